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
