// Why one long file: a request's leased decisions, the lease calls they share, the rest of the
// request through the shared store and the background hand-backs all move the same units.
//! Leased quota (`consistency: leased`): this instance takes blocks of units from a shared
//! counter in one atomic call ([`crate::algorithm::lease`]: never more than what is left),
//! admits from its block in memory, and takes the next block when it runs out. Every unit
//! it admits was taken from the shared counter first, so the fleet never admits more than
//! the limit, whatever the number of instances and the concurrency.
//!
//! - Blocks are sized from the instance's recent rate (what it would admit in one lease
//!   period) and its share of what is left (at most the remaining budget divided by twice the
//!   number of instances taking leases recently); near the limit they shrink to the
//!   request's own hits, which is then exact. A key whose rate asks for no more than the
//!   request's hits (seen for the first time, or seldom) is decided exactly instead, in the
//!   shared store's calls that requests share.
//! - A block lives one lease period at most, and a windowed block no longer than its window:
//!   units not admitted by then go back to the shared counter (also at shutdown), or die
//!   with their window.
//! - Requests that need units while a lease is in flight wait for it rather than ask again;
//!   one request's leases go in one call.
//! - A refused request's reserved units go back to the block, not to the store; refunds
//!   (`is_negative_hits`) give back to the block at most what it admitted, the rest to the
//!   store.
//! - While the store fails, the units in hand are still admitted; then the rule's
//!   `failure_mode` answers (the request goes to the shared store as an exact one, behind
//!   its failure policy).
//!
//! Concurrency counters are never leased (their releases must reach the shared count), and
//! neither is a request the over-limit cache reads without charging.

mod ask;
mod block;
mod round;
mod sweep;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use parking_lot::Mutex;

pub use ask::{ASK_KEPT, AskId, Grant, LeaseAsk, LeaseOptions, Report, Take};
use block::{Block, Outcome};
use round::Round;
pub use sweep::{BlockView, LeaseStatus};

use super::digest::{Digest, DigestMap, Digester, Sharded};
use super::{
    Admission, Applied, Batch, BoxFuture, Calls, Consistency, CounterOp, Role, Shared, Store,
    StoreError, StoreStatus,
};
use crate::algorithm::{Decision, Micros};
use crate::clock::Clock;

const SHARDS: usize = 16;
/// Rounds of waiting for other requests' leases before a request is decided exactly.
const MAX_ROUNDS: usize = 4;
/// The longest wait for another request's lease (its call has the store's deadline; this
/// only guards against a flight that never lands).
const WAIT_LIMIT: Duration = Duration::from_secs(2);
/// Hand-backs per call.
const GIVE_BACKS_PER_CALL: usize = 512;
/// Blocks listed in `/rlconfig`.
const LISTED_BLOCKS: usize = 20;
/// Hand-backs kept for another try after their call failed (a Redis restart, an outage);
/// past it the oldest are given up (their units stay counted: under, never over).
const MAX_RETRIED_GIVE_BACKS: usize = 100_000;

/// The leasing layer in front of a shared store.
pub struct Leased {
    shared: Arc<Core>,
}

/// What the requests, the lease rounds and the sweeper share.
struct Core {
    inner: Arc<dyn Shared>,
    shards: Sharded<DigestMap<Block>>,
    digester: Digester,
    clock: Arc<dyn Clock>,
    options: LeaseOptions,
    period: Micros,
    /// How long a store wiped under blocks grants nothing (see [`Report`]).
    hold: Micros,
    /// Instances taking leases recently, the last time the store said (at least 1).
    instances: AtomicU64,
    blocks: AtomicUsize,
    /// Whether the sweeper runs (started with the first lease).
    started: AtomicBool,
    totals: Totals,
    /// The sweeper's last view of the blocks, for `status`.
    view: Mutex<(u64, u64, Vec<BlockView>)>,
    /// Hand-backs whose call failed, each with the instant after which it can change
    /// nothing (its window ended; a token bucket refilled past it): tried again at each sweep
    /// until they land or that instant passes.
    retries: Mutex<std::collections::VecDeque<(LeaseAsk, Micros)>>,
}

/// Running totals (the metrics' source).
#[derive(Default)]
struct Totals {
    calls: AtomicU64,
    leases: AtomicU64,
    refused: AtomicU64,
    units_leased: AtomicU64,
    units_returned: AtomicU64,
    local: AtomicU64,
    /// Of `local`: global counters (`scope: global`).
    global_local: AtomicU64,
    exact: AtomicU64,
}

/// A request's leased decisions so far.
struct Local {
    decisions: Vec<Option<Decision>>,
    /// Units taken from blocks for this request: (op, block, generation, hits).
    reserved: Vec<(usize, Digest, u64, u64)>,
    /// Operations the shared store decides (not leased, or leasing failed).
    exact: Vec<usize>,
    /// Of `exact`, the leased refunds no block could take: read without charging (a refund
    /// to the shared counter could free units that other instances hold).
    peek: Vec<usize>,
    calls: Calls,
}

/// How long a store wiped under blocks grants nothing ([`Report`]): until every block taken
/// before the wipe has ended (a lease period), been closed by a sweep (every quarter period,
/// at most a second) and its report has landed (half a second, for the call's deadline and a
/// loaded sweep): 2 s with the default period of 1 s.
fn hold(period: Micros) -> Micros {
    let sweep = (period / 4).clamp(10_000, 1_000_000);
    period + period / 4 + sweep + 500_000
}

impl Leased {
    /// Leases from `inner`; `clock` times the blocks (local time: only durations matter).
    pub fn new(inner: Arc<dyn Shared>, options: LeaseOptions, clock: Arc<dyn Clock>) -> Self {
        let period = options.period.as_micros().clamp(1_000, u64::MAX as u128) as Micros;
        Self {
            shared: Arc::new(Core {
                hold: hold(period),
                inner,
                shards: Sharded::new(SHARDS, |_| DigestMap::default()),
                digester: Digester::new(),
                clock,
                options,
                period,
                instances: AtomicU64::new(1),
                blocks: AtomicUsize::new(0),
                started: AtomicBool::new(false),
                totals: Totals::default(),
                view: Mutex::default(),
                retries: Mutex::default(),
            }),
        }
    }

    /// Does what the background sweeper does every quarter lease period, now: hands back
    /// the units of blocks whose lease period ended and closes them with their reports.
    /// For tests on a manual clock, whose sweeper runs on real time. Returns the units
    /// handed back.
    pub async fn sweep_now(&self) -> u64 {
        self.shared.sweep(false).await
    }

    /// Hands every unit in hand back to the shared counters (at shutdown, after the drain):
    /// a rolling restart wastes no budget. Returns the units handed back.
    pub async fn hand_back_all(&self) -> u64 {
        self.shared.sweep(true).await
    }

    async fn apply_batch(&self, batch: &Batch) -> Result<Applied, StoreError> {
        // A peek (0 hits) reads the shared counter: a block knows only its own units.
        let leasing = |op: &CounterOp| {
            op.consistency == Consistency::Leased
                && op.limit.algorithm.leasable()
                && batch.admission != Admission::Never
                && op.hits != 0
        };
        if !batch.ops.iter().any(leasing) {
            return self.shared.inner.apply(batch).await;
        }
        self.shared.start();
        if batch.ops.iter().all(|op| leasing(op) && op.hits >= 0)
            && let Some(applied) = self.shared.decide_in_hand(batch)
        {
            return Ok(applied);
        }
        let mut local = Local {
            decisions: vec![None; batch.ops.len()],
            reserved: Vec::new(),
            exact: Vec::new(),
            peek: Vec::new(),
            calls: Calls::default(),
        };
        let mut pending = Vec::new();
        for (i, op) in batch.ops.iter().enumerate() {
            match (leasing(op), op.hits < 0) {
                (false, _) => local.exact.push(i),
                (true, true) => self.shared.refund(i, op, &mut local),
                (true, false) => pending.push(i),
            }
        }
        self.decide_leased(batch, pending, &mut local).await;
        self.finish(batch, local).await
    }

    /// Decides `pending` (leased charges) from the blocks, taking the leases they need: one
    /// call per round, a few rounds of waiting for other requests' leases at most.
    async fn decide_leased(&self, batch: &Batch, mut pending: Vec<usize>, local: &mut Local) {
        let shared = &self.shared;
        for round_number in 1..=MAX_ROUNDS {
            if pending.is_empty() {
                return;
            }
            let now = shared.clock.now();
            let mut waits = Vec::new();
            let mut round = Round::new(shared.hold);
            for &i in &pending {
                let op = &batch.ops[i];
                let digest = shared.block_digest(op);
                match shared.take(op, digest, now, &mut round) {
                    None => local.exact.push(i),
                    Some(Outcome::Decided { decision, reserved }) => {
                        local.decisions[i] = Some(decision);
                        if reserved > 0 {
                            local.reserved.push((i, digest, round.generation, reserved));
                        }
                        shared.totals.local.fetch_add(1, Ordering::Relaxed);
                        if op.key.is_global() {
                            shared.totals.global_local.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Some(Outcome::Wait(notified)) => waits.push((i, notified)),
                    Some(Outcome::Lease(ask, report)) => round.lead(i, digest, op, (ask, report)),
                    Some(Outcome::Exact) => {
                        shared.totals.exact.fetch_add(1, Ordering::Relaxed);
                        local.exact.push(i);
                    }
                }
            }
            if !round.asks.is_empty() {
                local.calls = local.calls.and(Calls::one(1));
                shared.lease_round(batch, round, now, local).await;
            }
            pending = waits.iter().map(|(i, _)| *i).collect();
            if round_number == MAX_ROUNDS || pending.is_empty() {
                // The last round's waiters are decided exactly, without waiting.
                break;
            }
            // Another request's lease lands within the store's deadline; the caller's own
            // deadline bounds the wait too.
            let limit = batch.deadline.map_or(WAIT_LIMIT, |at| {
                at.saturating_duration_since(tokio::time::Instant::now())
                    .min(WAIT_LIMIT)
            });
            join_all(
                waits
                    .into_iter()
                    .map(|(_, n)| tokio::time::timeout(limit, n)),
            )
            .await;
        }
        shared
            .totals
            .exact
            .fetch_add(pending.len() as u64, Ordering::Relaxed);
        local.exact.extend(pending);
    }

    /// The rest of the request through the shared store, with the admission the leased
    /// decisions leave it; then the request's answer, and its reserved units back to their
    /// blocks when it is refused.
    async fn finish(&self, batch: &Batch, local: Local) -> Result<Applied, StoreError> {
        let verdict = Verdict::of(batch, &local);
        let ops: Vec<CounterOp> = local
            .exact
            .iter()
            .map(|&i| {
                let mut op = batch.ops[i].clone();
                // A leased quota counter within its limit: the request cannot be over by
                // quota, so the others only count.
                if verdict.quota_met && op.role == Role::Quota {
                    op.role = Role::Shadow;
                }
                if local.peek.contains(&i) {
                    op.hits = 0;
                }
                op
            })
            .collect();
        let inner = if ops.is_empty() {
            None
        } else {
            let rest = Batch {
                ops,
                admission: match batch.admission {
                    Admission::ByRule if verdict.rejected => Admission::Never,
                    admission => admission,
                },
                deadline: batch.deadline,
                charged_at: batch.charged_at,
            };
            match self.shared.inner.apply(&rest).await {
                Ok(applied) => Some(applied),
                Err(e) => {
                    self.shared.put_back(&local.reserved);
                    return Err(e);
                }
            }
        };
        let admitted = match batch.admission {
            Admission::Always => true,
            Admission::Never => false,
            Admission::ByRule => !verdict.rejected && inner.as_ref().is_none_or(|a| a.admitted),
        };
        if !admitted {
            self.shared.put_back(&local.reserved);
        }
        local.answer(admitted, inner)
    }
}

/// What the leased decisions alone say about a request.
struct Verdict {
    /// Refused whatever the rest says: an enforced leased counter over, or every quota
    /// counter over and all of them leased.
    rejected: bool,
    /// A leased quota counter within its limit: the request cannot be over by quota.
    quota_met: bool,
}

impl Verdict {
    fn of(batch: &Batch, local: &Local) -> Self {
        let leased = || {
            batch
                .ops
                .iter()
                .zip(&local.decisions)
                .filter_map(|(op, d)| d.map(|d| (op.role, d.allowed)))
        };
        let enforce_over = leased().any(|(role, allowed)| role == Role::Enforce && !allowed);
        let mut quota = leased().filter(|(role, _)| *role == Role::Quota).peekable();
        let any_quota = quota.peek().is_some();
        let quota_met = quota.any(|(_, allowed)| allowed);
        let inner_quota = local
            .exact
            .iter()
            .any(|i| batch.ops[*i].role == Role::Quota);
        Self {
            rejected: enforce_over || (any_quota && !quota_met && !inner_quota),
            quota_met,
        }
    }
}

impl Local {
    /// The request's answer: the leased decisions and the shared store's for the rest.
    fn answer(mut self, admitted: bool, inner: Option<Applied>) -> Result<Applied, StoreError> {
        let mut applied = Applied {
            decisions: Vec::new(),
            admitted,
            degraded: false,
            cached: Vec::new(),
            decided_at: None,
            calls: self.calls,
        };
        if let Some(inner) = inner {
            for (&i, d) in self.exact.iter().zip(&inner.decisions) {
                self.decisions[i] = Some(*d);
            }
            applied.cached = inner.cached.iter().map(|&k| self.exact[k]).collect();
            applied.degraded = inner.degraded;
            applied.decided_at = inner.decided_at;
            applied.calls = inner.calls.and(self.calls);
        }
        applied.decisions = self
            .decisions
            .into_iter()
            .map(|d| d.ok_or_else(|| StoreError::Internal("a counter got no decision".into())))
            .collect::<Result<_, _>>()?;
        Ok(applied)
    }
}

impl Core {
    /// A block per counter and limit: the classes of a `priorities` rule share one counter
    /// with different limits, and each leases against its own.
    fn block_digest(&self, op: &CounterOp) -> Digest {
        self.digester
            .digest_with(&op.key, [op.limit.requests, op.limit.burst])
    }

    /// Starts the sweeper and the count of instances, once.
    fn start(self: &Arc<Self>) {
        // Read first: a write on every request would bounce the line between cores.
        if self.started.load(Ordering::Relaxed) || self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(sweep::sweeper(Arc::downgrade(self)));
        }
    }

    /// The common case, without a store call: every operation leased, charging, and its
    /// block holding the units (or a refusal that covers it). `None` (nothing taken) when
    /// one is not so: the request takes the general path.
    fn decide_in_hand(&self, batch: &Batch) -> Option<Applied> {
        let now = self.clock.now();
        let mut decisions = Vec::with_capacity(batch.ops.len());
        let mut reserved: Vec<(usize, Digest, u64, u64)> = Vec::new();
        for (i, op) in batch.ops.iter().enumerate() {
            let digest = self.block_digest(op);
            let decided = self
                .shards
                .of(&digest)
                .lock()
                .get_mut(&digest)
                .filter(|block| block.limit == op.limit)
                .and_then(|block| {
                    let hits = op.hits as u64;
                    block
                        .take_in_hand(hits, now)
                        .map(|(decision, taken)| (decision, taken, block.generation))
                });
            let Some((decision, taken, generation)) = decided else {
                self.put_back(&reserved);
                return None;
            };
            if taken > 0 {
                reserved.push((i, digest, generation, taken));
            }
            decisions.push(decision);
        }
        let admitted = super::admitted(&batch.ops, &decisions, batch.admission);
        if !admitted {
            self.put_back(&reserved);
        }
        self.totals
            .local
            .fetch_add(batch.ops.len() as u64, Ordering::Relaxed);
        let global = batch.ops.iter().filter(|op| op.key.is_global()).count();
        self.totals
            .global_local
            .fetch_add(global as u64, Ordering::Relaxed);
        Some(Applied {
            decisions,
            admitted,
            degraded: false,
            cached: Vec::new(),
            decided_at: None,
            calls: Calls::default(),
        })
    }

    /// What `op`'s block says at `now` (creating the block); `None` when no block can be
    /// made (the table is full): decided exactly. Units of an ended lease period join the
    /// round as a hand-back.
    fn take(
        &self,
        op: &CounterOp,
        digest: Digest,
        now: Micros,
        round: &mut Round,
    ) -> Option<Outcome> {
        let mut shard = self.shards.of(&digest).lock();
        let block = match shard.entry(digest) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                if self.blocks.load(Ordering::Relaxed) >= self.options.max_keys {
                    self.totals.exact.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
                self.blocks.fetch_add(1, Ordering::Relaxed);
                entry.insert(Block::new(op.key.clone(), op.limit, now))
            }
        };
        if block.limit != op.limit {
            // The rule changed (a reload): what the block holds was leased under the old
            // limit and goes back; the new limit leases afresh.
            block.ends_at = block.ends_at.min(now);
        }
        let back = block.expire(now);
        if back > 0 {
            round.give_back(block, digest, back, now);
        }
        block.limit = op.limit;
        let instances = self.instances.load(Ordering::Relaxed);
        let outcome = block.take(op.hits as u64, now, instances, self.period);
        if let Outcome::Lease(..) = outcome {
            block.flight = Some(Arc::new(tokio::sync::Notify::new()));
            if block.limit.algorithm.refills() && block.units > 0 {
                // Too few tokens for the request: they go back in the same call, ahead of
                // the lease (a new block holds only what the bucket owes at its lease).
                round.give_back(block, digest, block.units.min(block.granted), now);
                block.units = 0;
            }
        }
        round.generation = block.generation;
        Some(outcome)
    }

    /// A leased refund: back to the block, at most what it admitted. Not to the shared
    /// counter: it counts the units other instances hold as taken, and a refund there could
    /// free them while they are still admitted. Without a block, the counter is read.
    fn refund(&self, i: usize, op: &CounterOp, local: &mut Local) {
        let digest = self.block_digest(op);
        let now = self.clock.now();
        let mut shard = self.shards.of(&digest).lock();
        let Some(block) = shard.get_mut(&digest) else {
            local.exact.push(i);
            local.peek.push(i);
            return;
        };
        let generation = block.generation;
        block.give_back(op.hits.unsigned_abs(), generation);
        local.decisions[i] = Some(block.refunded(now));
    }

    /// Units a refused request reserved, back to their blocks.
    fn put_back(&self, reserved: &[(usize, Digest, u64, u64)]) {
        for (_, digest, generation, hits) in reserved {
            if let Some(block) = self.shards.of(digest).lock().get_mut(digest) {
                block.give_back(*hits, *generation);
            }
        }
    }
}

impl Store for Leased {
    fn apply<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<Applied, StoreError>> {
        Box::pin(self.apply_batch(batch))
    }

    fn status(&self) -> StoreStatus {
        let mut status = self.shared.inner.status();
        if self.shared.started.load(Ordering::Acquire) {
            status.leases = Some(self.shared.status());
        }
        status
    }

    /// Drops this instance's blocks of these counters (their units were taken from the
    /// count being cleared), then resets the shared counters. Blocks other instances hold
    /// stay theirs until they run out or expire.
    fn reset<'a>(&'a self, ops: &'a [CounterOp]) -> BoxFuture<'a, Result<u64, StoreError>> {
        for op in ops {
            let digest = self.shared.block_digest(op);
            if self
                .shared
                .shards
                .of(&digest)
                .lock()
                .remove(&digest)
                .is_some()
            {
                self.shared.blocks.fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.shared.inner.reset(ops)
    }

    fn store_key(&self, op: &CounterOp) -> String {
        self.shared.inner.store_key(op)
    }

    /// Hands back every block's units, then passes the shutdown on.
    fn shut_down(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let units = self.hand_back_all().await;
            if units > 0 {
                tracing::info!(units, "leased units handed back to the shared counters");
            }
            self.shared.inner.shut_down().await;
        })
    }
}
