// Why one long file: `/explain` and `/counters` share the parsing of a request's descriptors and
// buckets from a query or a body, and their error answers.
//! The admin API on the HTTP port, as JSON: `POST /explain` (a `RateLimitRequest` in the
//! proto3 JSON `/json` takes), `GET /counters` and `DELETE /counters`
//! (`?domain=D&entry=KEY=VALUE&entry=...`, or `?domain=D&descriptor=K=V,K2=V2` as the CLI
//! writes it: one descriptor, its entries in order). The
//! answers are the gRPC API's messages in proto3 JSON (lowerCamelCase names, enums by name).

use std::collections::HashMap;
use std::net::SocketAddr;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::api::{self, proto};
use super::reset::Refusal;
use super::{AdminState, bad_request};
use crate::limiter::{Descriptor, Entry, LimitError};

/// The most entries a `/counters` query may name: the request limit's (`MAX_DESCRIPTOR_ENTRIES`)
/// applies after this, which only bounds the parsing.
const MAX_QUERY_ENTRIES: usize = 256;

pub(super) async fn explain(State(state): State<AdminState>, body: Bytes) -> Response {
    let request = serde_json::from_slice::<super::json::JsonRequest>(&body)
        .map_err(|e| e.to_string())
        .and_then(|r| r.into_proto().map_err(|e| e.to_string()))
        .and_then(crate::rls::convert::request_from_proto);
    let request = match request {
        Ok(request) => request,
        Err(e) => return bad_request(format!("invalid RateLimitRequest JSON: {e}")),
    };
    match state.limiter.explain(&request) {
        Ok(explained) => {
            let answer = api::explained_to_proto(request.domain.clone(), &explained);
            axum::Json(explain_json(&answer)).into_response()
        }
        Err(e) => error_response(e),
    }
}

pub(super) async fn get(State(state): State<AdminState>, RawQuery(query): RawQuery) -> Response {
    let query = query.unwrap_or_default();
    if query.split('&').any(|p| p.starts_with("bucket=")) {
        return bucket(&state, &query);
    }
    let (domain, descriptor) = match parse_query(&query) {
        Ok(parsed) => parsed,
        Err(e) => return bad_request(e),
    };
    match state.limiter.counters(&domain, &descriptor).await {
        Ok((explanation, states)) => {
            let store = state.limiter.store().status().kind;
            let answer = api::counters_to_proto(&explanation, &states, store);
            axum::Json(counters_json(&answer)).into_response()
        }
        Err(e) => error_response(e),
    }
}

/// `GET /counters?domain=D&bucket=K=V,K2=V2`: what an RLQS bucket gets (its pairs unordered,
/// as Envoy sends them).
fn bucket(state: &AdminState, query: &str) -> Response {
    let (domain, pairs) = match parse_bucket_query(query) {
        Ok(parsed) => parsed,
        Err(e) => return bad_request(e),
    };
    let Some(quotas) = &state.rlqs else {
        return bad_request("this server has no RLQS face".into());
    };
    let key = match crate::quota::BucketKey::new(&pairs) {
        Ok(key) => key,
        Err(reason) => return bad_request(format!("bucket id: {}", reason.label())),
    };
    let view = quotas.explain(&domain, &key);
    axum::Json(bucket_json(&api::bucket_to_proto(domain, &view))).into_response()
}

/// `domain=D&bucket=K=V,K2=V2` → the domain and the bucket's pairs. A bucket id is a map, so
/// a key given twice is refused rather than one of its values kept.
fn parse_bucket_query(query: &str) -> Result<(String, HashMap<String, String>), String> {
    let mut domain = None;
    let mut pairs = HashMap::new();
    for (name, value) in parameters(query, &["domain", "bucket"])? {
        match name {
            "domain" => domain = Some(value),
            "bucket" => {
                for part in value.split(',') {
                    let (key, pair_value) = part
                        .split_once('=')
                        .ok_or_else(|| format!("bucket pair `{part}` is not KEY=VALUE"))?;
                    if pairs.len() == crate::quota::MAX_PAIRS {
                        return Err(format!(
                            "more than {} bucket pairs",
                            crate::quota::MAX_PAIRS
                        ));
                    }
                    if pairs
                        .insert(key.to_owned(), pair_value.to_owned())
                        .is_some()
                    {
                        return Err(format!("bucket key `{key}` is repeated in `{value}`"));
                    }
                }
            }
            other => {
                return Err(format!(
                    "unknown query parameter `{other}` (expected domain and bucket)"
                ));
            }
        }
    }
    let domain = domain.ok_or("the query must name a domain: ?domain=D&bucket=KEY=VALUE")?;
    Ok((domain, pairs))
}

/// An RLQS bucket's explanation in proto3 JSON.
pub fn bucket_json(answer: &proto::BucketExplanation) -> Value {
    json!({
        "domain": answer.domain,
        "descriptor": answer.descriptor.iter().map(|e| json!({"key": e.key, "value": e.value})).collect::<Vec<_>>(),
        "rule": answer.rule,
        "assignment": answer.assignment,
        "rate": answer.rate.to_string(),
        "windowSeconds": answer.window_seconds.to_string(),
        "burst": answer.burst.to_string(),
        "shadowMode": answer.shadow_mode,
        "tracked": answer.tracked,
        "claim": answer.claim.to_string(),
        "held": answer.held.to_string(),
        "demand": answer.demand,
        "shares": answer.shares.iter().map(|s| json!({
            "stream": s.stream.to_string(),
            "rate": s.rate.to_string(),
            "burst": s.burst.to_string(),
            "demand": s.demand,
        })).collect::<Vec<_>>(),
    })
}

pub(super) async fn delete(
    State(state): State<AdminState>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let peer = peer.map(|Extension(ConnectInfo(addr))| addr);
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let who = match state.reset.authorize(authorization, None).await {
        Ok(who) => who,
        Err(refusal) => {
            state.reset.refused("http", &refusal);
            tracing::warn!(?peer, reason = %refusal.log_reason(), "counter reset refused");
            return refusal_response(&refusal);
        }
    };
    let (domain, descriptor) = match parse_query(query.as_deref().unwrap_or("")) {
        Ok(parsed) => parsed,
        Err(e) => return bad_request(e),
    };
    let result = state.limiter.reset(&domain, &descriptor).await;
    state.reset.done("http", result.is_ok());
    match result {
        Ok((explanation, deleted)) => {
            let counters = api::counter_names(&explanation);
            tracing::warn!(?peer, %who, %domain, ?counters, deleted, "counters reset");
            axum::Json(json!({"counters": counters, "deleted": deleted.to_string()}))
                .into_response()
        }
        Err(e) => error_response(e),
    }
}

fn refusal_response(refusal: &Refusal) -> Response {
    let body = format!("{}\n", refusal.message());
    match refusal {
        Refusal::Disabled(_) => (StatusCode::FORBIDDEN, body).into_response(),
        Refusal::Unauthenticated(_) => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            body,
        )
            .into_response(),
        Refusal::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, body).into_response(),
    }
}

fn error_response(error: LimitError) -> Response {
    match error {
        LimitError::InvalidRequest(message) => bad_request(message),
        LimitError::Store(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
    }
}

/// `domain=D&entry=KEY=VALUE&...` (percent-encoded, `+` a space) → the domain and one
/// descriptor of those entries, in order.
fn parse_query(query: &str) -> Result<(String, Descriptor), String> {
    let mut domain = None;
    let mut entries = Vec::new();
    for (name, value) in parameters(query, &["domain", "descriptor"])? {
        match name {
            "domain" => domain = Some(value),
            "entry" | "descriptor" => {
                let parts: Vec<&str> = if name == "entry" {
                    vec![value.as_str()]
                } else {
                    value.split(',').collect()
                };
                for part in parts {
                    if entries.len() == MAX_QUERY_ENTRIES {
                        return Err(format!("more than {MAX_QUERY_ENTRIES} entries"));
                    }
                    let (key, value) = part.split_once('=').ok_or_else(|| {
                        format!("{name} `{part}` is not KEY=VALUE (an empty value is KEY=)")
                    })?;
                    entries.push(Entry {
                        key: key.to_owned(),
                        value: value.to_owned(),
                    });
                }
            }
            other => {
                return Err(format!(
                    "unknown query parameter `{other}` (expected domain, and entry or descriptor)"
                ));
            }
        }
    }
    let domain = domain.ok_or("the query must name a domain: ?domain=D&entry=KEY=VALUE")?;
    if entries.is_empty() {
        return Err("the query must name the descriptor's entries: &entry=KEY=VALUE".into());
    }
    Ok((
        domain,
        Descriptor {
            entries,
            limit: None,
            hits: 0,
        },
    ))
}

/// A query's parameters in order, their values decoded. A parameter in `once` given twice is
/// an error naming it: keeping the last (or merging them) would answer for something the
/// caller did not ask about (`bucket=tenant=a&bucket=plan=free` is not the bucket
/// `tenant=a,plan=free`).
fn parameters<'q>(query: &'q str, once: &[&str]) -> Result<Vec<(&'q str, String)>, String> {
    let mut parameters: Vec<(&str, String)> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if once.contains(&name) && parameters.iter().any(|(seen, _)| *seen == name) {
            return Err(match name {
                "bucket" => "query parameter `bucket` is repeated: name one bucket, its pairs \
                             joined by commas (bucket=K=V,K2=V2)"
                    .to_owned(),
                "descriptor" => "query parameter `descriptor` is repeated: name one descriptor, \
                                 its entries joined by commas (descriptor=K=V,K2=V2)"
                    .to_owned(),
                _ => format!("query parameter `{name}` is repeated (it may occur once)"),
            });
        }
        parameters.push((name, percent_decode(value)?));
    }
    Ok(parameters)
}

pub(super) fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("bad percent-encoding in `{text}`"))?;
                out.push(hex);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| format!("`{text}` does not decode to UTF-8"))
}

/// The JSON form of an `Explain` answer (what `POST /explain` answers).
pub fn explain_json(answer: &proto::ExplainResponse) -> Value {
    json!({
        "domain": answer.domain,
        "domainFound": answer.domain_found,
        "descriptors": answer.descriptors.iter().map(explanation_json).collect::<Vec<_>>(),
    })
}

/// The JSON form of a `GetCounters` answer (what `GET /counters` answers).
pub fn counters_json(answer: &proto::CountersResponse) -> Value {
    json!({
        "explanation": answer.explanation.as_ref().map(explanation_json),
        "counters": answer.counters.iter().map(|c| json!({
            "limit": c.limit.as_ref().map(limit_json),
            "used": c.used.to_string(),
            "remaining": c.remaining.to_string(),
            "resetAfterMs": c.reset_after_ms.to_string(),
            "over": c.over,
            "overdraft": c.overdraft.to_string(),
            "degraded": c.degraded,
        })).collect::<Vec<_>>(),
        "store": answer.store,
    })
}

fn explanation_json(e: &proto::DescriptorExplanation) -> Value {
    json!({
        "outcome": e.outcome().as_str_name(),
        "reason": e.reason,
        "path": e.path.iter().map(|s| json!({
            "level": s.level,
            "key": s.key,
            "value": s.value,
            "kind": s.kind().as_str_name(),
            "pattern": s.pattern,
        })).collect::<Vec<_>>(),
        "rule": e.rule,
        "limits": e.limits.iter().map(limit_json).collect::<Vec<_>>(),
        "replacedBy": e.replaced_by,
        "shadowMode": e.shadow_mode,
        "quotaMode": e.quota_mode,
    })
}

fn limit_json(l: &proto::Limit) -> Value {
    json!({
        "requestsPerUnit": l.requests_per_unit,
        "unit": l.unit,
        "algorithm": l.algorithm,
        "burst": l.burst,
        "name": l.name,
        "consistency": l.consistency,
        "failureMode": l.failure_mode,
        "counter": l.counter,
        "storeKey": l.store_key,
        "overdraft": l.overdraft,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_names_a_domain_and_entries_in_order() {
        let (domain, d) =
            parse_query("domain=api&entry=api_key%3Dpartner-a&entry=path=%2Flogin+x&entry=k=")
                .unwrap();
        assert_eq!(domain, "api");
        let entries: Vec<(&str, &str)> = d
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect();
        assert_eq!(
            entries,
            [("api_key", "partner-a"), ("path", "/login x"), ("k", "")]
        );
        for bad in [
            "",
            "domain=api",
            "entry=k=v",
            "domain=api&entry=novalue",
            "domain=api&entry=k=%zz",
            "domain=api&entry=k=v&hits=3",
        ] {
            assert!(parse_query(bad).is_err(), "{bad}");
        }
        let (_, d) =
            parse_query("domain=api&descriptor=remote_address%3D10.0.0.7,path%3D%2Flogin").unwrap();
        assert_eq!(d.entries.len(), 2);
        assert_eq!(
            (d.entries[1].key.as_str(), d.entries[1].value.as_str()),
            ("path", "/login")
        );
        for (twice, name) in [
            ("domain=api&entry=k=v&domain=web", "domain"),
            ("domain=api&descriptor=a=1&descriptor=b=2", "descriptor"),
        ] {
            let error = parse_query(twice).unwrap_err();
            assert!(
                error.contains(&format!("query parameter `{name}` is repeated")),
                "{twice} → {error}"
            );
        }
        let many = format!("domain=d{}", "&entry=k=v".repeat(MAX_QUERY_ENTRIES + 1));
        assert!(parse_query(&many).unwrap_err().contains("more than"));
    }
}
