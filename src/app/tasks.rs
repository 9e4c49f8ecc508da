//! The service's background tasks that tick once a second until the drain: RLQS's tick, the
//! refused keys' counts and the watch that tells readiness the gRPC turns are saturated.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::SATURATED_AFTER;
use crate::health::Health;
use crate::net::turns::Turns;
use crate::quota::Quotas;

/// The RLQS tick, once a second until `drain`: shares, TTLs, claims, abandons; on the RLQS
/// thread (a tick over 100,000 buckets takes some 20 ms).
pub(super) fn spawn_quota_ticks(
    quotas: Arc<Quotas>,
    lane: &crate::rlqs::Lane,
    drain: &CancellationToken,
) {
    let stop = drain.clone();
    lane.handle().spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => quotas.tick().await,
            }
        }
    });
}

/// Refused keys, once a second until `drain`: the new hashes to the shared store, the windows
/// that ended counted, the counts into the metrics.
pub(super) fn spawn_refused_ticks(
    limiter: Arc<crate::limiter::Limiter>,
    shared: Arc<dyn crate::store::Shared>,
    metrics: Arc<super::metrics::Metrics>,
    drain: &CancellationToken,
) {
    let stop = drain.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            for published in limiter.distinct().tick(shared.as_ref()).await {
                metrics.refused_keys(&published);
            }
        }
    });
}

/// Tells readiness, once a second until `drain`, whether requests have waited for turns
/// without a break for [`SATURATED_AFTER`].
pub(super) fn spawn_turn_watch(turns: Arc<Turns>, health: Arc<Health>, drain: &CancellationToken) {
    let stop = drain.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let busy = turns.saturated_for().filter(|t| *t >= SATURATED_AFTER);
            health.set_busy(busy.map(|t| t.as_secs()));
        }
    });
}
