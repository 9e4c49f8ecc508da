//! Concurrency: requests in flight, not per time (DESIGN §4).
//!
//! Hits acquire (`c + h <= L` passes), refunds release (`is_negative_hits`, sent by Envoy's
//! `apply_on_stream_done`). Every acquisition is counted, admitted or not, because every one
//! is released: Envoy sends the stream-done release for refused requests too (see
//! [`super::applies_unconditionally`]). So `c` is "acquired and not yet released", and only
//! admitted acquisitions are ever more than `L`-bounded work in flight.
//!
//! There is no window: `limit.window` is a safety TTL. Every change pushes the counter's
//! expiry that far ahead, so releases that never come (a crashed proxy) cannot hold capacity
//! forever: once the key is idle for the TTL, it is gone.

use super::{Decision, Limit, Micros, SECOND, can_ever_pass};

/// The stored state: requests in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InFlight {
    /// Hits acquired and not yet released.
    pub count: u64,
}

/// Applies `hits` (negative: release) to `state`.
pub fn decide(
    state: Option<&InFlight>,
    limit: &Limit,
    _now: Micros,
    hits: i64,
) -> (Decision, InFlight) {
    let count = state.map_or(0, |s| s.count);
    let next = if hits < 0 {
        Some(count.saturating_sub(hits.unsigned_abs()))
    } else {
        let h = hits as u64;
        (limit.requests > 0 && count.saturating_add(h) <= limit.requests).then(|| count + h)
    };
    match next {
        Some(count) => (
            Decision {
                overdraft: 0,
                allowed: true,
                remaining: limit.requests.saturating_sub(count),
                reset_after: 0,
                retry_after: None,
            },
            InFlight { count },
        ),
        None => (
            Decision {
                overdraft: 0,
                allowed: false,
                remaining: limit.requests.saturating_sub(count),
                reset_after: 0,
                // Capacity comes back when a request in flight ends, which cannot be known;
                // a second is a polite first retry.
                retry_after: can_ever_pass(limit.requests, hits as u64)
                    .then_some(SECOND.min(limit.window)),
            },
            // Counted anyway: its release will come.
            InFlight {
                count: count.saturating_add(hits as u64),
            },
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;

    #[test]
    fn acquire_up_to_the_limit_and_release() {
        let limit = Limit::new(2, 60 * SECOND, Algorithm::Concurrency);
        let mut state = InFlight { count: 0 };
        for expected in [true, true, false] {
            let (d, next) = decide(Some(&state), &limit, 0, 1);
            assert_eq!(d.allowed, expected);
            if d.allowed {
                state = next;
            }
        }
        let (d, next) = decide(Some(&state), &limit, 0, -1);
        assert_eq!((d.allowed, d.remaining), (true, 1));
        let (d, _) = decide(Some(&next), &limit, 0, -5);
        assert_eq!(d.remaining, 2);
    }
}
