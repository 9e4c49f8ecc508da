// Why one long file: a port of one reference file, case for case, so that a reader can compare
// them side by side.
//! Port of envoyproxy/ratelimit's `test/config/config_test.go`, black-box: what the reference
//! asserts about `GetLimit` (which rule a descriptor matches, its limit and its stats key) is
//! observed here through a `ShouldRateLimit` answer (`current_limit`, `limit_remaining`,
//! code) and through the `rule` label of the per-rule series on `/metrics`; what it asserts
//! about config errors is observed through `sluice::config::load_sources`.
//!
//! The reference's fixtures (`test/config/*.yaml`) are restated below as the configs they
//! describe. Matching involves no store, so these cases run on the memory store only.

use std::collections::BTreeMap;

use crate::common::reference::{
    Seen, answer, desc_hits, metrics, named, no_limit, req, rule_stats, status, unlimited,
};
use crate::common::{TestServer, config_dir, descriptor, request, should_rate_limit};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::google::protobuf::{Struct, value::Kind};
use sluice::config::{self, ConfigError, LoadOptions};
use sluice::settings::Settings;

// === the reference's fixtures, as configs ===

/// `basic_config.yaml`.
const BASIC: &str = "
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: key2
    value: value3
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: key4
    rate_limit: {name: key4_rate_limit, unit: day, requests_per_unit: 1}
  - key: key5
    value: value5
    rate_limit: {unit: day, requests_per_unit: 15}
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit: {unit: day, requests_per_unit: 25}
  - key: key6
    rate_limit: {unlimited: true}
  - key: key7
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 70}
";

/// `merge_domain_key1.yaml`.
const MERGE_1: &str = "
domain: test-domain
descriptors:
  - key: key1
    value: value1
    rate_limit: {unit: minute, requests_per_unit: 10}
";

/// `merge_domain_key2.yaml`.
const MERGE_2: &str = "
domain: test-domain
descriptors:
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 20}
";

/// `shadowmode_config.yaml`.
const SHADOW: &str = "
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
        shadow_mode: true
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
    shadow_mode: true
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
";

/// `wildcard.yaml`.
const WILDCARD: &str = "
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: noWild
    value: foo
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: noVal
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: midWild
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: multiWild
    value: foo*bar*baz
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit: {unit: minute, requests_per_unit: 20}
";

/// `share_threshold.yaml`, with every `minute` turned into `hour`: these cases check which
/// counter and which stats key values share, several requests in a row, and an hour's window
/// cannot end between them the way a minute's could. The unit is not what they test.
const SHARE_THRESHOLD: &str = "
domain: test-domain
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: nested
    value: parent
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: hour, requests_per_unit: 200}
  - key: files
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: hour, requests_per_unit: 300}
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: hour, requests_per_unit: 60}
  - key: service
    value: svc/*
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit: {unit: hour, requests_per_unit: 80}
  - key: path
    value: path/*
    share_threshold: true
    descriptors:
      - key: file
        value: file/*
        share_threshold: false
        descriptors:
          - key: type
            rate_limit: {unit: hour, requests_per_unit: 120}
  - key: user
    value: user/*
    share_threshold: true
    descriptors:
      - key: resource
        value: res/*
        share_threshold: true
        descriptors:
          - key: action
            rate_limit: {unit: hour, requests_per_unit: 150}
  - key: file
    value: test1
    rate_limit: {unit: hour, requests_per_unit: 50}
  - key: file
    value: test*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: midpath
    value: /api*v1
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: multiroute
    value: svc*ep*rpc
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 50}
  - key: midroute
    value: /api*v2
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: hour, requests_per_unit: 80}
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - key: resource
        value: res*v2
        share_threshold: true
        rate_limit: {unit: hour, requests_per_unit: 60}
";

/// `metadata.yaml`.
const METADATA: &str = "
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
        metadata:
          name: service_1
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
    metadata:
      service_with_quota:
        name: service_2
";

// === helpers ===

/// A descriptor's entries, `(key, value)`.
type Entries<'a> = &'a [(&'a str, &'a str)];

async fn server_of(files: &[(&str, &str)]) -> TestServer {
    TestServer::start(files).await
}

/// `total_hits` of every per-rule series on the page, by `rule` label.
fn hits_by_rule(page: &str) -> BTreeMap<String, u64> {
    page.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("ratelimit_service_rate_limit_total_hits{")?;
            let (labels, value) = rest.rsplit_once("} ")?;
            let rule = labels
                .split(',')
                .find_map(|l| l.strip_prefix("rule=\""))?
                .strip_suffix('"')?;
            Some((rule.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// What one request did: its answer, and the stats keys (`rule` labels) whose `total_hits`
/// it moved, with by how much.
struct Hit {
    overall: Code,
    statuses: Vec<Seen>,
    counted: Vec<(String, u64)>,
    response: envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse,
}

async fn hit(server: &TestServer, request: RateLimitRequest) -> Hit {
    let before = hits_by_rule(&metrics(server).await);
    let mut client = server.client().await;
    let response = should_rate_limit(&mut client, request).await;
    let after = hits_by_rule(&metrics(server).await);
    let counted = after
        .into_iter()
        .filter_map(|(rule, n)| {
            let grew = n - before.get(&rule).copied().unwrap_or(0);
            (grew > 0).then_some((rule, grew))
        })
        .collect();
    let (overall, statuses) = answer(&response);
    Hit {
        overall,
        statuses,
        counted,
        response,
    }
}

/// Sends one descriptor to `test-domain` (the domain of the reference's fixtures) and
/// asserts its status and the one stats key its hit counted under (`None`: none, as for no
/// limit and `unlimited`).
async fn expect(server: &TestServer, entries: Entries<'_>, want: Seen, key: Option<&str>) {
    let h = hit(server, req("test-domain", &[entries])).await;
    assert_eq!(h.statuses, [want], "{entries:?}");
    let want_counted: Vec<(String, u64)> = key.map(|k| (k.to_owned(), 1)).into_iter().collect();
    assert_eq!(h.counted, want_counted, "stats key of {entries:?}");
}

/// Sends `entries` to `domain` once and returns the stats keys its hit counted under.
async fn counted_under(server: &TestServer, domain: &str, entries: Entries<'_>) -> Vec<String> {
    let h = hit(server, req(domain, &[entries])).await;
    assert_eq!(h.overall, Code::Ok, "{entries:?}");
    h.counted.into_iter().map(|(rule, _)| rule).collect()
}

// === TestBasicConfig ===

/// config_test.go:30 TestBasicConfig: which rule of `basic_config.yaml` each descriptor
/// matches, the limit it reports, and the stats key its hit is counted under. The reference
/// bumps the four counters by hand; here one real request per descriptor moves the ones a
/// hit within the limit moves (`total_hits`, `within_limit`).
#[tokio::test]
async fn basic_config_matches_each_descriptor_to_its_rule() {
    let server = server_of(&[("basic_config.yaml", BASIC)]).await;
    let page = metrics(&server).await;
    assert!(
        !page.contains(r#"ratelimit_service_domain_not_found{domain="foo_domain"}"#),
        "{page}"
    );
    // An unknown domain: no limit, and one domain_not_found for it (none for the known one).
    let h = hit(&server, req("foo_domain", &[&[("key1", "value1")]])).await;
    assert_eq!((h.overall, h.statuses), (Code::Ok, vec![no_limit()]));
    let page = metrics(&server).await;
    assert_eq!(
        crate::common::metric::<u64>(
            &page,
            r#"ratelimit_service_domain_not_found{domain="foo_domain"}"#
        ),
        Some(1)
    );
    assert!(
        !page.contains(r#"ratelimit_service_domain_not_found{domain="test-domain"}"#),
        "{page}"
    );

    // No rule: an unknown value under a key with only values, a node without a limit, and
    // descriptors longer than any rule.
    expect(&server, &[("key1", "something")], no_limit(), None).await;
    expect(&server, &[("key1", "value1")], no_limit(), None).await;
    expect(
        &server,
        &[("key2", "value2"), ("subkey", "subvalue")],
        no_limit(),
        None,
    )
    .await;
    expect(
        &server,
        &[("key5", "value5"), ("subkey5", "subvalue")],
        no_limit(),
        None,
    )
    .await;

    // Key-only default at the second level, then the value-specific override there.
    expect(
        &server,
        &[("key1", "value1"), ("subkey1", "something")],
        status(Code::Ok, Some((5, Unit::Second)), 4),
        Some("test-domain.key1_value1.subkey1"),
    )
    .await;
    expect(
        &server,
        &[("key1", "value1"), ("subkey1", "subvalue1")],
        status(Code::Ok, Some((10, Unit::Second)), 9),
        Some("test-domain.key1_value1.subkey1_subvalue1"),
    )
    .await;
    // Key-only default at the first level, the value override, and a whitelisted value.
    expect(
        &server,
        &[("key2", "something")],
        status(Code::Ok, Some((20, Unit::Minute)), 19),
        Some("test-domain.key2"),
    )
    .await;
    expect(
        &server,
        &[("key2", "value2")],
        status(Code::Ok, Some((30, Unit::Minute)), 29),
        Some("test-domain.key2_value2"),
    )
    .await;
    expect(&server, &[("key2", "value3")], no_limit(), None).await;
    // No name in the config: an empty name; a configured one is reported.
    expect(
        &server,
        &[("key3", "foo")],
        status(Code::Ok, Some((1, Unit::Hour)), 0),
        Some("test-domain.key3"),
    )
    .await;
    expect(
        &server,
        &[("key4", "foo")],
        named(Code::Ok, (1, Unit::Day, "key4_rate_limit"), 0),
        Some("test-domain.key4"),
    )
    .await;
    // unlimited: OK with the most remaining, and no limit to count against.
    expect(&server, &[("key6", "foo")], unlimited(), None).await;
    // detailed_metric: one stats key per runtime value.
    for value in ["unspecified_value", "another_value"] {
        let key = format!("test-domain.key7_{value}");
        expect(
            &server,
            &[("key7", value)],
            status(Code::Ok, Some((70, Unit::Minute)), 69),
            Some(&key),
        )
        .await;
    }

    // A hit within the limit is total_hits and within_limit, nothing else.
    let counted = rule_stats(&server, "test-domain.key1_value1.subkey1").await;
    assert_eq!(counted, crate::common::reference::stats(1, 1, 0, 0));
}

/// config_test.go:37 TestBasicConfig: a descriptor without entries. The reference answers it
/// OK without a limit. Difference (docs/reference/differences.md, "an override with unit `UNKNOWN`, ... a descriptor
/// without entries"): Envoy's proto requires at least one entry, so Sluice answers
/// INVALID_ARGUMENT naming the descriptor, in a known domain and in an unknown one.
#[tokio::test]
async fn basic_config_a_descriptor_without_entries_is_an_invalid_argument() {
    let server = server_of(&[("basic_config.yaml", BASIC)]).await;
    let mut client = server.client().await;
    for domain in ["foo_domain", "test-domain"] {
        let status = client
            .should_rate_limit(request(domain, vec![descriptor(&[])]))
            .await
            .expect_err("a descriptor without entries is refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status.message().contains("descriptor 0 has no entries"),
            "{}",
            status.message()
        );
    }
}

// === TestDomainMerge ===

/// config_test.go:227 TestDomainMerge: with merging on, two files of one domain give the
/// rules of both.
#[tokio::test]
async fn merged_domain_files_give_the_rules_of_both() {
    let mut settings = Settings::for_tests(config_dir(
        "merge",
        &[
            ("merge_domain_key1.yaml", MERGE_1),
            ("merge_domain_key2.yaml", MERGE_2),
        ],
    ));
    settings.merge_domains = true;
    let server = TestServer::start_with(settings).await;
    let h = hit(&server, req("foo_domain", &[&[("key1", "value1")]])).await;
    assert_eq!(h.statuses, [no_limit()]);
    expect(
        &server,
        &[("key1", "value1")],
        status(Code::Ok, Some((10, Unit::Minute)), 9),
        Some("test-domain.key1_value1"),
    )
    .await;
    expect(
        &server,
        &[("key2", "value2")],
        status(Code::Ok, Some((20, Unit::Minute)), 19),
        Some("test-domain.key2_value2"),
    )
    .await;
}

// === TestConfigLimitOverride ===

fn with_override(
    entries: &[(&str, &str)],
    requests_per_unit: u32,
    unit: Unit,
) -> envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor {
    let mut d = descriptor(entries);
    d.limit = Some(RateLimitOverride {
        requests_per_unit,
        unit: unit as i32,
    });
    d
}

const OVERRIDDEN: &[(&str, &str)] = &[("key1", "value1"), ("subkey1", "something")];

/// config_test.go:256 TestConfigLimitOverride: an override in the request replaces the
/// configured limit (for a known domain only), reported without a name; a changed override
/// is a limit of its own.
#[tokio::test]
async fn a_request_override_replaces_the_configured_limit() {
    let server = server_of(&[("basic_config.yaml", BASIC)]).await;
    let mut client = server.client().await;
    let r = should_rate_limit(
        &mut client,
        request("foo_domain", vec![with_override(OVERRIDDEN, 10, Unit::Day)]),
    )
    .await;
    assert_eq!(answer(&r), (Code::Ok, vec![no_limit()]));
    for (n, unit) in [(10, Unit::Day), (42, Unit::Hour)] {
        let r = should_rate_limit(
            &mut client,
            request("test-domain", vec![with_override(OVERRIDDEN, n, unit)]),
        )
        .await;
        assert_eq!(
            answer(&r),
            (Code::Ok, vec![status(Code::Ok, Some((n, unit)), n - 1)])
        );
    }
    let other = [("key1", "value1"), ("subkey1", "something_else")];
    let r = should_rate_limit(
        &mut client,
        request("test-domain", vec![with_override(&other, 42, Unit::Hour)]),
    )
    .await;
    assert_eq!(
        answer(&r),
        (Code::Ok, vec![status(Code::Ok, Some((42, Unit::Hour)), 41)])
    );
}

/// config_test.go:275 TestConfigLimitOverride: the reference counts an override under the
/// domain and every entry's key and value (`test-domain.key1_value1.subkey1_something`).
/// Difference (docs/reference/differences.md, "the statistics of a request override"): Sluice names it by its keys
/// only, so request values never become series; every value and every changed override count
/// on under `test-domain.key1.subkey1`.
#[tokio::test]
async fn a_request_override_is_counted_under_its_keys() {
    let server = server_of(&[("basic_config.yaml", BASIC)]).await;
    let key = "test-domain.key1.subkey1";
    let h = hit(
        &server,
        request(
            "test-domain",
            vec![with_override(OVERRIDDEN, 10, Unit::Day)],
        ),
    )
    .await;
    assert_eq!(h.counted, [(key.to_owned(), 1)]);
    hit(
        &server,
        request(
            "test-domain",
            vec![with_override(OVERRIDDEN, 42, Unit::Hour)],
        ),
    )
    .await;
    let other = [("key1", "value1"), ("subkey1", "something_else")];
    hit(
        &server,
        request("test-domain", vec![with_override(&other, 42, Unit::Hour)]),
    )
    .await;
    assert_eq!(rule_stats(&server, key).await.total_hits, 3);
    let page = metrics(&server).await;
    assert!(
        !page.contains("something"),
        "no request value in a label:\n{page}"
    );
}

// === config errors ===

/// The errors of loading `sources` (file name, YAML).
fn errors_of(sources: &[(&str, &str)], merge_domains: bool) -> Vec<ConfigError> {
    let sources: Vec<(String, String)> = sources
        .iter()
        .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
        .collect();
    config::load_sources(&sources, LoadOptions { merge_domains })
        .expect_err("the reference rejects this config")
}

/// Asserts that the first error is in `file` and says the reference's `message` (which the
/// reference prints as `file: message`; Sluice puts the tree path and the parser's line and
/// column between, and may add a hint after). The reference stops at that first error;
/// Sluice goes on and reports every other one too (Difference: validation, "every error of
/// a load at once with line and column").
fn assert_first_error(errors: &[ConfigError], file: &str, message: &str) {
    let error = errors.first().expect("an error");
    assert_eq!(error.file, file, "{error}");
    assert!(
        error.message.starts_with(message),
        "{error}\nwant: {message}"
    );
    assert!(error.to_string().starts_with(file), "{error}");
}

/// Each of the reference's rejected single files, with the message it panics with.
/// (reference test, line, file name, YAML, message)
const REJECTED: &[(&str, u32, &str, &str, &str)] = &[
    (
        "TestEmptyDomain",
        347,
        "empty_domain.yaml",
        "descriptors:\n",
        "config file cannot have empty domain",
    ),
    (
        "TestEmptyKey",
        368,
        "empty_key.yaml",
        "domain: test-domain\ndescriptors:\n  - value: value1\n",
        "descriptor has empty key",
    ),
    (
        "TestDuplicateKey",
        379,
        "duplicate_key.yaml",
        "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n  - key: key1\n    value: value1\n",
        "duplicate descriptor composite key 'test-domain.key1_value1'",
    ),
    (
        "TestBadLimitUnit",
        403,
        "bad_limit_unit.yaml",
        "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: foo\n      requests_per_unit: 5\n",
        "invalid rate limit unit 'foo'",
    ),
    (
        "TestReplacesSelf",
        414,
        "replaces_self.yaml",
        "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    descriptors:\n      - key: subkey1\n        rate_limit:\n          name: self\n          replaces:\n            - name: self\n          unit: second\n          requests_per_unit: 5\n",
        "replaces should not contain name of same descriptor",
    ),
    (
        "TestReplacesEmpty",
        425,
        "replaces_empty.yaml",
        "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    descriptors:\n      - key: subkey1\n        rate_limit:\n          name: self\n          replaces:\n            - name:\n          unit: second\n          requests_per_unit: 5\n",
        "should not have an empty replaces entry",
    ),
    (
        "TestMisspelledKey",
        447,
        "misspelled_key.yaml",
        "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    ratelimit:\n      unit: day\n      requests_per_unit: 5\n",
        "config error, unknown key 'ratelimit'",
    ),
    (
        "TestMisspelledKey",
        457,
        "misspelled_key2.yaml",
        "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n",
        "config error, unknown key 'requestsperunit'",
    ),
    (
        "TestNonMapList",
        478,
        "non_map_list.yaml",
        "domain: test-domain\ndescriptors:\n  - a\n  - b\n  - c\n",
        "config error, yaml file contains list of type other than map: a",
    ),
    (
        "TestUnlimitedWithRateLimitUnit",
        489,
        "unlimited_with_unit.yaml",
        "domain: test-domain\ndescriptors:\n  - key: foo\n    rate_limit:\n      unlimited: true\n      unit: day\n      requests_per_unit: 25\n",
        "should not specify rate limit unit when unlimited",
    ),
];

/// config_test.go:347 TestEmptyDomain, :368 TestEmptyKey, :379 TestDuplicateKey,
/// :403 TestBadLimitUnit, :414 TestReplacesSelf, :425 TestReplacesEmpty,
/// :447 TestMisspelledKey (both files), :478 TestNonMapList and
/// :489 TestUnlimitedWithRateLimitUnit: each file is rejected with the reference's message.
#[test]
fn each_rejected_file_gets_the_reference_message() {
    for (test, line, file, yaml, message) in REJECTED {
        let errors = errors_of(&[(file, yaml)], false);
        assert!(
            errors.iter().all(|e| e.file == *file),
            "config_test.go:{line} {test}: {errors:#?}"
        );
        assert_first_error(&errors, file, message);
    }
}

/// config_test.go:357 TestDuplicateDomain: a second file declaring a loaded domain is
/// rejected, naming that file (here a file whose `descriptors` is empty).
#[test]
fn a_second_file_of_one_domain_is_rejected() {
    let errors = errors_of(
        &[
            ("basic_config.yaml", BASIC),
            (
                "duplicate_domain.yaml",
                "domain: test-domain\ndescriptors:\n",
            ),
        ],
        false,
    );
    assert_first_error(
        &errors,
        "duplicate_domain.yaml",
        "duplicate domain 'test-domain' in config file",
    );
}

/// config_test.go:390 TestDuplicateKeyDomainMerge: merging one file with itself makes each
/// of its rules a duplicate.
#[test]
fn merging_a_file_with_itself_duplicates_its_rules() {
    let errors = errors_of(
        &[
            ("merge_domain_key1.yaml", MERGE_1),
            ("merge_domain_key1.yaml", MERGE_1),
        ],
        true,
    );
    assert_first_error(
        &errors,
        "merge_domain_key1.yaml",
        "duplicate descriptor composite key 'test-domain.key1_value1'",
    );
}

/// config_test.go:436 TestBadYaml: text that is not YAML is a load error. The reference
/// goes on with its Go parser's words (`yaml: line 2: found unexpected end of stream`);
/// Sluice with its own parser's, so only the reference's prefix is compared.
#[test]
fn text_that_is_not_yaml_is_a_load_error() {
    let errors = errors_of(&[("bad_yaml.yaml", "'''\n")], false);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(errors[0].file, "bad_yaml.yaml");
    assert!(
        errors[0].message.starts_with("error loading config file: "),
        "{}",
        errors[0]
    );
}

/// config_test.go:467 TestNonStringKey: a top-level key that is not a string
/// (`0.25: test-domain`) is rejected with `config error, key is not of type string: 0.25`.
#[test]
fn a_key_that_is_not_a_string_is_rejected() {
    let yaml = "0.25: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: day\n      requests_per_unit: 5\n";
    let errors = errors_of(&[("non_string_key.yaml", yaml)], false);
    assert_first_error(
        &errors,
        "non_string_key.yaml",
        "config error, key is not of type string: 0.25",
    );
}

// === TestShadowModeConfig ===

/// config_test.go:500 TestShadowModeConfig: the rules with `shadow_mode` never refuse and
/// count their over-limit hits as `shadow_mode`; the others refuse. A single request over
/// each limit (its hits_addend past it) keeps the one-second and one-minute windows out of
/// the way.
#[tokio::test]
async fn shadow_mode_rules_report_ok_and_count_shadow_hits() {
    let server = server_of(&[("shadowmode_config.yaml", SHADOW)]).await;
    let mut client = server.client().await;
    // (entries, limit, shadow, stats key)
    let cases: [(Entries, (u32, Unit), bool, &str); 4] = [
        (
            &[("key1", "value1"), ("subkey1", "something")],
            (5, Unit::Second),
            false,
            "test-domain.key1_value1.subkey1",
        ),
        (
            &[("key1", "value1"), ("subkey1", "subvalue1")],
            (10, Unit::Second),
            true,
            "test-domain.key1_value1.subkey1_subvalue1",
        ),
        (
            &[("key2", "something")],
            (20, Unit::Minute),
            true,
            "test-domain.key2",
        ),
        (
            &[("key2", "value2")],
            (30, Unit::Minute),
            false,
            "test-domain.key2_value2",
        ),
    ];
    for (entries, (n, unit), shadow, key) in cases {
        let over = u64::from(n) + 1;
        let r = should_rate_limit(
            &mut client,
            request("test-domain", vec![desc_hits(entries, over)]),
        )
        .await;
        let code = if shadow { Code::Ok } else { Code::OverLimit };
        assert_eq!(
            answer(&r),
            (code, vec![status(code, Some((n, unit)), 0)]),
            "{entries:?}"
        );
        let near = u64::from(n) - (f64::from(n) * 0.8).floor() as u64;
        let counted = rule_stats(&server, key).await;
        assert_eq!(
            (
                counted.total_hits,
                counted.over_limit,
                counted.near_limit,
                counted.within_limit,
                counted.shadow_mode
            ),
            (over, 1, near, 0, u64::from(shadow)),
            "{key}"
        );
    }
}

// === TestWildcardConfig ===

/// config_test.go:576 TestWildcardConfig: a key-only rule and a wildcard value each give
/// every matching value the same limit and one stats key (the pattern's, `*` included),
/// while each value keeps a counter of its own; a wildcard may stand anywhere and match
/// nothing; exact values never match by prefix.
#[tokio::test]
async fn wildcard_values_match_by_pattern_and_share_a_stats_key() {
    let server = server_of(&[("wildcard.yaml", WILDCARD)]).await;
    let twenty = status(Code::Ok, Some((20, Unit::Minute)), 19);
    let ten = status(Code::Ok, Some((10, Unit::Minute)), 9);
    let cases: &[(Entries, &Seen, &str)] = &[
        (&[("noVal", "foo1")], &twenty, "test-domain.noVal"),
        (&[("noVal", "foo2")], &twenty, "test-domain.noVal"),
        (&[("wild", "foo1")], &twenty, "test-domain.wild_foo*"),
        (&[("wild", "foo2")], &twenty, "test-domain.wild_foo*"),
        (
            &[("nestedWild", "val1"), ("wild", "goo2")],
            &twenty,
            "test-domain.nestedWild_val1.wild_goo*",
        ),
        (
            &[("midWild", "barab")],
            &twenty,
            "test-domain.midWild_bar*b",
        ),
        (
            &[("midWild", "bar123b")],
            &twenty,
            "test-domain.midWild_bar*b",
        ),
        // `*` matches the empty string.
        (&[("midWild", "barb")], &twenty, "test-domain.midWild_bar*b"),
        (
            &[("multiWild", "foo123bar456baz")],
            &ten,
            "test-domain.multiWild_foo*bar*baz",
        ),
        (
            &[("multiWild", "foobarbaz")],
            &ten,
            "test-domain.multiWild_foo*bar*baz",
        ),
    ];
    for (entries, want, key) in cases {
        expect(&server, entries, (*want).clone(), Some(key)).await;
    }
    for entries in [
        [("wild", "bar")],
        [("noWild", "foo1")],
        [("midWild", "bara")],
        [("midWild", "xbarb")],
        [("multiWild", "foo123baz")],
        [("multiWild", "bar456baz")],
    ] {
        expect(&server, &entries, no_limit(), None).await;
    }
    // Each stats key took every matching value's hit.
    for (key, hits) in [
        ("test-domain.noVal", 2),
        ("test-domain.wild_foo*", 2),
        ("test-domain.midWild_bar*b", 3),
        ("test-domain.multiWild_foo*bar*baz", 2),
    ] {
        assert_eq!(rule_stats(&server, key).await.total_hits, hits, "{key}");
    }
}

// === TestDetailedMetric ===

/// A two-level config for domain `nested`: `key-1` (100) with `key-2` (5) below, each with
/// or without `detailed_metric`.
fn two_levels(top_detailed: bool, leaf_detailed: bool) -> String {
    format!(
        "domain: nested
descriptors:
  - key: key-1
    detailed_metric: {top_detailed}
    rate_limit: {{unit: minute, requests_per_unit: 100}}
    descriptors:
      - key: key-2
        detailed_metric: {leaf_detailed}
        rate_limit: {{unit: minute, requests_per_unit: 5}}
"
    )
}

/// The reference's `realisticExampleConfig`.
const REALISTIC: &str = "
domain: nested
descriptors:
  - key: key_1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 500}
  - key: key_1
    value: some-value-for-key-1
    rate_limit: {unit: minute, requests_per_unit: 500}
  - key: key_2
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5000}
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: key_2
    value: specific-id
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 50000}
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 100}
";

/// config_test.go:712 TestDetailedMetric: `detailed_metric` on the matched rule names its
/// stats key by every runtime value; without it, by the config's keys and values.
#[tokio::test]
async fn detailed_metric_names_the_stats_key_by_runtime_values() {
    let top: &[(&str, &str)] = &[("key-1", "value-1")];
    let both: &[(&str, &str)] = &[("key-1", "value-1"), ("key-2", "value-2")];
    // (subtest, config, request, limit, stats key)
    let cases: [(&str, String, Entries, u32, &str); 7] = [
        (
            "nested with no values but request only top-level key",
            two_levels(true, false),
            top,
            100,
            "nested.key-1_value-1",
        ),
        (
            "... with no detailed metric",
            two_levels(false, false),
            top,
            100,
            "nested.key-1",
        ),
        (
            "nested with no values and request fully nested descriptors",
            two_levels(true, true),
            both,
            5,
            "nested.key-1_value-1.key-2_value-2",
        ),
        (
            "... with no detailed metric",
            two_levels(false, false),
            both,
            5,
            "nested.key-1.key-2",
        ),
        (
            "test nested descriptors with simple request",
            REALISTIC.to_owned(),
            &[("key_1", "value-for-key-1")],
            500,
            "nested.key_1_value-for-key-1",
        ),
        (
            "test nested only second descriptor request not nested",
            REALISTIC.to_owned(),
            &[("key_2", "key-2-value")],
            5000,
            "nested.key_2_key-2-value",
        ),
        (
            "test nested descriptors with nested request",
            REALISTIC.to_owned(),
            &[("key_2", "key-2-value"), ("key_3", "requested-key3-value")],
            5,
            "nested.key_2_key-2-value.key_3_requested-key3-value",
        ),
    ];
    for (name, yaml, entries, limit, key) in cases {
        let server = server_of(&[("nested.yaml", &yaml)]).await;
        let h = hit(&server, req("nested", &[entries])).await;
        assert_eq!(
            h.statuses,
            [status(Code::Ok, Some((limit, Unit::Minute)), limit - 1)],
            "{name}"
        );
        assert_eq!(h.counted, [(key.to_owned(), 1)], "{name}");
    }
}

// === TestValueToMetric_* ===

/// `route` → `http_method` → `subject_id` (60 a minute) in `domain`, with `value_to_metric`
/// on the first two levels as given and `detailed_metric` on the leaf.
fn route_method_subject(domain: &str, route: bool, method: bool, leaf_detailed: bool) -> String {
    format!(
        "domain: {domain}
descriptors:
  - key: route
    value_to_metric: {route}
    descriptors:
      - key: http_method
        value_to_metric: {method}
        descriptors:
          - key: subject_id
            detailed_metric: {leaf_detailed}
            rate_limit: {{unit: minute, requests_per_unit: 60}}
"
    )
}

const DRAW_GET_123: &[(&str, &str)] = &[
    ("route", "draw"),
    ("http_method", "GET"),
    ("subject_id", "123"),
];

/// config_test.go:1027 TestValueToMetric_UsesRuntimeValuesInStats: the levels with
/// `value_to_metric` are named by their runtime values, the rest by their keys.
#[tokio::test]
async fn value_to_metric_names_its_levels_by_runtime_values() {
    let yaml = route_method_subject("domain", true, true, false);
    let server = server_of(&[("c.yaml", &yaml)]).await;
    assert_eq!(
        counted_under(&server, "domain", DRAW_GET_123).await,
        ["domain.route_draw.http_method_GET.subject_id"]
    );
    let counted = rule_stats(&server, "domain.route_draw.http_method_GET.subject_id").await;
    assert_eq!((counted.total_hits, counted.within_limit), (1, 1));
}

/// config_test.go:1087 TestValueToMetric_DefaultKeyIncludesValueAtThatLevel,
/// :1127 TestValueToMetric_MidLevelOnly and :1171 TestValueToMetric_NoFlag_Unchanged:
/// the flag names its own level by value, wherever it is; without it nothing changes.
#[tokio::test]
async fn value_to_metric_names_only_the_levels_that_set_it() {
    let top = "domain: d
descriptors:
  - key: k1
    value_to_metric: true
    descriptors:
      - key: k2
        rate_limit: {unit: second, requests_per_unit: 1}
";
    let server = server_of(&[("d.yaml", top)]).await;
    assert_eq!(
        counted_under(&server, "d", &[("k1", "A"), ("k2", "foo")]).await,
        ["d.k1_A.k2"]
    );
    let middle = "domain: d
descriptors:
  - key: k1
    descriptors:
      - key: k2
        value_to_metric: true
        descriptors:
          - key: k3
            rate_limit: {unit: second, requests_per_unit: 1}
";
    let server = server_of(&[("d.yaml", middle)]).await;
    assert_eq!(
        counted_under(&server, "d", &[("k1", "X"), ("k2", "Y"), ("k3", "Z")]).await,
        ["d.k1.k2_Y.k3"]
    );
    let none = "domain: d
descriptors:
  - key: k1
    descriptors:
      - key: k2
        rate_limit: {unit: second, requests_per_unit: 1}
";
    let server = server_of(&[("d.yaml", none)]).await;
    assert_eq!(
        counted_under(&server, "d", &[("k1", "X"), ("k2", "Y")]).await,
        ["d.k1.k2"]
    );
}

/// config_test.go:1208 TestValueToMetric_DoesNotOverrideDetailedMetric: `detailed_metric`
/// on the leaf names every level by value, whatever the `value_to_metric` flags.
#[tokio::test]
async fn detailed_metric_wins_over_value_to_metric() {
    let yaml = route_method_subject("domain", true, true, true);
    let server = server_of(&[("c.yaml", &yaml)]).await;
    assert_eq!(
        counted_under(&server, "domain", DRAW_GET_123).await,
        ["domain.route_draw.http_method_GET.subject_id_123"]
    );
}

/// config_test.go:1265 TestValueToMetric_WithConfiguredValues: a level with a configured
/// value is named by it; each configured value keeps its own limit.
#[tokio::test]
async fn value_to_metric_keeps_configured_values() {
    let yaml = "domain: test-domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
      - key: http_method
        value: POST
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 30}
";
    let server = server_of(&[("c.yaml", yaml)]).await;
    for (method, user, limit) in [("GET", "user123", 60), ("POST", "user456", 30)] {
        let entries = [
            ("route", "api"),
            ("http_method", method),
            ("subject_id", user),
        ];
        let key = format!("test-domain.route_api.http_method_{method}.subject_id");
        expect(
            &server,
            &entries,
            status(Code::Ok, Some((limit, Unit::Minute)), limit - 1),
            Some(&key),
        )
        .await;
    }
}

/// config_test.go:1354 TestValueToMetric_WithWildcard: a wildcard level with the flag is
/// named by the runtime value, not the pattern.
#[tokio::test]
async fn value_to_metric_names_a_wildcard_level_by_its_value() {
    let yaml = "domain: domain
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 100}
";
    let server = server_of(&[("c.yaml", yaml)]).await;
    for (user, action, resource) in [
        ("alice", "readfile", "documents"),
        ("bob", "readdata", "database"),
    ] {
        let h = hit(
            &server,
            req(
                "domain",
                &[&[("user", user), ("action", action), ("resource", resource)]],
            ),
        )
        .await;
        assert_eq!(
            h.statuses,
            [status(Code::Ok, Some((100, Unit::Minute)), 99)]
        );
        assert_eq!(
            h.counted,
            [(format!("domain.user_{user}.action_{action}.resource"), 1)]
        );
    }
}

/// config_test.go:1428 TestValueToMetric_WithEmptyValue: an empty runtime value names its
/// level by the key alone.
#[tokio::test]
async fn value_to_metric_names_an_empty_value_by_its_key() {
    let yaml = route_method_subject("domain", true, true, false);
    let server = server_of(&[("c.yaml", &yaml)]).await;
    for (route, method, key) in [
        ("", "GET", "domain.route.http_method_GET.subject_id"),
        ("draw", "", "domain.route_draw.http_method.subject_id"),
        ("", "", "domain.route.http_method.subject_id"),
    ] {
        let entries = [
            ("route", route),
            ("http_method", method),
            ("subject_id", "123"),
        ];
        assert_eq!(counted_under(&server, "domain", &entries).await, [key]);
    }
    let counted = rule_stats(&server, "domain.route.http_method.subject_id").await;
    assert_eq!((counted.total_hits, counted.within_limit), (1, 1));
}

/// config_test.go:1526 TestValueToMetric_FullKeyMatchesStatsKey: the reference's point is
/// that its log key equals its stats key (an internal); what a user sees are the three stats
/// keys, with the flags, without them, and with `detailed_metric`.
#[tokio::test]
async fn stats_keys_with_and_without_the_flags() {
    let with = route_method_subject("test-domain", true, true, false);
    let without = route_method_subject("test-domain-2", false, false, false);
    let detailed = route_method_subject("test-domain-3", false, false, true);
    let server = server_of(&[
        ("1.yaml", &with),
        ("2.yaml", &without),
        ("3.yaml", &detailed),
    ])
    .await;
    let entries = [
        ("route", "api"),
        ("http_method", "GET"),
        ("subject_id", "user123"),
    ];
    for (domain, key) in [
        (
            "test-domain",
            "test-domain.route_api.http_method_GET.subject_id",
        ),
        (
            "test-domain-2",
            "test-domain-2.route.http_method.subject_id",
        ),
        (
            "test-domain-3",
            "test-domain-3.route_api.http_method_GET.subject_id_user123",
        ),
    ] {
        assert_eq!(counted_under(&server, domain, &entries).await, [key]);
    }
}

// === TestShareThreshold ===

/// config_test.go:1669 TestShareThreshold: with `share_threshold`, every value a pattern
/// matches shares one counter (each request below sees the one before it) and one stats
/// key, the pattern's; the pattern wins over `value_to_metric` and `detailed_metric` at its
/// level; an exact value beats the pattern and keeps its own counter; middle and several
/// wildcards work alike.
#[tokio::test]
async fn share_threshold_values_share_one_counter_and_stats_key() {
    let server = server_of(&[("share_threshold.yaml", SHARE_THRESHOLD)]).await;
    let ok = |n: u32, remaining: u32| status(Code::Ok, Some((n, Unit::Hour)), remaining);
    // Case 1: basic.
    for (i, value) in ["files/a.pdf", "files/b.csv", "files/c.txt"]
        .iter()
        .enumerate()
    {
        expect(
            &server,
            &[("files", value)],
            ok(100, 99 - i as u32),
            Some("test-domain.files_files/*"),
        )
        .await;
    }
    // Case 2: over value_to_metric, and over detailed_metric, at the shared level.
    expect(
        &server,
        &[("route", "api/v1"), ("method", "GET")],
        ok(60, 59),
        Some("test-domain.route_api/*.method"),
    )
    .await;
    expect(
        &server,
        &[("service", "svc/user"), ("endpoint", "get")],
        ok(80, 79),
        Some("test-domain.service_svc/*.endpoint_get"),
    )
    .await;
    // Case 3: nested.
    expect(
        &server,
        &[("nested", "parent"), ("files", "nested/file1.txt")],
        ok(200, 199),
        Some("test-domain.nested_parent.files_nested/*"),
    )
    .await;
    expect(
        &server,
        &[("files", "top/file1.txt"), ("files", "nested/file1.txt")],
        ok(300, 299),
        Some("test-domain.files_top/*.files_nested/*"),
    )
    .await;
    expect(
        &server,
        &[("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")],
        ok(120, 119),
        Some("test-domain.path_path/*.file_file/*.type"),
    )
    .await;
    expect(
        &server,
        &[
            ("user", "user/alice"),
            ("resource", "res/file1"),
            ("action", "read"),
        ],
        ok(150, 149),
        Some("test-domain.user_user/*.resource_res/*.action"),
    )
    .await;
    // Case 4: the exact value has its own limit, counter and stats key.
    expect(
        &server,
        &[("file", "test1")],
        ok(50, 49),
        Some("test-domain.file_test1"),
    )
    .await;
    for (i, value) in ["test2", "test23", "test123"].iter().enumerate() {
        expect(
            &server,
            &[("file", value)],
            ok(100, 99 - i as u32),
            Some("test-domain.file_test*"),
        )
        .await;
    }
    assert_eq!(
        rule_stats(&server, "test-domain.file_test*")
            .await
            .total_hits,
        3
    );
    assert_eq!(
        rule_stats(&server, "test-domain.file_test1")
            .await
            .total_hits,
        1
    );
    // Case 5: a middle wildcard.
    for (i, value) in ["/api/v1", "/api-beta-v1", "/apiXYZv1"].iter().enumerate() {
        expect(
            &server,
            &[("midpath", value)],
            ok(100, 99 - i as u32),
            Some("test-domain.midpath_/api*v1"),
        )
        .await;
    }
    expect(&server, &[("midpath", "/api/v2")], no_limit(), None).await;
    // Case 6: several wildcards.
    for (i, value) in ["svcAepBrpc", "svcXXXepYYYrpc", "svceprpc"]
        .iter()
        .enumerate()
    {
        expect(
            &server,
            &[("multiroute", value)],
            ok(50, 49 - i as u32),
            Some("test-domain.multiroute_svc*ep*rpc"),
        )
        .await;
    }
    expect(&server, &[("multiroute", "svcABCrpc")], no_limit(), None).await;
    // Case 7: a middle wildcard over value_to_metric.
    for (i, value) in ["/api/v2", "/api-beta-v2"].iter().enumerate() {
        expect(
            &server,
            &[("midroute", value)],
            ok(80, 79 - i as u32),
            Some("test-domain.midroute_/api*v2"),
        )
        .await;
    }
    // Case 8: nested middle wildcards.
    for (i, (tenant, resource)) in [("t1prod", "resAv2"), ("t99prod", "resBBBv2")]
        .iter()
        .enumerate()
    {
        expect(
            &server,
            &[("tenant", tenant), ("resource", resource)],
            ok(60, 59 - i as u32),
            Some("test-domain.tenant_t*prod.resource_res*v2"),
        )
        .await;
    }
}

// === TestWildcardStatsBehavior ===

/// One rule `wild: <pattern>` (20 a minute) in `test-domain`, with the flags given.
fn wild(pattern: &str, flags: &str) -> String {
    format!(
        "domain: test-domain
descriptors:
  - key: wild
    value: \"{pattern}\"
{flags}    rate_limit: {{unit: minute, requests_per_unit: 20}}
"
    )
}

/// config_test.go:1987 TestWildcardStatsBehavior: a wildcard's stats key is its pattern,
/// unless `value_to_metric` (without `share_threshold`) names it by the runtime value;
/// `value_to_metric` elsewhere leaves the pattern; a pattern with `*` in the middle and at the
/// end behaves as one with `*` at the end.
#[tokio::test]
async fn a_wildcard_stats_key_is_its_pattern_unless_value_to_metric() {
    let share = "    share_threshold: true\n";
    let by_value = "    value_to_metric: true\n";
    let both = "    share_threshold: true\n    value_to_metric: true\n";
    // (subtest, config, values, stats key of each)
    let cases: [(&str, String, &[&str], &[&str]); 6] = [
        (
            "No flags",
            wild("foo*", ""),
            &["foo1"],
            &["test-domain.wild_foo*"],
        ),
        (
            "value_to_metric",
            wild("foo*", by_value),
            &["foo1"],
            &["test-domain.wild_foo1"],
        ),
        (
            "share_threshold",
            wild("foo*", share),
            &["foo1"],
            &["test-domain.wild_foo*"],
        ),
        (
            "share_threshold with value_to_metric",
            wild("foo*", both),
            &["foo1"],
            &["test-domain.wild_foo*"],
        ),
        (
            "middle+trailing wildcard - no flags",
            wild("foo*bar*", ""),
            &["foo123bar456", "fooXbarY"],
            &["test-domain.wild_foo*bar*", "test-domain.wild_foo*bar*"],
        ),
        (
            "middle+trailing wildcard - value_to_metric",
            wild("foo*bar*", by_value),
            &["foo123bar456"],
            &["test-domain.wild_foo123bar456"],
        ),
    ];
    for (name, yaml, values, keys) in cases {
        let server = server_of(&[("c.yaml", &yaml)]).await;
        for (value, key) in values.iter().zip(keys) {
            assert_eq!(
                counted_under(&server, "test-domain", &[("wild", value)]).await,
                [*key],
                "{name}"
            );
        }
    }
    // value_to_metric in another descriptor: the wildcard keeps its pattern.
    let yaml = "domain: test-domain
descriptors:
  - key: wild
    value: foo*
    descriptors:
      - key: other
        value_to_metric: true
        descriptors:
          - key: limit
            rate_limit: {unit: minute, requests_per_unit: 20}
";
    let server = server_of(&[("c.yaml", yaml)]).await;
    assert_eq!(
        counted_under(
            &server,
            "test-domain",
            &[("wild", "foo1"), ("other", "bar"), ("limit", "X")]
        )
        .await,
        ["test-domain.wild_foo*.other_bar.limit"]
    );
}

// === TestMetadata ===

/// The `metadata` field of an answer's dynamic metadata.
fn metadata_of(
    response: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse,
) -> Struct {
    let dynamic = response
        .dynamic_metadata
        .as_ref()
        .expect("dynamic metadata");
    match dynamic.fields.get("metadata").and_then(|v| v.kind.as_ref()) {
        Some(Kind::StructValue(s)) => s.clone(),
        other => panic!("no metadata struct: {other:?}"),
    }
}

fn string_field(s: &Struct, name: &str) -> Option<String> {
    match s.fields.get(name)?.kind.as_ref()? {
        Kind::StringValue(v) => Some(v.clone()),
        _ => None,
    }
}

/// config_test.go:2209 TestMetadata: a rule's `metadata` (a string, a nested mapping) comes
/// with its limit; seen in the reference's dynamic metadata (`RESPONSE_DYNAMIC_METADATA`).
#[tokio::test]
async fn a_rules_metadata_comes_with_its_limit() {
    let mut settings = Settings::for_tests(config_dir("metadata", &[("metadata.yaml", METADATA)]));
    settings.response.dynamic_metadata = true;
    let server = TestServer::start_with(settings).await;
    let h = hit(
        &server,
        req(
            "test-domain",
            &[&[("key1", "value1"), ("subkey1", "something")]],
        ),
    )
    .await;
    assert_eq!(h.statuses, [status(Code::Ok, Some((5, Unit::Second)), 4)]);
    assert_eq!(
        h.counted,
        [("test-domain.key1_value1.subkey1".to_owned(), 1)]
    );
    let metadata = metadata_of(&h.response);
    assert_eq!(
        string_field(&metadata, "name").as_deref(),
        Some("service_1")
    );

    let h = hit(&server, req("test-domain", &[&[("key2", "something")]])).await;
    assert_eq!(h.statuses, [status(Code::Ok, Some((20, Unit::Minute)), 19)]);
    assert_eq!(h.counted, [("test-domain.key2".to_owned(), 1)]);
    let metadata = metadata_of(&h.response);
    let nested = match metadata
        .fields
        .get("service_with_quota")
        .and_then(|v| v.kind.as_ref())
    {
        Some(Kind::StructValue(s)) => s.clone(),
        other => panic!("service_with_quota is not a mapping: {other:?}"),
    };
    assert_eq!(string_field(&nested, "name").as_deref(), Some("service_2"));
}
