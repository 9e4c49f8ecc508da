//! Log setup from `LOG_LEVEL` and `LOG_FORMAT`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use clap::ValueEnum;

/// Logging settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// `trace`, `debug`, `info`, `warn` or `error`.
    pub level: String,
    /// Output format.
    pub format: LogFormat,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber; later calls are ignored.
pub fn init(settings: &LogSettings) {
    let filter = EnvFilter::try_new(format!("warn,sluice={}", settings.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        // A closed stderr must not take the server down: tracing would report the failed
        // write with `eprintln!`, which panics when stderr itself is the problem.
        .log_internal_errors(false);
    let _ = match settings.format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// A rate limit for log lines about a condition that can repeat on every request (a failing
/// store, a refused connection): [`Every::ready`] is true at most once per interval, so a
/// fault costs a line every few seconds, not one per request.
pub struct Every {
    interval: u64,
    /// Microseconds since [`EPOCH`] of the last `true`, plus one (0: never).
    last: std::sync::atomic::AtomicU64,
}

static EPOCH: std::sync::LazyLock<std::time::Instant> =
    std::sync::LazyLock::new(std::time::Instant::now);

impl Every {
    /// True at most once per `interval`.
    pub const fn new(interval: std::time::Duration) -> Self {
        Self {
            interval: interval.as_micros() as u64,
            last: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Whether a line may be logged now (and, if so, the interval starts again).
    pub fn ready(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let now = EPOCH.elapsed().as_micros() as u64 + 1;
        let last = self.last.load(Relaxed);
        (last == 0 || now - last >= self.interval)
            && self
                .last
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::Every;
    use std::time::Duration;

    #[test]
    fn a_rate_limited_line_is_ready_once_per_interval() {
        let every = Every::new(Duration::from_secs(3600));
        assert!(every.ready());
        assert!(!every.ready());
        let always = Every::new(Duration::ZERO);
        assert!(always.ready() && always.ready());
    }
}
