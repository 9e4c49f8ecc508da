//! The local over-limit cache (on by default with Redis) answers only what it knows: a
//! refused `low` priority says nothing about `critical`, a refusal of many hits nothing about
//! fewer, and concurrency counters are never cached. Against a real Redis.

use crate::common::redis::{RedisServer, command_calls};
use crate::common::{TestServer, config_dir};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::UInt64Value;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shed_low_priority_does_not_shed_critical() {
    let redis = RedisServer::start();
    let server = server(&redis).await;
    let cache = server.domain("cache");
    for _ in 0..2 {
        assert!(cache.hit("priority=low").await.is_ok());
    }
    for _ in 0..3 {
        assert!(cache.hit("priority=low").await.is_over_limit());
    }
    // critical may use the whole limit of 4: two more.
    for _ in 0..2 {
        assert!(cache.hit("priority=critical").await.is_ok());
    }
    assert!(cache.hit("priority=critical").await.is_over_limit());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_of_many_hits_does_not_refuse_fewer() {
    let redis = RedisServer::start();
    let server = server(&redis).await;
    let cache = server.domain("cache");
    assert!(cache.hits("batch=b", 8).await.is_ok());
    assert!(cache.hits("batch=b", 5).await.is_over_limit());
    let one = cache.hit("batch=b").await;
    assert_eq!((one.code(), one.remaining()), (Code::Ok, vec![1]));
    // Once even one hit is refused, more hits are refused too (from the cache or not).
    assert!(cache.hits("batch=b", 2).await.is_over_limit());
    assert!(cache.hit("batch=b").await.is_ok());
    assert!(cache.hit("batch=b").await.is_over_limit());
    assert!(cache.hits("batch=b", 3).await.is_over_limit());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_acquisitions_still_count_so_the_cap_holds() {
    let redis = RedisServer::start();
    let server = server(&redis).await;
    let cache = server.domain("cache");
    // A and B in flight; C and D refused.
    for _ in 0..2 {
        assert!(cache.hit("inflight=i").await.is_ok());
    }
    for _ in 0..2 {
        assert!(cache.hit("inflight=i").await.is_over_limit());
    }
    // Envoy releases C and D when their streams end; A and B are still in flight, so a
    // new request must still be refused (had D been answered from a cache without being
    // counted, its release would free a slot that A or B holds).
    cache.release("inflight=i").await;
    cache.release("inflight=i").await;
    assert!(cache.hit("inflight=i").await.is_over_limit());
    cache.release("inflight=i").await; // that refused one's
    cache.release("inflight=i").await; // A ends
    assert!(cache.hit("inflight=i").await.is_ok());
}

/// envoyproxy/ratelimit `test/integration/integration_test.go` (the local cache cases): once
/// `key3` is refused from the cache, `key2` still reports what its counter holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_other_descriptors_of_a_cached_refusal_report_their_real_remaining() {
    let redis = RedisServer::start();
    let server = server(&redis).await;
    let cache = server.domain("cache");
    let both = "key2_local=n | key3_local=n";
    for i in 1..=10u32 {
        let answer = cache.hit(both).await;
        assert!(answer.is_ok(), "request {i}");
        assert_eq!(answer.remaining(), [20 - i, 10 - i], "request {i}");
    }
    // The 11th is refused by the store; the next ones from the cache. Rejected requests
    // charge nothing, so key2 has 10 left every time.
    for i in 11..=15 {
        let answer = cache.hit(both).await;
        assert!(answer.is_over_limit(), "request {i}");
        assert_eq!(answer.codes(), [Code::Ok, Code::OverLimit], "request {i}");
        assert_eq!(answer.remaining(), [10, 0], "request {i}");
    }
    // A request carrying only the cached key still costs no script call.
    let calls = command_calls(&redis, "evalsha");
    for _ in 0..5 {
        assert!(cache.hit("key3_local=n").await.is_over_limit());
    }
    assert_eq!(command_calls(&redis, "evalsha"), calls);
    let answer = cache.hit("key2_local=n").await;
    assert_eq!((answer.code(), answer.remaining()), (Code::Ok, vec![9]));
}

/// A concurrency acquisition in a request refused from the cache counts, as it does in a
/// request the store refuses: its release will come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_in_a_cached_refusal_still_counts() {
    let redis = RedisServer::start();
    let server = server(&redis).await;
    let cache = server.domain("cache");
    assert!(cache.hits("batch=c", 11).await.is_over_limit());
    // 11 hits on batch, one on inflight.
    let mut both = cache.request("batch=c | inflight=c");
    both.descriptors[0].hits_addend = Some(UInt64Value { value: 11 });
    both.descriptors[1].hits_addend = Some(UInt64Value { value: 1 });
    for _ in 0..2 {
        let answer = cache.send(both.clone()).await.unwrap();
        assert_eq!(answer.overall_code(), Code::OverLimit);
    }
    // Two acquisitions are held (their releases have not come): the cap of 2 is reached.
    assert!(cache.hit("inflight=c").await.is_over_limit());
}
