//! The counter store: which one, the Redis connections (the main one and the per-second
//! one, turned into [`RedisOptions`] in one place), the memory store's cap and the
//! over-limit cache.

use std::num::{NonZeroU64, NonZeroUsize};
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::super::parse::{parse_count, parse_duration, parse_positive_duration, parse_ratio};
use super::named;
use crate::settings::{Backend, SettingsError};
use crate::store::RegionOptions;
use crate::store::memory::MemoryOptions;
use crate::store::redis::{RedisKind, RedisOptions};

/// The smallest over-limit cache, in bytes, whatever `LOCAL_CACHE_SIZE_IN_BYTES` asks (0 is off).
const MIN_LOCAL_CACHE_BYTES: u64 = 512 * 1024;

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Store")]
pub struct StoreArgs {
    /// Counter store [default: redis when REDIS_URL is set, else memory]
    #[arg(long, env = "BACKEND_TYPE", value_enum, ignore_case = true)]
    backend: Option<Backend>,

    #[command(flatten)]
    redis: RedisArgs,

    #[command(flatten)]
    per_second: PerSecondArgs,

    #[command(flatten)]
    root: RootArgs,

    /// Prefix of every Redis key
    #[arg(long, env = "CACHE_KEY_PREFIX", default_value = "")]
    cache_key_prefix: String,

    /// Memory for the local over-limit cache, in bytes (0: off)
    ///
    /// About 128 bytes per counter; at least 512 KiB when on, as in the reference (whose tests
    /// use 1000).
    #[arg(long, env = "LOCAL_CACHE_SIZE_IN_BYTES", default_value = "16777216")]
    local_cache_size_in_bytes: u64,

    /// Redis key layout of fixed-window counters: sluice (unambiguous), or reference (envoyproxy/ratelimit's keys and plain counts, shared with reference instances during a migration)
    #[arg(
        long,
        env = "REDIS_KEY_FORMAT",
        value_enum,
        ignore_case = true,
        default_value = "sluice"
    )]
    redis_key_format: KeyFormat,

    /// Most random seconds added to a reference-layout counter's expiry (REDIS_KEY_FORMAT=reference)
    ///
    /// Each write of such a key sets its expiry to the unit plus a random 0..N-1 seconds, as
    /// the reference does; Sluice's own keys expire exactly when their state ends.
    #[arg(long, env = "EXPIRATION_JITTER_MAX_SECONDS", default_value = "300")]
    expiration_jitter_max_seconds: u64,

    /// Replicas that must hold each count before it is answered (0: none)
    ///
    /// After each script call Sluice sends WAIT for this many replicas, for at most
    /// REDIS_DEADLINE; fewer acknowledgements answer by the failure mode. A failover then
    /// cannot lose a count Sluice admitted on, at the cost of a replication round trip per
    /// call (docs/operations/faults.md). Single Redis and Sentinel only.
    #[arg(long, env = "REDIS_WAIT_REPLICAS", default_value = "0")]
    redis_wait_replicas: u32,

    /// Cap on counters the memory store tracks
    #[arg(long, env = "MEMORY_MAX_KEYS", default_value = "1000000", value_parser = parse_count::<NonZeroU64>)]
    memory_max_keys: NonZeroU64,
}

/// The Redis key layout of fixed-window counters (`REDIS_KEY_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyFormat {
    /// Sluice's unambiguous keys (the default).
    Sluice,
    /// The reference's `prefix` + `domain_key_value_..._<window start>` with plain integers.
    Reference,
}

/// The main Redis.
#[derive(Debug, Clone, Args)]
struct RedisArgs {
    /// Redis address: redis://, rediss:// (TLS), unix:///path or /path, host:port; for Cluster a comma-separated seed list; for Sentinel 'master-name,host:port,...'
    #[arg(long, env = "REDIS_URL")]
    redis_url: Option<String>,

    /// Redis deployment
    #[arg(
        long,
        env = "REDIS_TYPE",
        value_enum,
        ignore_case = true,
        default_value = "single"
    )]
    redis_type: RedisKind,

    /// Redis password, or user:password for an ACL user
    ///
    /// Credentials Redis refuses count as an outage: the failure policy answers, and the error
    /// is logged and shown in /rlconfig.
    #[arg(long, env = "REDIS_AUTH", hide_env_values = true)]
    redis_auth: Option<String>,

    /// Password of the Sentinels themselves
    #[arg(long, env = "REDIS_SENTINEL_AUTH", hide_env_values = true)]
    redis_sentinel_auth: Option<String>,

    /// Use TLS for Redis addresses given without a scheme
    #[arg(long, env = "REDIS_TLS")]
    redis_tls: bool,

    /// PEM CA bundle for Redis TLS (default: the system roots)
    #[arg(long, env = "REDIS_TLS_CACERT")]
    redis_tls_cacert: Option<PathBuf>,

    /// PEM client certificate for Redis mutual TLS
    #[arg(long, env = "REDIS_TLS_CLIENT_CERT")]
    redis_tls_client_cert: Option<PathBuf>,

    /// PEM client key for Redis mutual TLS
    #[arg(long, env = "REDIS_TLS_CLIENT_KEY")]
    redis_tls_client_key: Option<PathBuf>,

    /// Skip the TLS hostname check (only for test setups)
    #[arg(long, env = "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")]
    redis_tls_skip_hostname_verification: bool,

    /// Multiplexed connections per Redis node
    ///
    /// Each connection carries one script call at a time, holding every request that arrived
    /// while the previous call was out, so a few connections serve many requests.
    #[arg(long, env = "REDIS_POOL_SIZE", default_value = "2", value_parser = parse_count::<NonZeroUsize>)]
    redis_pool_size: NonZeroUsize,

    /// Time allowed to connect to Redis
    ///
    /// Connections are made in the background: a request never waits longer than
    /// REDIS_DEADLINE.
    #[arg(long, env = "REDIS_TIMEOUT", default_value = "2s", value_parser = parse_duration)]
    redis_connect_timeout: Duration,
}

/// The per-second Redis (`REDIS_PERSECOND`); TLS files and the key prefix are the main one's.
#[derive(Debug, Clone, Args)]
struct PerSecondArgs {
    /// Count the limits whose unit is `second` on a Redis of their own (REDIS_PERSECOND_*)
    #[arg(long, env = "REDIS_PERSECOND")]
    redis_persecond: bool,

    /// Address of the per-second Redis, in REDIS_URL's forms
    ///
    /// The TLS files (REDIS_TLS_CACERT, _CLIENT_CERT, _CLIENT_KEY,
    /// _SKIP_HOSTNAME_VERIFICATION), CACHE_KEY_PREFIX, the deadline and the breaker settings
    /// are shared with the main Redis, as in the reference.
    #[arg(long, env = "REDIS_PERSECOND_URL")]
    redis_persecond_url: Option<String>,

    /// Deployment of the per-second Redis
    #[arg(
        long,
        env = "REDIS_PERSECOND_TYPE",
        value_enum,
        ignore_case = true,
        default_value = "single"
    )]
    redis_persecond_type: RedisKind,

    /// Password (or user:password) of the per-second Redis
    #[arg(long, env = "REDIS_PERSECOND_AUTH", hide_env_values = true)]
    redis_persecond_auth: Option<String>,

    /// Password of the per-second Redis's Sentinels
    #[arg(long, env = "REDIS_PERSECOND_SENTINEL_AUTH", hide_env_values = true)]
    redis_persecond_sentinel_auth: Option<String>,

    /// Use TLS for per-second Redis addresses given without a scheme (certificates: REDIS_TLS_*)
    #[arg(long, env = "REDIS_PERSECOND_TLS")]
    redis_persecond_tls: bool,

    /// Multiplexed connections per per-second Redis node
    #[arg(long, env = "REDIS_PERSECOND_POOL_SIZE", default_value = "2", value_parser = parse_count::<NonZeroUsize>)]
    redis_persecond_pool_size: NonZeroUsize,

    /// Time allowed to connect to the per-second Redis
    #[arg(long, env = "REDIS_PERSECOND_TIMEOUT", default_value = "2s", value_parser = parse_duration)]
    redis_persecond_connect_timeout: Duration,
}

/// The root of global counters (`scope: global`): a Redis in the home region that every
/// region's instances lease from through their region's pools.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Regions")]
struct RootArgs {
    /// This region's name, under which the root counts it among the regions sharing global
    /// rules (`scope: global`); needs ROOT_REDIS_URL
    #[arg(long, env = "REGION")]
    region: Option<String>,

    /// Address of the root Redis holding global rules' counters, in REDIS_URL's forms
    /// (rediss:// for TLS, with the REDIS_TLS_* files); unset: global rules count in this
    /// region's store alone
    #[arg(long, env = "ROOT_REDIS_URL")]
    root_redis_url: Option<String>,

    /// Deployment of the root Redis (single is best: grants are rare)
    #[arg(
        long,
        env = "ROOT_REDIS_TYPE",
        value_enum,
        ignore_case = true,
        default_value = "single"
    )]
    root_redis_type: RedisKind,

    /// Password (or user:password) of the root Redis
    #[arg(long, env = "ROOT_REDIS_AUTH", hide_env_values = true)]
    root_redis_auth: Option<String>,

    /// Use TLS for a root address given without a scheme (certificates: REDIS_TLS_*)
    #[arg(long, env = "ROOT_REDIS_TLS")]
    root_redis_tls: bool,

    /// Longest wait for a root call (asks and hand-backs, never a request's): past it the
    /// root counts as away
    #[arg(long, env = "ROOT_DEADLINE", default_value = "1s", value_parser = parse_positive_duration)]
    root_deadline: Duration,

    /// How long a region's pool lives after the root granted it units; asks want what the
    /// region uses in this time. At least ten root round trips
    #[arg(long, env = "REGION_LEASE_PERIOD", default_value = "2s", value_parser = parse_positive_duration)]
    region_lease_period: Duration,

    /// Replicas of the root that must hold each grant before a region uses it: after each
    /// root call Sluice sends WAIT for this many, for at most ROOT_DEADLINE; fewer is a
    /// failed call (its units are lost to the window, never admitted). A root failover then
    /// cannot lose a grant a region admits from. Single Redis and Sentinel only
    #[arg(long, env = "ROOT_WAIT_REPLICAS", default_value = "0")]
    root_wait_replicas: u32,

    /// What failure_mode local admits per window in a region cut off from the root, as a
    /// share of the limit [default: one over the number of regions]
    #[arg(long, env = "PARTITION_SHARE", value_parser = parse_ratio)]
    partition_share: Option<f64>,
}

/// The resolved store settings.
pub(super) struct Stores {
    pub backend: Backend,
    pub redis: Option<RedisOptions>,
    pub redis_per_second: Option<RedisOptions>,
    pub memory: MemoryOptions,
    pub local_cache_keys: usize,
    /// Whether fixed-window counters take the reference's Redis keys.
    pub reference_keys: bool,
    /// The root Redis and this region's settings, with ROOT_REDIS_URL (the lease period
    /// filled in later).
    pub root: Option<(RedisOptions, RegionOptions)>,
}

/// What distinguishes one Redis connection from the other, and the setting that names it.
struct Connection {
    /// Id of the address argument, named in errors.
    url_id: &'static str,
    /// What needs the address, for the error when it is missing.
    needed_by: String,
    url: Option<String>,
    kind: RedisKind,
    auth: Option<String>,
    sentinel_auth: Option<String>,
    tls: bool,
    connections: NonZeroUsize,
    connect_timeout: Duration,
}

impl StoreArgs {
    /// `deadline` is every script call's longest wait (the failure policy's).
    pub(super) fn resolve(self, deadline: Duration) -> Result<Stores, SettingsError> {
        let backend = self.backend.unwrap_or(if self.redis.redis_url.is_some() {
            Backend::Redis
        } else {
            Backend::Memory
        });
        let base = RedisOptions {
            url: String::new(),
            kind: RedisKind::Single,
            auth: None,
            sentinel_auth: None,
            tls: false,
            tls_ca: self.redis.redis_tls_cacert.clone(),
            tls_cert: self.redis.redis_tls_client_cert.clone(),
            tls_key: self.redis.redis_tls_client_key.clone(),
            tls_insecure: self.redis.redis_tls_skip_hostname_verification,
            key_prefix: self.cache_key_prefix.clone(),
            connections: 1,
            connect_timeout: Duration::ZERO,
            call_timeout: deadline,
            expiration_jitter: Duration::from_secs(self.expiration_jitter_max_seconds),
            wait_replicas: self.redis_wait_replicas,
        };
        let redis = match backend {
            Backend::Memory => None,
            Backend::Redis => Some(connect(self.redis.connection(), &base)?),
        };
        let redis_per_second = match (&redis, self.per_second.redis_persecond) {
            (_, false) => None,
            (None, true) => {
                let message = format!(
                    "needs the redis backend ({}) for the other counters",
                    super::env_name("redis_url")
                );
                return Err(named(&["redis_persecond"], message));
            }
            (Some(_), true) => Some(connect(self.per_second.connection(), &base)?),
        };
        let root = self.root.resolve(redis.is_some(), &base)?;
        Ok(Stores {
            root,
            reference_keys: backend == Backend::Redis
                && self.redis_key_format == KeyFormat::Reference,
            backend,
            redis,
            redis_per_second,
            memory: MemoryOptions {
                max_keys: self.memory_max_keys.get(),
            },
            // About 128 bytes per entry: a digest, the refusal and the map's overhead. Like the
            // reference's cache library, never less than 512 KiB when on: a few hundred bytes
            // would hold one refusal per shard and drop the rest.
            local_cache_keys: match self.local_cache_size_in_bytes {
                0 => 0,
                bytes => (bytes.max(MIN_LOCAL_CACHE_BYTES) / 128) as usize,
            },
        })
    }
}

impl RedisArgs {
    fn connection(self) -> Connection {
        Connection {
            url_id: "redis_url",
            needed_by: "the redis backend".into(),
            url: self.redis_url,
            kind: self.redis_type,
            auth: self.redis_auth,
            sentinel_auth: self.redis_sentinel_auth,
            tls: self.redis_tls,
            connections: self.redis_pool_size,
            connect_timeout: self.redis_connect_timeout,
        }
    }
}

impl RootArgs {
    /// The root's connection (its calls time out at ROOT_DEADLINE) and the region's
    /// settings; `regional`: whether this instance counts in a Redis of its own (the pools
    /// live there).
    fn resolve(
        self,
        regional: bool,
        base: &RedisOptions,
    ) -> Result<Option<(RedisOptions, RegionOptions)>, SettingsError> {
        let region = self.region.clone().filter(|r| !r.trim().is_empty());
        if self.root_redis_url.is_none() {
            if region.is_some() {
                let message = format!(
                    "names this region for a root, but {} is not set: global rules would count in this region alone",
                    super::env_name("root_redis_url")
                );
                return Err(named(&["region"], message));
            }
            return Ok(None);
        }
        let Some(region) = region else {
            let message = format!(
                "needs {}: the root counts regions by name",
                super::env_name("region")
            );
            return Err(named(&["root_redis_url"], message));
        };
        if !regional {
            let message = format!(
                "needs the redis backend ({}) for this region's pools",
                super::env_name("redis_url")
            );
            return Err(named(&["root_redis_url"], message));
        }
        let connection = Connection {
            url_id: "root_redis_url",
            needed_by: super::env_name("root_redis_url"),
            url: self.root_redis_url,
            kind: self.root_redis_type,
            auth: self.root_redis_auth,
            sentinel_auth: None,
            tls: self.root_redis_tls,
            connections: NonZeroUsize::MIN,
            connect_timeout: self.root_deadline,
        };
        let base = RedisOptions {
            call_timeout: self.root_deadline,
            wait_replicas: self.root_wait_replicas,
            ..base.clone()
        };
        let options = RegionOptions {
            region,
            period: self.region_lease_period,
            root_deadline: self.root_deadline,
            partition_share: self.partition_share.unwrap_or(0.0),
            ..RegionOptions::default()
        };
        Ok(Some((connect(connection, &base)?, options)))
    }
}

impl PerSecondArgs {
    fn connection(self) -> Connection {
        Connection {
            url_id: "redis_persecond_url",
            needed_by: super::env_name("redis_persecond"),
            url: self.redis_persecond_url,
            kind: self.redis_persecond_type,
            auth: self.redis_persecond_auth,
            sentinel_auth: self.redis_persecond_sentinel_auth,
            tls: self.redis_persecond_tls,
            connections: self.redis_persecond_pool_size,
            connect_timeout: self.redis_persecond_connect_timeout,
        }
    }
}

/// The one place a Redis connection's settings become [`RedisOptions`]: the address is
/// required and parsed now, so a typo stops startup instead of failing every request.
fn connect(connection: Connection, base: &RedisOptions) -> Result<RedisOptions, SettingsError> {
    let id = connection.url_id;
    let Some(url) = connection.url.filter(|u| !u.trim().is_empty()) else {
        let message = format!("{} needs a Redis address", connection.needed_by);
        return Err(named(&[id], message));
    };
    let options = RedisOptions {
        url,
        kind: connection.kind,
        auth: connection.auth.filter(|a| !a.is_empty()),
        sentinel_auth: connection.sentinel_auth.filter(|a| !a.is_empty()),
        tls: connection.tls,
        connections: connection.connections.get(),
        connect_timeout: connection.connect_timeout,
        ..base.clone()
    };
    crate::store::RedisStore::new(&options).map_err(|m| named(&[id], m))?;
    Ok(options)
}
