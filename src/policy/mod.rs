//! The compiled, immutable rate limit policy: every domain's descriptor tree, indexed for
//! matching. Built once per config load by [`crate::config`]; the hot path only reads it
//! through an `Arc<Policy>`.

mod matcher;
mod metadata;
pub use matcher::{EntryRef, StepKind, TraceEnd, UNORDERED_STEPS};
pub use metadata::{MetaValue, merge_into};
mod ladder;
pub use ladder::{Ladder, LadderChoice, MAX_RUNGS, ratio_label};
mod pattern;
mod unit;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

pub use pattern::Pattern;
pub use unit::Unit;

use crate::algorithm::{self, Algorithm};
use crate::store::{Consistency, FailureMode};

/// All loaded domains.
#[derive(Debug, Default)]
pub struct Policy {
    domains: HashMap<String, Domain>,
}

/// One domain: the top level of its descriptor tree.
#[derive(Debug, Default)]
pub struct Domain {
    pub(crate) children: Children,
    /// The file's `failure_mode`, for rules without their own and for request overrides.
    pub failure_mode: Option<FailureMode>,
    /// The file's `consistency`, for rules without their own and for request overrides.
    pub consistency: Option<Consistency>,
}

/// One level of a descriptor tree: the children of a node, grouped by entry key.
#[derive(Debug, Default)]
pub(crate) struct Children {
    pub(crate) by_key: HashMap<String, KeyGroup>,
}

/// The children of one node that share an entry key.
#[derive(Debug, Default)]
pub(crate) struct KeyGroup {
    /// Children with an exact `value`.
    pub(crate) exact: HashMap<String, Node>,
    /// Children whose `value` contains `*`, in config order (the first match wins).
    pub(crate) wildcards: Vec<(Pattern, Node)>,
    /// The child without a `value`: matches any value, one counter per value.
    pub(crate) any: Option<Box<Node>>,
}

/// A descriptor node: an optional rule and the next level.
#[derive(Debug, Default)]
pub(crate) struct Node {
    pub(crate) rule: Option<Rule>,
    pub(crate) children: Children,
}

/// A matched node's rate limit rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// The reference's stats key, e.g. `domain.key1_value1.key2`; names the rule in
    /// `/rlconfig`, logs and metrics.
    pub stats_key: String,
    /// What is enforced: counted limits (all must pass), or nothing at all (`unlimited`).
    pub limit: RuleLimit,
    /// `name` of the rate limit (the first named one of `rate_limits`), used by `replaces`.
    pub name: Option<String>,
    /// Names of other rules that this rule replaces when both match one request.
    pub replaces: Vec<String>,
    /// Count and report, never reject.
    pub shadow_mode: bool,
    /// Quota mode: the request is only over the limit when every quota descriptor is.
    pub quota_mode: bool,
    /// `detailed_metric`: metrics per runtime value (bounded; see the metrics docs).
    pub detailed_metric: bool,
    /// Whether the rule's limits appear in the response headers and body Sluice writes
    /// (`response_headers: false` keeps a limit that protects the service unadvertised).
    pub response_headers: bool,
    /// Whether some level on the path to this rule has `value_to_metric` (see [`Level`]):
    /// its series then carry runtime values.
    pub value_to_metric: bool,
    /// Per descriptor level on the path to this rule: the wildcard pattern when that level
    /// has `share_threshold: true` (all matching values share one counter), else `None`.
    pub shared: Vec<Option<String>>,
    /// What to answer while the store fails: the rule's own (or an enclosing descriptor's)
    /// `failure_mode`, else the domain's; `None` for the process default.
    pub failure_mode: Option<FailureMode>,
    /// `exact` or `leased`: the rule's own (or an enclosing descriptor's) `consistency`, else
    /// the domain's; `None` for the process default. Concurrency limits are always exact.
    pub consistency: Option<Consistency>,
    /// `scope: global`: one budget for every region, leased through each region's pool
    /// from a root counter (always leased).
    pub global: bool,
    /// Priority load shedding: one counter for every value of the last entry, which names
    /// the priority class.
    pub priorities: Option<Priorities>,
    /// The descriptor's `metadata` mapping, for the response's dynamic metadata.
    pub metadata: Option<BTreeMap<String, MetaValue>>,
    /// The levels on the path to this rule, from the domain down. Metrics name series from
    /// them.
    pub levels: Vec<Level>,
    /// The candidate limits its counts are measured against (`ladder:`).
    pub ladder: LadderChoice,
}

/// One level of the descriptor tree on the path to a rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Level {
    /// The entry key.
    pub key: String,
    /// The configured value (exact or wildcard); `None` for a key-only level.
    pub value: Option<String>,
    /// `value_to_metric` on this level: metric series name it by the runtime value where the
    /// configuration has none (key-only) or a pattern (wildcard), as the reference does for
    /// each level that sets it.
    pub value_to_metric: bool,
}

/// The share of a limit each priority class may fill (`priorities:`), all on one counter:
/// a class with share 0.5 is admitted only while the shared count is under half the limit,
/// so the top of the capacity stays for the classes with larger shares.
#[derive(Debug, Clone, PartialEq)]
pub struct Priorities {
    shares: HashMap<String, f64>,
    lowest: f64,
}

impl Priorities {
    /// Priorities from `(class, share)` pairs, every share in (0, 1]; `None` when empty.
    pub fn new(shares: HashMap<String, f64>) -> Option<Self> {
        let lowest = shares.values().copied().fold(f64::INFINITY, f64::min);
        (!shares.is_empty()).then_some(Self { shares, lowest })
    }

    /// The share of `class`; a class the config does not name gets the lowest share, so an
    /// unexpected value can never take capacity kept for named classes.
    pub fn share(&self, class: &str) -> f64 {
        self.shares.get(class).copied().unwrap_or(self.lowest)
    }

    /// `limit` as seen by `class`: the share applies to the count (token bucket: to the
    /// burst; the refill rate is the same for everyone).
    pub fn limit_for(&self, class: &str, limit: &RateLimit) -> RateLimit {
        let share = self.share(class);
        let scale = |n: u64| (n as f64 * share).floor() as u64;
        let mut scaled = limit.clone();
        if limit.algorithm.refills() {
            scaled.burst = Some(scale(limit.capacity()));
        } else {
            scaled.requests_per_unit = scale(limit.requests_per_unit);
        }
        scaled
    }
}

/// The limit a rule enforces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleLimit {
    /// `unlimited: true`: always OK, nothing counted.
    Unlimited,
    /// One limit (`rate_limit`) or several (`rate_limits`), all of which must pass.
    Limited(Vec<RateLimit>),
}

/// The largest `requests_per_unit` (and `burst`): 2^53 - 1, the largest integer that every
/// store computes with exactly (Redis's scripts compute in doubles). Counts may pass it (a
/// usage budget's overdraft); they stay exact in both stores up to 2^64 - 1 and saturate there.
pub const MAX_LIMIT: u64 = (1 << 53) - 1;

/// `requests_per_unit` per `unit`, enforced by `algorithm`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RateLimit {
    /// Hits per unit; 0 means always over the limit; at most [`MAX_LIMIT`].
    pub requests_per_unit: u64,
    /// The window length (concurrency: the safety TTL of a counter).
    pub unit: Unit,
    /// The algorithm enforcing it.
    pub algorithm: Algorithm,
    /// Token bucket capacity; `None` for `requests_per_unit`.
    pub burst: Option<u64>,
    /// A usage budget (see [`algorithm::Limit::overdraft`]).
    pub overdraft: bool,
    /// The window is this many units (at least 1).
    pub unit_multiplier: u32,
    /// Reported in `current_limit.name`.
    pub name: Option<String>,
}

impl RateLimit {
    /// A fixed-window limit without a name (e.g. a request's override).
    pub fn fixed(requests_per_unit: u64, unit: Unit) -> Self {
        Self {
            requests_per_unit,
            unit,
            algorithm: Algorithm::FixedWindow,
            burst: None,
            overdraft: false,
            unit_multiplier: 1,
            name: None,
        }
    }

    /// The window's length: `unit_multiplier` units (concurrency: the counter's TTL).
    pub fn window(&self) -> algorithm::Micros {
        self.unit.window() * u64::from(self.unit_multiplier)
    }

    /// The window as a config names it: `MINUTE`, or `MINUTE x 5`.
    pub fn window_name(&self) -> String {
        match self.unit_multiplier {
            1 => self.unit.proto_name().to_owned(),
            n => format!("{} x {n}", self.unit.proto_name()),
        }
    }

    /// The most hits that can pass at once: the burst, or `requests_per_unit` (see
    /// [`algorithm::Limit::capacity`]).
    pub fn capacity(&self) -> u64 {
        self.burst.unwrap_or(self.requests_per_unit)
    }

    /// The algorithm's view of this limit.
    pub fn algorithm_limit(&self) -> algorithm::Limit {
        let requests = self.requests_per_unit;
        algorithm::Limit {
            requests,
            window: self.window(),
            algorithm: self.algorithm,
            burst: self.capacity(),
            overdraft: self.overdraft,
        }
    }
}

// === impl Policy ===

impl Policy {
    /// A policy over the given domains.
    pub fn new(domains: HashMap<String, Domain>) -> Self {
        Self { domains }
    }

    /// The domain called `name`, if loaded.
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// Number of loaded domains.
    pub fn domain_count(&self) -> usize {
        self.domains.len()
    }

    /// Every rule of every domain, sorted by stats key.
    pub fn rules(&self) -> Vec<&Rule> {
        let mut rules = Vec::new();
        for domain in self.domains.values() {
            domain.children.collect_rules(&mut rules);
        }
        rules.sort_by(|a, b| a.stats_key.cmp(&b.stats_key));
        rules
    }

    /// Every counted or unlimited rule with the name of its domain, sorted by stats key.
    pub fn rules_by_domain(&self) -> Vec<(&str, &Rule)> {
        let mut rules = Vec::new();
        for (name, domain) in &self.domains {
            let mut of_domain = Vec::new();
            domain.children.collect_rules(&mut of_domain);
            rules.extend(of_domain.into_iter().map(|r| (name.as_str(), r)));
        }
        rules.sort_by(|a, b| a.1.stats_key.cmp(&b.1.stats_key));
        rules
    }

    /// A domain's own `failure_mode` (its file's), if it has one.
    pub fn failure_mode_of(&self, domain: &str) -> Option<FailureMode> {
        self.domains.get(domain).and_then(|d| d.failure_mode)
    }

    /// What a valid policy may still do that its operator should know (`sluice validate`
    /// prints them): a global rule that fails open in a region cut off from the root.
    pub fn warnings(&self) -> Vec<String> {
        self.rules_by_domain()
            .into_iter()
            .filter(|(_, rule)| rule.global)
            .filter_map(|(domain, rule)| {
                let file_mode = self.failure_mode_of(domain);
                match rule.failure_mode.or(file_mode) {
                    Some(FailureMode::Allow) => Some(format!(
                        "{}: scope: global with failure_mode: allow admits without bound in a region cut off from the root once its pool ends; deny never over-admits, local admits the region's share",
                        rule.stats_key
                    )),
                    None => Some(format!(
                        "{}: scope: global without a failure_mode takes the service's (FAILURE_MODE, allow by default), which admits without bound in a region cut off from the root once its pool ends; say deny or local",
                        rule.stats_key
                    )),
                    _ => None,
                }
            })
            .collect()
    }

    /// The sorted, human-readable rule listing served at `/rlconfig`, one rule per line in
    /// the reference service's layout.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        for rule in self.rules() {
            let limits = match &rule.limit {
                RuleLimit::Unlimited => {
                    let _ = write!(
                        out,
                        "{}: unlimited, shadow_mode: {}, quota_mode: {}",
                        rule.stats_key, rule.shadow_mode, rule.quota_mode
                    );
                    if let Some(mode) = rule.failure_mode {
                        let _ = write!(out, ", failure_mode: {}", mode.as_str());
                    }
                    out.push('\n');
                    continue;
                }
                RuleLimit::Limited(limits) => limits,
            };
            // One line per limit, in the reference's layout, then Sluice's additions.
            for limit in limits {
                let _ = write!(
                    out,
                    "{}: unit={} requests_per_unit={}, shadow_mode: {}, quota_mode: {}, algorithm: {}",
                    rule.stats_key,
                    limit.unit.proto_name(),
                    limit.requests_per_unit,
                    rule.shadow_mode,
                    rule.quota_mode,
                    limit.algorithm.as_str(),
                );
                if let Some(burst) = limit.burst {
                    let _ = write!(out, ", burst: {burst}");
                }
                if limit.unit_multiplier != 1 {
                    let _ = write!(out, ", unit_multiplier: {}", limit.unit_multiplier);
                }
                if limit.overdraft {
                    let _ = write!(out, ", overdraft: true");
                }
                if let Some(name) = &limit.name {
                    let _ = write!(out, ", name: {name}");
                }
                if let Some(mode) = rule.failure_mode {
                    let _ = write!(out, ", failure_mode: {}", mode.as_str());
                }
                if let Some(consistency) = rule.consistency
                    && limit.algorithm.leasable()
                {
                    let _ = write!(out, ", consistency: {}", consistency.as_str());
                }
                if rule.global {
                    let _ = write!(out, ", scope: global");
                }
                out.push('\n');
            }
        }
        out
    }
}

impl Children {
    fn collect_rules<'a>(&'a self, out: &mut Vec<&'a Rule>) {
        for group in self.by_key.values() {
            let nodes = group
                .exact
                .values()
                .chain(group.wildcards.iter().map(|(_, n)| n))
                .chain(group.any.as_deref());
            for node in nodes {
                out.extend(node.rule.as_ref());
                node.children.collect_rules(out);
            }
        }
    }
}
