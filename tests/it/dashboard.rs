//! The Grafana dashboard and the alerting rules against a real Prometheus scraping a real
//! fleet (three instances on one Redis, job `sluice` as the ServiceMonitor names it): every
//! panel query and every alert expression evaluates without error, every series they name
//! exists, the panels have data where the traffic implies it, the dashboard's variables
//! resolve, and the fleet-wide figures match the traffic.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::common::prometheus::PrometheusServer;
use crate::common::redis::RedisServer;
use crate::common::{SluiceProcess, config_dir, drive_processes};

/// A shadow rule and an enforced one, both of 2 per 4-second window.
const CONFIG: &str = r#"
domain: dash
descriptors:
  - key: user
    rate_limit: {unit: second, unit_multiplier: 4, requests_per_unit: 2}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: second, unit_multiplier: 4, requests_per_unit: 2}
"#;

fn repo(path: &str) -> String {
    std::fs::read_to_string(crate::common::repo_path(path)).unwrap()
}

/// Every panel target's expression, with the dashboard's variables as Grafana would fill
/// them ("All" for domain and rule; a rate interval four scrapes long).
fn panel_queries() -> Vec<(String, String)> {
    let dashboard: Value =
        serde_json::from_str(&repo("deploy/grafana/sluice-dashboard.json")).unwrap();
    dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|panel| {
            let title = panel["title"].as_str().unwrap_or("").to_owned();
            panel["targets"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |t| {
                    let expr = t["expr"]
                        .as_str()
                        .unwrap()
                        .replace("$domain", ".*")
                        .replace("$rule", ".*")
                        .replace("$__rate_interval", "20s")
                        .replace("$__range", "10m");
                    (title.clone(), expr)
                })
        })
        .collect()
}

/// Every alert's expression.
fn alert_queries() -> Vec<(String, String)> {
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&repo("deploy/prometheus/sluice-alerts.yaml")).unwrap();
    rules["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_sequence().unwrap().clone())
        .map(|r| {
            (
                r["alert"].as_str().unwrap().to_owned(),
                r["expr"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The metric names an expression reads (identifiers of our families, and `up`).
fn series_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut word = String::new();
    let mut in_string = false;
    for c in expr.chars().chain(std::iter::once(' ')) {
        if c == '"' {
            in_string = !in_string;
        }
        if !in_string && (c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            word.push(c);
            continue;
        }
        if word.starts_with("sluice_") || word.starts_with("ratelimit_") || word == "up" {
            names.insert(word.clone());
        }
        word.clear();
    }
    names
}

/// Prometheus's answer to an instant query: the result, or the error it gave.
async fn query(prometheus: &PrometheusServer, promql: &str) -> Result<Vec<Value>, String> {
    prometheus.instant(promql).await
}

fn value_of(result: &[Value]) -> Option<f64> {
    result.first()?["value"][1].as_str()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_and_alert_evaluates_against_a_real_prometheus_scraping_a_fleet() {
    let redis = RedisServer::start();
    let dir = config_dir("dashboard", &[("d.yaml", CONFIG)]);
    let instances: Vec<SluiceProcess> = (0..3)
        .map(|_| SluiceProcess::on_redis(&dir, &redis, &["--redis-deadline", "2s"]))
        .collect();
    let targets: Vec<&str> = instances.iter().map(|i| i.http.as_str()).collect();
    let rules = crate::common::repo_path("deploy/prometheus/sluice-alerts.yaml");
    let prometheus = PrometheusServer::scraping_with_rules(&targets, Some(&rules)).await;

    // One window: six keys refused by each rule (3 hits on a limit of 2), spread over the
    // three instances.
    crate::measurement::next_window().await;
    for k in 0..6 {
        for key in ["user", "trial"] {
            drive_processes(&instances, "dash", &[(key, &format!("k{k}"))], 3, 3).await;
        }
    }
    // Prometheus has the window's counts (3 s after it ends) and a few scrapes of traffic.
    crate::common::eventually_within(
        std::time::Duration::from_secs(30),
        "the window's refused keys in Prometheus",
        || async {
            let q = "min(max by (rule) (sluice_rule_newly_refused_keys{domain=\"dash\"}))";
            query(&prometheus, q)
                .await
                .ok()
                .as_deref()
                .and_then(value_of)
                == Some(6.0)
        },
    )
    .await;

    // The fleet-wide figures the traffic implies: six distinct keys refused, all new; the
    // shadow rule's six key-windows past its limit, one hit each past it.
    for (promql, expected) in [
        ("max(sluice_rule_refused_keys{rule=\"dash.trial\"})", 6.0),
        (
            "max(sluice_rule_newly_refused_keys{rule=\"dash.user\"})",
            6.0,
        ),
        (
            "sum(sluice_rule_key_windows_total{rule=\"dash.trial\"})",
            6.0,
        ),
        (
            "sum(sluice_rule_key_windows_past_total{rule=\"dash.trial\",le=\"1\"})",
            6.0,
        ),
        (
            "sum(sluice_rule_hits_past_total{rule=\"dash.trial\",le=\"1\"})",
            6.0,
        ),
        (
            "sum(sluice_rule_hits_past_total{rule=\"dash.user\",le=\"0.5\"})",
            12.0,
        ),
    ] {
        let got = query(&prometheus, promql).await.unwrap();
        assert_eq!(value_of(&got), Some(expected), "{promql}");
    }

    // Every series any panel or alert names exists.
    let exprs: Vec<(String, String)> = panel_queries().into_iter().chain(alert_queries()).collect();
    let names: BTreeSet<String> = exprs.iter().flat_map(|(_, e)| series_names(e)).collect();
    assert!(names.len() > 20, "{names:?}");
    for name in &names {
        let found = query(&prometheus, &format!("count({{__name__=\"{name}\"}})"))
            .await
            .unwrap();
        assert!(
            value_of(&found).is_some_and(|n| n > 0.0),
            "no series {name} in a real fleet's scrape: a panel or alert names it"
        );
    }

    // Every panel query evaluates, with data (the traffic touched every panel).
    for (title, promql) in panel_queries() {
        let result = query(&prometheus, &promql)
            .await
            .unwrap_or_else(|e| panic!("panel {title:?}: {promql}: {e}"));
        assert!(!result.is_empty(), "panel {title:?} has no data: {promql}");
    }
    // Every alert expression evaluates (most are rightly empty on a healthy fleet).
    for (alert, promql) in alert_queries() {
        query(&prometheus, &promql)
            .await
            .unwrap_or_else(|e| panic!("alert {alert}: {promql}: {e}"));
    }

    // Prometheus loaded the shipped rule file and evaluates every rule without error.
    let addr = prometheus
        .url
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let (_, body) = crate::common::http_get(addr, "/api/v1/rules")
        .await
        .unwrap();
    let loaded: Value = serde_json::from_str(&body).unwrap();
    let rules: Vec<&Value> = loaded["data"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .collect();
    assert_eq!(rules.len(), alert_queries().len(), "{body}");
    for rule in rules {
        assert_eq!(rule["health"], "ok", "{rule}");
    }

    // The variables resolve to this fleet's domain and rules.
    let dashboard: Value =
        serde_json::from_str(&repo("deploy/grafana/sluice-dashboard.json")).unwrap();
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        let Some(definition) = variable["definition"].as_str() else {
            continue;
        };
        // label_values(SELECTOR, LABEL)
        let inner = definition
            .strip_prefix("label_values(")
            .and_then(|d| d.strip_suffix(')'))
            .unwrap_or_else(|| panic!("variable {definition}"));
        let (selector, label) = inner.rsplit_once(',').unwrap();
        let selector = selector.replace("$domain", ".*");
        let promql = format!("count by ({}) ({selector})", label.trim());
        let values = query(&prometheus, &promql).await.unwrap();
        let got: BTreeSet<String> = values
            .iter()
            .filter_map(|v| v["metric"][label.trim()].as_str().map(str::to_owned))
            .collect();
        assert!(
            got.contains("dash") || got.contains("dash.user"),
            "variable {} resolves to {got:?}",
            variable["name"]
        );
    }
}
