// Why one long file: a port of one reference file, case for case, so that a reader can compare
// them side by side.
//! Port of envoyproxy/ratelimit's `test/integration/integration_test.go`: a whole server
//! (here in process, on 127.0.0.1:0) over the reference's integration configs
//! (`test/integration/runtime/current/ratelimit/`), driven over gRPC, its statistics read
//! from `/metrics`. The reference's scenario runs on each of its Redis layouts; here on the
//! memory store and on each layout Sluice has: one Redis, with and without the over-limit
//! cache, with a key prefix, with a Redis of its own for per-second limits, with a password,
//! over TLS with a client certificate, through Sentinel, and on a Cluster.
//!
//! Not ported: memcache (Sluice has no memcache store), the xDS config provider (none), statsd
//! extra tags (no statsd), the freecache hit/miss gauges (no counterpart), and the
//! `RUNTIME_WATCH_ROOT` variants (one way of watching the directory).

use std::path::Path;
use std::time::Duration;

use crate::common::certs::{server_tls, tls_endpoint};
use crate::common::redis::{
    RedisCluster, RedisSentinel, RedisServer, TlsRedisServer, command_calls,
};
use crate::common::reference::{
    RuleStats, answer, counter, no_limit, req, rule_stats, status, wait_for_counter, write_config,
};
use crate::common::{TestServer, config_dir, descriptor, request, should_rate_limit};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::settings::{Backend, Settings};
use sluice::store::redis::{RedisKind, RedisOptions};

/// `basic.yaml`.
const BASIC: &str = "
domain: basic
descriptors:
  - key: key1
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: one_per_minute
    rate_limit: {unit: minute, requests_per_unit: 1}
";

/// `another.yaml` (without the reference's `_local` copies of each rule, which only keep
/// its runs apart in one shared statsd store), with `key2` per hour instead of per minute:
/// the scenario sends 40 requests on it, and an hour's window cannot end among them.
const ANOTHER: &str = "
domain: another
descriptors:
  - key: key2
    rate_limit: {unit: hour, requests_per_unit: 20}
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: key4
    rate_limit: {unit: day, requests_per_unit: 20}
";

/// `share_threshold.yaml`.
const SHARE_THRESHOLD: &str = "
domain: share-threshold-test
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: files_no_share
    value: files_no_share/*
    rate_limit: {unit: hour, requests_per_unit: 10}
";

/// `reload.yaml`, copied into the config directory by the reload test.
const RELOAD: &str = "
domain: reload
descriptors:
  - key: key1
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: block
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: one_per_minute
    rate_limit: {unit: minute, requests_per_unit: 1}
";

const RUNTIME: &[(&str, &str)] = &[
    ("basic.yaml", BASIC),
    ("another.yaml", ANOTHER),
    ("share_threshold.yaml", SHARE_THRESHOLD),
];

type Client = RateLimitServiceClient<tonic::transport::Channel>;

/// A CA, server and client certificates (`crate::common::certs`), made once for the tests of this
/// file that only read them (making them takes about a second).
fn shared_certs() -> &'static Path {
    static CERTS: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    CERTS.get_or_init(|| crate::common::certs::fresh("integration-certs"))
}

// === stores ===

/// Test settings over the runtime configs, counting in the memory store.
fn memory() -> Settings {
    Settings::for_tests(config_dir("integration", RUNTIME))
}

/// Test settings over the runtime configs, counting in the Redis `options` describe, with
/// the over-limit cache on or off, and a deadline no loaded CI machine misses.
fn on_redis(options: RedisOptions, local_cache: bool) -> Settings {
    let mut settings = memory();
    settings.backend = Backend::Redis;
    settings.redis = Some(RedisOptions {
        call_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        ..options
    });
    settings.resilience.deadline = Duration::from_secs(5);
    settings.local_cache_keys = if local_cache { 1000 } else { 0 };
    settings
}

fn single(redis: &RedisServer) -> RedisOptions {
    RedisOptions::new(redis.url(), RedisKind::Single)
}

// === TestBasicConfig ===

/// integration_test.go:549 testBasicBaseConfig, the reference's scenario:
/// - a domain without config answers OK without a limit;
/// - a 50-a-second limit answers 49 left, counted under `basic.key1`;
/// - 25 requests on a limit of 20: 20 pass (each one less left), 5 are refused, counted in
///   `over_limit` (and, with the over-limit cache, all refusals but the first in
///   `over_limit_with_local_cache`);
/// - 15 requests carrying a fresh `key2` and `key3` (10): from the 11th, `key3` refuses each
///   request. Difference: a refused request charges nothing, so `key2` stays at 10 left, as
///   the reference's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` variants expect (its default
///   goes on charging it: 20 - (i + 1));
/// - `duration_until_reset` counts down between two requests a second apart.
async fn basic_config(settings: Settings) -> TestServer {
    let local_cache = settings.local_cache_keys > 0;
    let (server, clock) = TestServer::start_with_clock(settings).await;
    let mut client = server.client().await;

    let r = should_rate_limit(&mut client, req("foo", &[&[("hello", "world")]])).await;
    assert_eq!(answer(&r), (Code::Ok, vec![no_limit()]));

    let r = should_rate_limit(&mut client, req("basic", &[&[("key1", "foo")]])).await;
    assert_eq!(
        answer(&r),
        (
            Code::Ok,
            vec![status(Code::Ok, Some((50, Unit::Second)), 49)]
        )
    );
    assert_eq!(rule_stats(&server, "basic.key1").await.total_hits, 1);

    let hour = |n: u32| Some((n, Unit::Hour));
    for i in 0..25u32 {
        let r = should_rate_limit(&mut client, req("another", &[&[("key2", "a")]])).await;
        let (code, remaining) = if i >= 20 {
            (Code::OverLimit, 0)
        } else {
            (Code::Ok, 20 - (i + 1))
        };
        assert_eq!(
            answer(&r),
            (code, vec![status(code, hour(20), remaining)]),
            "request {i}"
        );
        let key2 = rule_stats(&server, "another.key2").await;
        let over = u64::from(i.saturating_sub(19));
        let cached = if local_cache {
            u64::from(i.saturating_sub(20))
        } else {
            0
        };
        assert_eq!(
            (
                key2.total_hits,
                key2.over_limit,
                key2.over_limit_with_local_cache
            ),
            (u64::from(i) + 1, over, cached),
            "request {i}"
        );
    }

    for i in 0..15u32 {
        let r = should_rate_limit(
            &mut client,
            req("another", &[&[("key2", "b")], &[("key3", "b")]]),
        )
        .await;
        let (code, key2_left, key3_left) = if i >= 10 {
            (Code::OverLimit, 10, 0)
        } else {
            (Code::Ok, 20 - (i + 1), 10 - (i + 1))
        };
        assert_eq!(
            answer(&r),
            (
                code,
                vec![
                    status(Code::Ok, hour(20), key2_left),
                    status(code, hour(10), key3_left)
                ]
            ),
            "request {i}"
        );
        let key2 = rule_stats(&server, "another.key2").await;
        assert_eq!(
            (
                key2.total_hits,
                key2.over_limit,
                key2.over_limit_with_local_cache
            ),
            (u64::from(i) + 26, 5, if local_cache { 4 } else { 0 }),
            "request {i}"
        );
        let key3: RuleStats = rule_stats(&server, "another.key3").await;
        let over = u64::from(i.saturating_sub(9));
        let cached = if local_cache {
            u64::from(i.saturating_sub(10))
        } else {
            0
        };
        assert_eq!(
            (
                key3.total_hits,
                key3.over_limit,
                key3.over_limit_with_local_cache
            ),
            (u64::from(i) + 1, over, cached),
            "request {i}"
        );
    }

    let reset = |r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
        r.statuses[0].duration_until_reset.unwrap().seconds
    };
    let dur = || req("another", &[&[("key4", "durTest")]]);
    let first = should_rate_limit(&mut client, dur()).await;
    // What is tested is time passing: whole seconds, rounded up, drop after a second.
    clock.advance(1_100_000);
    let second = should_rate_limit(&mut client, dur()).await;
    assert!(
        reset(&second) < reset(&first),
        "{} then {}",
        reset(&first),
        reset(&second)
    );
    server
}

/// integration_test.go:92 TestBasicConfig, on the memory store (the reference runs the
/// scenario on memcache too, its other store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_config_on_memory() {
    basic_config(memory()).await;
}

/// integration_test.go:97 TestBasicConfig/WithoutPerSecondRedis (and :104, its
/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` variant, which is how Sluice always counts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_config_on_redis() {
    let redis = RedisServer::start();
    basic_config(on_redis(single(&redis), false)).await;
}

/// integration_test.go:99 TestBasicConfig/WithoutPerSecondRedisWithLocalCache (and :106).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_config_on_redis_with_local_cache() {
    let redis = RedisServer::start();
    basic_config(on_redis(single(&redis), true)).await;
}

/// integration_test.go:101 TestBasicConfig/WithoutPerSecondRedisWithCachePrefix: and every
/// key in Redis carries the prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_config_on_redis_with_cache_key_prefix() {
    let redis = RedisServer::start();
    let options = RedisOptions {
        key_prefix: "prefix:".into(),
        ..single(&redis)
    };
    basic_config(on_redis(options, false)).await;
    let keys = redis_keys(&redis);
    assert!(!keys.is_empty());
    assert!(keys.iter().all(|k| k.starts_with("prefix:")), "{keys:?}");
}

/// Every key in `redis`.
fn redis_keys(redis: &RedisServer) -> Vec<String> {
    redis
        .command(&["KEYS", "*"])
        .lines()
        .filter(|l| !l.starts_with('*') && !l.starts_with('$'))
        .map(str::to_owned)
        .collect()
}

/// integration_test.go:98 TestBasicConfig/WithPerSecondRedis and :100 (with the over-limit
/// cache): limits per second count in a Redis of their own (`REDIS_PERSECOND`), the others
/// in the main one.
async fn basic_config_with_a_per_second_redis(local_cache: bool) {
    let main = RedisServer::start();
    let fast = RedisServer::start();
    let mut settings = on_redis(single(&main), local_cache);
    settings.redis_per_second = Some(RedisOptions {
        call_timeout: Duration::from_secs(5),
        ..single(&fast)
    });
    let server = basic_config(settings).await;
    // Each request's counters go to the Redis of their unit.
    let mut client = server.client().await;
    for (descriptor, per_second) in [
        (req("basic", &[&[("key1", "foo")]]), true),
        (req("another", &[&[("key3", "c")]]), false),
    ] {
        let calls = (
            command_calls(&main, "evalsha"),
            command_calls(&fast, "evalsha"),
        );
        let r = should_rate_limit(&mut client, descriptor).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        let moved = (
            command_calls(&main, "evalsha") - calls.0,
            command_calls(&fast, "evalsha") - calls.1,
        );
        assert_eq!(moved, if per_second { (0, 1) } else { (1, 0) });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_config_on_redis_with_a_per_second_redis() {
    basic_config_with_a_per_second_redis(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_config_on_redis_with_a_per_second_redis_and_local_cache() {
    basic_config_with_a_per_second_redis(true).await;
}

/// integration_test.go:176 TestBasicAuthConfig: a Redis that requires a password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_config_on_redis_with_auth() {
    let redis = RedisServer::start_with(&["--requirepass", "password123"]);
    let options = RedisOptions {
        auth: Some("password123".into()),
        ..single(&redis)
    };
    basic_config(on_redis(options, false)).await;
}

/// integration_test.go:166 TestBasicTLSConfig/WithoutPerSecondRedisTLSWithClientCert: Redis
/// over TLS with a private CA, a client certificate and a password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_config_on_redis_over_tls_with_a_client_certificate() {
    let certs = shared_certs();
    let redis = TlsRedisServer::start_in(certs, Some("password123"));
    basic_config(on_redis(redis.options(), false)).await;
}

/// integration_test.go:195 TestBasicAuthConfigWithRedisSentinel: the master found through a
/// Sentinel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_config_on_redis_through_sentinel() {
    let master = RedisServer::start();
    let sentinel = RedisSentinel::start(&master, "mymaster");
    let options = RedisOptions::new(format!("mymaster,{}", sentinel.addr()), RedisKind::Sentinel);
    basic_config(on_redis(options, false)).await;
}

/// integration_test.go:188 TestBasicAuthConfigWithRedisCluster: a three-master Cluster
/// (without the password; the password is the previous case's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_config_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let options = RedisOptions::new(cluster.url(), RedisKind::Cluster);
    basic_config(on_redis(options, false)).await;
}

// === TestBasicReloadConfig ===

/// integration_test.go:806 testConfigReload (TestBasicReloadConfig/ReloadWithoutWatchRoot):
/// a file added to the config directory is loaded (`config_load_success` grows) and its
/// rules answer; its removal is a reload too.
async fn config_reload(mut settings: Settings) {
    settings.config_watch_interval = Duration::from_millis(100);
    let dir = settings.config_dir.clone();
    let server = TestServer::start_with(settings).await;
    let mut client = server.client().await;
    let block = || req("reload", &[&[("block", "foo")]]);
    let r = should_rate_limit(&mut client, block()).await;
    assert_eq!(answer(&r), (Code::Ok, vec![no_limit()]));

    let loads = counter(&server, "ratelimit_service_config_load_success").await;
    write_config(&dir, "reload.yaml", RELOAD);
    let after = wait_for_counter(&server, "ratelimit_service_config_load_success", loads + 1).await;
    let r = should_rate_limit(&mut client, req("reload", &[&[("key1", "foo")]])).await;
    assert_eq!(
        answer(&r),
        (
            Code::Ok,
            vec![status(Code::Ok, Some((50, Unit::Second)), 49)]
        )
    );

    std::fs::remove_file(dir.join("reload.yaml")).unwrap();
    wait_for_counter(&server, "ratelimit_service_config_load_success", after + 1).await;
    let r = should_rate_limit(&mut client, block()).await;
    assert_eq!(
        answer(&r),
        (Code::Ok, vec![no_limit()]),
        "the domain is gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_reload_on_memory() {
    config_reload(memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_reload_on_redis() {
    let redis = RedisServer::start();
    config_reload(on_redis(single(&redis), false)).await;
}

// === TestShareThreshold ===

/// integration_test.go:923 testShareThreshold: values matching a `share_threshold` pattern
/// share its 10 an hour (a different value is refused once ten went to one); a wildcard
/// without it gives each value its own.
async fn share_threshold(settings: Settings) {
    let server = TestServer::start_with(settings).await;
    let mut client = server.client().await;
    let domain = "share-threshold-test";
    for i in 0..10 {
        let r = should_rate_limit(&mut client, req(domain, &[&[("files", "files/a.pdf")]])).await;
        assert_eq!(r.overall_code, Code::Ok as i32, "request {i}");
    }
    let r = should_rate_limit(&mut client, req(domain, &[&[("files", "files/b.csv")]])).await;
    assert_eq!(
        answer(&r),
        (
            Code::OverLimit,
            vec![status(Code::OverLimit, Some((10, Unit::Hour)), 0)]
        )
    );
    for i in 0..10 {
        let value = format!("files_no_share/{i}");
        let r = should_rate_limit(&mut client, req(domain, &[&[("files_no_share", &value)]])).await;
        assert_eq!(
            answer(&r),
            (Code::Ok, vec![status(Code::Ok, Some((10, Unit::Hour)), 9)])
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_threshold_on_memory() {
    share_threshold(memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_threshold_on_redis() {
    let redis = RedisServer::start();
    share_threshold(on_redis(single(&redis), false)).await;
}

// === gRPC TLS ===

/// One request over TLS to `server`, trusting the CA in `ca` and presenting the client
/// certificate in `identity`, if given.
async fn ask_over_tls(
    server: &TestServer,
    ca: &Path,
    identity: Option<&Path>,
) -> Result<u32, String> {
    let channel = tls_endpoint(server.grpc_addr.port(), Some(ca), identity)?
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let mut client: Client = RateLimitServiceClient::new(channel);
    client
        .should_rate_limit(request("basic", vec![descriptor(&[("key1", "tls")])]))
        .await
        .map(|r| r.into_inner().statuses[0].limit_remaining)
        .map_err(|e| format!("rpc: {e:?}"))
}

fn tls_settings(certs: &Path, client_ca: bool) -> Settings {
    let mut settings = memory();
    settings.grpc_tls = Some(server_tls(certs, client_ca));
    settings
}

/// integration_test.go:271 Test_mTLS: with a client CA, a client presenting a certificate
/// it signed is served (one without is not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_serves_a_client_with_a_certificate() {
    let certs = shared_certs();
    let server = TestServer::start_with(tls_settings(certs, true)).await;
    assert_eq!(ask_over_tls(&server, certs, Some(certs)).await, Ok(49));
    assert!(ask_over_tls(&server, certs, None).await.is_err());
}

/// integration_test.go:298 TestReloadGRPCServerCerts: the server's certificate is trusted
/// through its CA and not through another; once new files are moved over the old ones, the
/// new CA is trusted (within ten seconds) and the old one no longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_server_certificates_are_reloaded() {
    let initial = crate::common::certs::fresh("integration-certs-initial");
    let new = shared_certs();
    let server = TestServer::start_with(tls_settings(&initial, false)).await;
    assert!(ask_over_tls(&server, &initial, None).await.is_ok());
    assert!(ask_over_tls(&server, new, None).await.is_err());
    // The new files are moved over the old ones (copied beside them first: the shared
    // directory keeps its own).
    for file in ["server.crt", "server.key"] {
        let beside = initial.join(format!(".{file}.new"));
        std::fs::copy(new.join(file), &beside).unwrap();
        std::fs::rename(beside, initial.join(file)).unwrap();
    }
    crate::common::eventually_within(
        Duration::from_secs(10),
        "the new certificate is served",
        || async { ask_over_tls(&server, new, None).await.is_ok() },
    )
    .await;
    assert!(ask_over_tls(&server, &initial, None).await.is_err());
}
