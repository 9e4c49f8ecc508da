//! One budget, many Envoys: three Envoy 1.40s with the `rate_limit_quota` filter share one
//! budget within the stated bound, an idle Envoy's share moves to the busy ones; two Sluice
//! replicas on one Redis divide it fleet-wide, also across a replica's restart.

use std::time::{Duration, Instant};

use crate::common::redis::{RedisServer, free_port};
use crate::common::rlqs::{KeepAlive, RULES, call, envoy};
use crate::common::{SluiceProcess, TestServer, config_dir, eventually, http_get};

/// [`RULES`]: 10 per second, a burst of 10.
const RATE: f64 = 10.0;
const BURST: f64 = 10.0;

/// The longest any phase of traffic waits for what it is after.
const PHASE_LIMIT: Duration = Duration::from_secs(40);

/// Requests in bucket `shared` through each of `fronts`, two connections each, until `done`
/// says so of what each front admitted so far (checked every 100 ms; at most
/// [`PHASE_LIMIT`], then the test fails naming `what`): when each admitted one was answered,
/// by front.
async fn hammer_until(
    fronts: &[u16],
    what: &str,
    done: impl Fn(&[Vec<Instant>], Instant) -> bool,
) -> Vec<Vec<Instant>> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = Arc::new(AtomicBool::new(false));
    let admitted: Vec<Arc<parking_lot::Mutex<Vec<Instant>>>> =
        fronts.iter().map(|_| Arc::default()).collect();
    let mut loops = Vec::new();
    for (front, admitted) in fronts.iter().zip(&admitted) {
        for _ in 0..2 {
            let (front, admitted, stop) = (*front, admitted.clone(), stop.clone());
            loops.push(tokio::spawn(async move {
                let mut client = KeepAlive::connect(front).await;
                while !stop.load(Ordering::Relaxed) {
                    if client.call("shared").await == 200 {
                        admitted.lock().push(Instant::now());
                    }
                }
            }));
        }
    }
    let started = Instant::now();
    let snapshot = || -> Vec<Vec<Instant>> {
        admitted
            .iter()
            .map(|a| {
                let mut a = a.lock().clone();
                a.sort();
                a
            })
            .collect()
    };
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if done(&snapshot(), Instant::now()) {
            break;
        }
        assert!(
            started.elapsed() < PHASE_LIMIT,
            "{what}: not within {PHASE_LIMIT:?}; admitted {:?}",
            snapshot().iter().map(Vec::len).collect::<Vec<_>>()
        );
    }
    stop.store(true, Ordering::Relaxed);
    for handle in loops {
        handle.await.unwrap();
    }
    snapshot()
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

/// Every Envoy of `fronts` busy until each has a share (at least 5 admitted in the last
/// 5 s) and `also` holds: what each admitted.
async fn all_busy(
    fronts: &[u16],
    also: impl Fn(&[Vec<Instant>], Instant) -> bool,
) -> Vec<Vec<Instant>> {
    hammer_until(fronts, "every Envoy gets a share", |admitted, now| {
        admitted
            .iter()
            .all(|a| in_last(a, now, Duration::from_secs(5)) >= 5)
            && also(admitted, now)
    })
    .await
}

fn in_last(admitted: &[Instant], until: Instant, t: Duration) -> usize {
    admitted.iter().filter(|at| until - **at <= t).count()
}

/// Whether the Envoys together admitted at least `share` of the rate over the last 2 s.
fn admitting(admitted: &[Vec<Instant>], now: Instant, share: f64) -> bool {
    let recent: usize = admitted
        .iter()
        .map(|a| in_last(a, now, Duration::from_secs(2)))
        .sum();
    recent as f64 >= share * RATE * 2.0
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
    let busy = all_busy(&fronts, |_, _| true).await;
    let mut all: Vec<Instant> = busy.concat();
    all.sort();
    // One token per new Envoy (a bucket cannot start empty).
    assert_within_bound(&all, 3.0);
    // The third goes idle: after a few reports its share has moved to the other two, which
    // admit about the whole rate (at least 90 % of it over 2 s).
    let two = hammer_until(&fronts[..2], "the idle Envoy's share moves", |a, now| {
        admitting(a, now, 0.9)
    })
    .await;
    all.extend(two.concat());
    all.sort();
    assert_within_bound(&all, 3.0);
    // The idle one kept its floor.
    assert_eq!(call(fronts[2], "shared").await, 200);
}

/// A replica on `redis`, its gRPC port `port`.
fn replica(dir: &std::path::Path, redis: &RedisServer, port: u16) -> SluiceProcess {
    let addr = format!("127.0.0.1:{port}");
    SluiceProcess::on_redis(
        dir,
        redis,
        &["--redis-deadline", "2s", "--grpc-addr", &addr],
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
    // Both busy: the budget is divided about evenly between the replicas' Envoys (neither
    // admits twice what the other does over 5 s).
    let first = all_busy(&fronts, |admitted, now| {
        let recent: Vec<usize> = admitted
            .iter()
            .map(|a| in_last(a, now, Duration::from_secs(5)))
            .collect();
        recent[0].min(recent[1]) * 2 >= recent[0].max(recent[1])
    })
    .await;
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
    // Counted over 5 s that start after the old process's assignments (2 s TTLs) ended.
    let restarted = Instant::now();
    let second = hammer_until(
        &fronts,
        "the restarted replica's Envoy gets a share again",
        |a, now| {
            now - restarted >= Duration::from_secs(7)
                && in_last(&a[1], now, Duration::from_secs(5)) >= 5
        },
    )
    .await;
    all.extend(second.concat());
    all.sort();
    assert_within_bound(&all, 4.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_envoy_gets_its_share_back_once_the_old_ones_ttl_ends() {
    let sluice = TestServer::start(&[("rq.yaml", RULES)]).await;
    let port = sluice.grpc_addr.port();
    let (first, front) = envoy(port, "{blanket_rule: DENY_ALL}").await;
    let mut all = hammer_until(&[front], "the first Envoy admits 20", |a, _| {
        a[0].len() >= 20
    })
    .await
    .concat();
    // Envoy dies; its stream's share stays counted until the TTL of what it was sent (10 s),
    // as a live Envoy whose stream broke would still enforce it.
    drop(first);
    let (_second, front) = envoy(port, "{blanket_rule: DENY_ALL}").await;
    let again = hammer_until(
        &[front],
        "the new Envoy holds the budget again",
        |a, now| admitting(a, now, 0.75),
    )
    .await
    .concat();
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
    let mut all = hammer_until(&[front], "Envoy admits 20", |a, _| a[0].len() >= 20)
        .await
        .concat();
    // A rolling restart: drained (2 s TTLs), then a new process on the same port; Envoy
    // reopens its stream and lists its bucket again.
    sluice.terminate();
    drop(sluice);
    let _sluice = SluiceProcess::spawn(&dir, &["--grpc-addr", &addr]);
    // Counted over 2 s that start after the old process's assignments (2 s TTLs) ended.
    let restarted = Instant::now();
    let again = hammer_until(&[front], "Envoy is served by the new process", |a, now| {
        now - restarted >= Duration::from_secs(4) && admitting(a, now, 0.75)
    })
    .await
    .concat();
    all.extend(again);
    all.sort();
    // The new process knows nothing of the old one's shares: it may hand out its burst
    // again (the restart's allowance, at most one burst).
    assert_within_bound(&all, 2.0 + BURST);
}

/// A replica killed with `kill -9` while it holds its part of the budget (issue 42;
/// docs/operations/faults.md): its Envoy keeps enforcing the assignment it last got until its
/// TTL (10 s), then denies (`DENY_ALL`: nothing to reach); its claim stays counted in Redis
/// until it ends, 5 s after that TTL, so the fleet never admits past the bound, and then the
/// survivor's Envoy takes the whole budget. The cost: the dead replica's part, unused from
/// the kill until its claim ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_with_its_claim_keeps_the_bound_and_its_part_returns() {
    let redis = RedisServer::start();
    let dir = config_dir("rlqs-kill", &[("rq.yaml", RULES)]);
    let ports = [free_port(), free_port()];
    let mut replicas = vec![
        replica(&dir, &redis, ports[0]),
        replica(&dir, &redis, ports[1]),
    ];
    let (a, b) = tokio::join!(
        envoy(ports[0], "{blanket_rule: DENY_ALL}"),
        envoy(ports[1], "{blanket_rule: DENY_ALL}"),
    );
    let fronts = [a.1, b.1];
    // Both busy, the budget divided between the replicas.
    let first = all_busy(&fronts, |admitted, now| {
        let recent: Vec<usize> = admitted
            .iter()
            .map(|a| in_last(a, now, Duration::from_secs(5)))
            .collect();
        recent[0].min(recent[1]) * 2 >= recent[0].max(recent[1])
    })
    .await;
    let mut all: Vec<Instant> = first.concat();
    // The second replica dies holding its claim; both Envoys stay busy until the survivor's
    // admits at least 90 % of the whole rate over 2 s.
    let mut dead = replicas.pop().unwrap();
    dead.child.kill().unwrap();
    dead.child.wait().unwrap();
    let killed = Instant::now();
    let second = hammer_until(
        &fronts,
        "the survivor's Envoy takes the dead replica's part",
        |a, now| in_last(&a[0], now, Duration::from_secs(2)) as f64 >= 0.9 * RATE * 2.0,
    )
    .await;
    let whole = Instant::now() - killed;
    let orphan_last = second[1].last().map(|at| *at - killed);
    eprintln!(
        "figures: an RLQS replica killed (kill -9): the survivor's Envoy admits the whole rate {whole:.1?} after the kill; the dead replica's Envoy admitted {} more, the last {orphan_last:.1?} after the kill",
        second[1].len()
    );
    // The dead replica's Envoy enforced what it held, for at most its TTL (and a report).
    assert!(
        orphan_last.is_none_or(|t| t <= Duration::from_secs(11)),
        "{orphan_last:?}"
    );
    // The part came back only once the dead claim could have ended (the TTL and 5 s).
    assert!(whole >= Duration::from_secs(10), "{whole:?}");
    all.extend(second.concat());
    all.sort();
    assert_within_bound(&all, 2.0);
}
