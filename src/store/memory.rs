// Why one long file: sharding, expiry, the byte bound and eviction share one lock discipline, kept
// in view together.
//! The in-memory store: the embedded default, correct for ONE instance only (several
//! instances with private memory admit the limit once each).
//!
//! A fixed number of shards, each a `HashMap` behind its own `parking_lot::Mutex` (never held
//! across an `.await`: a batch is applied synchronously). A request locks only the shards
//! its counters live in, in ascending order (so two requests can never deadlock), which
//! makes the whole batch atomic without a global lock. Idle counters expire: a background
//! sweeper drops them, and a full shard purges them before evicting anything.
//!
//! Memory is bounded in bytes, whatever the descriptor values: a counter is stored under a
//! 128-bit keyed digest of its key (`memory/table.rs`), in a fixed-size entry, and a cap on
//! tracked counters bounds their number. When a shard is full, the victim is the counter
//! charged the fewest hits (then the closest to expiry) among a random sample: a flood of
//! one-hit keys evicts its own kind, and the counters in real use, those that have been
//! charged again and again and are the ones near their limits, survive it.

mod leases;
mod pools;
mod slot;
mod table;

use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::{
    Applied, Batch, BoxFuture, CounterOp, Grant, LeaseAsk, Store, StoreError, StoreStatus, admitted,
};
use crate::algorithm::{self, Algorithm, Micros, SECOND, State, Transition};
use crate::clock::Clock;

use super::digest::{DigestMap, Digester, Sharded};
use slot::Slot;
use table::{Digest, Table};

/// Counters drawn at random to choose a victim when a full shard must evict. With a fraction
/// `f` of a shard's counters charged more than once, all 16 are such counters with
/// probability `f^16`: with 90 % of them in real use, one eviction in five touches them.
const EVICTION_SAMPLE: usize = 16;
/// A store that evicted a live counter this recently is reported full.
const FULL_FOR: Micros = 60 * SECOND;
/// A full shard scans for expired entries at most this often.
const PURGE_INTERVAL: Micros = SECOND;
/// How often the background sweeper drops expired counters.
const SWEEP_INTERVAL: Duration = Duration::from_secs(2);
/// Counters a shard holds at the cap: 7/8 of 2^14 hash buckets.
const FULL_SHARD: u64 = 16_384 * 7 / 8;
/// Eviction warnings are logged at most this often.
const WARN_INTERVAL: Micros = 60 * SECOND;
/// Instances the lease model remembers at most (names are the callers' own).
const MAX_INSTANCES: usize = 4096;

/// Heap bytes a counter of the cap may take at most: a 48-byte entry and its share of the
/// index (at worst two buckets of 25 bytes each × 8/7, for a shard just past a doubling of
/// its index; with the default cap, shards are sized so that about 29 bytes is the share).
pub const MAX_BYTES_PER_COUNTER: u64 = 48 + 58;

/// Memory store settings.
#[derive(Debug, Clone, Copy)]
pub struct MemoryOptions {
    /// Cap on tracked counters (approximate: enforced per shard).
    pub max_keys: u64,
}

impl Default for MemoryOptions {
    fn default() -> Self {
        Self {
            max_keys: 1_000_000,
        }
    }
}

/// A cheap-to-clone handle to the shared counters.
#[derive(Clone)]
pub struct MemoryStore {
    shared: Arc<Shared>,
}

struct Shared {
    shards: Sharded<Shard>,
    digester: Digester,
    clock: Arc<dyn Clock>,
    max_keys: u64,
    max_per_shard: usize,
    tracked: AtomicU64,
    evicted: AtomicU64,
    last_evicted: AtomicU64,
    last_warned: AtomicU64,
    /// Instances that took leases, with when they last said so (the model of a shared store
    /// that tests run several leasing instances over).
    instances: Mutex<HashMap<String, Micros>>,
    /// Sets of refused keys (the model of a shared store's).
    refused: Mutex<super::refused::Sets>,
    /// The leases' epoch: when a lease call first found the store empty, and until when it
    /// grants nothing (the learning rule, as `lua/lease.lua` keeps it; see [`super::Report`]).
    epoch: Mutex<(Micros, Micros)>,
    /// The last epoch, kept through a wipe.
    last_epoch: AtomicU64,
    /// Regions' pools of global counters.
    pools: Mutex<pools::Pools>,
    /// Each asker's last grant per counter, for its retry (see [`super::AskId`]).
    asks: Mutex<HashMap<(u64, super::CounterKey), leases::Recorded>>,
}

struct Shard {
    entries: Table<Slot>,
    last_purge: Micros,
}

// === impl MemoryStore ===

impl MemoryStore {
    /// A new, empty store reading time from `clock`. Inside a Tokio runtime it also starts the
    /// sweeper of expired counters, which stops when the last handle is dropped.
    pub fn new(options: MemoryOptions, clock: Arc<dyn Clock>) -> Self {
        let max_keys = options.max_keys.max(1);
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        // Enough shards that cores rarely contend (but each holds a fair share of the cap: a
        // shard of a handful of keys would evict too eagerly), and enough that a full shard
        // fits a hash table of 2^14 buckets at its 7/8 load factor. Hash tables double in
        // size, so a shard just past a power of two wastes half its buckets; sized from the
        // cap, a full store sits near the top of the load factor instead (memory per counter
        // in docs/performance.md).
        let concurrency = (cores * 16).min((max_keys / 256).max(1) as usize);
        let shards = concurrency.max(max_keys.div_ceil(FULL_SHARD) as usize);
        let max_per_shard = max_keys.div_ceil(shards as u64) as usize;
        let seeds = RandomState::new();
        let shared = Arc::new(Shared {
            shards: Sharded::new(shards, |i| Shard {
                entries: Table::new(max_per_shard, seeds.hash_one(i as u64)),
                last_purge: 0,
            }),
            digester: Digester::new(),
            clock,
            max_keys,
            max_per_shard,
            tracked: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            last_evicted: AtomicU64::new(0),
            last_warned: AtomicU64::new(0),
            instances: Mutex::default(),
            refused: Mutex::default(),
            epoch: Mutex::default(),
            last_epoch: AtomicU64::new(0),
            pools: Mutex::default(),
            asks: Mutex::default(),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(sweep(Arc::downgrade(&shared)));
        }
        Self { shared }
    }

    /// Number of tracked counters, expired ones not yet dropped included.
    pub fn len(&self) -> u64 {
        self.shared.tracked.load(Ordering::Relaxed)
    }

    /// Whether no counter is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Heap bytes the counters take (allocated capacity): bounded by the cap on counters,
    /// whatever the descriptor values.
    pub fn heap_bytes(&self) -> u64 {
        let tables: usize = self
            .shared
            .shards
            .iter()
            .map(|shard| shard.lock().entries.heap_bytes())
            .sum();
        (tables + self.shared.shards.len() * size_of::<Mutex<Shard>>()) as u64
    }

    /// Drops every expired counter now (the sweeper does this periodically).
    pub fn purge_expired(&self) {
        let now = self.shared.clock.now();
        for shard in self.shared.shards.iter() {
            self.shared.purge(&mut shard.lock(), now);
        }
    }

    fn apply_now(&self, batch: &Batch) -> Applied {
        let now = self.shared.clock.now();
        if batch.ops.iter().any(|op| batch.stale_refund(op, now)) {
            // Refunds into a later window than their charge's change nothing: checked only.
            let mut checked = batch.clone();
            for op in &mut checked.ops {
                if batch.stale_refund(op, now) {
                    op.hits = 0;
                }
            }
            checked.charged_at = None;
            return self.apply_at(&checked, now);
        }
        self.apply_at(batch, now)
    }

    fn apply_at(&self, batch: &Batch, now: Micros) -> Applied {
        let shared = &*self.shared;
        let digests: Vec<Digest> = batch
            .ops
            .iter()
            .map(|op| shared.digester.digest(&op.key))
            .collect();
        let shard_of: Vec<usize> = digests.iter().map(|d| shared.shards.index(d)).collect();
        let mut order = shard_of.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<MutexGuard<'_, Shard>> =
            order.iter().map(|&i| shared.shards[i].lock()).collect();
        let guard_of = |op: usize| order.binary_search(&shard_of[op]).expect("shard is locked");

        // Decide every operation against the counters plus this batch's own earlier
        // charges (two descriptors of one request may share a counter).
        let mut pending = Pending::default();
        let mut decisions = Vec::with_capacity(batch.ops.len());
        for (i, op) in batch.ops.iter().enumerate() {
            let current = pending
                .state(digests[i])
                .or_else(|| guards[guard_of(i)].get(&digests[i], op.limit.algorithm, now));
            let t = algorithm::decide(current.as_ref(), &op.limit, now, op.hits);
            decisions.push(t.decision);
            if (t.decision.allowed && op.hits != 0)
                || algorithm::applies_unconditionally(&op.limit, op.hits)
            {
                pending.push(i, digests[i], t);
            }
        }

        let admitted = admitted(&batch.ops, &decisions, batch.admission);
        if !admitted {
            // Nothing is charged, but refunds still return what earlier requests took (and
            // concurrency acquisitions count: their releases will come).
            pending = Pending::default();
            for (i, op) in batch
                .ops
                .iter()
                .enumerate()
                .filter(|(_, op)| algorithm::applies_unconditionally(&op.limit, op.hits))
            {
                let current = pending
                    .state(digests[i])
                    .or_else(|| guards[guard_of(i)].get(&digests[i], op.limit.algorithm, now));
                let t = algorithm::decide(current.as_ref(), &op.limit, now, op.hits);
                pending.push(i, digests[i], t);
            }
        }
        for (i, key, t) in pending.latest() {
            let hits = batch.ops[i].hits;
            shared.store(&mut guards[guard_of(i)], key, t, hits, now);
        }
        Applied {
            decisions,
            admitted,
            degraded: false,
            cached: Vec::new(),
            decided_at: Some(now),
            calls: Default::default(),
        }
    }
}

/// The charges a batch has decided so far, latest per key: what a later operation on the same
/// counter must see. A request carries few operations, so they are scanned while they are few
/// and indexed once there are more (a wide request stays linear, not quadratic).
#[derive(Default)]
struct Pending {
    /// Operation index, counter and decided transition of every charge, in order.
    charges: Vec<(usize, Digest, Transition)>,
    /// Key → position in `charges` of its latest charge, once there are more than
    /// [`Pending::SCAN`].
    index: Option<DigestMap<usize>>,
}

impl Pending {
    const SCAN: usize = 8;

    fn state(&self, key: Digest) -> Option<State> {
        let at = match &self.index {
            Some(index) => index.get(&key).copied(),
            None => self.charges.iter().rposition(|(_, k, _)| *k == key),
        };
        at.map(|at| self.charges[at].2.next)
    }

    fn push(&mut self, op: usize, key: Digest, t: Transition) {
        let at = self.charges.len();
        self.charges.push((op, key, t));
        match &mut self.index {
            Some(index) => {
                index.insert(key, at);
            }
            None if self.charges.len() > Self::SCAN => {
                let index = self
                    .charges
                    .iter()
                    .enumerate()
                    .map(|(at, (_, k, _))| (*k, at))
                    .collect();
                self.index = Some(index);
            }
            None => {}
        }
    }

    /// Every charge in order; a key charged twice ends with its latest state.
    fn latest(self) -> impl Iterator<Item = (usize, Digest, Transition)> {
        self.charges.into_iter()
    }
}

impl MemoryStore {
    /// Drops the counters of `ops` that hold live state; answers how many did.
    fn reset_now(&self, ops: &[CounterOp]) -> u64 {
        let shared = &*self.shared;
        let now = shared.clock.now();
        let mut cleared = 0;
        for op in ops {
            let digest = shared.digester.digest(&op.key);
            let mut shard = shared.shards.of(&digest).lock();
            if let Some(slot) = shard.entries.remove(&digest) {
                shared.tracked.fetch_sub(1, Ordering::Relaxed);
                cleared += u64::from(slot.live(now));
            }
        }
        cleared
    }
}

impl Store for MemoryStore {
    fn apply<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<Applied, StoreError>> {
        Box::pin(std::future::ready(Ok(self.apply_now(batch))))
    }

    fn reset<'a>(&'a self, ops: &'a [CounterOp]) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(std::future::ready(Ok(self.reset_now(ops))))
    }

    /// Holds nothing of another store's: its counters end with the process.
    fn shut_down(&self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }

    fn status(&self) -> StoreStatus {
        StoreStatus {
            kind: "memory",
            tracked_keys: Some(self.len()),
            max_keys: Some(self.shared.max_keys),
            evicted_keys: self.shared.evicted.load(Ordering::Relaxed),
            bytes: Some(self.heap_bytes()),
            full: {
                let last = self.shared.last_evicted.load(Ordering::Relaxed);
                last != 0 && self.shared.clock.now().saturating_sub(last) < FULL_FOR
            },
            healthy: true,
            detail: None,
            failure_mode_answers: Default::default(),
            leases: None,
            region: None,
            evicts_counters: None,
        }
    }
}

impl super::Shared for MemoryStore {
    fn lease<'a>(&'a self, asks: &'a [LeaseAsk]) -> BoxFuture<'a, Result<Vec<Grant>, StoreError>> {
        Box::pin(std::future::ready(Ok(self.lease_now(asks))))
    }

    fn instances<'a>(
        &'a self,
        instance: &'a str,
        within: Duration,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        let now = self.shared.clock.now();
        let mut seen = self.shared.instances.lock();
        let within = within.as_micros() as Micros;
        seen.retain(|_, at| now.saturating_sub(*at) < within);
        if seen.len() < MAX_INSTANCES || seen.contains_key(instance) {
            seen.insert(instance.to_owned(), now);
        }
        Box::pin(std::future::ready(Ok(seen.len().max(1) as u64)))
    }

    fn pool<'a>(
        &'a self,
        ops: &'a [super::PoolOp],
    ) -> BoxFuture<'a, Result<Vec<super::PoolAnswer>, StoreError>> {
        let now = self.shared.clock.now();
        let answers = self.shared.pools.lock().apply(ops, now);
        Box::pin(std::future::ready(Ok(answers)))
    }

    /// One instance: every claim gets what it asks.
    fn claim<'a>(
        &'a self,
        asks: &'a [super::ClaimAsk],
    ) -> BoxFuture<'a, Result<Vec<super::ClaimGrant>, StoreError>> {
        Box::pin(std::future::ready(Ok(asks
            .iter()
            .map(super::ClaimGrant::alone)
            .collect())))
    }

    fn add_refused<'a>(
        &'a self,
        adds: &'a [super::RefusedAdd],
    ) -> BoxFuture<'a, Result<Vec<u32>, StoreError>> {
        let mut sets = self.shared.refused.lock();
        let levels = adds.iter().map(|add| sets.add(add)).collect();
        Box::pin(std::future::ready(Ok(levels)))
    }

    fn close_refused<'a>(
        &'a self,
        closes: &'a [super::RefusedClose],
    ) -> BoxFuture<'a, Result<Vec<super::RefusedCounts>, StoreError>> {
        let now = self.shared.clock.now();
        let mut sets = self.shared.refused.lock();
        let counts = closes.iter().map(|close| sets.close(close, now)).collect();
        Box::pin(std::future::ready(Ok(counts)))
    }
}

// === impl Shared ===

impl Shared {
    fn store(&self, shard: &mut Shard, key: Digest, t: Transition, hits: i64, now: Micros) {
        let mut slot = Slot::pack(t.next, t.expires_at);
        let charge = u32::try_from(hits.max(0)).unwrap_or(u32::MAX);
        if let Some(existing) = shard.entries.get_mut(&key) {
            slot.charged = existing.charged.saturating_add(charge);
            *existing = slot;
            return;
        }
        slot.charged = charge;
        if shard.entries.len() >= self.max_per_shard {
            if now.saturating_sub(shard.last_purge) >= PURGE_INTERVAL {
                self.purge(shard, now);
            }
            if shard.entries.len() >= self.max_per_shard {
                self.evict_one(shard, now);
            }
        }
        shard.entries.insert_new(key, slot);
        self.tracked.fetch_add(1, Ordering::Relaxed);
    }

    fn purge(&self, shard: &mut Shard, now: Micros) {
        let removed = shard.entries.retain(|slot| slot.live(now));
        shard.last_purge = now;
        self.tracked.fetch_sub(removed as u64, Ordering::Relaxed);
    }

    /// Drops the sampled counter whose loss admits the least: an expired one, else the one
    /// charged the fewest hits, else the one closest to expiry.
    fn evict_one(&self, shard: &mut Shard, now: Micros) {
        let mut victim: Option<(usize, (bool, u32, u32))> = None;
        let positions: Vec<usize> = shard.entries.sample(EVICTION_SAMPLE).collect();
        for at in positions {
            let slot = shard.entries.at(at);
            let score = (slot.live(now), slot.charged, slot.expires);
            if victim.is_none_or(|(_, best)| score < best) {
                victim = Some((at, score));
            }
        }
        let Some((at, (live, _, _))) = victim else {
            return;
        };
        shard.entries.remove_at(at);
        self.tracked.fetch_sub(1, Ordering::Relaxed);
        if !live {
            return;
        }
        let evicted = self.evicted.fetch_add(1, Ordering::Relaxed) + 1;
        self.last_evicted.store(now.max(1), Ordering::Relaxed);
        let last = self.last_warned.load(Ordering::Relaxed);
        if (last == 0 || now.saturating_sub(last) >= WARN_INTERVAL)
            && self
                .last_warned
                .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                max_keys = self.max_keys,
                evicted_total = evicted,
                "memory store is full: evicting the live counters charged the fewest hits, which forgets them; raise --memory-max-keys or use a shared store"
            );
        }
    }
}

impl Shard {
    fn get(&self, key: &Digest, algorithm: Algorithm, now: Micros) -> Option<State> {
        self.entries
            .get(key)
            .filter(|slot| slot.live(now))
            .map(|slot| slot.unpack(algorithm))
    }
}

/// Drops expired counters periodically until the store is dropped.
async fn sweep(shared: Weak<Shared>) {
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        for shard in shared.shards.iter() {
            let now = shared.clock.now();
            shared.purge(&mut shard.lock(), now);
            // Let requests run between shards: a sweep of a million keys takes a while.
            tokio::task::yield_now().await;
        }
    }
}

#[cfg(test)]
mod tests;
