//! The local over-limit cache (the reference service's `LOCAL_CACHE_SIZE_IN_BYTES`): once
//! the store rejects a counter until `t`, this instance answers requests that need that
//! counter from memory until `t`, without a store round trip. Hot abusive keys then cost
//! nothing, which is when the store is most loaded.
//!
//! Only enforced counters are cached (a shadow or quota counter alone does not reject a
//! request), only real store answers (not failure-mode ones), and a refund through this
//! instance forgets the key (capacity came back before `t`).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex};

use super::{Applied, Batch, BoxFuture, CounterKey, Role, Store, StoreError, StoreStatus};
use crate::algorithm::{Decision, Micros};
use crate::clock::Clock;

const SHARDS: usize = 16;

/// A store front that remembers which counters are over the limit until when.
pub struct OverLimitCache {
    inner: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    shards: Box<[Mutex<HashMap<CounterKey, Micros>>]>,
    hasher: RandomState,
    max_per_shard: usize,
}

impl OverLimitCache {
    /// Caches up to about `max_keys` over-limit counters in front of `inner`.
    pub fn new(inner: Arc<dyn Store>, max_keys: usize, clock: Arc<dyn Clock>) -> Self {
        Self {
            inner,
            clock,
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
            max_per_shard: max_keys.div_ceil(SHARDS).max(1),
        }
    }

    fn shard(&self, key: &CounterKey) -> &Mutex<HashMap<CounterKey, Micros>> {
        &self.shards[(self.hasher.hash_one(key) as usize) % SHARDS]
    }

    /// Until when `key` is known to be over the limit, if it is now.
    fn over_until(&self, key: &CounterKey, now: Micros) -> Option<Micros> {
        let shard = self.shard(key).lock().unwrap_or_else(|p| p.into_inner());
        shard.get(key).copied().filter(|&until| until > now)
    }

    fn remember(&self, key: &CounterKey, until: Micros, now: Micros) {
        let mut shard = self.shard(key).lock().unwrap_or_else(|p| p.into_inner());
        if shard.len() >= self.max_per_shard && !shard.contains_key(key) {
            shard.retain(|_, &mut t| t > now);
            if shard.len() >= self.max_per_shard {
                return; // full of live entries: the store still answers correctly
            }
        }
        shard.insert(key.clone(), until);
    }

    fn forget(&self, key: &CounterKey) {
        self.shard(key)
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    async fn apply_batch(&self, batch: &Batch) -> Result<Applied, StoreError> {
        let now = self.clock.now();
        // A request with an enforced counter known to be over is rejected; rejected
        // requests charge nothing, so the store need not be asked at all.
        let cached = if batch.always_admit || batch.ops.iter().any(|op| op.hits < 0) {
            None // global shadow mode admits anyway; refunds must reach the store
        } else {
            batch.ops.iter().find_map(|op| {
                (op.role == Role::Enforce && op.hits > 0)
                    .then(|| self.over_until(&op.key, now))
                    .flatten()
                    .map(|until| (&op.key, until))
            })
        };
        if let Some((over_key, until)) = cached {
            let decisions = batch
                .ops
                .iter()
                .map(|op| {
                    let reset_after = op.limit.window_left(now);
                    if op.key == *over_key {
                        Decision {
                            allowed: false,
                            remaining: 0,
                            reset_after: reset_after.max(until - now),
                            retry_after: Some(until - now),
                        }
                    } else {
                        // Not asked: what the store would say is unknown; nothing is charged.
                        Decision {
                            allowed: true,
                            remaining: op.limit.requests,
                            reset_after,
                            retry_after: None,
                        }
                    }
                })
                .collect();
            return Ok(Applied {
                decisions,
                admitted: false,
                degraded: false,
                from_cache: true,
            });
        }

        let applied = self.inner.apply(batch).await?;
        if !applied.degraded {
            for (op, decision) in batch.ops.iter().zip(&applied.decisions) {
                if op.hits < 0 {
                    self.forget(&op.key);
                } else if op.role == Role::Enforce
                    && !decision.allowed
                    && let Some(retry) = decision.retry_after
                {
                    self.remember(&op.key, now + retry, now);
                }
            }
        }
        Ok(applied)
    }
}

impl Store for OverLimitCache {
    fn apply<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<Applied, StoreError>> {
        Box::pin(self.apply_batch(batch))
    }

    fn status(&self) -> StoreStatus {
        self.inner.status()
    }
}
