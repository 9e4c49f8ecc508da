//! The process's one Prometheus registry and every component's metrics in it, assembled here
//! and handed out: each layer defines and registers its own (the limiter's per-rule series in
//! [`RuleSeries`], the gRPC service's in [`RlsMetrics`], config loads in [`ConfigMetrics`],
//! the store's in [`StoreMetrics`]); [`Metrics`] is the limiter's observer and feeds each.
//!
//! Per rule, with labels `domain`, `rule` (the rule's stats key) and the reference's `key1`
//! and `key2` (its first two levels), counted by hits as the reference service counts them:
//! `ratelimit_service_rate_limit_{total_hits,within_limit,over_limit,near_limit,
//! over_limit_with_local_cache,shadow_mode}`. Labels never carry request values, except for
//! rules with `detailed_metric`/`value_to_metric`, and those are capped: past the cap, hits
//! go to one `__overflow__` series and are counted. Plus gRPC requests and latency, errors by
//! type, config loads, store latency, errors, breaker state and failure-mode answers, and
//! the memory store's size.

use std::sync::Arc;
use std::time::Duration;

use prometheus::Registry;

use crate::limiter::{LimitEvent, Limiter, Observer, RuleSeries};
use crate::metrics::Exposition;
use crate::policy::Policy;
use crate::quota::RlqsMetrics;
use crate::rls::RlsMetrics;
use crate::source::ConfigMetrics;
use crate::store::{StoreMetrics, StoreStatus};

/// The process's registry and every component's metrics in it.
pub struct Metrics {
    registry: Registry,
    /// Per-rule series: the limiter's observer.
    rules: RuleSeries,
    /// The gRPC service's.
    rls: Arc<RlsMetrics>,
    /// The RLQS face's.
    rlqs: Arc<RlqsMetrics>,
    /// Config loads.
    config: ConfigMetrics,
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
            rlqs: Arc::new(RlqsMetrics::register(&registry)),
            config: ConfigMetrics::register(&registry),
            store: StoreMetrics::register(&registry),
            registry,
        }
    }

    /// The process's ladder of candidate limits (`LIMIT_LADDER*`; `None`: only rules with a
    /// ladder of their own are measured).
    pub fn with_ladder(self, ladder: Option<crate::policy::Ladder>) -> Self {
        self.rules.set_ladder(ladder);
        self
    }

    /// Sets a rule's gauges of distinct and new refused keys.
    pub fn refused_keys(&self, published: &crate::limiter::Published) {
        self.rules.refused_keys(published);
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
    /// them, and for components registered after start-up).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The gRPC service's metrics, to hand to [`RlsService`](crate::rls::RlsService).
    pub fn rls(&self) -> Arc<RlsMetrics> {
        self.rls.clone()
    }

    /// The RLQS face's metrics, to hand to [`Quotas`](crate::quota::Quotas).
    pub fn rlqs(&self) -> Arc<RlqsMetrics> {
        self.rlqs.clone()
    }

    /// The config loads' counters, to hand to the config sources.
    pub fn config(&self) -> ConfigMetrics {
        self.config.clone()
    }

    /// The Prometheus text exposition, with the store's state read now.
    pub fn render(&self, store: &StoreStatus) -> String {
        self.store.observe(store);
        self.rules.sweep_idle_overrides();
        self.registry.render()
    }
}

impl Observer for Metrics {
    fn limit_decided(&self, event: &LimitEvent<'_>) {
        self.rules.limit_decided(event);
    }

    fn each_limit(&self, event: &LimitEvent<'_>) {
        self.rules.each_limit(event);
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

    fn policy_swapped(&self, policy: &Policy) {
        self.rules.policy_swapped(policy);
    }
}

/// What `/metrics` serves: the registry, with the limiter's store read at each scrape.
pub struct Scrape {
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// The limiter whose store is read.
    pub limiter: Arc<Limiter>,
}

impl Exposition for Scrape {
    fn render(&self) -> String {
        self.metrics.render(&self.limiter.store().status())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::limiter::{Descriptor, LimiterOptions, Request};

    const TWO_RULES: &str = "domain: m\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n  - key: other\n    rate_limit: {unit: hour, requests_per_unit: 10}\n";
    const ONE_RULE: &str = "domain: m\ndescriptors:\n  - key: other\n    rate_limit: {unit: hour, requests_per_unit: 10}\n";

    /// A policy swapped into the limiter reaches the per-rule series through this observer:
    /// the series of a rule the new policy lacks are gone from the exposition.
    #[tokio::test]
    async fn a_swapped_policy_drops_the_series_of_removed_rules() {
        let metrics = Arc::new(Metrics::new(0.8, 100));
        let limiter =
            Limiter::for_tests(TWO_RULES, LimiterOptions::default(), Arc::new(SystemClock))
                .with_observer(metrics.clone());
        let request = Request::of("m", vec![Descriptor::of(&[("user", "a")], 1)]);
        limiter.check(&request).await.unwrap();
        let status = limiter.store().status();
        assert!(metrics.render(&status).contains(r#"rule="m.user""#));
        limiter.set_policy(Arc::new(crate::config::policy_for_tests(ONE_RULE)));
        assert!(!metrics.render(&status).contains(r#"rule="m.user""#));
    }
}
