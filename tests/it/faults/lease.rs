//! Leased quota under faults: a Sluice replica killed (`kill -9`) while it holds blocks.

use std::time::Duration;

use super::{Sent, check, drive, over};
use crate::common::redis::RedisServer;
use crate::common::{SluiceProcess, config_dir};

/// Three instances leasing 5 keys of 600 a day from one Redis (`consistency: leased`), 300
/// requests a second round-robin; instance 0 killed with `kill -9` 2 s in, while it holds a
/// block of every key. Never over the limit (a block is spent only by its holder); the dead
/// instance's blocks are lost until the window ends, so each key is admitted at least its
/// limit less what one instance can hold (`max(h, min(⌈r × P⌉, ⌊R / 2n⌋))`, at most
/// 600 / 6 = 100 here). Requests sent to the dead instance fail
/// (what Envoy sees of a dead pod until it is taken out); no other error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leasing_replica_killed_loses_at_most_its_blocks_never_over() {
    let redis = RedisServer::start();
    let yaml = "domain: f\nconsistency: leased\ndescriptors:\n  - key: k\n    failure_mode: deny\n    rate_limit: {unit: day, requests_per_unit: 600}\n";
    let dir = config_dir("faults-lease", &[("f.yaml", yaml)]);
    let url = redis.url();
    let mut instances: Vec<SluiceProcess> = (0..3)
        .map(|_| SluiceProcess::spawn(&dir, &["--backend", "redis", "--redis-url", &url]))
        .collect();
    let clients = crate::common::process::clients(&instances).await;
    let keys: Vec<String> = (0..5).map(|i| format!("k{i}")).collect();
    let kill_at = Duration::from_secs(2);
    let mut killed = None;
    let history = drive(&clients, "f", &keys, 300, Duration::from_secs(14), |now| {
        if now >= kill_at && killed.is_none() {
            killed = Some(now);
            let _ = instances[0].child.kill();
            let _ = instances[0].child.wait();
        }
    })
    .await;
    let killed = killed.expect("killed");
    // Errors only from the dead instance, after its death; the rest is the fleet's answer.
    let (dead, alive): (Vec<Sent>, Vec<Sent>) = history.into_iter().partition(|s| {
        s.instance == 0 && s.at >= killed && s.answer != "OK" && s.answer != "OVER_LIMIT"
    });
    let verdict = check(&alive);
    assert_eq!(verdict.errors, 0, "errors from the live instances");
    assert!(!dead.is_empty(), "the killed instance answered on");
    // The fault happened while the instance held blocks: it had been admitting from them.
    let before: u64 = alive
        .iter()
        .filter(|s| s.instance == 0 && s.at < killed && s.answer == "OK")
        .count() as u64;
    assert!(before > 0);
    let over = over(&verdict, 600);
    let least = verdict.admitted.values().min().copied().unwrap_or(0);
    eprintln!(
        "figures: a leasing replica killed (kill -9): admitted max {} min {least} of 600 a key, {over} over, {} requests to the dead instance failed",
        verdict.admitted.values().max().unwrap_or(&0),
        dead.len()
    );
    assert_eq!(over, 0);
    assert!(least >= 600 - 100, "{:?}", verdict.admitted);
}
