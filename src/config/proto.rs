//! Rules pushed by an xDS control plane (`ratelimit.config.ratelimit.v3.RateLimitConfig`, as
//! Envoy Gateway sends them) → the same raw files the YAML loader produces, compiled by the
//! same checks. A resource's `name` stands where a file name would in errors.
//!
//! The proto has no place for Sluice's own rule fields: an xDS rule counts with a fixed window
//! and answers by the process's `FAILURE_MODE` while the store fails; the rules of the
//! domains the operator names (`XDS_USAGE_BUDGET_DOMAINS`) are usage budgets.

use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};

use super::raw::{RawDescriptor, RawFile, RawRateLimit, RawReplaces};
use super::{ConfigError, LoadOptions, MAX_NESTING};
use crate::policy::Policy;

/// Compiles every resource of one xDS response into one policy, or every error. The counted
/// rules of a domain in `budgets` (or of every domain, with `*`) are usage budgets.
pub fn compile_resources(
    configs: &[RateLimitConfig],
    options: LoadOptions,
    budgets: &[String],
) -> Result<Policy, Vec<ConfigError>> {
    let mut errors = Vec::new();
    let mut files = Vec::with_capacity(configs.len());
    for (i, config) in configs.iter().enumerate() {
        let name = if config.name.is_empty() {
            format!("resource[{i}]")
        } else {
            config.name.clone()
        };
        let budget = budgets.iter().any(|d| d == "*" || *d == config.domain);
        match raw_file(config, budget) {
            Ok(file) => files.push((name, file)),
            Err(message) => errors.push(ConfigError::file(&name, message)),
        }
    }
    super::compile_after(&files, errors, options)
}

fn raw_file(config: &RateLimitConfig, budget: bool) -> Result<RawFile, String> {
    Ok(RawFile {
        name: Some(config.name.clone()).filter(|n| !n.is_empty()),
        domain: Some(config.domain.clone()),
        descriptors: Some(descriptors(&config.descriptors, 1, budget)?),
        failure_mode: None,
        consistency: None,
    })
}

/// Descriptors at `depth` (1 for the top level), within the YAML loader's nesting bound.
fn descriptors(
    list: &[RateLimitDescriptor],
    depth: usize,
    budget: bool,
) -> Result<Vec<RawDescriptor>, String> {
    if !list.is_empty() && depth > MAX_NESTING {
        return Err(format!("descriptors nest deeper than {MAX_NESTING} levels"));
    }
    list.iter()
        .map(|d| {
            Ok(RawDescriptor {
                key: Some(d.key.clone()),
                value: Some(d.value.clone()).filter(|v| !v.is_empty()),
                rate_limit: d.rate_limit.as_ref().map(|p| rate_limit(p, budget)),
                rate_limits: None,
                descriptors: Some(descriptors(&d.descriptors, depth + 1, budget)?)
                    .filter(|n| !n.is_empty()),
                shadow_mode: d.shadow_mode,
                quota_mode: d.quota_mode,
                detailed_metric: d.detailed_metric,
                value_to_metric: false,
                response_headers: None,
                share_threshold: false,
                metadata: d.metadata.as_ref().map(|s| struct_value(s, 0)),
                failure_mode: None,
                consistency: None,
                scope: None,
                priorities: None,
                ladder: None,
            })
        })
        .collect()
}

fn rate_limit(policy: &RateLimitPolicy, budget: bool) -> RawRateLimit {
    // UNKNOWN is "no unit": how an `unlimited` policy arrives.
    let unit = match RateLimitUnit::try_from(policy.unit) {
        Ok(RateLimitUnit::Unknown) => None,
        Ok(unit) => Some(unit.as_str_name().to_ascii_lowercase()),
        Err(_) => Some(format!("unit number {}", policy.unit)),
    };
    RawRateLimit {
        unit,
        requests_per_unit: (!policy.unlimited).then_some(u64::from(policy.requests_per_unit)),
        unlimited: policy.unlimited,
        name: Some(policy.name.clone()).filter(|n| !n.is_empty()),
        replaces: (!policy.replaces.is_empty()).then(|| {
            policy
                .replaces
                .iter()
                .map(|r| RawReplaces {
                    name: Some(r.name.clone()),
                })
                .collect()
        }),
        algorithm: None,
        burst: None,
        overdraft: budget && !policy.unlimited,
        unit_multiplier: None,
    }
}

/// Most nesting of a metadata `Struct` kept; deeper values are dropped (the gRPC message
/// size already bounds the whole).
const MAX_METADATA_DEPTH: usize = 32;

fn struct_value(fields: &Struct, depth: usize) -> serde_yaml::Value {
    let mut map = serde_yaml::Mapping::new();
    for (key, value) in &fields.fields {
        map.insert(key.clone().into(), value_of(value, depth + 1));
    }
    serde_yaml::Value::Mapping(map)
}

fn value_of(value: &Value, depth: usize) -> serde_yaml::Value {
    if depth > MAX_METADATA_DEPTH {
        return serde_yaml::Value::Null;
    }
    match &value.kind {
        None | Some(Kind::NullValue(_)) => serde_yaml::Value::Null,
        Some(Kind::NumberValue(n)) => (*n).into(),
        Some(Kind::StringValue(s)) => s.clone().into(),
        Some(Kind::BoolValue(b)) => (*b).into(),
        Some(Kind::StructValue(s)) => struct_value(s, depth),
        Some(Kind::ListValue(list)) => serde_yaml::Value::Sequence(
            list.values.iter().map(|v| value_of(v, depth + 1)).collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitReplace;

    fn limit(unit: RateLimitUnit, requests: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit: requests,
            ..Default::default()
        })
    }

    /// The shape Envoy Gateway generates: a route descriptor whose value is the route, with
    /// nested `rule-N-match-M` descriptors.
    fn gateway_config() -> RateLimitConfig {
        RateLimitConfig {
            name: "default/eg/http".into(),
            domain: "default/eg/http".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "httproute/default/backend/rule/0/match/0/example_com".into(),
                value: "httproute/default/backend/rule/0/match/0/example_com".into(),
                descriptors: vec![
                    RateLimitDescriptor {
                        key: "rule-0-match-0".into(),
                        value: "rule-0-match-0".into(),
                        rate_limit: limit(RateLimitUnit::Hour, 3),
                        ..Default::default()
                    },
                    RateLimitDescriptor {
                        key: "rule-0-match-1".into(),
                        rate_limit: Some(RateLimitPolicy {
                            unlimited: true,
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn envoy_gateway_rules_compile_with_unlimited_as_unit_unknown() {
        let policy = compile_resources(&[gateway_config()], LoadOptions::default(), &[]).unwrap();
        let text = policy.dump();
        assert!(text.contains("rule-0-match-0"), "{text}");
        assert!(text.contains("unit=HOUR requests_per_unit=3"), "{text}");
    }

    #[test]
    fn errors_name_the_resource_and_every_problem() {
        let mut bad = gateway_config();
        bad.descriptors[0].descriptors[0].rate_limit = limit(RateLimitUnit::Unknown, 3);
        bad.descriptors[0].descriptors[1].rate_limit = Some(RateLimitPolicy {
            unit: RateLimitUnit::Minute as i32,
            requests_per_unit: 1,
            name: "a".into(),
            replaces: vec![RateLimitReplace { name: "a".into() }],
            ..Default::default()
        });
        let empty = RateLimitConfig::default();
        let errors = compile_resources(&[bad, empty], LoadOptions::default(), &[]).unwrap_err();
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert!(
            text.iter()
                .all(|e| e.starts_with("default/eg/http") || e.starts_with("resource[1]")),
            "{text:?}"
        );
        assert!(text.len() >= 3, "{text:?}");
    }
}
