//! The algorithms black-box, over gRPC, on the memory store and on Redis: token buckets,
//! several limits on one descriptor, concurrency released by `is_negative_hits`, and windows
//! of N units (`unit_multiplier`). Time is
//! a manual clock that every store reads (Redis's script too), moved instead of slept.

use std::time::Duration;

use crate::common::redis::RedisServer;
use crate::common::{DomainClient, TestServer, config_dir};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::UInt64Value;
use sluice::clock::{Clock, ManualClock};
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
  - key: half_minute
    rate_limit: {unit: second, unit_multiplier: 30, requests_per_unit: 3}
  - key: two_minutes
    rate_limit: {unit: minute, unit_multiplier: 2, requests_per_unit: 4, algorithm: token_bucket}
  - key: five_minutes
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 10, algorithm: sliding_window}
"#;

/// One microsecond-exact second.
const SECOND: u64 = 1_000_000;

/// A running server on a store, its clock, and the store's server if it has one.
struct Setup {
    server: TestServer,
    clock: std::sync::Arc<ManualClock>,
    _redis: Option<RedisServer>,
}

impl Setup {
    fn algo(&self) -> DomainClient {
        self.server.domain("algo")
    }
}

async fn memory() -> Setup {
    let (server, clock) = TestServer::with_config_and_clock(CONFIG).await;
    Setup {
        server,
        clock,
        _redis: None,
    }
}

async fn redis() -> Setup {
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
    let (server, clock) = TestServer::start_with_clock(settings).await;
    Setup {
        server,
        clock,
        _redis: Some(redis),
    }
}

async fn token_bucket_takes_a_burst_then_refills(setup: &Setup) {
    let algo = setup.algo();
    let answers = futures_util::future::join_all((0..8).map(|_| algo.hit("tb=a"))).await;
    assert_eq!(answers.iter().filter(|r| r.is_ok()).count(), 5);
    for rejected in answers.iter().filter(|r| r.is_over_limit()) {
        let header = &rejected.response_headers_to_add[0];
        assert_eq!(
            (header.key.as_str(), header.value.as_str()),
            ("retry-after", "1")
        );
    }
    // Another key is untouched.
    let other = algo.hit("tb=b").await;
    assert_eq!((other.code(), other.remaining()), (Code::Ok, vec![4]));
    setup.clock.advance(SECOND);
    assert!(algo.hit("tb=a").await.is_ok());
}

async fn token_bucket_of_two_says_when_to_come_back(setup: &Setup) {
    let algo = setup.algo();
    assert!(algo.hit("tb2=a").await.is_ok());
    assert!(algo.hit("tb2=a").await.is_ok());
    let third = algo.hit("tb2=a").await;
    assert!(third.is_over_limit());
    let reset = third.statuses[0].duration_until_reset.unwrap();
    let millis = reset.seconds * 1000 + i64::from(reset.nanos) / 1_000_000;
    assert!(
        (800..=1000).contains(&millis),
        "about 1000 ms, got {millis}"
    );
}

async fn the_stricter_limit_decides(setup: &Setup) {
    let algo = setup.algo();
    let name =
        |r: &crate::common::Decision| r.statuses[0].current_limit.as_ref().unwrap().name.clone();
    // The start of a second, so that the per-second window holds three requests.
    setup
        .clock
        .set(setup.clock.now() / SECOND * SECOND + SECOND);
    let first = algo.hit("both=a").await;
    assert_eq!(
        (first.code(), name(&first).as_str()),
        (Code::Ok, "per_second")
    );
    assert_eq!(first.remaining(), [1]);
    algo.hit("both=a").await;
    let third = algo.hit("both=a").await;
    assert_eq!(
        (third.code(), name(&third).as_str()),
        (Code::OverLimit, "per_second")
    );
    setup.clock.advance(SECOND);
    // A new second: the per-second limit has room, the per-day one has one left.
    let fourth = algo.hit("both=a").await;
    assert_eq!(
        (fourth.code(), name(&fourth).as_str()),
        (Code::Ok, "per_day")
    );
    assert_eq!(fourth.remaining(), [0]);
    let fifth = algo.hit("both=a").await;
    assert_eq!(
        (fifth.code(), name(&fifth).as_str()),
        (Code::OverLimit, "per_day")
    );
}

async fn concurrency_is_released_by_negative_hits(setup: &Setup) {
    let algo = setup.algo();
    let release = || {
        let mut request = algo.request("inflight=a");
        request.descriptors[0].is_negative_hits = true;
        request.descriptors[0].hits_addend = Some(UInt64Value { value: 1 });
        request
    };
    assert!(algo.hit("inflight=a").await.is_ok());
    assert!(algo.hit("inflight=a").await.is_ok());
    assert!(algo.hit("inflight=a").await.is_over_limit());
    // Every acquisition gets released, the refused one too (as Envoy does).
    for remaining in [0, 1] {
        let released = algo.send(release()).await.unwrap();
        assert_eq!(
            (
                released.overall_code(),
                released.statuses[0].limit_remaining
            ),
            (Code::Ok, remaining)
        );
    }
    assert!(algo.hit("inflight=a").await.is_ok());
}

/// Whole seconds of a status's `duration_until_reset`, rounded up.
fn reset_seconds(answer: &crate::common::Decision) -> i64 {
    let reset = answer.statuses[0].duration_until_reset.unwrap();
    reset.seconds + i64::from(reset.nanos > 0)
}

async fn windows_of_thirty_seconds_are_aligned_to_the_epoch(setup: &Setup) {
    let algo = setup.algo();
    // Ten seconds into a window: epoch-aligned windows of 30 s start at :00 and :30.
    let window = 30 * SECOND;
    setup
        .clock
        .set(setup.clock.now() / window * window + window + 10 * SECOND);
    for left in [2, 1, 0] {
        let answer = algo.hit("half_minute=a").await;
        assert_eq!((answer.code(), answer.remaining()), (Code::Ok, vec![left]));
        // Envoy's RateLimit cannot say "per 30 s": no unit at all rather than a wrong one.
        assert!(answer.statuses[0].current_limit.is_none());
    }
    let refused = algo.hit("half_minute=a").await;
    assert!(refused.is_over_limit());
    assert_eq!(reset_seconds(&refused), 20, "the window's end, 20 s away");
    assert!(
        refused
            .response_headers_to_add
            .iter()
            .any(|h| h.key == "retry-after" && h.value == "20")
    );
    setup.clock.advance(20 * SECOND - 1);
    assert!(algo.hit("half_minute=a").await.is_over_limit());
    setup.clock.advance(1);
    assert!(algo.hit("half_minute=a").await.is_ok(), "a new window");
}

async fn a_token_bucket_of_four_per_two_minutes_refills_one_every_thirty_seconds(setup: &Setup) {
    let algo = setup.algo();
    for _ in 0..4 {
        assert!(algo.hit("two_minutes=a").await.is_ok());
    }
    let refused = algo.hit("two_minutes=a").await;
    assert!(refused.is_over_limit());
    assert_eq!(reset_seconds(&refused), 30);
    setup.clock.advance(30 * SECOND);
    assert!(algo.hit("two_minutes=a").await.is_ok());
    assert!(algo.hit("two_minutes=a").await.is_over_limit());
}

async fn a_sliding_window_of_five_minutes_weighs_the_last_five(setup: &Setup) {
    let algo = setup.algo();
    let window = 300 * SECOND;
    setup
        .clock
        .set(setup.clock.now() / window * window + window);
    for _ in 0..10 {
        assert!(algo.hit("five_minutes=a").await.is_ok());
    }
    assert!(algo.hit("five_minutes=a").await.is_over_limit());
    // Four minutes on, still within the window: nothing came back.
    setup.clock.advance(240 * SECOND);
    assert!(algo.hit("five_minutes=a").await.is_over_limit());
    // Halfway into the next window half the previous count weighs: 5 of 10 left.
    setup.clock.advance(60 * SECOND + 150 * SECOND);
    let answer = algo.hit("five_minutes=a").await;
    assert_eq!((answer.code(), answer.remaining()), (Code::Ok, vec![4]));
}

macro_rules! on_every_store {
    ($($case:ident),* $(,)?) => {
        mod memory_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(&super::memory().await).await;
                }
            )*
        }
        mod redis_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(&super::redis().await).await;
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
    windows_of_thirty_seconds_are_aligned_to_the_epoch,
    a_token_bucket_of_four_per_two_minutes_refills_one_every_thirty_seconds,
    a_sliding_window_of_five_minutes_weighs_the_last_five,
);
