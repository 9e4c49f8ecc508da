//! Prometheus's HTTP API as `sluice advise` asks it: instant queries at one time, each
//! answer's vector, and errors that name the URL and the query.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::super::ToolError;
use super::super::http::{encode, get};

/// Longest wait for one query's answer.
const QUERY_LIMIT: Duration = Duration::from_secs(60);

/// Largest answer read for one query.
const MAX_ANSWER_BYTES: u64 = 64 * 1024 * 1024;

/// Prometheus's HTTP API at one URL.
pub(super) struct Prometheus {
    host: String,
    prefix: String,
    /// The URL as given, for messages.
    pub(super) url: String,
    /// The time every query is evaluated at (Unix seconds): when advise started.
    pub(super) at: f64,
}

impl Prometheus {
    pub(super) fn new(url: &str) -> Result<Self, ToolError> {
        let rest = match url.split_once("://") {
            Some(("http", rest)) => rest,
            Some((scheme, _)) => {
                return Err(ToolError::Usage(format!(
                    "--prometheus {url}: {scheme} is not supported; give an http:// URL (a port-forward, or the in-cluster service)"
                )));
            }
            None => url,
        };
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if authority.is_empty() {
            return Err(ToolError::Usage(format!("--prometheus {url}: no host")));
        }
        let host = if authority
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            authority.to_owned()
        } else {
            format!("{authority}:80")
        };
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        Ok(Self {
            host,
            prefix: path.trim_end_matches('/').to_owned(),
            url: url.to_owned(),
            at,
        })
    }

    /// An instant query at the time advise started: its vector, as (labels, value).
    pub(super) async fn query(
        &self,
        promql: &str,
    ) -> Result<Vec<(BTreeMap<String, String>, f64)>, ToolError> {
        let path = format!(
            "{}/api/v1/query?query={}&time={:.3}",
            self.prefix,
            encode(promql),
            self.at
        );
        let failed = |what: String| {
            ToolError::Rpc(format!(
                "Prometheus at {} {what}\n  query: {promql}",
                self.url
            ))
        };
        let answer = get(&self.host, &path, QUERY_LIMIT, MAX_ANSWER_BYTES)
            .await
            .map_err(|e| failed(format!("cannot be reached: {e}")))?;
        let body: Value = serde_json::from_str(&answer.body).map_err(|_| {
            failed(format!(
                "answered {} without the API's JSON (is this Prometheus?): {}",
                answer.status,
                answer.body.chars().take(200).collect::<String>().trim()
            ))
        })?;
        if body["status"] != "success" {
            return Err(failed(format!(
                "answered {} {}: {}",
                answer.status,
                body["errorType"].as_str().unwrap_or("error"),
                body["error"].as_str().unwrap_or("(no message)")
            )));
        }
        let result = body["data"]["result"]
            .as_array()
            .ok_or_else(|| failed("answered a result that is not a vector".into()))?;
        Ok(result
            .iter()
            .filter_map(|sample| {
                let labels = sample["metric"]
                    .as_object()?
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect();
                let value = sample["value"][1].as_str()?.parse::<f64>().ok()?;
                Some((labels, value))
            })
            .collect())
    }
}

/// A label matcher's value, quoted for PromQL.
pub(super) fn quoted(value: &str) -> String {
    format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The queries, in order, each with what its answer fills.
pub(super) fn queries(selector: &str, range: &str, need: &str) -> Vec<(&'static str, String)> {
    let by = "domain, rule, window, algorithm";
    // What a counter gained over the range, exactly (no extrapolation to the range's edges,
    // as increase() does): now minus then; a series younger than the range, or one that
    // restarted within it, counts what it holds now.
    let gained = |name: &str| {
        format!(
            "(({name}{selector} - {name}{selector} offset {range}) >= 0 or ({name}{selector} + 0))"
        )
    };
    let increase = |name: &str, extra: &str| format!("sum by ({by}{extra}) ({})", gained(name));
    vec![
        ("key_windows", increase("sluice_rule_key_windows_total", "")),
        (
            "windows_past",
            increase("sluice_rule_key_windows_past_total", ", le"),
        ),
        ("hits_past", increase("sluice_rule_hits_past_total", ", le")),
        ("hits", increase("sluice_rule_hits_measured_total", "")),
        (
            "limit",
            format!("max by ({by}) (sluice_rule_limit{selector})"),
        ),
        (
            "burst",
            format!("max by ({by}) (sluice_rule_burst{selector})"),
        ),
        (
            "limit_changes",
            format!("max by ({by}) (changes(sluice_rule_limit{selector}[{range}]))"),
        ),
        (
            "enforced",
            format!(
                "sum by (domain, rule) ({}) - sum by (domain, rule) ({})",
                gained("ratelimit_service_rate_limit_over_limit"),
                gained("ratelimit_service_rate_limit_shadow_mode")
            ),
        ),
        (
            "reaches",
            format!(
                "max by ({by}) (timestamp(sluice_rule_key_windows_total{selector} offset {need}))"
            ),
        ),
    ]
}
