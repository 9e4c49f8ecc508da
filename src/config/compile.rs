//! Raw config files → [`Policy`], with every semantic check of DESIGN §2. All errors of a
//! load are collected; the policy is only returned when there are none.

mod rule;

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use super::raw::{RawDescriptor, RawFile};
use super::{ConfigError, LoadOptions};
use crate::policy::{Children, Domain, KeyGroup, Level, Node, Pattern, Policy};
use crate::store::{Consistency, FailureMode};

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
            consistency: None,
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
        let file_consistency = cx.consistency(raw.consistency.as_deref(), "consistency");
        if file_consistency.is_some() {
            if domain
                .consistency
                .is_some_and(|c| Some(c) != file_consistency)
            {
                cx.error(
                    "consistency",
                    format!("conflicting consistency for merged domain '{name}'"),
                );
            }
            domain.consistency = file_consistency;
        }
        cx.consistency = domain.consistency;
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
    /// The consistency in force at the current level (descriptor's, or the file's).
    consistency: Option<Consistency>,
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
        let mode = FailureMode::ALL
            .into_iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(value));
        if mode.is_none() {
            self.error(
                path,
                format!("invalid failure_mode '{value}' (expected allow, deny, local or envoy)"),
            );
        }
        mode
    }

    /// Parses a `consistency` value, recording an error for a bad one.
    fn consistency(&mut self, value: Option<&str>, path: &str) -> Option<Consistency> {
        let value = value?;
        let consistency = [Consistency::Exact, Consistency::Leased]
            .into_iter()
            .find(|c| c.as_str().eq_ignore_ascii_case(value));
        if consistency.is_none() {
            self.error(
                path,
                format!("invalid consistency '{value}' (expected exact or leased)"),
            );
        }
        consistency
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
                self.error(&format!("{path}.key"), "descriptor has empty key");
                continue;
            }
            let value = raw.value.as_deref().filter(|v| !v.is_empty());
            let composite = match value {
                Some(value) => format!("{key}_{value}"),
                None => key.to_owned(),
            };
            let stats_key = format!("{parent_key}.{composite}");
            let pattern = value.and_then(Pattern::new);
            self.check_descriptor(raw, &path, &composite, pattern.is_some());
            let group = children.by_key.entry(key.to_owned()).or_default();
            if is_taken(group, value, pattern.as_ref()) {
                self.error(
                    &path,
                    format!("duplicate descriptor composite key '{stats_key}'"),
                );
                continue;
            }
            let node = self.node(raw, &path, &stats_key, value, pattern.as_ref());
            match (value, pattern) {
                (_, Some(pattern)) => group.wildcards.push((pattern, node)),
                (Some(value), None) => {
                    group.exact.insert(value.to_owned(), node);
                }
                (None, None) => group.any = Some(Box::new(node)),
            }
        }
    }

    /// The checks of one descriptor's own fields that no other field depends on.
    fn check_descriptor(
        &mut self,
        raw: &RawDescriptor,
        path: &str,
        composite: &str,
        wildcard: bool,
    ) {
        if raw.share_threshold && !wildcard {
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
    }

    /// Compiles one descriptor and those nested in it, within the scope it opens: its level,
    /// its failure mode and its shared wildcard.
    fn node(
        &mut self,
        raw: &RawDescriptor,
        path: &str,
        stats_key: &str,
        value: Option<&str>,
        pattern: Option<&Pattern>,
    ) -> Node {
        let enclosing_mode = self.failure_mode;
        if let Some(mode) =
            self.failure_mode(raw.failure_mode.as_deref(), &format!("{path}.failure_mode"))
        {
            self.failure_mode = Some(mode);
        }
        let enclosing_consistency = self.consistency;
        if let Some(consistency) =
            self.consistency(raw.consistency.as_deref(), &format!("{path}.consistency"))
        {
            self.consistency = Some(consistency);
        }
        self.levels.push(Level {
            key: raw.key.clone().unwrap_or_default(),
            value: value.map(str::to_owned),
            value_to_metric: raw.value_to_metric,
        });
        self.shared.push(
            pattern
                .filter(|_| raw.share_threshold)
                .map(|p| p.as_str().to_owned()),
        );
        let mut node = Node {
            rule: self.rule(raw, path, stats_key),
            children: Children::default(),
        };
        let nested = raw.descriptors.as_deref().unwrap_or_default();
        self.level(
            &mut node.children,
            nested,
            &format!("{path}.descriptors"),
            stats_key,
        );
        self.shared.pop();
        self.levels.pop();
        self.failure_mode = enclosing_mode;
        self.consistency = enclosing_consistency;
        node
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
