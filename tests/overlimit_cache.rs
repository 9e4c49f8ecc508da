//! The local over-limit cache (on by default with Redis) answers only what it knows: a
//! refused `low` priority says nothing about `critical`, a refusal of many hits nothing about
//! fewer, and concurrency counters are never cached. Against a real Redis.

mod common;

use common::redis::RedisServer;
use common::{TestServer, config_dir, descriptor, request, should_rate_limit};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use sluice::settings::{Backend, Settings};
use sluice::store::redis::{RedisKind, RedisOptions};

const CONFIG: &str = "domain: cache
descriptors:
  - key: priority
    priorities: {critical: 1.0, low: 0.5}
    rate_limit: {unit: hour, requests_per_unit: 4}
  - key: batch
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: inflight
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: concurrency}
";

async fn server(redis: &RedisServer) -> TestServer {
    let mut settings = Settings::for_tests(config_dir("overlimit-cache", &[("c.yaml", CONFIG)]));
    settings.backend = Backend::Redis;
    settings.redis = Some(RedisOptions::new(redis.url(), RedisKind::Single));
    settings.local_cache_keys = 1000;
    TestServer::start_with(settings).await
}

fn with_hits(key: &str, value: &str, hits: u64, negative: bool) -> RateLimitRequest {
    let mut d = descriptor(&[(key, value)]);
    d.hits_addend = Some(prost_types_u64(hits));
    d.is_negative_hits = negative;
    request("cache", vec![d])
}

fn prost_types_u64(value: u64) -> envoy_types::pb::google::protobuf::UInt64Value {
    envoy_types::pb::google::protobuf::UInt64Value { value }
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shed_low_priority_does_not_shed_critical() {
    let redis = RedisServer::start();
    let server = server(&redis).await;
    let mut client = server.client().await;
    let ask = |class: &str| request("cache", vec![descriptor(&[("priority", class)])]);
    for _ in 0..2 {
        assert_eq!(
            should_rate_limit(&mut client, ask("low"))
                .await
                .overall_code,
            OK
        );
    }
    for _ in 0..3 {
        assert_eq!(
            should_rate_limit(&mut client, ask("low"))
                .await
                .overall_code,
            OVER
        );
    }
    // critical may use the whole limit of 4: two more.
    for _ in 0..2 {
        assert_eq!(
            should_rate_limit(&mut client, ask("critical"))
                .await
                .overall_code,
            OK
        );
    }
    assert_eq!(
        should_rate_limit(&mut client, ask("critical"))
            .await
            .overall_code,
        OVER
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_of_many_hits_does_not_refuse_fewer() {
    let redis = RedisServer::start();
    let server = server(&redis).await;
    let mut client = server.client().await;
    let ask = |hits| with_hits("batch", "b", hits, false);
    assert_eq!(
        should_rate_limit(&mut client, ask(8)).await.overall_code,
        OK
    );
    assert_eq!(
        should_rate_limit(&mut client, ask(5)).await.overall_code,
        OVER
    );
    let one = should_rate_limit(&mut client, ask(1)).await;
    assert_eq!((one.overall_code, one.statuses[0].limit_remaining), (OK, 1));
    // Once even one hit is refused, more hits are refused too (from the cache or not).
    assert_eq!(
        should_rate_limit(&mut client, ask(2)).await.overall_code,
        OVER
    );
    assert_eq!(
        should_rate_limit(&mut client, ask(1)).await.overall_code,
        OK
    );
    assert_eq!(
        should_rate_limit(&mut client, ask(1)).await.overall_code,
        OVER
    );
    assert_eq!(
        should_rate_limit(&mut client, ask(3)).await.overall_code,
        OVER
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_acquisitions_still_count_so_the_cap_holds() {
    let redis = RedisServer::start();
    let server = server(&redis).await;
    let mut client = server.client().await;
    let acquire = || with_hits("inflight", "i", 1, false);
    let release = || with_hits("inflight", "i", 1, true);
    // A and B in flight; C and D refused.
    for _ in 0..2 {
        assert_eq!(
            should_rate_limit(&mut client, acquire()).await.overall_code,
            OK
        );
    }
    for _ in 0..2 {
        assert_eq!(
            should_rate_limit(&mut client, acquire()).await.overall_code,
            OVER
        );
    }
    // Envoy releases C and D when their streams end; A and B are still in flight, so a
    // new request must still be refused (had D been answered from a cache without being
    // counted, its release would free a slot that A or B holds).
    should_rate_limit(&mut client, release()).await;
    should_rate_limit(&mut client, release()).await;
    assert_eq!(
        should_rate_limit(&mut client, acquire()).await.overall_code,
        OVER
    );
    should_rate_limit(&mut client, release()).await; // that refused one's
    should_rate_limit(&mut client, release()).await; // A ends
    assert_eq!(
        should_rate_limit(&mut client, acquire()).await.overall_code,
        OK
    );
}
