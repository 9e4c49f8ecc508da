//! Token bucket as GCRA, the generic cell rate algorithm (DESIGN §4).
//!
//! Emission interval `T = W / L` (one token per `T`), capacity `B` (the burst). The state is
//! the theoretical arrival time `tat`: `tat' = max(tat, now) + h * T`; the hits pass iff
//! `tat' - B * T <= now`. A bucket is full when `tat <= now`, so an idle key never saves more
//! than one burst. The state also keeps the time of the last charge, and `now` is clamped to
//! it: a clock that steps backwards neither adds tokens nor removes any (DESIGN §4).
//! A usage budget ([`Limit::overdraft`]) passes iff `max(tat, now) + max(h, 1) * T - B * T
//! <= now` and charges `h` either way: `tat` may pass `now + B * T` (a debt), and the bucket
//! refills out of it at the same rate.
//! Fractional tokens are kept: `tat` is an `f64` of microseconds, computed in the same order
//! in Rust and in the Lua script.

use super::{Decision, Limit, Micros, can_ever_pass};

/// The stored state: the theoretical arrival time, in microseconds since the epoch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bucket {
    /// When the bucket will be full again if nothing else arrives.
    pub tat: f64,
    /// The time of the last charge; an earlier `now` is read as this time.
    pub last: Micros,
}

impl Bucket {
    /// Once `now` reaches `tat` the bucket is full: the state equals no state.
    pub fn expires_at(&self) -> Micros {
        self.tat.ceil().max(0.0) as Micros
    }
}

/// Applies `hits` (negative: refund) to `state`.
pub fn decide(state: Option<&Bucket>, limit: &Limit, now: Micros, hits: i64) -> (Decision, Bucket) {
    let now = state.map_or(now, |b| b.last.max(now));
    let now_f = now as f64;
    let tat = state.map_or(now_f, |b| b.tat).max(now_f);
    let burst = limit.burst;
    if limit.requests == 0 || burst == 0 {
        let decision = Decision {
            overdraft: 0,
            allowed: hits < 0,
            remaining: 0,
            reset_after: 0,
            retry_after: None,
        };
        return (decision, Bucket { tat, last: now });
    }
    let interval = limit.window as f64 / limit.requests as f64;
    let capacity = burst as f64 * interval;

    if hits < 0 {
        let next = Bucket {
            tat: (tat - hits.unsigned_abs() as f64 * interval).max(now_f),
            last: now,
        };
        return (allowed(&next, interval, capacity, now_f), next);
    }
    let h = hits as u64;
    let candidate = tat + h as f64 * interval;
    let needed = tat + limit.room_for(h) as f64 * interval;
    if needed - capacity <= now_f {
        let next = Bucket {
            tat: candidate,
            last: now,
        };
        return (allowed(&next, interval, capacity, now_f), next);
    }
    // A usage budget records the refused charge: the bucket goes into debt (its arrival time
    // passes now by more than the capacity) and refills out of it.
    let current = Bucket {
        tat: if limit.overdraft { candidate } else { tat },
        last: now,
    };
    let after = current.tat + limit.room_for(h) as f64 * interval;
    // A budget's debt: the tokens used past the burst.
    let debt = ((current.tat - now_f - capacity) / interval).floor();
    let decision = Decision {
        overdraft: if limit.overdraft && debt > 0.0 {
            debt as u64
        } else {
            0
        },
        allowed: false,
        remaining: remaining(&current, interval, capacity, now_f),
        reset_after: micros(current.tat - now_f),
        retry_after: can_ever_pass(burst, h).then(|| micros(after - capacity - now_f)),
    };
    (decision, current)
}

fn allowed(b: &Bucket, interval: f64, capacity: f64, now: f64) -> Decision {
    Decision {
        overdraft: 0,
        allowed: true,
        remaining: remaining(b, interval, capacity, now),
        reset_after: micros(b.tat - now),
        retry_after: None,
    }
}

/// Whole tokens left.
fn remaining(b: &Bucket, interval: f64, capacity: f64, now: f64) -> u64 {
    let left = ((capacity - (b.tat - now)) / interval).floor();
    if left <= 0.0 { 0 } else { left as u64 }
}

/// A positive duration in whole microseconds, rounded up (never early).
fn micros(d: f64) -> Micros {
    if d <= 0.0 { 0 } else { d.ceil() as Micros }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, SECOND};

    fn bucket(rate_per_second: u64, burst: u64) -> Limit {
        Limit {
            burst,
            ..Limit::new(rate_per_second, SECOND, Algorithm::TokenBucket)
        }
    }

    fn hit(state: &mut Option<Bucket>, limit: &Limit, now: Micros, hits: i64) -> Decision {
        let (decision, next) = decide(state.as_ref(), limit, now, hits);
        if decision.allowed {
            *state = Some(next);
        }
        decision
    }

    #[test]
    fn capacity_five_refilling_two_per_second() {
        let limit = bucket(2, 5);
        let mut state = None;
        let now = 1_000 * SECOND;
        let answers: Vec<bool> = (0..8)
            .map(|_| hit(&mut state, &limit, now, 1).allowed)
            .collect();
        assert_eq!(answers, [true, true, true, true, true, false, false, false]);
        // The next token exists after half a second.
        assert_eq!(
            hit(&mut state, &limit, now, 1).retry_after,
            Some(SECOND / 2)
        );
        assert!(hit(&mut state, &limit, now + SECOND, 1).allowed);
        // Another key is untouched.
        assert_eq!(hit(&mut None, &limit, now, 1).remaining, 4);
    }

    #[test]
    fn capacity_two_at_one_per_second() {
        let limit = bucket(1, 2);
        let mut state = None;
        assert!(hit(&mut state, &limit, 0, 1).allowed);
        assert!(hit(&mut state, &limit, 0, 1).allowed);
        let third = hit(&mut state, &limit, 0, 1);
        assert!(!third.allowed);
        assert_eq!(third.retry_after, Some(SECOND));
        assert!(hit(&mut state, &limit, SECOND, 1).allowed);
    }

    #[test]
    fn an_idle_bucket_holds_one_burst_at_most() {
        let limit = bucket(10, 3);
        let mut state = None;
        hit(&mut state, &limit, 0, 3);
        let later = hit(&mut state, &limit, 3_600 * SECOND, 0);
        assert_eq!(later.remaining, 3);
    }

    #[test]
    fn fractional_tokens_are_kept() {
        // 3 per second: one token every 333,333.33 µs. The thirds of a microsecond add up
        // instead of being rounded away.
        let limit = bucket(3, 3);
        let mut state = None;
        assert_eq!(hit(&mut state, &limit, 0, 3).remaining, 0);
        assert!(!hit(&mut state, &limit, 333_333, 1).allowed);
        assert!(hit(&mut state, &limit, 333_334, 1).allowed);
        assert!(!hit(&mut state, &limit, 666_666, 1).allowed);
        assert!(hit(&mut state, &limit, 666_667, 1).allowed);
        assert!(!hit(&mut state, &limit, 999_999, 1).allowed);
        assert!(hit(&mut state, &limit, SECOND, 1).allowed);
    }

    #[test]
    fn a_clock_stepping_back_neither_adds_nor_removes_tokens() {
        let limit = bucket(1, 1);
        let mut state = None;
        assert!(hit(&mut state, &limit, 10 * SECOND, 1).allowed);
        assert!(!hit(&mut state, &limit, 5 * SECOND, 1).allowed);
        // Plain GCRA would read 5 s as "6 s before the bucket refills" and refuse.
        let limit = bucket(1, 4);
        let mut state = None;
        assert_eq!(hit(&mut state, &limit, 10 * SECOND, 1).remaining, 3);
        assert_eq!(hit(&mut state, &limit, 5 * SECOND, 1).remaining, 2);
        // Time runs on from the last charge: one token back a second after it.
        assert_eq!(hit(&mut state, &limit, 11 * SECOND, 1).remaining, 2);
    }

    #[test]
    fn refunds_stop_at_a_full_bucket() {
        let limit = bucket(1, 4);
        let mut state = None;
        hit(&mut state, &limit, 0, 3);
        assert_eq!(hit(&mut state, &limit, 0, -1).remaining, 2);
        assert_eq!(hit(&mut state, &limit, 0, -10).remaining, 4);
    }

    #[test]
    fn more_hits_than_the_burst_never_pass() {
        let decision = hit(&mut None, &bucket(100, 5), 0, 6);
        assert!(!decision.allowed);
        assert_eq!(decision.retry_after, None);
    }
}
