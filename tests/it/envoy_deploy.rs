// Why one long file: the shipped deployment exercised end to end; each test needs the same Envoy
// and Sluice pair.
//! `deploy/envoy/envoy.yaml` and `deploy/envoy/sluice-config/`, run as shipped (ports and
//! addresses replaced) with a real Envoy in front of a slow upstream: priority load shedding
//! keeps capacity for critical routes, the fifth concurrent request is refused and admitted
//! again once one completes, and quota refusals carry Retry-After, the draft RateLimit
//! headers and a problem+json body.

use std::path::PathBuf;
use std::time::Duration;

use crate::common::TestServer;
use crate::common::envoy::{self, Envoy, header};
use crate::common::redis::free_port;
use sluice::rls::ResponseOptions;
use sluice::settings::Settings;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn deploy_dir() -> PathBuf {
    crate::common::repo_path("deploy/envoy")
}

/// An upstream that answers `ok` after the `x-delay-ms` the request asks for.
async fn slow_upstream() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    // Serve every request of a kept-alive connection.
                    while let Some(end) = find(&buffer, b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buffer[..end]).to_ascii_lowercase();
                        buffer.drain(..end + 4);
                        let delay = head
                            .lines()
                            .find_map(|l| l.strip_prefix("x-delay-ms: "))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        tokio::time::sleep(Duration::from_millis(delay)).await;
                        let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if stream.write_all(reply).await.is_err() {
                            return;
                        }
                    }
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    port
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

struct Stack {
    /// The first Sluice instance (the one the tests read metrics and counters from).
    sluice: TestServer,
    /// Further instances behind the same Envoy.
    others: Vec<TestServer>,
    envoy: Envoy,
    front: u16,
}

fn settings(redis: Option<&str>) -> Settings {
    let mut settings = Settings::for_tests(deploy_dir().join("sluice-config"));
    settings.response = ResponseOptions {
        draft_headers: true,
        problem_json: true,
        ..ResponseOptions::default()
    };
    if let Some(url) = redis {
        settings.backend = sluice::settings::Backend::Redis;
        settings.redis = Some(sluice::store::redis::RedisOptions::new(
            url,
            sluice::store::redis::RedisKind::Single,
        ));
        settings.resilience.deadline = Duration::from_secs(1);
    }
    settings
}

/// Sluice on the shipped configs, and Envoy on the shipped bootstrap pointed at it.
async fn stack() -> Stack {
    stack_of(vec![TestServer::start_with(settings(None)).await]).await
}

/// Envoy on the shipped bootstrap, balancing over `sluices`.
async fn stack_of(mut sluices: Vec<TestServer>) -> Stack {
    let upstream = slow_upstream().await;
    let (front, admin) = (free_port(), free_port());
    let endpoints: Vec<String> = sluices
        .iter()
        .map(|s| {
            format!(
                "{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {}}}}}}}}}",
                s.grpc_addr.port()
            )
        })
        .collect();
    let mut bootstrap = std::fs::read_to_string(deploy_dir().join("envoy.yaml")).unwrap();
    for (from, to) in [
        (
            "port_value: 9901".to_owned(),
            format!("port_value: {admin}"),
        ),
        (
            "address: 0.0.0.0, port_value: 10000".to_owned(),
            format!("address: 127.0.0.1, port_value: {front}"),
        ),
        (
            "address: backend, port_value: 8080".to_owned(),
            format!("address: 127.0.0.1, port_value: {upstream}"),
        ),
        (
            "[{endpoint: {address: {socket_address: {address: sluice, port_value: 8081}}}}]"
                .to_owned(),
            format!("[{}]", endpoints.join(", ")),
        ),
    ] {
        assert!(
            bootstrap.contains(&from),
            "deploy/envoy/envoy.yaml no longer has '{from}'"
        );
        bootstrap = bootstrap.replace(&from, &to);
    }
    let envoy = Envoy::start(&bootstrap, admin).await;
    let sluice = sluices.remove(0);
    Stack {
        sluice,
        others: sluices,
        envoy,
        front,
    }
}

/// Free slots of the shared in-flight counter, as critical sees them (peek: hits 0).
async fn critical_slots(stack: &Stack) -> u64 {
    let body = r#"{"domain":"shedding","descriptors":[{"entries":[{"key":"priority","value":"critical"}],"hitsAddend":0}]}"#;
    let (_, text) = crate::common::http(stack.sluice.http_addr, "POST", "/json", body)
        .await
        .unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["statuses"][0]["limitRemaining"].as_u64().unwrap_or(0)
}

/// Waits until the shared counter has exactly `free` slots (the readiness signal of
/// requests in flight or releases that landed).
async fn until_free(stack: &Stack, free: u64) {
    let what = format!("the in-flight counter shows {free} free slots");
    crate::common::eventually(&what, || async { critical_slots(stack).await == free }).await;
}

fn slow(stack: &Stack, path: &'static str, delay_ms: u64) -> tokio::task::JoinHandle<u16> {
    let front = stack.front;
    tokio::spawn(async move {
        let delay = delay_ms.to_string();
        envoy::get(front, path, &[("x-delay-ms", &delay)]).await.0
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn low_priority_is_shed_while_critical_still_passes() {
    let stack = stack().await;
    let reports = [
        slow(&stack, "/reports", 1500),
        slow(&stack, "/reports", 1500),
    ];
    until_free(&stack, 2).await;
    // Low may fill half of the 4 slots: a third report is shed with 503 ...
    let (status, head, _) = envoy::get(stack.front, "/reports", &[]).await;
    assert_eq!(status, 503, "{head}");
    assert!(header(&head, "retry-after").is_some(), "{head}");
    // ... while at the same moment checkout, critical, still gets through.
    let (status, head, _) = envoy::get(stack.front, "/checkout", &[]).await;
    assert_eq!(status, 200, "{head}");
    for report in reports {
        assert_eq!(report.await.unwrap(), 200);
    }
    until_free(&stack, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fifth_request_in_flight_waits_for_one_to_complete() {
    let stack = stack().await;
    let quick = slow(&stack, "/checkout", 600);
    let long: Vec<_> = (0..3).map(|_| slow(&stack, "/checkout", 4000)).collect();
    until_free(&stack, 0).await;
    let (status, head, _) = envoy::get(stack.front, "/checkout", &[]).await;
    assert_eq!(status, 503, "{head}");
    // Once the quick one completes, Envoy releases its slot and a new request is admitted
    // while the other three are still in flight.
    assert_eq!(quick.await.unwrap(), 200);
    until_free(&stack, 1).await;
    let (status, head, _) = envoy::get(stack.front, "/checkout", &[]).await;
    assert_eq!(status, 200, "{head}");
    for request in long {
        assert_eq!(request.await.unwrap(), 200);
    }
}

/// A minimal Structured Field list parser (RFC 9651) for items of a string with integer
/// parameters: what the draft RateLimit fields are made of.
fn parse_sf_list(field: &str) -> Vec<(String, Vec<(String, i64)>)> {
    let mut items = Vec::new();
    for member in field.split(", ") {
        let rest = member.strip_prefix('"').expect("an sf-string item");
        let mut name = String::new();
        let mut chars = rest.chars();
        loop {
            match chars.next().expect("closing quote") {
                '\\' => name.push(chars.next().unwrap()),
                '"' => break,
                c => name.push(c),
            }
        }
        let params = chars
            .as_str()
            .split(';')
            .skip(1)
            .map(|p| {
                let (k, v) = p.split_once('=').expect("key=value parameter");
                assert!(
                    k.chars().all(|c| c.is_ascii_lowercase()),
                    "parameter key {k}"
                );
                (k.to_owned(), v.parse().expect("integer parameter"))
            })
            .collect();
        items.push((name, params));
    }
    items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_refusals_tell_the_client_when_to_come_back() {
    let stack = stack().await;
    let key = [("x-api-key", "client-1")];
    let (status, head, _) = envoy::get(stack.front, "/api/orders", &key).await;
    assert_eq!(status, 200, "{head}");
    let policy = parse_sf_list(header(&head, "ratelimit-policy").expect("RateLimit-Policy"));
    assert_eq!(
        policy,
        [
            (
                "per_api_key".to_owned(),
                vec![("q".to_owned(), 3), ("w".to_owned(), 60)]
            ),
            (
                "per_client_address".to_owned(),
                vec![("q".to_owned(), 600), ("w".to_owned(), 60)]
            ),
        ]
    );
    let state = parse_sf_list(header(&head, "ratelimit").expect("RateLimit"));
    assert_eq!(state[0].1[0], ("r".to_owned(), 2));
    assert_eq!(state[1].1[0], ("r".to_owned(), 599));

    envoy::get(stack.front, "/api/orders", &key).await;
    envoy::get(stack.front, "/api/orders", &key).await;
    let (status, head, body) = envoy::get(stack.front, "/api/orders", &key).await;
    assert_eq!(status, 429, "{head}");
    let retry_after: i64 = header(&head, "retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    let state = parse_sf_list(header(&head, "ratelimit").expect("RateLimit"));
    assert_eq!(
        state[0],
        (
            "per_api_key".to_owned(),
            vec![("r".to_owned(), 0), ("t".to_owned(), retry_after)]
        )
    );
    // Envoy's own x-ratelimit-* headers agree with the statuses.
    assert_eq!(header(&head, "x-ratelimit-remaining"), Some("0"), "{head}");
    assert_eq!(
        header(&head, "content-type"),
        Some("application/problem+json"),
        "{head}"
    );
    let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(problem["status"], 429);
    assert_eq!(
        problem["violated-policies"],
        serde_json::json!(["per_api_key"])
    );
    // Another client is untouched.
    assert_eq!(
        envoy::get(stack.front, "/api/orders", &[("x-api-key", "client-2")])
            .await
            .0,
        200
    );
}

/// A counter value from Envoy's admin `/stats`.
async fn envoy_stat(stack: &Stack, name: &str) -> u64 {
    let addr = format!("127.0.0.1:{}", stack.envoy.admin).parse().unwrap();
    let (_, stats) = crate::common::http_get(addr, &format!("/stats?filter={name}"))
        .await
        .unwrap();
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_is_cut_by_the_local_filter_before_sluice_sees_it() {
    let stack = stack().await;
    let mut tasks = Vec::new();
    for i in 0..200 {
        let front = stack.front;
        tasks.push(tokio::spawn(async move {
            let key = format!("flood-{i}");
            envoy::get(front, "/api/items", &[("x-api-key", &key)])
                .await
                .0
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let cut = envoy_stat(&stack, "local_ratelimit.http_local_rate_limit.rate_limited").await;
    assert!(cut >= 100, "the local filter cut {cut} of 200");
    // Sluice saw only what the local filter let through.
    let (_, metrics) = crate::common::http_get(stack.sluice.http_addr, "/metrics")
        .await
        .unwrap();
    let checked: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix(r#"ratelimit_service_rate_limit_total_hits{domain="quota",key1="api_key",key2="",rule="quota.api_key"} "#))
        .map_or(0, |v| v.parse().unwrap());
    // Every request the local filter let through, and only those, reached Sluice.
    assert_eq!(
        checked + cut,
        200,
        "Sluice checked {checked}, the local filter cut {cut}"
    );
    assert!(checked <= 60, "Sluice saw {checked} of 200");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sluice_instances_sharing_redis_hold_one_limit() {
    let redis = crate::common::redis::RedisServer::start();
    let url = redis.url();
    let sluices = vec![
        TestServer::start_with(settings(Some(&url))).await,
        TestServer::start_with(settings(Some(&url))).await,
    ];
    let stack = stack_of(sluices).await;
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(
            envoy::get(stack.front, "/api/items", &[("x-api-key", "shared")])
                .await
                .0,
        );
    }
    // 3 per minute, whichever instance Envoy asked...
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429]);
    // ...and Envoy did ask both.
    for instance in std::iter::once(&stack.sluice).chain(&stack.others) {
        let (_, page) = crate::common::http_get(instance.http_addr, "/metrics")
            .await
            .unwrap();
        let answered: f64 = page
            .lines()
            .filter(|l| {
                l.starts_with("sluice_grpc_requests_total{")
                    && l.contains(r#"method="ShouldRateLimit""#)
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert!(answered > 0.0, "an instance got no request:\n{page}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_fails_open_when_sluice_is_stopped() {
    let stack = stack().await;
    let Stack {
        sluice,
        others: _others,
        envoy,
        front,
    } = stack;
    sluice.stop().await.unwrap();
    for _ in 0..5 {
        assert_eq!(
            envoy::get(front, "/api/items", &[("x-api-key", "k")])
                .await
                .0,
            200
        );
    }
    drop(envoy);
}
