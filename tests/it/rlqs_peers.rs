//! An RLQS stream is not a free identity: the streams of one peer (one client address)
//! count as one Envoy in the division of a budget, on one instance and across replicas, so
//! a client that opens a hundred streams and reports any usage gets what one Envoy would,
//! and an honest Envoy keeps its max-min fair share. Each client here has a loopback address
//! of its own.

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
    rate_limit: {unit: second, requests_per_unit: 10}
";

/// A hostile client: `streams` streams from one address, each reporting the most usage
/// there is for the tenant's bucket.
async fn hostile(addr: std::net::SocketAddr, streams: usize) -> Vec<Stream> {
    let mut all = Vec::new();
    for _ in 0..streams {
        let stream = Stream::open_from(addr, local(1)).await.unwrap();
        stream
            .report("rq", vec![usage(&[("tenant", "a")], u64::MAX, u64::MAX)])
            .await;
        all.push(stream);
    }
    all
}

/// Reports `per_second` requests a second for the tenant on `honest` (and keeps `hostile`
/// reporting the most there is) until the honest Envoy's token bucket refills at least
/// `want` a second; answers its last bucket.
async fn honest_gets(honest: &mut Stream, hostile: &[Stream], per_second: u64, want: u32) -> u32 {
    let started = Instant::now();
    let mut last = 0;
    honest
        .report("rq", vec![usage(&[("tenant", "a")], 1, 0)])
        .await;
    while started.elapsed() < Duration::from_secs(60) {
        let next = tokio::time::timeout(Duration::from_secs(1), honest.answers.message()).await;
        if let Ok(answer) = next {
            let answer = answer.unwrap().expect("the stream is open");
            for action in answer.bucket_action {
                if let Some(Kind::QuotaAssignmentAction(a)) = action.bucket_action {
                    last = match a.rate_limit_strategy.and_then(|s| s.strategy) {
                        Some(Strategy::TokenBucket(b)) => b.tokens_per_fill.unwrap().value,
                        _ => 0,
                    };
                }
            }
            if last >= want {
                return last;
            }
            continue;
        }
        // A second passed: the next reports.
        honest
            .report("rq", vec![usage(&[("tenant", "a")], per_second, 0)])
            .await;
        for stream in hostile {
            stream
                .report("rq", vec![usage(&[("tenant", "a")], u64::MAX, u64::MAX)])
                .await;
        }
    }
    panic!("the honest Envoy got {last} a second at most, not {want}");
}

/// The probe: a client with 100 streams reporting u64::MAX took a tenant's whole budget;
/// the honest Envoy was DENY_ALL for the whole run. Both ask for the whole budget here: the
/// max-min fair division is half each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_streams_from_one_address_get_what_one_envoy_gets() {
    let dir = config_dir("rlqs-peers-one", &[("rq.yaml", RULES)]);
    let sluice = TestServer::start_with(Settings::for_tests(dir)).await;
    let hostile = hostile(sluice.grpc_addr, 100).await;
    let mut honest = Stream::open_from(sluice.grpc_addr, local(2)).await.unwrap();
    let got = honest_gets(&mut honest, &hostile, 10, 5).await;
    assert!(got >= 5, "{got}");
}

/// The same across two replicas on one Redis, with an honest Envoy asking for 5 of the 10:
/// it gets its 5 (the division by the replicas' demand gave it 4, and nothing against the
/// hundred streams).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn across_replicas_an_honest_envoy_keeps_its_max_min_share() {
    let redis = RedisServer::start();
    let [a, b] = two_replicas("rlqs-peers-fleet", RULES, &redis);
    let hostile = hostile(a.grpc.parse().unwrap(), 100).await;
    let mut honest = Stream::open_from(b.grpc.parse().unwrap(), local(2))
        .await
        .unwrap();
    let got = honest_gets(&mut honest, &hostile, 5, 5).await;
    assert!(got >= 5, "{got}");
}
