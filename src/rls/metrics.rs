//! The gRPC service's own metrics: requests and latency by method and code, errors by type,
//! and the reference's `should_rate_limit_error` split.

use std::time::Duration;

use prometheus::{Histogram, HistogramVec, IntCounterVec, Registry};

use crate::metrics::{LATENCY_BUCKETS, counter_vec, histogram_vec};

/// Buckets of the reference's response-time histogram: statsd_exporter's defaults, which its
/// Prometheus sink uses (in seconds, or in milliseconds with
/// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`, the same numbers).
const REFERENCE_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Requests of `ShouldRateLimit` and `/json`, and their errors.
pub struct RlsMetrics {
    requests: IntCounterVec,
    latency: HistogramVec,
    /// The reference's `ratelimit_service_response_time_seconds{grpc_method="ShouldRateLimit"}`,
    /// resolved once: it is observed on every request.
    response_time: Histogram,
    /// 1 (seconds) or 1000 (`PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`).
    response_time_scale: f64,
    errors: IntCounterVec,
    should_rate_limit_error: IntCounterVec,
}

impl RlsMetrics {
    /// Registers the service's metrics into `registry`.
    pub fn register(registry: &Registry) -> Self {
        let should_rate_limit_error = counter_vec(
            registry,
            "ratelimit_service_should_rate_limit_error",
            "Requests that failed: redis_error (the store failed; the failure policy answered), service_error (an invalid request, an internal error)",
            &["err_type"],
        );
        for kind in ["redis_error", "service_error"] {
            should_rate_limit_error.with_label_values(&[kind]);
        }
        Self {
            requests: counter_vec(
                registry,
                "sluice_grpc_requests_total",
                "gRPC requests by method and code",
                &["method", "code"],
            ),
            latency: histogram_vec(
                registry,
                "sluice_grpc_request_duration_seconds",
                "gRPC request latency",
                LATENCY_BUCKETS,
                &["method"],
            ),
            errors: counter_vec(registry, "sluice_errors_total", "Errors by type", &["type"]),
            response_time: histogram_vec(
                registry,
                "ratelimit_service_response_time_seconds",
                "ShouldRateLimit response time, as the reference reports it (in milliseconds with PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS)",
                REFERENCE_BUCKETS,
                &["grpc_method"],
            )
            .with_label_values(&["ShouldRateLimit"]),
            response_time_scale: 1.0,
            should_rate_limit_error,
        }
    }

    /// Reports the reference's response time in milliseconds instead of seconds (its
    /// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`; the name stays).
    pub fn response_time_in_milliseconds(&mut self, on: bool) {
        self.response_time_scale = if on { 1000.0 } else { 1.0 };
    }

    /// A gRPC (or `/json`) request answered with `code` after `elapsed`.
    pub fn request(&self, method: &str, code: &str, elapsed: Duration) {
        self.requests.with_label_values(&[method, code]).inc();
        self.latency
            .with_label_values(&[method])
            .observe(elapsed.as_secs_f64());
        // The reference times its gRPC methods only.
        if method == "ShouldRateLimit" {
            self.response_time
                .observe(elapsed.as_secs_f64() * self.response_time_scale);
        }
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
}
