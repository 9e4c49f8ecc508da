//! Distinct and new refused keys, counted by two instances over one memory store.

use std::sync::Arc;

use super::*;
use crate::clock::ManualClock;
use crate::store::MemoryStore;

const MINUTE: Micros = 60 * SECOND;

fn rule() -> (Rule, RateLimit) {
    let policy = crate::config::policy_for_tests(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    );
    let rule = policy.rules()[0].clone();
    let crate::policy::RuleLimit::Limited(limits) = &rule.limit else {
        unreachable!()
    };
    let limit = limits[0].clone();
    (rule, limit)
}

fn refuse(d: &DistinctRefused, keys: impl IntoIterator<Item = u32>) {
    let (rule, limit) = rule();
    let refused = Decision {
        allowed: false,
        remaining: 0,
        reset_after: 0,
        retry_after: None,
        overdraft: 0,
    };
    for k in keys {
        let descriptor = Descriptor::of(&[("k", &k.to_string())], 1);
        d.decided("d", &rule, &limit, &refused, &descriptor);
    }
}

#[tokio::test]
async fn two_instances_count_a_key_once_and_a_key_refused_before_is_not_new() {
    let clock = Arc::new(ManualClock::new(100 * MINUTE));
    let store = MemoryStore::new(Default::default(), clock.clone());
    let a = DistinctRefused::new(clock.clone(), Duration::from_secs(86_400));
    let b = DistinctRefused::new(clock.clone(), Duration::from_secs(86_400));
    // Window 1: a refuses keys 0..6, b keys 3..10 (3, 4 and 5 on both).
    refuse(&a, 0..6);
    refuse(&b, 3..10);
    assert!(a.tick(&store).await.is_empty());
    assert!(b.tick(&store).await.is_empty());
    // The window ends; counted after the grace.
    clock.advance(MINUTE + GRACE.as_micros() as Micros);
    let counts = |p: Vec<Published>| p.into_iter().map(|p| p.counts).collect::<Vec<_>>();
    let first = RefusedCounts {
        distinct: 10,
        new: 10,
    };
    assert_eq!(counts(a.tick(&store).await), [first]);
    assert_eq!(counts(b.tick(&store).await), [first]);
    // Window 2 (now current): b refuses 8..12: 4 distinct, 2 new (10, 11).
    refuse(&b, 8..12);
    b.tick(&store).await;
    clock.advance(MINUTE);
    assert_eq!(
        counts(b.tick(&store).await),
        [RefusedCounts {
            distinct: 4,
            new: 2
        }]
    );
    // a refused nothing in window 2: it says 0 once; b's figure is the fleet's.
    assert_eq!(counts(a.tick(&store).await), [RefusedCounts::default()]);
    assert!(a.tick(&store).await.is_empty());
}

#[tokio::test]
async fn a_million_refused_keys_hold_a_bounded_sample() {
    let clock = Arc::new(ManualClock::new(100 * MINUTE));
    let store = MemoryStore::new(Default::default(), clock.clone());
    let d = DistinctRefused::new(clock.clone(), Duration::from_secs(86_400));
    refuse(&d, 0..1_000_000);
    {
        let rules = d.rules.lock();
        let s = rules.values().next().unwrap().open.values().next().unwrap();
        assert!(s.seen.len() <= WINDOW_CAP && s.pending.len() <= WINDOW_CAP);
    }
    d.tick(&store).await;
    clock.advance(MINUTE + GRACE.as_micros() as Micros);
    let p = d.tick(&store).await;
    let error = (p[0].counts.distinct as f64 - 1e6).abs() / 1e6;
    assert!(error < 0.15, "{:?}", p[0].counts);
}
