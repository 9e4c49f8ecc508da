//! Port of envoyproxy/ratelimit's `test/server/health_test.go`, black-box: `/healthcheck`
//! over HTTP and `grpc.health.v1.Health/Check` for `ratelimit`, on a real server. The
//! reference flips its health components by hand; here the config directory and a real
//! redis-server (started, killed, restarted on its port) change for real.
//!
//! The reference's health has two components besides SIGTERM: Redis (unhealthy until the
//! first connection is confirmed, and whenever Redis fails) and, with
//! `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, the config. Sluice follows the config (and
//! shutdown) only: while Redis is down it stays healthy and answers by each rule's
//! `failure_mode` (docs/reference/differences.md: "health while Redis is down"); those cases assert
//! Sluice's behaviour.

use crate::common::redis::RedisServer;
use crate::common::reference::{
    Store, eventually, grpc_health, grpc_health_follows_the_file, on_each_store, write_config,
};
use crate::common::{TestServer, http_get};
use tonic_health::pb::health_check_response::ServingStatus;

const CONFIG: &str = "domain: health\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";

async fn healthcheck(server: &TestServer) -> (u16, String) {
    http_get(server.http_addr, "/healthcheck").await.unwrap()
}

/// A server on `store` whose config directory starts empty, with
/// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`; and that directory.
async fn needing_config(store: &Store) -> (TestServer, std::path::PathBuf) {
    let mut settings = store.settings(&[]);
    settings.require_config = true;
    let dir = settings.config_dir.clone();
    (TestServer::start_unready(settings).await, dir)
}

/// A server counting in a Redis that does not run yet (its port is free); and that Redis,
/// killed, to be restarted on the same port.
async fn before_redis(require_config: bool) -> (TestServer, RedisServer, std::path::PathBuf) {
    let mut store = Store::redis();
    let mut settings = store.settings(&[("health.yaml", CONFIG)]);
    settings.require_config = require_config;
    let dir = settings.config_dir.clone();
    store.redis_server_mut().unwrap().kill();
    let Store::Redis { redis, .. } = store else {
        unreachable!()
    };
    (TestServer::start_unready(settings).await, redis, dir)
}

// === TestHealthCheck ===

/// health_test.go:18 TestHealthCheck: once Redis answers, `/healthcheck` is 200 `OK`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_is_ok_while_redis_answers() {
    let store = Store::redis();
    let server = store.server(&[("health.yaml", CONFIG)]).await;
    assert_eq!(healthcheck(&server).await, (200, "OK".to_owned()));
}

/// health_test.go:33 TestHealthCheck: the reference's `/healthcheck` is 500 until the Redis
/// connection is confirmed and while Redis fails. Difference (docs/reference/differences.md, "health while Redis is
/// down"): Sluice's stays 200 throughout, and gRPC health SERVING, while the failure policy
/// answers: restarting or unlisting every pod for Redis's outage would turn it into the
/// rate limit service's outage. (Also health_test.go:75 and :109, the same with a config
/// required and over gRPC.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_stays_up_while_redis_is_down() {
    let (server, mut redis, _dir) = before_redis(true).await;
    let up = |server: &TestServer| {
        let addr = server.http_addr;
        async move { http_get(addr, "/healthcheck").await.unwrap() == (200, "OK".to_owned()) }
    };
    eventually("healthy with the config loaded, Redis not running", || {
        up(&server)
    })
    .await;
    assert_eq!(
        grpc_health(&server, "ratelimit").await,
        ServingStatus::Serving
    );
    let mut client = server.client().await;
    let ask = || crate::common::request("health", vec![crate::common::descriptor(&[("k", "v")])]);
    // Fail open (the default failure_mode) while Redis is away.
    let answer = crate::common::should_rate_limit(&mut client, ask()).await;
    assert_eq!(answer.overall_code, 1, "OK by the failure policy");
    redis.restart();
    redis.kill();
    assert!(up(&server).await, "still healthy after Redis went away");
    assert_eq!(
        grpc_health(&server, "ratelimit").await,
        ServingStatus::Serving
    );
}

// === TestHealthyWithAtLeastOneConfigLoaded ===

/// health_test.go:54 TestHealthyWithAtLeastOneConfigLoaded: with
/// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, `/healthcheck` fails until a config is loaded
/// (Redis answering), then is 200 `OK`.
async fn healthcheck_waits_for_a_config(store: &Store) {
    let (server, dir) = needing_config(store).await;
    assert_ne!(healthcheck(&server).await.0, 200, "no config yet");
    write_config(&dir, "health.yaml", CONFIG);
    eventually("healthy once a config is loaded", || async {
        healthcheck(&server).await == (200, "OK".to_owned())
    })
    .await;
}

/// health_test.go:69 TestHealthyWithAtLeastOneConfigLoaded: with no domain loaded the
/// reference's `/healthcheck` answers 500; so does Sluice's (with the reason in the body).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_domain_the_healthcheck_is_500_with_the_reason() {
    let (server, _dir) = needing_config(&Store::memory()).await;
    let (status, body) = healthcheck(&server).await;
    assert_eq!(status, 500);
    assert!(!body.trim().is_empty(), "the reason is given");
}

// === TestGrpcHealthCheck ===

/// health_test.go:98 TestGrpcHealthCheck: once Redis answers, `ratelimit` is SERVING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_health_is_serving_while_redis_answers() {
    let store = Store::redis();
    let server = store.server(&[("health.yaml", CONFIG)]).await;
    assert_eq!(
        grpc_health(&server, "ratelimit").await,
        ServingStatus::Serving
    );
}

// === TestGrpcHealthyWithAtLeastOneConfigLoaded ===

/// health_test.go:136 TestGrpcHealthyWithAtLeastOneConfigLoaded: with
/// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, `ratelimit` is NOT_SERVING until a config is
/// loaded, SERVING once it is, NOT_SERVING once the config is gone (the reference fails its
/// config and Redis components together; Redis: see `grpc_health_follows_redis`).
async fn grpc_health_waits_for_a_config(store: &Store) {
    let (server, dir) = needing_config(store).await;
    grpc_health_follows_the_file(&server, &dir, "health.yaml", CONFIG).await;
}

on_each_store!([memory, redis] [healthcheck_waits_for_a_config,
    grpc_health_waits_for_a_config]);
