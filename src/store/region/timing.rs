//! The times a region works by: when its pools ask the root, when a refused take is worth
//! trying again, the demand a refusal stands for, and the root's time a block reads.

use std::sync::atomic::Ordering;

use super::{Core, micros};
use crate::algorithm::{Limit, Micros};
use crate::store::pool::{PoolAnswer, Timing};

impl Core {
    /// When a pool asks the root, and for how much (see [`Timing`]).
    pub(super) fn timing(&self, limit: &Limit) -> Timing {
        let window = limit.window.max(1);
        let floor = (limit.requests as u128 * self.period as u128).div_ceil(window as u128);
        Timing {
            // An active region takes from its pool at least once a lease period (its
            // instances' blocks end): asking this far ahead keeps a busy pool from ending.
            lead: self.round_trip.load(Ordering::Relaxed)
                + micros(self.options.lease_period)
                + self.period / 4,
            period: self.period,
            ask_ttl: 2 * micros(self.options.root_deadline),
            window,
            floor: floor.min(limit.requests as u128) as u64,
            advance: limit.algorithm == crate::algorithm::Algorithm::FixedWindow,
        }
    }

    /// When a refused take is worth trying again: once the ask in flight has landed (a
    /// root round trip), else a quarter region lease period.
    pub(super) fn retry(&self, answer: &PoolAnswer) -> Micros {
        if answer.asking || answer.ask.is_some() {
            self.round_trip
                .load(Ordering::Relaxed)
                .clamp(1_000, self.period / 4)
        } else {
            self.period / 4
        }
    }

    /// The demand a refused block lease stands for: its instance asks again only after its
    /// block's refusal ends (the retry, at most a quarter lease period), and wants `want`
    /// per lease period: what it would have used meanwhile.
    pub(super) fn refused_demand(&self, want: u64) -> u64 {
        let lease_period = micros(self.options.lease_period).max(1);
        let retry = self
            .round_trip
            .load(Ordering::Relaxed)
            .clamp(1_000, self.period / 4)
            .min(lease_period / 4);
        (want as u128 * retry as u128 / lease_period as u128) as u64
    }
}

/// The root's time a block taken from `answer`'s pool is told: its window ends as the block
/// reads it. A window's block must end by the pool's root window's end (region time), which
/// the pool bounds twice: by its guard and its largest offset, and by its end (each grant's
/// end is no later than the window's by that grant's own offset); the later of the two
/// holds. `root_now` alone would not do: it overestimates the root's time by the largest
/// offset, which can pass the window's end while the pool, ended by its best-timed grant,
/// still lasts; the block would then read the next window and admit the old window's units
/// a lease period into it, beside that window's limit.
pub(super) fn block_now(answer: &PoolAnswer, limit: &Limit) -> Micros {
    let window = limit.window.max(1);
    if !limit.algorithm.windowed() || answer.generation == 0 {
        return answer.root_now;
    }
    let end = answer.guard.saturating_add(window);
    let left = end
        .saturating_sub(answer.root_now)
        .max(answer.until.saturating_sub(answer.now))
        .min(window);
    if left == 0 {
        // (The pool has ended: nothing was taken.)
        return answer.root_now;
    }
    end - left
}
