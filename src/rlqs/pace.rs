//! The pace of RLQS work: what a report costs is its bucket usages, and a stream (and the
//! instance, over all streams) may spend only so many a second. Past it the stream is not
//! read until the debt is paid, so HTTP/2 flow control stops the client and a flood of
//! reports costs neither memory nor the decision path's CPU.

use std::time::Duration;

use tokio::time::Instant;

/// How many times what Envoys send the pace allows: Envoy 1.40 lists every bucket every 5 s,
/// so a stream at its bucket cap sends the cap every 5 s, and the instance's streams at most
/// the instance's cap every 5 s.
const HEADROOM: f64 = 2.0;

/// Envoy 1.40's report interval, in seconds.
const REPORT_INTERVAL: f64 = 5.0;

/// The pace of one stream whose bucket cap is `cap`: twice what an Envoy at the cap sends,
/// and a whole report at once.
pub fn of_stream(cap: usize) -> Pace {
    Pace::new(cap as f64 * HEADROOM / REPORT_INTERVAL, cap as f64)
}

/// The pace of the instance, whose bucket cap is `cap` and streams' `stream_cap`: what Envoys
/// holding every bucket send (20,000 usages a second with the default 100,000: a report
/// past it waits for the next turn, it is not lost), and a whole report at once. Ten streams
/// flooding at twice that took ShouldRateLimit's p99 to 3.5 times its quiet figure on two
/// cores, three streams (at about this pace) to 1.7 times (docs/performance.md).
pub fn of_instance(cap: usize, stream_cap: usize) -> Pace {
    let rate = (cap as f64 / REPORT_INTERVAL).max(stream_cap as f64);
    Pace::new(rate, rate.max(stream_cap as f64))
}

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
