//! Regions cut off from the root on the model: what they hold, then their failure mode.

use super::*;

#[tokio::test(flavor = "current_thread")]
async fn a_cut_region_admits_what_it_holds_then_denies_while_the_others_carry_on() {
    let planet = planet(&[2, 2]);
    let limit = limit(100_000, WINDOW, Algorithm::FixedWindow, 100_000);
    // Both regions busy for 2 s: their pools and blocks fill.
    rounds(&planet, &limit, 80, 2, 25_000).await;
    planet.regions[1].link.state.lock().cut = true;
    let cut_at = planet.clock.now();
    let tail = (PERIOD + LEASE_PERIOD).as_micros() as Micros;
    let mut in_cut = Vec::new();
    while planet.clock.now() < cut_at + 2 * tail {
        let admitted = rounds(&planet, &limit, 1, 2, 25_000).await;
        in_cut.push((planet.clock.now() - cut_at, admitted));
    }
    let held: u64 = in_cut.iter().map(|(_, a)| a[1]).sum();
    let late: Vec<_> = in_cut
        .iter()
        .filter(|(t, a)| *t >= tail && a[1] > 0)
        .collect();
    // (What it held may be little: a pool lives a region lease period after its last grant,
    // and a well-stocked pool is not asked for more.)
    assert!(
        late.is_empty(),
        "the cut region admitted past its pool and blocks ({held} in all): {late:?}"
    );
    // The connected region admitted (nearly) all it was asked: 2 instances × 2 hits a round
    // (a round whose pool ran dry waits for its ask to land, at the next round here).
    let connected: u64 = in_cut.iter().map(|(_, a)| a[0]).sum();
    assert!(connected * 10 >= in_cut.len() as u64 * 4 * 9, "{in_cut:?}");
    let status = planet.regions[1].instances[0].regions.region_status();
    assert!(
        !status.root_reachable && status.failure_mode_decisions > 0,
        "{status:?}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_request_with_a_regional_counter_loses_none_of_its_units_in_a_cut() {
    let planet = planet(&[1]);
    let instance = &planet.regions[0].instances[0];
    let global = limit(1000, WINDOW, Algorithm::FixedWindow, 1000);
    let per_user = limit(100, WINDOW, Algorithm::FixedWindow, 100);
    let user = |hits| CounterOp {
        consistency: Consistency::Leased,
        failure_mode: FailureMode::Allow,
        ..counters::op("model", [("user", "u")], per_user, hits, Role::Enforce)
    };
    let both = || batch(vec![op(&global, 1, FailureMode::Allow), user(1)]);
    let mut admitted = 0u64;
    // Cut off from the start: the global counter's pool never fills, its failure mode
    // (allow) answers; the user's counter is the region's own and leases as usual.
    planet.regions[0].link.state.lock().cut = true;
    for _ in 0..60 {
        let applied = instance.leased.apply(&both()).await.unwrap();
        if applied.decisions[1].allowed && applied.admitted {
            admitted += 1;
        }
        settle().await;
        planet.clock.advance(50_000);
        sweep(&planet).await;
        settle().await;
    }
    // Then the user's counter alone, until its instance is refused with nothing in hand:
    // every unit its leases took was admitted, whatever the global counter's calls did.
    let mut refused = 0;
    while refused < 2 {
        let applied = instance.leased.apply(&batch(vec![user(1)])).await.unwrap();
        if applied.admitted {
            admitted += 1;
            refused = 0;
        } else {
            refused += 1;
            planet.clock.advance(300_000);
        }
        assert!(admitted <= 100, "more than the limit");
    }
    assert_eq!(admitted, 100);
}
