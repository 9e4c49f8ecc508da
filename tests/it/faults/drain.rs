//! A SIGTERM drain under load, with requests waiting on Redis and an RLQS stream open.

use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Kind;

use super::{Sent, check, drive, over};
use crate::common::faultproxy::{Fault, FaultProxy};
use crate::common::redis::RedisServer;
use crate::common::rlqs::{RULES as RLQS_RULES, Stream, usage};
use crate::common::{SluiceProcess, config_dir};

/// The TTL of an RLQS assignment sent by the drain.
fn ttl_of(
    answer: &envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaResponse,
) -> i64 {
    match &answer.bucket_action[0].bucket_action {
        Some(Kind::QuotaAssignmentAction(a)) => a.assignment_time_to_live.unwrap().seconds,
        other => panic!("not an assignment: {other:?}"),
    }
}

/// Three instances on one Redis 100 ms away each way (the proxy holds every chunk), 300
/// requests a second on 20 keys of 30 a day, and an RLQS stream open on instance 0, which
/// gets SIGTERM 2 s in. Every request it had received is answered by the limit (none
/// dropped, none answered by an error), including those waiting on Redis at the signal; the
/// fleet never admits past the limit; the stream gets its assignment again with the drain's
/// 2 s TTL and then ends cleanly (Envoy reopens it on another replica).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_under_load_answers_everything_in_flight_and_closes_rlqs_streams() {
    let redis = RedisServer::start();
    let upstream = format!("127.0.0.1:{}", redis.port).parse().unwrap();
    let proxy = FaultProxy::start(upstream).await;
    proxy.set(Fault::Delay(Duration::from_millis(100)));
    let rules = "domain: f\ndescriptors:\n  - key: k\n    failure_mode: deny\n    rate_limit: {unit: day, requests_per_unit: 30}\n";
    let dir = config_dir(
        "faults-drain",
        &[("f.yaml", rules), ("rq.yaml", RLQS_RULES)],
    );
    let url = format!("redis://{}", proxy.addr);
    let args = [
        "--backend",
        "redis",
        "--redis-url",
        &url,
        "--redis-deadline",
        "2s",
    ];
    let instances: Vec<SluiceProcess> = (0..3).map(|_| SluiceProcess::spawn(&dir, &args)).collect();
    let clients = crate::common::process::clients(&instances).await;
    let mut stream = Stream::open(instances[0].grpc.parse().unwrap())
        .await
        .unwrap();
    stream
        .report("rq", vec![usage(&[("name", "a")], 1, 0)])
        .await;
    assert_eq!(ttl_of(&stream.next().await), 10);
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    let signal_at = Duration::from_secs(2);
    let mut signalled = None;
    let history = drive(&clients, "f", &keys, 300, Duration::from_secs(4), |now| {
        if now >= signal_at && signalled.is_none() {
            signalled = Some(now);
            instances[0].terminate();
        }
    })
    .await;
    let signalled = signalled.expect("signalled");
    // Sent to the draining instance 20 ms or more before the signal: on the wire, received.
    let received = |s: &&Sent| s.instance == 0 && s.at + Duration::from_millis(20) <= signalled;
    let before: Vec<&Sent> = history.iter().filter(received).collect();
    let in_flight = before.iter().filter(|s| s.at + s.took > signalled).count();
    let refused_after = history
        .iter()
        .filter(|s| {
            s.instance == 0 && s.at >= signalled && s.answer != "OK" && s.answer != "OVER_LIMIT"
        })
        .count();
    let answered: Vec<Sent> = history
        .iter()
        .filter(|s| s.instance != 0 || s.at < signalled)
        .cloned()
        .collect();
    let verdict = check(&answered);
    let dropped: Vec<&&Sent> = before
        .iter()
        .filter(|s| s.answer != "OK" && s.answer != "OVER_LIMIT")
        .collect();
    eprintln!(
        "figures: a drain under load: {in_flight} requests waiting on Redis at SIGTERM, {} dropped; {refused_after} sent to it afterwards refused; {} over the limit",
        dropped.len(),
        over(&verdict, 30)
    );
    // The fault happened with requests in flight.
    assert!(in_flight >= 5, "{in_flight} in flight at the signal");
    assert!(dropped.is_empty(), "{dropped:?}");
    assert_eq!(over(&verdict, 30), 0);
    // The RLQS stream: the assignment again with the drain's TTL, then the end.
    assert_eq!(ttl_of(&stream.next().await), 2);
    let end = tokio::time::timeout(Duration::from_secs(10), stream.answers.message())
        .await
        .expect("the stream ends within 10 s");
    assert!(matches!(end, Ok(None)), "{end:?}");
}
