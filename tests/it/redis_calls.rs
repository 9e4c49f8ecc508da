//! What a request costs Redis: one script call per request, none while a counter is known
//! to be over its limit (the local over-limit cache), and Sentinel finds the master.

use std::time::Duration;

use crate::common::redis::{RedisSentinel, RedisServer, command_calls};
use crate::common::{TestServer, config_dir, descriptor, eventually_blocking, request};
use sluice::settings::{Backend, Settings};
use sluice::store::redis::{RedisKind, RedisOptions};
use sluice::store::resilient::ResilienceOptions;

const CONFIG: &str = "domain: calls\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 3}\n  - key: j\n    rate_limit: {unit: day, requests_per_unit: 100}\n";

async fn server(url: String, kind: RedisKind, local_cache_keys: usize) -> TestServer {
    server_with_auth(url, kind, local_cache_keys, None).await
}

async fn server_with_auth(
    url: String,
    kind: RedisKind,
    local_cache_keys: usize,
    auth: Option<&str>,
) -> TestServer {
    let mut settings = Settings::for_tests(config_dir("calls", &[("calls.yaml", CONFIG)]));
    settings.backend = Backend::Redis;
    settings.redis = Some(RedisOptions {
        key_prefix: "calls:".into(),
        connections: 1,
        auth: auth.map(str::to_owned),
        ..RedisOptions::new(url, kind)
    });
    settings.resilience = ResilienceOptions {
        deadline: Duration::from_secs(2),
        ..ResilienceOptions::default()
    };
    settings.local_cache_keys = local_cache_keys;
    TestServer::start_with(settings).await
}

fn script_calls(redis: &RedisServer) -> u64 {
    command_calls(redis, "evalsha") + command_calls(redis, "eval")
}

#[tokio::test]
async fn one_script_call_per_request_whatever_the_number_of_descriptors() {
    let redis = RedisServer::start();
    let server = server(redis.url(), RedisKind::Single, 0).await;
    let calls = server.domain("calls");
    for _ in 0..10 {
        calls.hit("j=v0 | j=v1 | j=v2 | j=v3").await;
    }
    // The script was loaded at startup: exactly one call per request.
    assert_eq!(script_calls(&redis), 10);
    assert_eq!(
        command_calls(&redis, "get") + command_calls(&redis, "incrby"),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_share_script_calls_and_each_stays_all_or_nothing() {
    let redis = RedisServer::start();
    let server = server(redis.url(), RedisKind::Single, 0).await;
    let calls = server.domain("calls");
    // 200 requests at once, each for (k, x) limited to 3 and (j, y) limited to 100: only 3
    // are admitted, and the 197 rejected charge nothing on (j, y).
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let calls = calls.clone();
            tokio::spawn(async move { calls.hit("k=x | j=y").await.is_ok() })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += usize::from(task.await.unwrap());
    }
    assert_eq!(admitted, 3);
    assert_eq!(calls.hit("j=y").await.remaining(), [100 - 3 - 1]);
    // At most one call per request (the later one included).
    assert!(script_calls(&redis) <= 200 + 1);
}

#[tokio::test]
async fn counters_known_over_the_limit_cost_no_redis_call() {
    let redis = RedisServer::start();
    let server = server(redis.url(), RedisKind::Single, 1000).await;
    let domain = server.domain("calls");
    for _ in 0..3 {
        assert!(domain.hit("k=hot").await.is_ok());
    }
    assert!(domain.hit("k=hot").await.is_over_limit());
    let calls = script_calls(&redis);
    for _ in 0..20 {
        let r = domain.hit("k=hot").await;
        assert!(r.is_over_limit());
        assert_eq!(r.response_headers_to_add[0].key, "retry-after");
    }
    assert_eq!(
        script_calls(&redis),
        calls,
        "answered from the over-limit cache"
    );
    let (_, metrics) = crate::common::http_get(server.http_addr, "/metrics")
        .await
        .unwrap();
    let series = r#"ratelimit_service_rate_limit_over_limit_with_local_cache{domain="calls",key1="k",key2="",rule="calls.k"} 20"#;
    assert!(metrics.contains(series), "{metrics}");
    // Other counters still go to Redis.
    domain.hit("k=cold").await;
    assert_eq!(script_calls(&redis), calls + 1);
}

#[tokio::test]
async fn sentinel_leads_to_the_master() {
    let master = RedisServer::start();
    let sentinel = RedisSentinel::start(&master, "sluice-master");
    let url = format!("sluice-master,{}", sentinel.addr());
    let server = server(url, RedisKind::Sentinel, 0).await;
    // A loaded machine may let the first connection through the Sentinel take a moment
    // (answered by the failure policy meanwhile): wait until one request is counted.
    let calls = server.domain("calls");
    crate::common::eventually("a request is counted through the Sentinel", || async {
        calls.hit("k=first").await.remaining()[0] < 3
    })
    .await;
    let mut remaining = Vec::new();
    for _ in 0..3 {
        remaining.extend(calls.hit("k=s").await.remaining());
    }
    assert_eq!(remaining, [2, 1, 0]);
    assert!(script_calls(&master) >= 3, "counted on the master");
}

#[tokio::test]
async fn every_counter_key_expires_with_its_window() {
    let redis = RedisServer::start();
    let server = server(redis.url(), RedisKind::Single, 0).await;
    let calls = server.domain("calls");
    for value in ["a", "b|c", "d=e"] {
        // Values with the spec's separators, so built by hand.
        let request = request("calls", vec![descriptor(&[("j", value)])]);
        calls.send(request).await.unwrap();
    }
    let keys = redis.command(&["KEYS", "calls:*"]);
    let names: Vec<&str> = keys.lines().filter(|l| l.starts_with("calls:")).collect();
    assert_eq!(names.len(), 3, "{keys}");
    for name in names {
        let ttl: i64 = redis
            .command(&["PTTL", name])
            .trim_start_matches(':')
            .parse()
            .unwrap();
        assert!(ttl > 0 && ttl <= 86_400_000, "{name}: {ttl}");
    }
    assert!(keys.contains(r"calls:calls|j=b\|c|86400s:fw"), "{keys}");
}

#[tokio::test]
async fn a_unix_socket_works() {
    let dir = crate::common::temp_dir("unix");
    let socket = dir.join("redis.sock");
    let mut child = std::process::Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--save",
            "",
            "--appendonly",
            "no",
            "--unixsocket",
        ])
        .arg(&socket)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    eventually_blocking("redis opens its socket", || socket.exists());
    let server = server(socket.display().to_string(), RedisKind::Single, 0).await;
    let calls = server.domain("calls");
    let mut remaining = Vec::new();
    for _ in 0..2 {
        remaining.extend(calls.hit("k=unix").await.remaining());
    }
    assert_eq!(remaining, [2, 1]);
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_sentinel_failover_counting_moves_to_the_promoted_replica() {
    let mut master = RedisServer::start();
    let replica = RedisServer::replica_of(&master);
    let sentinel = RedisSentinel::start(&master, "failover");
    eventually_blocking("sentinel to know the replica", || {
        sentinel
            .try_command(&["SENTINEL", "replicas", "failover"])
            .is_ok_and(|r| r.contains(&replica.port.to_string()))
    });
    let server = server(
        format!("failover,{}", sentinel.addr()),
        RedisKind::Sentinel,
        0,
    )
    .await;
    let calls = server.domain("calls");
    let remaining = async |value: &str| calls.hit(&format!("j={value}")).await.remaining()[0];
    assert_eq!(remaining("before").await, 99);

    master.kill();
    // While there is no master, requests fail open (remaining stays at the limit); once
    // Sentinel has promoted the replica, Sluice asks it again and counts there.
    let mut attempt = 0;
    let limit = Duration::from_secs(60);
    crate::common::eventually_within(limit, "counting resumes after the failover", || {
        attempt += 1;
        let key = format!("after-{attempt}");
        async move { (remaining(&key).await, remaining(&key).await) == (99, 98) }
    })
    .await;
    let master_now = sentinel.command(&["SENTINEL", "get-master-addr-by-name", "failover"]);
    assert!(
        master_now.contains(&replica.port.to_string()),
        "{master_now}"
    );
    let counted = format!("calls:calls|j=after-{attempt}|86400s:fw");
    assert_eq!(replica.command(&["EXISTS", &counted]), ":1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_auth_is_a_password_or_a_user_and_password() {
    let redis = RedisServer::start_with(&[
        "--requirepass",
        "s3cret",
        "--user",
        "alice",
        "on",
        ">wonderland",
        "~*",
        "+@all",
    ]);
    for (auth, counted) in [
        (Some("s3cret"), true),
        (Some("alice:wonderland"), true),
        (Some("alice:wrong"), false),
        (None, false),
    ] {
        let server = server_with_auth(redis.url(), RedisKind::Single, 0, auth).await;
        let calls = server.domain("calls");
        let spec = format!("j=auth-{}", auth.unwrap_or("none"));
        let mut remaining = Vec::new();
        for _ in 0..2 {
            remaining.extend(calls.hit(&spec).await.remaining());
        }
        // Counted: 99 then 98. Refused by Redis: the failure policy (allow) answers 100.
        let expected = if counted {
            vec![99, 98]
        } else {
            vec![100, 100]
        };
        assert_eq!(remaining, expected, "REDIS_AUTH {auth:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_instance_connects_and_loads_the_script_before_serving() {
    let redis = RedisServer::start();
    let _server = server(redis.url(), RedisKind::Single, 0).await;
    // Before any request: the first ones must not wait for a connection or meet NOSCRIPT
    // (with a 15 ms deadline, a cold start would answer them by the failure policy).
    let sha = redis::Script::new(sluice::store::redis::SCRIPT)
        .get_hash()
        .to_owned();
    assert_eq!(redis.command(&["SCRIPT", "EXISTS", &sha]), "*1\r\n:1");
    assert_eq!(script_calls(&redis), 0);
}
