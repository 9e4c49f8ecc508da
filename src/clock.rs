//! Time, injected: the system clock in production, a manual clock in tests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::algorithm::Micros;

/// A source of wall-clock time in microseconds since the Unix epoch.
///
/// Wall-clock (not monotonic) time, because windows are aligned to the epoch and, with a
/// shared store, every instance must agree on which window it is.
pub trait Clock: Send + Sync + 'static {
    /// Microseconds since the Unix epoch.
    fn now(&self) -> Micros;
}

/// The operating system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Micros {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as Micros)
            .unwrap_or(0)
    }
}

/// Microseconds since the Unix epoch as the wall clock read at start-up, moved on by a
/// monotonic clock: for measuring durations (leased blocks' lifetimes), which a wall clock
/// stepped back or forward (NTP) must not stretch or cut.
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    start: std::time::Instant,
    start_micros: Micros,
}

impl MonotonicClock {
    /// A clock reading the wall clock's time now.
    pub fn new() -> Self {
        Self {
            start: std::time::Instant::now(),
            start_micros: SystemClock.now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Micros {
        self.start_micros
            .saturating_add(self.start.elapsed().as_micros() as Micros)
    }
}

/// A clock that only moves when told to; for tests.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock reading `now`.
    pub fn new(now: Micros) -> Self {
        Self(AtomicU64::new(now))
    }

    /// Moves the clock forward by `by` microseconds.
    pub fn advance(&self, by: Micros) {
        self.0.fetch_add(by, Ordering::SeqCst);
    }

    /// Sets the clock to `now` (which may step backwards).
    pub fn set(&self, now: Micros) {
        self.0.store(now, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Micros {
        self.0.load(Ordering::SeqCst)
    }
}

/// `duration` moved at random by up to `share` of itself either way (0: not at all), so that
/// waits and deadlines of many processes or attempts do not fall together.
pub fn jittered(duration: Duration, share: f64) -> Duration {
    if share <= 0.0 {
        return duration;
    }
    use std::hash::BuildHasher as _;
    // A random number without a dependency: the standard library seeds each RandomState.
    let draw = std::collections::hash_map::RandomState::new().hash_one(duration.as_nanos());
    let unit = (draw % 10_000) as f64 / 10_000.0; // [0, 1)
    duration.mul_f64((1.0 + share * (2.0 * unit - 1.0)).max(0.0))
}
