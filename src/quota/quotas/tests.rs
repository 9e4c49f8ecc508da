//! Quotas on a manual clock.

use super::*;
use crate::clock::ManualClock;

const RULES: &str = "domain: rq\ndescriptors:\n  - key: name\n    rate_limit: {unit: second, requests_per_unit: 10}\n";

fn usage(allowed: u64) -> Vec<Usage> {
    vec![Usage {
        bucket: BucketKey::new(&[("name".to_owned(), "a".to_owned())].into()),
        allowed,
        denied: 0,
        first_sight: true,
    }]
}

/// The report gate is the algorithm's token bucket on the injected clock: a stream's
/// reports past its rate are dropped until the clock moves on.
#[tokio::test]
async fn reports_past_the_rate_are_dropped_until_the_clock_moves() {
    let clock = Arc::new(ManualClock::new(1_700_000_000 * SECOND));
    let limiter = Arc::new(Limiter::for_tests(RULES, Default::default(), clock.clone()));
    let store = Arc::new(crate::store::MemoryStore::new(
        Default::default(),
        clock.clone(),
    ));
    let options = RlqsOptions {
        reports_per_second: 2,
        ..RlqsOptions::default()
    };
    let quotas = Quotas::new(limiter, store, options).with_clock(clock.clone());
    let (stream, _outbox) = quotas.open(1).unwrap();
    let mut dropped = Vec::new();
    for _ in 0..3 {
        dropped.push(quotas.report(stream, "rq", usage(1)).await.dropped);
    }
    assert_eq!(
        dropped,
        [false, false, true],
        "two a second, as many at once"
    );
    clock.advance(SECOND / 2);
    assert!(!quotas.report(stream, "rq", usage(1)).await.dropped);
    assert!(quotas.report(stream, "rq", usage(1)).await.dropped);
    assert_eq!(quotas.now(), 0.5, "RLQS time is the injected clock's");
}
