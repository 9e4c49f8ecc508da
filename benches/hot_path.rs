//! Criterion benches of the in-process hot path: descriptor matching, the memory store, and
//! a whole `Limiter::check`. Fixed seeds and fixed configs, so runs compare.
#![allow(missing_docs)]

use std::sync::Arc;

use criterion::{BatchSize, Criterion, black_box, criterion_group, criterion_main};
use sluice::algorithm::{Algorithm, Limit, SECOND};
use sluice::clock::SystemClock;
use sluice::config::{LoadOptions, load_sources};
use sluice::limiter::{Descriptor, Entry, Limiter, LimiterOptions, Request};
use sluice::store::lease::LeaseOptions;
use sluice::store::memory::MemoryOptions;
use sluice::store::{
    Admission, Batch, Consistency, CounterKey, CounterOp, FailureMode, Leased, MemoryStore,
    RegionOptions, Regions, Role, Store,
};

const CONFIG: &str = r#"
domain: bench
descriptors:
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: api_key
    value: partner-a
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: path
    value: /api/v*/users/*
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
  - key: remote_address
    descriptors:
      - key: path
        value: /login
        rate_limit: {unit: hour, requests_per_unit: 1000000000}
"#;

fn policy() -> sluice::policy::Policy {
    load_sources(
        &[("bench.yaml".into(), CONFIG.into())],
        LoadOptions::default(),
    )
    .unwrap()
}

fn matcher(c: &mut Criterion) {
    let policy = policy();
    let domain = policy.domain("bench").unwrap();
    let mut group = c.benchmark_group("matcher");
    group.bench_function("exact", |b| {
        b.iter(|| domain.find(black_box(&[("api_key", "partner-a")])))
    });
    group.bench_function("key_only", |b| {
        b.iter(|| domain.find(black_box(&[("api_key", "someone-else")])))
    });
    group.bench_function("wildcard", |b| {
        b.iter(|| domain.find(black_box(&[("path", "/api/v2/users/42")])))
    });
    group.bench_function("nested", |b| {
        b.iter(|| {
            domain.find(black_box(&[
                ("remote_address", "10.0.0.7"),
                ("path", "/login"),
            ]))
        })
    });
    group.finish();
}

fn memory_store(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let limit = Limit {
        overdraft: false,
        requests: u64::MAX / 2,
        window: 60 * SECOND,
        algorithm: Algorithm::FixedWindow,
        burst: u64::MAX / 2,
    };
    let mut group = c.benchmark_group("memory_store");
    for keys in [1usize, 10_000, 1_000_000] {
        let store = MemoryStore::new(
            MemoryOptions {
                max_keys: 2_000_000,
            },
            Arc::new(SystemClock),
        );
        let batches: Vec<Batch> = (0..keys.min(100_000))
            .map(|i| Batch {
                ops: vec![CounterOp {
                    key: CounterKey::new(
                        "bench",
                        [("k", format!("v{}", i * (keys / keys.min(100_000))).as_str())],
                        &limit,
                    ),
                    limit,
                    hits: 1,
                    role: Role::Enforce,
                    failure_mode: FailureMode::Allow,
                    consistency: Default::default(),
                }],
                admission: Admission::ByRule,
                deadline: None,
                charged_at: None,
            })
            .collect();
        // Pre-populate so the map holds `keys` counters.
        for i in 0..keys {
            let batch = Batch {
                ops: vec![CounterOp {
                    key: CounterKey::new("bench", [("k", format!("v{i}").as_str())], &limit),
                    limit,
                    hits: 1,
                    role: Role::Enforce,
                    failure_mode: FailureMode::Allow,
                    consistency: Default::default(),
                }],
                admission: Admission::ByRule,
                deadline: None,
                charged_at: None,
            };
            runtime.block_on(store.apply(&batch)).unwrap();
        }
        let mut next = 0usize;
        group.bench_function(format!("apply_1_op_{keys}_keys"), |b| {
            b.iter(|| {
                next = (next + 7919) % batches.len();
                runtime
                    .block_on(store.apply(black_box(&batches[next])))
                    .unwrap()
            })
        });
    }
    group.finish();
}

fn limiter_check(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let store = MemoryStore::new(MemoryOptions::default(), Arc::new(SystemClock));
    let limiter = Limiter::new(
        Arc::new(policy()),
        Arc::new(store),
        LimiterOptions::default(),
    );
    let request = |n: usize| Request {
        domain: "bench".into(),
        descriptors: (0..n)
            .map(|i| Descriptor {
                entries: vec![Entry {
                    key: "api_key".into(),
                    value: format!("client-{i}"),
                }],
                limit: None,
                hits: 1,
            })
            .collect(),
    };
    let mut group = c.benchmark_group("limiter_check");
    for n in [1, 4] {
        group.bench_function(format!("{n}_descriptors"), |b| {
            b.iter_batched_ref(
                || request(n),
                |r| runtime.block_on(limiter.check(r)).unwrap(),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

/// Nanoseconds per decision of each algorithm, as a pure function on a live state.
fn algorithms(c: &mut Criterion) {
    let mut group = c.benchmark_group("algorithm");
    for algorithm in Algorithm::ALL {
        let limit = Limit::new(1_000_000_000, 60 * SECOND, algorithm);
        let mut now = 1_700_000_000 * SECOND;
        let mut state = Some(sluice::algorithm::decide(None, &limit, now, 1).next);
        group.bench_function(algorithm.as_str(), |b| {
            b.iter(|| {
                now += 1_000;
                let t = sluice::algorithm::decide(black_box(state.as_ref()), &limit, now, 1);
                state = Some(t.next);
                t.decision
            })
        });
    }
    group.finish();
}

/// One single-counter request through the memory store, per algorithm.
fn memory_store_algorithms(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let store = MemoryStore::new(MemoryOptions::default(), Arc::new(SystemClock));
    let mut group = c.benchmark_group("memory_store_algorithm");
    for algorithm in Algorithm::ALL {
        let limit = Limit::new(u64::MAX / 4, 60 * SECOND, algorithm);
        let batch = Batch {
            ops: vec![CounterOp {
                key: CounterKey::new("bench", [("k", "v")], &limit),
                limit,
                hits: 1,
                role: Role::Enforce,
                failure_mode: FailureMode::Allow,
                consistency: Default::default(),
            }],
            admission: Admission::ByRule,
            deadline: None,
            charged_at: None,
        };
        group.bench_function(algorithm.as_str(), |b| {
            b.iter(|| runtime.block_on(store.apply(black_box(&batch))).unwrap())
        });
    }
    group.finish();
}

/// A leased decision served from the instance's block, for a region-scope counter and for a
/// global one (`scope: global`: blocks from the region's pool, granted by the root; memory
/// stores for both): the request path of a global rule costs what a regional one does.
fn global_leased(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let clock = Arc::new(SystemClock);
    let store = |clock: &Arc<SystemClock>| {
        Arc::new(MemoryStore::new(MemoryOptions::default(), clock.clone()))
    };
    let regions = Arc::new(Regions::new(
        store(&clock),
        store(&clock),
        RegionOptions::default(),
        clock.clone(),
    ));
    let leased = Leased::new(regions, LeaseOptions::default(), clock);
    let limit = Limit::new(u64::MAX / 4, 3_600 * SECOND, Algorithm::FixedWindow);
    let mut group = c.benchmark_group("leased_decision");
    for (name, global) in [("region", false), ("global", true)] {
        let key = CounterKey::new("bench", [("k", name)], &limit);
        let batch = Batch {
            ops: vec![CounterOp {
                key: if global { key.global() } else { key },
                limit,
                hits: 1,
                role: Role::Enforce,
                failure_mode: FailureMode::Deny,
                consistency: Consistency::Leased,
            }],
            admission: Admission::ByRule,
            deadline: None,
            charged_at: None,
        };
        // Warm: the first requests are counted exactly while the rate is learned, then
        // leases come.
        for _ in 0..10_000 {
            runtime.block_on(leased.apply(&batch)).unwrap();
        }
        group.bench_function(name, |b| {
            b.iter(|| runtime.block_on(leased.apply(black_box(&batch))).unwrap())
        });
    }
    group.finish();
}

/// The RLQS face: a report of 1,000 buckets an Envoy already reported (the steady state:
/// Envoy lists every bucket in every report), and the once-a-second tick over them.
fn rlqs(c: &mut Criterion) {
    use sluice::quota::{BucketKey, Quotas, RlqsOptions, Usage};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let rules = "domain: rq\ndescriptors:\n  - key: name\n    rate_limit: {unit: second, requests_per_unit: 1000}\n";
    let policy = load_sources(&[("rq.yaml".into(), rules.into())], LoadOptions::default()).unwrap();
    let store = Arc::new(MemoryStore::new(
        MemoryOptions::default(),
        Arc::new(SystemClock),
    ));
    let limiter = Arc::new(Limiter::new(
        Arc::new(policy),
        store.clone(),
        LimiterOptions::default(),
    ));
    let options = RlqsOptions {
        reports_per_second: u64::MAX,
        ..RlqsOptions::default()
    };
    let quotas = Quotas::new(limiter, store, options);
    let (stream, _outbox) = quotas.open(0).unwrap();
    // Bucket ids as they come off the wire, made canonical in the measured part as the
    // service does (the protobuf decoding itself is not measured).
    let ids: Vec<std::collections::HashMap<String, String>> = (0..1000)
        .map(|i| [("name".to_owned(), format!("tenant-{i}"))].into())
        .collect();
    let report = |ids: &[std::collections::HashMap<String, String>], allowed| {
        ids.iter()
            .map(|id| Usage {
                bucket: BucketKey::new(id),
                allowed,
                denied: 0,
                first_sight: false,
            })
            .collect::<Vec<_>>()
    };
    runtime.block_on(quotas.report(stream, "rq", report(&ids, 1)));
    let mut group = c.benchmark_group("rlqs");
    group.bench_function("report_1000_buckets", |b| {
        b.iter(|| runtime.block_on(quotas.report(stream, "rq", report(black_box(&ids), 5))))
    });
    group.bench_function("tick_1000_buckets", |b| {
        b.iter(|| runtime.block_on(quotas.tick()))
    });
    group.finish();
}

criterion_group!(
    benches,
    rlqs,
    matcher,
    algorithms,
    memory_store,
    memory_store_algorithms,
    limiter_check,
    global_leased
);
criterion_main!(benches);
