//! Sliding window: a weighted two-window counter (DESIGN §4).
//!
//! With limit `L`, window `W`, current window start `s = floor(now / W) * W`, elapsed
//! `e = now - s`, previous window's count `p` and current `c`, the estimate of hits in the
//! last `W` is `p * (W - e) / W + c`; `h` hits pass iff `estimate + h <= L`. Unlike the fixed
//! window it never admits `2L` across a boundary; it assumes the previous window's hits were
//! spread evenly, so its error is bounded by that assumption.
//!
//! A usage budget ([`Limit::overdraft`]) passes iff `estimate + max(h, 1) <= L` and charges
//! `h` either way; the overdraft slides out with the windows that hold it.
//!
//! The state keeps the time of the last charge (its window is the current one) and `now` is
//! clamped to it: a clock that steps backwards neither adds capacity nor removes any.
//!
//! The arithmetic is `f64` in exactly this order in Rust and in the Lua script, so the same
//! state gives the same answer in memory and in Redis.

use super::{Decision, Limit, Micros, can_ever_pass};

/// The stored state: the time of the last charge, and the counts of its window and the one
/// before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Windows {
    /// The time of the last charge; an earlier `now` is read as this time.
    pub last: Micros,
    /// Hits of the window before the current one.
    pub previous: u64,
    /// Hits of the current window (the one holding `last`).
    pub current: u64,
}

impl Windows {
    /// Start of the current window, a multiple of the window length.
    pub fn start(&self, limit: &Limit) -> Micros {
        self.last - self.last % limit.window
    }

    /// After two windows, both counts have slid out: the state equals no state.
    pub fn expires_at(&self, limit: &Limit) -> Micros {
        self.start(limit).saturating_add(2 * limit.window)
    }
}

/// The estimate of hits within the last window, at `elapsed` into the current one.
fn estimate(w: &Windows, window: Micros, elapsed: Micros) -> f64 {
    w.previous as f64 * (window - elapsed) as f64 / window as f64 + w.current as f64
}

/// Applies `hits` (negative: refund) to `state`.
pub fn decide(
    state: Option<&Windows>,
    limit: &Limit,
    now: Micros,
    hits: i64,
) -> (Decision, Windows) {
    let window = limit.window;
    let now = state.map_or(now, |w| w.last.max(now));
    let start = now - now % window;
    // Roll the stored windows forward to `now`'s window.
    let w = match state {
        Some(w) if w.start(limit) == start => Windows { last: now, ..*w },
        Some(w) if w.start(limit) + window == start => Windows {
            last: now,
            previous: w.current,
            current: 0,
        },
        _ => Windows {
            last: now,
            previous: 0,
            current: 0,
        },
    };
    let elapsed = now - start;
    let l = limit.requests;

    if hits < 0 {
        let next = Windows {
            current: w.current.saturating_sub(hits.unsigned_abs()),
            ..w
        };
        return (allowed(limit, &next, now, elapsed), next);
    }
    let h = hits as u64;
    if l > 0 && estimate(&w, window, elapsed) + limit.room_for(h) as f64 <= l as f64 {
        let next = Windows {
            current: w.current + h,
            ..w
        };
        return (allowed(limit, &next, now, elapsed), next);
    }
    // A usage budget records the refused charge: the overdraft slides out with its windows.
    let w = Windows {
        current: w
            .current
            .saturating_add(if limit.overdraft { h } else { 0 }),
        ..w
    };
    // The overdraft: the current count (exact) plus the previous window's whole weighted
    // hits, less the limit.
    let weighted = (w.previous as f64 * (window - elapsed) as f64 / window as f64).floor();
    let decision = Decision {
        overdraft: if limit.overdraft {
            w.current.saturating_add(weighted as u64).saturating_sub(l)
        } else {
            0
        },
        allowed: false,
        remaining: remaining(&w, limit, elapsed),
        reset_after: full_after(&w, limit, now),
        retry_after: can_ever_pass(l, h).then(|| retry_after(&w, limit, now, limit.room_for(h))),
    };
    (decision, w)
}

fn allowed(limit: &Limit, w: &Windows, now: Micros, elapsed: Micros) -> Decision {
    Decision {
        overdraft: 0,
        allowed: true,
        remaining: remaining(w, limit, elapsed),
        reset_after: full_after(w, limit, now),
        retry_after: None,
    }
}

fn remaining(w: &Windows, limit: &Limit, elapsed: Micros) -> u64 {
    let left = limit.requests as f64 - estimate(w, limit.window, elapsed);
    if left <= 0.0 { 0 } else { left.floor() as u64 }
}

/// Time until the estimate is back to zero: the end of the next window if the current one
/// has hits, else the end of this one if the previous had any.
fn full_after(w: &Windows, limit: &Limit, now: Micros) -> Micros {
    let until = if w.current > 0 {
        w.start(limit) + 2 * limit.window
    } else if w.previous > 0 {
        w.start(limit) + limit.window
    } else {
        now
    };
    until.saturating_sub(now)
}

/// The earliest time from `now` at which `h` more hits fit (`h <= L`, `L > 0`).
fn retry_after(w: &Windows, limit: &Limit, now: Micros, h: u64) -> Micros {
    let (window, l) = (limit.window as f64, limit.requests as f64);
    let end = w.start(limit) + limit.window;
    // Within the current window, as the previous window's weight decays.
    if w.previous > 0 && w.current + h <= limit.requests {
        let t = end as f64 - (l - h as f64 - w.current as f64) * window / w.previous as f64;
        let t = t.ceil() as Micros;
        if t < end {
            return t.saturating_sub(now);
        }
    }
    // In the next window, where the current count becomes the decaying previous one.
    let t = if w.current > 0 {
        let t = (end + limit.window) as f64 - (l - h as f64) * window / w.current as f64;
        (t.ceil() as Micros).max(end)
    } else {
        end
    };
    t.saturating_sub(now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, SECOND};

    const MINUTE: Micros = 60 * SECOND;

    fn limit(requests: u64) -> Limit {
        Limit::new(requests, MINUTE, Algorithm::SlidingWindow)
    }

    fn hit(state: &mut Option<Windows>, limit: &Limit, now: Micros, hits: i64) -> Decision {
        let (decision, next) = decide(state.as_ref(), limit, now, hits);
        if decision.allowed {
            *state = Some(next);
        }
        decision
    }

    fn burst(state: &mut Option<Windows>, limit: &Limit, now: Micros, n: usize) -> usize {
        (0..n).filter(|_| hit(state, limit, now, 1).allowed).count()
    }

    #[test]
    fn the_boundary_burst_is_refused() {
        // 100 at second 59.9 and 100 at 60.1: the fixed window takes all 200.
        let limit = limit(100);
        let mut state = None;
        assert_eq!(burst(&mut state, &limit, 59 * SECOND + 900_000, 100), 100);
        let first = hit(&mut state, &limit, 60 * SECOND + 100_000, 1);
        assert!(!first.allowed);
        // The previous window weighs 99.83 at 60.1 s; one hit fits once it weighs 99.
        assert_eq!(first.retry_after, Some(500_000));
        assert_eq!(burst(&mut state, &limit, 60 * SECOND + 100_000, 99), 0);
        // At second 90 the previous window weighs one half: 50 more.
        assert_eq!(burst(&mut state, &limit, 90 * SECOND, 100), 50);
    }

    #[test]
    fn a_quarter_into_the_next_window_three_quarters_of_the_last_count() {
        let limit = limit(100);
        let mut state = None;
        assert_eq!(burst(&mut state, &limit, 30 * SECOND, 70), 70);
        // 100 - 0.75 * 70 = 47.5
        assert_eq!(burst(&mut state, &limit, 75 * SECOND, 100), 47);
    }

    #[test]
    fn retry_after_is_exact_in_the_next_window() {
        let limit = limit(10);
        let mut state = None;
        burst(&mut state, &limit, 0, 10);
        let rejected = hit(&mut state, &limit, SECOND, 1);
        // In the next window at t: 10 * (120 - t) / 60 + 1 <= 10  ⇔  t >= 66 s.
        assert_eq!(rejected.retry_after, Some(65 * SECOND));
        assert!(!hit(&mut state, &limit, 66 * SECOND - 1, 1).allowed);
        assert!(hit(&mut state, &limit, 66 * SECOND, 1).allowed);
    }

    #[test]
    fn a_clock_stepping_back_neither_adds_nor_removes_capacity() {
        let limit = limit(10);
        let mut state = None;
        // 10 at 0 s; at 90 s, half a window into the next one, they weigh 5: 4 more taken.
        assert_eq!(burst(&mut state, &limit, 0, 10), 10);
        assert_eq!(burst(&mut state, &limit, 90 * SECOND, 4), 4);
        // The clock steps back to 61 s: read as 90 s, one more fits (at 61 s the first
        // window would weigh 9.8 and none would).
        assert!(hit(&mut state, &limit, 61 * SECOND, 1).allowed);
        assert!(!hit(&mut state, &limit, 61 * SECOND, 1).allowed);
        // Stepping back into the first window hands out no fresh budget either.
        assert!(!hit(&mut state, &limit, 30 * SECOND, 1).allowed);
    }

    #[test]
    fn refunds_and_idle_windows() {
        let limit = limit(10);
        let mut state = None;
        burst(&mut state, &limit, 0, 10);
        assert_eq!(hit(&mut state, &limit, 1, -3).remaining, 3);
        // Two windows later nothing is left of it.
        assert_eq!(hit(&mut state, &limit, 2 * MINUTE, 0).remaining, 10);
    }
}
