//! A counter's state as the memory store keeps it: 32 bytes, whatever the algorithm.

use super::table::Digest;
use crate::algorithm::{
    Algorithm, Micros, SECOND, State, concurrency, fixed_window, sliding_window, token_bucket,
};

/// A counter's state packed into 32 bytes, so that an entry (with its 16-byte digest) takes
/// 48 bytes, instead of the 56 of the `State` enum and an expiry with the key. The algorithm is
/// not stored: it is part of the key. Counts are kept in 64 bits (a usage budget's overdraft
/// can pass any 32-bit number), saturating; the expiry in whole seconds, rounded up (a state
/// read after its expiry equals no state anyway: every algorithm reads an old state as it
/// would read none, so a second's grace only delays the purge).
#[derive(Clone, Copy)]
pub(super) struct Slot {
    /// A fixed window's start; a sliding window's last charge; for a token bucket the bits of
    /// its theoretical arrival time.
    pub(super) word: u64,
    /// The count; for a sliding window the previous window's count; for a token bucket the
    /// time of its last charge.
    pub(super) first: u64,
    /// A sliding window's current count.
    pub(super) second: u64,
    /// Unix second (rounded up) from which the state equals no state.
    pub(super) expires: u32,
    /// Hits charged since the counter was created (saturating): what eviction spares.
    pub(super) charged: u32,
}

// An entry: the digest and the packed state (docs/performance.md counts on it).
const _: () = assert!(size_of::<(Digest, Slot)>() == 48);

// === impl Slot ===

impl Slot {
    pub(super) fn pack(state: State, expires_at: Micros) -> Self {
        let (word, first, second) = match state {
            State::FixedWindow(w) => (w.start, w.count, 0),
            State::SlidingWindow(w) => (w.last, w.previous, w.current),
            State::TokenBucket(b) => (b.tat.to_bits(), b.last, 0),
            State::Concurrency(c) => (0, c.count, 0),
        };
        let seconds = expires_at.div_ceil(SECOND);
        Self {
            word,
            first,
            second,
            expires: u32::try_from(seconds).unwrap_or(u32::MAX),
            charged: 0,
        }
    }

    /// Whether the state still differs from no state at `now`.
    pub(super) fn live(&self, now: Micros) -> bool {
        self.expires_at() > now
    }

    /// The instant from which the state equals no state (rounded up to a second).
    pub(super) fn expires_at(&self) -> Micros {
        u64::from(self.expires) * SECOND
    }

    /// The state, read as `algorithm`'s (the algorithm a counter's key names).
    pub(super) fn unpack(&self, algorithm: Algorithm) -> State {
        match algorithm {
            Algorithm::FixedWindow => State::FixedWindow(fixed_window::Window {
                start: self.word,
                count: self.first,
            }),
            Algorithm::SlidingWindow => State::SlidingWindow(sliding_window::Windows {
                last: self.word,
                previous: self.first,
                current: self.second,
            }),
            Algorithm::TokenBucket => State::TokenBucket(token_bucket::Bucket {
                tat: f64::from_bits(self.word),
                last: self.first,
            }),
            Algorithm::Concurrency => {
                State::Concurrency(concurrency::InFlight { count: self.first })
            }
        }
    }
}
