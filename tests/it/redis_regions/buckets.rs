//! Global token buckets across regions with real Redis servers: within the burst plus the
//! rate over every stretch, through load, a cut and a root restart.

use super::*;

/// A global token bucket: over any stretch of time the planet admits at most the burst plus
/// the rate, and with demand at 4.5 times the rate in every region, nearly that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_bucket_across_regions_admits_its_burst_and_rate_and_no_more() {
    let root = RedisServer::start();
    let regions = planet("regions-bucket", &root, [0, 40, 75]).await;
    let histories = load(&regions, "bucket", 150, Duration::from_secs(8), |_| {}).await;
    let per_region: Vec<u64> = histories.iter().map(|h| admitted(h)).collect();
    for history in &histories {
        assert_eq!(errors(history), 0);
    }
    let (worst, bound, span) = bucket_bound(&histories);
    let total: u64 = per_region.iter().sum();
    eprintln!(
        "figures: a token bucket of {RATE} a second, burst {BURST}, in three regions (0, 80, 150 ms round trips): admitted {per_region:?} = {total} in {:.2} s, of at most {bound:.0}; closest approach to the bound over any stretch: {worst:.1}",
        span as f64 / 1e6
    );
    assert!(
        worst <= 0.0,
        "over the burst plus the rate by {worst:.1} over some stretch"
    );
    // Under: the root keeps about RATE x REGION_LEASE_PERIOD / 2 while the regions share
    // its refill (each takes a sixth of what is left every half second), and the regions
    // hold their pools and blocks.
    assert!(
        total as f64 >= 0.75 * bound,
        "{total} admitted of at most {bound:.0}"
    );
    // Every region gets a share: none waits on a nearer one.
    assert!(
        per_region.iter().all(|&n| n >= total / 6),
        "admitted per region {per_region:?}"
    );
}

/// The token bucket's bound over the planet's admitted requests: how far the closest
/// stretch of time comes to the burst plus the rate (negative: under it), the bound over the
/// whole run, and the run's span (µs).
fn bucket_bound(histories: &[Vec<Sent>]) -> (f64, f64, u64) {
    // Each admitted request was decided between its sending and its answer (wall clock, µs).
    let mut ok: Vec<(u64, u64)> = histories
        .iter()
        .flatten()
        .filter(|s| s.answer == "OK")
        .map(|s| s.wall)
        .collect();
    ok.sort();
    let longest = ok
        .iter()
        .map(|(sent, answered)| answered - sent)
        .max()
        .unwrap_or(0);
    let per_micro = RATE as f64 / 1e6;
    let mut worst = f64::MIN;
    for i in 0..ok.len() {
        for j in i..ok.len() {
            // Requests i..=j were decided within [sent_i, sent_j + the longest answer].
            let room = BURST as f64 + per_micro * (ok[j].0 - ok[i].0 + longest) as f64;
            worst = worst.max((j - i + 1) as f64 - room);
        }
    }
    let span = ok.last().map_or(0, |l| l.1) - ok.first().map_or(0, |f| f.0);
    (worst, BURST as f64 + per_micro * span as f64, span)
}

/// A global token bucket with a region cut off from the root: the cut region admits from
/// its holdings for the pool's and blocks' lifetimes, then denies; the planet stays within
/// the burst plus the rate over every stretch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_region_under_a_token_bucket_admits_what_it_holds_then_denies() {
    let root = RedisServer::start();
    let regions = planet("regions-bucket-cut", &root, [0, 20, 20]).await;
    let (cut_from, cut_to) = (Duration::from_secs(1), Duration::from_secs(7));
    let proxy = &regions[1].proxy;
    let histories = load(&regions, "bucket", 60, Duration::from_secs(8), |now| {
        proxy.set(if now >= cut_from && now < cut_to {
            Fault::BlackHole
        } else {
            Fault::Delay(Duration::from_millis(20))
        });
    })
    .await;
    for history in &histories {
        assert_eq!(errors(history), 0);
    }
    let (worst, bound, _) = bucket_bound(&histories);
    let tail = cut_from + Duration::from_secs(3);
    let late = histories[1]
        .iter()
        .filter(|s| s.at >= tail && s.at < cut_to && s.answer == "OK")
        .count();
    let per_region: Vec<u64> = histories.iter().map(|h| admitted(h)).collect();
    eprintln!(
        "figures: a token bucket, region 1 cut for 6 s: admitted {per_region:?} of at most {bound:.0}; region 1 admitted {late} from 3 s into the cut; closest approach to the bound: {worst:.1}"
    );
    assert!(worst <= 0.0, "over the burst plus the rate by {worst:.1}");
    assert_eq!(late, 0, "region 1 admitted late in the cut");
    assert!(per_region[0] > 0 && per_region[2] > 0);
}

/// A global token bucket through a root restarted with its append-only file under load: the
/// root keeps its arrival time, and the planet stays within the burst plus the rate over
/// every stretch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_bucket_through_a_root_restart_with_its_append_only_file_stays_within_its_bound() {
    let mut root = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let regions = planet("regions-bucket-restart", &root, [0, 20, 40]).await;
    let restart_at = Duration::from_secs(2);
    let mut restarted = false;
    let histories = load(&regions, "bucket", 100, Duration::from_secs(6), |now| {
        if now >= restart_at && !restarted {
            restarted = true;
            root.restart();
        }
    })
    .await;
    assert!(restarted);
    for history in &histories {
        assert_eq!(errors(history), 0);
    }
    let (worst, bound, _) = bucket_bound(&histories);
    let per_region: Vec<u64> = histories.iter().map(|h| admitted(h)).collect();
    eprintln!(
        "figures: a token bucket, the root restarted (append-only file) under load: admitted {per_region:?} of at most {bound:.0}; closest approach to the bound: {worst:.1}"
    );
    assert!(worst <= 0.0, "over the burst plus the rate by {worst:.1}");
}
