//! Prometheus metrics, registered into one explicit `Registry` (no global state), served at
//! `GET /metrics`. Each layer defines and registers its own: the per-rule series (the
//! limiter's observer) in [`rules`](self), the gRPC service's in
//! [`rls::RlsMetrics`](crate::rls::RlsMetrics), config loads in
//! [`reload::ConfigMetrics`](crate::reload::ConfigMetrics), the store's in
//! [`store::StoreMetrics`](crate::store::StoreMetrics). [`Metrics`] is the registry and
//! those parts, built once by `app` and handed out.
//!
//! Per rule, with labels `domain`, `rule` (the rule's stats key) and the reference's `key1`
//! and `key2` (its first two levels), counted by hits as the reference service counts them:
//! `ratelimit_service_rate_limit_{total_hits,within_limit,over_limit,near_limit,
//! over_limit_with_local_cache,shadow_mode}`. Labels never carry request values, except for
//! rules with `detailed_metric`/`value_to_metric`, and those are capped: past the cap, hits
//! go to one `__overflow__` series and are counted. Plus gRPC requests and latency, errors by
//! type, config loads, store latency, errors, breaker state and failure-mode answers, and
//! the memory store's size.

mod rules;
pub mod statsd;

use std::sync::Arc;
use std::time::Duration;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

use crate::limiter::{LimitEvent, Observer};
use crate::policy::Policy;
use crate::reload::ConfigMetrics;
use crate::rls::RlsMetrics;
use crate::store::{StoreMetrics, StoreStatus};
use rules::RuleSeries;
#[cfg(test)]
use rules::label_value;

/// Label value of the series that takes hits past the detailed-series cap.
pub const OVERFLOW: &str = "__overflow__";

/// Most unknown domains counted in `ratelimit_service_domain_not_found` series of their own
/// (they come from requests); the rest are counted under `domain="__overflow__"`.
pub const MAX_UNKNOWN_DOMAINS: usize = 100;

/// Buckets of the latency histograms, in seconds: 100 µs to 1 s.
pub(crate) const LATENCY_BUCKETS: &[f64] = &[
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0,
];

/// The process's registry and every component's metrics in it.
pub struct Metrics {
    registry: Registry,
    /// Per-rule series: the limiter's observer.
    rules: RuleSeries,
    /// The gRPC service's.
    rls: Arc<RlsMetrics>,
    /// Config loads.
    pub config: ConfigMetrics,
    /// Store calls, breaker, failure policy, memory store size.
    store: StoreMetrics,
}

// === impl Metrics ===

impl Metrics {
    /// A new registry with every component's metrics in it. `max_detailed` caps the series
    /// of `detailed_metric`/`value_to_metric` rules.
    pub fn new(near_limit_ratio: f64, max_detailed: usize) -> Self {
        let registry = Registry::new();
        Self {
            rules: RuleSeries::register(&registry, near_limit_ratio, max_detailed),
            rls: Arc::new(RlsMetrics::register(&registry)),
            config: ConfigMetrics::register(&registry),
            store: StoreMetrics::register(&registry),
            registry,
        }
    }

    /// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`: the reference's response-time histogram in
    /// milliseconds.
    pub fn with_response_time_in_milliseconds(mut self, on: bool) -> Self {
        if let Some(rls) = Arc::get_mut(&mut self.rls) {
            rls.response_time_in_milliseconds(on);
        }
        self
    }

    /// The registry every component's metrics are in (for the statsd exporter, which reads
    /// them).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The gRPC service's metrics, to hand to [`RlsService`](crate::rls::RlsService).
    pub fn rls(&self) -> Arc<RlsMetrics> {
        self.rls.clone()
    }

    /// The Prometheus text exposition, with the store's state read now.
    pub fn render(&self, store: &StoreStatus) -> String {
        self.store.observe(store);
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    /// Drops the series of rules that `policy` no longer has (after a reload).
    pub fn retain_rules(&self, policy: &Policy) {
        self.rules.retain(policy);
    }
}

impl Observer for Metrics {
    fn limit_decided(&self, event: &LimitEvent<'_>) {
        self.rules.limit_decided(event);
    }

    fn domain_not_found(&self, domain: &str) {
        self.rules.domain_not_found(domain);
    }

    fn global_shadow_mode(&self) {
        self.rules.global_shadow_mode();
    }

    fn store_call(&self, elapsed: Duration, ok: bool) {
        self.store.call(elapsed, ok);
        if !ok {
            self.rls.should_rate_limit_error("redis_error");
        }
    }
}

// === registration helpers ===

/// Registers a new counter vector into `registry`.
pub(crate) fn counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> IntCounterVec {
    register(
        registry,
        IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

/// Registers a new counter into `registry`.
pub(crate) fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    register(registry, IntCounter::new(name, help).expect("valid metric"))
}

/// Registers a new gauge into `registry`.
pub(crate) fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    register(registry, IntGauge::new(name, help).expect("valid metric"))
}

/// Registers a new histogram into `registry`.
pub(crate) fn histogram(registry: &Registry, name: &str, help: &str, buckets: &[f64]) -> Histogram {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    register(registry, Histogram::with_opts(opts).expect("valid metric"))
}

/// Registers a new histogram vector into `registry`.
pub(crate) fn histogram_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: &[f64],
    labels: &[&str],
) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    register(
        registry,
        HistogramVec::new(opts, labels).expect("valid metric"),
    )
}

/// Registers `metric` (its names are fixed in the code, so a clash is a bug) and returns it.
fn register<M: prometheus::core::Collector + Clone + 'static>(registry: &Registry, metric: M) -> M {
    registry
        .register(Box::new(metric.clone()))
        .expect("unique metric");
    metric
}

#[cfg(test)]
mod tests;
