//! Black-box tests over gRPC and HTTP against a real server on 127.0.0.1:0, with config
//! files in the reference format.

use crate::common::{TestServer, descriptor, http, http_get, request};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, rate_limit::Unit};
use envoy_types::pb::google::protobuf::UInt64Value;

const API: &str = r#"
domain: api
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 3, name: per_client}
  - key: client
    value: premium
    rate_limit: {unit: minute, requests_per_unit: 10, name: premium}
  - key: client
    value: partner-*
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: client
    value: internal
  - key: client
    value: robot
    rate_limit: {unlimited: true}
  - key: remote_address
    descriptors:
      - key: path
        value: /login
        rate_limit: {unit: hour, requests_per_unit: 2}
  - key: plan
    value: gold
    rate_limit: {unit: hour, requests_per_unit: 1000, name: gold, replaces: [{name: per_client}]}
  - key: experiment
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
"#;

async fn api() -> TestServer {
    TestServer::with_config(API).await
}

#[tokio::test]
async fn exact_value_beats_wildcard_beats_key_only() {
    let server = api().await;
    let api = server.domain("api");
    for (value, expected) in [("premium", 10), ("partner-acme", 5), ("someone", 3)] {
        let r = api.hit(&format!("client={value}")).await;
        let limit = r.statuses[0].current_limit.as_ref().unwrap();
        assert_eq!(limit.requests_per_unit, expected, "client={value}");
        assert_eq!(r.remaining(), [expected - 1]);
    }
}

#[tokio::test]
async fn whitelisted_and_unlimited_values_pass_without_counting() {
    let server = api().await;
    let api = server.domain("api");
    for _ in 0..5 {
        let r = api.hit("client=internal | client=robot").await;
        assert!(r.is_ok());
        assert!(r.statuses[0].current_limit.is_none());
        assert!(r.statuses[1].current_limit.is_none());
        assert_eq!(r.remaining(), [0, 4_294_967_295]);
    }
}

#[tokio::test]
async fn rules_apply_only_at_their_depth() {
    let server = api().await;
    let api = server.domain("api");
    // The nested rule applies to the two-entry descriptor ...
    let r = api.hit("remote_address=10.0.0.7,path=/login").await;
    assert_eq!(
        r.statuses[0].current_limit.as_ref().unwrap().unit,
        Unit::Hour as i32
    );
    // ... not to one entry, a different path, or a longer descriptor.
    for spec in [
        "remote_address=10.0.0.7",
        "remote_address=10.0.0.7,path=/other",
        "remote_address=10.0.0.7,path=/login,x=y",
        "client=someone,x=y",
    ] {
        let r = api.hit(spec).await;
        assert!(r.statuses[0].current_limit.is_none(), "{spec}");
    }
}

#[tokio::test]
async fn over_limit_answers_carry_retry_after_and_reset() {
    let server = api().await;
    let api = server.domain("api");
    let login = "remote_address=10.0.0.8,path=/login";
    for _ in 0..2 {
        assert!(api.hit(login).await.is_ok());
    }
    let r = api.hit(login).await;
    assert!(r.is_over_limit());
    assert_eq!(r.codes(), [Code::OverLimit]);
    let reset = r.statuses[0].duration_until_reset.unwrap();
    assert!(reset.seconds <= 3600);
    let header = &r.response_headers_to_add[0];
    assert_eq!(header.key, "retry-after");
    let seconds: i64 = header.value.parse().unwrap();
    assert!(
        seconds >= reset.seconds && seconds <= reset.seconds + 1,
        "{seconds} vs {reset:?}"
    );
}

#[tokio::test]
async fn a_rejected_request_charges_none_of_its_descriptors() {
    let server = api().await;
    let api = server.domain("api");
    let ip = "remote_address=10.0.0.9,path=/login";
    for _ in 0..2 {
        api.hit(ip).await;
    }
    for _ in 0..5 {
        assert!(
            api.hit(&format!("client=carol | {ip}"))
                .await
                .is_over_limit()
        );
    }
    let r = api.hit("client=carol").await;
    assert_eq!(r.remaining(), [2], "carol was never charged");
}

#[tokio::test]
async fn replaces_drops_the_replaced_limit_within_one_request() {
    let server = api().await;
    let api = server.domain("api");
    for _ in 0..3 {
        api.hit("client=dave").await;
    }
    let r = api.hit("client=dave | plan=gold").await;
    assert!(r.is_ok());
    assert!(r.statuses[0].current_limit.is_none());
    assert_eq!(r.statuses[1].current_limit.as_ref().unwrap().name, "gold");
}

#[tokio::test]
async fn shadow_mode_rules_never_reject() {
    let server = api().await;
    let api = server.domain("api");
    for _ in 0..3 {
        let r = api.hit("experiment=b").await;
        assert!(r.is_ok());
        assert_eq!(r.codes(), [Code::Ok]);
    }
}

#[tokio::test]
async fn peek_and_per_descriptor_hits() {
    let server = api().await;
    let api = server.domain("api");
    let with_hits = |hits| {
        let mut request = api.request("client=erin");
        request.descriptors[0].hits_addend = Some(UInt64Value { value: hits });
        request
    };
    let r = api.send(with_hits(2)).await.unwrap();
    assert_eq!(r.statuses[0].limit_remaining, 1);
    for _ in 0..3 {
        let r = api.send(with_hits(0)).await.unwrap();
        assert_eq!(
            (r.overall_code(), r.statuses[0].limit_remaining),
            (Code::Ok, 1)
        );
    }
    assert!(api.hits("client=erin", 2).await.is_over_limit());
}

#[tokio::test]
async fn overrides_replace_the_configured_limit() {
    let server = api().await;
    let api = server.domain("api");
    let mut request = api.request("client=frank");
    request.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: Unit::Day as i32,
    });
    let r = api.send(request.clone()).await.unwrap();
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (1, Unit::Day as i32));
    let r = api.send(request).await.unwrap();
    assert_eq!(r.overall_code(), Code::OverLimit);
}

#[tokio::test]
async fn bad_requests_are_invalid_argument_and_the_server_keeps_serving() {
    let server = api().await;
    let api = server.domain("api");
    let mut bad_override = api.request("client=x");
    bad_override.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 10,
        unit: Unit::Unknown as i32,
    });
    let cases = [
        server.domain("").request("client=x"),
        api.request(""),
        bad_override,
        request("api", vec![descriptor(&[])]),
    ];
    for bad in cases {
        let status = api.send(bad).await.unwrap_err();
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{}",
            status.message()
        );
        assert!(!status.message().is_empty());
    }
    assert!(api.hit("client=x").await.is_ok());
}

#[tokio::test]
async fn unknown_domain_is_ok() {
    let server = api().await;
    assert!(server.domain("nope").hit("client=x").await.is_ok());
}

#[tokio::test]
async fn json_endpoint_answers_200_429_and_400() {
    let server = api().await;
    let body = r#"{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"1.1.1.1"},{"key":"path","value":"/login"}]}]}"#;
    for _ in 0..2 {
        let (status, text) = http(server.http_addr, "POST", "/json", body).await.unwrap();
        assert_eq!(status, 200, "{text}");
        assert!(text.contains(r#""overallCode":"OK""#), "{text}");
    }
    let (status, text) = http(server.http_addr, "POST", "/json", body).await.unwrap();
    assert_eq!(status, 429);
    assert!(text.contains("retry-after"), "{text}");
    let (status, text) = http(server.http_addr, "POST", "/json", "{").await.unwrap();
    assert_eq!(status, 400);
    assert!(text.contains("invalid RateLimitRequest JSON"), "{text}");
}

#[tokio::test]
async fn grpc_health_is_serving() {
    use crate::common::health::{Health, Status};
    let server = api().await;
    let health = Health::connect(server.grpc_addr).await;
    // "ratelimit": the name envoyproxy/ratelimit registers, which probes written for it ask.
    for service in [
        "",
        "envoy.service.ratelimit.v3.RateLimitService",
        "ratelimit",
    ] {
        assert_eq!(
            health.status(service).await,
            Status::Serving,
            "service '{service}'"
        );
    }
}

#[tokio::test]
async fn rlconfig_and_healthcheck_over_http() {
    let server = api().await;
    let (status, body) = http_get(server.http_addr, "/rlconfig").await.unwrap();
    assert_eq!(status, 200);
    let rules: Vec<_> = body.lines().filter(|l| !l.starts_with('#')).collect();
    let mut sorted = rules.clone();
    sorted.sort();
    assert_eq!(rules, sorted);
    assert!(rules.contains(&"api.client_premium: unit=MINUTE requests_per_unit=10, shadow_mode: false, quota_mode: false, algorithm: fixed_window, name: premium"), "{body}");
    assert_eq!(
        http_get(server.http_addr, "/healthcheck").await.unwrap(),
        (200, "OK".into())
    );
}

#[tokio::test]
async fn stopping_drains_and_reports_not_serving() {
    let server = api().await;
    let http_addr = server.http_addr;
    server.stop().await.unwrap();
    assert!(
        http_get(http_addr, "/healthcheck").await.is_err(),
        "listener closed after drain"
    );
}
