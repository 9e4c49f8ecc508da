//! Prometheus metrics, registered into one explicit `Registry` (no global state), served at
//! `GET /metrics`.
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

use std::time::Duration;

use parking_lot::Mutex;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

use crate::limiter::{LimitEvent, Observer};
use crate::policy::Policy;
use crate::store::StoreStatus;
use rules::RuleSeries;
#[cfg(test)]
use rules::label_value;

/// Label value of the series that takes hits past the detailed-series cap.
pub const OVERFLOW: &str = "__overflow__";

/// Most unknown domains counted in `ratelimit_service_domain_not_found` series of their own
/// (they come from requests); the rest are counted under `domain="__overflow__"`.
pub const MAX_UNKNOWN_DOMAINS: usize = 100;

/// Every metric of the process.
pub struct Metrics {
    registry: Registry,
    /// Per-rule series: the limiter's observer.
    rules: RuleSeries,
    should_rate_limit_error: IntCounterVec,
    grpc_requests: IntCounterVec,
    grpc_latency: HistogramVec,
    errors: IntCounterVec,
    config_load_success: IntCounter,
    config_load_error: IntCounter,
    store_latency: Histogram,
    store_errors: IntCounter,
    store_healthy: IntGauge,
    failure_mode: IntCounterVec,
    failure_mode_seen: Mutex<[u64; 3]>,
    memory_keys: IntGauge,
    memory_evicted: IntGauge,
    memory_bytes: IntGauge,
    memory_full: IntGauge,
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let vec = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry
        .register(Box::new(vec.clone()))
        .expect("unique metric");
    vec
}

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("valid metric");
    registry
        .register(Box::new(c.clone()))
        .expect("unique metric");
    c
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("valid metric");
    registry
        .register(Box::new(g.clone()))
        .expect("unique metric");
    g
}

// === impl Metrics ===

impl Metrics {
    /// Registers every metric into a new registry. `max_detailed` caps the series of
    /// `detailed_metric`/`value_to_metric` rules.
    pub fn new(near_limit_ratio: f64, max_detailed: usize) -> Self {
        let registry = Registry::new();
        let r = &registry;
        let latency_buckets = vec![
            0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0,
        ];
        let grpc_latency = HistogramVec::new(
            HistogramOpts::new(
                "sluice_grpc_request_duration_seconds",
                "gRPC request latency",
            )
            .buckets(latency_buckets.clone()),
            &["method"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(grpc_latency.clone()))
            .expect("unique metric");
        let store_latency = Histogram::with_opts(
            HistogramOpts::new(
                "sluice_store_request_duration_seconds",
                "Store call latency",
            )
            .buckets(latency_buckets),
        )
        .expect("valid metric");
        registry
            .register(Box::new(store_latency.clone()))
            .expect("unique metric");
        Self {
            rules: RuleSeries::register(r, near_limit_ratio, max_detailed),
            should_rate_limit_error: {
                let vec = counter_vec(
                    r,
                    "ratelimit_service_should_rate_limit_error",
                    "Requests that failed: redis_error (the store failed; the failure policy answered), service_error (an invalid request, an internal error)",
                    &["err_type"],
                );
                for kind in ["redis_error", "service_error"] {
                    vec.with_label_values(&[kind]);
                }
                vec
            },
            grpc_requests: counter_vec(
                r,
                "sluice_grpc_requests_total",
                "gRPC requests by method and code",
                &["method", "code"],
            ),
            grpc_latency,
            errors: counter_vec(r, "sluice_errors_total", "Errors by type", &["type"]),
            config_load_success: counter(
                r,
                "ratelimit_service_config_load_success",
                "Config loads that succeeded",
            ),
            config_load_error: counter(
                r,
                "ratelimit_service_config_load_error",
                "Config loads that failed (the old config stayed)",
            ),
            store_latency,
            store_errors: counter(
                r,
                "sluice_store_errors_total",
                "Requests the store did not answer (errors, timeouts, the open breaker)",
            ),
            store_healthy: gauge(
                r,
                "sluice_store_healthy",
                "1 while the store answers, 0 while its circuit breaker is open",
            ),
            failure_mode: counter_vec(
                r,
                "sluice_failure_mode_decisions_total",
                "Counters answered by the failure policy",
                &["mode"],
            ),
            failure_mode_seen: Mutex::default(),
            memory_keys: gauge(
                r,
                "sluice_memory_store_keys",
                "Counters the memory store tracks",
            ),
            memory_evicted: gauge(
                r,
                "sluice_memory_store_evicted_keys",
                "Live counters the memory store evicted at its cap",
            ),
            memory_bytes: gauge(
                r,
                "sluice_memory_store_bytes",
                "Heap bytes the memory store's counters take",
            ),
            memory_full: gauge(
                r,
                "sluice_memory_store_full",
                "1 while the memory store evicts live counters (it did within the last minute)",
            ),
            registry,
        }
    }

    /// The Prometheus text exposition, with the store's state read now.
    pub fn render(&self, store: &StoreStatus) -> String {
        self.store_healthy.set(i64::from(store.healthy));
        if let Some(keys) = store.tracked_keys {
            self.memory_keys.set(keys as i64);
        }
        self.memory_evicted.set(store.evicted_keys as i64);
        if let Some(bytes) = store.bytes {
            self.memory_bytes.set(bytes as i64);
        }
        self.memory_full.set(i64::from(store.full));
        {
            let mut seen = self.failure_mode_seen.lock();
            for (i, mode) in ["allow", "deny", "local"].iter().enumerate() {
                let now = store.failure_mode_answers[i];
                self.failure_mode
                    .with_label_values(&[mode])
                    .inc_by(now.saturating_sub(seen[i]));
                seen[i] = now.max(seen[i]);
            }
        }
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    /// A gRPC (or `/json`) request answered with `code` after `elapsed`.
    pub fn request(&self, method: &str, code: &str, elapsed: Duration) {
        self.grpc_requests.with_label_values(&[method, code]).inc();
        self.grpc_latency
            .with_label_values(&[method])
            .observe(elapsed.as_secs_f64());
    }

    /// An error of `kind` (e.g. `invalid_request`, `store_unavailable`).
    pub fn error(&self, kind: &str) {
        self.errors.with_label_values(&[kind]).inc();
    }

    /// A `ShouldRateLimit` call that failed: `service_error` (the request was invalid, or
    /// answering it failed) or `redis_error`, as the reference counts them.
    pub fn should_rate_limit_error(&self, kind: &str) {
        self.should_rate_limit_error
            .with_label_values(&[kind])
            .inc();
    }

    /// A config load's outcome.
    pub fn config_loaded(&self, ok: bool) {
        if ok {
            self.config_load_success.inc();
        } else {
            self.config_load_error.inc();
        }
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
        self.store_latency.observe(elapsed.as_secs_f64());
        if !ok {
            self.store_errors.inc();
            self.should_rate_limit_error("redis_error");
        }
    }
}

#[cfg(test)]
mod tests;
