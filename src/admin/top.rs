//! `GET /top`: each rule's top refused keys (for a shadow rule, those it would refuse), over
//! its current window and the last completed one, as JSON: `?domain=D` and `?rule=R` (a stats
//! key) narrow it, `?n=N` (1 to 100, default 20) sets how many keys per window.

use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{AdminState, bad_request};
use crate::algorithm::SECOND;
use crate::limiter::refused::{CAPACITY, RuleTop};

/// Keys per window unless `?n=` says otherwise.
const DEFAULT_N: usize = 20;

pub(super) async fn get(State(state): State<AdminState>, RawQuery(query): RawQuery) -> Response {
    let (mut domain, mut rule, mut n) = (None, None, DEFAULT_N);
    for pair in query
        .as_deref()
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = match super::counters::percent_decode(value) {
            Ok(v) => v,
            Err(e) => return bad_request(format!("{name}: {e}")),
        };
        match name {
            "domain" if domain.is_none() => domain = Some(value),
            "rule" if rule.is_none() => rule = Some(value),
            "n" => match value.parse::<usize>() {
                Ok(v) if (1..=CAPACITY).contains(&v) => n = v,
                _ => {
                    return bad_request(format!(
                        "n must be a whole number from 1 to {CAPACITY}, not {value:?}"
                    ));
                }
            },
            "domain" | "rule" => return bad_request(format!("{name} is given twice")),
            other => return bad_request(format!("unknown parameter {other:?}: domain, rule or n")),
        }
    }
    let view = state
        .limiter
        .refused()
        .view(domain.as_deref(), rule.as_deref(), n);
    axum::Json(json!({ "rules": view.iter().map(rule_json).collect::<Vec<_>>() })).into_response()
}

fn rule_json(top: &RuleTop) -> Value {
    json!({
        "domain": top.domain,
        "rule": top.rule,
        "shadow": top.shadow,
        "window_seconds": top.window as f64 / SECOND as f64,
        "windows": top.windows.iter().map(|w| json!({
            "start": w.start / SECOND,
            "refused_hits": w.total,
            "floor": w.floor,
            "keys": w.keys.iter().map(|k| json!({
                "key": k.key,
                "refused": k.count,
                "error": k.error,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}
