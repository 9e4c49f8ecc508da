//! One request's counter operations, and the rule that decides whether they are charged.

use super::CounterKey;
use crate::algorithm::{Decision, Limit};

/// How an operation's decision counts toward the request's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Over the limit → the request is over the limit.
    Enforce,
    /// Counted and reported, never rejects (`shadow_mode`).
    Shadow,
    /// `quota_mode`: the request is over the limit only when every quota operation is.
    Quota,
}

/// One counter to check and charge.
#[derive(Debug, Clone, PartialEq)]
pub struct CounterOp {
    /// The counter's identity.
    pub key: CounterKey,
    /// The limit and algorithm.
    pub limit: Limit,
    /// Hits to charge; 0 checks without charging; negative refunds.
    pub hits: i64,
    /// How this operation's decision counts.
    pub role: Role,
    /// What to answer for this counter when the store fails.
    pub failure_mode: FailureMode,
    /// Whether a shared store decides each hit, or this instance from a leased block.
    pub consistency: Consistency,
}

/// How a rule's counter is decided with a shared store (`consistency:` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Consistency {
    /// Every hit is decided by the shared store (the default).
    #[default]
    Exact,
    /// The instance takes blocks of units from the shared counter and admits from them in
    /// memory: never more than the limit, a bounded few less (docs/configuration/leased-quota.md).
    Leased,
}

impl Consistency {
    /// The name used in config files.
    pub fn as_str(self) -> &'static str {
        match self {
            Consistency::Exact => "exact",
            Consistency::Leased => "leased",
        }
    }
}

/// What a rule answers while its store is failing (`failure_mode:` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FailureMode {
    /// Fail open: admit (the default; counted and logged).
    #[default]
    Allow,
    /// Fail closed: reject (login, SMS, anything that costs money).
    Deny,
    /// Count in this instance's memory, with the limit divided by the number of instances.
    Local,
    /// Leave the decision to Envoy: the request fails at once with gRPC `UNAVAILABLE`, which
    /// Envoy's `failure_mode_deny` decides (what the reference does; the default under its
    /// name, so that an Envoy set to fail closed stays closed after the image is swapped).
    Envoy,
}

impl FailureMode {
    /// The name used in config files.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureMode::Allow => "allow",
            FailureMode::Deny => "deny",
            FailureMode::Local => "local",
            FailureMode::Envoy => "envoy",
        }
    }

    /// Every mode.
    pub const ALL: [FailureMode; 4] = [
        FailureMode::Allow,
        FailureMode::Deny,
        FailureMode::Local,
        FailureMode::Envoy,
    ];
}

/// Counters answered by the failure policy so far, by mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FailureModeAnswers {
    /// Admitted (`allow`).
    pub allow: u64,
    /// Refused (`deny`).
    pub deny: u64,
    /// Counted in this instance's memory (`local`).
    pub local: u64,
    /// Failed for Envoy to decide (`envoy`).
    pub envoy: u64,
}

impl FailureModeAnswers {
    /// The answers of `mode`.
    pub fn of(&self, mode: FailureMode) -> u64 {
        match mode {
            FailureMode::Allow => self.allow,
            FailureMode::Deny => self.deny,
            FailureMode::Local => self.local,
            FailureMode::Envoy => self.envoy,
        }
    }

    /// The answers of `mode`, to change.
    pub fn of_mut(&mut self, mode: FailureMode) -> &mut u64 {
        match mode {
            FailureMode::Allow => &mut self.allow,
            FailureMode::Deny => &mut self.deny,
            FailureMode::Local => &mut self.local,
            FailureMode::Envoy => &mut self.envoy,
        }
    }

    /// These answers and `other`'s together (two stores behind the per-second split).
    pub fn and(mut self, other: FailureModeAnswers) -> Self {
        for mode in FailureMode::ALL {
            *self.of_mut(mode) += other.of(mode);
        }
        self
    }
}

/// All counter operations of one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    /// Operations, in request order.
    pub ops: Vec<CounterOp>,
    /// Whether the request may be admitted (and so charged).
    pub admission: Admission,
    /// When the caller stops waiting (its gRPC deadline), if it said: a shared store's answer
    /// after that is worth nothing to it, so the failure policy answers before.
    pub deadline: Option<tokio::time::Instant>,
    /// For a batch of refunds only: the store time (µs) at which the hits were charged. A
    /// windowed counter whose window has moved on since is left alone, so that a refund never
    /// takes from a window that the charge did not go to.
    pub charged_at: Option<crate::algorithm::Micros>,
}

impl CounterOp {
    /// What gives back this operation's charge when its request is rejected after it was
    /// charged (another Cluster slot or Redis refused): its hits negated, unless it charged
    /// nothing or is a concurrency acquisition (those stay counted: their releases will come).
    pub fn refund(&self) -> Option<CounterOp> {
        (self.hits > 0 && !crate::algorithm::applies_unconditionally(&self.limit, self.hits)).then(
            || CounterOp {
                hits: -self.hits,
                role: Role::Enforce,
                ..self.clone()
            },
        )
    }
}

impl Batch {
    /// Whether `op` of this batch is a refund that would take from a later window than the
    /// one its hits were charged to (see [`Batch::charged_at`]): it must change nothing.
    pub fn stale_refund(&self, op: &CounterOp, now: crate::algorithm::Micros) -> bool {
        op.hits < 0
            && op.limit.algorithm.windowed()
            && op.limit.window > 0
            && self
                .charged_at
                .is_some_and(|t| t / op.limit.window != now / op.limit.window)
    }

    /// The window start a refund of `op` must still be in, for stores that check it
    /// themselves (the Redis script); `None` when the batch names no charge time.
    pub fn refund_guard(&self, op: &CounterOp) -> Option<crate::algorithm::Micros> {
        let t = self.charged_at?;
        (op.limit.window > 0).then(|| t - t % op.limit.window)
    }
}

/// Which requests a batch admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Admission {
    /// By [`admitted`]: no enforced operation over the limit, and not every quota one.
    #[default]
    ByRule,
    /// Whatever the decisions (global shadow mode answers OK, so it charges).
    Always,
    /// Never: every decision is made with the operation's hits, as for any request, and
    /// nothing is charged but what a rejected request charges too (refunds, concurrency
    /// acquisitions). The over-limit cache asks this for the other counters of a request it
    /// rejects, so that their statuses are the store's.
    Never,
}

/// The result of applying a batch. Two results are equal when they decide the same, however
/// the store reached the decisions ([`Applied::calls`] is left out).
#[derive(Debug, Clone)]
pub struct Applied {
    /// One decision per operation, in order.
    pub decisions: Vec<Decision>,
    /// Whether the request was admitted, i.e. the allowed hits were charged.
    pub admitted: bool,
    /// Whether the decisions came from the failure policy rather than the store.
    pub degraded: bool,
    /// The operations the local over-limit cache answered (refusals it remembered), by index;
    /// no store decided them. Empty when it answered none.
    pub cached: Vec<usize>,
    /// The store's time (µs) of the decision, where it has one clock (one Redis node, the
    /// memory store): what a later refund of these charges names in [`Batch::charged_at`].
    pub decided_at: Option<crate::algorithm::Micros>,
    /// How the decisions were reached, for traces.
    pub calls: Calls,
}

impl PartialEq for Applied {
    fn eq(&self, other: &Self) -> bool {
        self.decisions == other.decisions
            && self.admitted == other.admitted
            && self.degraded == other.degraded
            && self.cached == other.cached
            && self.decided_at == other.decided_at
    }
}

impl Eq for Applied {}

/// How one request's decisions reached a shared store, for traces: the script calls made
/// for it, and the requests the largest of them carried (requests that arrive together share
/// one call).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Calls {
    /// Script calls made for this request (0: no store call, e.g. the memory store or the
    /// over-limit cache answered alone).
    pub script_calls: u32,
    /// Requests in the largest of those calls, this one included.
    pub requests_per_call: u32,
}

impl Calls {
    /// One call carrying `requests` requests.
    pub fn one(requests: usize) -> Self {
        Self {
            script_calls: 1,
            requests_per_call: requests.min(u32::MAX as usize) as u32,
        }
    }

    /// The calls of two parts of a request together.
    pub fn and(self, other: Calls) -> Self {
        Self {
            script_calls: self.script_calls.saturating_add(other.script_calls),
            requests_per_call: self.requests_per_call.max(other.requests_per_call),
        }
    }
}

/// Whether a request whose operations got `decisions` is admitted.
///
/// Every store applies this same rule (the Redis scripts mirror it): any enforced operation
/// over the limit rejects the request; quota operations reject it only all together.
pub fn admitted(ops: &[CounterOp], decisions: &[Decision], admission: Admission) -> bool {
    match admission {
        Admission::Always => return true,
        Admission::Never => return false,
        Admission::ByRule => {}
    }
    let mut quota_seen = false;
    let mut quota_all_over = true;
    for (op, decision) in ops.iter().zip(decisions) {
        match op.role {
            Role::Enforce if !decision.allowed => return false,
            Role::Quota => {
                quota_seen = true;
                quota_all_over &= !decision.allowed;
            }
            Role::Enforce | Role::Shadow => {}
        }
    }
    !(quota_seen && quota_all_over)
}
