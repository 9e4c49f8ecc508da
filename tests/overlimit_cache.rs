//! The local over-limit cache (on by default with Redis) answers only what it knows: a
//! refused `low` priority says nothing about `critical`, a refusal of many hits nothing about
//! fewer, and concurrency counters are never cached. Against a real Redis.

mod common;

use common::redis::{RedisServer, command_calls};
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
  - key: key2_local
    rate_limit: {unit: hour, requests_per_unit: 20}
  - key: key3_local
    rate_limit: {unit: hour, requests_per_unit: 10}
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

/// envoyproxy/ratelimit `test/integration/integration_test.go` (the local cache cases): once
/// `key3` is refused from the cache, `key2` still reports what its counter holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_other_descriptors_of_a_cached_refusal_report_their_real_remaining() {
    let redis = RedisServer::start();
    let server = server(&redis).await;
    let mut client = server.client().await;
    let both = || {
        request(
            "cache",
            vec![
                descriptor(&[("key2_local", "n")]),
                descriptor(&[("key3_local", "n")]),
            ],
        )
    };
    for i in 1..=10u32 {
        let answer = should_rate_limit(&mut client, both()).await;
        assert_eq!(answer.overall_code, OK, "request {i}");
        assert_eq!(answer.statuses[0].limit_remaining, 20 - i, "request {i}");
        assert_eq!(answer.statuses[1].limit_remaining, 10 - i, "request {i}");
    }
    // The 11th is refused by the store; the next ones from the cache. Rejected requests
    // charge nothing, so key2 has 10 left every time.
    for i in 11..=15 {
        let answer = should_rate_limit(&mut client, both()).await;
        assert_eq!(answer.overall_code, OVER, "request {i}");
        assert_eq!(
            (answer.statuses[0].code, answer.statuses[0].limit_remaining),
            (OK, 10),
            "request {i}: key2"
        );
        assert_eq!(
            (answer.statuses[1].code, answer.statuses[1].limit_remaining),
            (OVER, 0),
            "request {i}: key3"
        );
    }
    // A request carrying only the cached key still costs no script call.
    let calls = command_calls(&redis, "evalsha");
    for _ in 0..5 {
        let only = request("cache", vec![descriptor(&[("key3_local", "n")])]);
        assert_eq!(
            should_rate_limit(&mut client, only).await.overall_code,
            OVER
        );
    }
    assert_eq!(command_calls(&redis, "evalsha"), calls);
    let alone = request("cache", vec![descriptor(&[("key2_local", "n")])]);
    let answer = should_rate_limit(&mut client, alone).await;
    assert_eq!(
        (answer.overall_code, answer.statuses[0].limit_remaining),
        (OK, 9)
    );
}

/// A concurrency acquisition in a request refused from the cache counts, as it does in a
/// request the store refuses: its release will come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_in_a_cached_refusal_still_counts() {
    let redis = RedisServer::start();
    let server = server(&redis).await;
    let mut client = server.client().await;
    let batch_only = with_hits("batch", "c", 11, false);
    assert_eq!(
        should_rate_limit(&mut client, batch_only.clone())
            .await
            .overall_code,
        OVER
    );
    let mut both = batch_only;
    both.descriptors.push(descriptor(&[("inflight", "c")]));
    both.descriptors[1].hits_addend = Some(prost_types_u64(1));
    for _ in 0..2 {
        assert_eq!(
            should_rate_limit(&mut client, both.clone())
                .await
                .overall_code,
            OVER
        );
    }
    // Two acquisitions are held (their releases have not come): the cap of 2 is reached.
    let acquire = with_hits("inflight", "c", 1, false);
    let answer = should_rate_limit(&mut client, acquire).await;
    assert_eq!(answer.overall_code, OVER);
}
