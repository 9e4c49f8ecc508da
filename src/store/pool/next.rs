//! A fixed window's next pool: granted ahead of its window, it waits beside the pool until
//! the latest the root's window can start in region time, then becomes the pool (see the
//! module above).

use super::{Install, Pool, PoolAnswer};
use crate::algorithm::Micros;

/// A fixed window's next pool, granted ahead of its window: it becomes the pool at `from`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Next {
    /// Units granted (0: none).
    pub granted: u64,
    /// Its root window's start, epoch and offset (see [`Install`]).
    pub guard: Micros,
    /// See above.
    pub epoch: Micros,
    /// See above.
    pub offset: i64,
    /// Region time from which, and until which, its units may be taken.
    pub from: Micros,
    /// See above.
    pub until: Micros,
}

impl Pool {
    /// A grant for the next window (ahead of it): the next pool, added to it if it is the
    /// same window and epoch, else in its place.
    pub(super) fn install_next(&mut self, install: &Install, ends: Micros) -> PoolAnswer {
        // The pool of the window before, from the same root epoch, may last until this
        // grant's reading of that window's end: the earliest the next window can start in
        // region time, and no later than a region lease period from this ask. (Its offset
        // stays the larger: lowered too, the region model refused about a round trip more
        // at each window start.)
        if self.generation != 0
            && self.interval == 0
            && install.prev_guard != 0
            && self.guard == install.prev_guard
            && self.epoch == install.epoch
        {
            let end = install.guard.saturating_add_signed(-install.offset);
            self.until = self.until.max(end.min(ends));
        }
        let next = &mut self.next;
        if next.granted > 0 && next.guard == install.guard && next.epoch == install.epoch {
            next.granted += install.units;
            next.from = next.from.max(install.from);
            next.until = next.until.max(ends);
            next.offset = next.offset.max(install.offset);
        } else {
            *next = Next {
                granted: install.units,
                guard: install.guard,
                epoch: install.epoch,
                offset: install.offset,
                from: install.from,
                until: ends,
            };
        }
        PoolAnswer {
            units: install.units,
            ..PoolAnswer::default()
        }
    }

    /// The next pool becomes the pool once its time has come (the old one's window is over).
    pub(super) fn promote(&mut self, now: Micros) {
        if self.next.granted == 0 || now < self.next.from {
            return;
        }
        let next = std::mem::take(&mut self.next);
        *self = Pool {
            granted: next.granted,
            used: 0,
            guard: next.guard,
            epoch: next.epoch,
            generation: now.max(self.generation + 1),
            until: next.until,
            offset: next.offset,
            reported: 0,
            failed: false,
            interval: 0,
            full_at: 0,
            last_grant: 0,
            ..*self
        };
    }
}
