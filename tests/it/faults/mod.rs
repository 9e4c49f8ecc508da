//! Faults of the counter store under load, each checked from the load driver's own history
//! against the bound the docs promise (issue 42; docs/operations/faults.md). This module is
//! the harness: the load driver with its history, the checker, the fleets.

mod budget;
mod clocks;
mod cluster;
mod drain;
mod eviction;
mod lease;
mod network;
mod sentinel;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

use crate::common::faultproxy::FaultProxy;
use crate::common::{SluiceProcess, config_dir, descriptor, request};

/// One request as the load driver saw it: its key, when it was sent (from the start), how
/// long the answer took, and the answer ("OK", "OVER_LIMIT", or the gRPC error code).
#[derive(Debug, Clone)]
pub(super) struct Sent {
    pub key: String,
    /// The instance it was sent to.
    pub instance: usize,
    pub at: Duration,
    pub took: Duration,
    pub answer: String,
    /// The machine's wall clock (Redis's, which runs on it unshifted) when it was sent and
    /// when it was answered, in microseconds since the Unix epoch.
    pub wall: (u64, u64),
}

/// What a run's history says, computed from the history alone (not from Sluice's metrics).
#[derive(Debug, Default)]
pub(super) struct Verdict {
    /// Per key: admitted requests.
    pub admitted: BTreeMap<String, u64>,
    /// Answers that were errors.
    pub errors: u64,
    /// The slowest answer.
    pub slowest: Duration,
}

pub(super) fn check(history: &[Sent]) -> Verdict {
    let mut v = Verdict::default();
    for s in history {
        if s.answer == "OK" {
            *v.admitted.entry(s.key.clone()).or_default() += 1;
        } else if s.answer != "OVER_LIMIT" {
            v.errors += 1;
        }
        v.slowest = v.slowest.max(s.took);
    }
    v
}

/// Sends `per_second` requests a second for `run`, cycling over `keys` and the instances'
/// `clients`, each on a task of its own (answers are not waited for before the next is sent);
/// calls `at(elapsed)` every 50 ms so that the caller can inject faults on a schedule.
pub(super) async fn drive(
    clients: &[RateLimitServiceClient<Channel>],
    domain: &str,
    keys: &[String],
    per_second: u32,
    run: Duration,
    mut at: impl FnMut(Duration),
) -> Vec<Sent> {
    let started = Instant::now();
    let gap = Duration::from_secs(1) / per_second;
    let mut tasks = Vec::new();
    let mut i = 0usize;
    let mut next_tick = Duration::ZERO;
    while started.elapsed() < run {
        let now = started.elapsed();
        if now >= next_tick {
            at(now);
            next_tick = now + Duration::from_millis(50);
        }
        let key = keys[i % keys.len()].clone();
        let instance = i % clients.len();
        let mut client = clients[instance].clone();
        let req = request(domain, vec![descriptor(&[("k", &key)])]);
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let sent_wall = wall_micros();
            let answer = match client.should_rate_limit(req).await {
                Ok(r) => r.into_inner().overall_code().as_str_name().to_owned(),
                Err(status) => format!("{:?}", status.code()),
            };
            Sent {
                key,
                instance,
                at: now,
                took: sent.elapsed(),
                answer,
                wall: (sent_wall, wall_micros()),
            }
        }));
        i += 1;
        let due = gap * i as u32;
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
    let mut history = Vec::new();
    for t in tasks {
        history.push(t.await.unwrap());
    }
    history
}

/// The machine's wall clock in microseconds since the Unix epoch.
pub(super) fn wall_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// Three instances on one Redis behind the fault proxy, exact counting, `failure_mode`
/// `mode`, a deadline of `deadline`.
pub(super) async fn fleet_behind(
    proxy: &FaultProxy,
    mode: &str,
    deadline: &str,
    limit: u32,
) -> (Vec<SluiceProcess>, Vec<RateLimitServiceClient<Channel>>) {
    fleet_behind_with(
        proxy,
        &["--failure-mode", mode, "--redis-deadline", deadline],
        limit,
    )
    .await
}

/// [`fleet_behind`] with `args` for each instance.
pub(super) async fn fleet_behind_with(
    proxy: &FaultProxy,
    args: &[&str],
    limit: u32,
) -> (Vec<SluiceProcess>, Vec<RateLimitServiceClient<Channel>>) {
    let url = format!("redis://{}", proxy.addr);
    let mut all = vec!["--backend", "redis", "--redis-url", &url];
    all.extend_from_slice(args);
    fleet(&all, limit).await
}

/// Three instances started with `args`, counting keys `k` of `limit` a day in domain `f`.
pub(super) async fn fleet(
    args: &[&str],
    limit: u32,
) -> (Vec<SluiceProcess>, Vec<RateLimitServiceClient<Channel>>) {
    let yaml = format!(
        "domain: f\ndescriptors:\n  - key: k\n    rate_limit: {{unit: day, requests_per_unit: {limit}}}\n"
    );
    let dir = config_dir("faults-fleet", &[("f.yaml", &yaml)]);
    let instances: Vec<SluiceProcess> = (0..3).map(|_| SluiceProcess::spawn(&dir, args)).collect();
    let clients = crate::common::process::clients(&instances).await;
    (instances, clients)
}

/// Requests answered OVER_LIMIT while their key had been admitted fewer than `limit - margin`
/// times by then (in the order sent): answers of the failure mode, not of the limit; the
/// margin covers requests in flight around the limit, whose order of counting is not the
/// order of sending.
pub(super) fn refused_under(history: &[Sent], limit: u64, margin: u64) -> Vec<&Sent> {
    let mut sorted: Vec<&Sent> = history.iter().collect();
    sorted.sort_by_key(|s| s.at);
    let mut admitted: BTreeMap<&str, u64> = BTreeMap::new();
    let mut refused = Vec::new();
    for s in sorted {
        let count = admitted.entry(&s.key).or_default();
        if s.answer == "OK" {
            *count += 1;
        } else if s.answer == "OVER_LIMIT" && *count + margin < limit {
            refused.push(s);
        }
    }
    refused
}

/// Admissions past the limit, summed over keys.
pub(super) fn over(verdict: &Verdict, limit: u64) -> u64 {
    verdict
        .admitted
        .values()
        .map(|a| a.saturating_sub(limit))
        .sum()
}

/// How many requests were sent in `[from, to)`.
pub(super) fn sent_between(history: &[Sent], from: Duration, to: Duration) -> u64 {
    history.iter().filter(|s| s.at >= from && s.at < to).count() as u64
}
