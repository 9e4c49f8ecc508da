//! Sentinel failovers under load: manual, the master killed, with `REDIS_WAIT_REPLICAS`.

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

use super::{Sent, check, drive, over, sent_between};
use crate::common::redis::{RedisSentinel, RedisServer, command_calls};
use crate::common::{SluiceProcess, config_dir};

/// Three instances following the master named by `sentinels` (`faults`), exact counting,
/// failure_mode deny, a 200 ms deadline, `extra` arguments; 5 keys of `limit` a day.
async fn sentinel_fleet(
    sentinels: &[RedisSentinel],
    limit: u32,
    extra: &[&str],
) -> (Vec<SluiceProcess>, Vec<RateLimitServiceClient<Channel>>) {
    let yaml = format!(
        "domain: f\ndescriptors:\n  - key: k\n    rate_limit: {{unit: day, requests_per_unit: {limit}}}\n"
    );
    let dir = config_dir("faults-sentinel", &[("f.yaml", &yaml)]);
    let addrs: Vec<String> = sentinels.iter().map(RedisSentinel::addr).collect();
    let url = format!("faults,{}", addrs.join(","));
    let instances: Vec<SluiceProcess> = (0..3)
        .map(|_| {
            let mut args = vec![
                "--backend",
                "redis",
                "--redis-type",
                "sentinel",
                "--redis-url",
                &url,
                "--redis-deadline",
                "200ms",
                "--failure-mode",
                "deny",
            ];
            args.extend_from_slice(extra);
            SluiceProcess::spawn(&dir, &args)
        })
        .collect();
    let clients = crate::common::process::clients(&instances).await;
    (instances, clients)
}

/// Whether `server` says it is a master (`ROLE`); false when it does not answer.
fn is_master(server: &RedisServer) -> bool {
    server
        .try_command(&["ROLE"])
        .is_ok_and(|r| r.contains("master"))
}

/// A manual Sentinel failover under load (three instances, 100 requests a second on 5 keys of
/// 150 a day, `SENTINEL FAILOVER` 2 s in, 16 s run). The replica is promoted at once, but
/// Sentinel demotes the old master only about ten seconds later, and until then it accepts
/// writes that are lost. Sluice asks a Sentinel which master it names twice a second, so the
/// fleet moves within that: admissions past the limits are bounded by what the fleet sends
/// from the promotion to a poll and a deadline later (plus scheduling), far less than the
/// seconds the old master stays writable. Counting goes on on the new master, no error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_under_load_is_followed_within_a_poll() {
    let master = RedisServer::start();
    let replica = RedisServer::replica_of(&master);
    let sentinel = RedisSentinel::start(&master, "faults");
    crate::common::eventually_blocking("sentinel to know the replica", || {
        sentinel
            .try_command(&["SENTINEL", "replicas", "faults"])
            .is_ok_and(|r| r.contains(&replica.port.to_string()))
    });
    let (_instances, clients) = sentinel_fleet(std::slice::from_ref(&sentinel), 150, &[]).await;
    let keys: Vec<String> = (0..5).map(|i| format!("k{i}")).collect();
    let failover_at = Duration::from_secs(2);
    let (mut failed_over, mut promoted) = (None, None);
    let history = drive(&clients, "f", &keys, 100, Duration::from_secs(16), |now| {
        if now >= failover_at && failed_over.is_none() {
            failed_over = Some(now);
            sentinel.command(&["SENTINEL", "FAILOVER", "faults"]);
        }
        if failed_over.is_some() && promoted.is_none() && is_master(&replica) {
            promoted = Some(now);
        }
    })
    .await;
    // The fault happened: the replica was promoted during the run, and the fleet counted on
    // it afterwards (a replica runs no script of its own).
    let promoted = promoted.expect("the replica was not promoted during the run");
    assert!(
        command_calls(&replica, "evalsha") > 0,
        "nothing counted on the new master"
    );
    let verdict = check(&history);
    assert_eq!(verdict.errors, 0);
    let over = over(&verdict, 150);
    let bound = sent_between(
        &history,
        promoted.saturating_sub(Duration::from_millis(200)),
        promoted + Duration::from_millis(1500),
    );
    eprintln!(
        "figures: a manual Sentinel failover: admitted max {} of 150 a key, {over} over in all of {} sent (bound {bound}); the old master a master at the end: {}",
        verdict.admitted.values().max().unwrap_or(&0),
        history.len(),
        is_master(&master)
    );
    assert!(
        over <= bound,
        "{over} admitted past the limits, more than the {bound} sent while the fleet followed the failover"
    );
}

/// The master killed (`kill -9`) under load, three Sentinels (quorum 2) promoting the replica
/// after `down-after-milliseconds` (1 s): the fleet answers by its failure mode (deny) until
/// the new master is named, then counts on it. What is lost is what the replica had not
/// received when the master died (the replication lag, here well under one deadline of
/// traffic): admissions past the limits are bounded by the requests of the 200 ms before the
/// kill; no error; counting again within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_master_killed_under_load_loses_at_most_the_replication_lag() {
    master_killed("redis-server").await;
}

/// [`a_sentinel_master_killed_under_load_loses_at_most_the_replication_lag`] on Valkey (its
/// server and its Sentinel).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valkey_sentinel_master_killed_under_load_loses_at_most_the_replication_lag() {
    master_killed("valkey-server").await;
}

async fn master_killed(program: &'static str) {
    let mut master = RedisServer::start_program(program, &[]);
    let replica = RedisServer::replica_of(&master);
    let sentinels = RedisSentinel::group(&master, "faults", 3);
    crate::common::eventually_blocking("sentinels to know the replica", || {
        sentinels.iter().all(|s| {
            s.try_command(&["SENTINEL", "replicas", "faults"])
                .is_ok_and(|r| r.contains(&replica.port.to_string()))
        })
    });
    let (_instances, clients) = sentinel_fleet(&sentinels, 120, &[]).await;
    let keys: Vec<String> = (0..5).map(|i| format!("k{i}")).collect();
    let kill_at = Duration::from_secs(2);
    let (mut killed, mut promoted) = (None, None);
    let history = drive(&clients, "f", &keys, 100, Duration::from_secs(14), |now| {
        if now >= kill_at && killed.is_none() {
            killed = Some(now);
            master.kill();
        }
        if killed.is_some() && promoted.is_none() && is_master(&replica) {
            promoted = Some(now);
        }
    })
    .await;
    let killed = killed.expect("killed");
    let promoted = promoted.expect("the replica was not promoted during the run");
    assert!(
        command_calls(&replica, "evalsha") > 0,
        "nothing counted on the new master"
    );
    let verdict = check(&history);
    assert_eq!(verdict.errors, 0);
    // The failure mode answered while there was no master: requests sent between the kill
    // (a deadline after) and the promotion were denied (no key was at its limit yet).
    let outage: Vec<&Sent> = history
        .iter()
        .filter(|s| s.at >= killed + Duration::from_millis(300) && s.at < promoted)
        .collect();
    assert!(!outage.is_empty());
    assert!(outage.iter().all(|s| s.answer == "OVER_LIMIT"));
    let recovery = history
        .iter()
        .filter(|s| s.at >= killed && s.answer == "OK")
        .map(|s| s.at - killed)
        .min()
        .expect("nothing admitted after the kill");
    let over = over(&verdict, 120);
    let bound = sent_between(
        &history,
        killed.saturating_sub(Duration::from_millis(200)),
        killed,
    );
    eprintln!(
        "figures: the Sentinel master ({program}) killed for {:?}: admitted max {} of 120 a key, {over} over in all of {} sent (bound {bound}), {} failure-mode answers, counting again {recovery:?} after the kill",
        promoted - killed,
        verdict.admitted.values().max().unwrap_or(&0),
        history.len(),
        outage.len()
    );
    assert!(
        over <= bound,
        "{over} over, more than the {bound} sent in the 200 ms before the kill"
    );
    assert!(recovery < Duration::from_secs(10), "{recovery:?}");
}

/// `REDIS_WAIT_REPLICAS=1` through a manual failover, a master with two replicas: a count is
/// answered only once a replica holds it, so what the old master accepts after the promotion
/// (its replicas have moved to the new master) answers by the failure mode, and no key is
/// admitted past its limit at all. Counting goes on once Sentinel has moved the other replica
/// to the new master (a master without a replica cannot meet the wait: with one replica,
/// every answer is the failure mode's after a failover until a replica is back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_a_replica_never_over_admits_through_a_failover() {
    let master = RedisServer::start();
    let replica = RedisServer::replica_of(&master);
    let other = RedisServer::replica_of(&master);
    let sentinel = RedisSentinel::start(&master, "faults");
    crate::common::eventually_blocking("sentinel to know the replicas", || {
        sentinel
            .try_command(&["SENTINEL", "replicas", "faults"])
            .is_ok_and(|r| {
                r.contains(&replica.port.to_string()) && r.contains(&other.port.to_string())
            })
    });
    let (_instances, clients) = sentinel_fleet(
        std::slice::from_ref(&sentinel),
        150,
        &["--redis-wait-replicas", "1"],
    )
    .await;
    let keys: Vec<String> = (0..5).map(|i| format!("k{i}")).collect();
    let failover_at = Duration::from_secs(2);
    let (mut failed_over, mut promoted) = (None, None);
    let history = drive(&clients, "f", &keys, 100, Duration::from_secs(12), |now| {
        if now >= failover_at && failed_over.is_none() {
            failed_over = Some(now);
            sentinel.command(&["SENTINEL", "FAILOVER", "faults"]);
        }
        if failed_over.is_some() && promoted.is_none() && (is_master(&replica) || is_master(&other))
        {
            promoted = Some(now);
        }
    })
    .await;
    // Sentinel may promote either replica.
    let promoted = promoted.expect("no replica was promoted during the run");
    let verdict = check(&history);
    assert_eq!(verdict.errors, 0);
    // Counting went on after the failover, with the wait.
    let after = history
        .iter()
        .filter(|s| s.at > promoted + Duration::from_secs(3) && s.answer == "OK")
        .count();
    assert!(after > 0, "nothing admitted after the failover");
    let over = over(&verdict, 150);
    eprintln!(
        "figures: a manual Sentinel failover with REDIS_WAIT_REPLICAS=1: admitted max {} of 150 a key, {over} over in all of {} sent, {after} admitted from 3 s after the promotion",
        verdict.admitted.values().max().unwrap_or(&0),
        history.len()
    );
    assert_eq!(over, 0);
}
