//! Proto ⇄ domain conversions for the Envoy rate limit API.
//!
//! The only bad requests the limiter cannot see are proto-specific (an override unit that is
//! `UNKNOWN` or not a unit at all); they are rejected here with INVALID_ARGUMENT.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    self, DescriptorStatus, RateLimit, rate_limit::Unit as ProtoUnit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration;

use super::headers::{self, ResponseOptions};
use crate::algorithm::{Micros, SECOND};
use crate::limiter::{self, Code, Descriptor, Entry, LimitOverride};
use crate::policy::Unit;

/// The entries of `request`'s descriptors, `k=v,k2=v2 | k3=v3` (for traces that ask for
/// values). At most the first 64 descriptors and 16 entries of each are written.
pub fn describe_values(request: &RateLimitRequest) -> String {
    let descriptors: Vec<String> = request
        .descriptors
        .iter()
        .take(64)
        .map(|d| {
            let entries: Vec<String> = d
                .entries
                .iter()
                .take(16)
                .map(|e| format!("{}={}", e.key, e.value))
                .collect();
            entries.join(",")
        })
        .collect();
    descriptors.join(" | ")
}

/// Converts a proto request; `Err` carries the INVALID_ARGUMENT message.
pub fn request_from_proto(request: RateLimitRequest) -> Result<limiter::Request, String> {
    // The request-level hits_addend applies where a descriptor has none; 0 means 1.
    let default_hits = u64::from(request.hits_addend.max(1));
    let descriptors = request
        .descriptors
        .into_iter()
        .enumerate()
        .map(|(i, d)| descriptor_from_proto(i, d, default_hits))
        .collect::<Result<_, _>>()?;
    Ok(limiter::Request {
        domain: request.domain,
        descriptors,
    })
}

fn descriptor_from_proto(
    index: usize,
    descriptor: RateLimitDescriptor,
    default_hits: u64,
) -> Result<Descriptor, String> {
    let limit = descriptor
        .limit
        .map(|o| {
            let unit = ProtoUnit::try_from(o.unit)
                .ok()
                .and_then(unit_from_proto)
                .ok_or_else(|| {
                    let name = ProtoUnit::try_from(o.unit)
                        .map_or_else(|_| o.unit.to_string(), |u| u.as_str_name().to_owned());
                    format!("rate limit descriptor {index}: limit override has invalid unit {name}")
                })?;
            Ok::<_, String>(LimitOverride {
                requests_per_unit: o.requests_per_unit,
                unit,
            })
        })
        .transpose()?;
    // A per-descriptor hits_addend wins when present, including 0 (check without charging).
    let hits = descriptor.hits_addend.map_or(default_hits, |h| h.value);
    let hits = i64::try_from(hits).unwrap_or(i64::MAX);
    Ok(Descriptor {
        entries: descriptor
            .entries
            .into_iter()
            .map(|e| Entry {
                key: e.key,
                value: e.value,
            })
            .collect(),
        limit,
        hits: if descriptor.is_negative_hits {
            -hits
        } else {
            hits
        },
    })
}

/// Converts the limiter's answer to the proto response, with the headers and body that
/// `options` asks for (see [`super::headers`]).
pub fn response_to_proto(
    response: &limiter::Response,
    options: &ResponseOptions,
) -> RateLimitResponse {
    let (headers, raw_body) = headers::render(response, options);
    RateLimitResponse {
        overall_code: code_to_proto(response.code) as i32,
        statuses: response.statuses.iter().map(status_to_proto).collect(),
        response_headers_to_add: headers
            .into_iter()
            .map(|(key, value)| HeaderValue {
                key,
                value,
                ..Default::default()
            })
            .collect(),
        raw_body,
        ..Default::default()
    }
}

fn status_to_proto(status: &limiter::DescriptorStatus) -> DescriptorStatus {
    DescriptorStatus {
        code: code_to_proto(status.code) as i32,
        current_limit: status.limit.as_ref().map(|l| RateLimit {
            name: l.name.clone().unwrap_or_default(),
            requests_per_unit: l.requests_per_unit,
            unit: unit_to_proto(l.unit) as i32,
        }),
        limit_remaining: status.remaining,
        duration_until_reset: status
            .reset_after
            .map(|micros| whole_seconds(micros, status.code == Code::OverLimit)),
        quota: None,
    }
}

fn code_to_proto(code: Code) -> rate_limit_response::Code {
    match code {
        Code::Ok => rate_limit_response::Code::Ok,
        Code::OverLimit => rate_limit_response::Code::OverLimit,
    }
}

/// Microseconds as whole seconds, rounded up, as the reference sends them (`unit - now %
/// unit`): Envoy's `X-RateLimit-Reset` reads only the seconds, so a fraction would make it say
/// a second less, and 0 during a window's last second. A refusal says 1 at least, as its
/// `retry-after` does.
pub(crate) fn whole_seconds(micros: Micros, over: bool) -> Duration {
    let seconds = micros.div_ceil(SECOND) as i64;
    Duration {
        seconds: if over { seconds.max(1) } else { seconds },
        nanos: 0,
    }
}

/// Microseconds as a protobuf Duration.
pub fn duration_to_proto(micros: Micros) -> Duration {
    Duration {
        seconds: (micros / SECOND) as i64,
        nanos: ((micros % SECOND) * 1_000) as i32,
    }
}

fn unit_from_proto(unit: ProtoUnit) -> Option<Unit> {
    Some(match unit {
        ProtoUnit::Unknown => return None,
        ProtoUnit::Second => Unit::Second,
        ProtoUnit::Minute => Unit::Minute,
        ProtoUnit::Hour => Unit::Hour,
        ProtoUnit::Day => Unit::Day,
        ProtoUnit::Week => Unit::Week,
        ProtoUnit::Month => Unit::Month,
        ProtoUnit::Year => Unit::Year,
    })
}

/// The proto enum of a unit.
pub fn unit_to_proto(unit: Unit) -> ProtoUnit {
    match unit {
        Unit::Second => ProtoUnit::Second,
        Unit::Minute => ProtoUnit::Minute,
        Unit::Hour => ProtoUnit::Hour,
        Unit::Day => ProtoUnit::Day,
        Unit::Week => ProtoUnit::Week,
        Unit::Month => ProtoUnit::Month,
        Unit::Year => ProtoUnit::Year,
    }
}
