//! The limiter's own request and response types: what Envoy asks and what Sluice answers,
//! without the proto (which only `rls` and `admin` know).
//!
//! The `*Limit` types, from the config to the answer:
//! - [`RateLimit`](crate::policy::RateLimit): one limit as configured (`requests_per_unit`
//!   per `unit`, its algorithm, burst, name); a rule's [`RuleLimit`](crate::policy::RuleLimit)
//!   is `unlimited` or one or several of them.
//! - [`Limit`](crate::algorithm::Limit): the numbers an algorithm decides with (requests per
//!   window in microseconds, burst, overdraft), made from a `RateLimit` for each counter.
//! - [`LimitOverride`]: Envoy's per-descriptor `limit` override, which stands for a rule.
//! - [`AppliedLimit`]: a limit a request was counted against, as the response headers tell it.
//! - [`ReportedLimit`]: the limit in a descriptor's status (`current_limit`).
//! - [`ExplainedLimit`](crate::limiter::ExplainedLimit): a limit `/explain` shows, with its
//!   counter.

use std::collections::BTreeMap;

use crate::algorithm::Micros;
use crate::policy::{MetaValue, Unit};

/// A rate limit request: a domain and its descriptors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The domain, naming one config file's tree.
    pub domain: String,
    /// The descriptors, each answered with one status, in order.
    pub descriptors: Vec<Descriptor>,
}

/// One descriptor: entries to match, and how many hits it costs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// `(key, value)` entries, matched level by level.
    pub entries: Vec<Entry>,
    /// A limit sent by Envoy that replaces the configured one.
    pub limit: Option<LimitOverride>,
    /// Hits to charge: 0 checks without charging, negative refunds (`is_negative_hits`).
    pub hits: i64,
}

#[cfg(test)]
impl Request {
    /// A request of `descriptors` in `domain`. For unit tests.
    pub(crate) fn of(domain: &str, descriptors: Vec<Descriptor>) -> Self {
        Self {
            domain: domain.into(),
            descriptors,
        }
    }
}

#[cfg(test)]
impl Descriptor {
    /// A descriptor of `(key, value)` entries charging `hits`, without an override. For unit
    /// tests.
    pub(crate) fn of(entries: &[(&str, &str)], hits: i64) -> Self {
        Self {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: (*k).into(),
                    value: (*v).into(),
                })
                .collect(),
            limit: None,
            hits,
        }
    }
}

/// One descriptor entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The entry's key, e.g. `remote_address`.
    pub key: String,
    /// The entry's runtime value, e.g. `10.0.0.7`.
    pub value: String,
}

/// A per-descriptor limit from the request (Envoy's `limit` override).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    /// Hits per unit; never 0 (rejected as a bad request).
    pub requests_per_unit: u32,
    /// The unit.
    pub unit: Unit,
}

/// OK or over the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Within the limit (or not limited).
    Ok,
    /// Over the limit.
    OverLimit,
}

/// The answer to a [`Request`].
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// The overall answer; never unknown.
    pub code: Code,
    /// One status per request descriptor, in request order.
    pub statuses: Vec<DescriptorStatus>,
    /// Every counted limit that applied, in request order (several per descriptor with
    /// `rate_limits`): what the RateLimit headers describe.
    pub limits: Vec<AppliedLimit>,
    /// The merged `metadata` of the matched rules not over the limit.
    pub metadata: Option<BTreeMap<String, MetaValue>>,
    /// The store call that decided it (`None`: nothing was counted), for traces.
    pub store_call: Option<StoreCall>,
}

/// The store call of one request, for traces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreCall {
    /// When it started.
    pub started: std::time::Instant,
    /// How long it took.
    pub elapsed: std::time::Duration,
    /// What answered.
    pub answered_by: AnsweredBy,
    /// The script calls it took, and the requests they carried.
    pub calls: crate::store::Calls,
}

/// What decided a request's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnsweredBy {
    /// The store.
    Store,
    /// The local over-limit cache (for one counter at least; the store for the others).
    OverLimitCache,
    /// The failure policy, the store having failed.
    FailureMode,
}

impl AnsweredBy {
    /// Its name in traces.
    pub fn as_str(self) -> &'static str {
        match self {
            AnsweredBy::Store => "store",
            AnsweredBy::OverLimitCache => "over_limit_cache",
            AnsweredBy::FailureMode => "failure_mode",
        }
    }
}

/// One counted limit of a request, as the response headers describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedLimit {
    /// Index of the descriptor it belongs to.
    pub descriptor: usize,
    /// The policy's name: the limit's `name`, else the rule's stats key.
    pub policy: String,
    /// Hits the policy allows (token bucket: the burst).
    pub quota: u64,
    /// The policy's window; `None` for concurrency, which has none.
    pub window: Option<Micros>,
    /// Hits left.
    pub remaining: u64,
    /// When over the limit: the time until the hits could pass; otherwise the time until the
    /// quota is fully restored.
    pub reset_after: Micros,
    /// Whether this limit refused the request (shadow and quota-only refusals excluded).
    pub over: bool,
    /// Whether it belongs to a quota-mode descriptor.
    pub quota_mode: bool,
    /// Whether it is a priority (load shedding) limit rather than a client's quota.
    pub shedding: bool,
}

/// The answer for one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorStatus {
    /// This descriptor's code.
    pub code: Code,
    /// The limit that applied, if any.
    pub limit: Option<ReportedLimit>,
    /// The rule that decided it, as the dynamic metadata names it: its limit's `name:` when
    /// set, else the rule's stats key; `None` when no limit applied.
    pub rule: Option<String>,
    /// Hits left before the limit (4294967295 for `unlimited`).
    pub remaining: u32,
    /// When over the limit: the time until the hits could pass; otherwise the time until the
    /// budget is fully restored. `None` when no limit applied.
    pub reset_after: Option<Micros>,
    /// Whether its rule keeps its limits out of the response headers and body Sluice writes
    /// (`response_headers: false`); Envoy still gets the status.
    pub hidden: bool,
}

/// The limit reported in a status (`current_limit`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedLimit {
    /// Requests per unit.
    pub requests_per_unit: u32,
    /// The unit.
    pub unit: Unit,
    /// The rule's `name`, if it has one.
    pub name: Option<String>,
}

impl Response {
    /// On OVER_LIMIT: the longest wait among the descriptors over the limit, in microseconds.
    pub fn retry_after(&self) -> Option<Micros> {
        if self.code != Code::OverLimit {
            return None;
        }
        self.statuses
            .iter()
            .filter(|s| s.code == Code::OverLimit && !s.hidden)
            .filter_map(|s| s.reset_after)
            .max()
    }
}
