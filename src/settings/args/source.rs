//! The config source: the directory (the reference's runtime layout), merging and reloads.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::super::parse::parse_duration;
use super::named;
use crate::settings::SettingsError;

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Config source")]
pub struct SourceArgs {
    /// Config directory [default: $RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/$RUNTIME_APPDIRECTORY when RUNTIME_ROOT is set, else ./config]
    #[arg(long, value_name = "DIR")]
    pub config: Option<PathBuf>,
    #[arg(long, env = "RUNTIME_ROOT", hide = true)]
    runtime_root: Option<PathBuf>,
    #[arg(long, env = "RUNTIME_SUBDIRECTORY", hide = true, default_value = "")]
    runtime_subdirectory: String,
    #[arg(
        long,
        env = "RUNTIME_APPDIRECTORY",
        hide = true,
        default_value = "config"
    )]
    runtime_appdirectory: String,

    /// Where the rules come from: FILE (the config directory) or GRPC_XDS_SOTW (an xDS control
    /// plane, state of the world over ADS)
    #[arg(long, env = "CONFIG_TYPE", default_value = "FILE")]
    config_type: String,

    /// Merge config files that declare the same domain instead of rejecting them
    #[arg(long, env = "MERGE_DOMAIN_CONFIG")]
    pub merge_domain_config: bool,

    /// How often the config directory is checked for changes; 0 reloads only on SIGHUP
    #[arg(long, env = "CONFIG_WATCH_INTERVAL", default_value = "500ms", value_parser = parse_duration)]
    pub config_watch_interval: Duration,

    /// Report unhealthy (/healthcheck, /ready, gRPC health) until a config with at least one
    /// domain is in force
    #[arg(long, env = "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED")]
    pub healthy_with_at_least_one_config_loaded: bool,
}

impl SourceArgs {
    /// Whether the rules come from xDS (`GRPC_XDS_SOTW`) rather than the directory (`FILE`).
    pub(super) fn is_xds(&self) -> Result<bool, SettingsError> {
        match self.config_type.to_ascii_uppercase().as_str() {
            "FILE" => Ok(false),
            "GRPC_XDS_SOTW" => Ok(true),
            _ => Err(named(
                &["config_type"],
                format!("'{}' is not one of FILE, GRPC_XDS_SOTW", self.config_type),
            )),
        }
    }

    /// `--config`, else the reference's `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`
    /// when `RUNTIME_ROOT` is set, else `./config`.
    pub(super) fn config_dir(&self) -> PathBuf {
        match (&self.config, &self.runtime_root) {
            (Some(dir), _) => dir.clone(),
            (None, Some(root)) => root
                .join(&self.runtime_subdirectory)
                .join(&self.runtime_appdirectory),
            (None, None) => PathBuf::from("config"),
        }
    }
}
