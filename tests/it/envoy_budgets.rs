//! Usage budgets through a real Envoy (1.40): the request path checks (`hits_addend: {number:
//! 0}`), the upstream reports its usage in a response header, and Envoy's stream-done call
//! charges it (`hits_addend: {format: "%RESP(x-tokens-used)%"}`). The stream that crosses the
//! budget completes; the next request is 429. With an estimate from a request header charged
//! on the request path, the stream-done call returns it and charges the actual in one request:
//! the budget settles to the actual, whichever was larger.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

use crate::common::envoy::{self, Bootstrap, Envoy};
use crate::common::redis::RedisServer;
use crate::common::{TestServer, config_dir, eventually};
use sluice::settings::{Backend, Settings};
use sluice::store::redis::{RedisKind, RedisOptions};

const CONFIG: &str = "
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 100, overdraft: true}
";

/// The tenant's descriptor from `x-tenant`.
const TENANT: &str = "request_headers: {header_name: x-tenant, descriptor_key: tenant}";

/// Envoy in front of `sluice`: `/report` checks on the request path and charges the reported
/// usage at stream done; `/settle` charges the `x-estimate` on the request path, and at stream
/// done returns it and charges the usage. The upstream reports as usage the request's `x-use`.
async fn edge(sluice: &TestServer) -> (Envoy, u16) {
    let routes = format!(
        r#"              - match: {{prefix: "/report"}}
                route: {{cluster: upstream}}
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                    - actions: [{{{TENANT}}}]
                      hits_addend: {{number: 0}}
                    - apply_on_stream_done: true
                      hits_addend: {{format: "%RESP(x-tokens-used)%"}}
                      actions: [{{{TENANT}}}]
              - match: {{prefix: "/settle"}}
                route: {{cluster: upstream}}
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                    - actions: [{{{TENANT}}}]
                      hits_addend: {{format: "%REQ(x-estimate)%"}}
                    - apply_on_stream_done: true
                      hits_addend: {{format: "%REQ(x-estimate)%", is_negative_hits: true}}
                      actions: [{{{TENANT}}}]
                    - apply_on_stream_done: true
                      hits_addend: {{format: "%RESP(x-tokens-used)%"}}
                      actions: [{{{TENANT}}}]"#
    );
    Bootstrap::new(sluice.grpc_addr.port())
        .routes(&routes)
        .filter("              enable_x_ratelimit_headers: DRAFT_VERSION_03")
        .upstream_route(
            r#"                response_headers_to_add:
                - header: {key: x-tokens-used, value: "%REQ(x-use)%"}"#,
        )
        .start()
        .await
}

/// What the tenant has used, asked of Sluice without charging.
async fn used(sluice: &TestServer, tenant: &str) -> u32 {
    let check = sluice
        .domain("edge")
        .charges(&[(&format!("tenant={tenant}"), 0)])
        .await;
    100 - check.statuses[0].limit_remaining
}

/// Waits until Envoy's stream-done report has reached Sluice (it is sent after the response).
async fn settled(sluice: &TestServer, tenant: &str, total: u32) {
    eventually(&format!("{tenant} has used {total}"), || async {
        used(sluice, tenant).await == total.min(100)
    })
    .await;
}

async fn the_stream_that_crosses_the_budget_completes_and_the_next_is_refused(sluice: &TestServer) {
    let (_envoy, front) = edge(sluice).await;
    let call = |use_: &'static str| async move {
        envoy::get(front, "/report", &[("x-tenant", "acme"), ("x-use", use_)]).await
    };
    assert_eq!(call("60").await.0, 200);
    settled(sluice, "acme", 60).await;
    // 60 used of 100: this stream passes the check and reports 60 more; the passing check's
    // headers already reflect the usage charged so far.
    let (status, head, body) = call("60").await;
    assert_eq!(
        (status, body.as_str()),
        (200, "hello"),
        "the crossing stream completes"
    );
    assert_eq!(
        envoy::header(&head, "x-ratelimit-remaining"),
        Some("40"),
        "{head}"
    );
    assert_eq!(
        envoy::header(&head, "x-ratelimit-limit").map(|l| l.starts_with("100")),
        Some(true),
        "{head}"
    );
    // 120 of 100, counted in full: a refund of 20 would still leave the budget spent.
    eventually("the crossing report is counted", || async {
        let check = sluice.domain("edge").charges(&[("tenant=acme", 0)]).await;
        check.code() == Code::OverLimit
    })
    .await;
    let (status, head, _) = call("1").await;
    assert_eq!(status, 429, "{head}");
    // The 429 describes the budget that refused: its limit, nothing left, and the wait until
    // the overdraft has aged out (the hour's end) in Sluice's RateLimit and Retry-After.
    assert_eq!(
        envoy::header(&head, "x-ratelimit-remaining"),
        Some("0"),
        "{head}"
    );
    let policy = envoy::header(&head, "ratelimit-policy").unwrap_or_default();
    assert!(policy.contains(";q=100;w=3600"), "{head}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let to_hour_end = 3600 - now % 3600;
    let retry: u64 = envoy::header(&head, "retry-after")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        retry.abs_diff(to_hour_end) <= 2,
        "retry-after {retry}, {to_hour_end} s to the hour's end"
    );
    let left = envoy::header(&head, "ratelimit").unwrap_or_default();
    assert!(left.contains(";r=0;t="), "{head}");
    // A refused request's stream reports no usage here (the upstream never answered it):
    // the tenant stays at its 120.
    let after = sluice.domain("edge").charges(&[("tenant=acme", -20)]).await;
    assert_eq!(
        after.statuses[0].limit_remaining, 0,
        "120 - 20 = 100: still spent"
    );
}

async fn an_estimate_settles_to_the_actual(sluice: &TestServer) {
    let (_envoy, front) = edge(sluice).await;
    let call = |tenant: &'static str, estimate: &'static str, use_: &'static str| async move {
        let headers = [
            ("x-tenant", tenant),
            ("x-estimate", estimate),
            ("x-use", use_),
        ];
        envoy::get(front, "/settle", &headers).await
    };
    // An estimate larger than the actual: 30 held while the stream runs, 12 at the end.
    assert_eq!(call("over", "30", "12").await.0, 200);
    settled(sluice, "over", 12).await;
    assert_eq!(call("over", "30", "12").await.0, 200);
    settled(sluice, "over", 24).await;
    // Smaller than the actual: 5 held, 40 at the end.
    assert_eq!(call("under", "5", "40").await.0, 200);
    settled(sluice, "under", 40).await;
    assert_eq!(call("under", "5", "40").await.0, 200);
    settled(sluice, "under", 80).await;
}

/// Sluice on the memory store, or on `redis`, with its own headers on (RateLimit-Policy and
/// RateLimit beside Retry-After).
async fn server(redis: Option<&RedisServer>) -> TestServer {
    let mut settings = Settings::for_tests(config_dir("envoy-budgets", &[("edge.yaml", CONFIG)]));
    settings.response.draft_headers = true;
    if let Some(redis) = redis {
        settings.backend = Backend::Redis;
        settings.redis = Some(RedisOptions::new(redis.url(), RedisKind::Single));
    }
    TestServer::start_with(settings).await
}

async fn memory() -> TestServer {
    server(None).await
}

async fn redis(redis: &RedisServer) -> TestServer {
    server(Some(redis)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_the_stream_that_crosses_the_budget_completes_and_the_next_is_refused() {
    the_stream_that_crosses_the_budget_completes_and_the_next_is_refused(&memory().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_the_stream_that_crosses_the_budget_completes_and_the_next_is_refused() {
    let server = RedisServer::start();
    the_stream_that_crosses_the_budget_completes_and_the_next_is_refused(&redis(&server).await)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_an_estimate_settles_to_the_actual() {
    an_estimate_settles_to_the_actual(&memory().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_an_estimate_settles_to_the_actual() {
    let server = RedisServer::start();
    an_estimate_settles_to_the_actual(&redis(&server).await).await;
}
