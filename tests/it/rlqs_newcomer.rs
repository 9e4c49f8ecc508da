//! An Envoy new to a budget that another Envoy holds whole gets its floor in its first
//! answer (a quarter of an even split, ahead of the lowering that makes room for it), on one
//! instance and from another replica on one Redis; before, it was told DENY_ALL and denied
//! the tenant's traffic for a second (one instance) or about six (across replicas).

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::Strategy;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Kind;

use crate::common::redis::RedisServer;
use crate::common::rlqs::{Stream, local, two_replicas, usage};
use crate::common::{TestServer, config_dir};
use sluice::settings::Settings;

const RULES: &str = "
domain: rq
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 100}
";

/// What an answer assigns the tenant's bucket: its token bucket's rate, 0 for DENY_ALL;
/// `None` when it says nothing of it.
fn rate(
    answer: &envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaResponse,
) -> Option<u32> {
    answer
        .bucket_action
        .iter()
        .rev()
        .find_map(|action| match &action.bucket_action {
            Some(Kind::QuotaAssignmentAction(a)) => Some(
                match a
                    .rate_limit_strategy
                    .as_ref()
                    .and_then(|s| s.strategy.as_ref())
                {
                    Some(Strategy::TokenBucket(b)) => b.tokens_per_fill.unwrap().value,
                    _ => 0,
                },
            ),
            _ => None,
        })
}

/// An Envoy that reports 100 requests a second for the tenant until it holds the whole
/// budget (a rate of 100 a second).
async fn incumbent(addr: std::net::SocketAddr) -> Stream {
    let mut stream = Stream::open_from(addr, local(1)).await.unwrap();
    stream
        .report("rq", vec![usage(&[("tenant", "a")], 1, 0)])
        .await;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        let next = tokio::time::timeout(Duration::from_secs(1), stream.answers.message()).await;
        match next {
            Ok(answer) => {
                let answer = answer.unwrap().expect("the stream is open");
                if rate(&answer) == Some(100) {
                    return stream;
                }
            }
            Err(_) => {
                stream
                    .report("rq", vec![usage(&[("tenant", "a")], 100, 0)])
                    .await
            }
        }
    }
    panic!("the first Envoy never held the whole budget");
}

/// A second Envoy's first report: its first answer for the bucket.
async fn newcomers_first_rate(addr: std::net::SocketAddr) -> u32 {
    let mut newcomer = Stream::open_from(addr, local(2)).await.unwrap();
    newcomer
        .report("rq", vec![usage(&[("tenant", "a")], 1, 0)])
        .await;
    loop {
        if let Some(rate) = rate(&newcomer.next().await) {
            return rate;
        }
    }
}

/// One instance: the newcomer's floor among two is 100 / 8 = 12 a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_gets_its_floor_in_its_first_answer() {
    let dir = config_dir("rlqs-newcomer-one", &[("rq.yaml", RULES)]);
    let sluice = TestServer::start_with(Settings::for_tests(dir)).await;
    let _first = incumbent(sluice.grpc_addr).await;
    let rate = newcomers_first_rate(sluice.grpc_addr).await;
    assert_eq!(rate, 12, "the floor of two Envoys of 100 a second");
}

/// Two replicas on one Redis: the first holds the whole budget (and its claim on all of
/// it); the second, whose claim is empty, gives its newcomer its floor at once all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn across_replicas_a_newcomer_gets_its_floor_in_its_first_answer() {
    let redis = RedisServer::start();
    let [a, b] = two_replicas("rlqs-newcomer-fleet", RULES, &redis);
    let _first = incumbent(a.grpc.parse().unwrap()).await;
    let rate = newcomers_first_rate(b.grpc.parse().unwrap()).await;
    assert_eq!(rate, 12, "the floor of two Envoys of 100 a second");
}
