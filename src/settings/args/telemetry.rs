//! Telemetry: metrics (the separate Prometheus listener, near-limit ratio, series cap) and
//! logs.

use clap::Args;

use super::super::parse::{parse_log_level, parse_ratio, resolve_addr};
use super::named;
use crate::logging::{LogFormat, LogSettings};
use crate::policy::Ladder;
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

    /// Measure each rule's counts on a ladder of candidate limits (sluice_rule_*_past_total);
    /// false: only rules with a ladder of their own
    #[arg(long, env = "LIMIT_LADDER", default_value = "true")]
    limit_ladder: bool,

    /// The ladder's lowest candidate, as a ratio of the limit
    #[arg(long, env = "LIMIT_LADDER_FROM", default_value = "0.0625")]
    limit_ladder_from: f64,

    /// The ladder's highest candidate, as a ratio of the limit
    #[arg(long, env = "LIMIT_LADDER_TO", default_value = "16")]
    limit_ladder_to: f64,

    /// The ladder's rungs per doubling (4: each rung 19 % above the one below)
    #[arg(long, env = "LIMIT_LADDER_STEPS", default_value = "4")]
    limit_ladder_steps: u32,

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
    /// The process's ladder of candidate limits; `None` when `LIMIT_LADDER` is false.
    pub(super) fn ladder(&self) -> Result<Option<Ladder>, SettingsError> {
        if !self.limit_ladder {
            return Ok(None);
        }
        Ladder::new(
            self.limit_ladder_from,
            self.limit_ladder_to,
            self.limit_ladder_steps,
        )
        .map(Some)
        .map_err(|message| {
            named(
                &["limit_ladder_from", "limit_ladder_to", "limit_ladder_steps"],
                message,
            )
        })
    }

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
