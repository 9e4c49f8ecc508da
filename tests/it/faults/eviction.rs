//! Redis at `maxmemory`: a policy that can evict counters is named at start-up and in a
//! metric.

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

