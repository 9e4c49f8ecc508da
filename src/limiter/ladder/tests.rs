//! The ladder's arithmetic against an exact model, and its counts from real limiter traffic.

use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::clock::SystemClock;
use crate::limiter::{Descriptor, Limiter, LimiterOptions, Request};
use crate::policy::RateLimit;

fn ladder(capacity: u64, ladder: Ladder) -> RuleLadder {
    let limit = RateLimit::fixed(capacity, crate::policy::Unit::Minute);
    RuleLadder::new(Default::default(), &limit, ladder)
}

/// Exactly, from every key-window's charges: per rung, key-windows whose peak is above it and
/// hits at positions above it.
fn exact(rungs: &[u64], windows: &[Vec<u64>]) -> (u64, Vec<u64>, Vec<u64>) {
    let mut past = vec![0; rungs.len()];
    let mut hits = vec![0; rungs.len()];
    for charges in windows.iter().filter(|c| !c.is_empty()) {
        let peak: u64 = charges.iter().sum();
        for (k, &r) in rungs.iter().enumerate() {
            past[k] += u64::from(peak > r);
            hits[k] += peak.saturating_sub(r);
        }
    }
    let seen = windows.iter().filter(|c| !c.is_empty()).count() as u64;
    (seen, past, hits)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Charges of 1 to 40 hits, key-window after key-window, counted from the count before and
    /// after each: the same counts as the exact model, on any ladder and any limit.
    #[test]
    fn the_ladder_counts_what_the_exact_model_does(
        capacity in 1u64..200,
        steps in 1u32..8,
        windows in proptest::collection::vec(proptest::collection::vec(1u64..40, 0..30), 0..20),
    ) {
        let l = ladder(capacity, Ladder::new(1.0 / 16.0, 16.0, steps).unwrap());
        for charges in &windows {
            let mut count = 0;
            for &c in charges {
                l.moved(count, count + c);
                count += c;
            }
        }
        let (seen, past, hits) = exact(&l.rungs, &windows);
        prop_assert_eq!(l.seen.load(Relaxed), seen);
        let got = l.cumulative();
        for k in 0..l.rungs.len() {
            prop_assert_eq!(got[k].1, past[k], "key-windows past rung {}", k);
            prop_assert_eq!(got[k].2, hits[k], "hits past rung {}", k);
        }
        prop_assert_eq!(got.last().unwrap(), &("+Inf", 0, 0));
        let total: u64 = windows.iter().flatten().sum();
        prop_assert_eq!(l.bands.iter().map(|b| b.load(Relaxed)).sum::<u64>(), total);
    }
}

const CONFIG: &str = r#"
domain: m
descriptors:
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 8}
  - key: enforced
    rate_limit: {unit: hour, requests_per_unit: 8}
  - key: own
    ladder: {from: 0.5, to: 2, steps_per_doubling: 1}
    rate_limit: {unit: hour, requests_per_unit: 8}
  - key: off
    ladder: false
    rate_limit: {unit: hour, requests_per_unit: 8}
"#;

/// A limiter over [`CONFIG`] feeding a registry with the ladders in it.
fn measured() -> (Limiter, prometheus::Registry) {
    let registry = prometheus::Registry::new();
    let series = Arc::new(crate::limiter::RuleSeries::register(&registry, 0.8, 100));
    let limiter = Limiter::for_tests(CONFIG, LimiterOptions::default(), Arc::new(SystemClock))
        .with_observer(series);
    (limiter, registry)
}

async fn hit(limiter: &Limiter, key: &str, value: &str, n: usize) {
    for _ in 0..n {
        let request = Request::of("m", vec![Descriptor::of(&[(key, value)], 1)]);
        limiter.check(&request).await.unwrap();
    }
}

/// The value of `name{labels…}` in the exposition, 0 when absent.
fn value(text: &str, name: &str, rule: &str, le: Option<&str>) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix('{')?;
        let (labels, value) = rest.rsplit_once("} ")?;
        let ok = labels.contains(&format!("rule=\"{rule}\""))
            && le.is_none_or(|le| labels.contains(&format!("le=\"{le}\"")));
        ok.then(|| value.parse().unwrap())
    })
}

#[tokio::test]
async fn a_shadow_rule_measures_every_rung_and_an_enforced_one_only_below_its_limit() {
    let (limiter, registry) = measured();
    // Shadow, limit 8: one key to 12 hits, one to 3.
    hit(&limiter, "shadowed", "a", 12).await;
    hit(&limiter, "shadowed", "b", 3).await;
    // Enforced, limit 8: 12 hits, 4 refused, not counted.
    hit(&limiter, "enforced", "a", 12).await;
    hit(&limiter, "own", "a", 5).await;
    hit(&limiter, "off", "a", 5).await;
    let text = crate::metrics::Exposition::render(&registry);
    let past = |rule: &str, le: &str| value(&text, KEY_WINDOWS_PAST, rule, Some(le));
    let hits = |rule: &str, le: &str| value(&text, HITS_PAST, rule, Some(le));
    let seen = |rule: &str| value(&text, KEY_WINDOWS, rule, None);
    assert_eq!(seen("m.shadowed"), Some(2.0));
    assert_eq!(past("m.shadowed", "1"), Some(1.0), "{text}");
    assert_eq!(hits("m.shadowed", "1"), Some(4.0));
    // 0.25 × 8 = 2: both keys past it, 10 + 1 hits.
    assert_eq!(past("m.shadowed", "0.25"), Some(2.0));
    assert_eq!(hits("m.shadowed", "0.25"), Some(11.0));
    // 1.4142 × 8 = 11.3: the first key's 12th hit.
    assert_eq!(hits("m.shadowed", "1.4142"), Some(1.0));
    assert_eq!(past("m.shadowed", "2"), Some(0.0));
    // Enforced: the refused hits are past every rung below the limit, none is measured above.
    assert_eq!(hits("m.enforced", "0.5"), Some(8.0));
    assert_eq!(past("m.enforced", "1"), Some(0.0));
    assert_eq!(
        hits("m.enforced", "1"),
        Some(4.0),
        "refused hits are past the limit"
    );
    assert_eq!(hits("m.enforced", "1.1892"), Some(0.0));
    // A ladder of its own: 0.5, 1 and 2; none for `ladder: false`.
    let own: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(HITS_PAST) && l.contains("rule=\"m.own\""))
        .collect();
    assert_eq!(own.len(), 4, "{own:?}");
    assert_eq!(hits("m.own", "0.5"), Some(1.0));
    assert_eq!(seen("m.off"), None);
}
