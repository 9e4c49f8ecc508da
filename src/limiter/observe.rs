//! What the limiter reports as it answers and when its policy changes, for metrics: an
//! observer trait, so that the limiter knows nothing of the registry `app` assembles.

use std::time::Duration;

use crate::algorithm::Decision;
use crate::policy::{Policy, RateLimit, Rule};

use super::Descriptor;

/// One counted limit of one request, as decided.
pub struct LimitEvent<'a> {
    /// The request's domain.
    pub domain: &'a str,
    /// The matched rule; `None` for a request's limit override.
    pub rule: Option<&'a Rule>,
    /// The request descriptor.
    pub descriptor: &'a Descriptor,
    /// The limit (scaled to the priority class's share where the rule has `priorities`).
    pub limit: &'a RateLimit,
    /// The store's decision.
    pub decision: &'a Decision,
    /// Whether the local over-limit cache refused this counter (no store decided it).
    pub from_cache: bool,
    /// Whether an allowed decision's hits were charged: the request was admitted (or the
    /// counter counts whatever the decisions, a usage budget's). A descriptor that fits in a
    /// request another refuses was not.
    pub charged: bool,
    /// Whether it was decided from a lease block (`consistency: leased`), not the shared
    /// count.
    pub leased: bool,
}

/// Receives what the limiter does. Every method has an empty default.
pub trait Observer: Send + Sync + 'static {
    /// A counted limit was decided: once per counted descriptor, under the limit that
    /// decided.
    fn limit_decided(&self, _event: &LimitEvent<'_>) {}
    /// Each counted limit of a descriptor was decided (every limit of a rule with several).
    fn each_limit(&self, _event: &LimitEvent<'_>) {}
    /// A request named `domain`, which no config declares.
    fn domain_not_found(&self, _domain: &str) {}
    /// The global shadow mode answered OK to a request its rules would have refused.
    fn global_shadow_mode(&self) {}
    /// The store answered (or failed) after `elapsed`.
    fn store_call(&self, _elapsed: Duration, _ok: bool) {}
    /// `policy` is about to replace the policy in force (a reload or an xDS push): what is
    /// kept per rule of the old one may go.
    fn policy_swapped(&self, _policy: &Policy) {}
}

/// An observer that ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoObserver;

impl Observer for NoObserver {}
