//! One limit for the whole fleet: three `sluice serve` processes sharing one Redis (or one
//! Redis Cluster) admit exactly the limit; three processes counting in private memory admit
//! three times it, the failure a shared store exists to prevent.

use std::collections::HashMap;

use crate::common::redis::{RedisCluster, RedisServer, cluster_args};
use crate::common::{SluiceProcess, config_dir};

// A day-long window, so that no window boundary falls inside a test run.
const CONFIG: &str = "domain: fleet\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 100}\n";

/// Sends 600 requests for one descriptor, round-robin over `instances`, 60 at a time;
/// returns the count of each answer ("OK", "OVER_LIMIT", or the gRPC error code).
async fn drive(instances: &[SluiceProcess], user: &str) -> HashMap<String, usize> {
    crate::common::drive_processes(instances, "fleet", &[("user", user)], 600, 60).await
}

fn expect(counts: &HashMap<String, usize>, ok: usize, over: usize) {
    let mut expected = HashMap::from([("OK".to_owned(), ok)]);
    if over > 0 {
        expected.insert("OVER_LIMIT".to_owned(), over);
    }
    assert_eq!(*counts, expected);
}

fn fleet(args: &[&str]) -> Vec<SluiceProcess> {
    let dir = config_dir("fleet", &[("fleet.yaml", CONFIG)]);
    // A generous deadline: this test is about counting, not about a loaded CI machine
    // running debug builds. With release builds the default 15 ms holds too (`cargo test
    // --release --test redis_fleet` with the deadline removed: 5 runs of 5 exact).
    let mut all = vec!["--redis-deadline", "2s"];
    all.extend_from_slice(args);
    (0..3).map(|_| SluiceProcess::spawn(&dir, &all)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_one_redis_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    let url = redis.url();
    let instances = fleet(&["--backend", "redis", "--redis-url", &url]);
    expect(&drive(&instances, "alice").await, 100, 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_a_redis_cluster_admit_exactly_the_limit() {
    let cluster = RedisCluster::start();
    let url = cluster.url();
    let instances = fleet(&cluster_args(&url));
    expect(&drive(&instances, "bob").await, 100, 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_with_private_memory_admit_three_times_the_limit() {
    let instances = fleet(&["--backend", "memory"]);
    expect(&drive(&instances, "carol").await, 300, 300);
}
