//! The admin router, exercised with `oneshot`.

use super::*;
use crate::clock::SystemClock;
use crate::limiter::LimiterOptions;
use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use tower::ServiceExt;

fn state(serving: bool) -> AdminState {
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: z\n    rate_limit: {unlimited: true}\n";
    let limiter = Arc::new(Limiter::for_tests(
        yaml,
        LimiterOptions::default(),
        Arc::new(SystemClock),
    ));
    let health = Arc::new(Health::default());
    health.set_serving(serving);
    AdminState {
        rls: RlsService::new(limiter.clone()),
        limiter,
        health,
        metrics: Arc::new(prometheus::Registry::new()),
        reset: Arc::new(super::ResetAccess::new(
            Default::default(),
            &prometheus::Registry::new(),
        )),
        rlqs: None,
        config: Arc::new(parking_lot::RwLock::new(ConfigInfo {
            directory: "cfg".into(),
            files: vec!["d.yaml".into()],
            last_reload: None,
            connection: None,
        })),
    }
}

async fn send(router: &Router, method: &str, uri: &str, body: &str) -> (StatusCode, String) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .body(Body::from(body.to_owned()))
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

const ONE_K: &str = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;

#[tokio::test]
async fn json_answers_200_then_429_with_retry_after() {
    let router = router(state(true));
    let (status, body) = send(&router, "POST", "/json", ONE_K).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["overallCode"], "OK");
    assert_eq!(json["statuses"][0]["currentLimit"]["unit"], "HOUR");
    let (status, body) = send(&router, "POST", "/json", ONE_K).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["overallCode"], "OVER_LIMIT");
    assert_eq!(json["responseHeadersToAdd"][0]["key"], "retry-after");
}

#[tokio::test]
async fn json_unlimited_reports_max_remaining() {
    let router = router(state(true));
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"z","value":"v"}]}]}"#;
    let (_, body) = send(&router, "POST", "/json", body).await;
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["statuses"][0]["limitRemaining"], 4_294_967_295u64);
}

#[tokio::test]
async fn json_bad_input_is_400_with_the_reason() {
    let router = router(state(true));
    let cases = [
        ("not json", "invalid RateLimitRequest JSON"),
        (
            r#"{"domain":"d","descriptors":[],"extra":1}"#,
            "unknown field `extra`",
        ),
        (
            r#"{"domain":"","descriptors":[{"entries":[{"key":"k"}]}]}"#,
            "domain must not be empty",
        ),
        (r#"{"domain":"d"}"#, "descriptor list must not be empty"),
        (
            r#"{"domain":"d","descriptors":[{"entries":[{"key":"k"}],"limit":{"requestsPerUnit":1}}]}"#,
            "invalid unit UNKNOWN",
        ),
    ];
    for (body, reason) in cases {
        let (status, text) = send(&router, "POST", "/json", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(text.contains(reason), "{body} → {text}");
    }
}

#[tokio::test]
async fn health_and_readiness_follow_the_serving_state() {
    let serving = router(state(true));
    assert_eq!(
        send(&serving, "GET", "/healthcheck", "").await,
        (StatusCode::OK, "OK".into())
    );
    assert_eq!(send(&serving, "GET", "/ready", "").await.0, StatusCode::OK);
    let draining = router(state(false));
    assert_eq!(
        send(&draining, "GET", "/healthcheck", "").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        send(&draining, "GET", "/ready", "").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test]
async fn rlconfig_lists_sorted_rules_and_the_store() {
    let router = router(state(true));
    let (status, body) = send(&router, "GET", "/rlconfig", "").await;
    assert_eq!(status, StatusCode::OK);
    let lines: Vec<_> = body.lines().collect();
    assert_eq!(
        lines[0],
        "d.k: unit=HOUR requests_per_unit=1, shadow_mode: false, quota_mode: false, algorithm: fixed_window"
    );
    assert_eq!(
        lines[1],
        "d.z: unlimited, shadow_mode: false, quota_mode: false"
    );
    assert!(
        lines[2].starts_with("# config: 1 domains from 1 files in cfg"),
        "{body}"
    );
    assert!(
        lines[3].starts_with("# store: memory, 0 keys tracked"),
        "{body}"
    );
}

#[tokio::test]
async fn counters_refuses_a_parameter_given_twice_naming_it() {
    let router = router(state(true));
    for (uri, name) in [
        ("/counters?domain=d&domain=e&entry=k=v", "domain"),
        (
            "/counters?domain=d&descriptor=k=v&descriptor=z=w",
            "descriptor",
        ),
        (
            "/counters?domain=api&bucket=tenant=a&bucket=plan=free",
            "bucket",
        ),
        ("/counters?domain=api&bucket=tenant=a&domain=api", "domain"),
    ] {
        let (status, text) = send(&router, "GET", uri, "").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri} → {text}");
        assert!(
            text.contains(&format!("query parameter `{name}` is repeated")),
            "{uri} → {text}"
        );
    }
    let (status, text) = send(
        &router,
        "GET",
        "/counters?domain=api&bucket=tenant=a,tenant=b",
        "",
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.contains("bucket key `tenant` is repeated"), "{text}");
    // `entry` is one per entry: given twice, it names a descriptor of two entries.
    let (status, text) = send(&router, "GET", "/counters?domain=d&entry=k=v&entry=z=w", "").await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(text.contains(r#""key":"z""#), "{text}");
}
