//! Every environment variable of envoyproxy/ratelimit (`src/settings/settings.go`) and what
//! Sluice does with it, so that none is ignored without a word: at start-up, the ones that are
//! set and not supported are named in one warning line, the ones not needed in one info line.
//! The table of reference variables in docs/configuration/settings.md and a test against the reference's own list keep
//! this table whole.

/// What Sluice does with one reference variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// Read, as a `serve` setting (docs/configuration/settings.md says how).
    Read,
    /// Accepted and not needed; the reason.
    NotNeeded(&'static str),
    /// A feature Sluice does not have: named at start-up when set, unless its value is the
    /// feature's off switch (`false` for the booleans marked so).
    Unsupported {
        /// Whether a false boolean value means "off", and is then not worth a warning.
        off_when_false: bool,
    },
}

use Support::{NotNeeded, Read};

const NAMED: Support = Support::Unsupported {
    off_when_false: false,
};
const SWITCH: Support = Support::Unsupported {
    off_when_false: true,
};

const PIPELINING: &str =
    "concurrent requests already share script calls on multiplexed connections";
const SOCKET_TYPE: &str = "the address says it: a path is a unix socket, anything else TCP";
const NO_POOL_LIMIT: &str = "multiplexed connections are never exhausted";

/// The reference's variables, in its order.
pub const VARIABLES: &[(&str, Support)] = &[
    ("HOST", Read),
    ("PORT", Read),
    ("DEBUG_HOST", Read),
    ("DEBUG_PORT", Read),
    ("GRPC_UDS", Read),
    ("GRPC_HOST", Read),
    ("GRPC_PORT", Read),
    ("GRPC_MAX_CONNECTION_AGE", Read),
    ("GRPC_MAX_CONNECTION_AGE_GRACE", Read),
    ("GRPC_SERVER_USE_TLS", Read),
    ("GRPC_SERVER_TLS_CERT", Read),
    ("GRPC_SERVER_TLS_KEY", Read),
    ("GRPC_CLIENT_TLS_CACERT", Read),
    ("GRPC_CLIENT_TLS_SAN", Read),
    ("LOG_LEVEL", Read),
    ("LOG_FORMAT", Read),
    ("CONFIG_TYPE", Read),
    ("FORCE_START_WITHOUT_INITIAL_CONFIG", Read),
    ("CONFIG_GRPC_XDS_NODE_ID", Read),
    ("CONFIG_GRPC_XDS_NODE_METADATA", Read),
    ("CONFIG_GRPC_XDS_SERVER_URL", Read),
    ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", Read),
    ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", Read),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", Read),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", Read),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", Read),
    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", Read),
    ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", Read),
    ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", Read),
    ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", Read),
    ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", Read),
    ("XDS_CLIENT_BACKOFF_JITTER", Read),
    ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", Read),
    ("USE_DOG_STATSD", Read),
    ("USE_DOG_STATSD_MOGRIFIERS", Read),
    ("USE_STATSD", Read),
    ("STATSD_HOST", Read),
    ("STATSD_PORT", Read),
    ("EXTRA_TAGS", Read),
    ("STATS_FLUSH_INTERVAL", Read),
    ("DISABLE_STATS", Read),
    ("USE_PROMETHEUS", Read),
    ("PROMETHEUS_ADDR", Read),
    ("PROMETHEUS_PATH", Read),
    (
        "PROMETHEUS_MAPPER_YAML",
        NotNeeded("the metrics are native Prometheus, already with the reference's names"),
    ),
    ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", Read),
    ("RUNTIME_ROOT", Read),
    ("RUNTIME_SUBDIRECTORY", Read),
    ("RUNTIME_APPDIRECTORY", Read),
    (
        "RUNTIME_IGNOREDOTFILES",
        NotNeeded("dotfiles are never config files (the reference's true)"),
    ),
    (
        "RUNTIME_WATCH_ROOT",
        NotNeeded(
            "the config directory's files are fingerprinted through symlinks, which sees a swapped root and edited files alike",
        ),
    ),
    ("EXPIRATION_JITTER_MAX_SECONDS", Read),
    ("LOCAL_CACHE_SIZE_IN_BYTES", Read),
    ("NEAR_LIMIT_RATIO", Read),
    ("CACHE_KEY_PREFIX", Read),
    ("BACKEND_TYPE", Read),
    (
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        NotNeeded("a refused request never charges its counters (the reference's true)"),
    ),
    ("LIMIT_RESPONSE_HEADERS_ENABLED", Read),
    ("LIMIT_LIMIT_HEADER", Read),
    ("LIMIT_REMAINING_HEADER", Read),
    ("LIMIT_RESET_HEADER", Read),
    ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", Read),
    ("REDIS_SOCKET_TYPE", NotNeeded(SOCKET_TYPE)),
    ("REDIS_TYPE", Read),
    ("REDIS_URL", Read),
    ("REDIS_POOL_SIZE", Read),
    ("REDIS_AUTH", Read),
    ("REDIS_TLS", Read),
    ("REDIS_TLS_CLIENT_CERT", Read),
    ("REDIS_TLS_CLIENT_KEY", Read),
    ("REDIS_TLS_CACERT", Read),
    ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", Read),
    ("REDIS_PIPELINE_WINDOW", NotNeeded(PIPELINING)),
    ("REDIS_PIPELINE_LIMIT", NotNeeded(PIPELINING)),
    ("REDIS_CLUSTER_PIPELINE_PARALLELISM", NotNeeded(PIPELINING)),
    ("REDIS_PERSECOND", Read),
    ("REDIS_PERSECOND_SOCKET_TYPE", NotNeeded(SOCKET_TYPE)),
    ("REDIS_PERSECOND_TYPE", Read),
    ("REDIS_PERSECOND_URL", Read),
    ("REDIS_PERSECOND_POOL_SIZE", Read),
    ("REDIS_PERSECOND_AUTH", Read),
    ("REDIS_PERSECOND_TLS", Read),
    ("REDIS_SENTINEL_AUTH", Read),
    ("REDIS_PERSECOND_SENTINEL_AUTH", Read),
    ("REDIS_PERSECOND_PIPELINE_WINDOW", NotNeeded(PIPELINING)),
    ("REDIS_PERSECOND_PIPELINE_LIMIT", NotNeeded(PIPELINING)),
    (
        "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
        NotNeeded(PIPELINING),
    ),
    ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", Read),
    ("REDIS_TIMEOUT", Read),
    ("REDIS_PERSECOND_TIMEOUT", Read),
    ("REDIS_POOL_ON_EMPTY_BEHAVIOR", NotNeeded(NO_POOL_LIMIT)),
    (
        "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
        NotNeeded(NO_POOL_LIMIT),
    ),
    ("REDIS_STARTUP_INITIAL_INTERVAL", Read),
    ("REDIS_STARTUP_MAX_INTERVAL", Read),
    ("REDIS_STARTUP_MAX_ELAPSED_TIME", Read),
    ("MEMCACHE_HOST_PORT", NAMED),
    ("MEMCACHE_MAX_IDLE_CONNS", NAMED),
    ("MEMCACHE_SRV", NAMED),
    ("MEMCACHE_SRV_REFRESH", NAMED),
    ("MEMCACHE_TLS", SWITCH),
    ("MEMCACHE_TLS_CLIENT_CERT", NAMED),
    ("MEMCACHE_TLS_CLIENT_KEY", NAMED),
    ("MEMCACHE_TLS_CACERT", NAMED),
    ("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", SWITCH),
    ("SHADOW_MODE", Read),
    ("QUOTA_MODE", Read),
    ("RESPONSE_DYNAMIC_METADATA", Read),
    ("MERGE_DOMAIN_CONFIG", Read),
    ("TRACING_ENABLED", Read),
    ("TRACING_SERVICE_NAME", Read),
    ("TRACING_SERVICE_NAMESPACE", Read),
    ("TRACING_SERVICE_INSTANCE_ID", Read),
    ("TRACING_EXPORTER_PROTOCOL", Read),
    ("TRACING_SAMPLING_RATE", Read),
];

/// The reference variables set in an environment that Sluice does not act on.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Audit {
    /// Set, and not supported: one warning line names them.
    pub unsupported: Vec<&'static str>,
    /// Set, and not needed, with the reason: one info line names them.
    pub not_needed: Vec<(&'static str, &'static str)>,
}

/// Looks up every reference variable with `get` (the process environment in `main`).
pub fn audit(get: impl Fn(&str) -> Option<String>) -> Audit {
    let mut audit = Audit::default();
    for &(name, support) in VARIABLES {
        let Some(value) = get(name).filter(|v| !v.trim().is_empty()) else {
            continue;
        };
        match support {
            Read => {}
            NotNeeded(reason) => audit.not_needed.push((name, reason)),
            Support::Unsupported { off_when_false } => {
                if !(off_when_false && super::parse_bool(&value) == Ok(false)) {
                    audit.unsupported.push(name);
                }
            }
        }
    }
    audit
}

impl Audit {
    /// Logs what was set and is not acted on: one warning line, one info line.
    pub fn log(&self) {
        if !self.unsupported.is_empty() {
            tracing::warn!(
                "set but not supported: {} (see docs/configuration/settings.md, Every envoyproxy/ratelimit variable)",
                self.unsupported.join(", ")
            );
        }
        if !self.not_needed.is_empty() {
            let list: Vec<String> = self
                .not_needed
                .iter()
                .map(|(name, reason)| format!("{name} ({reason})"))
                .collect();
            tracing::info!("set and not needed: {}", list.join("; "));
        }
    }
}
