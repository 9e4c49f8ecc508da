//! Clocks: three instances whose operating-system clocks are 2 s behind, 0.4 s ahead of and
//! 3 s ahead of the machine's (and so of Redis's, which runs on it unshifted), under load.
//! The offsets are real: each instance runs under libfaketime (preloaded), and the test
//! reads each instance's clock back from the timestamps of its own log.
//!
//! Sluice's key layout decides every window on Redis's clock (`TIME` in the script), and a
//! leased block's lifetime is a duration measured on the instance, so the offsets change
//! nothing there. The reference's layout (`REDIS_KEY_FORMAT=reference`) names each fixed
//! window by the instance's clock, as the reference does: instances a second or more apart
//! count the same second in different keys.

use std::collections::BTreeMap;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

use super::{Sent, check, drive, wall_micros};
use crate::common::redis::RedisServer;
use crate::common::{SluiceProcess, config_dir};

/// Each instance's offset, as libfaketime's `FAKETIME` spells it (seconds).
const OFFSETS: [&str; 3] = ["-2", "+0.4", "+3"];
/// Every rule's limit: per second.
const LIMIT: u64 = 20;

/// One rule per algorithm on the key `k` (the value names it), each 20 a second.
const RULES: &str = "domain: f
descriptors:
  - key: k
    value: fixed
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: k
    value: sliding
    rate_limit: {unit: second, requests_per_unit: 20, algorithm: sliding_window}
  - key: k
    value: bucket
    rate_limit: {unit: second, requests_per_unit: 20, algorithm: token_bucket}
  - key: k
    value: leased
    consistency: leased
    rate_limit: {unit: second, requests_per_unit: 20}
";

/// libfaketime's preload library, from Debian's `faketime` package (scripts/test installs it).
fn libfaketime() -> String {
    let found = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("faketime/libfaketime.so.1"))
        .find(|p| p.exists());
    found
        .expect("libfaketime.so.1 under /usr/lib/*/faketime/: install Debian's faketime (scripts/test does)")
        .display()
        .to_string()
}

/// The offset of an instance's clock from the machine's, in seconds, read from the first
/// timestamp of its start-up log (`2026-12-07T06:20:00.123456Z ...`) against the machine's
/// clock just before it started (the start takes well under the offsets measured).
fn logged_offset(instance: &SluiceProcess, machine_before: u64) -> f64 {
    let line = &instance.startup_log[0];
    let stamp = line.split_whitespace().next().unwrap_or_default();
    let clock = stamp
        .split('T')
        .nth(1)
        .and_then(|t| t.strip_suffix('Z'))
        .unwrap_or_else(|| panic!("no timestamp in {line:?}"));
    let mut parts = clock.split(':');
    let mut second_of_day = 0.0;
    for scale in [3600.0, 60.0, 1.0] {
        let part: f64 = parts.next().and_then(|p| p.parse().ok()).unwrap();
        second_of_day += part * scale;
    }
    let machine = (machine_before as f64 / 1e6) % 86_400.0;
    (second_of_day - machine + 43_200.0).rem_euclid(86_400.0) - 43_200.0
}

/// Three instances on `redis`, each under its offset from [`OFFSETS`], started with `args`;
/// returns them with their clients after checking each runs at its offset.
async fn offset_fleet(
    redis: &RedisServer,
    args: &[&str],
) -> (Vec<SluiceProcess>, Vec<RateLimitServiceClient<Channel>>) {
    let dir = config_dir("faults-clocks", &[("f.yaml", RULES)]);
    let lib = libfaketime();
    let url = redis.url();
    // (A 1 s deadline and failure_mode deny: on a loaded machine a call past the default
    // 15 ms was answered by the default failure mode, allow, and its admission counted in
    // no window: 21-22 admitted in one second of a limit of 20, nothing to do with clocks.)
    let mut all = vec![
        "--backend",
        "redis",
        "--redis-url",
        &url,
        "--redis-deadline",
        "1s",
        "--failure-mode",
        "deny",
    ];
    all.extend_from_slice(args);
    let mut instances = Vec::new();
    for offset in OFFSETS {
        let before = wall_micros();
        let env = [
            ("LD_PRELOAD", lib.as_str()),
            ("FAKETIME", offset),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ];
        let instance = SluiceProcess::spawn_with_env(&dir, &all, &env);
        let measured = logged_offset(&instance, before);
        let wanted: f64 = offset.parse().unwrap();
        assert!(
            (measured - wanted).abs() < 0.3,
            "an instance under FAKETIME={offset} logs a clock {measured:.3} s off"
        );
        instances.push(instance);
    }
    let clients = crate::common::process::clients(&instances).await;
    (instances, clients)
}

/// Per rule: the most admitted in one second of the machine's (Redis's) clock, counting only
/// answers sent and answered within that second (a lower bound of what the store counted
/// there: a request on the wire across a boundary could have been counted on either side).
fn most_in_one_second(history: &[Sent]) -> BTreeMap<String, u64> {
    let mut per_window: BTreeMap<(String, u64), u64> = BTreeMap::new();
    for s in history.iter().filter(|s| s.answer == "OK") {
        let (sent, answered) = (s.wall.0 / 1_000_000, s.wall.1 / 1_000_000);
        if sent == answered {
            *per_window.entry((s.key.clone(), sent)).or_default() += 1;
        }
    }
    let mut most = BTreeMap::new();
    for ((key, _), n) in per_window {
        let m = most.entry(key).or_insert(0);
        *m = n.max(*m);
    }
    most
}

/// What the load admits on each rule: 50 requests a second on each (three times the limit
/// of 20), round-robin over the three instances, for 5 s.
async fn load(clients: &[RateLimitServiceClient<Channel>]) -> Vec<Sent> {
    let keys: Vec<String> = ["fixed", "sliding", "bucket", "leased"]
        .map(String::from)
        .to_vec();
    drive(clients, "f", &keys, 200, Duration::from_secs(5), |_| {}).await
}

/// A token bucket's bound over the run: the burst (the limit) plus the rate (the limit a
/// second) times the span from the first request sent to the last answered.
fn bucket_bound(history: &[Sent]) -> u64 {
    let first = history.iter().map(|s| s.wall.0).min().unwrap();
    let last = history.iter().map(|s| s.wall.1).max().unwrap();
    LIMIT + (LIMIT as f64 * (last - first) as f64 / 1e6).floor() as u64
}

/// Sluice's layout: every algorithm within its limit per second of Redis's clock (fixed,
/// sliding and leased windows at most 20 in any second; the token bucket at most its burst
/// plus its rate over the run), as with clocks in step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offset_instance_clocks_change_nothing_in_sluices_layout() {
    let redis = RedisServer::start();
    let (_instances, clients) = offset_fleet(&redis, &[]).await;
    let history = load(&clients).await;
    let verdict = check(&history);
    assert_eq!(verdict.errors, 0);
    let most = most_in_one_second(&history);
    let bound = bucket_bound(&history);
    eprintln!(
        "figures: clocks offset {OFFSETS:?} s, Sluice's layout: admitted {:?} in 5 s; most in one second {most:?}; token bucket bound {bound}",
        verdict.admitted
    );
    for rule in ["fixed", "sliding", "leased"] {
        assert!(most[rule] <= LIMIT, "{rule}: {most:?}");
    }
    // The load reached every limit: each rule refused some of its requests.
    for rule in ["fixed", "sliding", "bucket", "leased"] {
        let refused = history
            .iter()
            .filter(|s| s.key == rule && s.answer == "OVER_LIMIT")
            .count();
        assert!(refused > 0, "{rule} never reached its limit");
    }
    assert!(
        verdict.admitted["bucket"] <= bound,
        "{:?}",
        verdict.admitted
    );
}

/// The reference's layout: each instance counts the second its own clock names, so with
/// clocks seconds apart the fleet admits up to the limit per instance in one second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offset_instance_clocks_split_the_reference_layouts_windows() {
    let redis = RedisServer::start();
    let (_instances, clients) = offset_fleet(&redis, &["--redis-key-format", "reference"]).await;
    let history = load(&clients).await;
    let verdict = check(&history);
    assert_eq!(verdict.errors, 0);
    let most = most_in_one_second(&history);
    eprintln!(
        "figures: clocks offset {OFFSETS:?} s, the reference's layout: admitted {:?} in 5 s; most in one second {most:?}",
        verdict.admitted
    );
    // Fixed windows are named by each instance's clock: more than the limit in one second,
    // at most the limit per instance.
    assert!(most["fixed"] > LIMIT, "{most:?}");
    assert!(most["fixed"] <= LIMIT * 3, "{most:?}");
    // The other algorithms keep Sluice's keys and Redis's clock.
    for rule in ["sliding", "leased"] {
        assert!(most[rule] <= LIMIT, "{rule}: {most:?}");
    }
}
