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

impl Children {
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
