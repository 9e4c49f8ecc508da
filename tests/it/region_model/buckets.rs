//! Token buckets across regions on the model: never over the burst plus the rate, nearly
//! all of it admitted, and no token kept in a pool past its time.

use super::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Never over, token buckets: over any stretch of time t, the planet admits at most the
    /// burst plus what the bucket refills in t (`rate × t`), whatever the regions,
    /// instances, delays, cuts, lost replies and crashes; a root wipe within the stretch adds
    /// at most a burst (the debt it erased: what a flushed store costs exact counting). A
    /// cut region admits nothing once its pool and blocks have ended (`deny`).
    #[test]
    fn token_buckets_never_admit_more_than_burst_plus_rate(
        requests in prop_oneof![1u64..20, 20u64..2000],
        burst in prop_oneof![1u64..20, 20u64..2000],
        seconds in prop_oneof![Just(1u64), Just(10), Just(60)],
        short in any::<bool>(),
        sizes in proptest::collection::vec(1usize..4, 1..4),
        waves in waves(),
    ) {
        let limit = limit(requests, seconds * SECOND, Algorithm::TokenBucket, burst);
        // Waves a few emission intervals apart (when `short`): tokens that outlive their
        // time show there.
        let waves: Vec<Wave> = waves
            .into_iter()
            .map(|w| Wave {
                gap: if short { w.gap % (4 * seconds * SECOND / requests + 1) } else { w.gap },
                ..w
            })
            .collect();
        let Run { admitted, wipes, cut_off, .. } = run(limit, &sizes, &waves);
        prop_assert_eq!(admitted_past_holdings(&cut_off), None);
        for (i, &(start, _)) in admitted.iter().enumerate() {
            let mut total = 0u64;
            for &(t, hits) in &admitted[i..] {
                total += hits;
                let refill = (t - start) as f64 * requests as f64 / limit.window as f64;
                // A wipe erases the root's debt, at most a burst: what it costs exact counting.
                let erased = wipes.iter().filter(|w| start < **w && **w <= t).count() as u64;
                let room = (burst * (1 + erased)) as f64 + refill;
                prop_assert!(
                    total as f64 <= room + 1e-6,
                    "{total} admitted in {} µs: more than a burst of {burst} plus {refill:.2} refilled ({erased} wipes)",
                    t - start
                );
            }
        }
    }
}

/// A token bucket of 100 a second with a burst of 200, demand at four times the rate in
/// three regions 0, 80 and 150 ms from the root: over 30 s the planet admits at most the
/// burst plus the refill (3,200), and nearly all of it.
#[tokio::test(flavor = "current_thread")]
async fn a_token_bucket_across_regions_admits_its_rate() {
    let planet = planet_afar(&[2, 2, 1]);
    let limit = limit(100, SECOND, Algorithm::TokenBucket, 200);
    // 5 instances x 4 hits every 50 ms: 400 a second, for 30 s.
    let admitted = rounds(&planet, &limit, 600, 4, 50_000).await;
    let total: u64 = admitted.iter().sum();
    eprintln!("token bucket across regions: {admitted:?} = {total} of at most 3,200");
    assert!(total <= 3_200, "{admitted:?}");
    assert!(total >= 2_900, "{admitted:?}");
}

/// A token bucket's pool keeps no token past its time: tokens a region was granted and did
/// not use are the root's again once the bucket has refilled them, so at one instant a
/// second later the planet admits at most the burst (exact takes from the pools, where no
/// block's own expiry stands in).
#[tokio::test(flavor = "current_thread")]
async fn a_token_buckets_pool_keeps_no_token_past_its_time() {
    let planet = planet(&[1, 1]);
    let limit = limit(100, SECOND, Algorithm::TokenBucket, 20);
    let take = |r: usize| {
        let regions = planet.regions[r].instances[0].regions.clone();
        async move {
            let applied = regions
                .apply(&batch(vec![op(&limit, 1, FailureMode::Deny)]))
                .await
                .unwrap();
            applied.admitted
        }
    };
    // Region 0 takes a few: its pool is granted a share of the burst, most of it unused.
    let mut early = 0;
    for _ in 0..4 {
        early += u64::from(take(0).await);
        settle().await;
    }
    assert!(early > 0);
    planet.clock.advance(SECOND);
    let mut admitted = 0;
    for _ in 0..10 {
        for r in 0..2 {
            for _ in 0..20 {
                admitted += u64::from(take(r).await);
            }
        }
        settle().await;
    }
    assert!(admitted > 0);
    assert!(
        admitted <= 20,
        "{admitted} admitted at one instant, burst 20"
    );
}
