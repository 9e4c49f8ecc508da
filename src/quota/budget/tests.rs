// Why one long file: the budget's rules, each against the same model of Envoy's token buckets
// and its simulation.
//! The budget against a model of Envoy 1.40's token buckets: whatever the demand does, the
//! fleet never admits more than burst + rate × t in any interval t.

use super::*;

/// Envoy's bucket as 1.40 keeps it: continuous refill, a new bucket full, a replacement at
/// the old one's fill fraction.
#[derive(Debug, Clone, Copy)]
struct EnvoyBucket {
    share: Share,
    tokens: f64,
}

impl EnvoyBucket {
    fn apply(old: Option<EnvoyBucket>, share: Share) -> Option<EnvoyBucket> {
        if share.is_empty() {
            return Some(EnvoyBucket { share, tokens: 0.0 });
        }
        let tokens = match old {
            Some(o) if !o.share.is_empty() => o.tokens / o.share.burst as f64 * share.burst as f64,
            _ => share.burst as f64,
        };
        Some(EnvoyBucket { share, tokens })
    }
}

struct Run {
    admitted: Vec<f64>,
    shares: Vec<Vec<Share>>,
}

/// `demand(envoy, t)`: requests per second an Envoy gets at `t`. Ticks every second, reports
/// every 5 s (staggered), 0.05 s steps, for `seconds`.
fn simulate(
    budget: Budget,
    envoys: usize,
    seconds: f64,
    demand: &dyn Fn(usize, f64) -> f64,
) -> Run {
    let dt = 0.05;
    let mut state = BudgetState::new(budget, budget.share_of(budget.rate), 0.0, true);
    let mut buckets: Vec<Option<EnvoyBucket>> = vec![None; envoys];
    let mut arrivals = vec![0.0f64; envoys];
    let mut counts = vec![(0u64, 0u64); envoys];
    let mut admitted = Vec::new();
    let mut shares = Vec::new();
    let mut t = 0.0;
    let mut next_tick = 1.0;
    // When the last changes reached the Envoys (they arrive in the step that makes them).
    let mut delivered = 0.0;
    let mut next_report: Vec<f64> = (0..envoys).map(|i| 0.5 + i as f64 * 1.3).collect();
    while t < seconds {
        let mut step_admitted = 0.0;
        for i in 0..envoys {
            arrivals[i] += demand(i, t) * dt;
            if let Some(b) = &mut buckets[i] {
                let per_second = budget.per_second(b.share.rate);
                b.tokens = (b.tokens + per_second * dt).min(b.share.burst as f64);
            }
            while arrivals[i] >= 1.0 {
                arrivals[i] -= 1.0;
                match &mut buckets[i] {
                    None => {
                        // No assignment: ALLOW_ALL (what the first report lets through).
                        counts[i].0 += 1;
                    }
                    Some(b) if b.tokens >= 1.0 => {
                        b.tokens -= 1.0;
                        counts[i].0 += 1;
                        step_admitted += 1.0;
                    }
                    Some(_) => counts[i].1 += 1,
                }
            }
        }
        admitted.push(step_admitted);
        let mut changes = Vec::new();
        for i in 0..envoys {
            if t >= next_report[i] {
                let (a, d) = std::mem::take(&mut counts[i]);
                state.report(i as StreamId, a, d, t);
                next_report[i] += REPORT_INTERVAL;
                if buckets[i].is_none() {
                    changes.extend(state.step(t, &|_| Some(delivered)));
                }
            }
        }
        if t >= next_tick {
            changes.extend(state.step(t, &|_| Some(delivered)));
            next_tick += 1.0;
            shares.push(
                (0..envoys)
                    .map(|i| state.sent(i as StreamId).unwrap_or_default())
                    .collect(),
            );
        }
        if !changes.is_empty() {
            delivered = t;
        }
        for (stream, share) in changes {
            let i = stream as usize;
            buckets[i] = EnvoyBucket::apply(buckets[i], share);
        }
        t += dt;
    }
    Run { admitted, shares }
}

/// The most admitted in any interval of `k` steps of 0.05 s, over every start.
fn worst(admitted: &[f64], k: usize) -> f64 {
    let mut prefix = vec![0.0];
    for a in admitted {
        prefix.push(prefix.last().unwrap() + a);
    }
    (0..admitted.len().saturating_sub(k))
        .map(|s| prefix[s + k] - prefix[s])
        .fold(0.0, f64::max)
}

fn assert_within_bound(budget: Budget, run: &Run, envoys: usize) {
    for k in [1, 10, 20, 100, 200, 600, 1200] {
        let t = k as f64 * 0.05;
        // One token per new Envoy may be handed out past the reserve (a bucket cannot be
        // empty), plus one step's rounding; and each Envoy joining a budget held by others
        // its floor in advance: its capacity and its rate until the room for it is made (a
        // lowering delivered at once settles within a second, seen at the next tick).
        let joining = envoys.saturating_sub(1) as f64;
        let floor = budget.share_of(floor(budget.rate, 2)); // the largest: the second Envoy
        let advance = floor.burst as f64 + budget.per_second(floor.rate) * (SETTLE + 1.0);
        let bound = budget.burst as f64
            + budget.per_second(budget.rate) * t
            + envoys as f64
            + 1.0
            + joining * advance;
        let seen = worst(&run.admitted, k);
        assert!(seen <= bound, "{seen} admitted in {t} s, bound {bound}");
    }
}

#[test]
fn one_envoy_gets_the_whole_budget() {
    let budget = Budget {
        rate: 10,
        burst: 10,
        window: 1,
    };
    let run = simulate(budget, 1, 30.0, &|_, _| 50.0);
    assert_within_bound(budget, &run, 1);
    assert_eq!(
        run.shares.last().unwrap()[0],
        Share {
            rate: 10,
            burst: 10
        }
    );
    // It admits the rate: about 10 per second once assigned.
    let admitted: f64 = run.admitted[200..].iter().sum();
    assert!(admitted >= 0.9 * 10.0 * 20.0, "{admitted}");
}

#[test]
fn an_idle_envoys_share_moves_to_a_busy_one_within_the_bound() {
    let budget = Budget {
        rate: 20,
        burst: 20,
        window: 1,
    };
    // Envoy 0 busy for 30 s then idle; Envoy 1 idle, then busy.
    let demand = |i: usize, t: f64| match (i, t < 30.0) {
        (0, true) | (1, false) => 100.0,
        _ => 0.0,
    };
    let run = simulate(budget, 2, 70.0, &demand);
    assert_within_bound(budget, &run, 2);
    let at = |second: usize| run.shares[second].clone();
    let busy_then = at(25);
    assert!(busy_then[0].rate >= 14, "{busy_then:?}");
    let busy_now = at(65);
    assert!(busy_now[1].rate >= 14, "{busy_now:?}");
    assert_eq!(busy_now[0].rate + busy_now[1].rate, 20);
}

#[test]
fn three_envoys_with_changing_demand_stay_within_the_bound() {
    let budget = Budget {
        rate: 60,
        burst: 60,
        window: 60,
    };
    let demand = |i: usize, t: f64| {
        let phase = ((t / 7.0) as usize + i) % 3;
        [0.0, 0.5, 5.0][phase]
    };
    let run = simulate(budget, 3, 120.0, &demand);
    assert_within_bound(budget, &run, 3);
}

#[test]
fn a_token_bucket_with_a_small_burst_stays_within_its_burst() {
    let budget = Budget {
        rate: 100,
        burst: 10,
        window: 1,
    };
    let demand = |i: usize, t: f64| {
        if (t as usize / 10 + i).is_multiple_of(2) {
            200.0
        } else {
            1.0
        }
    };
    let run = simulate(budget, 2, 60.0, &demand);
    assert_within_bound(budget, &run, 2);
}

#[test]
fn a_closed_streams_share_is_counted_until_its_ttl() {
    let budget = Budget {
        rate: 10,
        burst: 10,
        window: 1,
    };
    let mut state = BudgetState::new(budget, budget.share_of(10), 0.0, true);
    state.report(1, 1, 0, 0.0);
    assert_eq!(
        state.step(0.0, &|_| Some(0.0)),
        vec![(
            1,
            Share {
                rate: 10,
                burst: 10
            }
        )]
    );
    state.leave(1, 12.0);
    // A newcomer gets its floor in advance (a quarter of an even split between two); an
    // Envoy that reconnected is left to what it holds.
    state.report(2, 1, 0, 1.0);
    state.report_seen((3, 3), 1, 0, 1.0, false);
    let changes = state.step(1.0, &|_| Some(1.0));
    assert_eq!(
        changes,
        vec![(2, Share { rate: 1, burst: 1 })],
        "nothing but the floor is free before the TTL"
    );
    state.leave(3, 1.0);
    let changes = state.step(13.0, &|_| Some(13.0));
    assert_eq!(changes.len(), 1);
    assert!(changes[0].1.rate > 1, "{changes:?}");
}

#[test]
fn a_newcomer_gets_its_floor_at_once_one_at_a_time() {
    let budget = Budget {
        rate: 100,
        burst: 100,
        window: 1,
    };
    let mut state = BudgetState::new(budget, budget.share_of(100), 0.0, true);
    state.report(1, 100, 0, 0.0);
    assert_eq!(
        state.step(0.0, &|_| Some(0.0)),
        vec![(1, budget.share_of(100))]
    );
    // Two new Envoys and a second stream of the first one's peer at once: the first
    // newcomer gets its floor of three peers (100 / 12) ahead of the lowering that makes
    // room for it; the others wait, told DENY_ALL.
    state.report(2, 1, 0, 1.0);
    state.report(3, 1, 0, 1.0);
    state.report_seen((4, 1), 1, 0, 1.0, true);
    let changes: HashMap<StreamId, Share> = state.step(1.0, &|_| Some(1.0)).into_iter().collect();
    assert_eq!(changes[&2], Share { rate: 8, burst: 8 }, "{changes:?}");
    assert_eq!(changes[&3], Share::default(), "{changes:?}");
    assert_eq!(changes[&4], Share::default(), "{changes:?}");
    assert!(changes[&1].rate < 100, "the first is lowered: {changes:?}");
    // Once the lowering has settled, the room is made: the others get theirs, and the
    // shares sent add up to the budget.
    state.step(2.5, &|_| Some(1.0));
    state.step(3.5, &|_| Some(1.0));
    let rates: u64 = (1..=4)
        .map(|s| state.sent(s).unwrap_or_default().rate)
        .sum();
    assert!(rates <= 100, "{rates}");
    for stream in [3, 4] {
        assert!(
            state.sent(stream).is_some_and(|s| s.rate > 0),
            "{:?}",
            state.shares()
        );
    }
}

#[test]
fn an_advance_without_room_is_taken_back_after_its_limit() {
    // Another instance holds the budget; this one's claim stays 0, so the newcomer's floor
    // is never covered: it is taken back after ADVANCE_LIMIT.
    let budget = Budget {
        rate: 100,
        burst: 100,
        window: 1,
    };
    let mut state = BudgetState::new(budget, Share::default(), 0.0, false);
    state.others = 1;
    state.others_peers = 1;
    state.others_demand = 100.0;
    state.report(1, 1, 0, 0.0);
    assert_eq!(
        state.step(0.0, &|_| Some(0.0)),
        vec![(1, budget.share_of(12))],
        "a floor of two peers, at once"
    );
    assert!(state.step(ADVANCE_LIMIT - 1.0, &|_| Some(0.0)).is_empty());
    assert_eq!(
        state.step(ADVANCE_LIMIT, &|_| Some(0.0)),
        vec![(1, Share::default())]
    );
}

#[test]
fn a_lowering_is_counted_until_it_was_delivered() {
    let budget = Budget {
        rate: 10,
        burst: 10,
        window: 1,
    };
    let mut state = BudgetState::new(budget, budget.share_of(10), 0.0, true);
    state.report(1, 50, 0, 0.0);
    state.step(0.0, &|_| Some(0.0));
    state.report(2, 50, 0, 0.5);
    let first = state.step(1.0, &|_| None);
    assert!(
        first.iter().any(|(s, share)| *s == 1 && share.rate < 10),
        "{first:?}"
    );
    // Not delivered: Envoy 2 gets nothing yet.
    let second = state.step(5.0, &|_| None);
    assert!(
        !second.iter().any(|(s, share)| *s == 2 && share.rate > 0),
        "{second:?}"
    );
    let third = state.step(7.0, &|_| Some(5.5));
    assert!(
        third.iter().any(|(s, share)| *s == 2 && share.rate > 0),
        "{third:?}"
    );
}

#[test]
fn shadow_mode_counts_what_the_budget_would_have_denied() {
    let budget = Budget {
        rate: 10,
        burst: 10,
        window: 1,
    };
    let mut state = BudgetState::new(budget, budget.share_of(10), 0.0, true);
    assert_eq!(state.shadow_admitted(25, 0.0), 15);
    assert_eq!(state.shadow_admitted(5, 1.0), 0);
}

#[test]
fn raising_a_full_bucket_waits_for_the_reserve() {
    // 60 per minute: a raise's tokens come back at one per second.
    let budget = Budget {
        rate: 60,
        burst: 60,
        window: 60,
    };
    let mut state = BudgetState::new(budget, budget.share_of(60), 0.0, true);
    let delivered = |t: f64| move |_| Some(t);
    state.report(1, 1, 0, 0.0);
    state.report(2, 1, 0, 0.0);
    let first = state.step(0.0, &delivered(0.0));
    assert_eq!(first.len(), 2, "{first:?}");
    let full = state.sent(1).unwrap();
    // Envoy 1 admitted nothing (its bucket is full) but reports demand; Envoy 2 goes idle.
    state.report(1, 0, 500, 10.0);
    state.report(2, 0, 0, 10.0);
    let lowered = state.step(10.0, &delivered(9.0));
    assert!(
        lowered
            .iter()
            .any(|(s, share)| *s == 2 && share.rate < full.rate),
        "{lowered:?}"
    );
    let raised = state.step(11.5, &delivered(10.0));
    let one = raised.iter().find(|(s, _)| *s == 1).expect("raised").1;
    assert!(one.rate > full.rate, "the rate moves at once: {one:?}");
    assert!(
        one.burst <= full.burst + 2,
        "a full bucket's capacity waits for the reserve: {one:?}"
    );
    // Once Envoy 1 has spent its tokens (as a busy Envoy does), raising its capacity hands
    // out nothing at once, and the capacity follows.
    state.report(1, 40, 500, 16.0);
    let later = state.step(16.0, &delivered(12.0));
    let one = later.iter().find(|(s, _)| *s == 1).expect("raised").1;
    assert!(one.burst >= full.burst + 15, "{one:?}");
}

#[test]
fn raising_a_full_bucket_is_paid_from_the_reserve() {
    // Envoy 0 idles with a full bucket and spikes now and then; Envoy 1 is busy, stops and
    // starts again: Envoy 0's share rises while its bucket is full.
    let budget = Budget {
        rate: 20,
        burst: 20,
        window: 1,
    };
    let demand = |i: usize, t: f64| match i {
        0 if t % 10.0 < 0.3 => 2000.0,
        0 => 2.0,
        _ if (20.0..40.0).contains(&t) => 0.0,
        _ => 100.0,
    };
    let run = simulate(budget, 2, 80.0, &demand);
    assert_within_bound(budget, &run, 2);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    /// A demand pattern: for each Envoy, a rate per phase of 5 s (often 0, sometimes a flood).
    fn pattern(envoys: usize) -> impl Strategy<Value = Vec<Vec<f64>>> {
        let rate = prop_oneof![Just(0.0), 0.1f64..3.0, 3.0f64..50.0, Just(500.0)];
        proptest::collection::vec(proptest::collection::vec(rate, 12), envoys)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Whatever the demand does, the fleet stays within burst + rate × t (and a token per
        /// new Envoy): shares move down before up, and raises are paid from the reserve.
        #[test]
        fn the_fleet_stays_within_the_bound(
            rate in 1u64..60,
            burst in 1u64..60,
            window in prop_oneof![Just(1u64), Just(10), Just(60)],
            demands in (1usize..4).prop_flat_map(pattern),
        ) {
            let budget = Budget { rate, burst, window };
            let envoys = demands.len();
            let demand = |i: usize, t: f64| demands[i][((t / 5.0) as usize).min(11)];
            let run = simulate(budget, envoys, 60.0, &demand);
            assert_within_bound(budget, &run, envoys);
        }
    }
}

#[test]
fn the_fleets_part_is_max_min_fair_among_peers() {
    // 5 asked here against 10 elsewhere, of 10: 5 each (in proportion it was 3.5).
    assert_eq!(fair_part(10.0, &[5.0], 10.0, 1.0).round(), 5.0);
    assert_eq!(fair_part(10.0, &[10.0], 5.0, 1.0).round(), 5.0);
    // A small peer here gets all it asks; the rest is split evenly at the water level.
    assert!((fair_part(10.0, &[1.0, 10.0], 5.0, 1.0) - 5.5).abs() < 1e-6);
    // Every demand met: what is left is spread by the number of peers.
    assert!((fair_part(10.0, &[2.0], 3.0, 1.0) - 4.5).abs() < 1e-6);
}

#[test]
fn a_hundred_streams_of_one_peer_share_one_envoys_part() {
    let budget = Budget {
        rate: 10,
        burst: 10,
        window: 1,
    };
    let mut state = BudgetState::new(budget, budget.share_of(10), 0.0, true);
    for stream in 0..100 {
        state.report_seen((stream, 7), u64::MAX, u64::MAX, 0.0, false);
    }
    // 50 in a first report after a reconnect: counted over 5 s, 10 a second.
    state.report_seen((100, 8), 50, 0, 0.0, false);
    let peers = state.peer_demands();
    assert_eq!(peers.len(), 2);
    assert!(peers.iter().all(|(_, d)| *d <= 10.0), "{peers:?}");
    let targets = state.targets();
    let honest = targets.iter().find(|(s, _)| *s == 100).unwrap().1;
    let hostile: u64 = targets
        .iter()
        .filter(|(s, _)| *s != 100)
        .map(|(_, t)| t.rate)
        .sum();
    assert_eq!((honest.rate, hostile), (5, 5), "{targets:?}");
}
