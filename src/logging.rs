//! Log setup from `LOG_LEVEL` and `LOG_FORMAT`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::settings::{LogFormat, LogSettings};

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
