// Why one long file: one contract, run against every store; split, the stores could drift apart.
//! One contract for every store: the memory store, Redis, and a three-master Redis Cluster
//! answer the same batches the same way (DESIGN §3–§5). Redis cases run against real
//! redis-server processes started by the tests.

use std::sync::Arc;

use crate::common::counters;
use crate::common::eventually_blocking;
use crate::common::redis::{RedisCluster, RedisServer, command_calls};
use sluice::algorithm::{Algorithm, Limit, SECOND};
use sluice::clock::{Clock, ManualClock, SystemClock};
use sluice::store::memory::MemoryOptions;
use sluice::store::redis::{RedisKind, RedisOptions};
use sluice::store::{Admission, Applied, Batch, CounterOp, MemoryStore, RedisStore, Role, Store};

const HOUR: u64 = 3600 * SECOND;

fn limit(requests: u64) -> Limit {
    Limit::new(requests, HOUR, Algorithm::FixedWindow)
}

/// A namespace per test, so tests share servers without sharing counters.
fn namespace(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{test}-{}-{nanos}", std::process::id())
}

fn op(ns: &str, name: &str, requests: u64, hits: i64, role: Role) -> CounterOp {
    counters::op(ns, [("k", name)], limit(requests), hits, role)
}

async fn apply(store: &dyn Store, ops: Vec<CounterOp>) -> Applied {
    store.apply(&counters::batch(ops)).await.unwrap()
}

/// Remaining budget of a counter, without charging it.
async fn remaining(store: &dyn Store, ns: &str, name: &str, requests: u64) -> u64 {
    apply(store, vec![op(ns, name, requests, 0, Role::Enforce)])
        .await
        .decisions[0]
        .remaining
}

// === the contract ===

async fn admits_exactly_the_limit(store: &dyn Store) {
    let ns = namespace("exact");
    let mut remaining = Vec::new();
    for _ in 0..7 {
        let applied = apply(store, vec![op(&ns, "a", 5, 1, Role::Enforce)]).await;
        remaining.push((applied.admitted, applied.decisions[0].remaining));
    }
    assert_eq!(
        remaining,
        [
            (true, 4),
            (true, 3),
            (true, 2),
            (true, 1),
            (true, 0),
            (false, 0),
            (false, 0)
        ]
    );
    let rejected = apply(store, vec![op(&ns, "a", 5, 1, Role::Enforce)])
        .await
        .decisions[0];
    let retry = rejected.retry_after.unwrap();
    assert!(retry > 0 && retry <= HOUR, "{retry}");
    assert_eq!(rejected.reset_after, retry);
}

async fn a_rejected_batch_charges_nothing(store: &dyn Store) {
    let ns = namespace("nothing");
    let applied = apply(
        store,
        vec![
            op(&ns, "a", 5, 1, Role::Enforce),
            op(&ns, "closed", 0, 1, Role::Enforce),
        ],
    )
    .await;
    assert!(!applied.admitted);
    assert!(applied.decisions[0].allowed && !applied.decisions[1].allowed);
    assert_eq!(remaining(store, &ns, "a", 5).await, 5);
}

async fn many_counters_are_all_or_nothing(store: &dyn Store) {
    // Ten counters spread over Cluster slots; the last one is full.
    let ns = namespace("spread");
    apply(store, vec![op(&ns, "full", 1, 1, Role::Enforce)]).await;
    let mut ops: Vec<CounterOp> = (0..10)
        .map(|i| op(&ns, &format!("c{i}"), 3, 1, Role::Enforce))
        .collect();
    ops.push(op(&ns, "full", 1, 1, Role::Enforce));
    assert!(!apply(store, ops).await.admitted);
    for i in 0..10 {
        assert_eq!(
            remaining(store, &ns, &format!("c{i}"), 3).await,
            3,
            "counter c{i}"
        );
    }
}

async fn one_counter_twice_in_a_batch(store: &dyn Store) {
    let ns = namespace("twice");
    let applied = apply(
        store,
        vec![
            op(&ns, "a", 3, 2, Role::Enforce),
            op(&ns, "a", 3, 2, Role::Enforce),
        ],
    )
    .await;
    assert!(applied.decisions[0].allowed);
    assert!(!applied.decisions[1].allowed);
    assert_eq!(applied.decisions[1].remaining, 1);
    assert!(!applied.admitted);
    assert_eq!(remaining(store, &ns, "a", 3).await, 3);
}

async fn refunds_never_exceed_the_limit(store: &dyn Store) {
    let ns = namespace("refund");
    apply(store, vec![op(&ns, "a", 5, 3, Role::Enforce)]).await;
    let refund = apply(store, vec![op(&ns, "a", 5, -2, Role::Enforce)]).await;
    assert!(refund.admitted);
    assert_eq!(refund.decisions[0].remaining, 4);
    apply(store, vec![op(&ns, "a", 5, -100, Role::Enforce)]).await;
    assert_eq!(remaining(store, &ns, "a", 5).await, 5);
}

async fn refunds_apply_even_in_a_rejected_batch(store: &dyn Store) {
    let ns = namespace("refund-rejected");
    apply(store, vec![op(&ns, "a", 5, 3, Role::Enforce)]).await;
    let applied = apply(
        store,
        vec![
            op(&ns, "a", 5, -1, Role::Enforce),
            op(&ns, "closed", 0, 1, Role::Enforce),
        ],
    )
    .await;
    assert!(!applied.admitted);
    assert_eq!(remaining(store, &ns, "a", 5).await, 3);
}

async fn zero_hits_peek(store: &dyn Store) {
    let ns = namespace("peek");
    apply(store, vec![op(&ns, "a", 2, 2, Role::Enforce)]).await;
    let peek = apply(store, vec![op(&ns, "a", 2, 0, Role::Enforce)]).await;
    assert!(peek.admitted && peek.decisions[0].allowed);
    assert_eq!(peek.decisions[0].remaining, 0);
    assert!(
        !apply(store, vec![op(&ns, "a", 2, 1, Role::Enforce)])
            .await
            .admitted
    );
}

async fn shadow_and_quota_roles(store: &dyn Store) {
    let ns = namespace("roles");
    let shadow_over = apply(
        store,
        vec![
            op(&ns, "s", 0, 1, Role::Shadow),
            op(&ns, "e", 5, 1, Role::Enforce),
        ],
    )
    .await;
    assert!(shadow_over.admitted);
    assert!(!shadow_over.decisions[0].allowed);
    assert_eq!(remaining(store, &ns, "e", 5).await, 4);

    let one_quota_left = apply(
        store,
        vec![
            op(&ns, "q0", 0, 1, Role::Quota),
            op(&ns, "q1", 5, 1, Role::Quota),
        ],
    )
    .await;
    assert!(one_quota_left.admitted);
    let all_quota_over = apply(
        store,
        vec![
            op(&ns, "q0", 0, 1, Role::Quota),
            op(&ns, "q2", 0, 1, Role::Quota),
            op(&ns, "e", 5, 1, Role::Enforce),
        ],
    )
    .await;
    assert!(!all_quota_over.admitted);
    assert_eq!(remaining(store, &ns, "e", 5).await, 4);
}

async fn always_admit_charges_what_fits(store: &dyn Store) {
    let ns = namespace("always");
    let applied = store
        .apply(&Batch {
            ops: vec![
                op(&ns, "closed", 0, 1, Role::Enforce),
                op(&ns, "a", 5, 1, Role::Enforce),
            ],
            admission: Admission::Always,
            deadline: None,
            charged_at: None,
        })
        .await
        .unwrap();
    assert!(applied.admitted);
    assert!(!applied.decisions[0].allowed);
    assert_eq!(remaining(store, &ns, "a", 5).await, 4);
}

async fn never_admit_decides_with_the_hits_and_charges_nothing(store: &dyn Store) {
    let ns = namespace("never");
    let applied = store
        .apply(&Batch {
            ops: vec![
                op(&ns, "a", 5, 2, Role::Enforce),
                op(&ns, "b", 5, 6, Role::Enforce),
            ],
            admission: Admission::Never,
            deadline: None,
            charged_at: None,
        })
        .await
        .unwrap();
    assert!(!applied.admitted);
    // Decided as with the usual rule: 2 of 5 fit (3 would be left), 6 do not.
    assert!(applied.decisions[0].allowed);
    assert_eq!(applied.decisions[0].remaining, 3);
    assert!(!applied.decisions[1].allowed);
    assert_eq!(remaining(store, &ns, "a", 5).await, 5);
    assert_eq!(remaining(store, &ns, "b", 5).await, 5);
}

async fn more_hits_than_the_limit_never_pass(store: &dyn Store) {
    let ns = namespace("huge");
    let applied = apply(store, vec![op(&ns, "a", 5, 6, Role::Enforce)]).await;
    assert!(!applied.admitted);
    assert_eq!(applied.decisions[0].retry_after, None);
    assert_eq!(applied.decisions[0].remaining, 5);
}

async fn windows_end_on_unit_boundaries(store: &dyn Store, clock: &ManualClock) {
    let ns = namespace("window");
    let second = Limit {
        overdraft: false,
        requests: 1,
        window: SECOND,
        algorithm: Algorithm::FixedWindow,
        burst: 1,
    };
    let one = || counters::op(&ns, [("k", "s")], second, 1, Role::Enforce);
    let first = apply(store, vec![one()]).await;
    let reset = first.decisions[0].reset_after;
    assert!(reset > 0 && reset <= SECOND, "{reset}");
    // The next second: the counter starts again from zero.
    clock.advance(reset + 20_000);
    assert!(apply(store, vec![one()]).await.admitted);
}

/// Every case on `store`, whose time is `clock` (Redis's script included: the servers' tests
/// cover its own `TIME`).
async fn run_all(store: &dyn Store, clock: &ManualClock) {
    admits_exactly_the_limit(store).await;
    a_rejected_batch_charges_nothing(store).await;
    many_counters_are_all_or_nothing(store).await;
    one_counter_twice_in_a_batch(store).await;
    refunds_never_exceed_the_limit(store).await;
    refunds_apply_even_in_a_rejected_batch(store).await;
    zero_hits_peek(store).await;
    shadow_and_quota_roles(store).await;
    always_admit_charges_what_fits(store).await;
    never_admit_decides_with_the_hits_and_charges_nothing(store).await;
    more_hits_than_the_limit_never_pass(store).await;
    windows_end_on_unit_boundaries(store, clock).await;
}

/// A manual clock that starts at the wall clock's time.
fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(SystemClock.now()))
}

// === the stores ===

fn redis_options(url: String, kind: RedisKind) -> RedisOptions {
    RedisOptions {
        key_prefix: "contract:".into(),
        ..RedisOptions::new(url, kind)
    }
}

#[tokio::test]
async fn memory_store_keeps_the_contract() {
    let clock = clock();
    let store = MemoryStore::new(MemoryOptions::default(), clock.clone());
    run_all(&store, &clock).await;
}

#[tokio::test]
async fn redis_store_keeps_the_contract() {
    let redis = RedisServer::start();
    let clock = clock();
    let store = RedisStore::new(&redis_options(redis.url(), RedisKind::Single))
        .unwrap()
        .with_clock(clock.clone());
    run_all(&store, &clock).await;
    // One script call per request: the contract above sends 40-odd requests.
    let stats = redis.command(&["INFO", "commandstats"]);
    assert!(
        !stats.contains("cmdstat_get:"),
        "counters are read by the script only: {stats}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_store_keeps_the_contract() {
    let cluster = RedisCluster::start();
    let clock = clock();
    let store = RedisStore::new(&redis_options(cluster.url(), RedisKind::Cluster))
        .unwrap()
        .with_clock(clock.clone());
    run_all(&store, &clock).await;
}

#[tokio::test]
async fn redis_reloads_its_script_after_a_restart() {
    let mut redis = RedisServer::start();
    let store = RedisStore::new(&redis_options(redis.url(), RedisKind::Single)).unwrap();
    let ns = namespace("restart");
    assert!(
        apply(&store, vec![op(&ns, "a", 5, 1, Role::Enforce)])
            .await
            .admitted
    );
    redis.restart();
    // The first call after the restart may fail while the connection is remade; then the
    // script is loaded again (NOSCRIPT → EVAL) and counting starts from an empty server.
    let batch = counters::batch(vec![op(&ns, "a", 5, 1, Role::Enforce)]);
    let answered = std::cell::RefCell::new(None);
    crate::common::eventually("redis answers again after a restart", || async {
        match store.apply(&batch).await {
            Ok(applied) => *answered.borrow_mut() = Some(applied),
            Err(e) => assert!(e.is_transient(), "{e}"),
        }
        answered.borrow().is_some()
    })
    .await;
    assert_eq!(answered.into_inner().unwrap().decisions[0].remaining, 4);
}

#[tokio::test]
async fn redis_reads_a_value_it_cannot_parse_as_no_state() {
    let redis = RedisServer::start();
    let store = RedisStore::new(&redis_options(redis.url(), RedisKind::Single)).unwrap();
    let ns = namespace("garbage");
    // Someone wrote over a counter (another tool, a key collision): the counter starts over
    // instead of failing every request on it.
    let key = op(&ns, "a", 5, 1, Role::Enforce).key;
    redis.command(&[
        "SET",
        &format!("contract:{}", key.as_str()),
        "not a counter",
    ]);
    let applied = apply(&store, vec![op(&ns, "a", 5, 1, Role::Enforce)]).await;
    assert!(applied.admitted);
    assert_eq!(applied.decisions[0].remaining, 4);
    assert_eq!(remaining(&store, &ns, "a", 5).await, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_sends_the_calls_of_one_request_together() {
    let cluster = RedisCluster::start();
    let store =
        Arc::new(RedisStore::new(&redis_options(cluster.url(), RedisKind::Cluster)).unwrap());
    let ns = namespace("together");
    // `redis-cli --cluster create` gives the first node slots 0-5460 and the last
    // 10923-16383: a counter on each, the first node's in the lower slot (sent first when
    // calls go one after the other).
    let slot = |name: &str| -> u16 {
        let key = format!(
            "contract:{}",
            op(&ns, name, 5, 1, Role::Enforce).key.as_str()
        );
        let reply = cluster.nodes[0].command(&["CLUSTER", "KEYSLOT", &key]);
        reply.trim().trim_start_matches(':').parse().unwrap()
    };
    let names: Vec<String> = (0..200).map(|i| format!("c{i}")).collect();
    let first = names.iter().find(|n| slot(n) <= 5460).unwrap().clone();
    let last = names.iter().find(|n| slot(n) >= 10923).unwrap().clone();
    let ops = move || {
        vec![
            op(&ns, &first, 5, 1, Role::Enforce),
            op(&ns, &last, 5, 1, Role::Enforce),
        ]
    };
    // Connections made and the script loaded on both nodes.
    assert!(apply(store.as_ref(), ops()).await.admitted);
    let before = command_calls(&cluster.nodes[2], "evalsha");

    cluster.nodes[0].pause();
    let request = tokio::spawn({
        let (store, ops) = (store.clone(), ops());
        async move { apply(store.as_ref(), ops).await }
    });
    // The last node gets its call while the first cannot answer (this blocks one of the two
    // runtime threads; the request runs on the other).
    eventually_blocking(
        "the last node's call while the first node is paused",
        || command_calls(&cluster.nodes[2], "evalsha") > before,
    );
    cluster.nodes[0].resume();
    assert!(request.await.unwrap().admitted);
}
