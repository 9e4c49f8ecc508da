//! Properties of the algorithms over random traffic (proptest; failures are persisted under
//! `proptest-regressions/` and committed, so that they are replayed forever after).
//!
//! - fixed window: never more than `L` admitted within one window;
//! - sliding window: never more than `L` within one aligned window, and so at most `2L` within
//!   any interval of one window's length (the documented bound, reached only when the previous
//!   window's hits bunched up at its end);
//! - token bucket: never more than `burst + rate * t` admitted over any interval of length `t`;
//! - concurrency: never more than `L` admitted requests in flight, when every acquisition
//!   (admitted or refused) is released, as Envoy does;
//! - every algorithm: decisions are monotone in hits, and refunds never create capacity
//!   beyond the limit;
//! - usage budgets (`overdraft`): a fixed window records every charge, refused ones too, and
//!   passes exactly when the recorded count leaves room for `max(h, 1)`; a sliding window
//!   passes nothing its current window's recorded charges leave no room for; a token bucket
//!   passes nothing while the charges recorded since any instant exceed what it refilled.

use crate::common::counters::limit;
use proptest::prelude::*;
use sluice::algorithm::{Algorithm, Limit, Micros, SECOND, State, applies_unconditionally, decide};

/// One request: after `gap` microseconds, `hits` hits (negative: a refund).
#[derive(Debug, Clone, Copy)]
struct Step {
    gap: Micros,
    hits: i64,
}

fn steps(window: Micros) -> impl Strategy<Value = Vec<Step>> {
    let step = (
        prop_oneof![3 => Just(0u64), 5 => 0..window / 4, 1 => 0..2 * window],
        prop_oneof![8 => 1i64..=3, 1 => Just(0i64), 1 => -3i64..=-1],
    )
        .prop_map(|(gap, hits)| Step { gap, hits });
    proptest::collection::vec(step, 1..120)
}

fn limit_strategy(algorithm: Algorithm) -> impl Strategy<Value = Limit> {
    (
        1u64..20,
        prop_oneof![Just(SECOND), Just(60 * SECOND)],
        1u64..20,
    )
        .prop_map(move |(requests, window, burst)| limit(requests, window, algorithm, burst))
}

/// Runs the steps like a store does (state kept only when allowed); returns each admitted
/// charge as (time, hits) and each remaining value seen.
fn run(limit: &Limit, steps: &[Step]) -> (Vec<(Micros, u64)>, Vec<u64>) {
    let mut now = 1_700_000_000 * SECOND;
    let mut state: Option<State> = None;
    let mut admitted = Vec::new();
    let mut remaining = Vec::new();
    for step in steps {
        now += step.gap;
        let t = decide(state.as_ref(), limit, now, step.hits);
        if t.decision.allowed && step.hits > 0 {
            admitted.push((now, step.hits as u64));
        }
        if (t.decision.allowed && step.hits != 0) || applies_unconditionally(limit, step.hits) {
            state = Some(t.next);
        }
        remaining.push(t.decision.remaining);
    }
    (admitted, remaining)
}

/// Runs the steps like a store does and returns every step as (time, hits, allowed).
fn run_all(limit: &Limit, steps: &[Step]) -> Vec<(Micros, i64, bool)> {
    let mut now = 1_700_000_000 * SECOND;
    let mut state: Option<State> = None;
    let mut out = Vec::new();
    for step in steps {
        now += step.gap;
        let t = decide(state.as_ref(), limit, now, step.hits);
        if (t.decision.allowed && step.hits != 0) || applies_unconditionally(limit, step.hits) {
            state = Some(t.next);
        }
        out.push((now, step.hits, t.decision.allowed));
    }
    out
}

/// Usage budgets: larger charges, some past the limit on their own.
fn budget_steps(window: Micros) -> impl Strategy<Value = Vec<Step>> {
    let step = (
        prop_oneof![3 => Just(0u64), 5 => 0..window / 4, 1 => 0..2 * window],
        prop_oneof![6 => 1i64..=8, 2 => Just(0i64), 1 => 20i64..=60, 1 => -8i64..=-1],
    )
        .prop_map(|(gap, hits)| Step { gap, hits });
    proptest::collection::vec(step, 1..120)
}

/// Steps without refunds, for the "never admits more than" properties.
fn without_refunds(steps: Vec<Step>) -> Vec<Step> {
    steps.into_iter().filter(|s| s.hits >= 0).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn fixed_window_never_admits_more_than_the_limit_per_window(
        limit in limit_strategy(Algorithm::FixedWindow),
        steps in steps(60 * SECOND),
    ) {
        let (admitted, _) = run(&limit, &without_refunds(steps));
        let mut per_window = std::collections::HashMap::new();
        for (t, h) in admitted {
            *per_window.entry(t / limit.window).or_insert(0) += h;
        }
        prop_assert!(per_window.values().all(|&n| n <= limit.requests), "{per_window:?}");
    }

    #[test]
    fn sliding_window_stays_within_its_bound(
        limit in limit_strategy(Algorithm::SlidingWindow),
        steps in steps(60 * SECOND),
    ) {
        let (admitted, _) = run(&limit, &without_refunds(steps));
        let mut per_window = std::collections::HashMap::new();
        for &(t, h) in &admitted {
            *per_window.entry(t / limit.window).or_insert(0) += h;
        }
        prop_assert!(per_window.values().all(|&n| n <= limit.requests), "{per_window:?}");
        for &(start, _) in &admitted {
            let within: u64 = admitted
                .iter()
                .filter(|(t, _)| *t >= start && *t < start + limit.window)
                .map(|(_, h)| h)
                .sum();
            prop_assert!(within <= 2 * limit.requests);
        }
    }

    #[test]
    fn token_bucket_never_admits_more_than_burst_plus_rate(
        limit in limit_strategy(Algorithm::TokenBucket),
        steps in steps(SECOND),
    ) {
        let (admitted, _) = run(&limit, &without_refunds(steps));
        let interval = limit.window as f64 / limit.requests as f64;
        for (i, &(start, _)) in admitted.iter().enumerate() {
            let mut total = 0u64;
            for &(t, h) in &admitted[i..] {
                total += h;
                let allowance = limit.burst as f64 + (t - start) as f64 / interval;
                prop_assert!(total as f64 <= allowance + 1e-9, "{total} > {allowance}");
            }
        }
    }

    #[test]
    fn concurrency_never_admits_more_than_the_limit_in_flight(
        limit in limit_strategy(Algorithm::Concurrency),
        actions in proptest::collection::vec((any::<bool>(), any::<prop::sample::Index>()), 1..200),
    ) {
        // Clients acquire, or release one of their outstanding acquisitions (admitted or
        // refused: every acquisition is released, as Envoy does).
        let mut outstanding: Vec<bool> = Vec::new();
        let mut state = None;
        for (acquire, pick) in actions {
            let hits = if acquire || outstanding.is_empty() { 1 } else { -1 };
            let t = decide(state.as_ref(), &limit, 0, hits);
            state = Some(t.next);
            if hits > 0 {
                outstanding.push(t.decision.allowed);
            } else {
                outstanding.remove(pick.index(outstanding.len()));
            }
            let admitted_in_flight = outstanding.iter().filter(|&&a| a).count() as u64;
            prop_assert!(admitted_in_flight <= limit.requests);
        }
    }

    #[test]
    fn decisions_are_monotone_in_hits(
        algorithm in prop_oneof![
            Just(Algorithm::FixedWindow),
            Just(Algorithm::SlidingWindow),
            Just(Algorithm::TokenBucket),
            Just(Algorithm::Concurrency),
        ],
        seed in any::<u64>(),
        steps in steps(60 * SECOND),
        small in 0i64..5,
        extra in 0i64..5,
    ) {
        let limit = Limit {
            overdraft: false,
            requests: 1 + seed % 10,
            window: 60 * SECOND,
            algorithm,
            burst: 1 + (seed >> 8) % 10,
        };
        let limit = if algorithm == Algorithm::TokenBucket { limit } else { Limit { burst: limit.requests, ..limit } };
        let mut now = 1_700_000_000 * SECOND;
        let mut state = None;
        for step in &steps {
            now += step.gap;
            let t = decide(state.as_ref(), &limit, now, step.hits);
            if (t.decision.allowed && step.hits != 0) || applies_unconditionally(&limit, step.hits) {
                state = Some(t.next);
            }
            let fewer = decide(state.as_ref(), &limit, now, small);
            let more = decide(state.as_ref(), &limit, now, small + extra);
            prop_assert!(!more.decision.allowed || fewer.decision.allowed);
        }
    }

    #[test]
    fn refunds_never_create_capacity_beyond_the_limit(
        algorithm in prop_oneof![
            Just(Algorithm::FixedWindow),
            Just(Algorithm::SlidingWindow),
            Just(Algorithm::TokenBucket),
            Just(Algorithm::Concurrency),
        ],
        limit_size in 1u64..20,
        steps in steps(60 * SECOND),
    ) {
        let limit = Limit::new(limit_size, 60 * SECOND, algorithm);
        let (_, remaining) = run(&limit, &steps);
        prop_assert!(remaining.iter().all(|&r| r <= limit.burst.max(limit.requests)), "{remaining:?}");
    }

    #[test]
    fn a_fixed_window_budget_records_every_charge_and_passes_exactly_when_there_is_room(
        limit in limit_strategy(Algorithm::FixedWindow),
        steps in budget_steps(60 * SECOND),
    ) {
        let limit = limit.with_overdraft(true);
        // The model: one count per window, charged whatever the answer.
        let (mut window, mut count) = (u64::MAX, 0u64);
        for (t, h, allowed) in run_all(&limit, &steps) {
            if t / limit.window != window {
                (window, count) = (t / limit.window, 0);
            }
            if h >= 0 {
                let room = (h as u64).max(1);
                prop_assert_eq!(allowed, count + room <= limit.requests, "count {} at {}", count, t);
                count += h as u64;
            } else {
                count = count.saturating_sub(h.unsigned_abs());
            }
        }
    }

    #[test]
    fn a_sliding_window_budget_passes_nothing_its_recorded_charges_leave_no_room_for(
        limit in limit_strategy(Algorithm::SlidingWindow),
        steps in budget_steps(60 * SECOND),
    ) {
        let limit = limit.with_overdraft(true);
        let (mut window, mut count) = (u64::MAX, 0u64);
        for (t, h, allowed) in run_all(&limit, &without_refunds(steps)) {
            if t / limit.window != window {
                (window, count) = (t / limit.window, 0);
            }
            if allowed {
                prop_assert!(count + (h as u64).max(1) <= limit.requests, "count {} at {}", count, t);
            }
            count += h as u64;
        }
    }

    #[test]
    fn a_token_bucket_budget_passes_nothing_while_in_debt(
        limit in limit_strategy(Algorithm::TokenBucket),
        steps in budget_steps(SECOND),
    ) {
        let limit = limit.with_overdraft(true);
        let all = run_all(&limit, &without_refunds(steps));
        let interval = limit.window as f64 / limit.requests as f64;
        for (i, &(now, h, allowed)) in all.iter().enumerate() {
            if !allowed {
                continue;
            }
            // Every charge recorded since any earlier instant, and this one's room, fit in
            // the burst plus what refilled since.
            for &(start, _, _) in &all[..=i] {
                let since: i64 = all[..i].iter().filter(|(t, _, _)| *t >= start).map(|(_, h, _)| h).sum();
                let needed = since as f64 + h.max(1) as f64;
                let allowance = limit.burst as f64 + (now - start) as f64 / interval;
                prop_assert!(needed <= allowance + 1e-6, "{} > {} at {}", needed, allowance, now);
            }
        }
    }
}
