//! What operators ask about a request without sending it: how each descriptor matches
//! ([`Limiter::explain`]), what its counters hold ([`Limiter::counters`]), and clearing them
//! ([`Limiter::reset`]). The same stages as a request (validate, plan, the batch's counter
//! operations), so an explanation names exactly the rule and counters a request would use;
//! nothing here charges anything.

use crate::algorithm::{Decision, Micros};
use crate::policy::{Domain, RateLimit, Rule, RuleLimit, StepKind, TraceEnd};
use crate::store::{Admission, Batch, Consistency, CounterOp, FailureMode};

use super::{Descriptor, LimitError, Limiter, Plan, Request, plan, validate};

/// How every descriptor of a request is matched.
#[derive(Debug, Clone, PartialEq)]
pub struct Explained {
    /// Whether a loaded config defines the domain.
    pub domain_found: bool,
    /// One per request descriptor, in order.
    pub descriptors: Vec<Explanation>,
}

/// How one descriptor is matched, and the counters it would charge.
#[derive(Debug, Clone, PartialEq)]
pub struct Explanation {
    /// What the descriptor resolved to.
    pub outcome: Outcome,
    /// A sentence saying why.
    pub reason: String,
    /// The levels matched, from the domain down (the last one [`StepKind::None`] when a
    /// level has no matching child).
    pub path: Vec<Step>,
    /// The matched rule's stats key.
    pub rule: Option<String>,
    /// The limits counted, with their counters; empty when nothing is counted.
    pub limits: Vec<ExplainedLimit>,
    /// For [`Outcome::Replaced`]: the stats key of the rule that replaced this one.
    pub replaced_by: Option<String>,
    /// The rule's `shadow_mode`.
    pub shadow_mode: bool,
    /// The rule's `quota_mode` (or the global `QUOTA_MODE`).
    pub quota_mode: bool,
}

/// What a descriptor resolved to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A configured rule applies.
    Matched,
    /// The domain is not loaded: no limit.
    UnknownDomain,
    /// A level has no matching child: no limit.
    NoMatch,
    /// Every entry matched, but the rules are deeper than the descriptor goes: no limit.
    Depth,
    /// The matched node has no `rate_limit`: no limit.
    Whitelisted,
    /// `unlimited: true`: nothing counted.
    Unlimited,
    /// Another matched rule of the request `replaces` this one: no limit.
    Replaced,
    /// The request's own limit replaces the configured rule.
    Override,
}

/// One level of a descriptor's match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The request entry's key.
    pub key: String,
    /// The request entry's value.
    pub value: String,
    /// How it matched.
    pub kind: StepKind,
}

/// A limit a descriptor is counted against, and its counter.
#[derive(Debug, Clone, PartialEq)]
pub struct ExplainedLimit {
    /// The limit as configured (scaled to the class's share under `priorities`).
    pub limit: RateLimit,
    /// The counter operation a request would send (hits as the request asks).
    pub op: CounterOp,
    /// The key the store keeps the counter under now.
    pub store_key: String,
}

impl ExplainedLimit {
    /// `exact` or `leased`.
    pub fn consistency(&self) -> Consistency {
        self.op.consistency
    }

    /// What the store's failure answers for this counter.
    pub fn failure_mode(&self) -> FailureMode {
        self.op.failure_mode
    }
}

/// One counter's state, read without charging.
#[derive(Debug, Clone, PartialEq)]
pub struct CounterState {
    /// The limit and its counter.
    pub limit: ExplainedLimit,
    /// Hits counted in the current window (token bucket: tokens used; concurrency: in
    /// flight): the capacity less what is left, plus a usage budget's overdraft.
    pub used: u64,
    /// A usage budget's units used past its limit (0 within it, and for other rules).
    pub overdraft: u64,
    /// Hits the next request may still take.
    pub remaining: u64,
    /// Until the counter is fully restored (µs).
    pub reset_after: Micros,
    /// Whether a request of one hit would be refused now.
    pub over: bool,
    /// Whether the store failed and the failure policy answered instead.
    pub degraded: bool,
}

impl Limiter {
    /// How each descriptor of `request` is matched and which counters it would charge, as
    /// [`Limiter::check`] would match it; charges nothing. The request is validated as a
    /// request is (an invalid one is an error).
    pub fn explain(&self, request: &Request) -> Result<Explained, LimitError> {
        validate(request, &self.options)?;
        let policy = self.policy();
        let domain = policy.domain(&request.domain);
        let plans = plan(domain, request);
        let traces: Vec<_> = request
            .descriptors
            .iter()
            .map(|d| domain.map(|domain| domain.trace(&d.entries)))
            .collect();
        let descriptors = request
            .descriptors
            .iter()
            .zip(&plans)
            .zip(&traces)
            .map(|((descriptor, plan), trace)| {
                self.explain_one(request, domain, descriptor, plan, trace.as_ref(), &traces)
            })
            .collect();
        Ok(Explained {
            domain_found: domain.is_some(),
            descriptors,
        })
    }

    /// The state of every counter the descriptor uses (none when it is not counted), read
    /// from the store without charging.
    pub async fn counters(
        &self,
        domain: &str,
        descriptor: &Descriptor,
    ) -> Result<(Explanation, Vec<CounterState>), LimitError> {
        let explanation = self.explain_single(domain, descriptor)?;
        if explanation.limits.is_empty() {
            return Ok((explanation, Vec::new()));
        }
        let batch = Batch {
            ops: explanation
                .limits
                .iter()
                .map(|l| CounterOp {
                    hits: 0,
                    ..l.op.clone()
                })
                .collect(),
            admission: Admission::Never,
            deadline: None,
            charged_at: None,
        };
        let applied = self.store.apply(&batch).await?;
        let states = explanation
            .limits
            .iter()
            .zip(&applied.decisions)
            .map(|(limit, decision)| counter_state(limit, decision, applied.degraded))
            .collect();
        Ok((explanation, states))
    }

    /// Clears every counter the descriptor uses; answers them and how many held state.
    pub async fn reset(
        &self,
        domain: &str,
        descriptor: &Descriptor,
    ) -> Result<(Explanation, u64), LimitError> {
        let explanation = self.explain_single(domain, descriptor)?;
        if explanation.limits.is_empty() {
            return Ok((explanation, 0));
        }
        let ops: Vec<CounterOp> = explanation.limits.iter().map(|l| l.op.clone()).collect();
        let cleared = self.store.reset(&ops).await?;
        Ok((explanation, cleared))
    }

    fn explain_single(
        &self,
        domain: &str,
        descriptor: &Descriptor,
    ) -> Result<Explanation, LimitError> {
        let request = Request {
            domain: domain.to_owned(),
            descriptors: vec![descriptor.clone()],
        };
        let mut explained = self.explain(&request)?;
        explained
            .descriptors
            .pop()
            .ok_or_else(|| LimitError::InvalidRequest("no descriptor".into()))
    }

    fn explain_one(
        &self,
        request: &Request,
        domain: Option<&Domain>,
        descriptor: &Descriptor,
        plan: &Plan<'_>,
        trace: Option<&(Vec<StepKind>, TraceEnd<'_>)>,
        traces: &[Option<(Vec<StepKind>, TraceEnd<'_>)>],
    ) -> Explanation {
        let path = trace.map_or_else(Vec::new, |(steps, _)| path_of(descriptor, steps));
        let matched = trace.and_then(|(_, end)| match end {
            TraceEnd::Rule(rule) => Some(*rule),
            _ => None,
        });
        let mut explanation = Explanation {
            outcome: Outcome::Matched,
            reason: String::new(),
            path,
            rule: matched.map(|r| r.stats_key.clone()),
            limits: Vec::new(),
            replaced_by: None,
            shadow_mode: matched.is_some_and(|r| r.shadow_mode),
            quota_mode: matched.is_some_and(|r| r.quota_mode) || self.options.quota_mode,
        };
        let (outcome, reason) = match (domain, plan, trace) {
            (None, _, _) => (
                Outcome::UnknownDomain,
                format!("no loaded config defines the domain `{}`", request.domain),
            ),
            (Some(_), Plan::Counted { rule: None, .. }, _) => (
                Outcome::Override,
                "the request's own limit replaces the configured rule".to_owned(),
            ),
            (
                Some(_),
                Plan::Counted {
                    rule: Some(rule), ..
                },
                _,
            ) => (
                Outcome::Matched,
                format!("rule `{}` applies", rule.stats_key),
            ),
            (Some(_), Plan::Unlimited, _) => (
                Outcome::Unlimited,
                "the rule is `unlimited: true`: nothing is counted".to_owned(),
            ),
            (Some(_), Plan::NoLimit, Some((steps, end))) => {
                let (outcome, reason) = no_limit(descriptor, steps, *end);
                if outcome == Outcome::Replaced {
                    explanation.replaced_by = matched.and_then(|r| replacer(r, traces));
                }
                (outcome, reason)
            }
            (Some(_), Plan::NoLimit, None) => (Outcome::NoMatch, "no rule".to_owned()),
        };
        explanation.outcome = outcome;
        explanation.reason = match &explanation.replaced_by {
            Some(by) => format!("{reason} by `{by}`"),
            None => reason,
        };
        explanation.limits = self.explained_limits(request, domain, descriptor, plan);
        explanation
    }

    /// The limits a counted plan charges, with the counter operations a request would send.
    fn explained_limits(
        &self,
        request: &Request,
        domain: Option<&Domain>,
        descriptor: &Descriptor,
        plan: &Plan<'_>,
    ) -> Vec<ExplainedLimit> {
        let Plan::Counted { rule, limits } = plan else {
            return Vec::new();
        };
        let domain_modes = (
            domain.and_then(|d| d.failure_mode),
            domain.and_then(|d| d.consistency),
        );
        limits
            .iter()
            .map(|limit| {
                let op = self.counter_op(
                    &request.domain,
                    descriptor,
                    (*rule, limits.len()),
                    limit,
                    domain_modes,
                );
                ExplainedLimit {
                    limit: limit.clone(),
                    store_key: self.store.store_key(&op),
                    op,
                }
            })
            .collect()
    }
}

/// The steps of a traced match, with the request's entries.
fn path_of(descriptor: &Descriptor, steps: &[StepKind]) -> Vec<Step> {
    steps
        .iter()
        .zip(&descriptor.entries)
        .map(|(kind, entry)| Step {
            key: entry.key.clone(),
            value: entry.value.clone(),
            kind: kind.clone(),
        })
        .collect()
}

/// Why a descriptor of a known domain has no limit.
fn no_limit(descriptor: &Descriptor, steps: &[StepKind], end: TraceEnd<'_>) -> (Outcome, String) {
    match end {
        TraceEnd::NoMatch => {
            let level = steps.len();
            let entry = &descriptor.entries[level - 1];
            (
                Outcome::NoMatch,
                format!(
                    "no descriptor of key `{}` matches the value `{}` at level {level}",
                    entry.key, entry.value
                ),
            )
        }
        TraceEnd::Deeper => (
            Outcome::Depth,
            format!(
                "the descriptor has {} entries and the rules under them are deeper (a rule applies only at the depth of the request's entries)",
                descriptor.entries.len()
            ),
        ),
        TraceEnd::Whitelisted => (
            Outcome::Whitelisted,
            "the matched descriptor has no rate_limit: not limited".to_owned(),
        ),
        TraceEnd::Rule(rule) if matches!(rule.limit, RuleLimit::Limited(_)) => (
            Outcome::Replaced,
            format!("rule `{}` is replaced", rule.stats_key),
        ),
        TraceEnd::Rule(rule) => (Outcome::NoMatch, format!("rule `{}`", rule.stats_key)),
    }
}

/// The stats key of a matched rule of the request whose `replaces` names `rule`.
fn replacer(rule: &Rule, traces: &[Option<(Vec<StepKind>, TraceEnd<'_>)>]) -> Option<String> {
    let name = rule.name.as_deref()?;
    traces.iter().flatten().find_map(|(_, end)| match end {
        TraceEnd::Rule(other) if other.replaces.iter().any(|r| r == name) => {
            Some(other.stats_key.clone())
        }
        _ => None,
    })
}

fn counter_state(limit: &ExplainedLimit, decision: &Decision, degraded: bool) -> CounterState {
    let algorithm = limit.op.limit;
    let capacity = algorithm.capacity();
    CounterState {
        limit: limit.clone(),
        used: capacity
            .saturating_sub(decision.remaining)
            .saturating_add(decision.overdraft),
        overdraft: decision.overdraft,
        remaining: decision.remaining,
        reset_after: decision.reset_after,
        over: decision.remaining == 0,
        degraded,
    }
}
