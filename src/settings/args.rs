//! The `sluice serve` flags, each with its environment variable (the reference service's name
//! where it has one), and their resolution into [`Settings`].

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::parse::{parse_bool, parse_duration, resolve_addr};
use super::*;

/// The smallest over-limit cache, in bytes, whatever `LOCAL_CACHE_SIZE_IN_BYTES` asks (0 is off).
const MIN_LOCAL_CACHE_BYTES: u64 = 512 * 1024;

/// `sluice serve` flags.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
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

    /// gRPC listen address [default: $GRPC_HOST:$GRPC_PORT, i.e. 0.0.0.0:8081]
    #[arg(long, value_name = "HOST:PORT")]
    pub grpc_addr: Option<String>,
    #[arg(long, env = "GRPC_HOST", hide = true, default_value = "0.0.0.0")]
    grpc_host: String,
    #[arg(long, env = "GRPC_PORT", hide = true, default_value = "8081")]
    grpc_port: u16,

    /// Serve gRPC over TLS
    #[arg(long, env = "GRPC_SERVER_USE_TLS", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub grpc_server_use_tls: bool,

    /// PEM certificate chain of the gRPC listener (re-read when it changes)
    #[arg(long, env = "GRPC_SERVER_TLS_CERT")]
    pub grpc_server_tls_cert: Option<PathBuf>,

    /// PEM private key of the gRPC listener (re-read when it changes)
    #[arg(long, env = "GRPC_SERVER_TLS_KEY")]
    pub grpc_server_tls_key: Option<PathBuf>,

    /// PEM CA bundle client certificates must chain to: turns on mutual TLS
    #[arg(long, env = "GRPC_CLIENT_TLS_CACERT")]
    pub grpc_client_tls_cacert: Option<PathBuf>,

    /// Admin HTTP listen address [default: $HOST:$PORT, i.e. 0.0.0.0:8080]
    #[arg(long, value_name = "HOST:PORT")]
    pub http_addr: Option<String>,
    #[arg(long = "host", env = "HOST", hide = true, default_value = "0.0.0.0")]
    http_host: String,
    #[arg(long = "port", env = "PORT", hide = true, default_value = "8080")]
    http_port: u16,

    /// Open admin HTTP connections at most (each of the admin and Prometheus listeners);
    /// more wait to be accepted
    #[arg(long, env = "ADMIN_MAX_CONNECTIONS", default_value = "256")]
    pub admin_max_connections: usize,

    /// Time an admin HTTP client has to send a request's headers; also how long an idle
    /// keep-alive connection is kept
    #[arg(long, env = "ADMIN_HEADER_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub admin_header_timeout: Duration,

    /// Open gRPC connections at most; more wait to be accepted
    #[arg(long, env = "GRPC_MAX_CONNECTIONS", default_value = "10000")]
    pub grpc_max_connections: usize,

    /// Time a gRPC client has from connecting to the end of its TLS handshake and HTTP/2
    /// preface
    #[arg(long, env = "GRPC_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub grpc_handshake_timeout: Duration,

    /// gRPC requests answered at once, over all connections; more wait their turn (this
    /// bounds the memory of requests being decoded: each holds at most its 4 MiB message)
    #[arg(long, env = "GRPC_MAX_IN_FLIGHT", default_value = "1024")]
    pub grpc_max_in_flight: usize,

    /// Counter store [default: redis when REDIS_URL is set, else memory]
    #[arg(long, env = "BACKEND_TYPE", value_enum, ignore_case = true)]
    pub backend: Option<Backend>,
    /// Redis address: redis://, rediss:// (TLS), unix:///path or /path, host:port; for Cluster a comma-separated seed list; for Sentinel 'master-name,host:port,...'
    #[arg(long, env = "REDIS_URL")]
    pub redis_url: Option<String>,

    /// Redis deployment
    #[arg(
        long,
        env = "REDIS_TYPE",
        value_enum,
        ignore_case = true,
        default_value = "single"
    )]
    pub redis_type: RedisKind,

    /// Redis password, or user:password for an ACL user
    #[arg(long, env = "REDIS_AUTH", hide_env_values = true)]
    pub redis_auth: Option<String>,

    /// Password of the Sentinels themselves
    #[arg(long, env = "REDIS_SENTINEL_AUTH", hide_env_values = true)]
    pub redis_sentinel_auth: Option<String>,

    /// Use TLS for Redis addresses given without a scheme
    #[arg(long, env = "REDIS_TLS", value_name = "BOOL", num_args = 0..=1,
          default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub redis_tls: bool,

    /// PEM CA bundle for Redis TLS (default: the system roots)
    #[arg(long, env = "REDIS_TLS_CACERT")]
    pub redis_tls_cacert: Option<PathBuf>,

    /// PEM client certificate for Redis mutual TLS
    #[arg(long, env = "REDIS_TLS_CLIENT_CERT")]
    pub redis_tls_client_cert: Option<PathBuf>,

    /// PEM client key for Redis mutual TLS
    #[arg(long, env = "REDIS_TLS_CLIENT_KEY")]
    pub redis_tls_client_key: Option<PathBuf>,

    /// Skip the TLS hostname check (only for test setups)
    #[arg(long, env = "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", value_name = "BOOL", num_args = 0..=1,
          default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub redis_tls_skip_hostname_verification: bool,

    /// Count the limits whose unit is `second` on a Redis of their own (REDIS_PERSECOND_*)
    #[arg(long, env = "REDIS_PERSECOND", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub redis_persecond: bool,

    /// Address of the per-second Redis, in REDIS_URL's forms
    #[arg(long, env = "REDIS_PERSECOND_URL")]
    pub redis_persecond_url: Option<String>,

    /// Deployment of the per-second Redis
    #[arg(
        long,
        env = "REDIS_PERSECOND_TYPE",
        value_enum,
        ignore_case = true,
        default_value = "single"
    )]
    pub redis_persecond_type: RedisKind,

    /// Password (or user:password) of the per-second Redis
    #[arg(long, env = "REDIS_PERSECOND_AUTH", hide_env_values = true)]
    pub redis_persecond_auth: Option<String>,

    /// Password of the per-second Redis's Sentinels
    #[arg(long, env = "REDIS_PERSECOND_SENTINEL_AUTH", hide_env_values = true)]
    pub redis_persecond_sentinel_auth: Option<String>,

    /// Use TLS for per-second Redis addresses given without a scheme (certificates: REDIS_TLS_*)
    #[arg(long, env = "REDIS_PERSECOND_TLS", value_name = "BOOL", num_args = 0..=1,
          default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub redis_persecond_tls: bool,

    /// Multiplexed connections per per-second Redis node
    #[arg(long, env = "REDIS_PERSECOND_POOL_SIZE", default_value = "2")]
    pub redis_persecond_pool_size: usize,

    /// Time allowed to connect to the per-second Redis
    #[arg(long, env = "REDIS_PERSECOND_TIMEOUT", default_value = "2s", value_parser = parse_duration)]
    pub redis_persecond_connect_timeout: Duration,

    /// Prefix of every Redis key
    #[arg(long, env = "CACHE_KEY_PREFIX", default_value = "")]
    pub cache_key_prefix: String,

    /// Multiplexed connections per Redis node
    #[arg(long, env = "REDIS_POOL_SIZE", default_value = "2")]
    pub redis_pool_size: usize,

    /// Time allowed to connect to Redis
    #[arg(long, env = "REDIS_TIMEOUT", default_value = "2s", value_parser = parse_duration)]
    pub redis_connect_timeout: Duration,

    /// Deadline of every store call; past it the failure mode answers
    #[arg(long, env = "REDIS_DEADLINE", default_value = "15ms", value_parser = parse_duration)]
    pub redis_deadline: Duration,

    /// Consecutive store failures that open the circuit breaker
    #[arg(long, env = "REDIS_BREAKER_FAILURES", default_value = "3")]
    pub redis_breaker_failures: u32,

    /// Time the open breaker waits before trying the store again
    #[arg(long, env = "REDIS_BREAKER_COOLDOWN", default_value = "250ms", value_parser = parse_duration)]
    pub redis_breaker_cooldown: Duration,

    /// Failure mode of rules and domains that declare none
    #[arg(
        long,
        env = "FAILURE_MODE",
        value_enum,
        ignore_case = true,
        default_value = "allow"
    )]
    pub failure_mode: FailureMode,

    /// Sluice instances sharing the limits; `failure_mode: local` divides each limit by it
    #[arg(long, env = "FAILURE_MODE_LOCAL_INSTANCES", default_value = "1")]
    pub failure_mode_local_instances: u64,

    /// Memory for the local over-limit cache, in bytes (0: off)
    #[arg(long, env = "LOCAL_CACHE_SIZE_IN_BYTES", default_value = "16777216")]
    pub local_cache_size_in_bytes: u64,

    /// Never answer OVER_LIMIT overall (per-descriptor statuses still tell the truth)
    #[arg(long, env = "SHADOW_MODE", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub shadow_mode: bool,

    /// Treat every descriptor as a quota descriptor
    #[arg(long, env = "QUOTA_MODE", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub quota_mode: bool,

    /// Most descriptors one request may carry; more is answered INVALID_ARGUMENT
    #[arg(long, env = "MAX_REQUEST_DESCRIPTORS", default_value = "64")]
    pub max_request_descriptors: usize,

    /// Most entries one descriptor may carry; more is answered INVALID_ARGUMENT
    #[arg(long, env = "MAX_DESCRIPTOR_ENTRIES", default_value = "16")]
    pub max_descriptor_entries: usize,

    /// Report unhealthy (/healthcheck, /ready, gRPC health) until a config with at least one
    /// domain is in force
    #[arg(long, env = "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub healthy_with_at_least_one_config_loaded: bool,

    /// Merge config files that declare the same domain instead of rejecting them
    #[arg(long, env = "MERGE_DOMAIN_CONFIG", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub merge_domain_config: bool,

    /// How often the config directory is checked for changes; 0 reloads only on SIGHUP
    #[arg(long, env = "CONFIG_WATCH_INTERVAL", default_value = "500ms", value_parser = parse_duration)]
    pub config_watch_interval: Duration,

    /// Ratio of a limit from which hits count as near the limit, in (0, 1]
    #[arg(long, env = "NEAR_LIMIT_RATIO", default_value = "0.8")]
    pub near_limit_ratio: f64,

    /// Also serve Prometheus metrics on a listener of their own (PROMETHEUS_ADDR, PROMETHEUS_PATH)
    #[arg(long, env = "USE_PROMETHEUS", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub use_prometheus: bool,

    /// Address of the separate Prometheus listener
    #[arg(long, env = "PROMETHEUS_ADDR", default_value = "0.0.0.0:9090")]
    pub prometheus_addr: String,

    /// Path of the separate Prometheus listener
    #[arg(long, env = "PROMETHEUS_PATH", default_value = "/metrics")]
    pub prometheus_path: String,

    /// Cap on metric series of detailed_metric/value_to_metric rules (the rest go to __overflow__)
    #[arg(long, env = "METRICS_MAX_DETAILED_SERIES", default_value = "10000")]
    pub metrics_max_detailed_series: usize,

    /// Cap on counters the memory store tracks
    #[arg(long, env = "MEMORY_MAX_KEYS", default_value = "1000000")]
    pub memory_max_keys: u64,

    /// Log level: trace, debug, info, warn, error
    #[arg(long, env = "LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// Log format
    #[arg(
        long,
        env = "LOG_FORMAT",
        value_enum,
        ignore_case = true,
        default_value = "text"
    )]
    pub log_format: LogFormat,

    /// Time in-flight requests get to finish after SIGTERM (e.g. 15s, 500ms)
    #[arg(long, env = "SHUTDOWN_GRACE_PERIOD", default_value = "15s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,

    /// Time Sluice keeps serving after SIGTERM with health checks failing, before it stops
    /// accepting (so load balancers notice first)
    #[arg(long, env = "SHUTDOWN_DELAY", default_value = "5s", value_parser = parse_duration)]
    pub shutdown_delay: Duration,

    /// Retry-After on every OVER_LIMIT answer
    #[arg(long, env = "RETRY_AFTER_HEADER", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "true", default_missing_value = "true", value_parser = parse_bool)]
    pub retry_after_header: bool,

    /// The IETF draft RateLimit-Policy and RateLimit headers on every answer
    #[arg(long, env = "RATELIMIT_HEADERS", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub ratelimit_headers: bool,

    /// The reference service's limit/remaining/reset headers on every answer
    #[arg(long, env = "LIMIT_RESPONSE_HEADERS_ENABLED", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub limit_response_headers_enabled: bool,

    /// Name of the reference's limit header
    #[arg(long, env = "LIMIT_LIMIT_HEADER", default_value = "RateLimit-Limit")]
    pub limit_limit_header: String,

    /// Name of the reference's remaining header
    #[arg(
        long,
        env = "LIMIT_REMAINING_HEADER",
        default_value = "RateLimit-Remaining"
    )]
    pub limit_remaining_header: String,

    /// Name of the reference's reset header
    #[arg(long, env = "LIMIT_RESET_HEADER", default_value = "RateLimit-Reset")]
    pub limit_reset_header: String,

    /// An application/problem+json body on OVER_LIMIT answers
    #[arg(long, env = "RESPONSE_PROBLEM_JSON", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub problem_json: bool,

    /// The reference's dynamic metadata (domain, descriptors, merged rule metadata) on every answer
    #[arg(long, env = "RESPONSE_DYNAMIC_METADATA", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub response_dynamic_metadata: bool,

    #[arg(long, env = "KUBERNETES_SERVICE_HOST", hide = true)]
    kubernetes_service_host: Option<String>,
}

impl ServeArgs {
    /// Resolves defaults and checks every value.
    pub fn into_settings(self) -> Result<Settings, SettingsError> {
        let config_dir = match (&self.config, &self.runtime_root) {
            (Some(dir), _) => dir.clone(),
            (None, Some(root)) => root
                .join(&self.runtime_subdirectory)
                .join(&self.runtime_appdirectory),
            (None, None) => PathBuf::from("config"),
        };
        let grpc_addr = resolve_addr(
            "--grpc-addr (GRPC_HOST/GRPC_PORT)",
            self.grpc_addr,
            &self.grpc_host,
            self.grpc_port,
        )?;
        let grpc_tls = if self.grpc_server_use_tls {
            let (Some(cert), Some(key)) = (
                self.grpc_server_tls_cert.clone(),
                self.grpc_server_tls_key.clone(),
            ) else {
                return Err(SettingsError {
                    name: "GRPC_SERVER_USE_TLS".into(),
                    message: "needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY".into(),
                });
            };
            let files = TlsFiles {
                cert,
                key,
                client_ca: self.grpc_client_tls_cacert.clone(),
            };
            // Load once now, so that a bad file stops startup with its name.
            ReloadingTls::new(files.clone()).map_err(|message| SettingsError {
                name: "--grpc-server-tls-* (GRPC_SERVER_TLS_CERT/KEY, GRPC_CLIENT_TLS_CACERT)"
                    .into(),
                message,
            })?;
            Some(files)
        } else {
            None
        };
        let http_addr = resolve_addr(
            "--http-addr (HOST/PORT)",
            self.http_addr,
            &self.http_host,
            self.http_port,
        )?;
        let backend = self.backend.unwrap_or(if self.redis_url.is_some() {
            Backend::Redis
        } else {
            Backend::Memory
        });
        let redis = match backend {
            Backend::Memory => None,
            Backend::Redis => {
                let Some(url) = self.redis_url.clone().filter(|u| !u.trim().is_empty()) else {
                    return Err(SettingsError {
                        name: "--redis-url (REDIS_URL)".into(),
                        message: "the redis backend needs a Redis address".into(),
                    });
                };
                if self.redis_pool_size == 0 {
                    return Err(SettingsError {
                        name: "--redis-pool-size (REDIS_POOL_SIZE)".into(),
                        message: "must be at least 1".into(),
                    });
                }
                let options = RedisOptions {
                    url,
                    kind: self.redis_type,
                    auth: self.redis_auth.clone().filter(|a| !a.is_empty()),
                    sentinel_auth: self.redis_sentinel_auth.clone().filter(|a| !a.is_empty()),
                    tls: self.redis_tls,
                    tls_ca: self.redis_tls_cacert.clone(),
                    tls_cert: self.redis_tls_client_cert.clone(),
                    tls_key: self.redis_tls_client_key.clone(),
                    tls_insecure: self.redis_tls_skip_hostname_verification,
                    key_prefix: self.cache_key_prefix.clone(),
                    connections: self.redis_pool_size,
                    connect_timeout: self.redis_connect_timeout,
                    call_timeout: self.redis_deadline,
                };
                // Parse the addresses now, so a typo stops startup instead of every request.
                crate::store::RedisStore::new(&options).map_err(|message| SettingsError {
                    name: "--redis-url (REDIS_URL) and the REDIS_* settings".into(),
                    message,
                })?;
                Some(options)
            }
        };
        let redis_per_second = match (&redis, self.redis_persecond) {
            (_, false) => None,
            (None, true) => {
                return Err(SettingsError {
                    name: "--redis-persecond (REDIS_PERSECOND)".into(),
                    message: "needs the redis backend (REDIS_URL) for the other counters".into(),
                });
            }
            (Some(main), true) => {
                let Some(url) = self
                    .redis_persecond_url
                    .clone()
                    .filter(|u| !u.trim().is_empty())
                else {
                    return Err(SettingsError {
                        name: "--redis-persecond-url (REDIS_PERSECOND_URL)".into(),
                        message: "REDIS_PERSECOND needs the per-second Redis's address".into(),
                    });
                };
                if self.redis_persecond_pool_size == 0 {
                    return Err(SettingsError {
                        name: "--redis-persecond-pool-size (REDIS_PERSECOND_POOL_SIZE)".into(),
                        message: "must be at least 1".into(),
                    });
                }
                let options = RedisOptions {
                    url,
                    kind: self.redis_persecond_type,
                    auth: self.redis_persecond_auth.clone().filter(|a| !a.is_empty()),
                    sentinel_auth: self
                        .redis_persecond_sentinel_auth
                        .clone()
                        .filter(|a| !a.is_empty()),
                    tls: self.redis_persecond_tls,
                    connections: self.redis_persecond_pool_size,
                    connect_timeout: self.redis_persecond_connect_timeout,
                    ..main.clone()
                };
                crate::store::RedisStore::new(&options).map_err(|message| SettingsError {
                    name: "--redis-persecond-url (REDIS_PERSECOND_URL) and the REDIS_PERSECOND_* settings".into(),
                    message,
                })?;
                Some(options)
            }
        };
        for (name, value) in [
            (
                "--limit-limit-header (LIMIT_LIMIT_HEADER)",
                &self.limit_limit_header,
            ),
            (
                "--limit-remaining-header (LIMIT_REMAINING_HEADER)",
                &self.limit_remaining_header,
            ),
            (
                "--limit-reset-header (LIMIT_RESET_HEADER)",
                &self.limit_reset_header,
            ),
        ] {
            let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
            if value.is_empty() || !value.chars().all(token) {
                return Err(SettingsError {
                    name: name.into(),
                    message: format!("'{value}' is not an HTTP header name"),
                });
            }
        }
        if self.redis_deadline.is_zero() {
            return Err(SettingsError {
                name: "--redis-deadline (REDIS_DEADLINE)".into(),
                message: "must be more than 0".into(),
            });
        }
        if self.redis_breaker_failures == 0 {
            return Err(SettingsError {
                name: "--redis-breaker-failures (REDIS_BREAKER_FAILURES)".into(),
                message: "must be at least 1".into(),
            });
        }
        if self.failure_mode_local_instances == 0 {
            return Err(SettingsError {
                name: "--failure-mode-local-instances (FAILURE_MODE_LOCAL_INSTANCES)".into(),
                message: "must be at least 1".into(),
            });
        }
        if !(self.near_limit_ratio > 0.0 && self.near_limit_ratio <= 1.0) {
            return Err(SettingsError {
                name: "--near-limit-ratio (NEAR_LIMIT_RATIO)".into(),
                message: format!("{} is not in (0, 1]", self.near_limit_ratio),
            });
        }
        for (value, name) in [
            (
                self.max_request_descriptors,
                "--max-request-descriptors (MAX_REQUEST_DESCRIPTORS)",
            ),
            (
                self.max_descriptor_entries,
                "--max-descriptor-entries (MAX_DESCRIPTOR_ENTRIES)",
            ),
            (
                self.grpc_max_in_flight,
                "--grpc-max-in-flight (GRPC_MAX_IN_FLIGHT)",
            ),
        ] {
            if value == 0 {
                return Err(SettingsError {
                    name: name.into(),
                    message: "must be at least 1".into(),
                });
            }
        }
        for (name, max, timeout) in [
            (
                "--admin-max-connections (ADMIN_MAX_CONNECTIONS) / --admin-header-timeout (ADMIN_HEADER_TIMEOUT)",
                self.admin_max_connections,
                self.admin_header_timeout,
            ),
            (
                "--grpc-max-connections (GRPC_MAX_CONNECTIONS) / --grpc-handshake-timeout (GRPC_HANDSHAKE_TIMEOUT)",
                self.grpc_max_connections,
                self.grpc_handshake_timeout,
            ),
        ] {
            if max == 0 || timeout.is_zero() {
                return Err(SettingsError {
                    name: name.into(),
                    message: "must be more than 0".into(),
                });
            }
        }
        if self.memory_max_keys == 0 {
            return Err(SettingsError {
                name: "--memory-max-keys (MEMORY_MAX_KEYS)".into(),
                message: "must be at least 1".into(),
            });
        }
        let level = self.log_level.to_ascii_lowercase();
        let level = match level.as_str() {
            "trace" | "debug" | "info" | "warn" | "error" => level,
            "warning" => "warn".to_owned(),
            // logrus levels the reference service accepts
            "fatal" | "panic" => "error".to_owned(),
            _ => {
                return Err(SettingsError {
                    name: "--log-level (LOG_LEVEL)".into(),
                    message: format!(
                        "'{}' is not one of trace, debug, info, warn, error",
                        self.log_level
                    ),
                });
            }
        };
        Ok(Settings {
            config_dir,
            grpc_addr,
            grpc_tls,
            http_addr,
            backend,
            redis,
            redis_per_second,
            resilience: ResilienceOptions {
                deadline: self.redis_deadline,
                breaker_failures: self.redis_breaker_failures,
                breaker_cooldown: self.redis_breaker_cooldown,
                local_instances: self.failure_mode_local_instances,
            },
            // About 128 bytes per entry: a digest, the refusal and the map's overhead. Like the
            // reference's cache library, never less than 512 KiB when on: a few hundred bytes
            // would hold one refusal per shard and drop the rest.
            local_cache_keys: match self.local_cache_size_in_bytes {
                0 => 0,
                bytes => (bytes.max(MIN_LOCAL_CACHE_BYTES) / 128) as usize,
            },
            response: ResponseOptions {
                retry_after: self.retry_after_header,
                draft_headers: self.ratelimit_headers,
                reference_headers: self
                    .limit_response_headers_enabled
                    .then(|| ReferenceHeaders {
                        limit: self.limit_limit_header.clone(),
                        remaining: self.limit_remaining_header.clone(),
                        reset: self.limit_reset_header.clone(),
                    }),
                problem_json: self.problem_json,
                dynamic_metadata: self.response_dynamic_metadata,
            },
            limiter: LimiterOptions {
                shadow_mode: self.shadow_mode,
                quota_mode: self.quota_mode,
                failure_mode: self.failure_mode,
                max_descriptors: self.max_request_descriptors,
                max_entries: self.max_descriptor_entries,
            },
            merge_domains: self.merge_domain_config,
            require_config: self.healthy_with_at_least_one_config_loaded,
            config_watch_interval: self.config_watch_interval,
            memory: MemoryOptions {
                max_keys: self.memory_max_keys,
            },
            near_limit_ratio: self.near_limit_ratio,
            metrics_max_detailed_series: self.metrics_max_detailed_series,
            prometheus: if self.use_prometheus {
                let addr = self.prometheus_addr.trim_start_matches(':');
                let addr = if self.prometheus_addr.starts_with(':') {
                    format!("0.0.0.0:{addr}") // the reference's ":9090"
                } else {
                    addr.to_owned()
                };
                if !self.prometheus_path.starts_with('/') {
                    return Err(SettingsError {
                        name: "--prometheus-path (PROMETHEUS_PATH)".into(),
                        message: format!("'{}' must start with /", self.prometheus_path),
                    });
                }
                Some(PrometheusListener {
                    addr: resolve_addr("--prometheus-addr (PROMETHEUS_ADDR)", Some(addr), "", 0)?,
                    path: self.prometheus_path.clone(),
                })
            } else {
                None
            },
            log: LogSettings {
                level,
                format: self.log_format,
            },
            admin_connections: ConnectionLimits {
                max_connections: self.admin_max_connections,
                handshake_timeout: self.admin_header_timeout,
            },
            grpc_connections: ConnectionLimits {
                max_connections: self.grpc_max_connections,
                handshake_timeout: self.grpc_handshake_timeout,
            },
            grpc_max_in_flight: self.grpc_max_in_flight,
            shutdown_grace: self.shutdown_grace,
            shutdown_delay: self.shutdown_delay,
            kubernetes: self.kubernetes_service_host.is_some(),
        })
    }
}
