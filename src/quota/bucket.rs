//! Bucket ids: checked, made canonical, and matched to a rule of the policy in force, which
//! says what the bucket gets.
//!
//! A bucket id is an unordered map; its pairs are a descriptor's entries in the order the
//! domain's descriptor tree has them ([`Domain::find_unordered`](crate::policy::Domain)).

use std::collections::HashMap;

use crate::algorithm::SECOND;
use crate::policy::{Policy, RuleLimit};

use super::share::Budget;

/// Most pairs in a bucket id.
pub const MAX_PAIRS: usize = 16;
/// Most bytes of a bucket id's keys and values together.
pub const MAX_ID_BYTES: usize = 1024;

/// Why a bucket of a report was skipped (one bad bucket never fails the stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// No `bucket_id`, or one without pairs.
    Empty,
    /// More than [`MAX_PAIRS`] pairs, or more than [`MAX_ID_BYTES`] bytes.
    TooLarge,
    /// A pair with an empty key.
    EmptyKey,
}

impl Rejected {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Rejected::Empty => "empty_bucket_id",
            Rejected::TooLarge => "bucket_id_too_large",
            Rejected::EmptyKey => "empty_key",
        }
    }
}

/// A checked bucket id: its pairs sorted by key, and the text they make (the id's identity
/// on this stream).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BucketKey {
    /// `key=value` pairs, sorted, each part prefixed by its length (unambiguous).
    text: String,
    pairs: Vec<(String, String)>,
}

impl BucketKey {
    /// Checks `bucket` and makes it canonical.
    pub fn new(bucket: &HashMap<String, String>) -> Result<Self, Rejected> {
        if bucket.is_empty() {
            return Err(Rejected::Empty);
        }
        let bytes: usize = bucket.iter().map(|(k, v)| k.len() + v.len()).sum();
        if bucket.len() > MAX_PAIRS || bytes > MAX_ID_BYTES {
            return Err(Rejected::TooLarge);
        }
        if bucket.keys().any(String::is_empty) {
            return Err(Rejected::EmptyKey);
        }
        let mut pairs: Vec<(String, String)> =
            bucket.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        pairs.sort_unstable();
        let mut text = String::with_capacity(bytes + 8 * pairs.len());
        for (k, v) in &pairs {
            use std::fmt::Write as _;
            let _ = write!(text, "{}:{k}={}:{v};", k.len(), v.len());
        }
        Ok(Self { text, pairs })
    }

    /// The canonical text.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The pairs, sorted by key.
    pub fn pairs(&self) -> &[(String, String)] {
        &self.pairs
    }

    /// The id as a map again, for the answer.
    pub fn to_map(&self) -> HashMap<String, String> {
        self.pairs.iter().cloned().collect()
    }
}

/// What a bucket gets under the policy in force.
#[derive(Debug, Clone, PartialEq)]
pub enum Quota {
    /// Nothing limits it: an unknown domain, no rule, a whitelisted descriptor, `unlimited`,
    /// or only concurrency limits (which a token bucket cannot enforce).
    AllowAll {
        /// The rule's stats key, when a rule matched.
        rule: Option<String>,
    },
    /// A limit of 0.
    DenyAll {
        /// The rule's stats key.
        rule: String,
    },
    /// A budget divided among the Envoys by demand.
    Divided {
        /// The rule's stats key.
        rule: String,
        /// The whole fleet's budget.
        budget: Budget,
        /// Shadow mode: ALLOW_ALL is assigned, and what the budget would have denied is
        /// counted.
        shadow: bool,
    },
}

impl Quota {
    /// Whether the budget is divided among the Envoys (shadow mode included).
    pub fn is_divided(&self) -> bool {
        matches!(self, Quota::Divided { .. })
    }

    /// The rule's stats key, if a rule matched.
    pub fn rule(&self) -> Option<&str> {
        match self {
            Quota::AllowAll { rule } => rule.as_deref(),
            Quota::DenyAll { rule } | Quota::Divided { rule, .. } => Some(rule),
        }
    }

    /// What `key` in `domain` gets under `policy` (`shadow`: the process's global shadow
    /// mode).
    pub fn of(policy: &Policy, domain: &str, key: &BucketKey, shadow: bool) -> Quota {
        let Some(found) = policy.domain(domain) else {
            return Quota::AllowAll { rule: None };
        };
        let pairs: Vec<(&str, &str)> = key
            .pairs()
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let Some((_, rule)) = found.find_unordered(&pairs) else {
            return Quota::AllowAll { rule: None };
        };
        let name = rule.stats_key.clone();
        let RuleLimit::Limited(limits) = &rule.limit else {
            return Quota::AllowAll { rule: Some(name) };
        };
        let counted: Vec<_> = limits.iter().filter(|l| l.algorithm.divisible()).collect();
        if counted.is_empty() {
            return Quota::AllowAll { rule: Some(name) };
        }
        if counted.iter().any(|l| l.requests_per_unit == 0) && !(shadow || rule.shadow_mode) {
            return Quota::DenyAll { rule: name };
        }
        // Several limits: the slowest refill and the smallest burst, which stays within each.
        let budget = counted
            .iter()
            .map(|l| {
                let burst = l.capacity();
                Budget {
                    rate: l.requests_per_unit,
                    burst,
                    window: (l.window() / SECOND).max(1),
                }
            })
            .reduce(|a, b| {
                let slower =
                    if (a.rate as f64 / a.window as f64) <= (b.rate as f64 / b.window as f64) {
                        a
                    } else {
                        b
                    };
                Budget {
                    burst: a.burst.min(b.burst),
                    ..slower
                }
            })
            .expect("at least one limit");
        Quota::Divided {
            rule: name,
            budget,
            shadow: shadow || rule.shadow_mode,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(pairs: &[(&str, &str)]) -> BucketKey {
        let map = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        BucketKey::new(&map).unwrap()
    }

    const RULES: &str = "domain: rq\ndescriptors:\n  - key: tenant\n    descriptors:\n      - key: path\n        value: /login\n        rate_limit: {unit: minute, requests_per_unit: 10}\n  - key: bucket\n    value: open\n    rate_limit: {unlimited: true}\n  - key: bucket\n    value: closed\n    rate_limit: {unit: second, requests_per_unit: 0}\n  - key: bucket\n    rate_limit: {unit: second, requests_per_unit: 5}\n    shadow_mode: true\n";

    #[test]
    fn pairs_in_any_order_find_the_rule_in_the_tree_order() {
        let policy = crate::config::policy_for_tests(RULES);
        let quota = Quota::of(
            &policy,
            "rq",
            &key(&[("path", "/login"), ("tenant", "a")]),
            false,
        );
        let Quota::Divided {
            rule,
            budget,
            shadow,
        } = quota
        else {
            panic!("{quota:?}")
        };
        assert_eq!(rule, "rq.tenant.path_/login");
        assert_eq!((budget.rate, budget.burst, budget.window), (10, 10, 60));
        assert!(!shadow);
    }

    #[test]
    fn unlimited_zero_shadow_and_unknown_buckets_get_their_answers() {
        let policy = crate::config::policy_for_tests(RULES);
        let of =
            |pairs: &[(&str, &str)], domain: &str| Quota::of(&policy, domain, &key(pairs), false);
        assert!(matches!(
            of(&[("bucket", "open")], "rq"),
            Quota::AllowAll { rule: Some(_) }
        ));
        assert!(matches!(
            of(&[("bucket", "closed")], "rq"),
            Quota::DenyAll { .. }
        ));
        assert!(matches!(
            of(&[("bucket", "x")], "rq"),
            Quota::Divided { shadow: true, .. }
        ));
        assert_eq!(
            of(&[("nothing", "x")], "rq"),
            Quota::AllowAll { rule: None }
        );
        assert_eq!(
            of(&[("bucket", "x")], "other"),
            Quota::AllowAll { rule: None }
        );
        // A pair too many reaches no rule.
        assert_eq!(
            of(&[("bucket", "x"), ("more", "y")], "rq"),
            Quota::AllowAll { rule: None }
        );
    }

    #[test]
    fn bad_ids_are_refused_with_a_reason() {
        assert_eq!(BucketKey::new(&HashMap::new()), Err(Rejected::Empty));
        let big: HashMap<String, String> = (0..17).map(|i| (format!("k{i}"), "v".into())).collect();
        assert_eq!(BucketKey::new(&big), Err(Rejected::TooLarge));
        let long: HashMap<String, String> = [("k".into(), "v".repeat(2000))].into();
        assert_eq!(BucketKey::new(&long), Err(Rejected::TooLarge));
        let empty: HashMap<String, String> = [(String::new(), "v".into())].into();
        assert_eq!(BucketKey::new(&empty), Err(Rejected::EmptyKey));
        // Pairs that would join the same way stay apart.
        assert_ne!(key(&[("a", "b=c")]), key(&[("a=b", "c")]));
    }
}
