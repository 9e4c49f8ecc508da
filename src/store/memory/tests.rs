use super::*;
use crate::algorithm::{Algorithm, Limit};
use crate::clock::ManualClock;
use crate::store::{Admission, CounterKey, CounterOp, FailureMode, Role};

const PER_MINUTE_2: Limit = Limit {
    overdraft: false,
    requests: 2,
    window: 60 * SECOND,
    algorithm: Algorithm::FixedWindow,
    burst: 2,
};

fn store(max_keys: u64) -> (MemoryStore, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(1_000 * 60 * SECOND));
    (
        MemoryStore::new(MemoryOptions { max_keys }, clock.clone()),
        clock,
    )
}

fn op(name: &str, hits: i64) -> CounterOp {
    CounterOp {
        key: CounterKey::new("d", [("k", name)], &PER_MINUTE_2),
        limit: PER_MINUTE_2,
        hits,
        role: Role::Enforce,
        failure_mode: FailureMode::Allow,
        consistency: Default::default(),
    }
}

fn apply(store: &MemoryStore, ops: Vec<CounterOp>) -> Applied {
    store.apply_now(&Batch {
        ops,
        admission: Admission::ByRule,
        deadline: None,
        charged_at: None,
    })
}

#[test]
fn two_descriptors_on_one_counter_see_each_other() {
    let (store, _) = store(100);
    let applied = apply(&store, vec![op("a", 1), op("a", 1), op("a", 1)]);
    let allowed: Vec<_> = applied.decisions.iter().map(|d| d.allowed).collect();
    assert_eq!(allowed, [true, true, false]);
    assert!(!applied.admitted);
    // Rejected as a whole: nothing charged, the whole budget is still there.
    assert_eq!(store.len(), 0);
    assert!(apply(&store, vec![op("a", 2)]).admitted);
}

#[test]
fn a_rejected_batch_still_applies_its_refunds() {
    let (store, _) = store(100);
    apply(&store, vec![op("a", 2), op("b", 2)]);
    let applied = apply(&store, vec![op("a", -1), op("b", 1)]);
    assert!(!applied.admitted);
    assert_eq!(apply(&store, vec![op("a", 0)]).decisions[0].remaining, 1);
}

#[test]
fn peeking_does_not_create_counters() {
    let (store, _) = store(100);
    apply(&store, vec![op("a", 0)]);
    assert_eq!(store.len(), 0);
}

#[test]
fn expired_counters_are_purged_and_forgotten() {
    let (store, clock) = store(100);
    apply(&store, vec![op("a", 2)]);
    assert_eq!(store.len(), 1);
    clock.advance(60 * SECOND);
    store.purge_expired();
    assert_eq!(store.len(), 0);
    assert!(apply(&store, vec![op("a", 2)]).admitted);
}

#[test]
fn the_key_cap_bounds_memory_and_counts_evictions() {
    let (store, _) = store(300);
    for i in 0..10_000 {
        apply(&store, vec![op(&format!("flood-{i}"), 1)]);
    }
    let status = store.status();
    assert!(status.tracked_keys.unwrap() <= 300 + 64, "{status:?}");
    assert!(status.evicted_keys > 9_000, "{status:?}");
}

#[test]
fn a_full_store_reclaims_expired_counters_before_evicting() {
    let (store, clock) = store(256);
    for i in 0..256 {
        apply(&store, vec![op(&format!("old-{i}"), 1)]);
    }
    clock.advance(60 * SECOND);
    for i in 0..256 {
        apply(&store, vec![op(&format!("new-{i}"), 1)]);
    }
    assert_eq!(store.status().evicted_keys, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_never_admit_more_than_the_limit() {
    let (store, _) = store(1_000);
    let limit = Limit {
        requests: 1_000,
        ..PER_MINUTE_2
    };
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0;
            for _ in 0..500 {
                let batch = Batch {
                    ops: vec![CounterOp {
                        key: CounterKey::new("d", [("k", "shared")], &limit),
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
                admitted += u32::from(store.apply(&batch).await.unwrap().admitted);
            }
            admitted
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(total, 1_000);
}

#[test]
fn packed_slots_keep_every_algorithms_state() {
    use crate::algorithm::{concurrency, fixed_window, sliding_window, token_bucket};
    let states = [
        State::FixedWindow(fixed_window::Window {
            start: 1_700_000_000 * SECOND,
            count: 7,
        }),
        State::SlidingWindow(sliding_window::Windows {
            last: 1_700_000_061 * SECOND,
            previous: 99,
            current: 4_000_000_000,
        }),
        State::TokenBucket(token_bucket::Bucket {
            tat: 1_700_000_000_123_456.5,
            last: 1_700_000_000_000_001,
        }),
        State::Concurrency(concurrency::InFlight { count: 3 }),
    ];
    for (state, algorithm) in states.into_iter().zip(Algorithm::ALL) {
        // The expiry is kept in whole seconds, rounded up.
        let slot = Slot::pack(state, 1_700_000_000 * SECOND + 42);
        assert_eq!(slot.unpack(algorithm), state);
        assert_eq!(slot.expires_at(), 1_700_000_001 * SECOND);
    }
}

#[test]
fn counts_beyond_32_bits_saturate_and_stay_over_any_limit() {
    let (store, _) = store(100);
    let in_flight = Limit {
        overdraft: false,
        requests: u32::MAX.into(),
        window: 60 * SECOND,
        algorithm: Algorithm::Concurrency,
        burst: u32::MAX.into(),
    };
    let acquire = |hits| CounterOp {
        key: CounterKey::new("d", [("k", "huge")], &in_flight),
        limit: in_flight,
        hits,
        role: Role::Enforce,
        failure_mode: FailureMode::Allow,
        consistency: Default::default(),
    };
    // Acquisitions count whatever the decision (their releases will come).
    apply(&store, vec![acquire(i64::from(u32::MAX) + 10)]);
    let after = apply(&store, vec![acquire(0)]);
    assert_eq!(after.decisions[0].remaining, 0);
    assert!(!apply(&store, vec![acquire(1)]).decisions[0].allowed);
}

#[test]
fn a_lost_release_frees_its_slot_after_the_safety_ttl() {
    let (store, clock) = store(100);
    let in_flight = Limit {
        overdraft: false,
        requests: 1,
        window: 60 * SECOND,
        algorithm: Algorithm::Concurrency,
        burst: 1,
    };
    let acquire = CounterOp {
        key: CounterKey::new("d", [("k", "slot")], &in_flight),
        limit: in_flight,
        hits: 1,
        role: Role::Enforce,
        failure_mode: FailureMode::Allow,
        consistency: Default::default(),
    };
    assert!(apply(&store, vec![acquire.clone()]).admitted);
    // The release never comes (a proxy crashed): the slot stays taken...
    clock.advance(59 * SECOND);
    assert!(!apply(&store, vec![acquire.clone()]).admitted);
    // ...until the safety TTL after the last acquisition has passed.
    clock.advance(61 * SECOND);
    assert!(apply(&store, vec![acquire]).admitted);
}

const PER_HOUR_10: Limit = Limit {
    overdraft: false,
    requests: 10,
    window: 3600 * SECOND,
    algorithm: Algorithm::FixedWindow,
    burst: 10,
};

#[test]
fn a_flood_of_one_hit_keys_cannot_reset_counters_in_use() {
    // Real users limited to 10 a minute; a flood of random keys on an hourly rule (the
    // expiry-first eviction this replaced evicted the minute counters first).
    let (store, _) = store(10_000);
    let user = |u: usize| CounterOp {
        key: CounterKey::new("d", [("user", format!("u{u}").as_str())], &PER_MINUTE_2),
        limit: Limit {
            requests: 10,
            ..PER_MINUTE_2
        },
        hits: 1,
        role: Role::Enforce,
        failure_mode: FailureMode::Allow,
        consistency: Default::default(),
    };
    let flood = |i: u64| CounterOp {
        key: CounterKey::new("d", [("ip", format!("flood-{i}").as_str())], &PER_HOUR_10),
        limit: PER_HOUR_10,
        hits: 1,
        role: Role::Enforce,
        failure_mode: FailureMode::Allow,
        consistency: Default::default(),
    };
    let mut admitted = [0u32; 10];
    let mut next = 0;
    for round in 0..40 {
        for (u, count) in admitted.iter_mut().enumerate() {
            // Two at first (a real client's page load), then one per round.
            for _ in 0..if round == 0 { 2 } else { 1 } {
                *count += u32::from(apply(&store, vec![user(u)]).admitted);
            }
        }
        for _ in 0..5_000 {
            apply(&store, vec![flood(next)]);
            next += 1;
        }
    }
    assert!(store.status().evicted_keys > 150_000);
    assert!(store.status().full);
    assert_eq!(admitted, [10; 10], "no user got past its limit");
}

#[test]
fn memory_is_bounded_in_bytes_whatever_the_values() {
    let max_keys = 2_000;
    let (store, _) = store(max_keys);
    let huge = "v".repeat(8 * 1024);
    for i in 0..2 * max_keys {
        let key = CounterKey::new("d", [("k", format!("{i}{huge}").as_str())], &PER_MINUTE_2);
        let op = CounterOp { key, ..op("x", 1) };
        apply(&store, vec![op]);
    }
    let status = store.status();
    let bytes = status.bytes.unwrap();
    // The bound in docs/operations/limits.md: MAX_BYTES_PER_COUNTER per counter of the cap. 4,000 values of
    // 8 KiB went through (32 MiB); the store holds a few hundred kilobytes.
    assert!(
        bytes <= MAX_BYTES_PER_COUNTER * max_keys,
        "{bytes} bytes for {max_keys} counters"
    );
}
