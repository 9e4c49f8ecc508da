// The pool's arithmetic is one state machine that the memory store runs and lua/pool.lua
// mirrors (its unit tests walk it, in pool/tests.rs): the common part here, a token bucket's
// tokens in pool/tokens.rs, a fixed window's next pool in pool/next.rs.
//! A region's pool of a global counter (`scope: global`, docs/configuration/leased-quota.md,
//! "Across regions"): the units the root counter granted this region, which the region's
//! instances take blocks from, and the state of the region's asks to the root. The pool is
//! one record in the region's store, changed atomically by one operation at a time; its
//! arithmetic is written once, here ([`Pool::apply`]): the memory store runs it and
//! `lua/pool.lua` mirrors it line for line.
//!
//! - A pool holds `granted − used` free units until `until` (region time: timed from before
//!   the root call that granted them, never past the root window's end), then nothing.
//! - A take is the lease arithmetic with `R := granted − used`: at least the request's hits,
//!   at most what the block wants and `⌊R / 2n⌋` for `n` instances in the region.
//! - A take that leaves the pool low (under what the region uses in the time an ask takes,
//!   or empty, or ending before its window does) makes its caller the one that asks the root,
//!   if no ask is in flight: the pool records the ask (a marker) and answers what to ask.
//! - The root's answer is installed by the asker: units added to the pool of the same root
//!   window and epoch, or a new pool (a new window, a wiped root); a refusal or a failed
//!   call only clears the marker, until a time to ask again.
//! - Units come back from blocks (guarded by the pool's generation and root window) and go
//!   back to the root when nobody in the region takes any (withdrawn first, so that no
//!   instance can take them while they travel).
//! - A fixed window's pool that ends with its window asks for the next one a lead ahead: the
//!   grant waits as the next pool until the latest the root's window can start in region
//!   time, then becomes the pool.
//!
//! A token bucket's pool holds tokens, which the root bucket refills as time passes: a pool
//! may hold only the tokens the root still counts as taken, or the root and the region would
//! both admit them. Its free units are the last ones before `full_at` (the root bucket's
//! arrival time after the pool's last grant, in region time, never late), one emission
//! interval apart; a token whose time has passed is gone (see [`Pool::alive`]). Takes hand out
//! the earliest tokens, and a block's tokens end when the last of them does
//! ([`PoolAnswer::tokens_end`]). The root, the pools and the blocks together never hold more
//! than the burst.

use crate::algorithm::{Decision, Micros};
use crate::store::CounterKey;

pub use next::Next;

/// How long a pool's state outlives the pool (its end, its last ask): its rate and its ask
/// marker still matter for a while.
pub const KEEP: Micros = 60_000_000;

/// The longest time ahead a token bucket's pool counts its tokens over (30 days): with it,
/// the arithmetic stays exact in `lua/pool.lua`'s doubles (below 2^53).
pub const MAX_SPAN: Micros = 30 * 24 * 3_600 * 1_000_000;

/// The longest emission interval a token bucket's pool counts with (ns; about 11 days a
/// token): see [`MAX_SPAN`].
pub const MAX_INTERVAL: u64 = 1_000_000_000_000_000;

/// One operation on a region's pool.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolOp {
    /// The global counter.
    pub key: CounterKey,
    /// What to do.
    pub kind: PoolKind,
}

/// What a [`PoolOp`] does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PoolKind {
    /// Units for a block or a request: `need` at least (0: only look), `want` at most, a
    /// share of what is free among `instances`.
    Take {
        /// The most units to take.
        want: u64,
        /// The fewest worth taking (the request's hits).
        need: u64,
        /// The region's instances taking leases recently.
        instances: u64,
        /// The demand a refusal stands for (at least `need`): a refused block is asked
        /// again only after a while, and stands for its instance's use in that while.
        demand: u64,
        /// When the pool asks the root.
        timing: Timing,
    },
    /// A block's unused units back, if the pool is still the one (`generation`) of the root
    /// window (`guard`) they came from. A token bucket's pool takes back only the units of
    /// the take that left it as it is (`guard`: its [`PoolAnswer::mark`]), to where they were.
    Return {
        /// Units handed back.
        units: u64,
        /// The pool's generation (its [`PoolAnswer::generation`]) when they were taken.
        generation: Micros,
        /// The root window's start (root time) when they were taken.
        guard: Micros,
    },
    /// The root's answer to the ask this pool's [`RootAsk`] made.
    Install(Install),
    /// The free units out, for a hand-back to the root, with what was taken since the last
    /// report: when no instance took any for `idle`, or the pool ended.
    Withdraw {
        /// How long the pool must have been idle.
        idle: Micros,
    },
}

/// When a pool asks the root, and for how much.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Ask when what is free would last less than this at the region's rate, or the pool
    /// ends within it: the root's round trip, a lease period (an active region takes at
    /// least once in it) and a quarter of the region lease period.
    pub lead: Micros,
    /// The region lease period: what an ask wants is the region's use in this time.
    pub period: Micros,
    /// How long an ask is taken to be in flight, at most (twice the root deadline): then
    /// another caller may ask.
    pub ask_ttl: Micros,
    /// The root window's length.
    pub window: Micros,
    /// The fewest units an ask wants: the limit's own rate over a region lease period
    /// (`⌈L × period / window⌉`), so that a new key is not asked for one unit at a time
    /// while its rate is learned.
    pub floor: u64,
    /// Whether a pool that ends with its window asks for the next one ahead of it (a fixed
    /// window's, whose root counter is one per window).
    pub advance: bool,
}

/// The root's answer to a pool's ask, installed in the pool by the asker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Install {
    /// Units granted (0: refused, or the call failed).
    pub units: u64,
    /// The root window's start, root time; a token bucket's arrival time after the grant
    /// (root time: the root's time of its answer plus its time until full).
    pub guard: Micros,
    /// A token bucket's emission interval in nanoseconds, rounded up (at most
    /// [`MAX_INTERVAL`]); 0 for a fixed or sliding window.
    pub interval: u64,
    /// The root's epoch (the learning rule).
    pub epoch: Micros,
    /// Region time when the ask was made (its [`PoolAnswer::now`]).
    pub asked_at: Micros,
    /// Root time of its answer minus `asked_at`: the root's clock ahead of the region's,
    /// overestimated by the round trip, so that times derived from it are never late.
    pub offset: i64,
    /// How long the units may be admitted from `asked_at`: the region lease period, and no
    /// longer than the root window had left.
    pub left: Micros,
    /// The pool's `used` the ask reported (see [`RootAsk::used`]).
    pub reported: u64,
    /// Region time before which nobody asks again (0: anyone may): when no unit came, and
    /// when a token bucket's root had fewer than asked (the regions share its refill: a
    /// region near the root, asking again at once, would take nearly all of it).
    pub retry_at: Micros,
    /// Whether the root did not answer (the pool then says so to its takers).
    pub failed: bool,
    /// Region time before which the units may not be taken (a grant for the next window,
    /// from the latest the root's window can start in region time); 0: at once.
    pub from: Micros,
    /// A fixed window's grant: the root start of the window before its own (0: none). A
    /// grant for the next window also tells the pool of that window when its window ends
    /// at the earliest by this grant's clock reading, which may be closer than the pool's
    /// own grants' (a slow call overestimates the offset for the rest of the window).
    pub prev_guard: Micros,
}

/// The pool's answer to one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolAnswer {
    /// Units taken, returned, installed or withdrawn.
    pub units: u64,
    /// Free units after the operation (0 once the pool ended).
    pub free: u64,
    /// The region store's time.
    pub now: Micros,
    /// The root's time as the pool knows it (never behind it); `now` without a pool.
    pub root_now: Micros,
    /// Region time the pool ends.
    pub until: Micros,
    /// The root window's start (root time).
    pub guard: Micros,
    /// The root's epoch of the pool's units.
    pub epoch: Micros,
    /// The pool's generation: region time it was made (0: none); a token bucket's pool
    /// takes a new one at each grant.
    pub generation: Micros,
    /// A token bucket's pool: what a [`PoolKind::Return`] of the units this operation took
    /// must name as its guard (the pool's `used` after it).
    pub mark: u64,
    /// A token bucket's pool: region time its first free token ends, which is when the
    /// units this operation took end at the latest (0: not a token bucket's pool).
    pub tokens_end: Micros,
    /// Whether the root's last answer failed (a cut-off region).
    pub root_failed: bool,
    /// Whether an ask to the root is in flight.
    pub asking: bool,
    /// This caller asks the root (a take), or hands units back (a withdrawal): what.
    pub ask: Option<RootAsk>,
}

/// What a pool's caller asks the root, or hands back to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RootAsk {
    /// Units to ask (at least 1), or to hand back.
    pub units: u64,
    /// The learning rule's report: the epoch of the pool's units and what was taken from
    /// them since the last report.
    pub epoch: Micros,
    /// See above.
    pub admitted: u64,
    /// The pool's `used` the report counts up to.
    pub used: u64,
    /// The root window's start, root time (a hand-back's guard).
    pub guard: Micros,
    /// An ask for the next window, ahead of it.
    pub next: bool,
}

/// A pool's state.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Pool {
    /// Units the root granted for this pool.
    pub granted: u64,
    /// Units taken (by blocks and requests) or withdrawn.
    pub used: u64,
    /// The root window's start, root time.
    pub guard: Micros,
    /// The root's epoch of the units.
    pub epoch: Micros,
    /// Region time the pool was made.
    pub generation: Micros,
    /// Region time after which it grants nothing.
    pub until: Micros,
    /// See [`Install::offset`].
    pub offset: i64,
    /// Units taken plus hits refused, ever: the region's demand.
    pub demand: u64,
    /// `demand` and region time at the last ask: the region's rate since.
    pub asked_demand: u64,
    /// See above.
    pub asked_at: Micros,
    /// Region time until which an ask is in flight (or nobody asks again).
    pub asking_until: Micros,
    /// `used` when the last report went to the root.
    pub reported: u64,
    /// Whether the root's last answer failed.
    pub failed: bool,
    /// Region time of the last take of units.
    pub last_take: Micros,
    /// A token bucket's emission interval (ns); 0 for a window's pool.
    pub interval: u64,
    /// A token bucket's pool: region time its last token ends.
    pub full_at: Micros,
    /// A token bucket's pool: units of its last grant, the most a hand-back returns (they
    /// are the root bucket's last tokens, while its arrival time is the pool's guard).
    pub last_grant: u64,
    /// A fixed window's next pool, if granted ahead of its window.
    pub next: Next,
}

impl Pool {
    /// Applies `kind` at region time `now`; returns the answer. A missing pool is
    /// `Pool::default()`.
    pub fn apply(&mut self, kind: &PoolKind, now: Micros) -> PoolAnswer {
        if self.keep_until() <= now {
            *self = Pool::default();
        }
        self.evaporate(now);
        self.promote(now);
        let mut answer = match *kind {
            PoolKind::Take {
                want,
                need,
                instances,
                demand,
                timing,
            } => self.take((want, need, demand), instances, &timing, now),
            PoolKind::Return {
                units,
                generation,
                guard,
            } => {
                let mut back = 0;
                let current = if self.interval > 0 {
                    guard == self.used
                } else {
                    guard == self.guard
                };
                if generation == self.generation && current && self.generation != 0 {
                    back = units.min(self.used);
                    self.used -= back;
                    self.reported = self.reported.min(self.used);
                }
                PoolAnswer {
                    units: back,
                    ..PoolAnswer::default()
                }
            }
            PoolKind::Install(install) => self.install(&install, now),
            PoolKind::Withdraw { idle } => self.withdraw(idle, now),
        };
        answer.now = now;
        answer.root_now = if self.generation == 0 {
            now
        } else {
            now.saturating_add_signed(self.offset)
        };
        answer.free = self.free(now);
        answer.until = self.until;
        answer.guard = self.guard;
        answer.epoch = self.epoch;
        answer.generation = self.generation;
        answer.mark = self.used;
        answer.tokens_end = if self.interval > 0 && self.generation != 0 {
            self.front()
        } else {
            0
        };
        answer.root_failed = self.failed;
        answer.asking = now < self.asking_until;
        answer
    }

    /// Free units at `now`.
    pub fn free(&self, now: Micros) -> u64 {
        if now >= self.until {
            0
        } else if self.interval > 0 {
            (self.granted - self.used).min(self.alive(now))
        } else {
            self.granted - self.used
        }
    }

    /// Until when the pool's state matters: past its end, the region's rate and the marker
    /// still do for [`KEEP`]. A store may drop it then; [`Pool::apply`] forgets it then
    /// anyway, so that a store's expiry, late or early, changes nothing.
    pub fn keep_until(&self) -> Micros {
        self.until
            .max(self.asking_until)
            .max(self.asked_at)
            .max(self.next.until)
            .saturating_add(KEEP)
    }

    fn take(
        &mut self,
        (want, need, demand): (u64, u64, u64),
        instances: u64,
        timing: &Timing,
        now: Micros,
    ) -> PoolAnswer {
        let free = self.free(now);
        let units = if need > 0 && need <= free {
            let share = free / (2 * instances.max(1));
            want.min(share).max(need).min(free)
        } else {
            0
        };
        self.used += units;
        if need > 0 {
            self.demand += if units > 0 { units } else { need.max(demand) };
            self.last_take = now;
        }
        let mut answer = PoolAnswer {
            units,
            ..PoolAnswer::default()
        };
        if need == 0 || now < self.asking_until {
            return answer;
        }
        // The region's rate since the last ask (units per µs), what is left would last
        // `lead` at it; an ask wants a region lease period's worth.
        // (Over a quarter region lease period at least: demand counted over a few
        // milliseconds says little about a second.)
        let rate = if self.asked_at > 0 && now > self.asked_at {
            let elapsed = (now - self.asked_at).max(timing.period / 4).max(1);
            (self.demand - self.asked_demand) as f64 / elapsed as f64
        } else {
            0.0
        };
        let low_water = (rate * timing.lead as f64).ceil() as u64;
        let left = free - units;
        let window_end = (self.guard + timing.window).saturating_add_signed(-self.offset);
        // (A window's pool that ends with its window asks at the next window's first take;
        // a token bucket has no window.)
        let within_lead = now.saturating_add(timing.lead) >= self.until;
        let ending = within_lead && (self.interval > 0 || self.until < window_end);
        // A pool that ends with its window asks for the next one, once, a lead ahead.
        let advance = timing.advance
            && within_lead
            && self.interval == 0
            && self.generation != 0
            && self.until >= window_end
            && self.next.granted == 0;
        if units > 0 && left >= low_water.max(1) && !ending && !advance {
            return answer;
        }
        self.asking_until = now.saturating_add(timing.ask_ttl);
        self.asked_at = now;
        self.asked_demand = self.demand;
        answer.ask = Some(RootAsk {
            units: ((rate * timing.period as f64).ceil() as u64)
                .max(need)
                .max(timing.floor),
            epoch: self.epoch,
            admitted: self.used.saturating_sub(self.reported),
            used: self.used,
            guard: self.guard,
            next: advance,
        });
        answer
    }

    fn install(&mut self, install: &Install, now: Micros) -> PoolAnswer {
        self.asking_until = install.retry_at;
        self.failed = install.failed;
        if install.failed {
            return PoolAnswer::default();
        }
        let ends = install.asked_at.saturating_add(install.left);
        if install.units > 0 && install.from > now && install.interval == 0 && ends > install.from {
            return self.install_next(install, ends);
        }
        // The same pool while the root window and epoch are: an ended one comes back with
        // what it still had free (counted at the root, never admitted), and blocks taken
        // from it can still give back to it. A token bucket's: while the root's epoch is.
        let same = self.generation != 0
            && self.epoch == install.epoch
            && self.interval == install.interval
            && (install.interval > 0 || self.guard == install.guard);
        if same {
            self.reported = self.reported.max(install.reported).min(self.used);
        }
        if install.units == 0 {
            return PoolAnswer::default();
        }
        if ends <= now {
            // Too late: the units go back to the root (the caller hands them back).
            return PoolAnswer {
                ask: Some(RootAsk {
                    units: install.units,
                    guard: install.guard,
                    epoch: install.epoch,
                    ..RootAsk::default()
                }),
                ..PoolAnswer::default()
            };
        }
        if same && install.interval > 0 {
            self.add_tokens(install, now);
            self.until = self.until.max(ends);
        } else if same {
            self.granted += install.units;
            self.until = self.until.max(ends);
            self.offset = self.offset.max(install.offset);
        } else {
            *self = Pool {
                granted: install.units,
                used: 0,
                guard: install.guard,
                epoch: install.epoch,
                generation: now.max(self.generation + 1),
                until: ends,
                offset: install.offset,
                reported: 0,
                failed: false,
                asking_until: 0,
                interval: install.interval,
                full_at: install.guard.saturating_add_signed(-install.offset),
                last_grant: install.units,
                ..*self
            };
            // (Tokens whose time passed while the grant travelled are gone.)
            self.evaporate(now);
        }
        PoolAnswer {
            units: install.units,
            ..PoolAnswer::default()
        }
    }

    fn withdraw(&mut self, idle: Micros, now: Micros) -> PoolAnswer {
        let free = self.granted - self.used;
        let quiet = now >= self.until || now.saturating_sub(self.last_take) >= idle;
        let unreported = self.used.saturating_sub(self.reported);
        if self.generation == 0 || (free == 0 && unreported == 0) || !quiet {
            return PoolAnswer::default();
        }
        // (With nothing free, only the report: what was taken since the last one, which a
        // root wiped under this pool must charge.) A token bucket's pool hands back its
        // last grant's tokens at most: the root bucket's last ones; the others go with
        // their time.
        let units = if self.interval > 0 {
            free.min(self.last_grant)
        } else {
            free
        };
        self.used = self.granted;
        self.reported = self.used;
        self.last_grant = 0;
        PoolAnswer {
            units,
            ask: Some(RootAsk {
                units,
                epoch: self.epoch,
                admitted: unreported,
                used: self.used,
                guard: self.guard,
                next: false,
            }),
            ..PoolAnswer::default()
        }
    }
}

impl PoolAnswer {
    /// The answer to a take, as a counter's decision: allowed when units came; what is left
    /// of the root window; a refusal retried after `retry`.
    pub fn decision(&self, window: Micros, retry: Micros) -> Decision {
        let reset_after = if self.tokens_end > 0 {
            self.tokens_end.saturating_sub(self.now)
        } else if self.generation == 0 {
            window - self.root_now % window.max(1)
        } else {
            (self.guard + window).saturating_sub(self.root_now)
        };
        Decision {
            allowed: self.units > 0,
            remaining: self.free,
            reset_after,
            retry_after: (self.units == 0).then_some(retry.max(1_000)),
            overdraft: 0,
        }
    }
}

mod next;
mod tokens;

#[cfg(test)]
mod tests;
