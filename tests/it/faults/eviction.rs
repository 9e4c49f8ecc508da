//! Redis at `maxmemory`: a policy that can evict counters is named at start-up and in a
//! metric, and what each policy does to the counts when Redis is full.

use crate::common::redis::RedisServer;
use crate::common::{SluiceProcess, config_dir, http_get, metric};

const CONFIG: &str =
    "domain: f\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";

/// The metric `sluice_store_evicts_counters` of an instance on a Redis started with `extra`,
/// and whether it warned in its log.
async fn evicts(extra: &[&str]) -> (Option<i64>, bool) {
    let redis = RedisServer::start_with(extra);
    let dir = config_dir("faults-eviction", &[("f.yaml", CONFIG)]);
    let sluice = SluiceProcess::on_redis(&dir, &redis, &[]);
    let warning = "redis can evict rate limit counters";
    let mut value = None;
    for _ in 0..100 {
        let (_, page) = http_get(sluice.http.parse().unwrap(), "/metrics")
            .await
            .unwrap();
        value = metric::<i64>(&page, "sluice_store_evicts_counters");
        let warned = sluice.logged_at_startup(warning)
            || sluice.log.lock().iter().any(|l| l.contains(warning));
        if value == Some(1) || warned {
            return (value, warned);
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    (value, false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_can_evict_counters_is_named_at_start_up_and_in_a_metric() {
    let (value, warned) =
        evicts(&["--maxmemory", "100mb", "--maxmemory-policy", "volatile-lru"]).await;
    assert_eq!(value, Some(1));
    assert!(warned, "no start-up warning");
    let (value, warned) =
        evicts(&["--maxmemory", "100mb", "--maxmemory-policy", "noeviction"]).await;
    assert_eq!(value, Some(0));
    assert!(!warned);
}

/// One policy's run: Redis at `maxmemory` 4 MB with `policy`, filled by the test with 10 KB
/// values without a TTL from 0.5 s on while three instances count 20 keys of 30 a day at 300
/// requests a second for 3 s (failure_mode deny). Answers what the history says and how many
/// keys Redis evicted.
async fn under_memory_pressure(policy: &str) -> (super::Verdict, u64, u64) {
    let redis = RedisServer::start_with(&["--maxmemory", "4mb", "--maxmemory-policy", policy]);
    let url = redis.url();
    let args = [
        "--backend",
        "redis",
        "--redis-url",
        &url,
        "--failure-mode",
        "deny",
        "--redis-deadline",
        "200ms",
    ];
    let (_instances, clients) = super::fleet(&args, 30).await;
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    let value = "x".repeat(10_000);
    let mut filler = 0u32;
    // Nearly full before the load starts.
    let base: u64 = redis
        .command(&["INFO", "memory"])
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap();
    while filler < (4u32 << 20).saturating_sub(base as u32 + (300 << 10)) / 10_240 {
        filler += 1;
        redis.command(&["SET", &format!("filler:{filler}"), &value]);
    }
    let history = super::drive(
        &clients,
        "f",
        &keys,
        300,
        std::time::Duration::from_secs(3),
        |now| {
            if now >= std::time::Duration::from_millis(300) {
                for _ in 0..5 {
                    filler += 1;
                    // Refused (OOM) under noeviction once full: that is the point.
                    let _ = redis.try_command(&["SET", &format!("filler:{filler}"), &value]);
                }
            }
        },
    )
    .await;
    let stats = redis.command(&["INFO", "stats"]);
    let evicted = stats
        .lines()
        .find_map(|l| l.strip_prefix("evicted_keys:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    let verdict = super::check(&history);
    let refused = super::refused_under(&history, 30, 5).len() as u64;
    (verdict, evicted, refused)
}

/// Redis full, under each eviction policy: `noeviction` refuses the writes, and the failure
/// mode answers (never over the limit); a `volatile-*` policy evicts the counters themselves
/// (they are the only keys with a TTL) and their keys are admitted again; `allkeys-*` evicts
/// whatever it picks. Prints each policy's figures (docs/operations/faults.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_redis_drops_counters_only_under_an_evicting_policy() {
    for policy in [
        "noeviction",
        "volatile-lru",
        "volatile-ttl",
        "allkeys-lru",
        "allkeys-random",
    ] {
        let (verdict, evicted, refused) = under_memory_pressure(policy).await;
        let over = super::over(&verdict, 30);
        eprintln!(
            "figures: Redis full under {policy} for 2.5 s: admitted max {} of 30 a key, {over} over, {evicted} keys evicted, {refused} refused short of the limit, {} errors",
            verdict.admitted.values().max().unwrap_or(&0),
            verdict.errors
        );
        assert_eq!(verdict.errors, 0, "{policy}");
        match policy {
            "noeviction" => {
                assert_eq!(over, 0);
                assert_eq!(evicted, 0);
            }
            // The counters are the only keys with a TTL: whatever was evicted was a
            // counter (what that admitted past the limit depends on the load that followed).
            "volatile-lru" | "volatile-ttl" => assert!(evicted > 0, "{policy}: nothing evicted"),
            _ => assert!(evicted > 0, "{policy}: nothing evicted"),
        }
    }
}
