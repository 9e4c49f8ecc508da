//! A token bucket's pool: its tokens, one emission interval apart, up to the root bucket's
//! arrival time after its last grant (see the module above).

use super::{Install, MAX_SPAN, Pool};
use crate::algorithm::Micros;

impl Pool {
    /// A token bucket's pool: how many of its last tokens end after `t`: those before
    /// `full_at`, one interval apart, counted over [`MAX_SPAN`] at most.
    pub fn alive(&self, t: Micros) -> u64 {
        if t >= self.full_at || self.interval == 0 {
            return 0;
        }
        let span = (self.full_at - t).min(MAX_SPAN) as u128;
        (span * 1_000 / self.interval as u128) as u64
    }

    /// A token bucket's pool: its free tokens whose time has passed are gone (taken, not
    /// admitted: not reported).
    pub(super) fn evaporate(&mut self, now: Micros) {
        if self.interval == 0 || self.generation == 0 {
            return;
        }
        let free = self.granted - self.used;
        let alive = self.alive(now);
        if free > alive {
            let gone = free - alive;
            self.used += gone;
            self.reported = (self.reported + gone).min(self.used);
        }
    }

    /// A token bucket's pool: region time its first free token ends (rounded down).
    pub(super) fn front(&self) -> Micros {
        self.full_at - self.span(self.granted - self.used).min(self.full_at)
    }

    /// The time `tokens` intervals take (µs, rounded up).
    fn span(&self, tokens: u64) -> Micros {
        let ns = tokens as u128 * self.interval as u128;
        ns.div_ceil(1_000).min(u64::MAX as u128) as Micros
    }

    /// A token bucket's grant into its pool: its tokens end at the root's arrival time (in
    /// region time, with the pool's offset, the larger of the two, so that the old tokens
    /// and the new are placed alike and never late). The free tokens stay one run before
    /// `full_at`, never moved later:
    /// - the old run ends at or after the new one begins (the root charged nobody between
    ///   the two grants): one run up to the new end, the old tokens where they were or
    ///   earlier;
    /// - else a gap, which another region's charge at the root fills: the new tokens move
    ///   back to follow the old ones (ending earlier by the gap) when the gap is shorter
    ///   than the old run, else the old tokens are dropped. Either loses at most the shorter
    ///   of the two (under, never over).
    ///
    /// A new generation: units taken before it no longer come back (their place moved).
    pub(super) fn add_tokens(&mut self, install: &Install, now: Micros) {
        let offset = self.offset.max(install.offset);
        self.full_at = self
            .full_at
            .saturating_sub(offset.abs_diff(self.offset).min(self.full_at));
        self.offset = offset;
        self.evaporate(now);
        let old = self.granted - self.used;
        let new_end = install.guard.saturating_add_signed(-offset);
        let new_start = new_end.saturating_sub(self.span(install.units));
        let (full_at, kept) = if old == 0 || self.full_at >= new_start {
            (new_end, old)
        } else if new_start - self.full_at <= self.span(old) {
            let floor = (install.units as u128 * self.interval as u128 / 1_000) as Micros;
            (self.full_at.saturating_add(floor).min(new_end), old)
        } else {
            (new_end, 0)
        };
        let dropped = old - kept;
        self.used += dropped;
        self.reported = (self.reported + dropped).min(self.used);
        self.granted += install.units;
        self.full_at = full_at;
        self.guard = install.guard;
        self.last_grant = install.units;
        self.generation = now.max(self.generation + 1);
        self.evaporate(now);
    }
}
