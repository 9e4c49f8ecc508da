//! RLQS's protos ⇄ the decision's types, as `rls/convert.rs` is for `ShouldRateLimit`:
//! a report's usages in, a bucket's action out.

use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Kind, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::google::protobuf::{Duration as ProtoDuration, UInt32Value};

use crate::quota::{Action, Assigned, BucketKey, Rejected, Usage};

/// A report's first `cap` usages (the stream's bucket cap: those past it are not looked at).
pub fn usages(reported: Vec<BucketQuotaUsage>, cap: usize) -> Vec<Usage> {
    reported.into_iter().take(cap).map(usage).collect()
}

/// One bucket's usage: its id made canonical (or why it is refused), and whether this is
/// Envoy's first sight of the bucket (`time_elapsed` 0 or unset; a report after a reconnect
/// says 1 s or more).
fn usage(u: BucketQuotaUsage) -> Usage {
    Usage {
        bucket: u
            .bucket_id
            .as_ref()
            .map_or(Err(Rejected::Empty), |b| BucketKey::new(&b.bucket)),
        allowed: u.num_requests_allowed,
        denied: u.num_requests_denied,
        first_sight: u
            .time_elapsed
            .is_none_or(|t| t.seconds <= 0 && t.nanos <= 0),
    }
}

/// One bucket's action as Envoy reads it.
pub fn encode(bucket: &BucketKey, action: Action) -> BucketAction {
    let kind = match action {
        Action::Abandon => Kind::AbandonAction(AbandonAction {}),
        Action::Assign(assigned, ttl) => Kind::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(seconds(Duration::from_secs(ttl.max(1)))),
            rate_limit_strategy: Some(RateLimitStrategy {
                strategy: Some(strategy(assigned)),
            }),
        }),
    };
    BucketAction {
        bucket_id: Some(BucketId {
            bucket: bucket.to_map(),
        }),
        bucket_action: Some(kind),
    }
}

fn strategy(assigned: Assigned) -> Strategy {
    match assigned {
        Assigned::AllowAll => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
        Assigned::DenyAll => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
        Assigned::Bucket(share, window) => {
            let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
            Strategy::TokenBucket(TokenBucket {
                max_tokens: clamp(share.burst),
                tokens_per_fill: Some(UInt32Value {
                    value: clamp(share.rate),
                }),
                fill_interval: Some(seconds(Duration::from_secs(window.max(1)))),
            })
        }
    }
}

fn seconds(d: Duration) -> ProtoDuration {
    ProtoDuration {
        seconds: d.as_secs() as i64,
        nanos: 0,
    }
}
