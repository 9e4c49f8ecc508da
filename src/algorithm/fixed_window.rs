//! Fixed window: one count per window aligned to the Unix epoch (DESIGN §4).
//!
//! With limit `L`, window `W`, window start `s = floor(now / W) * W` and count `c`:
//! allowed iff `c + h <= L`, then `c += h`; remaining `L - c`; reset after `s + W - now`.
//! This is the reference service's algorithm; it admits up to `2L` across a window
//! boundary, which the sliding window and token bucket avoid.
//!
//! A usage budget ([`Limit::overdraft`]) passes iff `c + max(h, 1) <= L` and charges `h`
//! either way: the count may pass `L`, and stays there until the window ends.

use super::{Decision, Limit, Micros, can_ever_pass};

/// The stored state: the start of the window the count belongs to, and the count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Start of the window, a multiple of the window length.
    pub start: Micros,
    /// Hits charged within that window.
    pub count: u64,
}

impl Window {
    /// The instant this window ends, after which the state is the same as no state.
    pub fn end(&self, limit: &Limit) -> Micros {
        self.start.saturating_add(limit.window)
    }
}

/// Applies `hits` (negative: refund) to `state`; returns the decision and the state to keep
/// if the hits are charged.
pub fn decide(state: Option<&Window>, limit: &Limit, now: Micros, hits: i64) -> (Decision, Window) {
    let current_start = now - now % limit.window;
    // A stored window later than `now`'s window means the clock stepped backwards: keep
    // counting in the stored window rather than handing out a fresh budget.
    let window = match state {
        Some(w) if w.start >= current_start => *w,
        _ => Window {
            start: current_start,
            count: 0,
        },
    };
    let reset_after = window.end(limit).saturating_sub(now);

    if hits < 0 {
        let next = Window {
            count: window.count.saturating_sub(hits.unsigned_abs()),
            ..window
        };
        return (allowed(limit, next, reset_after), next);
    }

    let hits = hits as u64;
    let fits =
        limit.requests > 0 && window.count.saturating_add(limit.room_for(hits)) <= limit.requests;
    if fits {
        let next = Window {
            count: window.count + hits,
            ..window
        };
        (allowed(limit, next, reset_after), next)
    } else {
        // A usage budget records the refused charge: the overdraft stays until the window ends.
        let next = Window {
            count: window
                .count
                .saturating_add(if limit.overdraft { hits } else { 0 }),
            ..window
        };
        let decision = Decision {
            overdraft: if limit.overdraft {
                next.count.saturating_sub(limit.requests)
            } else {
                0
            },
            allowed: false,
            remaining: limit.requests.saturating_sub(next.count),
            reset_after,
            // More hits than the limit never fit, however long the client waits.
            retry_after: can_ever_pass(limit.requests, hits).then_some(reset_after),
        };
        (decision, next)
    }
}

fn allowed(limit: &Limit, window: Window, reset_after: Micros) -> Decision {
    Decision {
        overdraft: 0,
        allowed: true,
        remaining: limit.requests.saturating_sub(window.count),
        reset_after,
        retry_after: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, SECOND};

    const MINUTE: Micros = 60 * SECOND;

    fn per_minute(requests: u64) -> Limit {
        Limit::new(requests, MINUTE, Algorithm::FixedWindow)
    }

    /// Runs `hits` against `state`, keeping the new state only when allowed (as stores do).
    fn hit(state: &mut Option<Window>, limit: &Limit, now: Micros, hits: i64) -> Decision {
        let (decision, next) = decide(state.as_ref(), limit, now, hits);
        if decision.allowed {
            *state = Some(next);
        }
        decision
    }

    #[test]
    fn admits_exactly_the_limit_within_one_window() {
        let limit = per_minute(3);
        let mut state = None;
        let remaining: Vec<_> = (0..4)
            .map(|i| hit(&mut state, &limit, 10 * SECOND + i, 1))
            .map(|d| (d.allowed, d.remaining))
            .collect();
        assert_eq!(remaining, [(true, 2), (true, 1), (true, 0), (false, 0)]);
    }

    #[test]
    fn reset_and_retry_after_point_at_the_window_end() {
        let limit = per_minute(1);
        let mut state = None;
        let now = 61 * SECOND + 500_000;
        assert_eq!(hit(&mut state, &limit, now, 1).reset_after, 58_500_000);
        let rejected = hit(&mut state, &limit, now, 1);
        assert_eq!(rejected.retry_after, Some(58_500_000));
    }

    #[test]
    fn a_new_window_starts_from_zero() {
        let limit = per_minute(1);
        let mut state = None;
        assert!(hit(&mut state, &limit, 59 * SECOND, 1).allowed);
        assert!(!hit(&mut state, &limit, 59 * SECOND + 999_999, 1).allowed);
        assert!(hit(&mut state, &limit, 60 * SECOND, 1).allowed);
    }

    #[test]
    fn zero_requests_per_unit_is_always_over_and_never_retryable() {
        let limit = per_minute(0);
        let decision = hit(&mut None, &limit, 5, 1);
        assert!(!decision.allowed);
        assert_eq!(decision.retry_after, None);
        assert!(!hit(&mut None, &limit, 5, 0).allowed);
    }

    #[test]
    fn more_hits_than_the_limit_can_never_pass() {
        let decision = hit(&mut None, &per_minute(5), 0, 6);
        assert!(!decision.allowed);
        assert_eq!(decision.retry_after, None);
        assert_eq!(decision.remaining, 5);
    }

    #[test]
    fn zero_hits_peeks_without_charging() {
        let limit = per_minute(2);
        let mut state = None;
        hit(&mut state, &limit, 0, 2);
        let peek = hit(&mut state, &limit, 1, 0);
        assert!(peek.allowed);
        assert_eq!(peek.remaining, 0);
        assert_eq!(state.unwrap().count, 2);
    }

    #[test]
    fn refunds_return_hits_but_never_below_zero() {
        let limit = per_minute(5);
        let mut state = None;
        hit(&mut state, &limit, 0, 3);
        assert_eq!(hit(&mut state, &limit, 1, -2).remaining, 4);
        assert_eq!(hit(&mut state, &limit, 2, -10).remaining, 5);
        assert_eq!(state.unwrap().count, 0);
    }

    #[test]
    fn a_clock_stepping_back_keeps_the_later_window() {
        let limit = per_minute(1);
        let mut state = None;
        assert!(hit(&mut state, &limit, 60 * SECOND, 1).allowed);
        // The clock jumps back into the previous window: the budget is not handed out again.
        assert!(!hit(&mut state, &limit, 59 * SECOND, 1).allowed);
    }
}
