//! Rate limit algorithms as pure functions of `(state, limit, now, hits)`.
//!
//! Nothing here reads a clock, takes a lock or does I/O: the stores call [`decide`] under
//! their own atomicity (a shard lock in memory, a Lua script in Redis) and persist the
//! returned state. Every algorithm lives in its own file; [`Algorithm`] selects one.

pub mod fixed_window;

/// Time in integer microseconds since the Unix epoch (or a duration in microseconds).
///
/// Integer microseconds are what Redis `TIME` gives, so every store computes with the same
/// resolution and no floating point drift.
pub type Micros = u64;

/// One second in [`Micros`].
pub const SECOND: Micros = 1_000_000;

/// Which algorithm a limit is enforced with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    /// Windows aligned to the Unix epoch; one count per window (the reference behaviour).
    FixedWindow,
}

impl Algorithm {
    /// The name used in config files and in `/rlconfig`.
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
        }
    }

    /// A short, stable tag used inside counter keys so that two algorithms never share state.
    pub fn key_tag(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fw",
        }
    }
}

/// The numbers an algorithm needs: how many hits per window, and how long the window is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Limit {
    /// Hits allowed per window; 0 means every request is over the limit.
    pub requests: u64,
    /// Window length in microseconds; never 0.
    pub window: Micros,
    /// The algorithm that enforces this limit.
    pub algorithm: Algorithm,
}

/// The answer for one counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Whether the hits fit within the limit.
    pub allowed: bool,
    /// Hits still available after this decision (after charging, when allowed).
    pub remaining: u64,
    /// Time until the counter is fully restored (for a fixed window: the window's end).
    pub reset_after: Micros,
    /// When rejected: the earliest time after which the same hits could pass. `None` when
    /// allowed, or when the hits can never pass (more hits than the limit).
    pub retry_after: Option<Micros>,
}

/// The stored state of one counter, whatever its algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// See [`fixed_window::Window`].
    FixedWindow(fixed_window::Window),
}

/// What [`decide`] returns: the decision, and the state to store if the hits are charged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    /// The answer for this counter.
    pub decision: Decision,
    /// The state after charging the hits (equal to the old state when nothing changes).
    pub next: State,
    /// Instant after which `next` is equivalent to no state at all (the key's TTL).
    pub expires_at: Micros,
}

/// Applies `hits` (negative: a refund) to a counter of `limit` at time `now`.
///
/// `state` is the stored state, `None` when the counter is new or expired. A state of a
/// different algorithm than `limit.algorithm` is treated as absent.
pub fn decide(state: Option<&State>, limit: &Limit, now: Micros, hits: i64) -> Transition {
    match limit.algorithm {
        Algorithm::FixedWindow => {
            let window = state.map(|State::FixedWindow(w)| w);
            let (decision, next) = fixed_window::decide(window, limit, now, hits);
            Transition {
                decision,
                next: State::FixedWindow(next),
                expires_at: next.end(limit),
            }
        }
    }
}
