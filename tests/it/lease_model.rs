//! The lease protocol on its memory-backed model: several leasing instances ([`Leased`])
//! over one shared [`MemoryStore`] standing for Redis (the same algorithms, the same lease
//! arithmetic), on a pinned clock, with random traffic (proptest; failures are persisted
//! under `proptest-regressions/` and replayed).
//!
//! - never more than the limit: per window (fixed and sliding windows), and never more than
//!   `burst + rate * t` over any interval (token bucket), whatever the instances, their
//!   concurrency and the hits per request;
//! - bounded under: once every instance has been refused, the fleet admitted exactly the
//!   limit (every unit taken from the shared counter was admitted or is still held; a refused
//!   instance holds none);
//! - a store wiped under blocks (flushed, restarted empty) costs what it costs exact
//!   counting, the erased count (the learning rule);
//! - refused requests put their units back in the block; hand-backs at a lease period's end
//!   and at shutdown reach the shared counter; near the limit blocks shrink to one unit.
//!
//! The Redis script's half of the same protocol is checked against a real Redis in
//! `tests/it/redis_lease.rs`.

use std::sync::Arc;
use std::time::Duration;

use crate::common::counters::{self, batch, limit};
use futures_util::future::join_all;
use proptest::prelude::*;
use sluice::algorithm::{Algorithm, Limit, Micros, SECOND};
use sluice::clock::{Clock, ManualClock};
use sluice::store::lease::LeaseOptions;
use sluice::store::memory::MemoryOptions;
use sluice::store::{
    Applied, Batch, BoxFuture, Consistency, CounterOp, Grant, LeaseAsk, Leased, MemoryStore, Role,
    Shared, Store, StoreError, StoreStatus,
};

const START: Micros = 1_700_000_040 * SECOND;
const DAY: Micros = 86_400 * SECOND;

/// The shared store, answering after a yield: requests in flight together interleave at
/// every store call, as they do over a network.
struct Remote(MemoryStore);

impl Store for Remote {
    fn apply<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<Applied, StoreError>> {
        Box::pin(async move {
            tokio::task::yield_now().await;
            self.0.apply(batch).await
        })
    }
    fn reset<'a>(&'a self, ops: &'a [CounterOp]) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.0.reset(ops)
    }
    fn shut_down(&self) -> BoxFuture<'_, ()> {
        self.0.shut_down()
    }
    fn status(&self) -> StoreStatus {
        self.0.status()
    }
}

impl Shared for Remote {
    fn lease<'a>(&'a self, asks: &'a [LeaseAsk]) -> BoxFuture<'a, Result<Vec<Grant>, StoreError>> {
        Box::pin(async move {
            tokio::task::yield_now().await;
            self.0.lease(asks).await
        })
    }
    fn instances<'a>(
        &'a self,
        instance: &'a str,
        within: Duration,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.0.instances(instance, within)
    }
    fn pool<'a>(
        &'a self,
        ops: &'a [sluice::store::PoolOp],
    ) -> BoxFuture<'a, Result<Vec<sluice::store::PoolAnswer>, StoreError>> {
        self.0.pool(ops)
    }
    fn claim<'a>(
        &'a self,
        asks: &'a [sluice::store::ClaimAsk],
    ) -> BoxFuture<'a, Result<Vec<sluice::store::ClaimGrant>, StoreError>> {
        self.0.claim(asks)
    }
    fn add_refused<'a>(
        &'a self,
        adds: &'a [sluice::store::RefusedAdd],
    ) -> BoxFuture<'a, Result<Vec<u32>, StoreError>> {
        self.0.add_refused(adds)
    }
    fn close_refused<'a>(
        &'a self,
        closes: &'a [sluice::store::RefusedClose],
    ) -> BoxFuture<'a, Result<Vec<sluice::store::RefusedCounts>, StoreError>> {
        self.0.close_refused(closes)
    }
}

struct Fleet {
    clock: Arc<ManualClock>,
    store: Arc<Remote>,
    instances: Vec<Arc<Leased>>,
}

fn fleet(n: usize, period: Duration) -> Fleet {
    let clock = Arc::new(ManualClock::new(START));
    let store = Arc::new(Remote(MemoryStore::new(
        MemoryOptions::default(),
        clock.clone(),
    )));
    let instances = (0..n)
        .map(|i| {
            let options = LeaseOptions {
                period,
                instance: format!("instance-{i}"),
                ..LeaseOptions::default()
            };
            Arc::new(Leased::new(store.clone(), options, clock.clone()))
        })
        .collect();
    Fleet {
        clock,
        store,
        instances,
    }
}

fn op(limit: &Limit, key: &str, hits: i64, consistency: Consistency) -> CounterOp {
    CounterOp {
        consistency,
        ..counters::op("model", [("key", key)], *limit, hits, Role::Enforce)
    }
}

/// `hits` on the hot key through `instance`: whether admitted.
async fn hit(instance: &Leased, limit: &Limit, hits: i64) -> bool {
    let applied = instance
        .apply(&batch(vec![op(limit, "hot", hits, Consistency::Leased)]))
        .await
        .unwrap();
    applied.admitted
}

/// Hits `instance` one at a time until it refuses; returns the hits admitted.
async fn drain(instance: &Leased, limit: &Limit) -> u64 {
    let mut admitted = 0;
    while hit(instance, limit, 1).await {
        admitted += 1;
        assert!(
            admitted <= limit.requests.max(limit.burst),
            "more than the limit"
        );
    }
    admitted
}

/// One wave: `concurrency` requests of `hits` at once on one instance, after `gap`.
#[derive(Debug, Clone, Copy)]
struct Wave {
    instance: usize,
    gap: Micros,
    concurrency: usize,
    hits: i64,
}

fn waves(instances: usize, window: Micros) -> impl Strategy<Value = Vec<Wave>> {
    let wave = (
        0..instances,
        prop_oneof![4 => Just(0u64), 4 => 0..window / 8, 1 => 0..2 * window],
        prop_oneof![2 => Just(1usize), 2 => 2usize..16, 1 => 16usize..64],
        prop_oneof![8 => Just(1i64), 2 => 2i64..=4],
    )
        .prop_map(|(instance, gap, concurrency, hits)| Wave {
            instance,
            gap,
            concurrency,
            hits,
        });
    proptest::collection::vec(wave, 1..60)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `waves` on a fleet of `n`; returns each admitted charge as (time, hits).
fn run(limit: Limit, n: usize, period: Duration, waves: &[Wave]) -> Vec<(Micros, u64)> {
    runtime().block_on(async {
        let fleet = fleet(n, period);
        let mut admitted = Vec::new();
        for wave in waves {
            // Lease periods end on this clock: in the requests' path, or when a sweeper
            // (every quarter period of real time) looks.
            fleet.clock.advance(wave.gap);
            let instance = &fleet.instances[wave.instance];
            let answers =
                join_all((0..wave.concurrency).map(|_| hit(instance, &limit, wave.hits))).await;
            let now = fleet.clock.now();
            let ok = answers.iter().filter(|a| **a).count() as u64;
            if ok > 0 {
                admitted.push((now, ok * wave.hits as u64));
            }
        }
        admitted
    })
}

/// [`run`] with the shared store wiped (every counter and its epoch forgotten, as Redis
/// flushed or restarted empty) before wave `wipe`, and each instance's sweeper run before
/// every wave (it runs every quarter lease period): each admitted charge as (time, hits,
/// whether before the wipe).
fn run_wiped(limit: Limit, n: usize, waves: &[Wave], wipe: usize) -> Vec<(Micros, u64, bool)> {
    runtime().block_on(async {
        let fleet = fleet(n, Duration::from_secs(1));
        let mut admitted = Vec::new();
        for (i, wave) in waves.iter().enumerate() {
            if i == wipe {
                fleet.store.0.wipe();
            }
            fleet.clock.advance(wave.gap);
            for instance in &fleet.instances {
                instance.sweep_now().await;
            }
            let instance = &fleet.instances[wave.instance];
            let answers =
                join_all((0..wave.concurrency).map(|_| hit(instance, &limit, wave.hits))).await;
            let ok = answers.iter().filter(|a| **a).count() as u64;
            if ok > 0 {
                admitted.push((fleet.clock.now(), ok * wave.hits as u64, i < wipe));
            }
        }
        admitted
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// The learning rule: a store wiped under blocks costs what it costs exact counting,
    /// the erased count. Each window admits at most the limit plus what it had admitted
    /// before the wipe: the blocks taken before it report what they admitted after it, and
    /// the store grants nothing until they have.
    #[test]
    fn a_wiped_store_costs_leased_quota_at_most_the_erased_count(
        requests in prop_oneof![1u64..20, 20u64..2000],
        sliding in any::<bool>(),
        n in 1usize..6,
        waves in waves(5, 60 * SECOND),
        wipe in any::<prop::sample::Index>(),
    ) {
        let algorithm = if sliding { Algorithm::SlidingWindow } else { Algorithm::FixedWindow };
        let limit = limit(requests, 60 * SECOND, algorithm, requests);
        let waves: Vec<Wave> = waves.into_iter().map(|w| Wave { instance: w.instance % n, ..w }).collect();
        let wipe = wipe.index(waves.len());
        let admitted = run_wiped(limit, n, &waves, wipe);
        let mut per_window = std::collections::BTreeMap::new();
        for (t, hits, before) in admitted {
            let (all, erased) = per_window.entry(t / limit.window).or_insert((0u64, 0u64));
            *all += hits;
            if before {
                *erased += hits;
            }
        }
        for (window, (hits, erased)) in per_window {
            prop_assert!(
                hits <= requests + erased,
                "{hits} admitted in window {window} of a limit of {requests}, {erased} before the wipe"
            );
        }
    }

    #[test]
    fn fixed_and_sliding_windows_never_admit_more_than_the_limit_per_window(
        requests in prop_oneof![1u64..20, 20u64..2000],
        sliding in any::<bool>(),
        n in 1usize..6,
        waves in waves(5, 60 * SECOND),
    ) {
        let algorithm = if sliding { Algorithm::SlidingWindow } else { Algorithm::FixedWindow };
        let limit = limit(requests, 60 * SECOND, algorithm, requests);
        let waves: Vec<Wave> = waves.into_iter().map(|w| Wave { instance: w.instance % n, ..w }).collect();
        let admitted = run(limit, n, Duration::from_secs(1), &waves);
        let mut per_window = std::collections::BTreeMap::new();
        for (t, hits) in admitted {
            *per_window.entry(t / limit.window).or_insert(0u64) += hits;
        }
        for (window, hits) in per_window {
            prop_assert!(hits <= requests, "{hits} admitted in window {window} of a limit of {requests}");
        }
    }

    #[test]
    fn token_buckets_never_admit_more_than_burst_plus_rate(
        requests in 1u64..200,
        burst in 1u64..200,
        n in 1usize..6,
        waves in waves(5, 10 * SECOND),
    ) {
        let limit = limit(requests, 10 * SECOND, Algorithm::TokenBucket, burst);
        let waves: Vec<Wave> = waves.into_iter().map(|w| Wave { instance: w.instance % n, ..w }).collect();
        let admitted = run(limit, n, Duration::from_secs(1), &waves);
        for (i, &(start, _)) in admitted.iter().enumerate() {
            let mut total = 0u64;
            for &(t, hits) in &admitted[i..] {
                total += hits;
                let refill = (t - start) as f64 * requests as f64 / limit.window as f64;
                prop_assert!(
                    total as f64 <= burst as f64 + refill + 1e-6,
                    "{total} admitted in {} µs: more than a burst of {burst} plus {refill:.2} refilled",
                    t - start
                );
            }
        }
    }

    #[test]
    fn once_every_instance_is_refused_the_fleet_admitted_exactly_the_limit(
        requests in prop_oneof![1u64..50, 50u64..5000],
        algorithm in prop_oneof![
            Just(Algorithm::FixedWindow),
            Just(Algorithm::SlidingWindow),
            Just(Algorithm::TokenBucket),
        ],
        n in 1usize..6,
        waves in waves(5, 8),
    ) {
        // One window, the time still: no lease period ends, nothing refills. (A token
        // bucket's block too small for a request of several hits goes back only while no
        // other charge came after it, else the bucket refills it: single hits there.)
        let limit = limit(requests, DAY, algorithm, requests);
        let single = algorithm == Algorithm::TokenBucket;
        let waves: Vec<Wave> = waves
            .into_iter()
            .map(|w| Wave {
                instance: w.instance % n,
                gap: 0,
                hits: if single { 1 } else { w.hits },
                ..w
            })
            .collect();
        let total = runtime().block_on(async {
            let fleet = fleet(n, Duration::from_secs(3600));
            let mut total = 0;
            for wave in &waves {
                let instance = &fleet.instances[wave.instance];
                let answers = join_all((0..wave.concurrency).map(|_| hit(instance, &limit, wave.hits))).await;
                total += answers.iter().filter(|a| **a).count() as u64 * wave.hits as u64;
            }
            for instance in &fleet.instances {
                total += drain(instance, &limit).await;
            }
            // Every instance was refused with its block empty; the shared counter is spent.
            for instance in &fleet.instances {
                total += drain(instance, &limit).await;
            }
            total
        });
        // A token bucket's state is a time in floating point microseconds: a bucket of
        // thousands may round its last token away, exact or leased alike.
        let least = if algorithm == Algorithm::TokenBucket { requests - 1 } else { requests };
        prop_assert!(
            (least..=requests).contains(&total),
            "{total} admitted of a limit of {requests}"
        );
    }
}

#[tokio::test]
async fn a_refused_request_puts_its_units_back_in_the_block() {
    let fleet = fleet(1, Duration::from_secs(3600));
    let instance = &fleet.instances[0];
    let leased = limit(10, DAY, Algorithm::FixedWindow, 10);
    let strict = limit(1, DAY, Algorithm::FixedWindow, 1);
    let request = || {
        batch(vec![
            op(&leased, "hot", 1, Consistency::Leased),
            op(&strict, "strict", 1, Consistency::Exact),
        ])
    };
    assert!(instance.apply(&request()).await.unwrap().admitted);
    // The exact counter is now over: every further request is refused, and charges nothing
    // on the leased counter either.
    for _ in 0..20 {
        let applied = instance.apply(&request()).await.unwrap();
        assert!(!applied.admitted);
        assert!(applied.decisions[0].allowed);
    }
    assert_eq!(drain(instance, &leased).await, 9);
}

#[tokio::test]
async fn near_the_limit_blocks_shrink_to_one_unit() {
    let fleet = fleet(3, Duration::from_secs(3600));
    let limit = limit(10_000, DAY, Algorithm::FixedWindow, 10_000);
    // Instance 0 ramps up on a hot key, the others take their share; the last units go one
    // by one.
    let mut admitted = [0; 3];
    for _ in 0..3 {
        for (i, instance) in fleet.instances.iter().enumerate() {
            admitted[i] += drain(instance, &limit).await;
        }
    }
    assert_eq!(admitted.iter().sum::<u64>(), 10_000);
    let status = fleet.instances[0].status().leases.expect("leasing");
    assert!(
        status.leases < 200,
        "{} leases for 10,000 hits: blocks do not grow",
        status.leases
    );
    // Every instance admitted every unit it leased (and some hits exactly, before its rate
    // was known): nothing is left stranded.
    for (i, instance) in fleet.instances.iter().enumerate() {
        let status = instance.status().leases.unwrap();
        assert!(admitted[i] >= status.units_leased);
        assert!(admitted[i] - status.units_leased <= status.exact_decisions);
    }
}

/// Units `instance` holds after admitting `admitted` hits of the hot key (the first ones
/// exactly, before its rate was known).
fn held_by(instance: &Leased, admitted: u64) -> u64 {
    let status = instance.status().leases.unwrap();
    status.units_leased + status.exact_decisions - admitted
}

#[tokio::test]
async fn units_go_back_when_the_lease_period_ends_and_at_shutdown() {
    let fleet = fleet(2, Duration::from_secs(1));
    let limit = limit(100, DAY, Algorithm::FixedWindow, 100);
    let (a, b) = (&fleet.instances[0], &fleet.instances[1]);
    // A ramps up and holds a block; B gets what A left.
    for _ in 0..10 {
        assert!(hit(a, &limit, 1).await);
    }
    let held = held_by(a, 10);
    assert!(held > 0, "A holds a block");
    assert_eq!(drain(b, &limit).await, 90 - held);
    // The lease period ends: A's sweeper hands its units back (it looks every quarter of a
    // second), and B admits them.
    fleet.clock.advance(2 * SECOND);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while a.status().leases.unwrap().units_returned < held {
        assert!(
            tokio::time::Instant::now() < deadline,
            "A never handed back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(a.status().leases.unwrap().units_returned, held);
    assert_eq!(drain(b, &limit).await, held);

    // At shutdown too, within the lease period.
    let fleet = self::fleet(2, Duration::from_secs(3600));
    let (a, b) = (&fleet.instances[0], &fleet.instances[1]);
    for _ in 0..10 {
        assert!(hit(a, &limit, 1).await);
    }
    let held = held_by(a, 10);
    assert_eq!(a.hand_back_all().await, held);
    assert_eq!(drain(b, &limit).await, 90);
}

#[tokio::test]
async fn refunds_give_back_to_the_block_at_most_what_it_admitted_and_never_to_the_counter() {
    let fleet = fleet(2, Duration::from_secs(3600));
    let instance = &fleet.instances[0];
    let other = &fleet.instances[1];
    let limit = limit(10, DAY, Algorithm::FixedWindow, 10);
    // The first hit is exact (no rate yet), the second takes a block, the third (3 hits)
    // comes from it.
    assert!(hit(instance, &limit, 1).await);
    assert!(hit(instance, &limit, 1).await);
    assert!(hit(instance, &limit, 3).await);
    assert_eq!(instance.status().leases.unwrap().leases, 1);
    // A refund of 2 goes back to the block that admitted the hits; one of 10, at most what it
    // admitted.
    assert!(hit(instance, &limit, -2).await);
    assert!(hit(instance, &limit, -10).await);
    // Through another instance (no block): not to the shared counter, which counts the units
    // instances hold as taken (a refund there could free units still held and admitted).
    assert!(hit(other, &limit, -1).await);
    let total = drain(instance, &limit).await + drain(other, &limit).await;
    assert_eq!(total, 10 - 1);
}

#[tokio::test]
async fn a_flood_of_keys_is_decided_exactly_beyond_the_table() {
    let clock = Arc::new(ManualClock::new(START));
    let store = Arc::new(Remote(MemoryStore::new(
        MemoryOptions::default(),
        clock.clone(),
    )));
    let options = LeaseOptions {
        max_keys: 10,
        ..LeaseOptions::default()
    };
    let instance = Leased::new(store, options, clock);
    let limit = limit(1000, DAY, Algorithm::FixedWindow, 1000);
    for i in 0..100 {
        let key = format!("k{i}");
        for _ in 0..2 {
            let applied = instance
                .apply(&batch(vec![op(&limit, &key, 1, Consistency::Leased)]))
                .await
                .unwrap();
            assert!(applied.admitted, "key {i}");
        }
    }
    // Ten blocks (each key's first hit exact, its second leased); the other 90 keys exact.
    let status = instance.status().leases.unwrap();
    assert_eq!(status.blocks, 10);
    assert_eq!(status.leases, 10);
    assert_eq!(status.exact_decisions, 10 + 180);
}
