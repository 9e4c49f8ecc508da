//! Leases in memory: the lease protocol's store side (`lua/lease.lua` mirrored, with the
//! learning rule), for one instance and for the tests' roots and regions.

use std::sync::atomic::Ordering;

use super::{MemoryStore, pools};
use crate::algorithm::{self, Decision, Limit, Micros};
use crate::store::lease::ASK_KEPT;
use crate::store::{Grant, LeaseAsk, Take};

/// Asks kept for their retries, at most (past it, expired ones go first; then none is kept:
/// a retry is then a new ask, under and never over).
const MAX_ASKS: usize = 100_000;

/// An asker's last grant on a counter (`lua/lease.lua` keeps the same).
#[derive(Debug, Clone, Copy)]
pub(super) struct Recorded {
    seq: u64,
    units: u64,
    /// The store's time of the grant.
    at: Micros,
    reset_after: Micros,
    until: Micros,
}

impl MemoryStore {
    /// Each ask on its own, under its counter's shard lock: a lease charges what
    /// [`algorithm::lease`] grants, a hand-back is a refund within the lease's window; the
    /// learning rule as `lua/lease.lua` applies it (see [`super::Report`]).
    pub(super) fn lease_now(&self, asks: &[LeaseAsk]) -> Vec<Grant> {
        let now = self.shared.clock.now();
        let (born, hold_until) = self.epoch_at(asks, now);
        asks.iter()
            .map(|ask| self.lease_one(ask, (born, hold_until), now))
            .collect()
    }

    /// The store's epoch (when a call last found it empty) and until when it grants nothing
    /// (a wipe under blocks, as `asks` report them).
    fn epoch_at(&self, asks: &[LeaseAsk], now: Micros) -> (Micros, Micros) {
        let shared = &*self.shared;
        {
            let mut epoch = shared.epoch.lock();
            if epoch.0 == 0 {
                // After every epoch a block reports, as the script does, and after the
                // store's last one (Redis's clock has moved on since; a pinned one may not).
                let reported = asks.iter().map(|a| a.report.epoch.saturating_add(1));
                let after_last = shared.last_epoch.load(Ordering::Relaxed).saturating_add(1);
                epoch.0 = reported.fold(now.max(after_last), Micros::max);
                shared.last_epoch.store(epoch.0, Ordering::Relaxed);
            }
            let born = epoch.0;
            for ask in asks {
                let r = ask.report;
                if r.epoch != 0 && r.epoch != born && now < born.saturating_add(r.hold) {
                    epoch.1 = epoch.1.max(born.saturating_add(r.hold));
                }
            }
            *epoch
        }
    }

    /// One ask at `now` under its counter's shard lock, in the epoch `born`.
    fn lease_one(
        &self,
        ask: &LeaseAsk,
        (born, hold_until): (Micros, Micros),
        now: Micros,
    ) -> Grant {
        let shared = &*self.shared;
        let digest = shared.digester.digest(&ask.key);
        let mut shard = shared.shards.of(&digest).lock();
        if let Some(r) = self.replayed(ask, now) {
            // A retry of an ask already granted: what it got, once.
            let current = shard.get(&digest, ask.limit.algorithm, now);
            let t = algorithm::decide(current.as_ref(), &ask.limit, now, 0);
            return Grant {
                units: r.units,
                decision: Decision {
                    allowed: r.units > 0,
                    reset_after: r.reset_after,
                    retry_after: None,
                    ..t.decision
                },
                now: r.at,
                epoch: born,
            };
        }
        let older = ask.report.epoch != 0 && ask.report.epoch != born;
        if older && ask.report.admitted > 0 {
            // Admitted from units of an older epoch: charged, past the limit if need be.
            let current = shard.get(&digest, ask.limit.algorithm, now);
            let limit = Limit {
                overdraft: true,
                ..ask.limit
            };
            let hits = ask.report.admitted.min(i64::MAX as u64) as i64;
            let t = algorithm::decide(current.as_ref(), &limit, now, hits);
            shared.store(&mut shard, digest, t, hits, now);
        }
        let current = shard.get(&digest, ask.limit.algorithm, now);
        let lease = matches!(ask.take, Take::Lease(_));
        // An ask for a given window: decided as at its start, nothing once it is over; a
        // lease its asker gave up on, or one while a wiped store holds, takes nothing either,
        // nor does a hand-back of units that died with their epoch.
        let late = ask.start != 0 && now >= ask.start.saturating_add(ask.limit.window)
            || lease && ask.not_after != 0 && now > ask.not_after;
        let held = lease && now < hold_until;
        let at = now.max(ask.start);
        let (units, mut t, hits) = match ask.take {
            _ if late || held || older && !lease => (
                0,
                algorithm::decide(current.as_ref(), &ask.limit, now, 0),
                0,
            ),
            Take::Lease(want) => {
                let (units, t) = algorithm::lease(current.as_ref(), &ask.limit, at, want);
                (units, t, units as i64)
            }
            Take::GiveBack { .. } => {
                let hits = ask.give_back_hits(current.as_ref(), at);
                let t = algorithm::decide(current.as_ref(), &ask.limit, at, hits);
                (hits.unsigned_abs(), t, hits)
            }
        };
        if late {
            t.decision.allowed = false;
            t.decision.retry_after = None;
        } else if held {
            t.decision.allowed = false;
            t.decision.retry_after = Some(hold_until - now);
        }
        if hits != 0 {
            shared.store(&mut shard, digest, t, hits, now);
        }
        if lease {
            self.record(ask, units, t.decision.reset_after, now);
        }
        Grant {
            units,
            decision: t.decision,
            now,
            epoch: born,
        }
    }

    /// What a lease with an id was granted the first time, if this is a retry of it.
    fn replayed(&self, ask: &LeaseAsk, now: Micros) -> Option<Recorded> {
        if !matches!(ask.take, Take::Lease(_)) || ask.id.seq == 0 {
            return None;
        }
        self.shared
            .asks
            .lock()
            .get(&(ask.id.asker, ask.key.clone()))
            .filter(|r| r.seq == ask.id.seq && now < r.until)
            .copied()
    }

    /// Keeps what a lease with an id was granted, for its retry.
    fn record(&self, ask: &LeaseAsk, units: u64, reset_after: Micros, now: Micros) {
        if ask.id.seq == 0 {
            return;
        }
        let recorded = Recorded {
            seq: ask.id.seq,
            units,
            at: now,
            reset_after,
            until: now.saturating_add(ASK_KEPT),
        };
        let mut asks = self.shared.asks.lock();
        if asks.len() >= MAX_ASKS {
            asks.retain(|_, r| r.until > now);
        }
        if asks.len() < MAX_ASKS {
            asks.insert((ask.id.asker, ask.key.clone()), recorded);
        }
    }

    /// Forgets every counter and the leases' epoch, as Redis restarted empty or flushed:
    /// for tests of the learning rule.
    pub fn wipe(&self) {
        let shared = &*self.shared;
        for shard in shared.shards.iter() {
            let mut shard = shard.lock();
            let dropped = shard.entries.retain(|_| false) as u64;
            shared.tracked.fetch_sub(dropped, Ordering::Relaxed);
        }
        *shared.epoch.lock() = (0, 0);
        *shared.pools.lock() = pools::Pools::default();
        shared.asks.lock().clear();
    }
}
