//! Regions' pools of global counters: `lua/pool.lua` against the arithmetic it mirrors
//! (`store::pool`, which the memory store runs). Random operations on a few pools, on one
//! pinned clock, answer the same from a real Redis as from memory, one by one.

use std::sync::Arc;

use crate::common::redis::RedisServer;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use sluice::algorithm::{Algorithm, Limit, Micros, SECOND};
use sluice::clock::{Clock, ManualClock, SystemClock};
use sluice::store::memory::MemoryOptions;
use sluice::store::pool::{Install, PoolKind, Timing};
use sluice::store::redis::{RedisKind, RedisOptions};
use sluice::store::{CounterKey, MemoryStore, PoolOp, RedisStore, Shared};

const WINDOW: Micros = 60 * SECOND;
const TENANTS: [&str; 3] = ["a", "b", "c"];

const TIMING: Timing = Timing {
    lead: 20 * SECOND,
    period: 2 * SECOND,
    ask_ttl: 2 * SECOND,
    window: WINDOW,
    floor: 3,
    advance: true,
};

fn kind() -> impl Strategy<Value = PoolKind> {
    prop_oneof![
        4 => (0u64..50, 0u64..5, 1u64..4, 0u64..20).prop_map(|(want, need, instances, demand)| PoolKind::Take {
            want,
            need,
            instances,
            demand,
            timing: TIMING,
        }),
        1 => (0u64..20, any::<bool>(), any::<bool>()).prop_map(|(units, same, guard)| {
            PoolKind::Return {
                units,
                // The generation and guard are filled in from the last answer when `same`.
                generation: u64::from(!same),
                guard: u64::from(!guard),
            }
        }),
        2 => (
            (0u64..100, prop_oneof![4 => Just(1u64), 1 => Just(0)], prop_oneof![0u64..3 * SECOND, 0u64..90 * SECOND], prop_oneof![4 => Just(false), 1 => Just(true)], 0i64..5_000),
            prop_oneof![Just(0u64), Just(10_000_000u64), Just(3_333_334)],
            0u64..5 * SECOND,
            prop_oneof![2 => Just(0u64), 1 => 1..2 * SECOND],
        )
            .prop_map(|((units, epoch, left, failed, offset), interval, full_in, from)| PoolKind::Install(Install {
                // A grant for the next window when not 0 (made a time ahead in `place`).
                from,
                units,
                // A token bucket's time until full (made its arrival time in `place`).
                guard: full_in,
                interval,
                epoch,
                asked_at: 0,
                offset,
                left,
                reported: 0,
                retry_at: 0,
                failed,
                prev_guard: 0,
            })),
        1 => (0u64..SECOND).prop_map(|idle| PoolKind::Withdraw { idle }),
    ]
}

/// The operation with times and guards made relative to the pool as last answered, so that
/// the random cases reach the pool's every branch.
fn place(kind: PoolKind, last: &sluice::store::PoolAnswer, now: Micros) -> PoolKind {
    match kind {
        PoolKind::Return {
            units,
            generation,
            guard,
        } => PoolKind::Return {
            units,
            generation: if generation == 0 { last.generation } else { 1 },
            guard: match (guard, last.tokens_end > 0) {
                (0, false) => last.guard,
                (0, true) => last.mark,
                _ => 1,
            },
        },
        PoolKind::Install(install) if install.interval > 0 => {
            // A token bucket's: its arrival time after the grant, at least the units' time.
            let root_now = now + install.offset as Micros;
            let units_time = install.units * install.interval / 1_000;
            PoolKind::Install(Install {
                guard: root_now + units_time + install.guard,
                asked_at: now.saturating_sub(install.left / 3),
                from: 0,
                reported: last.free / 2,
                retry_at: now + SECOND / 4,
                ..install
            })
        }
        PoolKind::Install(install) if install.from > 0 => {
            // For the next window, from a while ahead.
            let root_now = now + install.offset as Micros;
            PoolKind::Install(Install {
                guard: root_now - root_now % WINDOW + WINDOW,
                asked_at: now.saturating_sub(install.left / 3),
                from: now + install.from,
                // (The pool's window when it is the one before.)
                prev_guard: root_now - root_now % WINDOW,
                reported: last.free / 2,
                retry_at: now + SECOND / 4,
                ..install
            })
        }
        PoolKind::Install(install) => {
            // As the region makes it: the root's window at the ask, no longer than it.
            let asked_at = now.saturating_sub(install.left / 3);
            let root_then = asked_at + install.offset as Micros;
            PoolKind::Install(Install {
                guard: root_then - root_then % WINDOW,
                asked_at,
                left: install.left.min(WINDOW - root_then % WINDOW),
                reported: last.free / 2,
                retry_at: now + SECOND / 4,
                ..install
            })
        }
        kind => kind,
    }
}

#[test]
fn the_pool_script_answers_what_the_memory_store_does() {
    let redis = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 96,
        failure_persistence: None,
        ..Config::default()
    });
    let ops = proptest::collection::vec((0usize..3, 0u64..SECOND, kind()), 1..80);
    let case = std::sync::atomic::AtomicU64::new(0);
    let limit = Limit::new(100, WINDOW, Algorithm::FixedWindow);
    runner
        .run(&ops, |ops| {
            let case = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let clock = Arc::new(ManualClock::new(SystemClock.now()));
            let memory = MemoryStore::new(MemoryOptions::default(), clock.clone());
            let options = RedisOptions {
                key_prefix: format!("pool{case}:"),
                ..RedisOptions::new(redis.url(), RedisKind::Single)
            };
            let store = RedisStore::new(&options).unwrap().with_clock(clock.clone());
            runtime.block_on(async {
                let mut last = vec![sluice::store::PoolAnswer::default(); 3];
                for (step, (pool, gap, kind)) in ops.into_iter().enumerate() {
                    clock.advance(gap);
                    let kind = place(kind, &last[pool], clock.now());
                    let op = PoolOp {
                        key: CounterKey::new("api", [("tenant", TENANTS[pool])], &limit),
                        kind,
                    };
                    let ours = memory.pool(std::slice::from_ref(&op)).await.unwrap();
                    let theirs = store.pool(std::slice::from_ref(&op)).await.unwrap();
                    prop_assert_eq!(ours[0], theirs[0], "step {}: {:?}", step, kind);
                    last[pool] = ours[0];
                }
                Ok(())
            })
        })
        .unwrap();
}

/// A real Redis and the memory store, on one pinned clock.
fn on_one_clock() -> (RedisServer, Arc<ManualClock>, MemoryStore, RedisStore) {
    let redis = RedisServer::start();
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let memory = MemoryStore::new(MemoryOptions::default(), clock.clone());
    let options = RedisOptions::new(redis.url(), RedisKind::Single);
    let store = RedisStore::new(&options).unwrap().with_clock(clock.clone());
    (redis, clock, memory, store)
}

/// A region's ask that reaches the root after its asker gave up (held by a partition, then
/// delivered when it heals) takes nothing, in memory as in Redis; in time, it is granted.
#[tokio::test]
async fn an_ask_delivered_after_its_asker_gave_up_takes_nothing() {
    use sluice::algorithm::Ask;
    use sluice::store::{LeaseAsk, Take};
    let (_redis, clock, memory, store) = on_one_clock();
    let limit = Limit::new(100, WINDOW, Algorithm::FixedWindow);
    let ask = |not_after| LeaseAsk {
        key: CounterKey::new("api", [("tenant", "a")], &limit).global(),
        limit,
        take: Take::Lease(Ask {
            want: 10,
            need: 1,
            instances: 1,
        }),
        report: Default::default(),
        not_after,
        id: Default::default(),
        start: 0,
    };
    let now = clock.now();
    for shared in [&memory as &dyn Shared, &store] {
        let late = shared.lease(&[ask(now - 1)]).await.unwrap();
        assert_eq!(late[0].units, 0);
        assert!(!late[0].decision.allowed);
        assert_eq!(late[0].decision.remaining, 100, "nothing was taken");
        let in_time = shared.lease(&[ask(now + 1)]).await.unwrap();
        assert_eq!(in_time[0].units, 10);
    }
}

/// A region's ask asked again with the same id (its reply was lost) gets what the first got,
/// at the first one's time, and takes nothing more, in memory as in Redis; another ask of the
/// same asker, or the same ask of another asker, is a new one.
#[tokio::test]
async fn a_retried_ask_gets_what_it_was_granted_once() {
    use sluice::algorithm::Ask;
    use sluice::store::lease::AskId;
    use sluice::store::{LeaseAsk, Take};
    let (_redis, clock, memory, store) = on_one_clock();
    let limit = Limit::new(100, WINDOW, Algorithm::FixedWindow);
    let ask = |asker, seq| LeaseAsk {
        key: CounterKey::new("api", [("tenant", "a")], &limit).global(),
        limit,
        take: Take::Lease(Ask {
            want: 10,
            need: 1,
            instances: 1,
        }),
        report: Default::default(),
        not_after: 0,
        id: AskId { asker, seq },
        start: 0,
    };
    for shared in [&memory as &dyn Shared, &store] {
        let first_at = clock.now();
        let first = shared.lease(&[ask(7, 41)]).await.unwrap()[0];
        clock.advance(SECOND);
        let again = shared.lease(&[ask(7, 41)]).await.unwrap()[0];
        assert_eq!((first.units, again.units), (10, 10));
        assert_eq!(again.now, first_at, "the first grant's time");
        assert_eq!(again.decision.remaining, 90, "taken once");
        let next = shared.lease(&[ask(7, 42)]).await.unwrap()[0];
        let other = shared.lease(&[ask(8, 42)]).await.unwrap()[0];
        assert_eq!((next.units, other.units), (10, 10));
        assert_eq!(other.decision.remaining, 70);
        assert_eq!(again.decision.reset_after, first.decision.reset_after);
        clock.advance(WINDOW);
    }
}
