//! One usage budget for the whole fleet: three `sluice serve` processes on one Redis (and on a
//! Redis Cluster), and clients that check on the request path and report random usage when
//! their stream ends, each on any instance. Every report counts (the budget's count is the sum
//! of the usage reported, to the unit); the budget is crossed by at most the reports in flight
//! when it is spent (here at most one per client); from then on every check is refused on every
//! instance. With estimates that settle to the actual, the crossing is at most the
//! under-estimates in flight, and estimates that never fall short never cross it at all.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::common::redis::{RedisCluster, RedisServer};
use crate::common::{DomainClient, SluiceProcess, config_dir, http_get};

const LIMIT: u64 = 20_000;
const CLIENTS: u64 = 12;
const MAX_USAGE: u64 = 400;

// A day-long window, so that no window boundary falls inside a test run.
const CONFIG: &str = "domain: ai\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: day, requests_per_unit: 20000, overdraft: true}\n";

fn fleet(store: &[&str]) -> Vec<SluiceProcess> {
    let dir = config_dir("budget-fleet", &[("ai.yaml", CONFIG)]);
    // A generous deadline: this test is about counting, not about a loaded machine.
    let mut args = vec!["--backend", "redis", "--redis-deadline", "2s"];
    args.extend_from_slice(store);
    (0..3).map(|_| SluiceProcess::spawn(&dir, &args)).collect()
}

/// splitmix64, seeded per client, so that a failing run can be replayed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n
    }
}

/// How clients use the budget.
#[derive(Clone, Copy, Debug)]
enum Pattern {
    /// Check with 0 hits; report the usage at stream done.
    CheckThenReport,
    /// Charge an estimate; at stream done give it back and charge the actual in one request
    /// (after a refusal: give it back alone, as Envoy does). `short` is how far an estimate
    /// may fall short of the actual (0: estimates never do).
    EstimateThenSettle { short: u64 },
}

/// Runs the clients against `instances` until the budget refuses each of them; returns the
/// usage reported in all, and the largest shortfall of an estimate that was admitted.
async fn spend(instances: &[SluiceProcess], tenant: &str, pattern: Pattern) -> (u64, u64) {
    let reported = Arc::new(AtomicU64::new(0));
    let worst_short = Arc::new(AtomicU64::new(0));
    let spec = format!("tenant={tenant}");
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let clients: Vec<DomainClient> = instances
            .iter()
            .map(|i| DomainClient::connect(&i.grpc, "ai"))
            .collect();
        let (reported, worst_short, spec) = (reported.clone(), worst_short.clone(), spec.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(0xB0D6_E700 + c);
            loop {
                let on = |rng: &mut Rng| &clients[rng.below(3) as usize];
                let usage = 1 + rng.below(MAX_USAGE);
                match pattern {
                    Pattern::CheckThenReport => {
                        if on(&mut rng).charges(&[(&spec, 0)]).await.is_over_limit() {
                            return;
                        }
                        // The stream-done report: its answer is ignored, it counts anyway.
                        on(&mut rng).charges(&[(&spec, usage as i64)]).await;
                        reported.fetch_add(usage, Ordering::SeqCst);
                    }
                    Pattern::EstimateThenSettle { short } => {
                        let estimate = (usage + rng.below(MAX_USAGE)).saturating_sub(short).max(1);
                        let checked = on(&mut rng).charges(&[(&spec, estimate as i64)]).await;
                        if checked.is_over_limit() {
                            on(&mut rng).charges(&[(&spec, -(estimate as i64))]).await;
                            return;
                        }
                        worst_short.fetch_max(usage.saturating_sub(estimate), Ordering::SeqCst);
                        let settle = [(spec.as_str(), -(estimate as i64)), (&spec, usage as i64)];
                        on(&mut rng).charges(&settle).await;
                        reported.fetch_add(usage, Ordering::SeqCst);
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    (
        reported.load(Ordering::SeqCst),
        worst_short.load(Ordering::SeqCst),
    )
}

/// The budget's count as `GET /counters` of `instance` shows it.
async fn used_of(instance: &SluiceProcess, tenant: &str) -> u64 {
    let addr = instance.http.parse().unwrap();
    let path = format!("/counters?domain=ai&entry=tenant={tenant}");
    let (status, body) = http_get(addr, &path).await.unwrap();
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    answer["counters"][0]["used"]
        .as_str()
        .and_then(|u| u.parse().ok())
        .unwrap_or_else(|| panic!("no used count in {body}"))
}

async fn every_report_counts_and_the_crossing_is_bounded(instances: &[SluiceProcess]) {
    let (reported, _) = spend(instances, "reports", Pattern::CheckThenReport).await;
    let used = used_of(&instances[0], "reports").await;
    assert_eq!(used, reported, "every unit reported is counted, none twice");
    assert!(
        used >= LIMIT,
        "the clients stopped before the budget was spent: {used}"
    );
    // Each client passed at most one check that the reports then in flight overtook.
    assert!(
        used < LIMIT + CLIENTS * MAX_USAGE,
        "{used} of {LIMIT}: crossed by more than the {CLIENTS} reports that can be in flight"
    );
    for instance in instances {
        let check = DomainClient::connect(&instance.grpc, "ai");
        assert!(
            check
                .charges(&[("tenant=reports", 0)])
                .await
                .is_over_limit()
        );
    }
}

async fn estimates_settle_to_the_actual(instances: &[SluiceProcess]) {
    // Estimates that may fall short by up to 100: the crossing is at most those shortfalls.
    let pattern = Pattern::EstimateThenSettle { short: 100 };
    let (reported, worst_short) = spend(instances, "short", pattern).await;
    let used = used_of(&instances[0], "short").await;
    assert_eq!(
        used, reported,
        "the budget holds the actual usage, not the estimates"
    );
    assert!(
        used <= LIMIT + CLIENTS * worst_short,
        "{used} of {LIMIT}: more than {CLIENTS} shortfalls of at most {worst_short}"
    );
    // Estimates that never fall short: the budget is never crossed.
    let pattern = Pattern::EstimateThenSettle { short: 0 };
    let (reported, _) = spend(instances, "ample", pattern).await;
    let used = used_of(&instances[0], "ample").await;
    assert_eq!(used, reported);
    assert!(
        used <= LIMIT,
        "{used} of {LIMIT} with estimates that never fall short"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_one_redis_keep_one_budget() {
    let redis = RedisServer::start();
    let url = redis.url();
    let instances = fleet(&["--redis-url", &url]);
    every_report_counts_and_the_crossing_is_bounded(&instances).await;
    estimates_settle_to_the_actual(&instances).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_a_redis_cluster_keep_one_budget() {
    let cluster = RedisCluster::start();
    let url = cluster.url();
    let instances = fleet(&["--redis-type", "cluster", "--redis-url", &url]);
    every_report_counts_and_the_crossing_is_bounded(&instances).await;
    estimates_settle_to_the_actual(&instances).await;
}
