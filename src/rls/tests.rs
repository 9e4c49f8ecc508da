//! The gRPC service called directly through its trait, as tonic-health's tests do.

use super::ResponseOptions;
use super::*;
use crate::clock::SystemClock;
use crate::limiter::LimiterOptions;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::UInt64Value;

/// A limiter over `yaml` on a memory store.
fn limiter(yaml: &str) -> Limiter {
    Limiter::for_tests(yaml, LimiterOptions::default(), Arc::new(SystemClock))
}

fn service() -> RlsService {
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2, name: two}\n";
    RlsService::new(Arc::new(limiter(yaml)))
}

fn descriptor(value: &str) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: "k".into(),
            value: value.into(),
        }],
        ..Default::default()
    }
}

async fn call(
    service: &RlsService,
    request: RateLimitRequest,
) -> Result<RateLimitResponse, Status> {
    service
        .should_rate_limit(Request::new(request))
        .await
        .map(Response::into_inner)
}

fn request(descriptors: Vec<RateLimitDescriptor>, hits_addend: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: "d".into(),
        descriptors,
        hits_addend,
    }
}

#[tokio::test]
async fn zero_hits_addend_is_converted_to_one() {
    let service = service();
    let response = call(&service, request(vec![descriptor("a")], 0))
        .await
        .unwrap();
    assert_eq!(response.statuses[0].limit_remaining, 1);
}

#[tokio::test]
async fn descriptor_hits_addend_wins_over_the_request_one() {
    let service = service();
    let mut d = descriptor("a");
    d.hits_addend = Some(UInt64Value { value: 0 });
    let response = call(&service, request(vec![d], 2)).await.unwrap();
    assert_eq!(
        response.statuses[0].limit_remaining, 2,
        "0 checks without charging"
    );
    let response = call(&service, request(vec![descriptor("a")], 2))
        .await
        .unwrap();
    assert_eq!(response.statuses[0].limit_remaining, 0);
}

#[tokio::test]
async fn over_limit_carries_retry_after_in_whole_seconds() {
    let service = service();
    call(&service, request(vec![descriptor("a")], 2))
        .await
        .unwrap();
    let response = call(&service, request(vec![descriptor("a")], 1))
        .await
        .unwrap();
    assert_eq!(response.overall_code, Code::OverLimit as i32);
    let status = &response.statuses[0];
    let limit = status.current_limit.as_ref().unwrap();
    assert_eq!((limit.name.as_str(), limit.requests_per_unit), ("two", 2));
    let reset = status.duration_until_reset.unwrap();
    let header = &response.response_headers_to_add[0];
    assert_eq!(header.key, "retry-after");
    // Rounded up: a reset in 12.3 s is announced as 13.
    let expected = reset.seconds + i64::from(reset.nanos > 0);
    assert_eq!(header.value, expected.max(1).to_string());
}

#[tokio::test]
async fn ok_answers_carry_no_retry_after() {
    let service = service();
    let response = call(&service, request(vec![descriptor("a")], 1))
        .await
        .unwrap();
    assert_eq!(response.overall_code, Code::Ok as i32);
    assert!(response.response_headers_to_add.is_empty());
}

#[tokio::test]
async fn an_override_with_unit_unknown_is_invalid_argument_not_a_crash() {
    let service = service();
    for unit in [0, 42] {
        let mut d = descriptor("a");
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 5,
            unit,
        });
        let status = call(&service, request(vec![d], 1)).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status.message().contains("invalid unit"),
            "{}",
            status.message()
        );
    }
    // Still serving.
    assert!(
        call(&service, request(vec![descriptor("a")], 1))
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn empty_domain_and_empty_descriptors_are_invalid_arguments() {
    let service = service();
    let mut no_domain = request(vec![descriptor("a")], 1);
    no_domain.domain.clear();
    let status = call(&service, no_domain).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(status.message(), "rate limit domain must not be empty");
    let status = call(&service, request(vec![], 1)).await.unwrap_err();
    assert_eq!(
        status.message(),
        "rate limit descriptor list must not be empty"
    );
}

#[tokio::test]
async fn negative_hits_release_what_was_taken() {
    let service = service();
    call(&service, request(vec![descriptor("a")], 2))
        .await
        .unwrap();
    let mut release = descriptor("a");
    release.is_negative_hits = true;
    release.hits_addend = Some(UInt64Value { value: 1 });
    let response = call(&service, request(vec![release], 1)).await.unwrap();
    assert_eq!(response.overall_code, Code::Ok as i32);
    assert_eq!(response.statuses[0].limit_remaining, 1);
}

#[tokio::test]
async fn huge_hits_do_not_overflow() {
    let service = service();
    let mut d = descriptor("a");
    d.hits_addend = Some(UInt64Value { value: u64::MAX });
    let response = call(&service, request(vec![d], 1)).await.unwrap();
    assert_eq!(response.overall_code, Code::OverLimit as i32);
    let mut d = descriptor("a");
    d.hits_addend = Some(UInt64Value { value: u64::MAX });
    d.is_negative_hits = true;
    let response = call(&service, request(vec![d], 1)).await.unwrap();
    assert_eq!(response.overall_code, Code::Ok as i32);
}

#[tokio::test]
async fn a_panicking_future_becomes_an_error() {
    use futures_util::FutureExt;
    let fut = std::panic::AssertUnwindSafe(async { panic!("boom") });
    let result: Result<(), _> = fut.catch_unwind().await;
    assert_eq!(panic_message(result.unwrap_err().as_ref()), "boom");
}

#[tokio::test]
async fn dynamic_metadata_describes_the_request_and_merges_rule_metadata() {
    use envoy_types::pb::google::protobuf::value::Kind;
    let yaml = r#"
domain: d
descriptors:
  - key: a
    metadata: {owner: team-a, service: {name: s1}}
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: b
    metadata: {owner: team-b, service: {tier: gold}, extra: 1}
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: closed
    metadata: {never: shown}
    rate_limit: {unit: hour, requests_per_unit: 0}
"#;
    let limiter = Arc::new(limiter(yaml));
    let service = RlsService::with_options(
        limiter,
        ResponseOptions {
            dynamic_metadata: true,
            ..ResponseOptions::default()
        },
    );
    let mut b = RateLimitDescriptor {
        entries: vec![Entry {
            key: "b".into(),
            value: "2".into(),
        }],
        ..Default::default()
    };
    b.hits_addend = Some(UInt64Value { value: 2 });
    let d = |key: &str| RateLimitDescriptor {
        entries: vec![Entry {
            key: key.into(),
            value: "1".into(),
        }],
        ..Default::default()
    };
    let response = call(&service, request(vec![d("a"), b, d("closed")], 3))
        .await
        .unwrap();
    let metadata = response.dynamic_metadata.unwrap();
    let json = |v: &envoy_types::pb::google::protobuf::Value| format!("{:?}", v.kind);
    assert!(json(&metadata.fields["domain"]).contains("\"d\""));
    assert!(matches!(metadata.fields["hitsAddend"].kind, Some(Kind::NumberValue(n)) if n == 3.0));
    let Some(Kind::ListValue(descriptors)) = &metadata.fields["descriptors"].kind else {
        panic!()
    };
    assert_eq!(descriptors.values.len(), 3);
    assert!(
        json(&descriptors.values[1]).contains("b=2")
            && json(&descriptors.values[1]).contains("hitsAddend")
    );
    let Some(Kind::StructValue(merged)) = &metadata.fields["metadata"].kind else {
        panic!()
    };
    // The first descriptor wins scalar conflicts; maps merge; the over-limit one is left out.
    assert!(json(&merged.fields["owner"]).contains("team-a"));
    let Some(Kind::StructValue(service_meta)) = &merged.fields["service"].kind else {
        panic!()
    };
    assert_eq!(service_meta.fields.len(), 2);
    assert!(merged.fields.contains_key("extra"));
    assert!(!merged.fields.contains_key("never"));
}

#[test]
fn the_callers_grpc_timeout_is_read_and_nonsense_ignored() {
    use std::time::Duration;
    let timeout = |value: &str| {
        let mut metadata = tonic::metadata::MetadataMap::new();
        metadata.insert("grpc-timeout", value.parse().unwrap());
        super::grpc_timeout(&metadata)
    };
    assert_eq!(timeout("20m"), Some(Duration::from_millis(20)));
    assert_eq!(timeout("1S"), Some(Duration::from_secs(1)));
    assert_eq!(timeout("250000u"), Some(Duration::from_micros(250_000)));
    assert_eq!(timeout("2H"), Some(Duration::from_secs(7200)));
    assert_eq!(timeout("123456789m"), None, "more than 8 digits");
    assert_eq!(timeout("20x"), None);
    assert_eq!(timeout("m"), None);
    assert_eq!(timeout("-5m"), None);
    assert_eq!(
        super::grpc_timeout(&tonic::metadata::MetadataMap::new()),
        None
    );
}

#[test]
fn durations_until_reset_are_whole_seconds_rounded_up() {
    use super::convert::whole_seconds as whole;
    assert_eq!(
        (
            whole(12_300_000, false).seconds,
            whole(12_300_000, false).nanos
        ),
        (13, 0)
    );
    assert_eq!(whole(60_000_000, false).seconds, 60);
    assert_eq!(whole(0, false).seconds, 0);
    // A refusal in the window's last instant still says 1, as retry-after does.
    assert_eq!(whole(200, true).seconds, 1);
    assert_eq!(whole(0, true).seconds, 1);
}
