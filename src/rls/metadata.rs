//! The reference service's `RESPONSE_DYNAMIC_METADATA`: a protobuf Struct Envoy stores as the
//! `envoy.filters.http.ratelimit` dynamic metadata (for access logs, later filters, Lua):
//!
//! ```text
//! domain: "api"
//! descriptors: [{entries: ["api_key=a"], limit: "requests_per_unit:10 unit:MINUTE", hitsAddend: 2,
//!                code: "OVER_LIMIT", limitName: "api.api_key"}]
//! hitsAddend: 3                      (the request's, when not 0)
//! metadata: {...}                    (merged `metadata` of the rules not over the limit)
//! ```
//!
//! Each descriptor's `code` (`OK`, `OVER_LIMIT`) and `limitName` (the rule that decided it:
//! its limit's `name:`, else its stats key; absent when no limit applied) are the fields the
//! reference is adding (envoyproxy/ratelimit#1239), so an access log can say which rule
//! refused a request.

use std::collections::{BTreeMap, HashMap};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};

use crate::limiter::{Code, DescriptorStatus};
use crate::policy::MetaValue;

/// What the Struct says about the request, taken before the request is converted.
pub struct RequestSummary {
    domain: String,
    descriptors: Vec<Value>,
    hits_addend: u32,
}

impl RequestSummary {
    /// Summarizes `request`.
    pub fn of(request: &RateLimitRequest) -> Self {
        let descriptors = request
            .descriptors
            .iter()
            .map(|d| {
                let mut fields = HashMap::new();
                let entries = d
                    .entries
                    .iter()
                    .map(|e| string(format!("{}={}", e.key, e.value)))
                    .collect();
                fields.insert("entries".to_owned(), list(entries));
                if let Some(limit) = &d.limit {
                    let unit = Unit::try_from(limit.unit).map_or("UNKNOWN", |u| u.as_str_name());
                    fields.insert(
                        "limit".to_owned(),
                        string(format!(
                            "requests_per_unit:{} unit:{unit}",
                            limit.requests_per_unit
                        )),
                    );
                }
                if let Some(hits) = &d.hits_addend {
                    fields.insert("hitsAddend".to_owned(), number(hits.value as f64));
                }
                structure(fields)
            })
            .collect();
        Self {
            domain: request.domain.clone(),
            descriptors,
            hits_addend: request.hits_addend,
        }
    }

    /// The dynamic metadata Struct, each descriptor with its status in `statuses` (in the
    /// request's order).
    pub fn into_struct(
        self,
        statuses: &[DescriptorStatus],
        metadata: Option<&BTreeMap<String, MetaValue>>,
    ) -> Struct {
        let mut fields = HashMap::new();
        fields.insert("domain".to_owned(), string(self.domain));
        let descriptors = self
            .descriptors
            .into_iter()
            .zip(statuses)
            .map(|(described, status)| with_status(described, status))
            .collect();
        fields.insert("descriptors".to_owned(), list(descriptors));
        if self.hits_addend != 0 {
            fields.insert("hitsAddend".to_owned(), number(f64::from(self.hits_addend)));
        }
        if let Some(metadata) = metadata {
            fields.insert(
                "metadata".to_owned(),
                meta(&MetaValue::Map(metadata.clone())),
            );
        }
        Struct { fields }
    }
}

/// A descriptor's Struct with its `code` and `limitName` added.
fn with_status(mut described: Value, status: &DescriptorStatus) -> Value {
    if let Some(Kind::StructValue(fields)) = &mut described.kind {
        let code = match status.code {
            Code::Ok => "OK",
            Code::OverLimit => "OVER_LIMIT",
        };
        fields
            .fields
            .insert("code".to_owned(), string(code.to_owned()));
        if let Some(rule) = &status.rule {
            fields
                .fields
                .insert("limitName".to_owned(), string(rule.clone()));
        }
    }
    described
}

fn meta(value: &MetaValue) -> Value {
    match value {
        MetaValue::Null => Value {
            kind: Some(Kind::NullValue(0)),
        },
        MetaValue::Bool(b) => Value {
            kind: Some(Kind::BoolValue(*b)),
        },
        MetaValue::Number(n) => number(*n),
        MetaValue::String(s) => string(s.clone()),
        MetaValue::List(items) => list(items.iter().map(meta).collect()),
        MetaValue::Map(map) => structure(map.iter().map(|(k, v)| (k.clone(), meta(v))).collect()),
    }
}

fn string(s: String) -> Value {
    Value {
        kind: Some(Kind::StringValue(s)),
    }
}

fn number(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

fn list(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

fn structure(fields: HashMap<String, Value>) -> Value {
    Value {
        kind: Some(Kind::StructValue(Struct { fields })),
    }
}
