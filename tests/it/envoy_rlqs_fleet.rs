//! One budget, many Envoys: three Envoy 1.40s with the `rate_limit_quota` filter share one
//! budget within the stated bound, an idle Envoy's share moves to the busy ones; two Sluice
//! replicas on one Redis divide it fleet-wide, also across a replica's restart.

use std::time::{Duration, Instant};

use crate::common::redis::{RedisServer, free_port};
use crate::common::rlqs::{KeepAlive, call, envoy};
use crate::common::{SluiceProcess, TestServer, config_dir, eventually, http_get};

/// 10 per second, a burst of 10.
const RULES: &str = "
domain: rq
descriptors:
  - key: name
    rate_limit: {unit: second, requests_per_unit: 10}
";
const RATE: f64 = 10.0;
const BURST: f64 = 10.0;

/// Requests in `bucket` through `front`, two connections at once, until `until`: when each
/// admitted one was answered.
async fn hammer(front: u16, bucket: &'static str, until: Instant) -> Vec<Instant> {
    let loops = (0..2).map(|_| {
        tokio::spawn(async move {
            let mut client = KeepAlive::connect(front).await;
            let mut admitted = Vec::new();
            while Instant::now() < until {
                if client.call(bucket).await == 200 {
                    admitted.push(Instant::now());
                }
            }
            admitted
        })
    });
    let mut all = Vec::new();
    for handle in loops {
        all.extend(handle.await.unwrap());
    }
    all.sort();
    all
}

/// The most admitted within any `t` of `admitted` (sorted).
fn most_within(admitted: &[Instant], t: Duration) -> usize {
    let mut most = 0;
    let mut start = 0;
    for end in 0..admitted.len() {
        while admitted[end] - admitted[start] > t {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most
}

/// Checks the bound over windows of 1, 5 and 10 s and the whole run: burst + rate × t, plus
/// `allowance` (requests let through before a first assignment, one token per new Envoy)
/// and a quarter of a second of rate for the time answers take to reach the client.
fn assert_within_bound(admitted: &[Instant], allowance: f64) {
    let span = admitted.last().map_or(Duration::ZERO, |l| *l - admitted[0]);
    for t in [1.0, 5.0, 10.0, span.as_secs_f64()] {
        let seen = most_within(admitted, Duration::from_secs_f64(t)) as f64;
        let bound = BURST + RATE * (t + 0.25) + allowance;
        assert!(
            seen <= bound,
            "{seen} admitted within {t:.1} s; the bound is {bound:.1}"
        );
    }
}

/// Every Envoy of `fronts` busy for `seconds`: what each admitted, each having had a share
/// (at least 5 in the last 5 s).
async fn all_busy(fronts: &[u16], seconds: u64) -> Vec<Vec<Instant>> {
    let until = Instant::now() + Duration::from_secs(seconds);
    let busy =
        futures_util::future::join_all(fronts.iter().map(|f| hammer(*f, "shared", until))).await;
    for (i, admitted) in busy.iter().enumerate() {
        let recent = in_last(admitted, until, Duration::from_secs(5));
        assert!(
            recent >= 5,
            "Envoy {i} gets a share: {recent} in the last 5 s"
        );
    }
    busy
}

fn in_last(admitted: &[Instant], until: Instant, t: Duration) -> usize {
    admitted.iter().filter(|at| until - **at <= t).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_envoys_share_one_budget_and_an_idle_ones_share_moves_to_the_busy() {
    let sluice = TestServer::start(&[("rq.yaml", RULES)]).await;
    let port = sluice.grpc_addr.port();
    let (a, b, c) = tokio::join!(
        envoy(port, "{blanket_rule: ALLOW_ALL}"),
        envoy(port, "{blanket_rule: ALLOW_ALL}"),
        envoy(port, "{blanket_rule: ALLOW_ALL}"),
    );
    let fronts = [a.1, b.1, c.1];
    // Each Envoy's first request passes under ALLOW_ALL and subscribes its bucket; what
    // follows is measured once all three hold an assignment.
    for front in fronts {
        assert_eq!(call(front, "shared").await, 200);
    }
    eventually("three streams hold shares", || async {
        let (_, page) = http_get(sluice.http_addr, "/rlconfig").await.unwrap();
        page.contains("streams 3")
    })
    .await;
    // All three busy.
    let busy = all_busy(&fronts, 12).await;
    let mut all: Vec<Instant> = busy.concat();
    all.sort();
    // One token per new Envoy (a bucket cannot start empty).
    assert_within_bound(&all, 3.0);
    // The third goes idle: after three reports its share has moved to the other two.
    let until = Instant::now() + Duration::from_secs(20);
    let two =
        futures_util::future::join_all(fronts[..2].iter().map(|f| hammer(*f, "shared", until)))
            .await;
    let recent: usize = two
        .iter()
        .map(|a| in_last(a, until, Duration::from_secs(5)))
        .sum();
    assert!(
        recent >= 38,
        "the two busy Envoys admit about the whole rate: {recent} in 5 s"
    );
    all.extend(two.concat());
    all.sort();
    assert_within_bound(&all, 3.0);
    // The idle one kept its floor.
    assert_eq!(call(fronts[2], "shared").await, 200);
}

/// A replica on `redis`, its gRPC port `port`.
fn replica(dir: &std::path::Path, redis: &RedisServer, port: u16) -> SluiceProcess {
    let url = redis.url();
    let addr = format!("127.0.0.1:{port}");
    SluiceProcess::spawn(
        dir,
        &[
            "--backend",
            "redis",
            "--redis-url",
            &url,
            "--redis-deadline",
            "2s",
            "--grpc-addr",
            &addr,
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_redis_divide_the_budget_also_across_a_restart() {
    let redis = RedisServer::start();
    let dir = config_dir("rlqs-fleet", &[("rq.yaml", RULES)]);
    let ports = [free_port(), free_port()];
    let mut replicas = vec![
        replica(&dir, &redis, ports[0]),
        replica(&dir, &redis, ports[1]),
    ];
    // Each Envoy asks its own replica; before an assignment (and when one expires) it denies.
    let (a, b) = tokio::join!(
        envoy(ports[0], "{blanket_rule: DENY_ALL}"),
        envoy(ports[1], "{blanket_rule: DENY_ALL}"),
    );
    let fronts = [a.1, b.1];
    let first = all_busy(&fronts, 12).await;
    // Both busy: the budget is divided about evenly between the replicas' Envoys.
    let until = *first.iter().flatten().max().unwrap();
    let recent: Vec<usize> = first
        .iter()
        .map(|a| in_last(a, until, Duration::from_secs(5)))
        .collect();
    assert!(
        recent[0].min(recent[1]) * 2 >= recent[0].max(recent[1]),
        "{recent:?} in the last 5 s"
    );
    let mut all: Vec<Instant> = first.concat();
    all.sort();
    // Twice as much through two replicas would be 20 a second; one token per new Envoy.
    assert_within_bound(&all, 2.0);
    // The second replica restarts (drained: short TTLs, its claim released); its Envoy
    // reconnects to the new process on the same port.
    let old = replicas.pop().unwrap();
    old.terminate();
    drop(old);
    replicas.push(replica(&dir, &redis, ports[1]));
    let until = Instant::now() + Duration::from_secs(15);
    let second = futures_util::future::join_all(fronts.map(|f| hammer(f, "shared", until))).await;
    let recent = in_last(&second[1], until, Duration::from_secs(5));
    assert!(
        recent >= 5,
        "the restarted replica's Envoy gets a share again: {recent}"
    );
    all.extend(second.concat());
    all.sort();
    assert_within_bound(&all, 4.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_envoy_gets_its_share_back_once_the_old_ones_ttl_ends() {
    let sluice = TestServer::start(&[("rq.yaml", RULES)]).await;
    let port = sluice.grpc_addr.port();
    let (first, front) = envoy(port, "{blanket_rule: DENY_ALL}").await;
    let until = Instant::now() + Duration::from_secs(4);
    let mut all = hammer(front, "shared", until).await;
    assert!(all.len() >= 20, "{} admitted", all.len());
    // Envoy dies; its stream's share stays counted until the TTL of what it was sent (10 s),
    // as a live Envoy whose stream broke would still enforce it.
    drop(first);
    let (_second, front) = envoy(port, "{blanket_rule: DENY_ALL}").await;
    let until = Instant::now() + Duration::from_secs(16);
    let again = hammer(front, "shared", until).await;
    let recent = in_last(&again, until, Duration::from_secs(4));
    assert!(
        recent >= 30,
        "the new Envoy holds the budget again: {recent} in 4 s"
    );
    all.extend(again);
    all.sort();
    assert_within_bound(&all, 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_keeps_its_share_across_a_restart_of_sluice() {
    let dir = config_dir("rlqs-restart", &[("rq.yaml", RULES)]);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let sluice = SluiceProcess::spawn(&dir, &["--grpc-addr", &addr]);
    let (_envoy, front) = envoy(port, "{blanket_rule: DENY_ALL}").await;
    let until = Instant::now() + Duration::from_secs(4);
    let mut all = hammer(front, "shared", until).await;
    // A rolling restart: drained (2 s TTLs), then a new process on the same port; Envoy
    // reopens its stream and lists its bucket again.
    sluice.terminate();
    drop(sluice);
    let _sluice = SluiceProcess::spawn(&dir, &["--grpc-addr", &addr]);
    let until = Instant::now() + Duration::from_secs(12);
    let again = hammer(front, "shared", until).await;
    let recent = in_last(&again, until, Duration::from_secs(4));
    assert!(
        recent >= 30,
        "Envoy is served by the new process: {recent} in 4 s"
    );
    all.extend(again);
    all.sort();
    // The new process knows nothing of the old one's shares: it may hand out its burst
    // again (the restart's allowance, at most one burst).
    assert_within_bound(&all, 2.0 + BURST);
}
