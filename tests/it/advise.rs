//! `sluice advise` against a real Prometheus scraping three instances on one Redis: the
//! ladder read back through Prometheus's HTTP API, percentiles, candidates, a recommendation
//! when the data allow one and none when they are thin; clear errors naming the URL and the
//! query.

use std::process::{Command, Output};

use serde_json::Value;

use crate::common::prometheus::PrometheusServer;
use crate::common::redis::RedisServer;
use crate::common::{SluiceProcess, config_dir};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// A shadow rule of 10 a day, and an enforced one.
const CONFIG: &str = r#"
domain: advise
descriptors:
  - key: user
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 10}
  - key: enforced
    rate_limit: {unit: day, requests_per_unit: 10}
"#;

fn advise(args: &[&str]) -> Output {
    Command::new(BIN).arg("advise").args(args).output().unwrap()
}

fn json_of(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The candidate of `rule` at `ratio`: (hits refused, key-windows refused).
fn candidate(rule: &Value, ratio: f64) -> (f64, f64) {
    let c = rule["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| (c["ratio"].as_f64().unwrap() - ratio).abs() < 1e-3)
        .unwrap_or_else(|| panic!("no candidate at {ratio}: {rule}"));
    (
        c["hits_refused"].as_f64().unwrap(),
        c["key_windows_refused"].as_f64().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advise_reads_the_ladder_through_a_real_prometheus() {
    let redis = RedisServer::start();
    let dir = config_dir("advise", &[("a.yaml", CONFIG)]);
    let instances: Vec<SluiceProcess> = (0..3)
        .map(|_| SluiceProcess::on_redis(&dir, &redis, &["--redis-deadline", "2s"]))
        .collect();
    let targets: Vec<&str> = instances.iter().map(|i| i.http.as_str()).collect();
    let prometheus = PrometheusServer::scraping(&targets).await;
    // 50 keys peak at 5, 9 at 12, one at 30, spread over the three instances.
    let drive = |key: &'static str, value: String, hits: usize| {
        let instances = &instances;
        async move {
            crate::common::drive_processes(instances, "advise", &[(key, &value)], hits, 4).await
        }
    };
    for k in 0..60 {
        let peak = match k {
            0..50 => 5,
            50..59 => 12,
            _ => 30,
        };
        drive("user", format!("u{k}"), peak).await;
    }
    drive("enforced", "e".into(), 15).await;
    let hits = 50 * 5 + 9 * 12 + 30;
    crate::common::eventually_within(
        std::time::Duration::from_secs(30),
        "Prometheus holds the traffic",
        || async {
            let measured = prometheus
                .query("sum(sluice_rule_hits_measured_total{rule=\"advise.user\"})")
                .await;
            let enforced = prometheus
                .query("sum(ratelimit_service_rate_limit_over_limit{rule=\"advise.enforced\"})")
                .await;
            measured == Some(hits as f64) && enforced == Some(5.0)
        },
    )
    .await;
    let url = prometheus.url.as_str();

    // Enough data by the flags: a recommendation, trusted.
    let trusted = json_of(&advise(&[
        "--prometheus",
        url,
        "--rule",
        "advise.user",
        "--min-key-windows",
        "50",
        "--range",
        "1h",
        "--min-range",
        "1s",
        "--json",
    ]));
    let rule = &trusted["rules"][0];
    assert_eq!(rule["rule"], "advise.user", "{trusted}");
    assert_eq!(rule["limit"], 10.0);
    assert_eq!(rule["key_windows"], 60.0);
    assert_eq!(rule["hits"], hits as f64);
    // At the configured 10: the 9 keys' 2 hits past it and the 30's 20; at 14 (1.4142): one
    // key, 16 hits; at 5 (0.5): none of the 5s, the other ten.
    assert_eq!(candidate(rule, 1.0), (38.0, 10.0));
    assert_eq!(candidate(rule, std::f64::consts::SQRT_2), (16.0, 1.0));
    assert_eq!(candidate(rule, 0.5), (9.0 * 7.0 + 25.0, 10.0));
    let peak = |q: f64| {
        rule["peaks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["quantile"] == q)
            .map(|p| p["peak"]["at"].as_f64().unwrap())
            .unwrap()
    };
    assert_eq!(peak(0.5), 5.0);
    assert!((28.0..=33.0).contains(&peak(0.99)), "{rule}");
    let recommendation = &rule["recommendation"];
    assert_eq!(recommendation["trusted"], true, "{rule}");
    let limit = recommendation["limit"].as_f64().unwrap();
    assert!((35.0..=42.0).contains(&limit), "p99 × 1.25: {rule}");
    assert!(rule["warnings"].as_array().unwrap().is_empty());

    // The defaults (a week, 1,000 key-windows): no confident number, and why.
    let output = advise(&["--prometheus", url, "--rule", "advise.user"]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("configured limit   10"), "{text}");
    assert!(text.contains("key-windows seen   60"), "{text}");
    assert!(text.contains("<- configured"), "{text}");
    assert!(text.contains("only 60 key-windows: too few"), "{text}");
    assert!(text.contains("do not reach back 7d"), "{text}");
    assert!(
        text.contains("recommended limit  none: the data are too thin"),
        "{text}"
    );
    // Progress goes to standard error, never into the answer.
    assert!(String::from_utf8_lossy(&output.stderr).contains("query 1/"));

    // An enforced rule: nothing above its limit was measured.
    let enforced = json_of(&advise(&[
        "--prometheus",
        url,
        "--rule",
        "advise.enforced",
        "--min-key-windows",
        "1",
        "--range",
        "1h",
        "--min-range",
        "1s",
        "--json",
    ]));
    let warnings = enforced["rules"][0]["warnings"].to_string();
    assert!(
        warnings.contains("refused 5 hits while enforcing"),
        "{enforced}"
    );

    // A rule Prometheus has no series of: the URL and the query named, exit 1.
    let output = advise(&["--prometheus", url, "--rule", "advise.nothing"]);
    let error = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        error.contains(&format!(
            "Prometheus at {url} has no sluice_rule_key_windows_total"
        )) && error.contains("query: sum by"),
        "{error}"
    );

    // Not Prometheus (Sluice's admin port): what answered, and the query.
    let not_prometheus = format!("http://{}", instances[0].http);
    let output = advise(&["--prometheus", &not_prometheus]);
    let error = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        error.contains(&format!("Prometheus at {not_prometheus} answered 404")),
        "{error}"
    );
}

#[test]
fn advise_names_an_unreachable_prometheus_and_refuses_https() {
    let output = advise(&["--prometheus", "http://127.0.0.1:1"]);
    let error = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        error.contains("Prometheus at http://127.0.0.1:1 cannot be reached")
            && error.contains("query: "),
        "{error}"
    );
    let output = advise(&["--prometheus", "https://prometheus.example:9090"]);
    assert_eq!(output.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&output.stderr).contains("https is not supported"));
}
