// Why one long file: the request path's stages (plan, batch, apply, respond, observe) in the order
// a request takes them (the statuses `respond` builds are in status.rs).
//! One rate limit request, end to end: match each descriptor to a rule, apply `replaces`,
//! send every counter to the store in one batch, and build the statuses and overall code.
//! Beside it: [`series`], the per-rule metric series that observe it.

mod distinct;
mod fnv;
mod inspect;
mod ladder;
mod observe;
mod options;
pub mod refused;
pub mod series;
mod status;
pub mod top;
mod types;

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;

use arc_swap::ArcSwap;

pub use distinct::{DistinctRefused, Published};
pub use inspect::{CounterState, Explained, ExplainedLimit, Explanation, Outcome, Step};
pub use observe::{LimitEvent, NoObserver, Observer};
pub use options::LimiterOptions;
pub use refused::RefusedKeys;
pub use series::RuleSeries;
use status::{Described, merged_metadata, override_key, status};
pub use types::{
    AnsweredBy, AppliedLimit, Code, Descriptor, DescriptorStatus, Entry, LimitOverride,
    ReportedLimit, Request, Response, StoreCall,
};

use crate::algorithm::Decision;
use crate::policy::{Domain, EntryRef, Policy, RateLimit, Rule, RuleLimit};
use crate::store::{
    Admission, Applied, Batch, Consistency, CounterKey, CounterOp, FailureMode, Role, Store,
    StoreError,
};

/// The largest charge a usage budget counts in full (Envoy's bound on `hits_addend`); a
/// larger one counts as this many.
pub const MAX_CHARGE: u64 = 1_000_000_000;

/// `limit_remaining` reported for `unlimited` rules, as the reference service does.
pub const UNLIMITED_REMAINING: u32 = u32::MAX;

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// The request itself is malformed.
    #[error("{0}")]
    InvalidRequest(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The limits of a counted descriptor: a rule's (scaled to the priority class's share when
/// the rule has `priorities`), or the request's override.
type Limits<'p> = Cow<'p, [RateLimit]>;

/// The value counters of a `priorities` rule use for the class entry: one counter for all.
const ALL_PRIORITIES: &str = "(all priorities)";

/// The rate limiter: the current policy plus a store.
pub struct Limiter {
    /// Swapped whole on reload; read without a lock on every request.
    policy: ArcSwap<Policy>,
    store: Arc<dyn Store>,
    options: LimiterOptions,
    observer: Arc<dyn Observer>,
    /// Each rule's top refused keys.
    refused: RefusedKeys,
    /// Each rule's sample of refused keys, for the distinct and new counts.
    distinct: DistinctRefused,
}

/// What one descriptor resolved to.
enum Plan<'p> {
    /// Unknown domain, no matching rule, or a whitelisted node.
    NoLimit,
    /// `unlimited: true`.
    Unlimited,
    /// Counted limits: a configured rule's, or (rule `None`) a request override.
    Counted {
        rule: Option<&'p Rule>,
        limits: Limits<'p>,
    },
}

#[cfg(test)]
impl Limiter {
    /// A limiter over one config file holding `yaml`, on a memory store reading `clock`. For
    /// unit tests.
    pub(crate) fn for_tests(
        yaml: &str,
        options: LimiterOptions,
        clock: Arc<dyn crate::clock::Clock>,
    ) -> Self {
        let policy = crate::config::policy_for_tests(yaml);
        let store = crate::store::MemoryStore::new(Default::default(), clock);
        Self::new(Arc::new(policy), Arc::new(store), options)
    }
}

impl Limiter {
    /// A limiter over `policy`, counting in `store`.
    pub fn new(policy: Arc<Policy>, store: Arc<dyn Store>, options: LimiterOptions) -> Self {
        Self {
            policy: ArcSwap::new(policy),
            store,
            options,
            observer: Arc::new(NoObserver),
            refused: RefusedKeys::default().hashing_values(options.top_refused_keys_hashed),
            distinct: DistinctRefused::new(
                Arc::new(crate::clock::SystemClock),
                options.refused_keys_history,
            ),
        }
    }

    /// Reports every decision to `observer` (metrics).
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Self {
        // The policy in force is the first the observer hears of (its limits as series).
        observer.policy_swapped(&self.policy.load());
        self.observer = observer;
        self
    }

    /// The policy currently in force.
    pub fn policy(&self) -> Arc<Policy> {
        self.policy.load_full()
    }

    /// Each rule's sample of refused keys (the distinct and new counts).
    pub fn distinct(&self) -> &DistinctRefused {
        &self.distinct
    }

    /// Each rule's top refused keys (`GET /top`).
    pub fn refused(&self) -> &RefusedKeys {
        &self.refused
    }

    /// Replaces the policy as a whole; requests in flight finish on the old one.
    pub fn set_policy(&self, policy: Arc<Policy>) {
        self.observer.policy_swapped(&policy);
        self.refused.follow(&policy);
        self.distinct.follow(&policy);
        self.policy.store(policy);
    }

    /// The process-wide switches in force.
    pub fn options(&self) -> &LimiterOptions {
        &self.options
    }

    /// The store counters live in.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Answers one request.
    pub async fn check(&self, request: &Request) -> Result<Response, LimitError> {
        self.check_until(request, None).await
    }

    /// Answers one request whose caller stops waiting at `deadline` (its gRPC deadline): a
    /// shared store then gets no longer than that, less a margin, before the failure policy
    /// answers. In four stages: plan (match each descriptor), batch (its counters), apply
    /// (one store call), respond (statuses, events, metadata).
    pub async fn check_until(
        &self,
        request: &Request,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Response, LimitError> {
        validate(request, &self.options)?;
        let policy = self.policy();
        let domain = policy.domain(&request.domain);
        if domain.is_none() {
            self.observer.domain_not_found(&request.domain);
        }
        let plans = plan(domain, request);
        let batch = self.batch(request, domain, &plans, deadline);
        let applied = self.apply(&batch).await?;
        let mut response = self.respond(request, &plans, &batch, applied.as_ref().map(|a| &a.0));
        response.store_call = applied.map(|a| a.1);
        Ok(response)
    }

    /// Every counter the plans need, in request order.
    fn batch(
        &self,
        request: &Request,
        domain: Option<&Domain>,
        plans: &[Plan<'_>],
        deadline: Option<tokio::time::Instant>,
    ) -> Batch {
        let mut batch = Batch {
            ops: Vec::with_capacity(plans.len()),
            admission: if self.options.shadow_mode {
                Admission::Always
            } else {
                Admission::ByRule
            },
            deadline,
            charged_at: None,
        };
        // Under the global QUOTA_MODE a descriptor without a limit is a quota descriptor that
        // is never over, so "every quota descriptor is over" cannot happen (the reference
        // service's rule); quota operations then never reject, exactly like shadow ones.
        let domain_mode = domain.and_then(|d| d.failure_mode);
        let domain_consistency = domain.and_then(|d| d.consistency);
        let quota_cannot_fail =
            self.options.quota_mode && plans.iter().any(|p| matches!(p, Plan::NoLimit));
        for (descriptor, plan) in request.descriptors.iter().zip(plans) {
            if let Plan::Counted { rule, limits } = plan {
                for limit in limits.iter() {
                    let mut op = self.counter_op(
                        &request.domain,
                        descriptor,
                        (*rule, limits.len()),
                        limit,
                        (domain_mode, domain_consistency),
                    );
                    if quota_cannot_fail && op.role == Role::Quota {
                        op.role = Role::Shadow;
                    }
                    batch.ops.push(op);
                }
            }
        }
        batch
    }

    /// One store call for the whole batch (none when it is empty), observed.
    async fn apply(&self, batch: &Batch) -> Result<Option<(Applied, StoreCall)>, LimitError> {
        if batch.ops.is_empty() {
            return Ok(None);
        }
        let started = std::time::Instant::now();
        let result = self.store.apply(batch).await;
        // An answer from the failure policy is a store failure too (a timeout, an error,
        // or the open breaker's immediate answer).
        let answered = result.as_ref().is_ok_and(|a| !a.degraded);
        let elapsed = started.elapsed();
        self.observer.store_call(elapsed, answered);
        let applied = result?;
        if batch.admission == Admission::Always
            && !crate::store::admitted(&batch.ops, &applied.decisions, Admission::ByRule)
        {
            self.observer.global_shadow_mode();
        }
        let call = StoreCall {
            started,
            elapsed,
            answered_by: if applied.degraded {
                AnsweredBy::FailureMode
            } else if !applied.cached.is_empty() {
                AnsweredBy::OverLimitCache
            } else {
                AnsweredBy::Store
            },
            calls: applied.calls,
        };
        Ok(Some((applied, call)))
    }

    /// The answer: one status per descriptor, the applied limits, the overall code and the
    /// merged metadata; every counted descriptor reported to the observer once.
    fn respond(
        &self,
        request: &Request,
        plans: &[Plan<'_>],
        batch: &Batch,
        applied: Option<&Applied>,
    ) -> Response {
        let admitted = applied.is_none_or(|a| a.admitted);
        // The counters the over-limit cache refused, if it did: their events say so.
        let cached: Vec<&CounterKey> = applied
            .map_or(&[][..], |a| &a.cached[..])
            .iter()
            .map(|&i| &batch.ops[i].key)
            .collect();
        let mut decisions = applied.map_or(&[][..], |a| &a.decisions[..]);
        let mut ops = &batch.ops[..];
        let mut limits_out = Vec::with_capacity(batch.ops.len());
        let mut statuses = Vec::with_capacity(plans.len());
        for (index, (descriptor, plan)) in request.descriptors.iter().zip(plans).enumerate() {
            let Plan::Counted { rule, limits } = plan else {
                statuses.push(DescriptorStatus {
                    code: Code::Ok,
                    limit: None,
                    rule: None,
                    remaining: if matches!(plan, Plan::Unlimited) {
                        UNLIMITED_REMAINING
                    } else {
                        0
                    },
                    reset_after: None,
                    hidden: false,
                });
                continue;
            };
            let (own, rest) = decisions.split_at(limits.len());
            decisions = rest;
            let (own_ops, rest) = ops.split_at(limits.len());
            ops = rest;
            let counted = limits.iter().zip(own).zip(own_ops);
            self.observe(request, descriptor, *rule, counted, &cached, admitted);
            // Hits of an allowed descriptor in a rejected request were not charged.
            let uncharged = if admitted {
                0
            } else {
                descriptor.hits.max(0) as u64
            };
            let policy = match rule {
                Some(rule) => Cow::Borrowed(rule.stats_key.as_str()),
                None => Cow::Owned(override_key(&request.domain, descriptor)),
            };
            let described = Described {
                index,
                rule: *rule,
                policy: &policy,
                quota_mode: rule.is_some_and(|r| r.quota_mode) || self.options.quota_mode,
            };
            statuses.push(status(&described, limits, own, uncharged, &mut limits_out));
        }
        let metadata = merged_metadata(plans, &statuses);
        Response {
            code: if admitted { Code::Ok } else { Code::OverLimit },
            statuses,
            limits: limits_out,
            metadata,
            store_call: None,
        }
    }

    /// One event per counted descriptor, so that its hits count once: under the limit that
    /// decided (refusing, else with the least remaining).
    fn observe<'a>(
        &self,
        request: &Request,
        descriptor: &Descriptor,
        rule: Option<&Rule>,
        counted: impl Iterator<Item = ((&'a RateLimit, &'a Decision), &'a CounterOp)> + Clone,
        cached: &[&CounterKey],
        admitted: bool,
    ) {
        let event =
            |((limit, decision), op): ((&'a RateLimit, &'a Decision), &'a CounterOp)| LimitEvent {
                domain: &request.domain,
                rule,
                descriptor,
                limit,
                decision,
                from_cache: cached.contains(&&op.key),
                charged: admitted || crate::algorithm::applies_unconditionally(&op.limit, op.hits),
                leased: op.consistency == Consistency::Leased,
            };
        for each in counted.clone() {
            self.observer.each_limit(&event(each));
        }
        if let Some(((limit, decision), op)) =
            counted.min_by_key(|((_, d), _)| (d.allowed, d.remaining))
        {
            self.observer.limit_decided(&event(((limit, decision), op)));
            if let Some(rule) = rule.filter(|_| self.options.top_refused_keys) {
                self.refused
                    .decided(&request.domain, rule, limit, decision, descriptor);
            }
            if let Some(rule) = rule.filter(|_| self.options.distinct_refused_keys) {
                self.distinct
                    .decided(&request.domain, rule, limit, decision, descriptor);
            }
        }
    }

    /// The counter of one of `rule`'s `limits` limits (`rule` `None`: the request's
    /// override) for `descriptor`.
    fn counter_op(
        &self,
        domain: &str,
        descriptor: &Descriptor,
        (rule, limits): (Option<&Rule>, usize),
        limit: &RateLimit,
        (domain_mode, domain_consistency): (Option<FailureMode>, Option<Consistency>),
    ) -> CounterOp {
        let mut algorithm_limit = limit.algorithm_limit();
        // A shadow rule counts every hit, past its limit too (as the reference counts every
        // hit), so that what a lower or higher limit would refuse is measured while nothing
        // is refused: its counter records refused charges as a usage budget's does. Switched
        // to enforce, the same counter refuses until the count falls back under the limit.
        if self.options.shadow_counts_past_limit
            && rule.is_some_and(|r| r.shadow_mode)
            && algorithm_limit.algorithm.takes_overdraft()
        {
            algorithm_limit.overdraft = true;
        }
        // `share_threshold` levels count under their pattern, so all matching values share
        // one counter; every other level counts per runtime value.
        // A `priorities` rule counts every class of its last entry on one counter.
        let last = descriptor.entries.len() - 1;
        let prioritized = rule.is_some_and(|r| r.priorities.is_some());
        let entries = descriptor.entries.iter().enumerate().map(|(depth, entry)| {
            let shared = rule
                .and_then(|r| r.shared.get(depth))
                .and_then(Option::as_deref)
                .or((prioritized && depth == last).then_some(ALL_PRIORITIES));
            (entry.key.as_str(), shared.unwrap_or(entry.value.as_str()))
        });
        let role = match rule {
            Some(r) if r.shadow_mode => Role::Shadow,
            Some(r) if r.quota_mode => Role::Quota,
            // The global switch covers request overrides too, as in the reference service.
            _ if self.options.quota_mode => Role::Quota,
            _ => Role::Enforce,
        };
        // Hits beyond the capacity plus one change no decision (they are over any state of the
        // counter) and no state (a refund cannot go below empty), so they are clamped here,
        // before any store does arithmetic with them: 2^63 hits must not overflow a count.
        // A usage budget records what it is charged, so its charges count in full up to
        // MAX_CHARGE (Envoy's own bound on `hits_addend`).
        let most = algorithm_limit
            .requests
            .max(algorithm_limit.burst)
            .saturating_add(1)
            .max(if algorithm_limit.overdraft {
                MAX_CHARGE
            } else {
                0
            })
            .min(i64::MAX as u64) as i64;
        // Concurrency releases must reach the shared count, and a usage budget's every
        // charge: never leased (a block taken from a budget is overdrawn by the next report).
        let global = rule.is_some_and(|r| r.global);
        let consistency = if !algorithm_limit.algorithm.leasable() || algorithm_limit.overdraft {
            Consistency::Exact
        } else if global {
            Consistency::Leased
        } else {
            rule.and_then(|r| r.consistency)
                .or(domain_consistency)
                .unwrap_or(self.options.consistency)
        };
        // The reference's keys where the reference has the same counter: one fixed window per
        // descriptor, decided exactly (its `rate_limits`, `priorities` and leases are Sluice's).
        let reference = self.options.reference_keys
            && algorithm_limit.algorithm.in_reference_layout()
            && consistency == Consistency::Exact
            && limits == 1
            && limit.unit_multiplier == 1
            && !prioritized;
        CounterOp {
            key: if global {
                CounterKey::new(domain, entries, &algorithm_limit).global()
            } else if reference {
                CounterKey::reference(domain, entries)
            } else {
                CounterKey::new(domain, entries, &algorithm_limit)
            },
            limit: algorithm_limit,
            hits: descriptor.hits.clamp(-most, most),
            role,
            failure_mode: rule
                .and_then(|r| r.failure_mode)
                .or(domain_mode)
                .unwrap_or(self.options.failure_mode),
            consistency,
        }
    }
}

fn validate(request: &Request, options: &LimiterOptions) -> Result<(), LimitError> {
    if request.domain.is_empty() {
        return Err(LimitError::InvalidRequest(
            "rate limit domain must not be empty".into(),
        ));
    }
    if request.descriptors.is_empty() {
        return Err(LimitError::InvalidRequest(
            "rate limit descriptor list must not be empty".into(),
        ));
    }
    if request.descriptors.len() > options.max_descriptors {
        return Err(LimitError::InvalidRequest(format!(
            "rate limit request has {} descriptors, more than the {} allowed (MAX_REQUEST_DESCRIPTORS)",
            request.descriptors.len(),
            options.max_descriptors
        )));
    }
    for (i, descriptor) in request.descriptors.iter().enumerate() {
        if descriptor.entries.is_empty() {
            return Err(LimitError::InvalidRequest(format!(
                "rate limit descriptor {i} has no entries"
            )));
        }
        if descriptor.entries.len() > options.max_entries {
            return Err(LimitError::InvalidRequest(format!(
                "rate limit descriptor {i} has {} entries, more than the {} allowed (MAX_DESCRIPTOR_ENTRIES)",
                descriptor.entries.len(),
                options.max_entries
            )));
        }
        // Envoy's proto requires a key (`min_len: 1`); the reference service rejects none.
        if let Some(j) = descriptor.entries.iter().position(|e| e.key.is_empty()) {
            return Err(LimitError::InvalidRequest(format!(
                "rate limit descriptor {i} entry {j} has an empty key"
            )));
        }
        if descriptor.limit.is_some_and(|l| l.requests_per_unit == 0) {
            return Err(LimitError::InvalidRequest(format!(
                "rate limit descriptor {i}: limit override must have requests_per_unit > 0"
            )));
        }
    }
    Ok(())
}

/// Resolves every descriptor to a plan, then drops the limits replaced by another matched
/// limit of the same request.
fn plan<'p>(domain: Option<&'p Domain>, request: &Request) -> Vec<Plan<'p>> {
    let Some(domain) = domain else {
        return request.descriptors.iter().map(|_| Plan::NoLimit).collect();
    };
    let mut replaced: HashSet<&'p str> = HashSet::new();
    let mut plans: Vec<Plan<'p>> = request
        .descriptors
        .iter()
        .map(|descriptor| {
            if let Some(o) = descriptor.limit {
                return Plan::Counted {
                    rule: None,
                    limits: Cow::Owned(vec![RateLimit::fixed(
                        u64::from(o.requests_per_unit),
                        o.unit,
                    )]),
                };
            }
            let Some(rule) = domain.find(&descriptor.entries) else {
                return Plan::NoLimit;
            };
            replaced.extend(rule.replaces.iter().map(String::as_str));
            match rule.limit {
                RuleLimit::Unlimited => Plan::Unlimited,
                RuleLimit::Limited(ref limits) => Plan::Counted {
                    rule: Some(rule),
                    limits: match (&rule.priorities, descriptor.entries.last()) {
                        (Some(priorities), Some(class)) => Cow::Owned(
                            limits
                                .iter()
                                .map(|l| priorities.limit_for(&class.value, l))
                                .collect(),
                        ),
                        _ => Cow::Borrowed(limits),
                    },
                },
            }
        })
        .collect();
    if !replaced.is_empty() {
        for plan in &mut plans {
            if let Plan::Counted {
                rule: Some(rule), ..
            } = plan
                && rule.name.as_deref().is_some_and(|n| replaced.contains(n))
            {
                *plan = Plan::NoLimit;
            }
        }
    }
    plans
}

impl EntryRef for Entry {
    fn key(&self) -> &str {
        &self.key
    }
    fn value(&self) -> &str {
        &self.value
    }
}

#[cfg(test)]
mod tests;
