//! The algorithms black-box, over gRPC, on the memory store and on Redis: token buckets,
//! several limits on one descriptor, and concurrency released by `is_negative_hits`.

mod common;

use std::time::Duration;

use common::redis::RedisServer;
use common::{TestServer, config_dir, descriptor, request, should_rate_limit};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::UInt64Value;
use sluice::settings::{Backend, Settings};
use sluice::store::redis::{RedisKind, RedisOptions};
use sluice::store::resilient::ResilienceOptions;

const CONFIG: &str = r#"
domain: algo
descriptors:
  - key: tb
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: token_bucket, burst: 5}
  - key: tb2
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 2}
  - key: both
    rate_limits:
      - {unit: second, requests_per_unit: 2, name: per_second}
      - {unit: day, requests_per_unit: 3, name: per_day}
  - key: inflight
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: concurrency}
"#;

async fn memory() -> (TestServer, Option<RedisServer>) {
    (TestServer::start(&[("algo.yaml", CONFIG)]).await, None)
}

async fn redis() -> (TestServer, Option<RedisServer>) {
    let redis = RedisServer::start();
    let mut settings = Settings::for_tests(config_dir("algo", &[("algo.yaml", CONFIG)]));
    settings.backend = Backend::Redis;
    settings.redis = Some(RedisOptions::new(redis.url(), RedisKind::Single));
    settings.resilience = ResilienceOptions {
        deadline: Duration::from_secs(2),
        ..ResilienceOptions::default()
    };
    // Fail closed: a Redis problem must show, not pass as OK.
    settings.limiter.failure_mode = sluice::store::FailureMode::Deny;
    (TestServer::start_with(settings).await, Some(redis))
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

async fn token_bucket_takes_a_burst_then_refills(server: &TestServer) {
    let mut client = server.client().await;
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            should_rate_limit(
                &mut client,
                request("algo", vec![descriptor(&[("tb", "a")])]),
            )
            .await
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    assert_eq!(answers.iter().filter(|r| r.overall_code == OK).count(), 5);
    for rejected in answers.iter().filter(|r| r.overall_code == OVER) {
        let header = &rejected.response_headers_to_add[0];
        assert_eq!(
            (header.key.as_str(), header.value.as_str()),
            ("retry-after", "1")
        );
    }
    // Another key is untouched.
    let other = should_rate_limit(
        &mut client,
        request("algo", vec![descriptor(&[("tb", "b")])]),
    )
    .await;
    assert_eq!(
        (other.overall_code, other.statuses[0].limit_remaining),
        (OK, 4)
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let retry = should_rate_limit(
        &mut client,
        request("algo", vec![descriptor(&[("tb", "a")])]),
    )
    .await;
    assert_eq!(retry.overall_code, OK);
}

async fn token_bucket_of_two_says_when_to_come_back(server: &TestServer) {
    let mut client = server.client().await;
    let ask = || request("algo", vec![descriptor(&[("tb2", "a")])]);
    assert_eq!(should_rate_limit(&mut client, ask()).await.overall_code, OK);
    assert_eq!(should_rate_limit(&mut client, ask()).await.overall_code, OK);
    let third = should_rate_limit(&mut client, ask()).await;
    assert_eq!(third.overall_code, OVER);
    let reset = third.statuses[0].duration_until_reset.unwrap();
    let millis = reset.seconds * 1000 + i64::from(reset.nanos) / 1_000_000;
    assert!(
        (800..=1000).contains(&millis),
        "about 1000 ms, got {millis}"
    );
}

async fn the_stricter_limit_decides(server: &TestServer) {
    let mut client = server.client().await;
    let ask = || request("algo", vec![descriptor(&[("both", "a")])]);
    let name = |r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
        r.statuses[0].current_limit.as_ref().unwrap().name.clone()
    };
    // Align to the start of a second so that the per-second window holds three requests.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    tokio::time::sleep(Duration::from_nanos(
        1_000_000_000 - u64::from(now.subsec_nanos()),
    ))
    .await;
    let first = should_rate_limit(&mut client, ask()).await;
    assert_eq!(
        (first.overall_code, name(&first).as_str()),
        (OK, "per_second")
    );
    assert_eq!(first.statuses[0].limit_remaining, 1);
    should_rate_limit(&mut client, ask()).await;
    let third = should_rate_limit(&mut client, ask()).await;
    assert_eq!(
        (third.overall_code, name(&third).as_str()),
        (OVER, "per_second")
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    // A new second: the per-second limit has room, the per-day one has one left.
    let fourth = should_rate_limit(&mut client, ask()).await;
    assert_eq!(
        (fourth.overall_code, name(&fourth).as_str()),
        (OK, "per_day")
    );
    assert_eq!(fourth.statuses[0].limit_remaining, 0);
    let fifth = should_rate_limit(&mut client, ask()).await;
    assert_eq!(
        (fifth.overall_code, name(&fifth).as_str()),
        (OVER, "per_day")
    );
}

async fn concurrency_is_released_by_negative_hits(server: &TestServer) {
    let mut client = server.client().await;
    let acquire = || request("algo", vec![descriptor(&[("inflight", "a")])]);
    let release = || {
        let mut d = descriptor(&[("inflight", "a")]);
        d.is_negative_hits = true;
        d.hits_addend = Some(UInt64Value { value: 1 });
        request("algo", vec![d])
    };
    assert_eq!(
        should_rate_limit(&mut client, acquire()).await.overall_code,
        OK
    );
    assert_eq!(
        should_rate_limit(&mut client, acquire()).await.overall_code,
        OK
    );
    assert_eq!(
        should_rate_limit(&mut client, acquire()).await.overall_code,
        OVER
    );
    // Every acquisition gets released, the refused one too (as Envoy does).
    for remaining in [0, 1] {
        let released = should_rate_limit(&mut client, release()).await;
        assert_eq!(
            (released.overall_code, released.statuses[0].limit_remaining),
            (OK, remaining)
        );
    }
    assert_eq!(
        should_rate_limit(&mut client, acquire()).await.overall_code,
        OK
    );
}

macro_rules! on_every_store {
    ($($case:ident),* $(,)?) => {
        mod memory_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let (server, _redis) = super::memory().await;
                    super::$case(&server).await;
                }
            )*
        }
        mod redis_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let (server, _redis) = super::redis().await;
                    super::$case(&server).await;
                }
            )*
        }
    };
}

on_every_store!(
    token_bucket_takes_a_burst_then_refills,
    token_bucket_of_two_says_when_to_come_back,
    the_stricter_limit_decides,
    concurrency_is_released_by_negative_hits,
);
