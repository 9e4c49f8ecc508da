//! Telemetry: metrics (the separate Prometheus listener, near-limit ratio, series cap) and
//! logs.

use clap::Args;

use super::super::parse::{parse_log_level, parse_ratio, resolve_addr};
use super::named;
use crate::logging::{LogFormat, LogSettings};
use crate::settings::{PrometheusListener, SettingsError};

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Telemetry")]
pub struct TelemetryArgs {
    /// Ratio of a limit from which hits count as near the limit, in (0, 1]
    #[arg(long, env = "NEAR_LIMIT_RATIO", default_value = "0.8", value_parser = parse_ratio)]
    pub near_limit_ratio: f64,

    /// Also serve Prometheus metrics on a listener of their own (PROMETHEUS_ADDR, PROMETHEUS_PATH)
    #[arg(long, env = "USE_PROMETHEUS")]
    use_prometheus: bool,

    /// Address of the separate Prometheus listener
    #[arg(long, env = "PROMETHEUS_ADDR", default_value = "0.0.0.0:9090")]
    prometheus_addr: String,

    /// Path of the separate Prometheus listener
    #[arg(long, env = "PROMETHEUS_PATH", default_value = "/metrics")]
    prometheus_path: String,

    /// The reference's ratelimit_service_response_time_seconds histogram in milliseconds
    ///
    /// The buckets are statsd_exporter's defaults and the name stays, as the reference does.
    #[arg(long, env = "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS")]
    pub prometheus_response_time_as_milliseconds: bool,

    /// Cap on metric series of detailed_metric/value_to_metric rules (the rest go to __overflow__)
    #[arg(long, env = "METRICS_MAX_DETAILED_SERIES", default_value = "10000")]
    pub metrics_max_detailed_series: usize,

    /// Log level: trace, debug, info, warn, error
    #[arg(long, env = "LOG_LEVEL", default_value = "info", value_parser = parse_log_level)]
    log_level: String,

    /// Log format
    #[arg(
        long,
        env = "LOG_FORMAT",
        value_enum,
        ignore_case = true,
        default_value = "text"
    )]
    log_format: LogFormat,
}

impl TelemetryArgs {
    /// The separate Prometheus listener, when `USE_PROMETHEUS` asks for it.
    pub(super) fn prometheus(&self) -> Result<Option<PrometheusListener>, SettingsError> {
        if !self.use_prometheus {
            return Ok(None);
        }
        // The reference's ":9090" means every interface.
        let addr = match self.prometheus_addr.strip_prefix(':') {
            Some(port) => format!("0.0.0.0:{port}"),
            None => self.prometheus_addr.clone(),
        };
        if !self.prometheus_path.starts_with('/') {
            let message = format!("'{}' must start with /", self.prometheus_path);
            return Err(named(&["prometheus_path"], message));
        }
        Ok(Some(PrometheusListener {
            addr: resolve_addr(Some(addr), "", 0).map_err(|m| named(&["prometheus_addr"], m))?,
            path: self.prometheus_path.clone(),
        }))
    }

    pub(super) fn log(&self) -> LogSettings {
        LogSettings {
            level: self.log_level.clone(),
            format: self.log_format,
        }
    }
}
