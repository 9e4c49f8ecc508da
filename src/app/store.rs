//! The store stack the settings ask for, and where its time comes from.

use std::sync::Arc;

use super::AppError;
use crate::clock::{Clock, MonotonicClock, SystemClock};
use crate::settings::{Backend, Settings};
use crate::store::redis::RedisOptions;
use crate::store::{
    Leased, MemoryStore, OverLimitCache, PerSecondSplit, RedisStore, Regions, Resilient, Shared,
    Store,
};

/// The store stack, and the shared store at its bottom (what the lease layer wraps), whose
/// handle goes to those that ask more of it than counting: RLQS's claims, the warm-up and
/// the probe at startup.
pub(super) struct Stores {
    /// What the limiter counts in: the top of the stack.
    pub top: Arc<dyn Store>,
    /// The shared store (the memory store alone, or the failure policy around Redis, or the
    /// per-second split of two).
    pub shared: Arc<dyn Shared>,
}

/// Where the stores take the time from.
pub(super) enum Time {
    /// The wall clock in process, Redis's own `TIME` in Redis.
    System,
    /// One clock for every store, Redis's script included.
    Pinned(Arc<dyn Clock>),
}

impl Time {
    /// The wall clock: of the counters (in memory, in Redis's script when pinned) and of the
    /// layers that remember when they end (the failure policy, the over-limit cache).
    fn wall(&self) -> Arc<dyn Clock> {
        match self {
            Time::System => Arc::new(SystemClock),
            Time::Pinned(clock) => clock.clone(),
        }
    }

    /// The clock of what lives for a duration in this process (leased blocks): a monotonic
    /// one, which NTP cannot stretch.
    fn durations(&self) -> Arc<dyn Clock> {
        match self {
            Time::System => Arc::new(MonotonicClock::new()),
            Time::Pinned(clock) => clock.clone(),
        }
    }
}

/// The store stack `settings` ask for: the memory store, or the layers of src/store/mod.rs
/// around Redis, from the inside out.
pub(super) fn build_store(settings: &Settings, time: &Time) -> Result<Stores, AppError> {
    let Backend::Redis = settings.backend else {
        let memory = memory(settings, time);
        return Ok(Stores {
            top: memory.clone(),
            shared: memory,
        });
    };
    let options = settings
        .redis
        .as_ref()
        .ok_or_else(|| AppError::Serve("the redis backend needs REDIS_URL".into()))?;
    // redis and resilient: each Redis behind its own failure policy (one failing leaves the
    // other exact).
    let main = resilient_redis(settings, options, time)?;
    tracing::info!(kind = ?options.kind, prefix = %options.key_prefix, "counting in redis");
    let per_second = (settings.redis_per_second.as_ref())
        .map(|fast| {
            let store = resilient_redis(settings, fast, time)?;
            tracing::info!(kind = ?fast.kind, "counting limits per second in their own redis (REDIS_PERSECOND)");
            Ok::<_, AppError>(store)
        })
        .transpose()?;
    // split: the counters with one-second windows on their own Redis (REDIS_PERSECOND).
    let shared = split(main.clone(), per_second.clone());
    // regions: global rules (`scope: global`) through this region's pools, granted by the
    // root (ROOT_REDIS_URL); the rest passes through.
    let leasing = match &settings.root {
        None => shared.clone(),
        Some((root, region)) => {
            let mut root_store = RedisStore::new(root).map_err(AppError::Serve)?;
            if let Time::Pinned(clock) = time {
                root_store = root_store.with_clock(clock.clone());
            }
            tracing::info!(region = %region.region, kind = ?root.kind, "global rules lease from the root redis (ROOT_REDIS_URL)");
            let regions: Arc<dyn Shared> = Arc::new(Regions::new(
                shared.clone(),
                Arc::new(root_store),
                region.clone(),
                time.durations(),
            ));
            regions
        }
    };
    // lease: blocks of units for `consistency: leased` rules; other requests pass through.
    let store = Arc::new(Leased::new(
        leasing,
        settings.lease.clone(),
        time.durations(),
    ));
    // overlimit: refusals remembered until the window ends, late answers' included.
    let late = [Some(main), per_second].into_iter().flatten();
    Ok(Stores {
        top: over_limit_cache(store, settings, time, late),
        shared,
    })
}

/// The memory store alone (one instance's counters).
fn memory(settings: &Settings, time: &Time) -> Arc<MemoryStore> {
    if settings.kubernetes {
        tracing::warn!(
            "memory store under Kubernetes: each replica counts on its own, so N replicas admit up to N times every limit; use a shared store for fleet-wide limits"
        );
    }
    Arc::new(MemoryStore::new(settings.memory, time.wall()))
}

/// A Redis store behind its failure policy. A script call may outlive its requests'
/// deadline: its answers still count (see `Resilient`), up to the background limit.
fn resilient_redis(
    settings: &Settings,
    options: &RedisOptions,
    time: &Time,
) -> Result<Arc<Resilient>, AppError> {
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
        time.wall(),
    )))
}

/// The main store, or it and the per-second one behind the split.
fn split(main: Arc<Resilient>, per_second: Option<Arc<Resilient>>) -> Arc<dyn Shared> {
    match per_second {
        None => main,
        Some(per_second) => Arc::new(PerSecondSplit::new(main, per_second)),
    }
}

/// `store` behind the over-limit cache when `LOCAL_CACHE_SIZE_IN_BYTES` turns it on; the
/// answers the `late` stores get after their deadline teach it too.
fn over_limit_cache(
    store: Arc<dyn Store>,
    settings: &Settings,
    time: &Time,
    late: impl Iterator<Item = Arc<Resilient>>,
) -> Arc<dyn Store> {
    if settings.local_cache_keys == 0 {
        return store;
    }
    let cache = OverLimitCache::new(store, settings.local_cache_keys, time.wall());
    for resilient in late {
        resilient.on_late_answers(cache.late_answers());
    }
    Arc::new(cache)
}
