//! The config files as written: serde structs in the reference format, plus the walk that
//! finds every unknown key of a file (serde stops at the first).

use serde::Deserialize;
use serde_yaml::Value;

/// One config file: one domain.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawFile {
    /// The config's name (Envoy Gateway writes one); named in error messages.
    #[serde(default)]
    pub name: Option<String>,
    /// The domain Envoy sends in `RateLimitRequest.domain`.
    #[serde(default)]
    pub domain: Option<String>,
    /// Top-level descriptors.
    #[serde(default)]
    pub descriptors: Option<Vec<RawDescriptor>>,
    /// What every rule of the domain answers while the store fails (Sluice extension).
    #[serde(default)]
    pub failure_mode: Option<String>,
    /// `exact` or `leased` for every rule of the domain that can lease (Sluice extension).
    #[serde(default)]
    pub consistency: Option<String>,
}

/// One descriptor node.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDescriptor {
    /// Entry key to match.
    #[serde(default)]
    pub key: Option<String>,
    /// Entry value to match; absent for "any value", `*` wildcards allowed.
    #[serde(default)]
    pub value: Option<String>,
    /// The limit for descriptors ending at this node.
    #[serde(default)]
    pub rate_limit: Option<RawRateLimit>,
    /// Several limits that must all pass (Sluice extension; excludes `rate_limit`).
    #[serde(default)]
    pub rate_limits: Option<Vec<RawRateLimit>>,
    /// Next level.
    #[serde(default)]
    pub descriptors: Option<Vec<RawDescriptor>>,
    /// Count and report, never reject.
    #[serde(default)]
    pub shadow_mode: bool,
    /// Over the limit only when every quota descriptor of a request is.
    #[serde(default)]
    pub quota_mode: bool,
    /// Metrics per runtime value.
    #[serde(default)]
    pub detailed_metric: bool,
    /// Runtime values of wildcard/key-only entries in metric names.
    #[serde(default)]
    pub value_to_metric: bool,
    /// `false`: the rule's limits stay out of the response headers and body Sluice writes
    /// (Sluice extension; default true).
    #[serde(default)]
    pub response_headers: Option<bool>,
    /// A wildcard value whose matches all share one counter.
    #[serde(default)]
    pub share_threshold: bool,
    /// Free-form operator metadata; kept out of matching, accepted for compatibility.
    #[serde(default)]
    pub metadata: Option<Value>,
    /// What this rule (and the rules nested below) answers while the store fails.
    #[serde(default)]
    pub failure_mode: Option<String>,
    /// `exact` or `leased`, for this rule and the rules nested below (Sluice extension).
    #[serde(default)]
    pub consistency: Option<String>,
    /// `region` (the default) or `global`: one budget for every region, for this rule
    /// (Sluice extension).
    #[serde(default)]
    pub scope: Option<String>,
    /// Priority load shedding: the share of the limit each value (class) may fill, on one
    /// counter shared by all classes (Sluice extension).
    #[serde(default)]
    pub priorities: Option<std::collections::BTreeMap<String, f64>>,
    /// The candidate limits its counts are measured against: `false`, or `from`, `to` and
    /// `steps_per_doubling` (Sluice extension).
    #[serde(default)]
    pub ladder: Option<Value>,
}

/// `rate_limit:` of a descriptor.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRateLimit {
    /// second | minute | hour | day | week | month | year, any case.
    #[serde(default)]
    pub unit: Option<String>,
    /// Hits per unit.
    #[serde(default)]
    pub requests_per_unit: Option<u64>,
    /// No limit at all.
    #[serde(default)]
    pub unlimited: bool,
    /// Name reported in `current_limit.name` and referenced by `replaces`.
    #[serde(default)]
    pub name: Option<String>,
    /// Names of limits this one replaces.
    #[serde(default)]
    pub replaces: Option<Vec<RawReplaces>>,
    /// fixed_window (default) | sliding_window | token_bucket | concurrency (Sluice extension).
    #[serde(default)]
    pub algorithm: Option<String>,
    /// Token bucket capacity (Sluice extension; default requests_per_unit).
    #[serde(default)]
    pub burst: Option<u64>,
    /// A usage budget: every charge counts, also past the limit (Sluice extension).
    #[serde(default)]
    pub overdraft: bool,
    /// The window is this many units (Sluice extension; default 1).
    #[serde(default)]
    pub unit_multiplier: Option<u32>,
}

/// The longest window a limit may have: 100 years (365-day years), so that every store's
/// arithmetic on window starts and ends stays exact (Redis's script computes in doubles).
pub const MAX_WINDOW_SECONDS: u64 = 100 * 365 * 86_400;

/// One `replaces:` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawReplaces {
    /// The replaced limit's `name`.
    #[serde(default)]
    pub name: Option<String>,
}

const FILE_KEYS: &[&str] = &[
    "name",
    "domain",
    "descriptors",
    "failure_mode",
    "consistency",
];
const DESCRIPTOR_KEYS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "rate_limits",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "response_headers",
    "share_threshold",
    "metadata",
    "failure_mode",
    "consistency",
    "scope",
    "priorities",
    "ladder",
];
const RATE_LIMIT_KEYS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "algorithm",
    "burst",
    "overdraft",
    "unit_multiplier",
];
const REPLACES_KEYS: &[&str] = &["name"];
const LADDER_KEYS: &[&str] = &["from", "to", "steps_per_doubling"];

/// A structural problem found by [`structure_errors`], in the reference's wording.
#[derive(Debug, PartialEq, Eq)]
pub struct StructureError {
    /// Path of the mapping or list item, e.g. `descriptors[0].rate_limit`.
    pub path: String,
    /// The unknown key, which is where the problem is in the text.
    pub key: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl StructureError {
    /// The path of the problem itself: the unknown key's, else [`StructureError::path`].
    pub fn field_path(&self) -> String {
        match &self.key {
            Some(key) => join(&self.path, key),
            None => self.path.clone(),
        }
    }
}

/// Every unknown key, non-string key and non-mapping list item of `root`, in document order.
pub fn structure_errors(root: &Value) -> Vec<StructureError> {
    let mut found = Vec::new();
    check_mapping(root, "", FILE_KEYS, &mut found);
    found
}

fn check_mapping(value: &Value, path: &str, known: &[&str], found: &mut Vec<StructureError>) {
    let Value::Mapping(map) = value else { return };
    for (key, child) in map {
        let name = match key {
            Value::String(s) => s.clone(),
            other => {
                found.push(StructureError {
                    path: path.to_owned(),
                    key: None,
                    message: format!("config error, key is not of type string: {}", render(other)),
                });
                continue;
            }
        };
        if !known.contains(&name.as_str()) {
            found.push(StructureError {
                path: path.to_owned(),
                key: Some(name.clone()),
                message: format!("config error, unknown key '{name}'"),
            });
            continue;
        }
        let child_path = join(path, &name);
        match name.as_str() {
            "descriptors" => check_list(child, &child_path, DESCRIPTOR_KEYS, found),
            "rate_limit" => check_mapping(child, &child_path, RATE_LIMIT_KEYS, found),
            "rate_limits" => check_list(child, &child_path, RATE_LIMIT_KEYS, found),
            "replaces" => check_list(child, &child_path, REPLACES_KEYS, found),
            "ladder" => check_mapping(child, &child_path, LADDER_KEYS, found),
            _ => {}
        }
    }
}

fn check_list(value: &Value, path: &str, known: &[&str], found: &mut Vec<StructureError>) {
    let Value::Sequence(items) = value else {
        return;
    };
    for (i, item) in items.iter().enumerate() {
        let item_path = format!("{path}[{i}]");
        if item.is_mapping() {
            check_mapping(item, &item_path, known, found);
        } else {
            found.push(StructureError {
                path: item_path,
                key: None,
                message: format!(
                    "config error, yaml file contains list of type other than map: {}",
                    render(item)
                ),
            });
        }
    }
}

/// A scalar or small node as YAML text, for messages.
fn render(value: &Value) -> String {
    serde_yaml::to_string(value)
        .map(|s| s.trim_end().to_owned())
        .unwrap_or_default()
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_unknown_key_with_its_path() {
        let yaml = "domain: d\nfoo: 1\ndescriptors:\n  - key: a\n    rate_limit: {unti: second, requests_per_unit: 1}\n    descriptors:\n      - key: b\n        shadowmode: true\n";
        let root: Value = serde_yaml::from_str(yaml).unwrap();
        let found = structure_errors(&root);
        let found: Vec<_> = found
            .iter()
            .map(|u| (u.path.as_str(), u.message.as_str()))
            .collect();
        assert_eq!(
            found,
            [
                ("", "config error, unknown key 'foo'"),
                (
                    "descriptors[0].rate_limit",
                    "config error, unknown key 'unti'"
                ),
                (
                    "descriptors[0].descriptors[0]",
                    "config error, unknown key 'shadowmode'"
                )
            ]
        );
    }

    #[test]
    fn list_items_must_be_mappings_and_keys_strings() {
        let root: Value =
            serde_yaml::from_str("domain: d\ndescriptors: [a, {key: b, 1: x}]\n").unwrap();
        let found: Vec<_> = structure_errors(&root)
            .into_iter()
            .map(|e| e.message)
            .collect();
        assert_eq!(
            found,
            [
                "config error, yaml file contains list of type other than map: a",
                "config error, key is not of type string: 1"
            ]
        );
    }
}
