//! Usage budgets under faults of the store: clients that check on the request path and
//! report their usage when their stream ends (Envoy's stream-done call, whose answer nobody
//! reads), while the network to Redis fails.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::common::faultproxy::{Fault, FaultProxy};
use crate::common::redis::RedisServer;
use crate::common::{DomainClient, SluiceProcess, config_dir, http_get};

const LIMIT: u64 = 250_000;
const CLIENTS: u64 = 12;
const MAX_USAGE: u64 = 400;

/// What one run's clients did, from their own records.
#[derive(Debug, Default)]
struct Spent {
    /// Usage of every admitted stream (each reported at its end): what the fleet let through.
    used: AtomicU64,
    /// Usage reported while the fault lasted and in the second after it.
    reported_in_fault: AtomicU64,
    /// Streams admitted.
    streams: AtomicU64,
    /// Streams admitted by a check sent while every instance's store was failing (from
    /// 250 ms into the fault to 250 ms before its end: past the deadline of the calls that
    /// were on the wire at its start, and answered before it ends).
    admitted_in_fault: AtomicU64,
}

/// The budget's count as `GET /counters` of `instance` shows it.
async fn counted(instance: &SluiceProcess) -> u64 {
    let addr = instance.http.parse().unwrap();
    let (status, body) = http_get(addr, "/counters?domain=ai&entry=tenant=t")
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    answer["counters"][0]["used"]
        .as_str()
        .and_then(|u| u.parse().ok())
        .unwrap_or_else(|| panic!("no used count in {body}"))
}

/// Three instances on one Redis behind the proxy (`failure_mode: deny`, a 200 ms deadline),
/// one budget of 250,000 a day; 12 clients, each in a loop: a check (0 hits), and if
/// admitted a 20 ms stream whose usage (1-400, pseudo-random) is reported at its end, on any
/// instance, until the budget is spent. `fault` from 1 s to 2 s. Returns what the clients did and the budget's
/// count at the end.
async fn spend_through(fault: Fault) -> (Spent, u64) {
    let redis = RedisServer::start();
    let upstream = format!("127.0.0.1:{}", redis.port).parse().unwrap();
    let proxy = FaultProxy::start(upstream).await;
    let yaml = format!(
        "domain: ai\ndescriptors:\n  - key: tenant\n    failure_mode: deny\n    rate_limit: {{unit: day, requests_per_unit: {LIMIT}, overdraft: true}}\n"
    );
    let dir = config_dir("faults-budget", &[("ai.yaml", &yaml)]);
    let url = format!("redis://{}", proxy.addr);
    let args = [
        "--backend",
        "redis",
        "--redis-url",
        &url,
        "--redis-deadline",
        "200ms",
    ];
    let instances: Vec<SluiceProcess> = (0..3).map(|_| SluiceProcess::spawn(&dir, &args)).collect();
    let spent = Arc::new(Spent::default());
    let in_fault = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    // Until the budget is spent: a client stops after 20 refusals in a row once the fault
    // and the second after it are over (at most 30 s: a loaded machine is slower).
    let run = Duration::from_secs(30);
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let clients: Vec<DomainClient> = instances
            .iter()
            .map(|i| DomainClient::connect(&i.grpc, "ai"))
            .collect();
        let (spent, in_fault) = (spent.clone(), in_fault.clone());
        tasks.push(tokio::spawn(async move {
            let mut seed = 0x5EED_0000 + c;
            let mut next = |n: u64| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (seed >> 33) % n
            };
            let mut refused_in_a_row = 0;
            while started.elapsed() < run && refused_in_a_row < 20 {
                let sent = started.elapsed();
                let checked = clients[next(3) as usize].charges(&[("tenant=t", 0)]).await;
                if checked.is_over_limit() {
                    if sent > Duration::from_secs(3) {
                        refused_in_a_row += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                refused_in_a_row = 0;
                spent.streams.fetch_add(1, Ordering::SeqCst);
                if sent >= Duration::from_millis(1250) && sent < Duration::from_millis(1750) {
                    spent.admitted_in_fault.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                let usage = 1 + next(MAX_USAGE);
                spent.used.fetch_add(usage, Ordering::SeqCst);
                if in_fault.load(Ordering::SeqCst) {
                    spent.reported_in_fault.fetch_add(usage, Ordering::SeqCst);
                }
                // The stream-done report: its answer is ignored.
                clients[next(3) as usize]
                    .charges(&[("tenant=t", usage as i64)])
                    .await;
            }
        }));
    }
    // The fault's window for the reports: from just before it starts to a second after it
    // ends (Sluice reconnects meanwhile).
    tokio::time::sleep(Duration::from_millis(990)).await;
    in_fault.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(10)).await;
    proxy.set(fault);
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy.set(Fault::None);
    tokio::time::sleep(Duration::from_secs(1)).await;
    in_fault.store(false, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }
    let counted = counted(&instances[0]).await;
    let spent = Arc::into_inner(spent).unwrap();
    (spent, counted)
}

/// Prints a run's figures and checks the bound: no stream is admitted while the store
/// fails (`deny` refuses the check of 0 hits), so the reports that can be lost are those of
/// streams admitted before the fault, and of streams admitted by an instance counting again
/// while another, which got their report, was not yet; the fleet is over the budget by at
/// most the reports in flight when it was spent (one per client) plus what the store never
/// counted.
fn assert_bound(name: &str, spent: &Spent, counted: u64) -> u64 {
    let used = spent.used.load(Ordering::SeqCst);
    let in_fault = spent.reported_in_fault.load(Ordering::SeqCst);
    let admitted_in_fault = spent.admitted_in_fault.load(Ordering::SeqCst);
    let lost = used.saturating_sub(counted);
    let over = used.saturating_sub(LIMIT);
    eprintln!(
        "figures: a usage budget through {name}: {} streams used {used} of {LIMIT} ({over} over), the budget counted {counted} ({lost} lost), {in_fault} reported during the fault and the second after, {admitted_in_fault} streams admitted while every instance's store failed",
        spent.streams.load(Ordering::SeqCst),
    );
    assert!(used >= LIMIT, "the clients never spent the budget: {used}");
    assert!(counted <= used, "counted {counted} of {used} used");
    // The fault happened to reports: some were sent through it.
    assert!(in_fault > 0);
    assert_eq!(
        admitted_in_fault, 0,
        "streams admitted while the store failed"
    );
    assert!(
        lost <= in_fault,
        "{lost} lost: more than was reported around the fault"
    );
    assert!(
        over <= CLIENTS * MAX_USAGE + lost,
        "{over} over: more than the reports in flight and the {lost} lost"
    );
    lost
}

/// A black hole: the calls that missed their deadline are delivered when it heals and count;
/// the reports refused while the breaker was open (`deny` refuses a charge it cannot make)
/// are lost. The instances count again together (the held calls arrive at once), so only
/// streams admitted before the fault lose their reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_store_admits_no_stream_and_loses_at_most_the_reports_in_flight() {
    let (spent, counted) = spend_through(Fault::BlackHole).await;
    let lost = assert_bound("a 1 s black hole", &spent, counted);
    // Only the reports of streams admitted before the fault: one per client.
    assert!(lost <= CLIENTS * MAX_USAGE, "{lost} lost");
}

/// Reset connections lose the reports sent through them: Sluice answers a report it could not
/// count by its failure mode, and Envoy does not read the answer of a stream-done call. The
/// instances reconnect at different times (each its own breaker's probe), so a stream admitted
/// by one may report to another that cannot count yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_connections_admit_no_stream_and_lose_only_reports_around_the_fault() {
    let (spent, counted) = spend_through(Fault::Reset).await;
    assert_bound("1 s of reset connections", &spent, counted);
}
