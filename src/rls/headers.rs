//! What a refused (or admitted) client is told, through `response_headers_to_add` and
//! `raw_body`, each part switchable by setting:
//!
//! - `Retry-After` (RFC 9110, whole seconds rounded up) on every OVER_LIMIT;
//! - the IETF draft-ietf-httpapi-ratelimit-headers-11 fields, as Structured Field lists with
//!   one item per quota that applied (load shedding limits are not quotas and are left out):
//!   `RateLimit-Policy: "name";q=100;w=60` and `RateLimit: "name";r=50;t=30`;
//! - the reference service's `LIMIT_RESPONSE_HEADERS_ENABLED` trio (limit, remaining, reset);
//! - an RFC 9457 `application/problem+json` body on OVER_LIMIT.

use std::fmt::Write as _;

use crate::algorithm::{Micros, SECOND};
use crate::limiter::{AppliedLimit, Code, Response};

/// Which parts of the answer to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseOptions {
    /// `Retry-After` on OVER_LIMIT.
    pub retry_after: bool,
    /// `RateLimit-Policy` and `RateLimit` on every answer with a counted limit.
    pub draft_headers: bool,
    /// The reference service's trio, with these header names.
    pub reference_headers: Option<ReferenceHeaders>,
    /// A problem+json body on OVER_LIMIT.
    pub problem_json: bool,
    /// The reference's `RESPONSE_DYNAMIC_METADATA` Struct on every answer.
    pub dynamic_metadata: bool,
}

impl Default for ResponseOptions {
    fn default() -> Self {
        Self {
            retry_after: true,
            draft_headers: false,
            reference_headers: None,
            problem_json: false,
            dynamic_metadata: false,
        }
    }
}

/// Names of the reference's three headers (`LIMIT_LIMIT_HEADER`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReferenceHeaders {
    /// Default `RateLimit-Limit`.
    pub limit: String,
    /// Default `RateLimit-Remaining`.
    pub remaining: String,
    /// Default `RateLimit-Reset`.
    pub reset: String,
}

/// The headers and body for `response`.
pub fn render(response: &Response, options: &ResponseOptions) -> (Vec<(String, String)>, Vec<u8>) {
    let mut headers = Vec::new();
    let over = response.code == Code::OverLimit;
    if over
        && options.retry_after
        && let Some(after) = response.retry_after()
    {
        headers.push(("retry-after".to_owned(), seconds(after).max(1).to_string()));
    }
    // The draft fields describe the client's quotas; load shedding limits are the service's
    // own capacity, not a quota to announce.
    let quotas: Vec<&AppliedLimit> = response.limits.iter().filter(|l| !l.shedding).collect();
    if options.draft_headers && !quotas.is_empty() {
        let (policy, state) = draft_fields(&quotas);
        headers.push(("ratelimit-policy".to_owned(), policy));
        headers.push(("ratelimit".to_owned(), state));
    }
    if let Some(names) = &options.reference_headers
        && let Some(chosen) = reference_choice(&response.limits)
    {
        headers.push((names.limit.clone(), chosen.quota.to_string()));
        headers.push((names.remaining.clone(), chosen.remaining.to_string()));
        headers.push((names.reset.clone(), seconds(chosen.reset_after).to_string()));
    }
    let mut body = Vec::new();
    if over && options.problem_json {
        body = problem(response).into_bytes();
        headers.push((
            "content-type".to_owned(),
            "application/problem+json".to_owned(),
        ));
    }
    (headers, body)
}

/// Whole seconds, rounded up.
fn seconds(micros: Micros) -> u64 {
    micros.div_ceil(SECOND)
}

/// `RateLimit-Policy` and `RateLimit` as Structured Field lists.
fn draft_fields(limits: &[&AppliedLimit]) -> (String, String) {
    let mut policy = String::new();
    let mut state = String::new();
    for (i, limit) in limits.iter().enumerate() {
        if i > 0 {
            policy.push_str(", ");
            state.push_str(", ");
        }
        let name = sf_string(&limit.policy);
        let _ = write!(policy, "{name};q={}", limit.quota);
        if let Some(window) = limit.window {
            let _ = write!(policy, ";w={}", seconds(window));
        }
        let _ = write!(
            state,
            "{name};r={};t={}",
            limit.remaining,
            seconds(limit.reset_after)
        );
    }
    (policy, state)
}

/// A Structured Field String: printable ASCII in quotes, `"` and `\` escaped; anything else
/// becomes `?` (policy names come from config files and are ASCII in practice).
fn sf_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

/// The reference's choice for its trio: the limit with the strictly lowest remaining (first
/// wins), replaced by any non-quota limit over the limit (last wins).
fn reference_choice(limits: &[AppliedLimit]) -> Option<&AppliedLimit> {
    let mut chosen: Option<&AppliedLimit> = None;
    for limit in limits {
        if chosen.is_none_or(|c| limit.remaining < c.remaining) {
            chosen = Some(limit);
        }
    }
    limits
        .iter()
        .rev()
        .find(|l| l.over && !l.quota_mode)
        .or(chosen)
}

/// An RFC 9457 problem document for a refusal.
fn problem(response: &Response) -> String {
    let violated: Vec<&AppliedLimit> = response.limits.iter().filter(|l| l.over).collect();
    let shedding = !violated.is_empty() && violated.iter().all(|l| l.shedding);
    let (status, title) = if shedding {
        (503, "Service Unavailable")
    } else {
        (429, "Too Many Requests")
    };
    let retry = response.retry_after().map(|m| seconds(m).max(1));
    let detail = match retry {
        Some(s) if shedding => format!("The service is shedding load; retry after {s} seconds."),
        Some(s) => format!("Rate limit exceeded; retry after {s} seconds."),
        None => "Rate limit exceeded.".to_owned(),
    };
    let mut doc = serde_json::json!({
        "type": "about:blank",
        "title": title,
        "status": status,
        "detail": detail,
        "violated-policies": violated.iter().map(|l| l.policy.as_str()).collect::<Vec<_>>(),
    });
    if let Some(s) = retry {
        doc["retry-after"] = s.into();
    }
    doc.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::DescriptorStatus;

    fn limit(policy: &str, quota: u64, remaining: u64, reset: Micros, over: bool) -> AppliedLimit {
        AppliedLimit {
            descriptor: 0,
            policy: policy.into(),
            quota,
            window: Some(60 * SECOND),
            remaining,
            reset_after: reset,
            over,
            quota_mode: false,
            shedding: false,
        }
    }

    fn response(code: Code, limits: Vec<AppliedLimit>) -> Response {
        let statuses = limits
            .iter()
            .map(|l| DescriptorStatus {
                code: if l.over { Code::OverLimit } else { Code::Ok },
                limit: None,
                rule: None,
                remaining: l.remaining as u32,
                reset_after: Some(l.reset_after),
                hidden: false,
            })
            .collect();
        Response {
            code,
            statuses,
            limits,
            metadata: None,
            store_call: None,
        }
    }

    fn all_on() -> ResponseOptions {
        ResponseOptions {
            retry_after: true,
            draft_headers: true,
            reference_headers: Some(ReferenceHeaders {
                limit: "RateLimit-Limit".into(),
                remaining: "RateLimit-Remaining".into(),
                reset: "RateLimit-Reset".into(),
            }),
            problem_json: true,
            dynamic_metadata: false,
        }
    }

    #[test]
    fn draft_fields_list_every_limit_as_structured_fields() {
        let r = response(
            Code::Ok,
            vec![
                limit("api_rps", 100, 50, 30 * SECOND, false),
                limit(r#"odd"name\"#, 5, 4, 1, false),
            ],
        );
        let (headers, body) = render(&r, &all_on());
        assert!(body.is_empty());
        let get = |k: &str| {
            headers
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(
            get("ratelimit-policy"),
            Some(r#""api_rps";q=100;w=60, "odd\"name\\";q=5;w=60"#)
        );
        assert_eq!(
            get("ratelimit"),
            Some(r#""api_rps";r=50;t=30, "odd\"name\\";r=4;t=1"#)
        );
        assert_eq!(get("retry-after"), None);
        // The trio shows the limit with the least remaining.
        assert_eq!(get("RateLimit-Remaining"), Some("4"));
    }

    #[test]
    fn refusals_carry_retry_after_the_trio_of_the_over_limit_and_a_problem() {
        let r = response(
            Code::OverLimit,
            vec![
                limit("a", 10, 0, 2_500_000, true),
                limit("b", 100, 0, 60 * SECOND, false),
            ],
        );
        let (headers, body) = render(&r, &all_on());
        let get = |k: &str| {
            headers
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("retry-after"), Some("3"));
        assert_eq!(get("RateLimit-Limit"), Some("10"));
        assert_eq!(get("RateLimit-Reset"), Some("3"));
        assert_eq!(get("content-type"), Some("application/problem+json"));
        let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(doc["status"], 429);
        assert_eq!(doc["violated-policies"], serde_json::json!(["a"]));
        assert_eq!(doc["retry-after"], 3);
    }

    #[test]
    fn shedding_refusals_are_503_problems() {
        let mut shed = limit("priority", 4, 0, SECOND, true);
        shed.shedding = true;
        let (_, body) = render(&response(Code::OverLimit, vec![shed]), &all_on());
        let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (doc["status"].as_u64(), doc["title"].as_str()),
            (Some(503), Some("Service Unavailable"))
        );
    }

    #[test]
    fn shedding_limits_are_not_announced_as_quotas() {
        let mut shed = limit("priority", 4, 2, SECOND, false);
        shed.shedding = true;
        let (headers, _) = render(&response(Code::Ok, vec![shed]), &all_on());
        assert!(
            headers.iter().all(|(n, _)| n != "ratelimit-policy"),
            "{headers:?}"
        );
    }

    #[test]
    fn by_default_only_retry_after() {
        let r = response(Code::OverLimit, vec![limit("a", 10, 0, SECOND, true)]);
        let (headers, body) = render(&r, &ResponseOptions::default());
        assert_eq!(headers, [("retry-after".to_owned(), "1".to_owned())]);
        assert!(body.is_empty());
    }
}
