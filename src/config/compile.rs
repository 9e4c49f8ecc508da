//! Raw config files → [`Policy`], with every semantic check of DESIGN §2. All errors of a
//! load are collected; the policy is only returned when there are none.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use super::raw::{RawDescriptor, RawFile, RawRateLimit};
use super::{ConfigError, LoadOptions};
use crate::algorithm::Algorithm;
use crate::policy::{
    Children, Domain, KeyGroup, Level, MetaValue, Node, Pattern, Policy, Priorities, RateLimit,
    Rule, RuleLimit,
};
use crate::store::FailureMode;

/// Compiles parsed files, in order, into one policy.
pub fn compile(
    files: &[(String, RawFile)],
    options: LoadOptions,
) -> Result<Policy, Vec<ConfigError>> {
    let mut domains: HashMap<String, (Domain, &str)> = HashMap::new();
    let mut errors = Vec::new();
    for (file, raw) in files {
        let name = raw.domain.as_deref().unwrap_or_default();
        if name.is_empty() {
            errors.push(ConfigError::file(
                file,
                "config file cannot have empty domain",
            ));
            continue;
        }
        let domain = match domains.entry(name.to_owned()) {
            Entry::Occupied(existing) if !options.merge_domains => {
                errors.push(ConfigError::at_path(
                    file,
                    "domain",
                    format!(
                        "duplicate domain '{name}' in config file (also declared in {}; set MERGE_DOMAIN_CONFIG=true to merge)",
                        existing.get().1
                    ),
                ));
                continue;
            }
            Entry::Occupied(existing) => &mut existing.into_mut().0,
            Entry::Vacant(slot) => &mut slot.insert((Domain::default(), file)).0,
        };
        let mut cx = Cx {
            file,
            errors: &mut errors,
            shared: Vec::new(),
            failure_mode: None,
            levels: Vec::new(),
        };
        let file_mode = cx.failure_mode(raw.failure_mode.as_deref(), "failure_mode");
        if file_mode.is_some() {
            if domain.failure_mode.is_some_and(|m| Some(m) != file_mode) {
                cx.error(
                    "failure_mode",
                    format!("conflicting failure_mode for merged domain '{name}'"),
                );
            }
            domain.failure_mode = file_mode;
        }
        cx.failure_mode = domain.failure_mode;
        let descriptors = raw.descriptors.as_deref().unwrap_or_default();
        cx.level(&mut domain.children, descriptors, "descriptors", name);
    }
    if errors.is_empty() {
        Ok(Policy::new(
            domains
                .into_iter()
                .map(|(name, (d, _))| (name, d))
                .collect(),
        ))
    } else {
        Err(errors)
    }
}

/// Compilation context for one file.
struct Cx<'a> {
    file: &'a str,
    errors: &'a mut Vec<ConfigError>,
    /// `share_threshold` patterns of the levels above the current one.
    shared: Vec<Option<String>>,
    /// The failure mode in force at the current level (descriptor's, or the file's).
    failure_mode: Option<FailureMode>,
    /// The levels down to the current one.
    levels: Vec<Level>,
}

impl Cx<'_> {
    fn error(&mut self, path: &str, message: impl Into<String>) {
        self.errors
            .push(ConfigError::at_path(self.file, path, message));
    }

    /// Parses a `failure_mode` value, recording an error for a bad one.
    fn failure_mode(&mut self, value: Option<&str>, path: &str) -> Option<FailureMode> {
        let value = value?;
        let mode = [FailureMode::Allow, FailureMode::Deny, FailureMode::Local]
            .into_iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(value));
        if mode.is_none() {
            self.error(
                path,
                format!("invalid failure_mode '{value}' (expected allow, deny or local)"),
            );
        }
        mode
    }

    /// Compiles the descriptors of one level into `children`.
    fn level(
        &mut self,
        children: &mut Children,
        descriptors: &[RawDescriptor],
        path: &str,
        parent_key: &str,
    ) {
        for (i, raw) in descriptors.iter().enumerate() {
            let path = format!("{path}[{i}]");
            let key = raw.key.as_deref().unwrap_or_default();
            if key.is_empty() {
                self.error(&path, "descriptor has empty key");
                continue;
            }
            let value = raw.value.as_deref().filter(|v| !v.is_empty());
            let composite = match value {
                Some(value) => format!("{key}_{value}"),
                None => key.to_owned(),
            };
            let stats_key = format!("{parent_key}.{composite}");
            let pattern = value.and_then(Pattern::new);
            if raw.share_threshold && pattern.is_none() {
                self.error(
                    &format!("{path}.share_threshold"),
                    format!(
                        "share_threshold can only be used with wildcard values (containing '*'), but found key '{composite}'"
                    ),
                );
            }
            if let Some(metadata) = &raw.metadata
                && !(metadata.is_mapping() || metadata.is_null())
            {
                self.error(
                    &format!("{path}.metadata"),
                    "error parsing metadata: expected a mapping of keys to values",
                );
            }
            let group = children.by_key.entry(key.to_owned()).or_default();
            if is_taken(group, value, pattern.as_ref()) {
                self.error(
                    &path,
                    format!("duplicate descriptor composite key '{stats_key}'"),
                );
                continue;
            }

            let enclosing_mode = self.failure_mode;
            if let Some(mode) =
                self.failure_mode(raw.failure_mode.as_deref(), &format!("{path}.failure_mode"))
            {
                self.failure_mode = Some(mode);
            }
            self.levels.push(Level {
                key: key.to_owned(),
                value: value.map(str::to_owned),
                value_to_metric: raw.value_to_metric,
            });
            self.shared.push(
                pattern
                    .as_ref()
                    .filter(|_| raw.share_threshold)
                    .map(|p| p.as_str().to_owned()),
            );
            let mut node = Node {
                rule: self.rule(raw, &path, &stats_key),
                children: Children::default(),
            };
            let nested = raw.descriptors.as_deref().unwrap_or_default();
            self.level(
                &mut node.children,
                nested,
                &format!("{path}.descriptors"),
                &stats_key,
            );
            self.shared.pop();
            self.levels.pop();
            self.failure_mode = enclosing_mode;

            match (value, pattern) {
                (_, Some(pattern)) => group.wildcards.push((pattern, node)),
                (Some(value), None) => {
                    group.exact.insert(value.to_owned(), node);
                }
                (None, None) => group.any = Some(Box::new(node)),
            }
        }
    }

    /// Compiles a descriptor's `rate_limit:` or `rate_limits:`; `None` when it has neither or
    /// they are invalid (with every error recorded).
    fn rule(&mut self, descriptor: &RawDescriptor, path: &str, stats_key: &str) -> Option<Rule> {
        let errors_before = self.errors.len();
        let entries: Vec<(String, &RawRateLimit)> =
            match (&descriptor.rate_limit, &descriptor.rate_limits) {
                (None, None) => {
                    if descriptor.priorities.is_some() {
                        self.error(
                            &format!("{path}.priorities"),
                            "priorities without rate_limit or rate_limits",
                        );
                    }
                    return None;
                }
                (Some(_), Some(_)) => {
                    self.error(
                        path,
                        "rate_limit and rate_limits are mutually exclusive: use one",
                    );
                    return None;
                }
                (Some(one), None) => vec![(format!("{path}.rate_limit"), one)],
                (None, Some(many)) => {
                    if many.is_empty() {
                        self.error(
                            &format!("{path}.rate_limits"),
                            "rate_limits must not be empty",
                        );
                    }
                    many.iter()
                        .enumerate()
                        .map(|(i, rl)| (format!("{path}.rate_limits[{i}]"), rl))
                        .collect()
                }
            };
        let several = descriptor.rate_limits.is_some();

        let mut limits = Vec::new();
        let mut unlimited = false;
        let mut replaces = Vec::new();
        for (path, raw) in &entries {
            let name = raw.name.as_deref().filter(|n| !n.is_empty());
            if raw.unlimited {
                if several {
                    self.error(
                        path,
                        "unlimited is not allowed in rate_limits; use rate_limit",
                    );
                }
                if raw.unit.as_deref().is_some_and(|u| !u.is_empty()) {
                    self.error(path, "should not specify rate limit unit when unlimited");
                }
                if raw.algorithm.is_some() {
                    self.error(
                        &format!("{path}.algorithm"),
                        "should not specify an algorithm when unlimited",
                    );
                }
                if raw.burst.is_some() {
                    self.error(
                        &format!("{path}.burst"),
                        "should not specify burst when unlimited",
                    );
                }
                unlimited = true;
            } else if let Some(limit) = self.limit(raw, path, name) {
                if limits
                    .iter()
                    .any(|l: &RateLimit| l.unit == limit.unit && l.algorithm == limit.algorithm)
                {
                    self.error(
                        path,
                        format!(
                            "two rate_limits with unit {} and algorithm {}: the stricter one always decides; keep one",
                            limit.unit.proto_name(),
                            limit.algorithm.as_str()
                        ),
                    );
                }
                limits.push(limit);
            }
            for (i, entry) in raw.replaces.iter().flatten().enumerate() {
                let entry_path = format!("{path}.replaces[{i}]");
                match entry.name.as_deref().filter(|n| !n.is_empty()) {
                    None => self.error(&entry_path, "should not have an empty replaces entry"),
                    Some(n) if Some(n) == name => self.error(
                        &entry_path,
                        "replaces should not contain name of same descriptor",
                    ),
                    Some(n) => replaces.push(n.to_owned()),
                }
            }
        }

        let name = entries
            .iter()
            .find_map(|(_, raw)| raw.name.clone().filter(|n| !n.is_empty()));
        let priorities = self.priorities(descriptor, path, unlimited);
        (self.errors.len() == errors_before).then(|| Rule {
            stats_key: stats_key.to_owned(),
            limit: if unlimited {
                RuleLimit::Unlimited
            } else {
                RuleLimit::Limited(limits)
            },
            name,
            replaces,
            shadow_mode: descriptor.shadow_mode,
            quota_mode: descriptor.quota_mode,
            detailed_metric: descriptor.detailed_metric,
            value_to_metric: self.levels.iter().any(|l| l.value_to_metric),
            shared: self.shared.clone(),
            failure_mode: self.failure_mode,
            priorities,
            metadata: match descriptor.metadata.as_ref().map(MetaValue::from_yaml) {
                Some(MetaValue::Map(map)) if !map.is_empty() => Some(map),
                _ => None,
            },
            levels: self.levels.clone(),
        })
    }

    /// Checks and compiles `priorities:`.
    fn priorities(
        &mut self,
        descriptor: &RawDescriptor,
        path: &str,
        unlimited: bool,
    ) -> Option<Priorities> {
        let raw = descriptor.priorities.as_ref()?;
        let path = format!("{path}.priorities");
        if descriptor.value.as_deref().is_some_and(|v| !v.is_empty()) {
            self.error(
                &path,
                "priorities need a key-only descriptor (no value): the request's value names the priority class",
            );
        }
        if unlimited {
            self.error(&path, "priorities need a counted limit, not unlimited");
        }
        if raw.is_empty() {
            self.error(&path, "priorities must name at least one class");
        }
        for (class, share) in raw {
            if !(*share > 0.0 && *share <= 1.0) {
                self.error(
                    &format!("{path}.{class}"),
                    format!("priority share {share} is not in (0, 1]"),
                );
            }
        }
        Priorities::new(raw.iter().map(|(c, s)| (c.clone(), *s)).collect())
    }

    /// Compiles one counted limit; `None` (with errors recorded) when it is invalid.
    fn limit(&mut self, raw: &RawRateLimit, path: &str, name: Option<&str>) -> Option<RateLimit> {
        let unit_text = raw.unit.as_deref().unwrap_or_default();
        let unit = unit_text.parse().ok();
        if unit.is_none() {
            self.error(
                &format!("{path}.unit"),
                format!("invalid rate limit unit '{unit_text}'"),
            );
        }
        if raw.requests_per_unit.is_none() {
            self.error(
                path,
                "rate limit has no requests_per_unit (use 0 to reject everything, or unlimited: true)",
            );
        }
        let algorithm = match raw.algorithm.as_deref() {
            None => Some(Algorithm::FixedWindow),
            Some(text) => {
                let found = Algorithm::ALL
                    .into_iter()
                    .find(|a| a.as_str().eq_ignore_ascii_case(text));
                if found.is_none() {
                    self.error(
                        &format!("{path}.algorithm"),
                        format!(
                            "invalid algorithm '{text}' (expected fixed_window, sliding_window, token_bucket or concurrency)"
                        ),
                    );
                }
                found
            }
        };
        if let Some(burst) = raw.burst {
            if algorithm != Some(Algorithm::TokenBucket) {
                self.error(
                    &format!("{path}.burst"),
                    "burst is only valid with algorithm: token_bucket",
                );
            } else if burst == 0 {
                self.error(&format!("{path}.burst"), "burst must be at least 1");
            }
        }
        Some(RateLimit {
            requests_per_unit: raw.requests_per_unit?,
            unit: unit?,
            algorithm: algorithm?,
            burst: raw.burst,
            name: name.map(str::to_owned),
        })
    }
}

/// Whether a sibling with the same key already claims `value` (or "any value").
fn is_taken(group: &KeyGroup, value: Option<&str>, pattern: Option<&Pattern>) -> bool {
    match (value, pattern) {
        (_, Some(p)) => group.wildcards.iter().any(|(q, _)| q == p),
        (Some(v), None) => group.exact.contains_key(v),
        (None, None) => group.any.is_some(),
    }
}
