//! RLQS's decision: what each Envoy may admit of a rule's budget. The stream face
//! ([`crate::rlqs`]) turns Envoy's reports into [`Usage`]s and the [`Action`]s waiting in a
//! stream's [`Outbox`] into answers; everything between is here, in the project's own types
//! (no protos), beside the limiter.
//!
//! - `bucket`: bucket ids → canonical keys → the rule and what it gives;
//! - `share`: the division of a budget by demand (pure);
//! - `budget`: what each Envoy holds of one budget, and the step that moves the shares
//!   without passing the bound;
//! - `quotas`: every stream and budget of the instance, the tick and claims;
//!   `quotas/report.rs` a usage report, `quotas/lifecycle.rs` renewals, abandons, reloads and
//!   the drain, `quotas/view.rs` the gauges, a bucket explained and the `/rlconfig` lines;
//! - `outbox`: what waits to be sent on a stream;
//! - `metrics`: the `sluice_rlqs_*` series.

mod bucket;
mod budget;
mod metrics;
mod outbox;
mod quotas;
mod share;

pub use bucket::{BucketKey, MAX_ID_BYTES, MAX_PAIRS, Quota, Rejected};
pub use budget::PeerId;
pub use metrics::RlqsMetrics;
pub use outbox::{Action, Assigned, Outbox};
pub use quotas::{
    BucketView, BudgetView, DRAIN_TTL, Quotas, REPORTS_PER_SECOND, ReportSummary, RlqsOptions,
    Usage,
};
pub use share::{Budget, Share, divide};
