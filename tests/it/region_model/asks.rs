//! A region's asks to the root on the model: units lost by reason, a lost reply asked again,
//! the next window asked ahead.

use super::*;

/// Units a region cannot give back are counted by reason: a pool withdrawn after its root
/// window ended is refused by the root (its units died with the window), and a request
/// refused by another of its limits gives back to its pool what it took.
#[tokio::test(flavor = "current_thread")]
async fn units_lost_to_the_planet_are_counted_by_reason() {
    let planet = planet(&[1]);
    let limit = limit(600, WINDOW, Algorithm::FixedWindow, 600);
    let regions = planet.regions[0].instances[0].regions.clone();
    let one = || batch(vec![op(&limit, 1, FailureMode::Deny)]);
    planet.clock.advance(WINDOW / 2);
    // The first take asks the root; the second is decided from the pool.
    regions.apply(&one()).await.unwrap();
    settle().await;
    assert!(regions.apply(&one()).await.unwrap().admitted);
    let free = regions.region_status().pool_free;
    assert!(free > 0, "the pool holds units");
    // A request whose other limit refuses: what it took goes back, nothing is lost.
    let mut mixed = one();
    let mut other = counters::op("model", [("user", "u")], limit, 1, Role::Enforce);
    other.limit.requests = 0;
    mixed.ops.push(other);
    assert!(!regions.apply(&mixed).await.unwrap().admitted);
    assert_eq!(regions.region_status().units_lost, [0, 0, 0]);
    // The window ends with units in the pool: its hand-back is refused, they are lost.
    planet.clock.advance(WINDOW / 2 + SECOND);
    regions.sweep_now().await;
    let status = regions.region_status();
    assert_eq!(status.units_lost[0], free, "{status:?}");
}

/// A grant whose reply is lost is not lost: the region asks again at once with the same ask,
/// and the root answers with what it granted, once. Four lost replies on the way: the planet
/// still admits the whole limit, and no more.
#[tokio::test(flavor = "current_thread")]
async fn a_lost_reply_costs_nothing_and_grants_nothing_twice() {
    let planet = planet(&[2]);
    let limit = limit(600, WINDOW, Algorithm::FixedWindow, 600);
    let mut total = 0;
    for round in 0..4 {
        planet.regions[0].link.state.lock().lose = 1;
        total += rounds(&planet, &limit, 50, 4, 25_000)
            .await
            .iter()
            .sum::<u64>();
        assert_eq!(planet.regions[0].link.state.lock().lose, 0, "round {round}");
    }
    // What instances and pools still hold goes back once they are idle.
    rounds(&planet, &limit, 20, 0, 250_000).await;
    total += rounds(&planet, &limit, 100, 4, 25_000)
        .await
        .iter()
        .sum::<u64>();
    assert_eq!(root_left(&planet, &limit).await, 0);
    assert_eq!(total, 600);
}

/// A hot key across window starts: each region asks for the next window ahead of it, so that
/// it is refused at a window start only while it cannot tell which window the root is in
/// (about a round trip), not for the next window's first ask on top.
#[tokio::test(flavor = "current_thread")]
async fn a_hot_key_is_refused_at_a_window_start_only_while_the_edge_is_uncertain() {
    let planet = planet_afar(&[1, 1, 1]);
    let limit = limit(1_000_000, 10 * SECOND, Algorithm::FixedWindow, 1_000_000);
    // 4 hits every 25 ms in each region (160 a second), for 40 s: four window starts.
    // (Counted after the first window: a new key is refused for its first ask's round trip.)
    let mut refused = vec![0u64; 3];
    for step in 0..1_600 {
        for (r, region) in planet.regions.iter().enumerate() {
            for _ in 0..4 {
                if !hit(&region.instances[0], &limit, 1, FailureMode::Deny).await && step >= 400 {
                    refused[r] += 1;
                }
            }
        }
        settle().await;
        planet.clock.advance(25_000);
        sweep(&planet).await;
        settle().await;
    }
    eprintln!("refused at window starts, by region (0, 80, 150 ms round trips): {refused:?}");
    // At most a round trip's demand per window start, and a step's (the pool ends half a
    // round trip before the root's window does, the next starts half one after; before
    // advance asks: 12, 45 and 69); the region beside the root, none.
    assert_eq!(refused[0], 0, "{refused:?}");
    for (r, round_trip) in [(1, 0.08), (2, 0.15)] {
        let bound = 3.0 * 160.0 * (round_trip + 0.025);
        assert!(refused[r] as f64 <= bound, "{refused:?}");
    }
}

/// A new key whose first request comes 100 ms before a window start: its first ask is for a
/// window over when it reaches the root (far regions) and takes nothing; the next take asks
/// for the root's current window at once, so the key is refused for a few round trips (the
/// first count of regions, the ask for the old window, the ask for the new one), not for a
/// quarter region lease period more (1,340 ms in the farthest region before).
#[tokio::test(flavor = "current_thread")]
async fn a_new_key_across_a_window_start_is_refused_for_a_few_round_trips() {
    let planet = planet_afar(&[2, 2, 2]);
    let window = 4 * SECOND;
    let limit = limit(1_000_000, window, Algorithm::FixedWindow, 1_000_000);
    let now = planet.clock.now();
    planet.clock.advance(window - now % window - 100_000);
    let first = planet.clock.now();
    // 100 a second in each region (one request per instance every 20 ms) for 2 s: the last
    // refusal of each region, from the first request.
    let mut last = [0; 3];
    for _ in 0..100 {
        for (r, region) in planet.regions.iter().enumerate() {
            for instance in &region.instances {
                if !hit(instance, &limit, 1, FailureMode::Deny).await {
                    last[r] = planet.clock.now() - first;
                }
            }
        }
        settle().await;
        planet.clock.advance(20_000);
        sweep(&planet).await;
        settle().await;
    }
    eprintln!(
        "a new key 100 ms before a window start: last refused, by region (0, 80, 150 ms round trips): {last:?} µs"
    );
    for (r, round_trip) in [(0, 0), (1, 80_000), (2, 150_000)] {
        assert!(last[r] <= 5 * round_trip.max(20_000), "{last:?}");
    }
}

/// A pool whose grants came over calls of different speeds: its offset is the largest
/// (the slow call's), its end the fast calls' (the window's end, nearly). A block taken in
/// the last stretch of the window reads the root's time past the window's end: it must still
/// end with the pool's window, not live a lease period into the next one, where the next
/// window's own limit is admitted too.
#[tokio::test(flavor = "current_thread")]
async fn a_block_taken_at_a_windows_end_ends_with_it_whatever_the_calls_took() {
    let planet = planet(&[1]);
    let window = 4 * SECOND;
    let limit = limit(1_000, window, Algorithm::FixedWindow, 1_000);
    let now = planet.clock.now();
    planet.clock.advance(window - now % window + SECOND / 2);
    let first = planet.clock.now() / window;
    // The first asks over a slow link (150 ms each way), the rest over a fast one; 100
    // requests a second in the first window, 500 in the second (twice its limit).
    planet.regions[0].link.state.lock().delay = 150_000;
    let mut per_window = std::collections::BTreeMap::new();
    for step in 0..750 {
        if step == 50 {
            planet.regions[0].link.state.lock().delay = 0;
        }
        let now = planet.clock.now();
        let hits = if now / window == first { 1 } else { 5 };
        for _ in 0..hits {
            if hit(
                &planet.regions[0].instances[0],
                &limit,
                1,
                FailureMode::Deny,
            )
            .await
            {
                *per_window.entry(now / window - first).or_insert(0u64) += 1;
            }
        }
        settle().await;
        planet.clock.advance(10_000);
        sweep(&planet).await;
        settle().await;
    }
    eprintln!("admitted per window: {per_window:?}");
    assert!(per_window[&1] <= 1_000, "{per_window:?}");
}
