//! Shared by the ports of envoyproxy/ratelimit's own test suites (`tests/it/reference_*.rs`): the
//! stores a case runs on, the per-rule statistics as `/metrics` shows them, and statuses in a
//! form that compares whole (code, limit, remaining) as the reference's assertions do.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use sluice::settings::{Backend, Settings};
use sluice::store::redis::{RedisKind, RedisOptions};

use super::redis::RedisServer;
use super::{TestServer, config_dir, descriptor, http_get};

/// Where a case's counters live.
pub enum Store {
    /// The in-process memory store.
    Memory,
    /// A real redis-server; `local_cache` turns the over-limit cache on (the reference's
    /// `LOCAL_CACHE_SIZE_IN_BYTES`, which its tests set to 1000).
    Redis {
        redis: RedisServer,
        local_cache: bool,
    },
}

impl Store {
    pub fn memory() -> Self {
        Store::Memory
    }

    /// A fresh redis-server, the over-limit cache off (the reference's default).
    pub fn redis() -> Self {
        Store::Redis {
            redis: RedisServer::start(),
            local_cache: false,
        }
    }

    /// A fresh redis-server with the over-limit cache on.
    pub fn redis_with_local_cache() -> Self {
        Store::Redis {
            redis: RedisServer::start(),
            local_cache: true,
        }
    }

    pub fn local_cache(&self) -> bool {
        matches!(
            self,
            Store::Redis {
                local_cache: true,
                ..
            }
        )
    }

    pub fn redis_server(&self) -> Option<&RedisServer> {
        match self {
            Store::Redis { redis, .. } => Some(redis),
            Store::Memory => None,
        }
    }

    pub fn redis_server_mut(&mut self) -> Option<&mut RedisServer> {
        match self {
            Store::Redis { redis, .. } => Some(redis),
            Store::Memory => None,
        }
    }

    /// Test settings over a fresh directory holding `files`, counting in this store. Every
    /// call gets a key prefix of its own, so the servers of one test sharing a Redis never
    /// share a counter.
    pub fn settings(&self, files: &[(&str, &str)]) -> Settings {
        let mut settings = Settings::for_tests(config_dir("reference", files));
        self.apply(&mut settings);
        settings
    }

    /// Points `settings` at this store.
    pub fn apply(&self, settings: &mut Settings) {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        if let Store::Redis { redis, local_cache } = self {
            settings.backend = Backend::Redis;
            settings.redis = Some(RedisOptions {
                key_prefix: format!("case{}:", NEXT.fetch_add(1, Ordering::Relaxed)),
                // A loaded CI machine must not turn a slow answer into a failure-policy one.
                call_timeout: Duration::from_secs(2),
                ..RedisOptions::new(redis.url(), RedisKind::Single)
            });
            settings.resilience.deadline = Duration::from_secs(2);
            settings.local_cache_keys = if *local_cache { 1000 } else { 0 };
        }
    }

    /// A server over `files` on this store.
    pub async fn server(&self, files: &[(&str, &str)]) -> TestServer {
        TestServer::start_with(self.settings(files)).await
    }
}

// === statuses ===

/// A descriptor status as compared in these tests: everything but the exact reset time,
/// whose presence is kept (the reference sets it exactly when there is a limit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub code: Code,
    /// `(requests_per_unit, unit, name)`.
    pub limit: Option<(u32, Unit, String)>,
    pub remaining: u32,
    pub has_reset: bool,
}

/// The expected status: `limit` without a name.
pub fn status(code: Code, limit: Option<(u32, Unit)>, remaining: u32) -> Seen {
    Seen {
        code,
        limit: limit.map(|(n, u)| (n, u, String::new())),
        remaining,
        has_reset: limit.is_some(),
    }
}

/// The expected status of a descriptor with a named limit.
pub fn named(code: Code, limit: (u32, Unit, &str), remaining: u32) -> Seen {
    Seen {
        code,
        limit: Some((limit.0, limit.1, limit.2.to_owned())),
        remaining,
        has_reset: true,
    }
}

/// OK without a limit: no rule matched (or a whitelisted value).
pub fn no_limit() -> Seen {
    status(Code::Ok, None, 0)
}

/// What `unlimited: true` answers.
pub fn unlimited() -> Seen {
    status(Code::Ok, None, u32::MAX)
}

pub fn seen(status: &DescriptorStatus) -> Seen {
    Seen {
        code: Code::try_from(status.code).unwrap_or(Code::Unknown),
        limit: status.current_limit.as_ref().map(|l| {
            (
                l.requests_per_unit,
                Unit::try_from(l.unit).unwrap_or(Unit::Unknown),
                l.name.clone(),
            )
        }),
        remaining: status.limit_remaining,
        has_reset: status.duration_until_reset.is_some(),
    }
}

/// The overall code and every status of `response`.
pub fn answer(response: &RateLimitResponse) -> (Code, Vec<Seen>) {
    (
        Code::try_from(response.overall_code).unwrap_or(Code::Unknown),
        response.statuses.iter().map(seen).collect(),
    )
}

// === requests ===

/// A request for `domain` with one descriptor per entry list, one hit.
pub fn req(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    super::request(domain, descriptors.iter().map(|d| descriptor(d)).collect())
}

/// A request whose `hits_addend` is `hits`.
pub fn req_hits(domain: &str, descriptors: &[&[(&str, &str)]], hits: u32) -> RateLimitRequest {
    let mut request = req(domain, descriptors);
    request.hits_addend = hits;
    request
}

/// A descriptor with its own `hits_addend`.
pub fn desc_hits(entries: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    let mut d = descriptor(entries);
    d.hits_addend = Some(UInt64Value { value: hits });
    d
}

// === per-rule statistics ===

/// The reference's six per-rule counters, read from `/metrics` by the `rule` label (the
/// reference's stats key). Missing series read 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuleStats {
    pub total_hits: u64,
    pub within_limit: u64,
    pub over_limit: u64,
    pub near_limit: u64,
    pub over_limit_with_local_cache: u64,
    pub shadow_mode: u64,
}

impl std::ops::Sub for RuleStats {
    type Output = RuleStats;
    fn sub(self, before: RuleStats) -> RuleStats {
        RuleStats {
            total_hits: self.total_hits - before.total_hits,
            within_limit: self.within_limit - before.within_limit,
            over_limit: self.over_limit - before.over_limit,
            near_limit: self.near_limit - before.near_limit,
            over_limit_with_local_cache: self.over_limit_with_local_cache
                - before.over_limit_with_local_cache,
            shadow_mode: self.shadow_mode - before.shadow_mode,
        }
    }
}

/// `RuleStats` from the fields the reference's assertions name.
pub fn stats(total: u64, within: u64, over: u64, near: u64) -> RuleStats {
    RuleStats {
        total_hits: total,
        within_limit: within,
        over_limit: over,
        near_limit: near,
        ..RuleStats::default()
    }
}

/// The value of `ratelimit_service_rate_limit_<name>` for the series whose `rule` label is
/// `rule`, if there is one.
pub fn rule_metric(page: &str, name: &str, rule: &str) -> Option<u64> {
    let prefix = format!("ratelimit_service_rate_limit_{name}{{");
    let label = format!("rule=\"{rule}\"");
    page.lines().find_map(|line| {
        let rest = line.strip_prefix(&prefix)?;
        let (labels, value) = rest.rsplit_once("} ")?;
        labels
            .split(',')
            .any(|l| l == label)
            .then(|| value.trim().parse().ok())
            .flatten()
    })
}

pub fn rule_stats_in(page: &str, rule: &str) -> RuleStats {
    let get = |name| rule_metric(page, name, rule).unwrap_or(0);
    RuleStats {
        total_hits: get("total_hits"),
        within_limit: get("within_limit"),
        over_limit: get("over_limit"),
        near_limit: get("near_limit"),
        over_limit_with_local_cache: get("over_limit_with_local_cache"),
        shadow_mode: get("shadow_mode"),
    }
}

/// The `/metrics` page.
pub async fn metrics(server: &TestServer) -> String {
    let (status, page) = http_get(server.http_addr, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    page
}

pub async fn rule_stats(server: &TestServer, rule: &str) -> RuleStats {
    rule_stats_in(&metrics(server).await, rule)
}

/// One metric without rule labels (`ratelimit_service_config_load_success`, or a series
/// with its labels as printed); 0 when absent.
pub async fn counter(server: &TestServer, series: &str) -> u64 {
    super::metric(&metrics(server).await, series).unwrap_or(0)
}

/// Waits until `series` on `/metrics` is at least `at_least` (a reload's readiness signal).
pub async fn wait_for_counter(server: &TestServer, series: &str, at_least: u64) -> u64 {
    let what = format!("{series} reaches {at_least}");
    eventually(&what, || async {
        counter(server, series).await >= at_least
    })
    .await;
    counter(server, series).await
}

/// Writes `text` to `dir/name` atomically (beside, then renamed), as config tools do.
pub fn write_config(dir: &std::path::Path, name: &str, text: &str) {
    let temp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&temp, text).unwrap();
    std::fs::rename(temp, dir.join(name)).unwrap();
}

/// The gRPC health status the server reports for `service`.
pub async fn grpc_health(
    server: &TestServer,
    service: &str,
) -> tonic_health::pb::health_check_response::ServingStatus {
    super::health::Health::connect(server.grpc_addr)
        .await
        .status(service)
        .await
}

/// Over gRPC, `ratelimit` of `server` (whose config directory is `dir`, holding no domain)
/// is not serving; serving once `file` holding `text` is written there; not serving again
/// once it is removed.
pub async fn grpc_health_follows_the_file(
    server: &TestServer,
    dir: &std::path::Path,
    file: &str,
    text: &str,
) {
    use tonic_health::pb::health_check_response::ServingStatus;
    assert_eq!(
        grpc_health(server, "ratelimit").await,
        ServingStatus::NotServing
    );
    write_config(dir, file, text);
    eventually(&format!("serving once {file} is loaded"), || async {
        grpc_health(server, "ratelimit").await == ServingStatus::Serving
    })
    .await;
    std::fs::remove_file(dir.join(file)).unwrap();
    eventually(&format!("not serving once {file} is gone"), || async {
        grpc_health(server, "ratelimit").await == ServingStatus::NotServing
    })
    .await;
}

pub use super::eventually;

/// One test per case and store: `on_each_store!([memory, redis] [case_a, case_b]);` makes
/// `memory::case_a`, `redis::case_a`, ..., each calling `case(&Store::<store>())`. The stores are
/// the constructors of [`Store`].
macro_rules! on_each_store {
    ([$($store:ident),* $(,)?] $cases:tt) => {
        $( crate::common::reference::on_store!($store $cases); )*
    };
}

/// The tests of [`on_each_store!`] on one store.
macro_rules! on_store {
    ($store:ident [$($case:ident),* $(,)?]) => {
        mod $store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(&super::Store::$store()).await;
                }
            )*
        }
    };
}

pub(crate) use {on_each_store, on_store};
