//! The network to Redis black-holed, slowed, reset, cut one way; Redis restarted empty;
//! `failure_mode: local` through a black hole.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Sent, check, drive, fleet_behind, fleet_behind_with};
use crate::common::faultproxy::{Fault, FaultProxy};
use crate::common::redis::RedisServer;

/// `fault` on the network to Redis for 1.5 s under load (20 keys of 30 a day, 300 requests a
/// second over three instances, failure_mode deny, a 200 ms deadline): no key admitted past
/// its limit, every answer within the deadline plus scheduling slack, no error, and counting
/// back within `recovery` of the heal. The history shows the fault happened: requests sent
/// while it lasted were denied by the failure mode (no key was at its limit yet). Prints the
/// figures (docs/operations/faults.md).
async fn network_fault(name: &str, fault: Fault, recovery_bound: Duration) {
    let redis = RedisServer::start();
    let upstream: std::net::SocketAddr = format!("127.0.0.1:{}", redis.port).parse().unwrap();
    let proxy = FaultProxy::start(upstream).await;
    let (_instances, clients) = fleet_behind(&proxy, "deny", "200ms", 30).await;
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    let (fault_from, fault_to) = (Duration::from_millis(1000), Duration::from_millis(2500));
    let history = drive(&clients, "f", &keys, 300, Duration::from_secs(4), |now| {
        proxy.set(if now >= fault_from && now < fault_to {
            fault
        } else {
            Fault::None
        });
    })
    .await;
    let verdict = check(&history);
    // Never over: the store's count and the failure mode's denials.
    for (key, admitted) in &verdict.admitted {
        assert!(
            *admitted <= 30,
            "{key}: {admitted} admitted on a limit of 30"
        );
    }
    assert_eq!(verdict.errors, 0, "{history:?}");
    // The fault happened: requests sent during it were denied (the limits were not reached
    // yet: each key had had at most a few dozen requests by then). Not those sent within a
    // deadline (200 ms) of either edge: one sent just before the heal is answered by Redis
    // if its bytes arrive in time.
    let margin = Duration::from_millis(300);
    let during: Vec<&Sent> = history
        .iter()
        .filter(|s| s.at >= fault_from + margin && s.at + margin < fault_to)
        .collect();
    assert!(!during.is_empty());
    assert!(
        during.iter().all(|s| s.answer == "OVER_LIMIT"),
        "answers during {name}: {:?}",
        during.iter().map(|s| &s.answer).collect::<Vec<_>>()
    );
    // Counting again after the heal: keys still under their limit were admitted.
    let healed = history
        .iter()
        .filter(|s| s.at >= fault_to && s.answer == "OK")
        .map(|s| s.at - fault_to)
        .min();
    let recovery = healed.expect("nothing admitted after the heal");
    let counted: u64 = verdict.admitted.values().sum();
    eprintln!(
        "figures: {name} for 1.5 s: admitted max {} of 30 a key ({counted} in all), slowest answer {:?}, recovery {:?}",
        verdict.admitted.values().max().unwrap_or(&0),
        verdict.slowest,
        recovery
    );
    assert!(recovery < recovery_bound, "recovery {recovery:?}");
    // Every answer within the deadline and the time a debug build under load takes to be
    // scheduled (the deadline is 200 ms).
    assert!(
        verdict.slowest < Duration::from_millis(1500),
        "{:?}",
        verdict.slowest
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_redis_under_load_never_over_admits_and_answers_within_the_deadline() {
    network_fault("a black hole", Fault::BlackHole, Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_slowed_past_the_deadline_never_over_admits() {
    let past = Duration::from_millis(400);
    network_fault(
        "400 ms of added latency",
        Fault::Delay(past),
        Duration::from_secs(1),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_to_redis_reset_never_over_admit() {
    network_fault("resets", Fault::Reset, Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_cut_one_way_never_over_admits() {
    network_fault(
        "a cut towards Redis",
        Fault::CutToRedis,
        Duration::from_secs(1),
    )
    .await;
    network_fault(
        "a cut from Redis",
        Fault::CutFromRedis,
        Duration::from_secs(1),
    )
    .await;
}

/// Redis restarted empty (no persistence) under load, each key half way to its limit: the
/// counts are erased, and each key is admitted again up to its limit; never more than the
/// limit plus what was erased (the documented cost of losing the store's memory), no error.
/// (A key already refused is not: the over-limit cache answers it until its window ends.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_empty_costs_at_most_the_erased_count() {
    let mut redis = RedisServer::start();
    let upstream: std::net::SocketAddr = format!("127.0.0.1:{}", redis.port).parse().unwrap();
    let proxy = FaultProxy::start(upstream).await;
    let (_instances, clients) = fleet_behind(&proxy, "deny", "200ms", 30).await;
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    let restart_at = Duration::from_millis(1000);
    let mut restarted = None;
    let history = drive(&clients, "f", &keys, 300, Duration::from_secs(5), |now| {
        if now >= restart_at && restarted.is_none() {
            restarted = Some(now);
            redis.restart();
        }
    })
    .await;
    // What was counted before the kill: the requests sent before it (a request sent then and
    // counted after the restart only makes the bound looser).
    let killed = restarted.expect("restarted");
    let before = check(
        &history
            .iter()
            .filter(|s| s.at < killed)
            .cloned()
            .collect::<Vec<_>>(),
    );
    let all = check(&history);
    assert_eq!(all.errors, 0);
    let mut over = 0;
    for (key, admitted) in &all.admitted {
        let erased = before.admitted.get(key).copied().unwrap_or(0);
        assert!(
            *admitted <= 30 + erased,
            "{key}: {admitted} admitted, limit 30 plus {erased} erased"
        );
        over = over.max(admitted.saturating_sub(30));
    }
    // The fault happened: keys counted before the restart were admitted past their limit
    // after it.
    assert!(
        before.admitted.values().all(|&a| a > 0),
        "{:?}",
        before.admitted
    );
    assert!(over > 0, "no key admitted past its limit after the restart");
    eprintln!(
        "figures: Redis restarted without persistence: admitted max {} of 30 a key ({} over), erased at most {} a key",
        all.admitted.values().max().unwrap_or(&0),
        over,
        before.admitted.values().max().unwrap_or(&0)
    );
}

/// `failure_mode: local` through a black hole: while Redis does not answer, each of the three
/// instances admits at most its share of the limit per key (30 / FAILURE_MODE_LOCAL_INSTANCES
/// = 10), counted in its own memory; over the window a key is admitted at most the limit plus
/// what the instances admitted locally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_hole_under_failure_mode_local_admits_each_instance_its_share() {
    let redis = RedisServer::start();
    let upstream: std::net::SocketAddr = format!("127.0.0.1:{}", redis.port).parse().unwrap();
    let proxy = FaultProxy::start(upstream).await;
    let args = [
        "--failure-mode",
        "local",
        "--failure-mode-local-instances",
        "3",
        "--redis-deadline",
        "200ms",
    ];
    let (_instances, clients) = fleet_behind_with(&proxy, &args, 30).await;
    // Few requests before the fault, so that no key is at its limit when it starts.
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    let (fault_from, fault_to) = (Duration::from_millis(500), Duration::from_millis(2500));
    let history = drive(&clients, "f", &keys, 300, Duration::from_secs(3), |now| {
        proxy.set(if now >= fault_from && now < fault_to {
            Fault::BlackHole
        } else {
            Fault::None
        });
    })
    .await;
    assert_eq!(check(&history).errors, 0);
    // Admitted during the fault, per key and instance: `inner`, away from its edges by more
    // than the deadline (surely answered from the instance's memory), checked against the
    // share; `around`, the whole fault and a deadline after (every admission that may have
    // been local), for the bound over the window.
    let margin = Duration::from_millis(300);
    let admitted_in = |from: Duration, to: Duration| {
        let mut by: BTreeMap<(String, usize), u64> = BTreeMap::new();
        for s in history
            .iter()
            .filter(|s| s.at >= from && s.at < to && s.answer == "OK")
        {
            *by.entry((s.key.clone(), s.instance)).or_default() += 1;
        }
        by
    };
    let inner = admitted_in(fault_from + margin, fault_to - margin);
    let around = admitted_in(fault_from, fault_to + margin);
    for ((key, instance), admitted) in &inner {
        assert!(
            *admitted <= 10,
            "{key} on instance {instance}: {admitted} admitted locally, its share is 10"
        );
    }
    // The fault happened: the instances admitted from their own memory, up to their shares.
    let most = inner.values().max().copied().unwrap_or(0);
    assert!(most >= 2, "local admissions during the fault: {inner:?}");
    let local = around;
    let all = check(&history);
    for (key, admitted) in &all.admitted {
        let locally: u64 = local
            .iter()
            .filter(|((k, _), _)| k == key)
            .map(|(_, n)| n)
            .sum();
        assert!(
            *admitted <= 30 + locally,
            "{key}: {admitted} admitted, 30 + {locally} locally"
        );
    }
    eprintln!(
        "figures: a black hole under failure_mode local for 2 s: admitted max {} of 30 a key, at most {most} of a share of 10 on one instance",
        all.admitted.values().max().unwrap_or(&0)
    );
}

/// Redis killed (`kill -9`) and restarted under load with an append-only file (`appendonly
/// yes`, `appendfsync` `fsync`), each key half way to its limit: the restarted Redis loads
/// every count it acknowledged (a process killed loses nothing its kernel received; `everysec`
/// loses up to a second only when the machine itself fails), so no key is admitted past its
/// limit; the failure mode answers while Redis is down and loading; no error.
async fn restarted_with_persistence(fsync: &str) {
    let mut redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", fsync]);
    let upstream: std::net::SocketAddr = format!("127.0.0.1:{}", redis.port).parse().unwrap();
    let proxy = FaultProxy::start(upstream).await;
    let (_instances, clients) = fleet_behind(&proxy, "deny", "200ms", 30).await;
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    let restart_at = Duration::from_millis(1000);
    let mut restarted = None;
    let history = drive(&clients, "f", &keys, 300, Duration::from_secs(5), |now| {
        if now >= restart_at && restarted.is_none() {
            restarted = Some(now);
            redis.restart();
        }
    })
    .await;
    let killed = restarted.expect("restarted");
    let all = check(&history);
    assert_eq!(all.errors, 0);
    // The fault happened: counts made before the kill are in the restarted Redis (its keys
    // exist), and every key was taken to its limit after it.
    let before = check(
        &history
            .iter()
            .filter(|s| s.at < killed)
            .cloned()
            .collect::<Vec<_>>(),
    );
    assert!(
        before.admitted.values().all(|&a| a > 0 && a < 30),
        "{:?}",
        before.admitted
    );
    // Never over; and taken to its limit, less a request in flight at the kill that Redis
    // counted but whose answer the failure mode gave (one a key at most, measured once in
    // CI on a loaded machine).
    assert!(
        all.admitted.values().all(|&a| (29..=30).contains(&a)),
        "{:?}",
        all.admitted
    );
    eprintln!(
        "figures: Redis killed and restarted with appendfsync {fsync}: admitted max {} of 30 a key (0 over), at most {} a key counted before the kill",
        all.admitted.values().max().unwrap_or(&0),
        before.admitted.values().max().unwrap_or(&0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_with_an_append_only_file_keeps_every_count() {
    restarted_with_persistence("always").await;
    restarted_with_persistence("everysec").await;
}

/// The network to Redis flapping: black-holed for 200 ms, then open for 200 ms, for 2 s under
/// load (the fleet and load of [`network_fault`], keys of 45 a day, each sent 90): never over
/// the limit, no error, every
/// answer within the deadline plus scheduling, and counting again after the last heal. The
/// fault happened: some requests were answered by the failure mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_network_to_redis_never_over_admits() {
    let redis = RedisServer::start();
    let upstream: std::net::SocketAddr = format!("127.0.0.1:{}", redis.port).parse().unwrap();
    let proxy = FaultProxy::start(upstream).await;
    let (_instances, clients) = fleet_behind(&proxy, "deny", "200ms", 45).await;
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    let (from, to) = (Duration::from_millis(500), Duration::from_millis(2500));
    // (6 s: after the last heal, 3.5 s of 15 requests a second a key, enough to reach the
    // limit even when every request of the flapping is denied, as on a loaded machine whose
    // connection did not recover within the 200 ms up.)
    let history = drive(&clients, "f", &keys, 300, Duration::from_secs(6), |now| {
        let flapping = now >= from && now < to;
        let down = flapping && ((now - from).as_millis() / 200) % 2 == 0;
        proxy.set(if down { Fault::BlackHole } else { Fault::None });
    })
    .await;
    let verdict = check(&history);
    assert_eq!(verdict.errors, 0);
    assert!(
        verdict.admitted.values().all(|&a| a <= 45),
        "{:?}",
        verdict.admitted
    );
    let refused = super::refused_under(&history, 45, 5);
    assert!(!refused.is_empty(), "nothing answered by the failure mode");
    let recovery = history
        .iter()
        .filter(|s| s.at >= to && s.answer == "OK")
        .map(|s| s.at - to)
        .min()
        .expect("nothing admitted after the flapping");
    eprintln!(
        "figures: a flapping network (200 ms down, 200 ms up) for 2 s: admitted max {} of 45 a key ({} in all), {} refused short of the limit, slowest answer {:?}, recovery {recovery:?}",
        verdict.admitted.values().max().unwrap_or(&0),
        verdict.admitted.values().sum::<u64>(),
        refused.len(),
        verdict.slowest
    );
    assert!(
        verdict.slowest < Duration::from_millis(1500),
        "{:?}",
        verdict.slowest
    );
    // The bound was put to the test: keys reached their limit after the flapping, as Redis
    // counts it. (Admitted, a key may end below 45: hits Redis counted when the held bytes
    // were delivered, after the failure mode had denied them; under load one to three a key,
    // and in CI runs no key was admitted 45 times.) A second after the last heal the network
    // is fine: a refusal then is the store's.
    let settled = to + Duration::from_secs(1);
    assert!(
        recovery < settled - to,
        "counting again only {recovery:?} after the heal"
    );
    let at_limit: std::collections::BTreeSet<&str> = history
        .iter()
        .filter(|s| s.at >= settled && s.answer == "OVER_LIMIT")
        .map(|s| s.key.as_str())
        .collect();
    assert!(
        !at_limit.is_empty(),
        "no key refused by the store after the flapping: {:?}",
        verdict.admitted
    );
}
