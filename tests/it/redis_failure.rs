//! The failure policy against a real Redis that is paused (SIGSTOP), resumed, killed and
//! restarted: answers keep coming without waiting on Redis, follow each domain's
//! `failure_mode`, and counting resumes when Redis returns, without a restart.

use std::time::{Duration, Instant};

use crate::common::redis::RedisServer;
use crate::common::{TestServer, config_dir, descriptor, http_get, request};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use sluice::settings::{Backend, Settings};
use sluice::store::redis::{RedisKind, RedisOptions};
use sluice::store::resilient::ResilienceOptions;

const OPEN: &str = "domain: open\nfailure_mode: allow\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 2}\n";
const CLOSED: &str = "domain: closed\nfailure_mode: deny\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 2}\n";
const LOCAL: &str = "domain: local\ndescriptors:\n  - key: k\n    failure_mode: local\n    rate_limit: {unit: day, requests_per_unit: 6}\n";

/// Generous for a loaded CI machine, still far below the reference service's 10 s.
const DEADLINE: Duration = Duration::from_millis(100);

async fn server(redis: &RedisServer) -> TestServer {
    server_with_deadline(redis, DEADLINE).await
}

async fn server_with_deadline(redis: &RedisServer, deadline: Duration) -> TestServer {
    TestServer::start_with(settings(redis, deadline)).await
}

fn settings(redis: &RedisServer, deadline: Duration) -> Settings {
    let mut settings = Settings::for_tests(config_dir(
        "failure",
        &[
            ("open.yaml", OPEN),
            ("closed.yaml", CLOSED),
            ("local.yaml", LOCAL),
        ],
    ));
    settings.backend = Backend::Redis;
    settings.redis = Some(RedisOptions {
        connections: 1,
        connect_timeout: Duration::from_secs(1),
        ..RedisOptions::new(redis.url(), RedisKind::Single)
    });
    settings.resilience = ResilienceOptions {
        deadline,
        breaker_failures: 3,
        breaker_cooldown: Duration::from_millis(100),
        // `local` counts a third of each limit: three instances share it.
        local_instances: 3,
    };
    settings
}

/// One request; panics on a gRPC error (the failure policy must answer, not fail) or on an
/// answer that took longer than a few deadlines.
async fn ask(server: &TestServer, domain: &str, value: &str) -> RateLimitResponse {
    let started = Instant::now();
    let response = server.domain(domain).hit(&format!("k={value}")).await.0;
    let took = started.elapsed();
    assert!(took < DEADLINE * 10, "{domain}/{value} took {took:?}");
    response
}

fn ok(r: &RateLimitResponse) -> bool {
    r.overall_code == Code::Ok as i32
}

/// Sends requests until the store answers again (the admin page shows the breaker closed).
async fn wait_until_counting(server: &TestServer) -> Duration {
    crate::common::eventually_within(Duration::from_secs(10), "counting resumes", || async move {
        ask(server, "open", "probe").await;
        let (_, page) = http_get(server.http_addr, "/rlconfig").await.unwrap();
        page.contains("# store: redis, ok;")
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_costs_no_waiting_and_follows_each_failure_mode() {
    let redis = RedisServer::start();
    let server = server(&redis).await;
    assert_eq!(
        ask(&server, "open", "a").await.statuses[0].limit_remaining,
        1
    );

    redis.pause();
    // allow: fail open.
    for _ in 0..5 {
        assert!(ok(&ask(&server, "open", "a").await));
    }
    // deny: fail closed, telling the client to come back.
    let denied = ask(&server, "closed", "a").await;
    assert!(!ok(&denied));
    assert_eq!(denied.response_headers_to_add[0].key, "retry-after");
    // A check of 0 hits (how a usage budget admits a stream) is refused too: its usage could
    // not be charged. A refund passes (it only gives back).
    let closed = server.domain("closed");
    assert!(closed.charges(&[("k=a", 0)]).await.is_over_limit());
    assert!(!closed.charges(&[("k=a", -1)]).await.is_over_limit());
    // local: this instance's share of the limit (6 / 3 instances = 2).
    let local: Vec<bool> = answers(&server, "local", "a", 4).await;
    assert_eq!(local, [true, true, false, false]);
    // Kubernetes must not kill the pod for Redis's outage.
    assert_eq!(
        http_get(server.http_addr, "/healthcheck").await.unwrap().0,
        200
    );
    let (_, page) = http_get(server.http_addr, "/rlconfig").await.unwrap();
    assert!(page.contains("failing (circuit breaker open)"), "{page}");
    // And Prometheus shows it: the breaker, the failed calls, the answers by mode.
    let (_, metrics) = http_get(server.http_addr, "/metrics").await.unwrap();
    let value = |series: &str| crate::common::metric::<f64>(&metrics, series);
    assert_eq!(value("sluice_store_healthy"), Some(0.0), "{metrics}");
    assert!(value("sluice_store_errors_total") >= Some(3.0), "{metrics}");
    // The reference's name for it: every request whose store call failed.
    assert_eq!(
        value(r#"ratelimit_service_should_rate_limit_error{err_type="redis_error"}"#),
        value("sluice_store_errors_total")
    );
    // allow: the five opens (and the calls that opened the breaker); deny: three; local: four.
    assert!(value(r#"sluice_failure_mode_decisions_total{mode="allow"}"#) >= Some(5.0));
    assert_eq!(
        value(r#"sluice_failure_mode_decisions_total{mode="deny"}"#),
        Some(3.0)
    );
    assert_eq!(
        value(r#"sluice_failure_mode_decisions_total{mode="local"}"#),
        Some(4.0)
    );

    redis.resume();
    let took = wait_until_counting(&server).await;
    assert!(
        took < Duration::from_secs(2),
        "counting resumed after {took:?}"
    );
    assert_eq!(
        ask(&server, "open", "fresh").await.statuses[0].limit_remaining,
        1
    );
    assert_eq!(
        ask(&server, "open", "fresh").await.statuses[0].limit_remaining,
        0
    );
    assert!(!ok(&ask(&server, "open", "fresh").await));
    assert!(ok(&ask(&server, "closed", "fresh").await));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_empty_redis_is_used_again_without_errors() {
    let mut redis = RedisServer::start();
    let server = server(&redis).await;
    assert!(ok(&ask(&server, "open", "a").await));
    assert!(ok(&ask(&server, "open", "a").await));
    assert!(!ok(&ask(&server, "open", "a").await));

    redis.kill();
    for _ in 0..5 {
        assert!(
            ok(&ask(&server, "open", "a").await),
            "fail open while redis is down"
        );
    }
    redis.restart();
    wait_until_counting(&server).await;
    // An empty server: the script is loaded again and counters start from zero. (The
    // requests admitted while it was down may reach it when it is back, and count: they
    // were admitted.)
    assert_eq!(
        ask(&server, "open", "after").await.statuses[0].limit_remaining,
        1
    );
}

/// `count` requests one after the other; whether each was OK.
async fn answers(server: &TestServer, domain: &str, value: &str, count: usize) -> Vec<bool> {
    let mut answers = Vec::with_capacity(count);
    for _ in 0..count {
        answers.push(ok(&ask(server, domain, value).await));
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_deadline_shorter_than_the_stores_is_answered_by_the_failure_policy_in_time() {
    let redis = RedisServer::start();
    let server = server_with_deadline(&redis, Duration::from_secs(2)).await;
    let mut client = server.client().await;
    assert!(ok(&ask(&server, "open", "a").await));

    redis.pause();
    // The caller waits 200 ms, less than the 2 s store deadline: it gets the failure
    // policy's answer before it gives up, not a timeout of its own (which Envoy would treat
    // as an error, whatever the rule's failure_mode).
    for domain in ["open", "closed"] {
        let mut short = tonic::Request::new(request(domain, vec![descriptor(&[("k", "a")])]));
        short.set_timeout(Duration::from_millis(200));
        let answer = client
            .should_rate_limit(short)
            .await
            .expect("answered before the caller's deadline")
            .into_inner();
        assert_eq!(ok(&answer), domain == "open", "{domain}");
    }
    redis.resume();
    wait_until_counting(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_the_breaker_is_open_no_request_waits_and_a_background_probe_closes_it() {
    // A long deadline, so that a request that waits for Redis cannot pass for one that
    // does not.
    let deadline = Duration::from_secs(1);
    let redis = RedisServer::start();
    let server = server_with_deadline(&redis, deadline).await;
    assert!(ok(&ask(&server, "open", "a").await));

    redis.pause();
    let open = server.domain("open");
    for _ in 0..3 {
        open.hit("k=a").await;
    }
    let (_, page) = http_get(server.http_addr, "/rlconfig").await.unwrap();
    assert!(page.contains("circuit breaker open"), "{page}");
    // Over several cooldowns (100 ms each), no request waits for Redis: one that did (a
    // probe, as before) would take the whole 1 s deadline.
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    while started.elapsed() < Duration::from_millis(600) {
        let one = Instant::now();
        assert!(open.hit("k=b").await.is_ok());
        slowest = slowest.max(one.elapsed());
    }
    assert!(slowest < deadline / 2, "a request waited {slowest:?}");
    redis.resume();
    let took = wait_until_counting(&server).await;
    assert!(
        took < Duration::from_secs(2),
        "counting resumed after {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_refusing_to_run_the_script_is_answered_by_each_failure_mode() {
    let redis = RedisServer::start();
    // A background probe passes under OOM (it writes nothing) and closes the breaker: give
    // the 40 requests below a cooldown they finish well within, even on a loaded machine.
    let mut settings = settings(&redis, DEADLINE);
    settings.resilience.breaker_cooldown = Duration::from_secs(1);
    let server = TestServer::start_with(settings).await;
    assert!(ok(&ask(&server, "closed", "a").await));

    // Out of memory, writes refused (OOM command not allowed): Redis answers at once, with
    // an error. Every answer follows the rule's failure_mode; none is a gRPC error (which
    // Envoy would let through, deny rules included).
    redis.command(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    redis.command(&["CONFIG", "SET", "maxmemory", "1"]);
    for i in 0..20 {
        let value = format!("oom{i}");
        assert!(
            !ok(&ask(&server, "closed", &value).await),
            "deny fails closed"
        );
        assert!(ok(&ask(&server, "open", &value).await), "allow fails open");
    }
    let (_, page) = http_get(server.http_addr, "/rlconfig").await.unwrap();
    assert!(page.contains("failing (circuit breaker open)"), "{page}");
    let (_, metrics) = http_get(server.http_addr, "/metrics").await.unwrap();
    assert_eq!(
        crate::common::metric::<f64>(&metrics, r#"sluice_errors_total{type="store_unavailable"}"#),
        None,
        "no request failed: {metrics}"
    );

    // Memory back: counting resumes by itself.
    redis.command(&["CONFIG", "SET", "maxmemory", "0"]);
    wait_until_counting(&server).await;
    assert_eq!(
        ask(&server, "closed", "after").await.statuses[0].limit_remaining,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_with_tiny_deadlines_cannot_open_the_breaker_for_everyone() {
    let redis = RedisServer::start();
    let server = server(&redis).await;
    let mut client = server.client().await;
    // A client (anyone who reaches the port) sends requests it gives a microsecond: each
    // misses its own deadline, and is answered by the failure policy or times out itself.
    for _ in 0..20 {
        let mut tiny = tonic::Request::new(request("closed", vec![descriptor(&[("k", "x")])]));
        // The header alone (the client itself waits): the server sees every request.
        tiny.metadata_mut()
            .insert("grpc-timeout", "1u".parse().unwrap());
        let _ = client.should_rate_limit(tiny).await;
    }
    // Redis is fine, so everyone else is still counted by it.
    let (_, page) = http_get(server.http_addr, "/rlconfig").await.unwrap();
    assert!(page.contains("# store: redis, ok;"), "{page}");
    assert_eq!(
        ask(&server, "closed", "other").await.statuses[0].limit_remaining,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_in_flight_cap_wait_their_turn_and_are_all_answered() {
    let redis = RedisServer::start();
    let mut settings = Settings::for_tests(config_dir("in-flight", &[("open.yaml", OPEN)]));
    settings.backend = Backend::Redis;
    settings.redis = Some(RedisOptions {
        connections: 1,
        ..RedisOptions::new(redis.url(), RedisKind::Single)
    });
    let deadline = Duration::from_millis(300);
    settings.resilience = ResilienceOptions {
        deadline,
        breaker_failures: 100,
        ..ResilienceOptions::default()
    };
    settings.grpc_max_in_flight = 1;
    let server = TestServer::start_with(settings).await;
    redis.pause();
    // Three requests at once, each held for the whole deadline by the paused Redis: with one
    // in flight at a time they are answered one after the other, none refused.
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..3 {
        let open = server.domain("open");
        tasks.push(tokio::spawn(
            async move { open.hit(&format!("k=w{i}")).await.0 },
        ));
    }
    for task in tasks {
        assert!(ok(&task.await.unwrap()), "answered by failure_mode: allow");
    }
    assert!(
        started.elapsed() >= deadline * 3,
        "three deadlines one after the other, not at once: {:?}",
        started.elapsed()
    );
    redis.resume();
}

/// `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`: health fails while Redis does not answer (the
/// failure policy still answers requests) and recovers with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_can_follow_the_store() {
    let mut redis = RedisServer::start();
    let mut settings = settings(&redis, DEADLINE);
    settings.require_store = true;
    let server = TestServer::start_with(settings).await;
    let health = || async { http_get(server.http_addr, "/healthcheck").await.unwrap() };
    assert_eq!(health().await, (200, "OK".into()));
    redis.kill();
    crate::common::eventually("health fails while Redis is gone", || async {
        ask(&server, "open", "h").await; // the failures that open the breaker
        health().await == (503, "the store does not answer".into())
    })
    .await;
    assert!(
        ok(&ask(&server, "open", "h").await),
        "requests are still answered"
    );
    redis.restart();
    crate::common::eventually("health recovers with Redis", || async {
        health().await.0 == 200
    })
    .await;
}

/// `REDIS_STARTUP_*`: with Redis not there, start-up retries it with a doubling wait for at
/// most `REDIS_STARTUP_MAX_ELAPSED_TIME`, then serves by the failure mode.
#[test]
fn startup_retries_the_store_for_the_time_given_then_serves() {
    let dir = config_dir("startup", &[("open.yaml", OPEN)]);
    let nobody = format!("127.0.0.1:{}", crate::common::redis::free_port());
    let served = crate::common::SluiceProcess::spawn_with_env(
        &dir,
        &[],
        &[
            ("REDIS_URL", nobody.as_str()),
            ("BACKEND_TYPE", "redis"),
            ("REDIS_TIMEOUT", "100ms"),
            ("REDIS_STARTUP_MAX_ELAPSED_TIME", "3s"),
            ("REDIS_STARTUP_INITIAL_INTERVAL", "100ms"),
            ("REDIS_STARTUP_MAX_INTERVAL", "200ms"),
        ],
    );
    let retries = served
        .startup_log
        .iter()
        .filter(|l| l.contains("store not ready at startup"))
        .count();
    assert!(retries >= 2, "{:?}", served.startup_log);
    assert!(
        served.logged_at_startup("not ready after REDIS_STARTUP_MAX_ELAPSED_TIME"),
        "{:?}",
        served.startup_log
    );
}
