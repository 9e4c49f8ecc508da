//! The local over-limit cache (the reference service's `LOCAL_CACHE_SIZE_IN_BYTES`): once
//! the store rejects a counter until `t`, this instance rejects requests that need that
//! counter until `t` without the store deciding them. A request carrying only such counters
//! costs no store round trip: hot abusive keys then cost nothing, which is when the store is
//! most loaded. The other counters of a request are read in one call that charges nothing,
//! so that every status is the one the store would give.
//!
//! A shadow counter known to be over is answered from the cache too, as the reference does:
//! it rejects nothing, and the store decides the request's other counters (none: no call).
//!
//! Enforced and shadow counters are cached (a quota counter's refusal alone decides
//! nothing), only real store answers (not failure-mode ones), and a refund through this
//! instance forgets the key (capacity came back before `t`). A cached refusal answers only
//! requests it certainly covers: at least as many hits, and a limit no larger (the classes of
//! a `priorities` rule share one counter with different shares: a refused `low` says
//! nothing about `critical`). Concurrency counters are never cached: their acquisitions
//! count even when refused, and their releases always reach the store.

use std::sync::Arc;

use super::LateAnswers;
use super::digest::{DigestMap, Digester, Sharded};
use super::{
    Admission, Applied, Batch, BoxFuture, CounterOp, Role, Store, StoreError, StoreStatus,
};
use crate::algorithm::{Decision, Micros};
use crate::clock::Clock;

const SHARDS: usize = 16;

/// A store front that remembers which counters are over the limit until when.
pub struct OverLimitCache {
    inner: Arc<dyn Store>,
    refusals: Arc<Refusals>,
}

/// The refusals remembered, shared with the sink of late answers.
struct Refusals {
    clock: Arc<dyn Clock>,
    /// Refusals by the digest of their counter's key: a fixed size per entry, whatever the
    /// descriptor values.
    shards: Sharded<DigestMap<Over>>,
    digester: Digester,
    max_per_shard: usize,
}

/// A refusal the store gave: `hits` hits of a limit of `requests` (burst `burst`) cannot
/// pass before `until`.
#[derive(Debug, Clone, Copy)]
struct Over {
    until: Micros,
    hits: i64,
    requests: u64,
    burst: u64,
}

impl Over {
    /// Whether this refusal certainly applies to `op` at `now`.
    fn covers(&self, op: &CounterOp, now: Micros) -> bool {
        self.until > now
            && op.hits >= self.hits
            && op.limit.requests <= self.requests
            && op.limit.burst <= self.burst
    }
}

/// Whether a refusal of `op` may be cached: an enforced or shadow counter's (a quota
/// counter's refusal alone decides nothing), never a concurrency counter's.
fn cacheable(op: &CounterOp) -> bool {
    matches!(op.role, Role::Enforce | Role::Shadow)
        && op.hits > 0
        && op.limit.algorithm.cacheable()
        // A usage budget's charges count even when refused: the store must see each.
        && !op.limit.overdraft
}

/// The decision for `op`, remembered as refused until `until`.
fn refusal(op: &CounterOp, until: Micros, now: Micros) -> Decision {
    Decision {
        overdraft: 0,
        allowed: false,
        remaining: 0,
        reset_after: op.limit.window_left(now).max(until - now),
        retry_after: Some(until - now),
    }
}

impl OverLimitCache {
    /// Caches up to about `max_keys` over-limit counters in front of `inner`.
    pub fn new(inner: Arc<dyn Store>, max_keys: usize, clock: Arc<dyn Clock>) -> Self {
        Self {
            inner,
            refusals: Arc::new(Refusals {
                clock,
                shards: Sharded::new(SHARDS, |_| DigestMap::default()),
                digester: Digester::new(),
                max_per_shard: max_keys.div_ceil(SHARDS).max(1),
            }),
        }
    }

    /// The sink for answers that arrived after their caller was answered by the failure
    /// policy (see [`super::Resilient::on_late_answers`]): their refusals are remembered too.
    pub fn late_answers(&self) -> Arc<dyn LateAnswers> {
        self.refusals.clone()
    }

    async fn apply_batch(&self, batch: &Batch) -> Result<Applied, StoreError> {
        let now = self.refusals.clock.now();
        if batch.admission != Admission::ByRule || batch.ops.iter().any(|op| op.hits < 0) {
            // Global shadow mode admits anyway; refunds must reach the store.
            return self.decide(batch, now).await;
        }
        // Until when the cache knows each operation's counter to be over, if it does.
        let known: Vec<Option<Micros>> = batch
            .ops
            .iter()
            .map(|op| {
                cacheable(op)
                    .then(|| self.refusals.over_until(op, now))
                    .flatten()
            })
            .collect();
        let over = (0..batch.ops.len())
            .find(|&i| known[i].is_some() && batch.ops[i].role == Role::Enforce);
        if let Some(over) = over {
            return Ok(self
                .reject(batch, over, known[over].unwrap_or(now), now)
                .await);
        }
        if known.iter().all(Option::is_none) {
            return self.decide(batch, now).await;
        }
        self.decide_without(batch, &known, now).await
    }

    /// The store decides `batch`; its refusals are remembered.
    async fn decide(&self, batch: &Batch, now: Micros) -> Result<Applied, StoreError> {
        let applied = self.inner.apply(batch).await?;
        if !applied.degraded {
            self.refusals.learn(batch, &applied, now);
        }
        Ok(applied)
    }

    /// A request with an enforced counter known to be over until `until` is rejected; a
    /// rejected request charges nothing, so the store need not decide it.
    async fn reject(&self, batch: &Batch, over: usize, until: Micros, now: Micros) -> Applied {
        let over_key = &batch.ops[over].key;
        let (cached, others): (Vec<usize>, Vec<usize>) =
            (0..batch.ops.len()).partition(|&i| batch.ops[i].key == *over_key);
        let mut calls = super::Calls::default();
        let mut decisions: Vec<Decision> =
            batch.ops.iter().map(|op| refusal(op, until, now)).collect();
        // The other counters' statuses are the store's: it reads them as for a rejected
        // request (nothing charged) in one call, which a request carrying only the cached
        // key does not need, so a flood on a hot abusive key still costs no round trip.
        if !others.is_empty() {
            let read = Batch {
                ops: others.iter().map(|&i| batch.ops[i].clone()).collect(),
                admission: Admission::Never,
                deadline: batch.deadline,
                charged_at: None,
            };
            match self.inner.apply(&read).await {
                Ok(applied) => {
                    calls = applied.calls;
                    for (&i, decision) in others.iter().zip(applied.decisions) {
                        decisions[i] = decision;
                    }
                }
                // The refusal stands; the other counters are reported as unknown (all left).
                Err(_) => {
                    for &i in &others {
                        let limit = &batch.ops[i].limit;
                        decisions[i] = Decision {
                            overdraft: 0,
                            allowed: true,
                            remaining: limit.requests,
                            reset_after: limit.window_left(now),
                            retry_after: None,
                        };
                    }
                }
            }
        }
        Applied {
            decisions,
            admitted: false,
            degraded: false,
            cached,
            decided_at: None,
            calls,
        }
    }

    /// A request with shadow counters known to be over: those are answered from the cache
    /// (they reject nothing, and a refused counter is not charged), the store decides the
    /// others, if any.
    async fn decide_without(
        &self,
        batch: &Batch,
        known: &[Option<Micros>],
        now: Micros,
    ) -> Result<Applied, StoreError> {
        let (cached, rest): (Vec<usize>, Vec<usize>) =
            (0..batch.ops.len()).partition(|&i| known[i].is_some());
        let mut decisions: Vec<Decision> = batch
            .ops
            .iter()
            .zip(known)
            .map(|(op, until)| refusal(op, until.unwrap_or(now), now))
            .collect();
        if rest.is_empty() {
            return Ok(Applied {
                admitted: super::admitted(&batch.ops, &decisions, batch.admission),
                decisions,
                degraded: false,
                cached,
                decided_at: None,
                calls: Default::default(),
            });
        }
        let rest_batch = Batch {
            ops: rest.iter().map(|&i| batch.ops[i].clone()).collect(),
            admission: batch.admission,
            deadline: batch.deadline,
            charged_at: None,
        };
        let applied = self.decide(&rest_batch, now).await?;
        for (&i, decision) in rest.iter().zip(&applied.decisions) {
            decisions[i] = *decision;
        }
        Ok(Applied {
            decisions,
            admitted: applied.admitted,
            degraded: applied.degraded,
            cached,
            decided_at: applied.decided_at,
            calls: applied.calls,
        })
    }
}

impl LateAnswers for Refusals {
    fn answered(&self, batch: &Batch, applied: &Applied, asked_at: Micros) {
        // The store decided between `asked_at` and now: counting from `asked_at` never
        // remembers a refusal longer than it lasts.
        if !applied.degraded {
            self.learn(batch, applied, asked_at);
        }
    }
}

// === impl Refusals ===

impl Refusals {
    /// Remembers the refusals and forgets the refunded keys of a store answer given at `now`.
    fn learn(&self, batch: &Batch, applied: &Applied, now: Micros) {
        for (op, decision) in batch.ops.iter().zip(&applied.decisions) {
            if op.hits < 0 {
                self.forget(op);
            } else if cacheable(op)
                && !decision.allowed
                && let Some(retry) = decision.retry_after
            {
                self.remember(op, now + retry, now);
            }
        }
    }

    /// Until when `op` is known to be over the limit, if it is now.
    fn over_until(&self, op: &CounterOp, now: Micros) -> Option<Micros> {
        let key = self.digester.digest(&op.key);
        let shard = self.shards.of(&key).lock();
        shard
            .get(&key)
            .filter(|over| over.covers(op, now))
            .map(|over| over.until)
    }

    fn remember(&self, op: &CounterOp, until: Micros, now: Micros) {
        let key = self.digester.digest(&op.key);
        let mut shard = self.shards.of(&key).lock();
        if shard.len() >= self.max_per_shard && !shard.contains_key(&key) {
            shard.retain(|_, over| over.until > now);
            if shard.len() >= self.max_per_shard {
                return; // full of live entries: the store still answers correctly
            }
        }
        shard.insert(
            key,
            Over {
                until,
                hits: op.hits,
                requests: op.limit.requests,
                burst: op.limit.burst,
            },
        );
    }

    fn forget(&self, op: &CounterOp) {
        let key = self.digester.digest(&op.key);
        self.shards.of(&key).lock().remove(&key);
    }
}

impl Store for OverLimitCache {
    fn apply<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<Applied, StoreError>> {
        Box::pin(self.apply_batch(batch))
    }

    /// Forgets the refusals remembered for these counters, then resets them in the store:
    /// a reset counter is not refused from memory until its window ends.
    fn reset<'a>(&'a self, ops: &'a [CounterOp]) -> BoxFuture<'a, Result<u64, StoreError>> {
        for op in ops {
            self.refusals.forget(op);
        }
        self.inner.reset(ops)
    }

    fn store_key(&self, op: &CounterOp) -> String {
        self.inner.store_key(op)
    }

    fn status(&self) -> StoreStatus {
        self.inner.status()
    }

    fn shut_down(&self) -> BoxFuture<'_, ()> {
        self.inner.shut_down()
    }
}
