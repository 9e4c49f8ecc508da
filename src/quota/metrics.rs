//! The RLQS face's metrics: streams, buckets, reports, assignments by strategy, abandons,
//! refused buckets, and per rule the demand reported against the rate handed out.

use prometheus::{GaugeVec, IntCounter, IntCounterVec, IntGauge, Registry};

use crate::metrics::{counter, counter_vec, gauge, gauge_vec};

/// Every series of the RLQS face.
pub struct RlqsMetrics {
    pub(super) streams: IntGauge,
    pub(super) buckets: IntGauge,
    pub(super) reports: IntCounter,
    pub(super) reports_dropped: IntCounter,
    pub(super) assignments: IntCounterVec,
    pub(super) abandoned: IntCounter,
    pub(super) rejected: IntCounterVec,
    pub(super) claim_errors: IntCounter,
    pub(super) demand: GaugeVec,
    pub(super) granted: GaugeVec,
    pub(super) shadow_denied: IntCounterVec,
    pub(super) refused_reports: IntCounterVec,
    pub(super) refused_streams: IntCounterVec,
    pub(super) max_streams: IntGauge,
    pub(super) max_buckets: IntGauge,
}

impl RlqsMetrics {
    /// Registers the series into `registry`.
    pub fn register(registry: &Registry) -> Self {
        let per_rule = |name: &str, help: &str| -> GaugeVec {
            gauge_vec(registry, name, help, &["domain", "rule"])
        };
        let assignments = counter_vec(
            registry,
            "sluice_rlqs_assignments_total",
            "RLQS assignments sent, by strategy: token_bucket, allow_all, deny_all",
            &["strategy"],
        );
        for strategy in ["token_bucket", "allow_all", "deny_all"] {
            assignments.with_label_values(&[strategy]);
        }
        Self {
            streams: gauge(registry, "sluice_rlqs_streams", "RLQS streams open"),
            buckets: gauge(
                registry,
                "sluice_rlqs_buckets",
                "RLQS buckets tracked, on every stream",
            ),
            reports: counter(
                registry,
                "sluice_rlqs_reports_total",
                "RLQS usage reports received",
            ),
            reports_dropped: counter(
                registry,
                "sluice_rlqs_reports_dropped_total",
                "RLQS usage reports dropped: a stream sent more than 100 per second",
            ),
            assignments,
            abandoned: counter(
                registry,
                "sluice_rlqs_abandoned_total",
                "RLQS buckets abandoned after going idle",
            ),
            rejected: {
                let rejected = counter_vec(
                    registry,
                    "sluice_rlqs_rejected_buckets_total",
                    "RLQS buckets of reports not tracked, by reason",
                    &["reason"],
                );
                // Every reason from the start, so that an alert on them has series to read.
                for reason in [
                    "over_stream_cap",
                    "over_instance_cap",
                    "empty_bucket_id",
                    "bucket_id_too_large",
                    "empty_key",
                ] {
                    rejected.with_label_values(&[reason]);
                }
                rejected
            },
            claim_errors: counter(
                registry,
                "sluice_rlqs_claim_errors_total",
                "Calls that renew this instance's claims on shared budgets and failed (the claims then stay as they are)",
            ),
            demand: per_rule(
                "sluice_rlqs_demand_per_second",
                "Requests per second the Envoys on this instance report for the rule's buckets (allowed + denied)",
            ),
            granted: per_rule(
                "sluice_rlqs_granted_per_second",
                "Tokens per second this instance hands out of the rule's budgets",
            ),
            shadow_denied: counter_vec(
                registry,
                "sluice_rlqs_shadow_denied_total",
                "Requests a shadow-mode rule's budget would have denied (estimated from reports)",
                &["domain", "rule"],
            ),
            refused_reports: {
                let refused = counter_vec(
                    registry,
                    "sluice_rlqs_reports_refused_total",
                    "RLQS reports that ended their stream: invalid_request (the message does not decode), request_too_large (over 4 MiB)",
                    &["reason"],
                );
                for reason in ["invalid_request", "request_too_large"] {
                    refused.with_label_values(&[reason]);
                }
                refused
            },
            refused_streams: {
                let refused = counter_vec(
                    registry,
                    "sluice_rlqs_streams_refused_total",
                    "RLQS streams refused when they opened: over_cap (RLQS_MAX_STREAMS open already, RESOURCE_EXHAUSTED), draining (UNAVAILABLE)",
                    &["reason"],
                );
                for reason in ["over_cap", "draining"] {
                    refused.with_label_values(&[reason]);
                }
                refused
            },
            max_streams: gauge(
                registry,
                "sluice_rlqs_max_streams",
                "RLQS streams this instance takes at once (RLQS_MAX_STREAMS)",
            ),
            max_buckets: gauge(
                registry,
                "sluice_rlqs_max_buckets",
                "RLQS buckets this instance tracks at most (RLQS_MAX_BUCKETS)",
            ),
        }
    }
}
