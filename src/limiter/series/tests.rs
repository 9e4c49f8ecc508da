// Why one long file: the reference's stats cases, one per test, sharing the request and exposition
// helpers at the top.
//! The per-rule series counted from real limiter traffic.

use std::sync::Arc;

use super::*;
use crate::clock::SystemClock;
use crate::limiter::{Descriptor, Limiter, LimiterOptions, Request};
use crate::metrics::Exposition;

/// The series in a registry of their own.
struct Metrics {
    registry: Registry,
    series: Arc<RuleSeries>,
}

impl Metrics {
    fn new(near_limit_ratio: f64, max_detailed: usize) -> Self {
        let registry = Registry::new();
        let series = RuleSeries::register(&registry, near_limit_ratio, max_detailed);
        Self {
            registry,
            series: Arc::new(series),
        }
    }

    fn render(&self) -> String {
        self.registry.render()
    }
}

const CONFIG: &str = r#"
domain: m
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: path
    descriptors:
      - key: method
        value: GET
        rate_limit: {unit: hour, requests_per_unit: 100}
  - key: tenant
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
"#;

/// A limiter over `yaml` with `options`, observed by `metrics`.
fn observed(yaml: &str, options: LimiterOptions, metrics: &Metrics) -> Limiter {
    Limiter::for_tests(yaml, options, Arc::new(SystemClock)).with_observer(metrics.series.clone())
}

fn limiter(metrics: &Metrics) -> Limiter {
    observed(CONFIG, LimiterOptions::default(), metrics)
}

fn request(entries: &[(&str, &str)], hits: i64) -> Request {
    Request::of("m", vec![Descriptor::of(entries, hits)])
}

/// One hit on `(key, value)`.
async fn hit(limiter: &Limiter, key: &str, value: &str) {
    limiter.check(&request(&[(key, value)], 1)).await.unwrap();
}

/// The value of the sample `name{labels}` in the exposition.
/// Asserts the value of series `name{labels}` in `text`.
#[track_caller]
fn expect(text: &str, name: &str, labels: &str, value: Option<u64>) {
    assert_eq!(sample(text, name, labels), value, "{name}{{{labels}}}");
}

/// Asserts the value of the per-rule series `ratelimit_service_rate_limit_{what}{labels}`.
#[track_caller]
fn expect_rule(text: &str, what: &str, labels: &str, value: Option<u64>) {
    expect(
        text,
        &format!("ratelimit_service_rate_limit_{what}"),
        labels,
        value,
    );
}

fn sample(text: &str, name: &str, labels: &str) -> Option<u64> {
    let prefix = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.parse().unwrap())
}

#[tokio::test]
async fn per_rule_counters_count_hits_like_the_reference() {
    let metrics = Arc::new(Metrics::new(0.8, 100));
    let limiter = limiter(&metrics);
    // 12 requests of 1 hit on a limit of 10: 10 within (2 of them near), 2 over.
    for _ in 0..12 {
        limiter.check(&request(&[("user", "u0")], 1)).await.unwrap();
    }
    // A request of 3 hits on the nested rule.
    limiter
        .check(&request(&[("path", "/x"), ("method", "GET")], 3))
        .await
        .unwrap();
    let text = metrics.render();
    let user = r#"domain="m",key1="user",key2="",rule="m.user""#;
    expect_rule(&text, "total_hits", user, Some(12));
    expect_rule(&text, "within_limit", user, Some(10));
    expect_rule(&text, "over_limit", user, Some(2));
    expect_rule(&text, "near_limit", user, Some(2));
    let nested = r#"domain="m",key1="path",key2="method_GET",rule="m.path.method_GET""#;
    expect_rule(&text, "total_hits", nested, Some(3));
    // Request values never become labels.
    assert!(!text.contains("u0") && !text.contains("/x"), "{text}");
}

#[tokio::test]
async fn shadow_mode_hits_over_the_limit_are_counted() {
    let metrics = Arc::new(Metrics::new(0.8, 100));
    let limiter = limiter(&metrics);
    for _ in 0..3 {
        hit(&limiter, "shadowed", "x").await;
    }
    let text = metrics.render();
    let labels = r#"domain="m",key1="shadowed",key2="",rule="m.shadowed""#;
    expect_rule(&text, "shadow_mode", labels, Some(2));
}

#[tokio::test]
async fn detailed_series_are_capped_with_an_overflow_series() {
    let metrics = Arc::new(Metrics::new(0.8, 2));
    let limiter = limiter(&metrics);
    for tenant in ["a", "b", "c", "d"] {
        hit(&limiter, "tenant", tenant).await;
    }
    let text = metrics.render();
    let a = r#"domain="m",key1="tenant_a",key2="",rule="m.tenant_a""#;
    expect_rule(&text, "total_hits", a, Some(1));
    let overflow = r#"domain="m",key1="",key2="",rule="__overflow__""#;
    expect_rule(&text, "total_hits", overflow, Some(2));
    let overflowed = text
        .lines()
        .find_map(|l| l.strip_prefix("sluice_metric_series_overflow_total "));
    assert_eq!(overflowed, Some("2"));
}

#[tokio::test]
async fn series_of_removed_rules_disappear_after_a_reload() {
    let metrics = Arc::new(Metrics::new(0.8, 100));
    let limiter = limiter(&metrics);
    limiter.check(&request(&[("user", "x")], 1)).await.unwrap();
    assert!(metrics.render().contains(r#"rule="m.user""#));
    let smaller = "domain: m\ndescriptors:\n  - key: path\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    metrics
        .series
        .policy_swapped(&crate::config::policy_for_tests(smaller));
    assert!(!metrics.render().contains(r#"rule="m.user""#));
}

#[test]
fn long_runtime_values_are_shortened_in_labels() {
    assert_eq!(super::label_value("GET"), "GET");
    let long = "é".repeat(100); // 200 bytes, two-byte characters
    let label = super::label_value(&long);
    assert!(label.len() <= 64 + 1 + 16, "{label}");
    assert!(label.starts_with(&"é".repeat(32)));
    assert_ne!(label, super::label_value(&"é".repeat(101)));
}

/// The `rule` label the hits of `entries` are counted under, with `config` in force.
async fn series_name(config: &str, entries: &[(&str, &str)]) -> String {
    let metrics = Arc::new(Metrics::new(0.8, 100));
    let limiter = observed(config, LimiterOptions::default(), &metrics);
    limiter.check(&request(entries, 1)).await.unwrap();
    let text = metrics.render();
    let line = text
        .lines()
        .find(|l| l.starts_with("ratelimit_service_rate_limit_total_hits{"))
        .unwrap_or_else(|| panic!("no series in {text}"));
    let start = line.find("rule=\"").unwrap() + 6;
    line[start..start + line[start..].find('"').unwrap()].to_owned()
}

/// envoyproxy/ratelimit `test/config/config_test.go`, the `TestValueToMetric_*` cases: each
/// level with `value_to_metric` names the series by its runtime value, whichever level it is.
#[tokio::test]
async fn value_to_metric_applies_on_every_level_that_sets_it() {
    let nested = "domain: m
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
";
    let request = [
        ("route", "draw"),
        ("http_method", "GET"),
        ("subject_id", "123"),
    ];
    // TestValueToMetric_UsesRuntimeValuesInStats
    assert_eq!(
        series_name(nested, &request).await,
        "m.route_draw.http_method_GET.subject_id"
    );
    // TestValueToMetric_WithEmptyValue: an empty value adds nothing.
    assert_eq!(
        series_name(
            nested,
            &[("route", ""), ("http_method", "GET"), ("subject_id", "1")]
        )
        .await,
        "m.route.http_method_GET.subject_id"
    );
    // TestValueToMetric_DoesNotOverrideDetailedMetric: detailed_metric on the rule wins.
    let detailed = nested.replace(
        "          - key: subject_id\n",
        "          - key: subject_id\n            detailed_metric: true\n",
    );
    assert_eq!(
        series_name(&detailed, &request).await,
        "m.route_draw.http_method_GET.subject_id_123"
    );
    // config_test.go TestDetailedMetric builds `key_value` for each level: `key_` when the
    // value is empty.
    assert_eq!(
        series_name(
            &detailed,
            &[("route", "draw"), ("http_method", ""), ("subject_id", "1")]
        )
        .await,
        "m.route_draw.http_method_.subject_id_1"
    );
}

/// `TestValueToMetric_MidLevelOnly`: only the level with the flag names its value.
#[tokio::test]
async fn value_to_metric_on_a_middle_level_names_that_level_only() {
    let mid = "domain: m
descriptors:
  - key: k1
    descriptors:
      - key: k2
        value_to_metric: true
        descriptors:
          - key: k3
            rate_limit: {unit: minute, requests_per_unit: 60}
";
    assert_eq!(
        series_name(mid, &[("k1", "X"), ("k2", "Y"), ("k3", "Z")]).await,
        "m.k1.k2_Y.k3"
    );
}

/// `TestValueToMetric_WithWildcard`: a wildcard level names the runtime value;
/// `TestValueToMetric_WithConfiguredValues`: an exact level its value.
#[tokio::test]
async fn value_to_metric_names_wildcard_and_exact_levels_by_their_values() {
    let wildcard = "domain: m
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 60}
      - key: action
        value: GET
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 60}
";
    for (user, action, name) in [
        ("alice", "readfile", "m.user_alice.action_readfile.resource"),
        ("bob", "GET", "m.user_bob.action_GET.resource"),
    ] {
        let request = [("user", user), ("action", action), ("resource", "r")];
        assert_eq!(series_name(wildcard, &request).await, name);
    }
}

/// The `over_limit`, `near_limit` and `within_limit` hits a request of `hits` adds on a fresh
/// `user` counter of 20 per hour already holding `used`.
async fn split(used: i64, hits: i64) -> [u64; 3] {
    let config = "domain: m\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 20}\n";
    let metrics = Arc::new(Metrics::new(0.8, 100));
    let limiter = observed(config, LimiterOptions::default(), &metrics);
    let read = || {
        let text = metrics.render();
        let labels = r#"domain="m",key1="user",key2="",rule="m.user""#;
        ["over_limit", "near_limit", "within_limit"].map(|name| {
            sample(
                &text,
                &format!("ratelimit_service_rate_limit_{name}"),
                labels,
            )
            .unwrap_or(0)
        })
    };
    if used > 0 {
        limiter
            .check(&request(&[("user", "u")], used))
            .await
            .unwrap();
    }
    let before = read();
    limiter
        .check(&request(&[("user", "u")], hits))
        .await
        .unwrap();
    let after = read();
    [0, 1, 2].map(|i| after[i] - before[i])
}

/// envoyproxy/ratelimit `test/redis/fixed_cache_impl_test.go` `TestNearLimit` (limit 20,
/// near-limit threshold 16): the hits of a refusal that crosses the limit split into over
/// (past 20) and near (16 to 20); a refusal of a full counter is all over.
#[tokio::test]
async fn refused_hits_split_into_over_and_near_like_the_reference() {
    // "Some of it over limit, all of it over near limit": 19 + 3.
    assert_eq!(split(19, 3).await, [2, 1, 0]);
    // "Some of it in all three places": 15 + 7.
    assert_eq!(split(15, 7).await, [2, 4, 0]);
    // "all of it over limit".
    assert_eq!(split(20, 3).await, [3, 0, 0]);
    // Admitted: "all of it over near limit" (16 + 3), "under near limit" (0 + 3).
    assert_eq!(split(16, 3).await, [0, 3, 3]);
    assert_eq!(split(0, 3).await, [0, 0, 3]);
}

#[tokio::test]
async fn unknown_domains_are_counted_per_domain_up_to_a_cap() {
    let metrics = Arc::new(Metrics::new(0.8, 100));
    let limiter = limiter(&metrics);
    for i in 0..MAX_UNKNOWN_DOMAINS + 5 {
        let mut r = request(&[("user", "u")], 1);
        r.domain = format!("nowhere-{i}");
        limiter.check(&r).await.unwrap();
    }
    let mut again = request(&[("user", "u")], 1);
    again.domain = "nowhere-0".into();
    limiter.check(&again).await.unwrap();
    let text = metrics.render();
    let count = |domain: &str| {
        sample(
            &text,
            "ratelimit_service_domain_not_found",
            &format!("domain=\"{domain}\""),
        )
    };
    assert_eq!(count("nowhere-0"), Some(2));
    assert_eq!(count("nowhere-99"), Some(1));
    assert_eq!(count("nowhere-100"), None);
    assert_eq!(count(OVERFLOW), Some(5));
}

#[tokio::test]
async fn the_global_shadow_mode_counts_the_requests_it_let_through() {
    let metrics = Arc::new(Metrics::new(0.8, 100));
    let options = LimiterOptions {
        shadow_mode: true,
        ..LimiterOptions::default()
    };
    let limiter = observed(CONFIG, options, &metrics);
    for _ in 0..13 {
        let response = limiter.check(&request(&[("user", "u")], 1)).await.unwrap();
        assert_eq!(response.code, crate::limiter::Code::Ok);
    }
    let text = metrics.render();
    let shadowed = text
        .lines()
        .find_map(|l| l.strip_prefix("ratelimit_service_global_shadow_mode "));
    assert_eq!(shadowed, Some("3"));
}

/// A request whose descriptor carries its own limit (Envoy's `limit` override).
fn override_request(key: &str) -> Request {
    let mut descriptor = Descriptor::of(&[(key, "v")], 1);
    descriptor.limit = Some(crate::limiter::LimitOverride {
        requests_per_unit: 5,
        unit: crate::policy::Unit::Minute,
    });
    Request::of("m", vec![descriptor])
}

#[tokio::test]
async fn override_series_are_capped_shortened_and_go_away_when_idle() {
    let metrics = Arc::new(Metrics::new(0.8, 2));
    let limiter = limiter(&metrics);
    let huge = "k".repeat(1 << 20);
    for key in [huge.as_str(), "b", "c", "d"] {
        limiter.check(&override_request(key)).await.unwrap();
    }
    let text = metrics.render();
    assert!(
        text.len() < 64 * 1024,
        "a 1 MiB key made /metrics {} bytes",
        text.len()
    );
    let b = r#"domain="m",key1="b",key2="",rule="m.b""#;
    expect_rule(&text, "total_hits", b, Some(1));
    let overflow = r#"domain="m",key1="",key2="",rule="__overflow__""#;
    assert_eq!(
        sample(&text, "ratelimit_service_rate_limit_total_hits", overflow),
        Some(2),
        "past the cap of 2: {text}"
    );
    // Used again within the idle time, "b" stays; unused, the huge key's series goes.
    metrics.series.advance(OVERRIDE_IDLE.as_secs() - 1);
    limiter.check(&override_request("b")).await.unwrap();
    metrics.series.advance(2);
    metrics.series.sweep_idle_overrides();
    let text = metrics.render();
    expect_rule(&text, "total_hits", b, Some(2));
    assert!(!text.contains("kkkk"), "{text}");
    // Its place under the cap is free again: a new override gets a series of its own.
    limiter.check(&override_request("e")).await.unwrap();
    let e = r#"domain="m",key1="e",key2="",rule="m.e""#;
    assert_eq!(
        sample(
            &metrics.render(),
            "ratelimit_service_rate_limit_total_hits",
            e
        ),
        Some(1)
    );
}

#[tokio::test]
async fn each_rules_limit_is_a_gauge_that_follows_reloads() {
    let metrics = Arc::new(Metrics::new(0.8, 100));
    let config = "domain: m\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n  - key: path\n    value: /login\n    rate_limits:\n      - {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 20}\n      - {unit: day, requests_per_unit: 1000}\n";
    let _limiter = observed(config, LimiterOptions::default(), &metrics);
    let text = metrics.render();
    let user =
        r#"algorithm="fixed_window",domain="m",key1="user",key2="",rule="m.user",window="3600s""#;
    expect(&text, "sluice_rule_limit", user, Some(10));
    let bucket = r#"algorithm="token_bucket",domain="m",key1="path_/login",key2="",rule="m.path_/login",window="1s""#;
    expect(&text, "sluice_rule_limit", bucket, Some(5));
    expect(&text, "sluice_rule_burst", bucket, Some(20));
    let daily = r#"algorithm="fixed_window",domain="m",key1="path_/login",key2="",rule="m.path_/login",window="86400s""#;
    expect(&text, "sluice_rule_limit", daily, Some(1000));
    // A reload: the removed rule's gauge goes, a changed limit is the new one.
    let smaller = "domain: m\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 7}\n";
    metrics
        .series
        .policy_swapped(&crate::config::policy_for_tests(smaller));
    let text = metrics.render();
    expect(&text, "sluice_rule_limit", user, Some(7));
    assert!(!text.contains("path_/login"), "{text}");
}
