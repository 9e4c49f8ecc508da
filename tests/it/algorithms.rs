// Why one long file: one table of worked cases shared by the pure functions, memory and Redis.
//! One table of worked cases (DESIGN §4 and the pattern's literature) that the pure
//! functions, the memory store and the Redis store all pass, with the same pinned clock.

use futures_util::future::join_all;
use std::collections::HashMap;
use std::sync::Arc;

use crate::common::counters;
use crate::common::redis::{RedisServer, command_calls};
use sluice::algorithm::{self, Algorithm, Decision, Limit, Micros, SECOND, State};
use sluice::clock::{Clock, ManualClock};
use sluice::store::memory::MemoryOptions;
use sluice::store::redis::{RedisKind, RedisOptions};
use sluice::store::{
    Admission, Batch, CounterKey, CounterOp, FailureMode, MemoryStore, RedisStore, Role, Store,
};

const MINUTE: Micros = 60 * SECOND;

/// One step of a case: at `at` (from the case's start, aligned to a minute), send `count`
/// requests of `hits` on counter `key`; expect `admitted` of them to pass and, if given, the
/// first decision's `remaining` and `retry_after`.
struct Step {
    key: &'static str,
    at: Micros,
    hits: i64,
    count: usize,
    admitted: usize,
    remaining: Option<u64>,
    retry_after: Option<Option<Micros>>,
}

const fn burst(key: &'static str, at: Micros, count: usize, admitted: usize) -> Step {
    Step {
        key,
        at,
        hits: 1,
        count,
        admitted,
        remaining: None,
        retry_after: None,
    }
}

const fn one(
    key: &'static str,
    at: Micros,
    hits: i64,
    allowed: bool,
    remaining: u64,
    retry_after: Option<Micros>,
) -> Step {
    Step {
        key,
        at,
        hits,
        count: 1,
        admitted: allowed as usize,
        remaining: Some(remaining),
        retry_after: Some(retry_after),
    }
}

struct Case {
    name: &'static str,
    limit: Limit,
    steps: Vec<Step>,
}

fn limit(algorithm: Algorithm, requests: u64, window: Micros, burst: u64) -> Limit {
    Limit {
        overdraft: false,
        requests,
        window,
        algorithm,
        burst,
    }
}

fn cases() -> Vec<Case> {
    use Algorithm::*;
    vec![
        Case {
            // Capacity 5, refilling 2 per second: 8 simultaneous requests.
            name: "token bucket 5 at 2/s",
            limit: limit(TokenBucket, 2, SECOND, 5),
            steps: vec![
                burst("a", 0, 5, 5),
                one("a", 0, 1, false, 0, Some(SECOND / 2)),
                burst("a", 0, 2, 0),
                one("b", 0, 1, true, 4, None),
                // Two tokens came back in that second.
                one("a", SECOND, 1, true, 1, None),
            ],
        },
        Case {
            name: "token bucket 2 at 1/s",
            limit: limit(TokenBucket, 1, SECOND, 2),
            steps: vec![
                one("a", 0, 1, true, 1, None),
                one("a", 0, 1, true, 0, None),
                one("a", 0, 1, false, 0, Some(SECOND)),
                one("b", 0, 1, true, 1, None),
                one("a", SECOND, 1, true, 0, None),
            ],
        },
        Case {
            // The clock steps back 5 s after a charge: no token is lost (plain GCRA would
            // refuse: the bucket would look 6 s from refilled), none is gained.
            name: "token bucket: a clock stepping back removes no tokens",
            limit: limit(TokenBucket, 1, SECOND, 4),
            steps: vec![
                one("a", 10 * SECOND, 1, true, 3, None),
                one("a", 5 * SECOND, 1, true, 2, None),
                one("a", 5 * SECOND, 1, true, 1, None),
                one("a", 11 * SECOND, 1, true, 1, None),
            ],
        },
        Case {
            // The clock steps back from 90 s to 61 s: read as 90 s (at 61 s the first
            // window would weigh 9.8 and refuse), and back to 30 s gives no fresh budget.
            name: "sliding window: a clock stepping back removes no capacity",
            limit: limit(SlidingWindow, 10, MINUTE, 10),
            steps: vec![
                burst("a", 0, 10, 10),
                burst("a", 90 * SECOND, 4, 4),
                one("a", 61 * SECOND, 1, true, 0, None),
                burst("a", 61 * SECOND, 1, 0),
                burst("a", 30 * SECOND, 1, 0),
            ],
        },
        Case {
            // 100 at second 59.9 and 100 at 60.1: the boundary burst.
            name: "fixed window 100/min across a boundary",
            limit: limit(FixedWindow, 100, MINUTE, 100),
            steps: vec![
                burst("a", 59_900_000, 100, 100),
                burst("a", 60_100_000, 100, 100),
            ],
        },
        Case {
            name: "sliding window 100/min across a boundary",
            limit: limit(SlidingWindow, 100, MINUTE, 100),
            steps: vec![
                burst("a", 59_900_000, 100, 100),
                one("a", 60_100_000, 1, false, 0, Some(500_000)),
                burst("a", 60_100_000, 99, 0),
                burst("a", 90 * SECOND, 100, 50),
            ],
        },
        Case {
            // 70 in the middle of one window, then a quarter into the next: 100 - 0.75 * 70.
            name: "sliding window weighs the previous window",
            limit: limit(SlidingWindow, 100, MINUTE, 100),
            steps: vec![
                burst("a", 30 * SECOND, 70, 70),
                burst("a", 75 * SECOND, 100, 47),
            ],
        },
        Case {
            name: "fixed window 10/s: two bursts around a second boundary",
            limit: limit(FixedWindow, 10, SECOND, 10),
            steps: vec![burst("a", 990_000, 10, 10), burst("a", 1_010_000, 10, 10)],
        },
        Case {
            name: "sliding window 10/s: two bursts around a second boundary",
            limit: limit(SlidingWindow, 10, SECOND, 10),
            steps: vec![burst("a", 990_000, 10, 10), burst("a", 1_010_000, 10, 0)],
        },
        Case {
            // Every acquisition is counted, refused ones too, since each gets released.
            name: "concurrency 2: acquire, release",
            limit: limit(Concurrency, 2, MINUTE, 2),
            steps: vec![
                one("a", 0, 1, true, 1, None),
                one("a", 0, 1, true, 0, None),
                one("a", 0, 1, false, 0, Some(SECOND)),
                one("a", 10, -1, true, 0, None),
                one("a", 10, -1, true, 1, None),
                one("a", 20, 1, true, 0, None),
                one("a", 30, -5, true, 2, None),
            ],
        },
        Case {
            name: "refunds never exceed the limit",
            limit: limit(SlidingWindow, 5, MINUTE, 5),
            steps: vec![burst("a", 0, 3, 3), one("a", 1, -10, true, 5, None)],
        },
        Case {
            // A usage budget: the charge that crosses it counts, checks are refused until the
            // window ends, a refund returns exactly what was charged.
            name: "fixed window budget of 100/min",
            limit: limit(FixedWindow, 100, MINUTE, 100).with_overdraft(true),
            steps: vec![
                one("a", 0, 80, true, 20, None),
                one("a", SECOND, 50, false, 0, Some(59 * SECOND)),
                one("a", 2 * SECOND, 0, false, 0, Some(58 * SECOND)),
                one("a", 3 * SECOND, -40, true, 10, None),
                one("a", MINUTE, 0, true, 100, None),
            ],
        },
        Case {
            // 250 of 100 carried into the next window at its remaining weight.
            name: "sliding window budget of 100/min",
            limit: limit(SlidingWindow, 100, MINUTE, 100).with_overdraft(true),
            steps: vec![
                one("a", 0, 250, false, 0, None),
                one("a", MINUTE + 36 * SECOND, 0, false, 0, Some(240_000)),
                one("a", MINUTE + 37 * SECOND, 0, true, 4, None),
            ],
        },
        Case {
            // One token a second, 60 at most: 90 at once is a debt of 30.
            name: "token bucket budget of 60/min",
            limit: limit(TokenBucket, 60, MINUTE, 60).with_overdraft(true),
            steps: vec![
                one("a", 0, 90, false, 0, None),
                one("a", 30 * SECOND, 0, false, 0, Some(SECOND)),
                one("a", 31 * SECOND, 1, true, 0, None),
            ],
        },
    ]
}

/// Something that decides one counter at a pinned time.
trait Decider {
    async fn decide(&mut self, key: &str, limit: &Limit, now: Micros, hits: i64) -> Decision;
}

/// The pure functions, storing state as the stores do (when allowed, or unconditionally).
#[derive(Default)]
struct Pure(HashMap<String, State>);

impl Decider for Pure {
    async fn decide(&mut self, key: &str, limit: &Limit, now: Micros, hits: i64) -> Decision {
        let t = algorithm::decide(self.0.get(key), limit, now, hits);
        if (t.decision.allowed && hits != 0) || algorithm::applies_unconditionally(limit, hits) {
            self.0.insert(key.to_owned(), t.next);
        }
        t.decision
    }
}

/// A store with a manual clock.
struct WithClock<S> {
    store: S,
    clock: Arc<ManualClock>,
    namespace: String,
}

impl<S: Store> Decider for WithClock<S> {
    async fn decide(&mut self, key: &str, limit: &Limit, now: Micros, hits: i64) -> Decision {
        self.clock.set(now);
        let op = counters::op(&self.namespace, [("k", key)], *limit, hits, Role::Enforce);
        let batch = counters::batch(vec![op]);
        self.store.apply(&batch).await.unwrap().decisions[0]
    }
}

/// A start time aligned to a minute, two days ahead of the real clock, so that keys written
/// to Redis with absolute expiries stay until the case is over.
fn base() -> Micros {
    let day = 86_400 * SECOND;
    let now = sluice::clock::SystemClock.now();
    (now / day + 2) * day
}

async fn run(backend: &str, mut make: impl FnMut(&str) -> Box<dyn FnMutDecider>) {
    for case in cases() {
        let mut decider = make(case.name);
        let start = base();
        for (i, step) in case.steps.iter().enumerate() {
            let mut admitted = 0;
            for n in 0..step.count {
                let d = decider
                    .call(step.key, &case.limit, start + step.at, step.hits)
                    .await;
                admitted += usize::from(d.allowed);
                if n == 0 {
                    if let Some(remaining) = step.remaining {
                        assert_eq!(
                            d.remaining, remaining,
                            "{backend}: {} step {i}: remaining",
                            case.name
                        );
                    }
                    if let Some(retry) = step.retry_after {
                        assert_eq!(
                            d.retry_after, retry,
                            "{backend}: {} step {i}: retry_after",
                            case.name
                        );
                    }
                }
            }
            assert_eq!(
                admitted, step.admitted,
                "{backend}: {} step {i}: admitted",
                case.name
            );
        }
    }
}

/// Object-safe wrapper so that one runner drives every backend.
trait FnMutDecider {
    fn call<'a>(
        &'a mut self,
        key: &'a str,
        limit: &'a Limit,
        now: Micros,
        hits: i64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Decision> + 'a>>;
}

impl<D: Decider> FnMutDecider for D {
    fn call<'a>(
        &'a mut self,
        key: &'a str,
        limit: &'a Limit,
        now: Micros,
        hits: i64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Decision> + 'a>> {
        Box::pin(self.decide(key, limit, now, hits))
    }
}

#[tokio::test]
async fn the_pure_functions_pass_the_worked_cases() {
    run("pure", |_| Box::new(Pure::default())).await;
}

#[tokio::test]
async fn the_memory_store_passes_the_worked_cases() {
    run("memory", |_| {
        let clock = Arc::new(ManualClock::new(0));
        Box::new(WithClock {
            store: MemoryStore::new(MemoryOptions::default(), clock.clone()),
            clock,
            namespace: "memory".into(),
        })
    })
    .await;
}

#[tokio::test]
async fn the_redis_store_passes_the_worked_cases() {
    let redis = RedisServer::start();
    let url = redis.url();
    let run_id = format!("{}-{}", std::process::id(), base());
    run("redis", |case| {
        let clock = Arc::new(ManualClock::new(0));
        let store = RedisStore::new(&RedisOptions::new(url.clone(), RedisKind::Single))
            .unwrap()
            .with_clock(clock.clone());
        Box::new(WithClock {
            store,
            clock,
            namespace: format!("{run_id}-{case}"),
        })
    })
    .await;
}

/// A small seeded generator (splitmix64), so that a failing run can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Random traffic over every algorithm (several counters per request, counters shared
/// within a request, refunds and releases, shadow and quota roles, global shadow mode), sent
/// to Redis in groups of concurrent requests that share one script call, and replayed one by
/// one on the memory store at the same pinned times: every decision and every admission
/// agrees.
#[tokio::test]
async fn the_redis_store_decides_random_traffic_as_the_memory_store_does() {
    let redis = RedisServer::start();
    let namespace = format!("random-{}-{}", std::process::id(), base());
    let clock = Arc::new(ManualClock::new(base()));
    // One connection: one call at a time, so Redis applies the requests in the order they
    // were sent (with two, two calls could overtake each other).
    let mut options = RedisOptions::new(redis.url(), RedisKind::Single);
    options.connections = 1;
    let redis_store = RedisStore::new(&options).unwrap().with_clock(clock.clone());
    let memory = MemoryStore::new(MemoryOptions::default(), clock.clone());
    let limits = [
        limit(Algorithm::FixedWindow, 3, SECOND, 3),
        limit(Algorithm::SlidingWindow, 4, 2 * SECOND, 4),
        limit(Algorithm::TokenBucket, 5, SECOND, 3),
        limit(Algorithm::Concurrency, 2, 10 * SECOND, 2),
        limit(Algorithm::FixedWindow, 5, SECOND, 5).with_overdraft(true),
        limit(Algorithm::SlidingWindow, 6, 2 * SECOND, 6).with_overdraft(true),
        limit(Algorithm::TokenBucket, 4, SECOND, 4).with_overdraft(true),
    ];
    let seed = 0x5EED_0001;
    let mut rng = Rng(seed);
    let mut requests = 0;
    let groups = 600;
    for group in 0..groups {
        clock.advance(rng.below(400_000));
        let batches: Vec<Batch> = (0..1 + rng.below(4))
            .map(|_| Batch {
                ops: (0..1 + rng.below(3))
                    .map(|_| {
                        let limit = limits[rng.below(limits.len() as u64) as usize];
                        let name = ["a", "b"][rng.below(2) as usize];
                        CounterOp {
                            key: CounterKey::new(&namespace, [("k", name)], &limit),
                            limit,
                            hits: [1, 1, 1, 1, 1, 0, 2, 3, -1, -1, 7][rng.below(11) as usize],
                            role: [
                                Role::Enforce,
                                Role::Enforce,
                                Role::Enforce,
                                Role::Shadow,
                                Role::Quota,
                            ][rng.below(5) as usize],
                            failure_mode: FailureMode::Allow,
                            consistency: Default::default(),
                        }
                    })
                    .collect(),
                admission: if rng.below(10) == 0 {
                    Admission::Always
                } else {
                    Admission::ByRule
                },
                deadline: None,
                charged_at: None,
            })
            .collect();
        let from_redis = join_all(batches.iter().map(|b| redis_store.apply(b))).await;
        for (i, (batch, from_redis)) in batches.iter().zip(from_redis).enumerate() {
            let from_memory = memory.apply(batch).await.unwrap();
            assert_eq!(
                from_redis.unwrap(),
                from_memory,
                "seed {seed:#x}, group {group}, request {i} of the group: {batch:?}"
            );
            requests += 1;
        }
    }
    // Each group went to Redis in one call (the first call also met NOSCRIPT once).
    let calls = command_calls(&redis, "evalsha");
    assert!(requests > 1000, "only {requests} requests were compared");
    assert!(
        calls <= groups + 1,
        "{requests} requests in {groups} groups took {calls} script calls"
    );
}
