//! Every process setting of `sluice serve`, from flags and environment variables (the
//! reference service's names where it has one; a flag wins over its variable), with defaults
//! and validation. Tests build [`Settings`] values directly.
//!
//! Settings only translate: each option type belongs to the module that reads it
//! (`LogSettings` to `logging`, `TracingSettings` to `traces`, `StatsdSettings` to
//! `metrics::statsd`, `XdsSettings` to `source::xds`, `RedisOptions` to `store::redis`, ...),
//! and no module below this one imports it.
//!
//! - `args`: the flags and their environment variables, one group per concern (listeners,
//!   config source, store, failure policy, requests, responses, telemetry, shutdown);
//! - [`reference`](mod@reference): every envoyproxy/ratelimit variable and what Sluice does with it;
//! - `parse`: the value parsers: booleans, durations, ratios, header names, log levels and
//!   addresses as operators write them; an empty environment variable read as an unset one.

mod args;
mod parse;
pub mod reference;

pub use args::ServeArgs;
pub use parse::{empty_env_is_unset, parse_bool, parse_duration, parse_positive_duration, switch};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::ValueEnum;

use crate::limiter::LimiterOptions;
use crate::logging::{LogFormat, LogSettings};
use crate::metrics::statsd::StatsdSettings;
use crate::net::connection::ConnectionLimits;
use crate::net::tls::TlsFiles;
use crate::rls::ResponseOptions;
use crate::source::xds::XdsSettings;
use crate::store::memory::MemoryOptions;
use crate::store::redis::RedisOptions;
use crate::store::resilient::ResilienceOptions;
use crate::traces::TracingSettings;

/// Validated settings of a serving process.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Directory of YAML domain configs.
    pub config_dir: PathBuf,
    /// The xDS config source, instead of the directory (`CONFIG_TYPE=GRPC_XDS_SOTW`).
    pub xds: Option<XdsSettings>,
    /// gRPC listen address.
    pub grpc_addr: SocketAddr,
    /// A unix socket gRPC listens on instead (`GRPC_UDS`).
    pub grpc_uds: Option<PathBuf>,
    /// TLS (and, with a client CA, mutual TLS) on the gRPC listener.
    pub grpc_tls: Option<TlsFiles>,
    /// Admin HTTP listen address.
    pub http_addr: SocketAddr,
    /// The reference's debug listener (`DEBUG_HOST`, `DEBUG_PORT`): the admin endpoints
    /// again, when asked for.
    pub debug_addr: Option<SocketAddr>,
    /// Connection cap and header timeout of the admin HTTP and Prometheus listeners (the
    /// timeout is their [`ConnectionLimits::handshake_timeout`]).
    pub admin_connections: ConnectionLimits,
    /// Connection cap and handshake timeout of the gRPC listener.
    pub grpc_connections: ConnectionLimits,
    /// gRPC requests answered at once; more wait their turn.
    pub grpc_max_in_flight: usize,
    /// Age at which a gRPC connection is sent GOAWAY (before the ±10 % jitter), and the
    /// grace it then gets (`GRPC_MAX_CONNECTION_AGE`, `GRPC_MAX_CONNECTION_AGE_GRACE`).
    pub grpc_max_connection_age: (Duration, Duration),
    /// Where counters live.
    pub backend: Backend,
    /// Redis connection settings (with `Backend::Redis`).
    pub redis: Option<RedisOptions>,
    /// The Redis of the counters with one-second windows (`REDIS_PERSECOND`), when they have
    /// their own; TLS files and the key prefix are the main Redis's.
    pub redis_per_second: Option<RedisOptions>,
    /// The root Redis of global rules and this region's settings (ROOT_REDIS_URL, REGION).
    pub root: Option<(RedisOptions, crate::store::RegionOptions)>,
    /// Deadline, circuit breaker and `local` failure mode of a shared store.
    pub resilience: ResilienceOptions,
    /// Entries of the local over-limit cache (0: off).
    pub local_cache_keys: usize,
    /// Leased quota: the block lifetime and this instance's name.
    pub lease: crate::store::lease::LeaseOptions,
    /// Envoy's `rate_limit_quota` filter: TTLs, abandons, caps.
    pub rlqs: crate::quota::RlqsOptions,
    /// Response headers and body.
    pub response: ResponseOptions,
    /// Global shadow and quota mode.
    pub limiter: LimiterOptions,
    /// Merge files declaring the same domain.
    pub merge_domains: bool,
    /// Unhealthy until a config with at least one domain is in force
    /// (`HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`).
    pub require_config: bool,
    /// Unhealthy while the store does not answer (`REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`).
    pub require_store: bool,
    /// How long start-up waits for the store (`REDIS_STARTUP_*`).
    pub store_startup: StoreStartup,
    /// How often the config directory is checked for changes (0: only on SIGHUP).
    pub config_watch_interval: Duration,
    /// In-memory store limits.
    pub memory: MemoryOptions,
    /// Fraction of a limit from which a hit counts as near the limit (metrics).
    pub near_limit_ratio: f64,
    /// Cap on metric series of `detailed_metric`/`value_to_metric` rules.
    pub metrics_max_detailed_series: usize,
    /// The ladder of candidate limits rules are measured against (`LIMIT_LADDER*`); `None`:
    /// only rules with a ladder of their own.
    pub ladder: Option<crate::policy::Ladder>,
    /// The reference's response-time histogram in milliseconds
    /// (`PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`).
    pub response_time_in_milliseconds: bool,
    /// A separate Prometheus listener (`USE_PROMETHEUS`); `/metrics` on the HTTP port is
    /// always there.
    pub prometheus: Option<PrometheusListener>,
    /// OpenTelemetry traces (`TRACING_ENABLED`).
    pub tracing: Option<TracingSettings>,
    /// The reference's stats to statsd or DogStatsD (`USE_STATSD`, `USE_DOG_STATSD`).
    pub statsd: Option<StatsdSettings>,
    /// Log verbosity and format.
    pub log: LogSettings,
    /// Time allowed for in-flight requests to finish on SIGTERM.
    pub shutdown_grace: Duration,
    /// Time the process keeps serving after SIGTERM, with health checks failing, before it
    /// stops accepting (so that load balancers stop sending first).
    pub shutdown_delay: Duration,
    /// Running under Kubernetes (several replicas are likely).
    pub kubernetes: bool,
    /// Run under the reference's name (`/bin/ratelimit`): its defaults where Sluice's would
    /// change what Envoy does, and one start-up line saying which defaults differ.
    pub as_reference: bool,
    /// Who may reset counters through the admin API (nobody by default).
    pub admin_reset: crate::admin::ResetSettings,
}

/// How long start-up waits for the store before serving by the failure mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreStartup {
    /// Retry for at most this long (`REDIS_STARTUP_MAX_ELAPSED_TIME`); zero: one attempt.
    pub max_elapsed: Duration,
    /// First wait between attempts.
    pub initial: Duration,
    /// Longest wait between attempts.
    pub max_interval: Duration,
}

impl Default for StoreStartup {
    fn default() -> Self {
        Self {
            max_elapsed: Duration::ZERO,
            initial: Duration::from_secs(1),
            max_interval: Duration::from_secs(30),
        }
    }
}

/// Where the separate Prometheus listener serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrometheusListener {
    /// Listen address.
    pub addr: SocketAddr,
    /// Path of the exposition.
    pub path: String,
}

/// Counter store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// In-process memory; correct for a single instance.
    Memory,
    /// Redis, shared by every instance.
    Redis,
}

/// A setting that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("invalid setting {name}: {message}")]
pub struct SettingsError {
    /// The flag and variable, e.g. `--grpc-addr (GRPC_HOST/GRPC_PORT)`.
    pub name: String,
    /// What is wrong.
    pub message: String,
}

impl Settings {
    /// Settings for tests and embedding: memory store, `config_dir`, loopback port 0.
    pub fn for_tests(config_dir: impl Into<PathBuf>) -> Self {
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        Self {
            config_dir: config_dir.into(),
            xds: None,
            grpc_addr: loopback,
            grpc_uds: None,
            grpc_tls: None,
            http_addr: loopback,
            debug_addr: None,
            admin_connections: ConnectionLimits {
                max_connections: 256,
                handshake_timeout: Duration::from_secs(10),
            },
            grpc_connections: ConnectionLimits {
                max_connections: 10_000,
                handshake_timeout: Duration::from_secs(10),
            },
            grpc_max_in_flight: 1024,
            grpc_max_connection_age: (Duration::from_secs(24 * 3600), Duration::from_secs(3600)),
            backend: Backend::Memory,
            redis: None,
            redis_per_second: None,
            root: None,
            resilience: ResilienceOptions::default(),
            local_cache_keys: 0,
            lease: Default::default(),
            rlqs: Default::default(),
            response: ResponseOptions::default(),
            limiter: LimiterOptions::default(),
            merge_domains: false,
            require_config: false,
            require_store: false,
            store_startup: StoreStartup::default(),
            config_watch_interval: Duration::from_millis(200),
            memory: MemoryOptions::default(),
            near_limit_ratio: 0.8,
            metrics_max_detailed_series: 10_000,
            ladder: Some(crate::policy::Ladder::default()),
            response_time_in_milliseconds: false,
            prometheus: None,
            tracing: None,
            statsd: None,
            log: LogSettings {
                level: "info".into(),
                format: LogFormat::Text,
            },
            shutdown_grace: Duration::from_secs(5),
            shutdown_delay: Duration::ZERO,
            kubernetes: false,
            as_reference: false,
            admin_reset: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests;
