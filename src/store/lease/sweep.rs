//! The background half of leasing: hand-backs when lease periods end (and at shutdown),
//! idle blocks dropped, the count of instances, and the view `status` reports.

use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Core, GIVE_BACKS_PER_CALL, LISTED_BLOCKS, MAX_RETRIED_GIVE_BACKS, Round};
use crate::algorithm::{Algorithm, Micros};
use crate::store::{LeaseAsk, Take};

/// What the leasing layer reports in [`StoreStatus::leases`](crate::store::StoreStatus::leases).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseStatus {
    /// This instance's name in the count of instances.
    pub instance: String,
    /// Instances taking leases recently, this one included.
    pub instances: u64,
    /// Counters this instance holds a block for.
    pub blocks: u64,
    /// Units leased and not admitted yet, over all blocks (as of the last sweep).
    pub outstanding: u64,
    /// Of those, in blocks of global counters (`scope: global`).
    pub outstanding_global: u64,
    /// Lease calls made (leases and hand-backs).
    pub calls: u64,
    /// Leases granted.
    pub leases: u64,
    /// Leases refused (nothing left).
    pub refused: u64,
    /// Units taken from shared counters.
    pub units_leased: u64,
    /// Units handed back to shared counters.
    pub units_returned: u64,
    /// Hand-backs whose call failed, waiting to be tried again.
    pub give_backs_waiting: u64,
    /// Decisions made from a block, without a store call.
    pub local_decisions: u64,
    /// Of those, global counters' (`scope: global`).
    pub global_block_decisions: u64,
    /// Leased counters decided exactly instead (the lease failed, the table was full, or
    /// the request waited too long).
    pub exact_decisions: u64,
    /// The largest blocks, largest first.
    pub top: Vec<BlockView>,
}

/// One block, for `/rlconfig`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockView {
    /// The counter's key.
    pub key: String,
    /// Its algorithm.
    pub algorithm: Algorithm,
    /// Units in hand.
    pub units: u64,
    /// Time until the block ends (its units go back or die).
    pub ends_in: Micros,
}

impl Core {
    /// Hands back the units of every block whose lease period ended (`all`: of every block,
    /// at shutdown), drops idle blocks and refreshes the view for `status`. Returns the units
    /// handed back.
    pub(super) async fn sweep(&self, all: bool) -> u64 {
        let now = self.clock.now();
        let mut round = Round::new(self.hold);
        let (mut outstanding, mut global, mut top) = (0u64, 0u64, Vec::new());
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            let before = shard.len();
            shard.retain(|digest, block| {
                if all {
                    block.ends_at = block.ends_at.min(now);
                }
                let back = block.expire(now);
                if back > 0 || block.has_report(now) {
                    // (No units: the block closes with its report only; see `Report`.)
                    round.give_back(block, *digest, back, now);
                }
                if block.idle(now, 2 * self.period) {
                    return false;
                }
                outstanding += block.units;
                if block.key.is_global() {
                    global += block.units;
                }
                if block.units > 0 {
                    top.push(BlockView {
                        key: block.key.to_string(),
                        algorithm: block.limit.algorithm,
                        units: block.units,
                        ends_in: block.ends_at.saturating_sub(now),
                    });
                }
                true
            });
            self.blocks
                .fetch_sub(before - shard.len(), Ordering::Relaxed);
            if top.len() > 4 * LISTED_BLOCKS {
                top.sort_by_key(|b| std::cmp::Reverse(b.units));
                top.truncate(LISTED_BLOCKS);
            }
        }
        top.sort_by_key(|b| std::cmp::Reverse(b.units));
        top.truncate(LISTED_BLOCKS);
        *self.view.lock() = (outstanding, global, top);
        // Hand-backs that failed before and can still change something go again.
        let mut asks = round.asks;
        {
            let mut retries = self.retries.lock();
            asks.extend(
                retries
                    .drain(..)
                    .filter(|(_, until)| *until > now)
                    .map(|(ask, _)| ask),
            );
        }
        let mut returned = 0;
        for chunk in asks.chunks(GIVE_BACKS_PER_CALL) {
            self.totals.calls.fetch_add(1, Ordering::Relaxed);
            match self.inner.lease(chunk).await {
                Ok(grants) => {
                    // What the store really took back (a counter no longer as the lease
                    // left it takes nothing).
                    let units: u64 = grants.iter().map(|g| g.units).sum();
                    self.totals
                        .units_returned
                        .fetch_add(units, Ordering::Relaxed);
                    returned += units;
                }
                Err(_) => self.retry_later(chunk),
            }
        }
        returned
    }

    /// Keeps the hand-backs among `asks`, whose call failed, for the next sweeps.
    pub(super) fn retry_later(&self, asks: &[LeaseAsk]) {
        let mut retries = self.retries.lock();
        for ask in asks {
            let Take::GiveBack { guard, .. } = ask.take else {
                continue;
            };
            // A window's hand-back changes nothing once its window has ended; a token
            // bucket's, once its arrival time has passed (the bucket is full anyway).
            let until = if ask.limit.algorithm.refills() {
                guard
            } else {
                guard.saturating_add(ask.limit.window)
            };
            if retries.len() >= MAX_RETRIED_GIVE_BACKS {
                retries.pop_front();
            }
            retries.push_back((ask.clone(), until));
        }
        static LOGGED: crate::logging::Every = crate::logging::Every::new(Duration::from_secs(60));
        if LOGGED.ready() {
            tracing::warn!(
                waiting = retries.len(),
                "leased units could not be handed back (the store failed); trying again at each sweep until their window ends"
            );
        }
    }

    /// Hand-backs waiting for another try.
    pub(super) fn retries_waiting(&self) -> usize {
        self.retries.lock().len()
    }

    /// Records this instance with the store and learns how many take leases.
    async fn count_instances(&self) {
        let within = (self.options.period * 3).max(Duration::from_secs(3));
        if let Ok(n) = self.inner.instances(&self.options.instance, within).await {
            self.instances.store(n.max(1), Ordering::Relaxed);
        }
    }

    pub(super) fn status(&self) -> LeaseStatus {
        let (outstanding, outstanding_global, top) = self.view.lock().clone();
        let t = &self.totals;
        LeaseStatus {
            instance: self.options.instance.clone(),
            instances: self.instances.load(Ordering::Relaxed),
            blocks: self.blocks.load(Ordering::Relaxed) as u64,
            outstanding,
            outstanding_global,
            calls: t.calls.load(Ordering::Relaxed),
            leases: t.leases.load(Ordering::Relaxed),
            refused: t.refused.load(Ordering::Relaxed),
            units_leased: t.units_leased.load(Ordering::Relaxed),
            units_returned: t.units_returned.load(Ordering::Relaxed),
            give_backs_waiting: self.retries_waiting() as u64,
            local_decisions: t.local.load(Ordering::Relaxed),
            global_block_decisions: t.global_local.load(Ordering::Relaxed),
            exact_decisions: t.exact.load(Ordering::Relaxed),
            top,
        }
    }
}

/// Sweeps every quarter lease period (at least once a second: the view for `status`) and
/// counts the instances once a lease period (at most once a second); stops when the layer is
/// dropped.
pub(super) async fn sweeper(shared: Weak<Core>) {
    let Some(period) = shared.upgrade().map(|s| s.options.period) else {
        return;
    };
    let sweep_every = (period / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let count_every = period.max(Duration::from_secs(1));
    let mut last_count: Option<tokio::time::Instant> = None;
    loop {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if last_count.is_none_or(|t| t.elapsed() >= count_every) {
            last_count = Some(tokio::time::Instant::now());
            shared.count_instances().await;
        }
        shared.sweep(false).await;
        drop(shared);
        tokio::time::sleep(sweep_every).await;
    }
}
