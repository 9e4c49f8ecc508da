// Why one long file: a port of one reference file, case for case, so that a reader can compare
// them side by side.
//! Port of envoyproxy/ratelimit's `test/service/ratelimit_test.go`, black-box. The reference
//! drives its service with a mocked config and a mocked cache that returns canned statuses;
//! here a real config says what each descriptor's limit is, and real requests bring each
//! counter to the state the canned status stands for (full, when the reference's cache says
//! OVER_LIMIT). Limits are per hour where the reference's minute is not what a case tests,
//! so no window can end between preparing a counter and the request that finds it full.
//!
//! Every case that counts runs on the memory store and on a real Redis (`mod memory`, `mod
//! redis` at the end).

use crate::common::reference::{
    Store, answer, counter, desc_hits, grpc_health, grpc_health_follows_the_file, named, no_limit,
    on_each_store, req, status, unlimited, wait_for_counter, write_config,
};
use crate::common::{TestServer, config_dir, http_get, request, should_rate_limit};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::{Struct, value::Kind};
use sluice::rls::ReferenceHeaders;
use sluice::settings::Settings;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

/// The rules the reference's mocked config hands out, one domain per group of cases.
const DOMAINS: &[(&str, &str)] = &[
    (
        "test-domain.yaml",
        "domain: test-domain\ndescriptors:\n  - key: other\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    ),
    (
        "different-domain.yaml",
        "domain: different-domain
descriptors:
  - key: foo
    rate_limit: {unit: hour, requests_per_unit: 10, name: key_name}
",
    ),
    (
        "some-domain.yaml",
        "domain: some-domain
descriptors:
  - key: foo
    value: bar
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: baz
    value: qux
    rate_limit: {unlimited: true}
",
    ),
    (
        "rule-shadow.yaml",
        "domain: rule-shadow
descriptors:
  - key: foo
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: hello
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 10}
",
    ),
    (
        "mixed-shadow.yaml",
        "domain: mixed-shadow
descriptors:
  - key: foo
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: hello
    rate_limit: {unit: hour, requests_per_unit: 10}
",
    ),
    (
        "quota-domain.yaml",
        "domain: quota-domain
descriptors:
  - key: foo
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: hello
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: regular
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: quota
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: quota1
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: quota2
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 3}
",
    ),
    (
        "metadata-passed.yaml",
        "domain: metadata-passed
descriptors:
  - key: regular
    metadata: {name: service_1}
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: quota
    quota_mode: true
    metadata: {name: service_2}
    rate_limit: {unit: hour, requests_per_unit: 5}
",
    ),
    (
        "metadata-all-passed.yaml",
        "domain: metadata-all-passed
descriptors:
  - key: regular
    quota_mode: true
    metadata: {name: service_1}
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: quota
    quota_mode: true
    metadata: {some_other_name: service_2}
    rate_limit: {unit: hour, requests_per_unit: 5}
",
    ),
    (
        "metadata-overlap.yaml",
        "domain: metadata-overlap
descriptors:
  - key: regular
    quota_mode: true
    metadata: {name: service_1}
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: quota
    quota_mode: true
    metadata: {name: service_2}
    rate_limit: {unit: hour, requests_per_unit: 5}
",
    ),
];

type Client = RateLimitServiceClient<Channel>;

/// Brings the counter of `domain`'s `key=value` to its limit `n` with one admitted request.
async fn fill(client: &mut Client, domain: &str, key: &str, value: &str, n: u64) {
    let r = should_rate_limit(client, request(domain, vec![desc_hits(&[(key, value)], n)])).await;
    assert_eq!(r.statuses[0].limit_remaining, 0, "{domain} {key}={value}");
}

async fn ask(
    client: &mut Client,
    domain: &str,
    descriptors: &[&[(&str, &str)]],
) -> RateLimitResponse {
    should_rate_limit(client, req(domain, descriptors)).await
}

fn hour(n: u32) -> Option<(u32, Unit)> {
    Some((n, Unit::Hour))
}

const FOO: &[(&str, &str)] = &[("foo", "bar")];
const HELLO: &[(&str, &str)] = &[("hello", "world")];

// === TestService ===

/// ratelimit_test.go:125 TestService: no rule answers OK without a limit; one descriptor
/// over its limit makes the request OVER_LIMIT, statuses in request order; a config that
/// fails to load leaves the one in force answering; the loads are counted.
async fn service(store: &Store) {
    let settings = store.settings(DOMAINS);
    let dir = settings.config_dir.clone();
    let server = TestServer::start_with(settings).await;
    let mut client = server.client().await;
    let r = ask(&mut client, "test-domain", &[HELLO]).await;
    assert_eq!(answer(&r), (Code::Ok, vec![no_limit()]));

    // A reload of the same rules (the counters carry on).
    fill(&mut client, "different-domain", "foo", "bar", 10).await;
    write_config(&dir, "test-domain.yaml", DOMAINS[0].1);
    wait_for_counter(&server, "ratelimit_service_config_load_success", 2).await;
    let over = named(Code::OverLimit, (10, Unit::Hour, "key_name"), 0);
    let r = ask(&mut client, "different-domain", &[FOO, HELLO]).await;
    assert_eq!(
        answer(&r),
        (Code::OverLimit, vec![over.clone(), no_limit()])
    );

    // A config that does not load: the old one stays; order follows the request.
    write_config(
        &dir,
        "broken.yaml",
        "domain: broken\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    );
    wait_for_counter(&server, "ratelimit_service_config_load_error", 1).await;
    let r = ask(&mut client, "different-domain", &[HELLO, FOO]).await;
    assert_eq!(answer(&r), (Code::OverLimit, vec![no_limit(), over]));

    assert_eq!(
        counter(&server, "ratelimit_service_config_load_success").await,
        2
    );
    assert_eq!(
        counter(&server, "ratelimit_service_config_load_error").await,
        1
    );
    assert_eq!(
        counter(&server, "ratelimit_service_global_shadow_mode").await,
        0
    );
}

// === shadow mode ===

/// ratelimit_test.go:220 TestServiceGlobalShadowMode: with `SHADOW_MODE`, a request its
/// rules refuse is answered OK, the statuses still saying which descriptor is over, and
/// counted in `global_shadow_mode`.
async fn global_shadow_mode(store: &Store) {
    let mut settings = store.settings(DOMAINS);
    settings.limiter.shadow_mode = true;
    let server = TestServer::start_with(settings).await;
    let mut client = server.client().await;
    fill(&mut client, "different-domain", "foo", "bar", 10).await;
    let r = ask(&mut client, "different-domain", &[FOO, HELLO]).await;
    assert_eq!(
        answer(&r),
        (
            Code::Ok,
            vec![
                named(Code::OverLimit, (10, Unit::Hour, "key_name"), 0),
                no_limit()
            ]
        )
    );
    assert_eq!(
        counter(&server, "ratelimit_service_global_shadow_mode").await,
        1
    );
}

/// ratelimit_test.go:277 TestRuleShadowMode: rules in shadow mode past their limits report
/// OK, and the request is OK, without counting `global_shadow_mode`.
async fn rule_shadow_mode(store: &Store) {
    let server = store.server(DOMAINS).await;
    let mut client = server.client().await;
    fill(&mut client, "rule-shadow", "foo", "bar", 10).await;
    fill(&mut client, "rule-shadow", "hello", "world", 10).await;
    let r = ask(&mut client, "rule-shadow", &[FOO, HELLO]).await;
    assert_eq!(
        answer(&r),
        (
            Code::Ok,
            vec![status(Code::Ok, hour(10), 0), status(Code::Ok, hour(10), 0)]
        )
    );
    assert_eq!(
        counter(&server, "ratelimit_service_global_shadow_mode").await,
        0
    );
}

/// ratelimit_test.go:312 TestMixedRuleShadowMode: a shadow rule past its limit says OK, an
/// enforced one past its limit refuses the request.
async fn mixed_rule_shadow_mode(store: &Store) {
    let server = store.server(DOMAINS).await;
    let mut client = server.client().await;
    fill(&mut client, "mixed-shadow", "foo", "bar", 10).await;
    fill(&mut client, "mixed-shadow", "hello", "world", 10).await;
    let r = ask(&mut client, "mixed-shadow", &[FOO, HELLO]).await;
    assert_eq!(
        answer(&r),
        (
            Code::OverLimit,
            vec![
                status(Code::Ok, hour(10), 0),
                status(Code::OverLimit, hour(10), 0)
            ]
        )
    );
    assert_eq!(
        counter(&server, "ratelimit_service_global_shadow_mode").await,
        0
    );
}

// === response headers ===

/// ratelimit_test.go:351 TestServiceWithCustomRatelimitHeaders and :410
/// TestServiceWithDefaultRatelimitHeaders: with `LIMIT_RESPONSE_HEADERS_ENABLED`, the
/// refusing descriptor's limit, remaining (0) and seconds until its window ends (58 at the
/// reference's pinned clock; here the status's own `duration_until_reset`), under the
/// configured names. Difference: OVER_LIMIT answers also carry `retry-after`.
async fn limit_response_headers(store: &Store, names: Option<[&str; 3]>) {
    let mut settings = store.settings(DOMAINS);
    let [limit, remaining, reset] =
        names.unwrap_or(["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"]);
    settings.response.reference_headers = Some(ReferenceHeaders {
        limit: limit.into(),
        remaining: remaining.into(),
        reset: reset.into(),
    });
    let server = TestServer::start_with(settings).await;
    let mut client = server.client().await;
    fill(&mut client, "different-domain", "foo", "bar", 10).await;
    let r = ask(&mut client, "different-domain", &[FOO, HELLO]).await;
    assert_eq!(
        answer(&r),
        (
            Code::OverLimit,
            vec![
                named(Code::OverLimit, (10, Unit::Hour, "key_name"), 0),
                no_limit()
            ]
        )
    );
    let seconds = r.statuses[0].duration_until_reset.unwrap().seconds;
    assert!((1..=3600).contains(&seconds), "{seconds}");
    let headers: Vec<(&str, &str)> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    let seconds = seconds.to_string();
    assert_eq!(
        headers,
        [
            ("retry-after", seconds.as_str()),
            (limit, "10"),
            (remaining, "0"),
            (reset, seconds.as_str()),
        ]
    );
}

async fn custom_ratelimit_headers(store: &Store) {
    limit_response_headers(
        store,
        Some([
            "A-Ratelimit-Limit",
            "A-Ratelimit-Remaining",
            "A-Ratelimit-Reset",
        ]),
    )
    .await;
}

async fn default_ratelimit_headers(store: &Store) {
    limit_response_headers(store, None).await;
}

// === invalid requests and errors ===

/// ratelimit_test.go:463 TestEmptyDomain and :475 TestEmptyDescriptors: refused with the
/// reference's messages and counted as `service_error`. Difference: the refusal is gRPC
/// INVALID_ARGUMENT.
#[tokio::test]
async fn an_empty_domain_or_no_descriptors_is_a_service_error() {
    let server = TestServer::start(DOMAINS).await;
    let mut client = server.client().await;
    let series = r#"ratelimit_service_should_rate_limit_error{err_type="service_error"}"#;
    for (n, (bad, message)) in [
        (req("", &[HELLO]), "rate limit domain must not be empty"),
        (
            request("test-domain", vec![]),
            "rate limit descriptor list must not be empty",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let error = client.should_rate_limit(bad).await.unwrap_err();
        assert_eq!(error.code(), tonic::Code::InvalidArgument);
        assert_eq!(error.message(), message);
        assert_eq!(counter(&server, series).await, n as u64 + 1);
    }
}

/// ratelimit_test.go:487 TestCacheError: the store fails (Redis killed). Difference: the
/// failure policy answers (fail open by default) instead of an error; the failure is still
/// counted in `redis_error`.
#[tokio::test]
async fn a_failing_store_is_a_redis_error() {
    let mut store = Store::redis();
    let mut settings = store.settings(DOMAINS);
    settings.resilience.deadline = std::time::Duration::from_millis(200);
    let server = TestServer::start_with(settings).await;
    let mut client = server.client().await;
    let r = ask(&mut client, "different-domain", &[FOO]).await;
    assert_eq!(
        answer(&r),
        (
            Code::Ok,
            vec![named(Code::Ok, (10, Unit::Hour, "key_name"), 9)]
        )
    );
    store.redis_server_mut().unwrap().kill();
    let r = ask(&mut client, "different-domain", &[FOO]).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(
        counter(
            &server,
            r#"ratelimit_service_should_rate_limit_error{err_type="redis_error"}"#
        )
        .await,
        1
    );
}

/// ratelimit_test.go:506 TestInitialLoadError: when the first config fails to load, the
/// reference keeps serving, answering each request with the error `no rate limit
/// configuration loaded`. Difference (docs/reference/differences.md, "a config that fails to load at startup"):
/// Sluice does not start (`sluice serve` exits 64) and says which file and what is wrong.
#[tokio::test]
async fn a_first_config_that_fails_to_load_stops_startup_with_the_error() {
    let dir = config_dir(
        "initial-error",
        &[(
            "bad.yaml",
            "domain: test-domain\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
        )],
    );
    let Err(error) = sluice::app::prepare(Settings::for_tests(dir)) else {
        panic!("an invalid first config must stop startup");
    };
    let sluice::app::AppError::Config(errors) = error else {
        panic!("not a config error: {error}");
    };
    let message = errors[0].to_string();
    assert!(
        message.contains("bad.yaml") && message.contains("fortnight"),
        "{message}"
    );
}

// === unlimited ===

/// ratelimit_test.go:527 TestUnlimited: an `unlimited` descriptor is not counted and
/// reports the most remaining, next to a counted one and one without a rule.
async fn unlimited_descriptors(store: &Store) {
    let server = store.server(DOMAINS).await;
    let mut client = server.client().await;
    let r = ask(&mut client, "some-domain", &[FOO, HELLO, &[("baz", "qux")]]).await;
    assert_eq!(
        answer(&r),
        (
            Code::Ok,
            vec![
                status(Code::Ok, Some((10, Unit::Minute)), 9),
                no_limit(),
                unlimited()
            ]
        )
    );
}

// === health ===

/// ratelimit_test.go:594 TestServiceHealthStatus: without
/// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, healthy from the start (`ratelimit`).
async fn healthy_at_start(store: &Store) {
    let server = store.server(DOMAINS).await;
    assert_eq!(
        grpc_health(&server, "ratelimit").await,
        ServingStatus::Serving
    );
}

/// ratelimit_test.go:622 TestServiceHealthStatusAtLeastOneConfigLoaded: with
/// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, not serving until a config with a domain is in
/// force, serving once it is, not serving again once a reload leaves no domain.
#[tokio::test]
async fn health_follows_whether_a_domain_is_loaded() {
    let dir = config_dir("at-least-one", &[]);
    let mut settings = Settings::for_tests(&dir);
    settings.require_config = true;
    let server = TestServer::start_unready(settings).await;
    grpc_health_follows_the_file(&server, &dir, "different-domain.yaml", DOMAINS[1].1).await;
    assert_ne!(
        http_get(server.http_addr, "/healthcheck").await.unwrap().0,
        200
    );
}

// === quota mode ===

/// ratelimit_test.go:676 TestServiceGlobalQuotaMode: with `QUOTA_MODE` every descriptor is
/// a quota descriptor; all of them over the limit refuse the request.
async fn global_quota_mode(store: &Store) {
    let mut settings = store.settings(DOMAINS);
    settings.limiter.quota_mode = true;
    let server = TestServer::start_with(settings).await;
    let mut client = server.client().await;
    fill(&mut client, "quota-domain", "foo", "bar", 10).await;
    fill(&mut client, "quota-domain", "hello", "world", 5).await;
    let r = ask(&mut client, "quota-domain", &[FOO, HELLO]).await;
    assert_eq!(
        answer(&r),
        (
            Code::OverLimit,
            vec![
                status(Code::OverLimit, hour(10), 0),
                status(Code::OverLimit, hour(5), 0)
            ]
        )
    );
}

/// The `metadata` of an answer's dynamic metadata, as (field, string value) pairs.
fn passed_metadata(response: &RateLimitResponse) -> Vec<(String, String)> {
    let dynamic: &Struct = response
        .dynamic_metadata
        .as_ref()
        .expect("dynamic metadata");
    let Some(Kind::StructValue(metadata)) =
        dynamic.fields.get("metadata").and_then(|v| v.kind.as_ref())
    else {
        panic!("no metadata in {dynamic:?}");
    };
    let mut fields: Vec<(String, String)> = metadata
        .fields
        .iter()
        .map(|(k, v)| match &v.kind {
            Some(Kind::StringValue(s)) => (k.clone(), s.clone()),
            other => panic!("{k}: {other:?}"),
        })
        .collect();
    fields.sort();
    fields
}

async fn metadata_server(store: &Store) -> TestServer {
    let mut settings = store.settings(DOMAINS);
    settings.limiter.quota_mode = true;
    settings.response.dynamic_metadata = true;
    TestServer::start_with(settings).await
}

const REGULAR: &[(&str, &str)] = &[("regular", "limit")];
const QUOTA: &[(&str, &str)] = &[("quota", "limit")];

/// ratelimit_test.go:729 TestMetadataReturnedForPassedDescriptors: the dynamic metadata
/// carries the `metadata` of the descriptors that passed, not of the one over its quota.
async fn metadata_of_passed_descriptors(store: &Store) {
    let server = metadata_server(store).await;
    let mut client = server.client().await;
    should_rate_limit(
        &mut client,
        request("metadata-passed", vec![desc_hits(REGULAR, 4)]),
    )
    .await;
    fill(&mut client, "metadata-passed", "quota", "limit", 5).await;
    let r = ask(&mut client, "metadata-passed", &[REGULAR, QUOTA]).await;
    assert_eq!(
        answer(&r),
        (
            Code::Ok,
            vec![
                status(Code::Ok, hour(10), 5),
                status(Code::OverLimit, hour(5), 0)
            ]
        )
    );
    assert_eq!(
        passed_metadata(&r),
        [("name".to_owned(), "service_1".to_owned())]
    );
}

/// ratelimit_test.go:790 TestMetadataReturnedForAllPassedDescriptors: every passed
/// descriptor's `metadata`, merged.
async fn metadata_of_all_passed_descriptors(store: &Store) {
    let server = metadata_server(store).await;
    let mut client = server.client().await;
    let r = ask(&mut client, "metadata-all-passed", &[REGULAR, QUOTA]).await;
    assert_eq!(
        answer(&r),
        (
            Code::Ok,
            vec![status(Code::Ok, hour(10), 9), status(Code::Ok, hour(5), 4)]
        )
    );
    assert_eq!(
        passed_metadata(&r),
        [
            ("name".to_owned(), "service_1".to_owned()),
            ("some_other_name".to_owned(), "service_2".to_owned())
        ]
    );
}

/// ratelimit_test.go:854 TestOverlappingMetadataReturnsTheFirstValue: where two passed
/// descriptors set one field, the first descriptor's value wins.
async fn overlapping_metadata_keeps_the_first_value(store: &Store) {
    let server = metadata_server(store).await;
    let mut client = server.client().await;
    let r = ask(&mut client, "metadata-overlap", &[REGULAR, QUOTA]).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(
        passed_metadata(&r),
        [("name".to_owned(), "service_1".to_owned())]
    );
}

/// ratelimit_test.go:915 TestServicePerDescriptorQuotaMode: an enforced descriptor over its
/// limit refuses the request whatever the quota descriptor says. Difference: a refused
/// request charges nothing, so the quota descriptor still has its 3 (the reference: 2).
async fn per_descriptor_quota_mode(store: &Store) {
    let server = store.server(DOMAINS).await;
    let mut client = server.client().await;
    fill(&mut client, "quota-domain", "regular", "limit", 5).await;
    let r = ask(&mut client, "quota-domain", &[REGULAR, QUOTA]).await;
    assert_eq!(
        answer(&r),
        (
            Code::OverLimit,
            vec![
                status(Code::OverLimit, hour(5), 0),
                status(Code::Ok, hour(3), 3)
            ]
        )
    );
}

/// ratelimit_test.go:966 TestServiceMixedPerDescriptorModes: the only quota descriptor over
/// its quota refuses the request, though the enforced one passes. Difference: a refused
/// request charges nothing, so the enforced descriptor still has its 5 (the reference: 4).
async fn mixed_per_descriptor_modes(store: &Store) {
    let server = store.server(DOMAINS).await;
    let mut client = server.client().await;
    fill(&mut client, "quota-domain", "quota", "limit", 3).await;
    let r = ask(&mut client, "quota-domain", &[REGULAR, QUOTA]).await;
    assert_eq!(
        answer(&r),
        (
            Code::OverLimit,
            vec![
                status(Code::Ok, hour(5), 5),
                status(Code::OverLimit, hour(3), 0)
            ]
        )
    );
}

/// ratelimit_test.go:1018 TestServiceMixedPerDescriptorModesUnderLimit: both within their
/// limits: OK.
async fn mixed_per_descriptor_modes_under_limit(store: &Store) {
    let server = store.server(DOMAINS).await;
    let mut client = server.client().await;
    let r = ask(&mut client, "quota-domain", &[REGULAR, QUOTA]).await;
    assert_eq!(
        answer(&r),
        (
            Code::Ok,
            vec![status(Code::Ok, hour(5), 4), status(Code::Ok, hour(3), 2)]
        )
    );
}

const QUOTA1: &[(&str, &str)] = &[("quota1", "limit")];
const QUOTA2: &[(&str, &str)] = &[("quota2", "limit")];

/// ratelimit_test.go:1070 TestServiceQuotaModeOnlyAllOverTheLimit: every quota descriptor
/// over its quota refuses the request.
async fn quota_mode_only_all_over(store: &Store) {
    let server = store.server(DOMAINS).await;
    let mut client = server.client().await;
    fill(&mut client, "quota-domain", "quota1", "limit", 5).await;
    fill(&mut client, "quota-domain", "quota2", "limit", 3).await;
    let r = ask(&mut client, "quota-domain", &[QUOTA1, QUOTA2]).await;
    assert_eq!(
        answer(&r),
        (
            Code::OverLimit,
            vec![
                status(Code::OverLimit, hour(5), 0),
                status(Code::OverLimit, hour(3), 0)
            ]
        )
    );
}

/// ratelimit_test.go:1118 TestServiceQuotaModeOnlySomeOverTheLimit: one quota descriptor
/// over its quota, another within: OK.
async fn quota_mode_only_some_over(store: &Store) {
    let server = store.server(DOMAINS).await;
    let mut client = server.client().await;
    fill(&mut client, "quota-domain", "quota1", "limit", 5).await;
    let r = ask(&mut client, "quota-domain", &[QUOTA1, QUOTA2]).await;
    assert_eq!(
        answer(&r),
        (
            Code::Ok,
            vec![
                status(Code::OverLimit, hour(5), 0),
                status(Code::Ok, hour(3), 2)
            ]
        )
    );
}

/// ratelimit_test.go:1166 TestServiceQuotaModeWithShadowMode and :1231
/// TestServiceMixedModeWithShadowMode: with `SHADOW_MODE`, a request its quota (or its
/// enforced and quota) descriptors refuse is answered OK, statuses unchanged, and counted in
/// `global_shadow_mode`.
async fn quota_and_mixed_modes_under_global_shadow_mode(store: &Store) {
    let mut settings = store.settings(DOMAINS);
    settings.limiter.shadow_mode = true;
    let server = TestServer::start_with(settings).await;
    let mut client = server.client().await;
    fill(&mut client, "quota-domain", "quota1", "limit", 5).await;
    fill(&mut client, "quota-domain", "quota2", "limit", 3).await;
    fill(&mut client, "quota-domain", "regular", "limit", 5).await;
    fill(&mut client, "quota-domain", "quota", "limit", 3).await;
    for (n, (descriptors, limits)) in [([QUOTA1, QUOTA2], [5, 3]), ([REGULAR, QUOTA], [5, 3])]
        .into_iter()
        .enumerate()
    {
        let r = ask(&mut client, "quota-domain", &descriptors).await;
        assert_eq!(
            answer(&r),
            (
                Code::Ok,
                vec![
                    status(Code::OverLimit, hour(limits[0]), 0),
                    status(Code::OverLimit, hour(limits[1]), 0)
                ]
            )
        );
        assert_eq!(
            counter(&server, "ratelimit_service_global_shadow_mode").await,
            n as u64 + 1
        );
    }
}

// === every counting case on both stores ===

on_each_store!([memory, redis] [service,
    global_shadow_mode,
    rule_shadow_mode,
    mixed_rule_shadow_mode,
    custom_ratelimit_headers,
    default_ratelimit_headers,
    unlimited_descriptors,
    healthy_at_start,
    global_quota_mode,
    metadata_of_passed_descriptors,
    metadata_of_all_passed_descriptors,
    overlapping_metadata_keeps_the_first_value,
    per_descriptor_quota_mode,
    mixed_per_descriptor_modes,
    mixed_per_descriptor_modes_under_limit,
    quota_mode_only_all_over,
    quota_mode_only_some_over,
    quota_and_mixed_modes_under_global_shadow_mode]);
