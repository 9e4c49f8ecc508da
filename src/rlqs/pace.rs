//! The pace of RLQS work: what a report costs is its bucket usages, and a stream (and the
//! instance, over all streams) may spend only so many a second. Past it the stream is not
//! read until the debt is paid, so HTTP/2 flow control stops the client and a flood of
//! reports costs neither memory nor the decision path's CPU.

use std::time::Duration;

use tokio::time::Instant;

/// Bucket usages the instance works through per second over all streams: ten times what
/// Envoys holding the 100,000 buckets of `RLQS_MAX_BUCKETS` send at their fastest usual
/// report interval (every 5 s), about 70 ms of CPU at 0.35 µs a usage.
pub const USAGES_PER_SECOND: f64 = 200_000.0;

/// A budget of work refilled at a steady rate, spent on credit: spending past it says how
/// long to wait before the next piece of work.
#[derive(Debug)]
pub struct Pace {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Pace {
    /// `rate` units a second, at most `burst` saved up.
    pub fn new(rate: f64, burst: f64) -> Self {
        Self {
            rate,
            burst,
            tokens: burst,
            at: Instant::now(),
        }
    }

    /// Spends `units`: how long to wait before spending more (zero while in credit).
    pub fn spend(&mut self, units: f64) -> Duration {
        self.spend_at(units, Instant::now())
    }

    /// [`Pace::spend`] at `now`.
    fn spend_at(&mut self, units: f64, now: Instant) -> Duration {
        let earned = now.saturating_duration_since(self.at).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + earned).min(self.burst) - units;
        self.at = now;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_past_the_burst_waits_for_the_rate() {
        let mut pace = Pace::new(1_000.0, 1_000.0);
        let t = pace.at;
        let ms = |n| t + Duration::from_millis(n);
        assert_eq!(pace.spend_at(1_000.0, t), Duration::ZERO);
        assert_eq!(pace.spend_at(500.0, t), Duration::from_millis(500));
        assert_eq!(pace.spend_at(0.0, ms(500)), Duration::ZERO);
        // Never more than the burst saved up.
        assert_eq!(pace.spend_at(2_000.0, ms(10_500)), Duration::from_secs(1));
    }
}
