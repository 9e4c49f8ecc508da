//! Descriptor lookup: which rule, if any, applies to a request descriptor.
//!
//! The reference service's rules, which operators depend on:
//! 1. per level, an exact `key`+`value` child wins; else the first wildcard child (config
//!    order) whose pattern matches the value; else the key-only child; else no limit;
//! 2. no backtracking: a level's choice is final even if a deeper level then fails;
//! 3. a rule applies only at the depth equal to the number of entries in the descriptor;
//! 4. a matched node without `rate_limit` is a whitelist (no limit).

use super::{Children, Domain, Node, Rule};

/// One entry of a request descriptor, borrowed from the request.
pub trait EntryRef {
    /// The entry's key.
    fn key(&self) -> &str;
    /// The entry's runtime value.
    fn value(&self) -> &str;
}

impl Domain {
    /// The rule that applies to a descriptor with `entries`, or `None` for no limit.
    pub fn find<E: EntryRef>(&self, entries: &[E]) -> Option<&Rule> {
        let mut level = &self.children;
        let last = entries.len().checked_sub(1)?;
        for (depth, entry) in entries.iter().enumerate() {
            let node = level.child(entry.key(), entry.value())?;
            if depth == last {
                return node.rule.as_ref();
            }
            level = &node.children;
        }
        None
    }
}

/// How one level of a descriptor was matched ([`Domain::trace`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepKind {
    /// The child with this exact value.
    Exact,
    /// The first wildcard child (config order) whose pattern matches; the pattern.
    Wildcard(String),
    /// The child without a value.
    KeyOnly,
    /// No child matches: matching stops here.
    None,
}

/// The end of a traced match.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TraceEnd<'p> {
    /// The last entry's node has this rule.
    Rule(&'p Rule),
    /// Some level has no matching child (the last step is [`StepKind::None`]).
    NoMatch,
    /// The last entry's node has no rule but children: the rules are deeper.
    Deeper,
    /// The last entry's node has no rule and no children: a whitelist.
    Whitelisted,
}

impl Domain {
    /// [`Domain::find`], step by step: how each level matched, and how the match ended.
    /// Follows the same rules (no backtracking), so what it names is what `find` returns.
    pub fn trace<'p, E: EntryRef>(&'p self, entries: &[E]) -> (Vec<StepKind>, TraceEnd<'p>) {
        let mut steps = Vec::with_capacity(entries.len());
        let mut level = &self.children;
        let mut node = None;
        for entry in entries {
            let Some((kind, next)) = level.child_traced(entry.key(), entry.value()) else {
                steps.push(StepKind::None);
                return (steps, TraceEnd::NoMatch);
            };
            steps.push(kind);
            level = &next.children;
            node = Some(next);
        }
        let end = match node {
            None => TraceEnd::NoMatch,
            Some(Node {
                rule: Some(rule), ..
            }) => TraceEnd::Rule(rule),
            Some(n) if !n.children.by_key.is_empty() => TraceEnd::Deeper,
            Some(_) => TraceEnd::Whitelisted,
        };
        (steps, end)
    }
}

impl Children {
    /// [`Children::child`], saying which kind of child matched.
    fn child_traced(&self, key: &str, value: &str) -> Option<(StepKind, &Node)> {
        let group = self.by_key.get(key)?;
        if let Some(node) = group.exact.get(value) {
            return Some((StepKind::Exact, node));
        }
        if let Some((pattern, node)) = group.wildcards.iter().find(|(p, _)| p.matches(value)) {
            return Some((StepKind::Wildcard(pattern.as_str().to_owned()), node));
        }
        group.any.as_deref().map(|node| (StepKind::KeyOnly, node))
    }

    fn child(&self, key: &str, value: &str) -> Option<&Node> {
        let group = self.by_key.get(key)?;
        group
            .exact
            .get(value)
            .or_else(|| {
                group
                    .wildcards
                    .iter()
                    .find(|(pattern, _)| pattern.matches(value))
                    .map(|(_, node)| node)
            })
            .or(group.any.as_deref())
    }
}

impl<K: AsRef<str>, V: AsRef<str>> EntryRef for (K, V) {
    fn key(&self) -> &str {
        self.0.as_ref()
    }
    fn value(&self) -> &str {
        self.1.as_ref()
    }
}

/// Most descent steps [`Domain::find_unordered`] takes before it gives up: a bound on the
/// work of one unordered lookup whatever the tree and the pairs.
pub const UNORDERED_STEPS: usize = 256;

impl Domain {
    /// The rule for an unordered set of `pairs` (an RLQS bucket id): the entry order is the
    /// descriptor tree's own, found from the top down. At each level every unused pair whose
    /// key the level has is tried, in key order, and the first order that uses every pair
    /// and ends on a rule wins; the steps are bounded by [`UNORDERED_STEPS`]. Answers the
    /// pairs in the order found and the rule, or `None` (no order reaches a rule).
    pub fn find_unordered<'a>(
        &self,
        pairs: &[(&'a str, &'a str)],
    ) -> Option<(Vec<(&'a str, &'a str)>, &Rule)> {
        let mut sorted = pairs.to_vec();
        sorted.sort_unstable();
        let mut used = vec![false; sorted.len()];
        let mut order = Vec::with_capacity(sorted.len());
        let mut steps = 0;
        let rule = descend(&self.children, &sorted, &mut used, &mut order, &mut steps)?;
        Some((order, rule))
    }
}

/// One level of [`Domain::find_unordered`].
fn descend<'p, 'a>(
    level: &'p Children,
    pairs: &[(&'a str, &'a str)],
    used: &mut [bool],
    order: &mut Vec<(&'a str, &'a str)>,
    steps: &mut usize,
) -> Option<&'p Rule> {
    for i in 0..pairs.len() {
        if used[i] || !level.by_key.contains_key(pairs[i].0) {
            continue;
        }
        *steps += 1;
        if *steps > UNORDERED_STEPS {
            return None;
        }
        let Some(node) = level.child(pairs[i].0, pairs[i].1) else {
            continue;
        };
        used[i] = true;
        order.push(pairs[i]);
        if order.len() == pairs.len() {
            if let Some(rule) = &node.rule {
                return Some(rule);
            }
        } else if let Some(rule) = descend(&node.children, pairs, used, order, steps) {
            return Some(rule);
        }
        used[i] = false;
        order.pop();
    }
    None
}
