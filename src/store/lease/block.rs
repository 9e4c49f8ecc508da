// Why one long file: take, install, give back and expire keep one invariant over a block's
// fields (each unit it holds was taken from the shared counter, and is admitted or handed back
// once), and the unit tests beside them check it.
//! One counter's block on this instance: the units it took from the shared counter and has
//! not admitted yet, and what it knows of the counter. Pure bookkeeping on the local clock;
//! the leasing layer holds each block under its shard's lock and does the store calls.

use std::sync::Arc;

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

use super::ask::{Grant, Report};
use crate::algorithm::{Algorithm, Ask, Decision, Limit, Micros, SECOND};
use crate::store::CounterKey;

/// A lease is worth a call of its own when the instance expects at least this many more
/// hits than the request's in a lease period; below it, hits are decided exactly.
const MIN_GAIN: u64 = 8;

/// A counter's block.
#[derive(Debug)]
pub(super) struct Block {
    pub(super) key: CounterKey,
    pub(super) limit: Limit,
    /// Units taken from the shared counter and not admitted yet.
    pub(super) units: u64,
    /// Hits admitted from this block's leases (net of refunds): what refunds may give back.
    used: u64,
    /// Hits asked of this block since the last lease: the instance's recent rate.
    asked_since_lease: u64,
    /// Hits per second this instance admitted on the counter, smoothed over leases.
    rate: f64,
    /// Local time of the last lease.
    leased_at: Micros,
    /// What a hand-back must find the counter still at (see `Take::GiveBack`): the
    /// window's start, or the bucket's arrival time the last lease left.
    pub(super) guard: Micros,
    /// Local time after which the units may no longer be admitted: the lease period's end or
    /// the window's, whichever comes first.
    pub(super) ends_at: Micros,
    /// Local time the lease's window ends (fixed and sliding windows; `Micros::MAX` for a
    /// token bucket): units left before it can go back, after it they died with it.
    pub(super) window_ends_at: Micros,
    /// What the shared counter had left after the last lease (for statuses).
    shared_left: u64,
    /// Local time the counter is fully restored, as the store said at the last lease.
    reset_at: Micros,
    /// The store refused `need` hits (or more) until this local time: answered from here.
    refused: Option<Refused>,
    /// A lease in flight: requests that need units wait for it rather than ask again.
    pub(super) flight: Option<Arc<Notify>>,
    /// The units the flight's leader found and counts on (its ask was for the rest): kept
    /// out of the block until the lease lands, so that nobody else takes them meanwhile.
    flight_units: u64,
    /// Units the last lease granted: a token bucket hands back at most these.
    pub(super) granted: u64,
    /// Changes whenever the units start over (a new window or lease period): units reserved
    /// before go back only to the block they came from.
    pub(super) generation: u64,
    /// Local time of the last hit: idle blocks are dropped.
    pub(super) touched_at: Micros,
    /// The store's epoch the units came from (0: none yet; see [`Report`]).
    epoch: Micros,
    /// Hits admitted since the last report was taken (net of refunds to the block).
    admitted: u64,
    /// Of those, what the lease in flight reports (back to `admitted` if it never lands).
    reporting: u64,
}

/// A refusal the store gave.
#[derive(Debug, Clone, Copy)]
struct Refused {
    need: u64,
    until: Micros,
    decision: Decision,
    at: Micros,
}

/// What a block says to `hits` hits.
#[derive(Debug)]
pub(super) enum Outcome {
    /// Decided here: admitted from the block (`reserved` hits taken from it), or refused as
    /// the store refused.
    Decided { decision: Decision, reserved: u64 },
    /// A lease is in flight: wait for it, then ask again (registered while the block's
    /// lock is held, so that the lease's wake-up cannot come between).
    Wait(OwnedNotified),
    /// Not enough units: take a lease with this ask, which carries the block's report (the
    /// caller leads the flight).
    Lease(Ask, Report),
    /// Not worth a lease (the recent rate asks for no more than these hits): decided by
    /// the shared store as an exact charge.
    Exact,
}

impl Block {
    pub(super) fn new(key: CounterKey, limit: Limit, now: Micros) -> Self {
        Self {
            key,
            limit,
            units: 0,
            used: 0,
            asked_since_lease: 0,
            rate: 0.0,
            leased_at: now,
            guard: 0,
            ends_at: now,
            window_ends_at: now,
            shared_left: 0,
            reset_at: now,
            refused: None,
            flight: None,
            flight_units: 0,
            granted: 0,
            generation: 0,
            touched_at: now,
            epoch: 0,
            admitted: 0,
            reporting: 0,
        }
    }

    /// What the block admitted since its last report, from units of which epoch; the count
    /// starts again. Admissions of a window that has ended belong to it (a report would
    /// charge the next one): none.
    pub(super) fn take_report(&mut self, now: Micros) -> Report {
        if self.limit.algorithm.windowed() && now >= self.window_ends_at {
            self.admitted = 0;
        }
        Report {
            epoch: self.epoch,
            admitted: std::mem::take(&mut self.admitted),
            hold: 0,
        }
    }

    /// Whether the block has something to report once its lease period has ended: hits
    /// admitted since its last call, in a window that has not ended.
    pub(super) fn has_report(&self, now: Micros) -> bool {
        self.admitted > 0 && (!self.limit.algorithm.windowed() || now < self.window_ends_at)
    }

    /// Ends the block if its time is up: returns the units that may go back to the shared
    /// counter (the window has not ended yet), or 0.
    pub(super) fn expire(&mut self, now: Micros) -> u64 {
        if now < self.ends_at || self.flight.is_some() {
            return 0;
        }
        self.evaporate(now);
        let back = if now >= self.window_ends_at {
            0
        } else if self.limit.algorithm.refills() {
            self.units.min(self.granted)
        } else {
            self.units
        };
        if self.units > 0 || self.used > 0 {
            self.generation += 1;
        }
        self.units = 0;
        if now >= self.window_ends_at {
            self.used = 0;
        }
        back
    }

    /// Decides `hits` (≥ 0) from the block at local time `now`; `instances` share the
    /// counter, `period` is the lease period.
    pub(super) fn take(
        &mut self,
        hits: u64,
        now: Micros,
        instances: u64,
        period: Micros,
    ) -> Outcome {
        self.touched_at = now;
        if hits == 0 {
            return Outcome::Decided {
                decision: self.allowed(now),
                reserved: 0,
            };
        }
        if let Some((decision, reserved)) = self.take_in_hand(hits, now) {
            return Outcome::Decided { decision, reserved };
        }
        let asked_before = self.asked_since_lease;
        self.asked_since_lease += hits;
        if let Some(flight) = &self.flight {
            return Outcome::Wait(flight.clone().notified_owned());
        }
        // A token bucket's leftover tokens are not added to a new block: each block may hold
        // only what the bucket owed when it was taken (see `evaporate`).
        let units = if now < self.ends_at && !self.limit.algorithm.refills() {
            self.units
        } else {
            0
        };
        let need = hits - units;
        let want = self.want(asked_before, need, now, period);
        if want < need.saturating_add(MIN_GAIN) {
            // This instance would use few more than the request's own hits in a lease
            // period: a lease would cost a call of its own for little. The shared store
            // decides them exactly (in the calls it shares among requests), and the hits
            // count toward the rate that sizes a later lease.
            return Outcome::Exact;
        }
        // The leftover waits for the lease with its leader (a token bucket's goes back).
        self.flight_units = units;
        self.units -= units;
        let report = self.take_report(now);
        self.reporting = report.admitted;
        Outcome::Lease(
            Ask {
                want,
                need,
                instances,
            },
            report,
        )
    }

    /// A token bucket refills the tokens a block took as time passes: a block may hold at
    /// most the tokens the bucket still owes (the time until it is full, at the last lease,
    /// in emission intervals), or this instance and the bucket would both admit them. The
    /// rest are the bucket's again; nothing needs handing back.
    fn evaporate(&mut self, now: Micros) {
        if !self.limit.algorithm.refills() || self.limit.requests == 0 {
            return;
        }
        let interval = self.limit.window as f64 / self.limit.requests as f64;
        // The store keeps the arrival time as a float: its time until full can read a
        // fraction of a microsecond short of a whole number of tokens. Half a token's worth
        // of slack at most (a microsecond, or less at rates over 500,000 a second) keeps a
        // block of k tokens from reading as k - 1, and never adds a whole one.
        let slack = interval.min(2.0) / 2.0;
        let owed = ((self.reset_at.saturating_sub(now) as f64 + slack) / interval).floor() as u64;
        self.units = self.units.min(owed);
    }

    /// Decides `hits` (> 0) from what the block holds at `now` (its units, or a refusal that
    /// covers them), changing nothing else: the decision and the hits taken, or `None` when
    /// that takes a lease (or a wait, or a hand-back first).
    pub(super) fn take_in_hand(&mut self, hits: u64, now: Micros) -> Option<(Decision, u64)> {
        if hits == 0 {
            return None;
        }
        self.touched_at = now;
        self.evaporate(now);
        let decided = if now < self.ends_at && self.units >= hits {
            self.units -= hits;
            self.used += hits;
            self.admitted += hits;
            (self.allowed(now), hits)
        } else {
            match self.refused {
                Some(refused) if now < refused.until && hits >= refused.need => {
                    (refused.decision_at(now), 0)
                }
                _ => return None,
            }
        };
        self.asked_since_lease += hits;
        Some(decided)
    }

    /// What to ask for: what this instance would admit in one lease period at its recent
    /// rate, at least `need`, at most the counter's capacity.
    fn want(&mut self, asked: u64, need: u64, now: Micros, period: Micros) -> u64 {
        let elapsed = now.saturating_sub(self.leased_at).max(1_000);
        if asked > 0 {
            let recent = asked as f64 * SECOND as f64 / elapsed as f64;
            // A rate from one short block is noisy; half the weight to the past.
            self.rate = if self.rate == 0.0 {
                recent
            } else {
                (self.rate + recent) / 2.0
            };
        }
        let per_period = (self.rate * period as f64 / SECOND as f64).ceil();
        let capacity = self.limit.requests.max(self.limit.burst);
        (per_period.min(capacity as f64) as u64).max(need)
    }

    /// Adds a lease's grant, asked at local time `asked` and answered at `now`; the
    /// leader's `hits` are then taken from the block when they fit. Returns the leader's
    /// decision and the hits reserved. The window's end is counted from when the call was
    /// sent, so that the block ends before the store's window does, never after.
    pub(super) fn install(
        &mut self,
        grant: &Grant,
        hits: u64,
        (asked, now): (Micros, Micros),
        period: Micros,
    ) -> (Decision, u64) {
        self.flight = None;
        self.reporting = 0;
        let mut leftover = std::mem::take(&mut self.flight_units);
        if self.epoch != 0 && grant.epoch != self.epoch {
            // The store was wiped (or is another): the units in hand were taken from the
            // count it lost, and what was admitted of them went in this call's report. They
            // die with that count.
            self.units = 0;
            self.used = 0;
            leftover = 0;
        }
        self.epoch = grant.epoch;
        let window_left = if self.limit.algorithm.windowed() {
            self.limit.window_left(grant.now)
        } else {
            Micros::MAX
        };
        if now >= self.ends_at || self.limit.algorithm.refills() {
            // The old block is over (its units were handed back or died), or a token
            // bucket's leftover, which the bucket refills: start again.
            self.generation += 1;
            self.units = 0;
            if now >= self.window_ends_at || self.limit.algorithm.refills() {
                self.used = 0;
            }
        }
        self.units += leftover;
        self.granted = grant.units;
        self.leased_at = now;
        self.guard = match self.limit.algorithm {
            Algorithm::TokenBucket => grant.now.saturating_add(grant.decision.reset_after),
            _ => grant.now - grant.now % self.limit.window.max(1),
        };
        self.asked_since_lease = 0;
        self.window_ends_at = asked.saturating_add(window_left);
        self.ends_at = now.saturating_add(period).min(self.window_ends_at);
        // From when the call was sent: the store's instant is no earlier, so this is no later.
        self.reset_at = asked.saturating_add(grant.decision.reset_after);
        self.shared_left = grant.decision.remaining;
        if grant.units == 0 {
            self.refused = Some(Refused {
                need: hits.saturating_sub(self.units).max(1),
                // Refused here for a quarter lease period at most: units other instances hand
                // back (their blocks end a lease period after they were taken) are seen soon.
                until: now.saturating_add(
                    grant
                        .decision
                        .retry_after
                        .unwrap_or(grant.decision.reset_after)
                        .min(period / 4),
                ),
                decision: grant.decision,
                at: now,
            });
        } else {
            self.refused = None;
            self.units += grant.units;
        }
        if grant.units > 0 && self.units >= hits {
            // The leader's hits, from the units just taken for them.
            self.units -= hits;
            self.used += hits;
            self.admitted += hits;
            return (self.allowed(now), hits);
        }
        let refused = Decision {
            allowed: false,
            ..grant.decision
        };
        (refused, 0)
    }

    /// Gives back hits admitted from this block (a refused request's reservation, or a
    /// refund): at most what it admitted in this generation. Returns the hits taken back.
    pub(super) fn give_back(&mut self, hits: u64, generation: u64) -> u64 {
        if generation != self.generation {
            return 0;
        }
        let back = hits.min(self.used);
        self.used -= back;
        self.units += back;
        self.admitted = self.admitted.saturating_sub(back);
        back
    }

    /// The status of an admitted request: what the counter had left at the last lease plus
    /// this instance's units (the units other instances hold are not known here).
    fn allowed(&self, now: Micros) -> Decision {
        Decision {
            overdraft: 0,
            allowed: self.limit.requests > 0,
            remaining: self.shared_left.saturating_add(self.units),
            reset_after: self.reset_at.saturating_sub(now),
            retry_after: None,
        }
    }

    /// A status for a refund decided here.
    pub(super) fn refunded(&self, now: Micros) -> Decision {
        Decision {
            allowed: true,
            ..self.allowed(now)
        }
    }

    /// Whether nothing happened on this block for `idle` and it holds nothing.
    pub(super) fn idle(&self, now: Micros, idle: Micros) -> bool {
        self.flight.is_none()
            && self.units == 0
            && now >= self.ends_at
            && now.saturating_sub(self.touched_at) >= idle
    }

    /// Clears the flight after a failed lease (its waiters ask again); the leader's
    /// leftover goes back to the block.
    pub(super) fn abort(&mut self) {
        if let Some(flight) = self.flight.take() {
            self.units += std::mem::take(&mut self.flight_units);
            self.admitted += std::mem::take(&mut self.reporting);
            flight.notify_waiters();
        }
    }
}

impl Refused {
    fn decision_at(&self, now: Micros) -> Decision {
        let elapsed = now.saturating_sub(self.at);
        Decision {
            overdraft: 0,
            allowed: false,
            remaining: self.decision.remaining,
            reset_after: self.decision.reset_after.saturating_sub(elapsed),
            retry_after: self.decision.retry_after.map(|r| r.saturating_sub(elapsed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;

    const MINUTE: Micros = 60 * SECOND;

    fn block(requests: u64) -> Block {
        let limit = Limit::new(requests, MINUTE, Algorithm::FixedWindow);
        Block::new(CounterKey::new("d", [("k", "v")], &limit), limit, 0)
    }

    fn grant(units: u64, remaining: u64, now: Micros) -> Grant {
        Grant {
            units,
            decision: Decision {
                overdraft: 0,
                allowed: units > 0,
                remaining,
                reset_after: MINUTE - now % MINUTE,
                retry_after: (units == 0).then_some(MINUTE - now % MINUTE),
            },
            now,
            epoch: 1,
        }
    }

    #[test]
    fn a_key_seen_once_is_exact_a_busy_one_leases_then_admits_from_its_units() {
        let mut b = block(1000);
        // No rate yet: a lease would be the hit itself.
        assert!(matches!(b.take(1, 0, 1, SECOND), Outcome::Exact));
        // A second hit 10 ms later: 100 a second, 100 for a lease period.
        let Outcome::Lease(ask, _) = b.take(1, 10_000, 1, SECOND) else {
            panic!("a busy key leases");
        };
        assert_eq!((ask.want, ask.need), (100, 1));
        b.flight = Some(Arc::new(Notify::new()));
        assert!(matches!(b.take(1, 10_000, 1, SECOND), Outcome::Wait(_)));
        let (d, reserved) = b.install(&grant(10, 990, 0), 1, (10_000, 10_000), SECOND);
        assert!(d.allowed);
        assert_eq!((reserved, b.units, d.remaining), (1, 9, 999));
        for _ in 0..9 {
            assert!(matches!(
                b.take(1, 10_010, 1, SECOND),
                Outcome::Decided { reserved: 1, .. }
            ));
        }
        // Ten hits in 10 µs (counted as 1 ms): the next ask is sized for a second of that.
        let Outcome::Lease(ask, _) = b.take(1, 10_010, 1, SECOND) else {
            panic!("the block is used up");
        };
        assert_eq!(ask.want, 1000);
    }

    #[test]
    fn a_refusal_answers_here_for_a_quarter_lease_period_at_most() {
        let mut b = block(10);
        let (d, _) = b.install(&grant(0, 0, 0), 1, (0, 0), SECOND);
        assert!(!d.allowed);
        assert!(matches!(
            b.take(1, SECOND / 4 - 1, 1, SECOND),
            Outcome::Decided { decision, .. } if !decision.allowed
        ));
        assert!(matches!(
            b.take(1, SECOND / 4, 1, SECOND),
            Outcome::Lease(..) | Outcome::Exact
        ));
    }

    #[test]
    fn units_go_back_before_the_window_ends_and_die_with_it() {
        let mut b = block(100);
        b.install(&grant(10, 90, 0), 1, (0, 0), SECOND);
        assert_eq!(b.expire(SECOND - 1), 0, "the lease period is not over");
        assert_eq!(b.expire(SECOND), 9);
        assert_eq!(b.units, 0);
        // A lease near the window's end ends with the window, and its units die with it.
        b.install(
            &grant(10, 80, MINUTE - 100),
            1,
            (2 * SECOND, 2 * SECOND),
            SECOND,
        );
        assert_eq!(b.ends_at, 2 * SECOND + 100);
        assert_eq!(b.expire(2 * SECOND + 100), 0);
    }

    #[test]
    fn refunds_give_back_at_most_what_the_block_admitted_in_its_generation() {
        let mut b = block(100);
        b.install(&grant(10, 90, 0), 3, (0, 0), SECOND);
        let generation = b.generation;
        assert_eq!(b.give_back(5, generation), 3);
        assert_eq!(b.units, 10);
        assert_eq!(b.give_back(1, generation + 1), 0);
    }
}
