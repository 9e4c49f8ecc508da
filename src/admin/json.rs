//! The proto3 JSON form of `RateLimitRequest` and `RateLimitResponse`, for `POST /json`.
//!
//! Field names are accepted in both spellings proto3 JSON allows (`hitsAddend` and
//! `hits_addend`); 64-bit integers as numbers or strings; enums by name or number. Unknown
//! fields are rejected, as proto3 JSON parsers do by default.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, rate_limit::Unit};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{Duration, UInt64Value};
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// A `RateLimitRequest` in proto3 JSON.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, rename = "hitsAddend", alias = "hits_addend")]
    hits_addend: Option<Number>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    #[serde(default, rename = "hitsAddend", alias = "hits_addend")]
    hits_addend: Option<Number>,
    #[serde(default, rename = "isNegativeHits", alias = "is_negative_hits")]
    is_negative_hits: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(default, rename = "requestsPerUnit", alias = "requests_per_unit")]
    requests_per_unit: Option<Number>,
    #[serde(default)]
    unit: Option<EnumValue>,
}

/// A proto3 JSON integer: a number or a decimal string.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Number {
    Int(u64),
    Text(String),
}

/// A proto3 JSON enum: its name or its number.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum EnumValue {
    Name(String),
    Int(i32),
}

impl Number {
    fn get(&self, field: &str) -> Result<u64, String> {
        match self {
            Number::Int(n) => Ok(*n),
            Number::Text(s) => s
                .parse()
                .map_err(|_| format!("{field}: '{s}' is not an unsigned integer")),
        }
    }
}

impl JsonRequest {
    /// The proto request this JSON describes.
    pub fn into_proto(self) -> Result<RateLimitRequest, String> {
        let hits_addend = match &self.hits_addend {
            Some(n) => u32::try_from(n.get("hitsAddend")?)
                .map_err(|_| "hitsAddend: out of range for uint32".to_owned())?,
            None => 0,
        };
        let descriptors = self
            .descriptors
            .into_iter()
            .enumerate()
            .map(|(i, d)| d.into_proto(i))
            .collect::<Result<_, _>>()?;
        Ok(RateLimitRequest {
            domain: self.domain,
            descriptors,
            hits_addend,
        })
    }
}

impl JsonDescriptor {
    fn into_proto(self, index: usize) -> Result<RateLimitDescriptor, String> {
        let field = |name: &str| format!("descriptors[{index}].{name}");
        let limit = self
            .limit
            .map(|o| {
                let requests_per_unit = match &o.requests_per_unit {
                    Some(n) => {
                        u32::try_from(n.get(&field("limit.requestsPerUnit"))?).map_err(|_| {
                            format!(
                                "{}: out of range for uint32",
                                field("limit.requestsPerUnit")
                            )
                        })?
                    }
                    None => 0,
                };
                let unit = match o.unit {
                    None => Unit::Unknown as i32,
                    Some(EnumValue::Int(n)) => n,
                    Some(EnumValue::Name(name)) => Unit::from_str_name(&name)
                        .ok_or_else(|| format!("{}: unknown unit '{name}'", field("limit.unit")))?
                        as i32,
                };
                Ok::<_, String>(rate_limit_descriptor::RateLimitOverride {
                    requests_per_unit,
                    unit,
                })
            })
            .transpose()?;
        let hits_addend = self
            .hits_addend
            .map(|n| {
                n.get(&field("hitsAddend"))
                    .map(|value| UInt64Value { value })
            })
            .transpose()?;
        Ok(RateLimitDescriptor {
            entries: self
                .entries
                .into_iter()
                .map(|e| rate_limit_descriptor::Entry {
                    key: e.key,
                    value: e.value,
                })
                .collect(),
            limit,
            hits_addend,
            is_negative_hits: self.is_negative_hits,
        })
    }
}

/// A `RateLimitResponse` in proto3 JSON.
pub fn response_to_json(response: &RateLimitResponse) -> Value {
    let mut out = Map::new();
    out.insert(
        "overallCode".into(),
        json!(code_name(response.overall_code)),
    );
    let statuses: Vec<Value> = response
        .statuses
        .iter()
        .map(|s| {
            let mut status = Map::new();
            status.insert("code".into(), json!(code_name(s.code)));
            if let Some(limit) = &s.current_limit {
                let mut l = Map::new();
                if !limit.name.is_empty() {
                    l.insert("name".into(), json!(limit.name));
                }
                l.insert("requestsPerUnit".into(), json!(limit.requests_per_unit));
                l.insert(
                    "unit".into(),
                    json!(Unit::try_from(limit.unit).map_or("UNKNOWN", |u| u.as_str_name())),
                );
                status.insert("currentLimit".into(), Value::Object(l));
            }
            status.insert("limitRemaining".into(), json!(s.limit_remaining));
            if let Some(d) = &s.duration_until_reset {
                status.insert("durationUntilReset".into(), json!(duration_json(d)));
            }
            Value::Object(status)
        })
        .collect();
    out.insert("statuses".into(), Value::Array(statuses));
    if !response.response_headers_to_add.is_empty() {
        let headers: Vec<Value> = response
            .response_headers_to_add
            .iter()
            .map(|h| json!({"key": h.key, "value": h.value}))
            .collect();
        out.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    Value::Object(out)
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name())
}

/// proto3 JSON duration: seconds with 0, 3, 6 or 9 fractional digits and an `s`.
fn duration_json(d: &Duration) -> String {
    let nanos = d.nanos.unsigned_abs();
    if nanos == 0 {
        format!("{}s", d.seconds)
    } else if nanos.is_multiple_of(1_000_000) {
        format!("{}.{:03}s", d.seconds, nanos / 1_000_000)
    } else if nanos.is_multiple_of(1_000) {
        format!("{}.{:06}s", d.seconds, nanos / 1_000)
    } else {
        format!("{}.{:09}s", d.seconds, nanos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_use_proto3_json_precision() {
        let d = |seconds, nanos| duration_json(&Duration { seconds, nanos });
        assert_eq!(d(42, 0), "42s");
        assert_eq!(d(0, 500_000_000), "0.500s");
        assert_eq!(d(1, 1_000), "1.000001s");
        assert_eq!(d(0, 1), "0.000000001s");
    }

    #[test]
    fn both_field_spellings_and_string_integers_are_accepted() {
        let camel: JsonRequest = serde_json::from_str(
            r#"{"domain":"d","hitsAddend":2,"descriptors":[{"entries":[{"key":"k","value":"v"}],"hitsAddend":"5","isNegativeHits":true}]}"#,
        )
        .unwrap();
        let proto = camel.into_proto().unwrap();
        assert_eq!(proto.hits_addend, 2);
        assert_eq!(
            proto.descriptors[0].hits_addend,
            Some(UInt64Value { value: 5 })
        );
        assert!(proto.descriptors[0].is_negative_hits);
        let snake: JsonRequest = serde_json::from_str(
            r#"{"domain":"d","hits_addend":3,"descriptors":[{"entries":[],"limit":{"requests_per_unit":4,"unit":"MINUTE"}}]}"#,
        )
        .unwrap();
        let proto = snake.into_proto().unwrap();
        assert_eq!(proto.hits_addend, 3);
        let limit = proto.descriptors[0].limit.unwrap();
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (4, Unit::Minute as i32)
        );
    }

    #[test]
    fn unknown_fields_and_units_are_errors() {
        assert!(serde_json::from_str::<JsonRequest>(r#"{"domain":"d","bogus":1}"#).is_err());
        let bad_unit: JsonRequest = serde_json::from_str(
            r#"{"domain":"d","descriptors":[{"limit":{"requestsPerUnit":1,"unit":"FORTNIGHT"}}]}"#,
        )
        .unwrap();
        assert_eq!(
            bad_unit.into_proto().unwrap_err(),
            "descriptors[0].limit.unit: unknown unit 'FORTNIGHT'"
        );
    }
}
