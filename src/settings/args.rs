//! The `sluice serve` flags, each with its environment variable (the reference service's name
//! where it has one), in one group per concern, and their resolution into [`Settings`].
//!
//! Adding a setting is one field in its group (a typed value parser, so clap names the flag
//! or variable in every error); docs/reference/settings.md is rendered from it (regenerate
//! with `UPDATE_DOCS=1 cargo test --test it docs_reference`), and the common ones have a row
//! with more words in docs/configuration/settings.md. Every `bool` is a switch
//! of one shape ([`switch`]).

mod admin;
mod failure;
mod lease;
mod listen;
mod requests;
mod response;
mod rlqs;
mod shutdown;
mod source;
mod stats;
mod store;
mod telemetry;
mod traces;
mod xds;

use clap::Args;

#[cfg(doc)]
use super::parse::switch;
use super::{Settings, SettingsError};
use crate::limiter::LimiterOptions;

/// `sluice serve` flags.
#[derive(Debug, Clone, Args)]
#[command(mut_args = super::parse::switch)]
pub struct ServeArgs {
    #[command(flatten)]
    listen: listen::ListenArgs,
    #[command(flatten)]
    source: source::SourceArgs,
    #[command(flatten)]
    xds: xds::XdsArgs,
    #[command(flatten)]
    store: store::StoreArgs,
    #[command(flatten)]
    failure: failure::FailureArgs,
    #[command(flatten)]
    lease: lease::LeaseArgs,
    #[command(flatten)]
    requests: requests::RequestArgs,
    #[command(flatten)]
    response: response::ResponseArgs,
    #[command(flatten)]
    rlqs: rlqs::RlqsArgs,
    #[command(flatten)]
    telemetry: telemetry::TelemetryArgs,
    #[command(flatten)]
    tracing: traces::TracingArgs,
    #[command(flatten)]
    stats: stats::StatsArgs,
    #[command(flatten)]
    shutdown: shutdown::ShutdownArgs,
    #[command(flatten)]
    admin: admin::AdminArgs,
}

impl ServeArgs {
    /// Resolves defaults and checks what no single value's parser can (settings that need
    /// each other, files and addresses).
    pub fn into_settings(self) -> Result<Settings, SettingsError> {
        let xds = if self.source.is_xds()? {
            Some(self.xds.resolve()?)
        } else {
            None
        };
        let listen = self.listen.resolve()?;
        let stores = self.store.resolve(self.failure.redis_deadline)?;
        let admin_reset = self.admin.resolve(listen.grpc_tls.as_ref())?;
        Ok(Settings {
            admin_reset,
            config_dir: self.source.config_dir(),
            xds,
            grpc_addr: listen.grpc_addr,
            grpc_tls: listen.grpc_tls,
            http_addr: listen.http_addr,
            admin_connections: listen.admin_connections,
            grpc_connections: listen.grpc_connections,
            grpc_max_in_flight: listen.grpc_max_in_flight,
            grpc_max_connection_age: listen.grpc_max_connection_age,
            debug_addr: listen.debug_addr,
            grpc_uds: listen.grpc_uds,
            backend: stores.backend,
            redis: stores.redis,
            redis_per_second: stores.redis_per_second,
            root: stores.root.map(|(redis, region)| {
                let region = crate::store::RegionOptions {
                    lease_period: self.lease.options().period,
                    ..region
                };
                (redis, region)
            }),
            resilience: self.failure.resilience(),
            local_cache_keys: stores.local_cache_keys,
            limiter: LimiterOptions {
                reference_keys: stores.reference_keys,
                ..self
                    .requests
                    .limiter(self.failure.default_failure_mode(), self.lease.consistency)
            },
            rlqs: self.rlqs.options(&self.lease.options().instance),
            lease: self.lease.options(),
            response: self.response.options(),
            merge_domains: self.source.merge_domain_config,
            require_config: self.source.healthy_with_at_least_one_config_loaded,
            require_store: self.failure.redis_health_check_active_connection,
            store_startup: crate::settings::StoreStartup {
                max_elapsed: self.failure.redis_startup_max_elapsed_time,
                initial: self.failure.redis_startup_initial_interval,
                max_interval: self.failure.redis_startup_max_interval,
            },
            config_watch_interval: self.source.config_watch_interval,
            memory: stores.memory,
            near_limit_ratio: self.telemetry.near_limit_ratio,
            metrics_max_detailed_series: self.telemetry.metrics_max_detailed_series,
            ladder: self.telemetry.ladder()?,
            response_time_in_milliseconds: self.telemetry.prometheus_response_time_as_milliseconds,
            prometheus: if self.stats.disable_stats {
                None
            } else {
                self.telemetry.prometheus()?
            },
            tracing: self.tracing.resolve()?,
            statsd: self.stats.resolve()?,
            log: self.telemetry.log(),
            shutdown_grace: self.shutdown.shutdown_grace,
            shutdown_delay: self.shutdown.shutdown_delay,
            kubernetes: self.shutdown.kubernetes_service_host.is_some(),
            as_reference: self.failure.as_reference,
        })
    }
}

/// The `serve` argument with this id (a field name). Only looked up for error messages.
fn serve_arg(id: &str) -> Option<clap::Arg> {
    let command = ServeArgs::augment_args(clap::Command::new("serve"));
    command.get_arguments().find(|a| a.get_id() == id).cloned()
}

/// An error about the arguments with these ids (field names), named as an operator sets
/// them: the first one's flag and every variable, e.g. `--grpc-addr (GRPC_HOST/GRPC_PORT)`.
fn named(ids: &[&str], message: impl Into<String>) -> SettingsError {
    let flag = ids
        .first()
        .and_then(|id| serve_arg(id))
        .and_then(|a| a.get_long().map(str::to_owned))
        .map_or_else(|| ids.join("/"), |long| format!("--{long}"));
    let vars: Vec<String> = ids
        .iter()
        .filter_map(|id| {
            serve_arg(id)?
                .get_env()
                .map(|v| v.to_string_lossy().into_owned())
        })
        .collect();
    SettingsError {
        name: if vars.is_empty() {
            flag
        } else {
            format!("{flag} ({})", vars.join("/"))
        },
        message: message.into(),
    }
}

/// The environment variable of the argument with this id.
fn env_name(id: &str) -> String {
    serve_arg(id)
        .and_then(|a| a.get_env().map(|v| v.to_string_lossy().into_owned()))
        .unwrap_or_else(|| id.to_owned())
}
