//! What an instance asks of a shared store for leased quota, and what it gets back.

use std::time::Duration;

use crate::algorithm::{Algorithm, Ask, Decision, Limit, Micros};
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
}

/// A lease or a hand-back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// Units for this instance's block (see [`crate::algorithm::lease`]).
    Lease(Ask),
    /// Unused units back to the counter. `leased_at` is the store time of the lease: a
    /// windowed counter whose window has moved on since is left alone (the units died with
    /// their window).
    GiveBack {
        /// Units handed back.
        units: u64,
        /// Store time (µs) of the lease they came from.
        leased_at: Micros,
    },
}

impl LeaseAsk {
    /// For a hand-back: the window start the counter must still be in, where the algorithm
    /// has windows (`None`: a token bucket, whose returned tokens never exceed the burst).
    pub fn guard(&self) -> Option<Micros> {
        match self.take {
            Take::GiveBack { leased_at, .. }
                if matches!(
                    self.limit.algorithm,
                    Algorithm::FixedWindow | Algorithm::SlidingWindow
                ) && self.limit.window > 0 =>
            {
                Some(leased_at - leased_at % self.limit.window)
            }
            _ => None,
        }
    }

    /// The hits to apply for a hand-back, negative; 0 for a lease or when the window has
    /// moved on since (at store time `now`).
    pub fn give_back_hits(&self, now: Micros) -> i64 {
        match self.take {
            Take::GiveBack { units, .. } => {
                let stale = self
                    .guard()
                    .is_some_and(|start| now - now % self.limit.window != start);
                if stale {
                    0
                } else {
                    -(units.min(i64::MAX as u64) as i64)
                }
            }
            Take::Lease(_) => 0,
        }
    }
}

/// A shared store's answer to one [`LeaseAsk`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Units taken for the block (0: refused, or a hand-back).
    pub units: u64,
    /// The counter's answer for the ask's need (allowed when units were taken).
    pub decision: Decision,
    /// The store's time (µs) of the answer.
    pub now: Micros,
}
