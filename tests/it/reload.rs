// Why one long file: reload and shutdown as one operator workflow, sharing the directory and
// server helpers.
//! Hot reload and shutdown as operators use them: files changed in the watched directory
//! (plain copies, broken files, ConfigMap-style symlink swaps), SIGHUP, and SIGTERM under
//! load.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::replace_file as write;
use crate::common::{
    SluiceProcess, TestServer, config_dir, descriptor, http_get, request, should_rate_limit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::settings::Settings;

const ONE: &str =
    "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
const FIVE: &str =
    "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";
const OTHER: &str =
    "domain: other\ndescriptors:\n  - key: j\n    rate_limit: {unit: hour, requests_per_unit: 7}\n";

/// Polls `/rlconfig` until it contains `needle`; returns how long that took.
async fn until_rlconfig(server: &TestServer, needle: &str) -> Duration {
    let what = format!("/rlconfig shows '{needle}'");
    crate::common::eventually_within(Duration::from_secs(10), &what, || async {
        let (_, page) = http_get(server.http_addr, "/rlconfig").await.unwrap();
        page.contains(needle)
    })
    .await
}

async fn remaining(server: &TestServer, domain: &str, key: &str, value: &str) -> u32 {
    let decision = server.domain(domain).hit(&format!("{key}={value}")).await;
    decision.remaining()[0]
}

async fn server_on(dir: &Path) -> TestServer {
    TestServer::start_with(Settings::for_tests(dir)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_config_takes_effect_within_two_seconds() {
    let dir = config_dir("reload-good", &[("r.yaml", ONE)]);
    let server = server_on(&dir).await;
    assert_eq!(remaining(&server, "r", "k", "a").await, 0);
    write(&dir, "other.yaml", OTHER);
    let took = until_rlconfig(&server, "other.j: unit=HOUR requests_per_unit=7").await;
    assert!(took < Duration::from_secs(2), "took {took:?}");
    assert_eq!(remaining(&server, "other", "j", "a").await, 6);
    let (_, page) = http_get(server.http_addr, "/rlconfig").await.unwrap();
    assert!(page.contains("# last reload: ok"), "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_config_is_rejected_and_the_old_limits_keep_answering() {
    let dir = config_dir("reload-broken", &[("r.yaml", FIVE)]);
    let server = server_on(&dir).await;
    assert_eq!(remaining(&server, "r", "k", "a").await, 4);
    write(
        &dir,
        "r.yaml",
        "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    );
    until_rlconfig(&server, "# last reload: rejected").await;
    let (_, page) = http_get(server.http_addr, "/rlconfig").await.unwrap();
    assert!(
        page.contains("invalid rate limit unit 'fortnight'"),
        "{page}"
    );
    // The old limits still answer, and counting went on.
    assert_eq!(remaining(&server, "r", "k", "a").await, 3);
    let (_, metrics) = http_get(server.http_addr, "/metrics").await.unwrap();
    assert!(
        metrics.contains("ratelimit_service_config_load_error 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn requests_and_health_checks_are_answered_while_a_slow_config_parses() {
    // One thread runs the server and this test: a reload parsing on it would stall both.
    let dir = config_dir("reload-slow", &[("r.yaml", FIVE)]);
    let server = server_on(&dir).await;
    let r = server.domain("r");
    // Within the size and depth bounds, but seconds of parsing: 2.5 MiB of sequences nested
    // 61 deep. Not a config file mapping, so the reload is rejected once parsed.
    let line = format!("- {}{}\n", "[".repeat(60), "]".repeat(60));
    write(&dir, "slow.yaml", &line.repeat(5 * 512 * 1024 / line.len()));
    // A failure detector, not a measurement: a local request takes milliseconds.
    let patience = Duration::from_secs(3);
    let mut answered = 0;
    let page = loop {
        let spec = format!("k=v{answered}");
        let ask = r.hit(&spec);
        let answer = tokio::time::timeout(patience, ask)
            .await
            .expect("a request went unanswered during the reload");
        assert_eq!(answer.remaining(), [4]);
        let health = tokio::time::timeout(patience, http_get(server.http_addr, "/healthcheck"))
            .await
            .expect("a health check went unanswered during the reload");
        assert_eq!(health.unwrap().0, 200);
        answered += 1;
        let (_, page) = tokio::time::timeout(patience, http_get(server.http_addr, "/rlconfig"))
            .await
            .expect("/rlconfig went unanswered during the reload")
            .unwrap();
        if page.contains("# last reload: rejected") {
            break page;
        }
    };
    assert!(page.contains("slow.yaml"), "{page}");
    assert!(answered > 0);
    // The old limits still answer.
    assert_eq!(remaining(&server, "r", "k", "a").await, 4);
    let (_, metrics) = http_get(server.http_addr, "/metrics").await.unwrap();
    assert!(
        metrics.contains("ratelimit_service_config_load_error 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_over_the_size_bound_is_rejected_unread_and_the_old_limits_stay() {
    let dir = config_dir("reload-too-big", &[("r.yaml", FIVE)]);
    let server = server_on(&dir).await;
    assert_eq!(remaining(&server, "r", "k", "a").await, 4);
    let len = sluice::config::MAX_FILE_BYTES as usize + 1;
    write(
        &dir,
        "big.yaml",
        &format!("domain: big\n{}", "#".repeat(len - 12)),
    );
    until_rlconfig(&server, "# last reload: rejected").await;
    let (_, page) = http_get(server.http_addr, "/rlconfig").await.unwrap();
    assert!(
        page.contains(
            "big.yaml: file is 4194305 bytes, more than the 4194304 a config file may have"
        ),
        "{page}"
    );
    assert!(!page.contains("domain: big"), "{page}");
    assert_eq!(remaining(&server, "r", "k", "a").await, 3);
    let (_, metrics) = http_get(server.http_addr, "/metrics").await.unwrap();
    assert!(
        metrics.contains("ratelimit_service_config_load_error 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_of_unchanged_rules_survive_a_reload() {
    let dir = config_dir("reload-counters", &[("r.yaml", FIVE)]);
    let server = server_on(&dir).await;
    assert_eq!(remaining(&server, "r", "k", "a").await, 4);
    assert_eq!(remaining(&server, "r", "k", "a").await, 3);
    write(&dir, "other.yaml", OTHER);
    until_rlconfig(&server, "other.j").await;
    assert_eq!(remaining(&server, "r", "k", "a").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_symlink_swap_is_reloaded() {
    // Kubernetes mounts a ConfigMap as `..<timestamp>/` directories, a `..data` link to the
    // current one, and top-level links `file -> ..data/file`; an update swaps `..data`.
    let dir = crate::common::temp_dir("reload-configmap");
    let first = dir.join("..2026_01_01");
    std::fs::create_dir(&first).unwrap();
    std::fs::write(first.join("r.yaml"), ONE).unwrap();
    std::os::unix::fs::symlink("..2026_01_01", dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/r.yaml", dir.join("r.yaml")).unwrap();
    let server = server_on(&dir).await;
    assert_eq!(remaining(&server, "r", "k", "a").await, 0);

    let second = dir.join("..2026_01_02");
    std::fs::create_dir(&second).unwrap();
    std::fs::write(second.join("r.yaml"), FIVE).unwrap();
    std::os::unix::fs::symlink("..2026_01_02", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    until_rlconfig(&server, "r.k: unit=HOUR requests_per_unit=5").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_at_once() {
    let dir = config_dir("reload-sighup", &[("r.yaml", ONE)]);
    let process = SluiceProcess::spawn(&dir, &["--config-watch-interval", "0s"]);
    let client = RateLimitServiceClient::connect(format!("http://{}", process.grpc))
        .await
        .unwrap();
    write(&dir, "r.yaml", FIVE);
    let status = std::process::Command::new("kill")
        .args(["-HUP", &process.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    crate::common::eventually_within(Duration::from_secs(5), "SIGHUP reloads", || {
        let mut client = client.clone();
        async move {
            let r =
                should_rate_limit(&mut client, request("r", vec![descriptor(&[("k", "x")])])).await;
            r.statuses[0]
                .current_limit
                .as_ref()
                .unwrap()
                .requests_per_unit
                == 5
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_waits_for_requests_in_flight() {
    // Requests held in flight by a paused Redis (answered by the failure policy at the 2 s
    // deadline) when SIGTERM arrives: the drain must let them finish before exiting.
    let redis = crate::common::redis::RedisServer::start();
    let dir = config_dir("drain", &[("r.yaml", FIVE)]);
    let mut process = SluiceProcess::on_redis(
        &dir,
        &redis,
        &["--redis-deadline", "2s", "--shutdown-grace", "20s"],
    );
    let client = RateLimitServiceClient::connect(format!("http://{}", process.grpc))
        .await
        .unwrap();
    redis.pause();
    let in_flight: Vec<_> = (0..8)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move {
                client
                    .should_rate_limit(request("r", vec![descriptor(&[("k", &format!("d{i}"))])]))
                    .await
                    .map(|r| r.into_inner().overall_code)
            })
        })
        .collect();
    // No signal tells that the server holds them; 300 ms is far more than a local request
    // takes to arrive, far less than the 2 s they wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    process.terminate();
    for request in in_flight {
        let answer = request.await.unwrap();
        assert!(
            answer.is_ok(),
            "a request in flight was dropped: {answer:?}"
        );
    }
    assert_eq!(process.child.wait().unwrap().code(), Some(0));
    redis.resume();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_answers_every_request_and_exits_zero() {
    let dir = config_dir("shutdown", &[("r.yaml", FIVE)]);
    let mut process =
        SluiceProcess::spawn(&dir, &["--shutdown-delay", "1s", "--shutdown-grace", "5s"]);
    let grpc = process.grpc.clone();
    let flowing = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted = flowing.clone();
    let load = tokio::spawn(async move {
        let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
            .await
            .unwrap();
        let (mut answered, mut failed) = (0u32, 0u32);
        let started = Instant::now();
        // Steady load through the shutdown delay: every request gets an answer.
        while started.elapsed() < Duration::from_millis(900) {
            match client
                .should_rate_limit(request("r", vec![descriptor(&[("k", "load")])]))
                .await
            {
                Ok(_) => answered += 1,
                Err(_) => failed += 1,
            }
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        (answered, failed)
    });
    crate::common::eventually("the load is flowing", || {
        std::future::ready(flowing.load(std::sync::atomic::Ordering::Relaxed) > 0)
    })
    .await;
    process.terminate();
    let (answered, failed) = load.await.unwrap();
    assert!(answered > 0);
    assert_eq!(failed, 0, "requests failed during the shutdown delay");
    let status = process.child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_fail_at_once_while_requests_are_still_served() {
    use crate::common::health::{Health, Status};
    let mut settings = Settings::for_tests(config_dir("shutdown-health", &[("r.yaml", FIVE)]));
    settings.shutdown_delay = Duration::from_secs(2);
    let server = TestServer::start_with(settings).await;
    let (http, mut client) = (server.http_addr, server.client().await);
    let health = Health::connect(server.grpc_addr).await;
    let stopping = tokio::spawn(server.stop());
    crate::common::eventually_within(
        Duration::from_secs(1),
        "healthcheck answers 503",
        || async { http_get(http, "/healthcheck").await.unwrap().0 == 503 },
    )
    .await;
    for service in ["", "ratelimit"] {
        assert_eq!(
            health.status(service).await,
            Status::NotServing,
            "'{service}'"
        );
    }
    // Still answering during the delay.
    let r = should_rate_limit(&mut client, request("r", vec![descriptor(&[("k", "h")])])).await;
    assert_eq!(r.statuses[0].limit_remaining, 4);
    stopping.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_healthy_with_at_least_one_config_loaded_health_waits_for_a_domain() {
    use crate::common::health::{Health, Status};
    let dir = config_dir("needs-config", &[]);
    let mut settings = Settings::for_tests(&dir);
    settings.require_config = true;
    let server = TestServer::start_unready(settings).await;
    let health = Health::connect(server.grpc_addr).await;
    let grpc_status = |service: &'static str| health.status(service);
    // An empty directory: no domain in force, so unhealthy everywhere.
    assert_eq!(
        http_get(server.http_addr, "/healthcheck").await.unwrap(),
        (500, "no rate limit config loaded".to_owned())
    );
    assert_eq!(grpc_status("ratelimit").await, Status::NotServing);
    // The first domain arrives: healthy, on both; /healthcheck in the same step that counts
    // the load (a probe that waits for the metric must not see 500 after it).
    let loads = || async {
        let (_, page) = http_get(server.http_addr, "/metrics").await.unwrap();
        crate::common::metric::<u64>(&page, "ratelimit_service_config_load_success").unwrap_or(0)
    };
    let before = loads().await;
    write(&dir, "r.yaml", FIVE);
    crate::common::eventually("the load is counted", || async { loads().await > before }).await;
    assert_eq!(
        http_get(server.http_addr, "/healthcheck").await.unwrap().0,
        200
    );
    crate::common::eventually("gRPC health serving", || async {
        grpc_status("").await == Status::Serving
    })
    .await;
    assert_eq!(grpc_status("ratelimit").await, Status::Serving);
}

/// What the usage-budget docs state for a reload: a new limit on the same window keeps the
/// count, a new window starts a new counter (the bound is old limit + new limit across it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_limit_keeps_the_count_and_a_new_window_starts_a_new_one() {
    let budget = |unit: &str, limit: u32| {
        format!(
            "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {{unit: {unit}, requests_per_unit: {limit}, overdraft: true}}\n"
        )
    };
    let dir = config_dir("reload-budget-window", &[("r.yaml", &budget("hour", 100))]);
    let server = server_on(&dir).await;
    let spent = server.domain("r").hits("k=t", 90).await;
    assert_eq!(spent.remaining()[0], 10);
    write(&dir, "r.yaml", &budget("hour", 200));
    until_rlconfig(&server, "requests_per_unit=200").await;
    assert_eq!(
        remaining(&server, "r", "k", "t").await,
        109,
        "the count is kept"
    );
    write(&dir, "r.yaml", &budget("day", 200));
    until_rlconfig(&server, "unit=DAY").await;
    assert_eq!(
        remaining(&server, "r", "k", "t").await,
        199,
        "a new counter"
    );
}
