//! Which Redis key holds a counter, and clearing counters (the admin API's reset).
//!
//! A Sluice key is the key prefix and the counter's key; its value names its window. A
//! reference-layout key ([`crate::store::CounterKey::reference`]) is the prefix, the
//! reference's `_`-joined parts and the window start in seconds, holding a plain integer
//! that the reference's `INCRBY` can charge too, with the reference's expiry: the unit's
//! length plus a random jitter of up to `EXPIRATION_JITTER_MAX_SECONDS`.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{ConnHandle, RedisStore, Shared, args};
use crate::algorithm::{Micros, SECOND};
use crate::clock::{Clock, SystemClock};
use crate::store::{CounterOp, StoreError};

/// Jitter for reference-layout expiries: a splitmix64 sequence, seeded from the clock (the
/// expiries only need to spread, not to be unpredictable).
pub(super) struct Jitter {
    state: AtomicU64,
    max_seconds: u64,
}

impl Jitter {
    pub(super) fn new(max_seconds: u64) -> Self {
        Self {
            state: AtomicU64::new(SystemClock.now() | 1),
            max_seconds,
        }
    }

    /// Seconds in `0..max` (the reference's `Int63n(max)`), 0 when there is no jitter.
    fn draw(&self) -> u64 {
        if self.max_seconds == 0 {
            return 0;
        }
        let mut z = self
            .state
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % self.max_seconds
    }
}

/// Whether `op` is counted in the reference's layout: a fixed window under a reference key.
pub(super) fn is_reference(op: &CounterOp) -> bool {
    op.key.is_reference() && op.limit.algorithm.in_reference_layout()
}

impl Shared {
    /// This instance's time in microseconds: what a reference-layout key's window start is
    /// computed from, as the reference computes it from its own clock.
    pub(super) fn local_now(&self) -> Micros {
        self.clock
            .get()
            .map_or_else(|| SystemClock.now(), |c| c.now())
    }

    /// The time reference-layout keys among `ops` name their window by: this instance's
    /// clock, read only when one of them needs it (0 otherwise).
    pub(super) fn keys_now<'a>(&self, mut ops: impl Iterator<Item = &'a CounterOp>) -> Micros {
        if ops.any(is_reference) {
            self.local_now()
        } else {
            0
        }
    }

    /// The Redis key of `op`'s counter at `now` (µs; see [`Shared::keys_now`]).
    pub(super) fn key_of(&self, op: &CounterOp, now: Micros) -> String {
        let mut key = String::with_capacity(self.prefix.len() + op.key.as_str().len() + 12);
        key.push_str(&self.prefix);
        key.push_str(op.key.as_str());
        if is_reference(op) {
            let unit = (op.limit.window / SECOND).max(1);
            let seconds = now / SECOND;
            key.push_str(&(seconds - seconds % unit).to_string());
        }
        key
    }

    /// The algorithm code and burst value the counter script gets for `op`: a
    /// reference-layout counter is a plain integer, and its burst slot carries its expiry in
    /// seconds (`lua/fixed_window.lua`).
    pub(super) fn script_algorithm(&self, op: &CounterOp) -> (i64, i64) {
        if is_reference(op) {
            let ttl = (op.limit.window / SECOND).max(1) + self.jitter.draw();
            (
                args::REFERENCE_WINDOW,
                i64::try_from(ttl).unwrap_or(i64::MAX),
            )
        } else {
            let burst = i64::try_from(op.limit.burst).unwrap_or(i64::MAX);
            (args::algorithm_code(op.limit.algorithm), burst)
        }
    }
}

impl RedisStore {
    /// Deletes the counters' keys (one `DEL` each: in a Cluster they live in different
    /// slots); answers how many existed.
    pub(super) async fn delete(&self, ops: &[CounterOp]) -> Result<u64, StoreError> {
        let shared = &self.shared;
        let now = shared.local_now();
        let mut deleted = 0;
        for op in ops {
            let key = shared.key_of(op, now);
            let (index, conn) = shared.connector.get().await?;
            let cmd = redis::cmd("DEL").arg(&key).clone();
            let result: redis::RedisResult<u64> = match conn {
                ConnHandle::Node(mut c) => cmd.query_async(&mut c).await,
                ConnHandle::Cluster(mut c) => cmd.query_async(&mut c).await,
            };
            deleted += result.map_err(|e| {
                let error = StoreError::from(e);
                if error.is_transient() {
                    shared.connector.reset(index);
                }
                error
            })?;
        }
        Ok(deleted)
    }
}
