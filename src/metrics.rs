//! The metrics kit every layer registers with: helpers that register a series into the
//! [`Registry`] they are handed (no global registry), the latency buckets they share, and
//! [`Exposition`], what a metrics endpoint renders. Each layer owns its series (the limiter's
//! per-rule series, the gRPC service's, the store's, the config sources'); `app` creates the
//! one registry and assembles them. [`statsd`] sends the reference's stats from it.

pub mod statsd;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

/// Buckets of the latency histograms, in seconds: 100 µs to 1 s.
pub(crate) const LATENCY_BUCKETS: &[f64] = &[
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0,
];

/// What `/metrics` serves: the Prometheus text exposition, rendered when scraped. The admin
/// and Prometheus listeners know only this, not what the process registered.
pub trait Exposition: Send + Sync + 'static {
    /// The exposition now.
    fn render(&self) -> String;
}

impl Exposition for Registry {
    fn render(&self) -> String {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
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

/// Registers a new gauge vector into `registry`, of integers (`IntGaugeVec`) or of
/// floating-point values (`GaugeVec`).
pub(crate) fn gauge_vec<P: prometheus::core::Atomic + 'static>(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::core::GenericGaugeVec<P> {
    register(
        registry,
        prometheus::core::GenericGaugeVec::new(Opts::new(name, help), labels)
            .expect("valid metric"),
    )
}

/// Registers a new gauge into `registry`.
pub(crate) fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    register(registry, IntGauge::new(name, help).expect("valid metric"))
}

/// Registers a new gauge of floating-point values into `registry`.
pub(crate) fn gauge_f64(registry: &Registry, name: &str, help: &str) -> prometheus::Gauge {
    register(
        registry,
        prometheus::Gauge::new(name, help).expect("valid metric"),
    )
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

/// Registers `metric` (its names are fixed in the code, so a clash is a bug), records it in
/// the [`catalog`], and returns it.
fn register<M: prometheus::core::Collector + Clone + 'static>(registry: &Registry, metric: M) -> M {
    registry
        .register(Box::new(metric.clone()))
        .expect("unique metric");
    let mut catalog = CATALOG.lock();
    for family in metric.collect() {
        let labels = metric
            .desc()
            .first()
            .map(|d| d.variable_labels.clone())
            .unwrap_or_default();
        catalog
            .entry(family.name().to_owned())
            .or_insert_with(|| Family {
                kind: match family.get_field_type() {
                    prometheus::proto::MetricType::COUNTER => "counter",
                    prometheus::proto::MetricType::GAUGE => "gauge",
                    prometheus::proto::MetricType::HISTOGRAM => "histogram",
                    _ => "other",
                },
                help: family.help().to_owned(),
                labels,
            });
    }
    metric
}

/// Registers `collector`, whose families are all counters computed when scraped, and records
/// each in the [`catalog`].
pub(crate) fn register_counters(
    registry: &Registry,
    collector: Box<dyn prometheus::core::Collector>,
) {
    let mut catalog = CATALOG.lock();
    for desc in collector.desc() {
        catalog
            .entry(desc.fq_name.clone())
            .or_insert_with(|| Family {
                kind: "counter",
                help: desc.help.clone(),
                labels: desc.variable_labels.clone(),
            });
    }
    drop(catalog);
    registry.register(collector).expect("unique metric");
}

/// A metric family as registered: its type, help and labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Family {
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// Its help text.
    pub help: String,
    /// Its label names, in order.
    pub labels: Vec<String>,
}

/// Every family this process has registered so far, by name.
static CATALOG: parking_lot::Mutex<std::collections::BTreeMap<String, Family>> =
    parking_lot::Mutex::new(std::collections::BTreeMap::new());

/// The metric families this process has registered so far, by name (the metrics reference
/// in docs/reference/metrics.md is rendered from it).
pub fn catalog() -> std::collections::BTreeMap<String, Family> {
    CATALOG.lock().clone()
}
