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
    // At most a round trip's demand per window start (before advance asks: 12, 45 and 69);
    // the region beside the root, none.
    assert_eq!(refused[0], 0, "{refused:?}");
    for (r, round_trip) in [(1, 0.08), (2, 0.15)] {
        let bound = 3.0 * 160.0 * round_trip;
        assert!(refused[r] as f64 <= bound, "{refused:?}");
    }
}
