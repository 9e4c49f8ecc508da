//! The store stack the settings ask for, and where its time comes from.

use std::sync::Arc;

use super::AppError;
use crate::clock::{Clock, SystemClock};
use crate::settings::{Backend, Settings};
use crate::store::redis::RedisOptions;
use crate::store::{
    Leased, MemoryStore, OverLimitCache, PerSecondSplit, RedisStore, Resilient, Store,
};

/// Where the stores take the time from.
pub(super) enum Time {
    /// The wall clock in process, Redis's own `TIME` in Redis.
    System,
    /// One clock for every store, Redis's script included.
    Pinned(Arc<dyn Clock>),
}

/// The store stack `settings` ask for: the memory store, or Redis behind its failure policy
/// (two with `REDIS_PERSECOND`), behind the leasing layer, behind the over-limit cache when
/// it is on.
pub(super) fn build_store(settings: &Settings, time: &Time) -> Result<Arc<dyn Store>, AppError> {
    let clock: Arc<dyn Clock> = match time {
        Time::System => Arc::new(SystemClock),
        Time::Pinned(clock) => clock.clone(),
    };
    Ok(match settings.backend {
        Backend::Memory => {
            if settings.kubernetes {
                tracing::warn!(
                    "memory store under Kubernetes: each replica counts on its own, so N replicas admit up to N times every limit; use a shared store for fleet-wide limits"
                );
            }
            Arc::new(MemoryStore::new(settings.memory, clock))
        }
        Backend::Redis => {
            let options = settings
                .redis
                .as_ref()
                .ok_or_else(|| AppError::Serve("the redis backend needs REDIS_URL".into()))?;
            // Each Redis behind its own failure policy: one failing leaves the other exact.
            let resilient = |options: &RedisOptions| -> Result<Arc<Resilient>, AppError> {
                // A script call may outlive its requests' deadline: its answers still count
                // (see `Resilient`), up to the background limit.
                let mut redis = RedisStore::new(&RedisOptions {
                    call_timeout: settings.resilience.background_limit(),
                    ..options.clone()
                })
                .map_err(AppError::Serve)?;
                if let Time::Pinned(clock) = time {
                    redis = redis.with_clock(clock.clone());
                }
                Ok(Arc::new(Resilient::new(
                    Arc::new(redis),
                    settings.resilience,
                    clock.clone(),
                )))
            };
            let main = resilient(options)?;
            tracing::info!(kind = ?options.kind, prefix = %options.key_prefix, "counting in redis");
            let mut shared = vec![main.clone()];
            let store: Arc<dyn Store> = match &settings.redis_per_second {
                None => main,
                Some(fast) => {
                    let per_second = resilient(fast)?;
                    tracing::info!(kind = ?fast.kind, "counting limits per second in their own redis (REDIS_PERSECOND)");
                    shared.push(per_second.clone());
                    Arc::new(PerSecondSplit::new(main, per_second))
                }
            };
            // Leased rules take blocks from the shared counters (the layer passes every
            // other request through untouched).
            // Blocks live for durations: a monotonic clock, which NTP cannot stretch.
            let durations: Arc<dyn Clock> = match time {
                Time::System => Arc::new(crate::clock::MonotonicClock::new()),
                Time::Pinned(clock) => clock.clone(),
            };
            let store: Arc<dyn Store> =
                Arc::new(Leased::new(store, settings.lease.clone(), durations));
            if settings.local_cache_keys > 0 {
                let cache = OverLimitCache::new(store, settings.local_cache_keys, clock);
                // Answers that arrive after their deadline still teach the cache.
                for resilient in &shared {
                    resilient.on_late_answers(cache.late_answers());
                }
                Arc::new(cache)
            } else {
                store
            }
        }
    })
}
