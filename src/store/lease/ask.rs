//! What an instance asks of a shared store for leased quota, and what it gets back.

use std::time::Duration;

use crate::algorithm::{Algorithm, Ask, Decision, Limit, Micros, State};
use crate::store::CounterKey;

/// Leasing settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseOptions {
    /// How long a block lives before its unused units go back (`LEASE_PERIOD`); blocks are
    /// sized for what the instance uses in this time.
    pub period: Duration,
    /// This instance's name in the shared count of instances taking leases.
    pub instance: String,
    /// Most counters this instance holds blocks for (`LEASE_MAX_KEYS`); beyond it, new
    /// counters are decided exactly.
    pub max_keys: usize,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        Self {
            period: Duration::from_secs(1),
            instance: format!("sluice-{}", std::process::id()),
            max_keys: 100_000,
        }
    }
}

/// One counter's lease, or hand-back, asked of a shared store.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseAsk {
    /// The counter.
    pub key: CounterKey,
    /// Its limit and algorithm (never concurrency).
    pub limit: Limit,
    /// What to do with it.
    pub take: Take,
    /// What the block admitted since its last call (the learning rule).
    pub report: Report,
    /// For a lease: the store's time (µs) after which it grants nothing, because the asker
    /// has given up waiting (0: none). A region's ask to the root carries one: an ask held by
    /// a partition and delivered when it heals must not take units nobody will receive.
    pub not_after: Micros,
    /// For a lease: who asks and which ask (`seq` 0: none). A region's ask to the root
    /// carries one; a retry of it carries the same, and the store answers the retry with
    /// what it granted the first time (kept for [`ASK_KEPT`]), so that a grant whose reply
    /// was lost is not lost, and nothing is granted twice.
    pub id: AskId,
    /// A fixed window's start the ask is for (0: the store's current window): a region asks
    /// the root for the next window ahead of it (decided as at its start), and a window that
    /// is over grants nothing and takes nothing back.
    pub start: Micros,
}

/// Who asks (`asker`, a region's name hashed) and which of its asks (`seq`, never 0).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct AskId {
    /// The asker.
    pub asker: u64,
    /// Its ask (0: none).
    pub seq: u64,
}

/// How long a store keeps the last grant of each asker for each counter (µs), for a retry.
pub const ASK_KEPT: Micros = 60_000_000;

/// The learning rule's part of an ask: what the block admitted since its last call, from
/// units of which epoch of the store (when a call last found it empty: new, flushed,
/// restarted empty). A store whose epoch is newer has lost the count those units were taken
/// from: it charges them (past the limit if need be: they were admitted) and ignores the
/// block's hand-back; and when it sees such a block within `hold` of its epoch's start, it
/// was wiped under blocks, and grants nothing until every one of them must have reported
/// (a lease period, its sweep, a call's deadline: `hold`). A wipe then costs leased quota
/// what it costs exact counting, the erased count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    /// The epoch the block's units came from (0: it has held none).
    pub epoch: Micros,
    /// Units the block admitted since its last call.
    pub admitted: u64,
    /// How long a store wiped under blocks grants nothing (µs).
    pub hold: Micros,
}

/// A lease or a hand-back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// Units for this instance's block (see [`crate::algorithm::lease`]).
    Lease(Ask),
    /// Unused units back to the counter, if it is still as the lease left it (0 units: the
    /// call only reports, see [`Report`]): a windowed
    /// counter in the window `guard` starts (the units died with their window otherwise); a
    /// token bucket whose arrival time is still `guard` (µs), the one the lease left. Tokens
    /// go back only while no other charge came after them: another instance's block was
    /// sized on the debt they are part of.
    GiveBack {
        /// Units handed back.
        units: u64,
        /// See above.
        guard: Micros,
    },
}

impl LeaseAsk {
    /// For a hand-back: its guard (see [`Take::GiveBack`]).
    pub fn guard(&self) -> Option<Micros> {
        match self.take {
            Take::GiveBack { guard, .. } => Some(guard),
            Take::Lease(_) => None,
        }
    }

    /// The hits to apply for a hand-back to a counter in `state` at store time `now`:
    /// negative, or 0 when the counter is no longer as the lease left it (or for a lease).
    pub fn give_back_hits(&self, state: Option<&State>, now: Micros) -> i64 {
        let Take::GiveBack { units, guard } = self.take else {
            return 0;
        };
        let current = match (self.limit.algorithm, state) {
            (Algorithm::FixedWindow | Algorithm::SlidingWindow, _) if self.limit.window > 0 => {
                now - now % self.limit.window == guard
            }
            // Within a microsecond: the store keeps the arrival time as a float.
            (Algorithm::TokenBucket, Some(State::TokenBucket(b))) => {
                (b.tat - guard as f64).abs() <= 1.0
            }
            _ => false,
        };
        if current {
            -(units.min(i64::MAX as u64) as i64)
        } else {
            0
        }
    }
}

/// A shared store's answer to one [`LeaseAsk`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Units taken for the block (0: refused); for a hand-back, the units handed back (0:
    /// the counter was no longer as the lease left it).
    pub units: u64,
    /// The counter's answer for the ask's need (allowed when units were taken).
    pub decision: Decision,
    /// The store's time (µs) of the answer.
    pub now: Micros,
    /// The store's epoch: when a call last found it empty (see [`Report`]).
    pub epoch: Micros,
}
