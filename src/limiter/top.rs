//! The heaviest keys of a stream, in bounded memory: the Space-Saving summary (Metwally,
//! Agrawal and El Abbadi, 2005), the building block of a rule's "top refused keys". It keeps
//! at most `capacity` keys, each with a count that never under-estimates the key's true count
//! and an error bound: the true count lies in `[count - error, count]`, and `error` is at most
//! the total weight offered divided by `capacity`. Every key whose true count is over that
//! share is in the summary. Two summaries merge into one with the same guarantees over both
//! streams (the fleet's list from each instance's).
//!
//! Cost: a key already held, one hash lookup; a new key while the summary is full, a scan of
//! the `capacity` entries for the smallest. Memory: `capacity` keys and three words each.

use std::collections::HashMap;
use std::hash::Hash;

/// One key of a summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted<K> {
    /// The key.
    pub key: K,
    /// At least its true count.
    pub count: u64,
    /// At most `count` minus its true count.
    pub error: u64,
}

/// A Space-Saving summary of at most `capacity` keys.
#[derive(Debug, Clone)]
pub struct TopKeys<K> {
    capacity: usize,
    entries: Vec<Counted<K>>,
    /// Keys come from requests, but the map never holds more than `capacity` + 1: keys aimed
    /// at one bucket cost at most that many comparisons, so the unkeyed hasher is safe here.
    index: HashMap<K, usize, super::fnv::FnvBuild>,
    /// The weight offered in all.
    total: u64,
}

impl<K: Hash + Eq + Clone> TopKeys<K> {
    /// An empty summary keeping at most `capacity` keys (at least one).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            capacity,
            entries: Vec::with_capacity(capacity),
            index: HashMap::with_capacity_and_hasher(capacity, Default::default()),
            total: 0,
        }
    }

    /// Counts `weight` more for `key` (owned only when it is new to the summary).
    pub fn offer<Q>(&mut self, key: &Q, weight: u64)
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.total = self.total.saturating_add(weight);
        if let Some(&i) = self.index.get(key) {
            let e = &mut self.entries[i];
            e.count = e.count.saturating_add(weight);
            return;
        }
        if self.entries.len() < self.capacity {
            self.index.insert(key.to_owned(), self.entries.len());
            self.entries.push(Counted {
                key: key.to_owned(),
                count: weight,
                error: 0,
            });
            return;
        }
        // Full: the new key takes the smallest entry's place, and its count as error.
        let (i, _) = self
            .entries
            .iter()
            .enumerate()
            .min_by_key(|(_, e)| e.count)
            .expect("a full summary has entries");
        let old = std::mem::replace(
            &mut self.entries[i],
            Counted {
                key: key.to_owned(),
                count: 0,
                error: 0,
            },
        );
        self.index.remove::<K>(&old.key);
        self.index.insert(key.to_owned(), i);
        let e = &mut self.entries[i];
        e.count = old.count.saturating_add(weight);
        e.error = old.count;
    }

    /// The weight offered in all (over every key, held or not).
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The most the count of a key not in the summary can be: the smallest count held when
    /// the summary is full, else 0.
    pub fn floor(&self) -> u64 {
        if self.entries.len() < self.capacity {
            0
        } else {
            self.entries.iter().map(|e| e.count).min().unwrap_or(0)
        }
    }

    /// The `n` heaviest keys, heaviest first (ties by the smaller error).
    pub fn top(&self, n: usize) -> Vec<Counted<K>> {
        let mut all = self.entries.clone();
        all.sort_by(|a, b| b.count.cmp(&a.count).then(a.error.cmp(&b.error)));
        all.truncate(n);
        all
    }

    /// This summary and `other` as one, over both streams, keeping `self`'s capacity: a key
    /// missing from one side is counted there at that side's floor (the most it can have had),
    /// which stays in its error, so counts still never under-estimate.
    pub fn merge(&self, other: &TopKeys<K>) -> TopKeys<K> {
        let (mine, theirs) = (self.floor(), other.floor());
        let mut merged: HashMap<K, Counted<K>> = HashMap::new();
        for e in &self.entries {
            let (count, error) = match other.index.get(&e.key) {
                Some(&j) => (other.entries[j].count, other.entries[j].error),
                None => (theirs, theirs),
            };
            merged.insert(
                e.key.clone(),
                Counted {
                    key: e.key.clone(),
                    count: e.count.saturating_add(count),
                    error: e.error.saturating_add(error),
                },
            );
        }
        for e in other
            .entries
            .iter()
            .filter(|e| !self.index.contains_key(&e.key))
        {
            merged.insert(
                e.key.clone(),
                Counted {
                    key: e.key.clone(),
                    count: e.count.saturating_add(mine),
                    error: e.error.saturating_add(mine),
                },
            );
        }
        let mut entries: Vec<Counted<K>> = merged.into_values().collect();
        entries.sort_by(|a, b| b.count.cmp(&a.count).then(a.error.cmp(&b.error)));
        entries.truncate(self.capacity);
        let index = entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.key.clone(), i))
            .collect();
        TopKeys {
            capacity: self.capacity,
            entries,
            index,
            total: self.total.saturating_add(other.total),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The true counts of a stream.
    fn exact(stream: &[(u8, u64)]) -> HashMap<u8, u64> {
        let mut counts = HashMap::new();
        for (key, weight) in stream {
            *counts.entry(*key).or_insert(0) += weight;
        }
        counts
    }

    /// The summary's guarantees against the exact counts of what it was offered.
    fn holds_its_bounds(summary: &TopKeys<u8>, counts: &HashMap<u8, u64>) {
        let total: u64 = counts.values().sum();
        assert_eq!(summary.total(), total);
        let share = total / summary.capacity as u64;
        for e in summary.top(usize::MAX) {
            let truth = counts.get(&e.key).copied().unwrap_or(0);
            assert!(e.count >= truth, "{e:?} under its true {truth}");
            assert!(e.count - e.error <= truth, "{e:?} over its true {truth}");
            assert!(e.error <= share, "{e:?}: error past {share}");
        }
        let held: Vec<u8> = summary.top(usize::MAX).iter().map(|e| e.key).collect();
        for (key, truth) in counts {
            if *truth > share {
                assert!(held.contains(key), "{key} ({truth} of {total}) is missing");
            } else if !held.contains(key) {
                assert!(*truth <= summary.floor(), "{key}: {truth} past the floor");
            }
        }
    }

    fn stream() -> impl Strategy<Value = Vec<(u8, u64)>> {
        // A few heavy keys among many light ones.
        let key = prop_oneof![3 => 0u8..4, 1 => 0u8..=255];
        proptest::collection::vec((key, 1u64..20), 0..400)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn a_summary_never_under_counts_and_holds_every_heavy_key(
            capacity in 1usize..12,
            stream in stream(),
        ) {
            let mut summary = TopKeys::new(capacity);
            for (key, weight) in &stream {
                summary.offer(key, *weight);
            }
            holds_its_bounds(&summary, &exact(&stream));
        }

        #[test]
        fn merged_summaries_keep_the_bounds_over_both_streams(
            capacity in 1usize..12,
            a in stream(),
            b in stream(),
        ) {
            let (mut one, mut two) = (TopKeys::new(capacity), TopKeys::new(capacity));
            for (key, weight) in &a {
                one.offer(key, *weight);
            }
            for (key, weight) in &b {
                two.offer(key, *weight);
            }
            let both: Vec<(u8, u64)> = a.iter().chain(&b).copied().collect();
            let merged = one.merge(&two);
            let counts = exact(&both);
            let total: u64 = counts.values().sum();
            prop_assert_eq!(merged.total(), total);
            for e in merged.top(usize::MAX) {
                let truth = counts.get(&e.key).copied().unwrap_or(0);
                prop_assert!(e.count >= truth, "{:?} under its true {}", e, truth);
                prop_assert!(e.count - e.error <= truth, "{:?} over its true {}", e, truth);
            }
        }
    }

    #[test]
    fn the_heaviest_keys_come_first_with_exact_counts_while_there_is_room() {
        let mut summary = TopKeys::new(3);
        for (key, weight) in [("a", 5), ("b", 2), ("a", 1), ("c", 7)] {
            summary.offer(&key.to_owned(), weight);
        }
        let top: Vec<(String, u64, u64)> = summary
            .top(2)
            .into_iter()
            .map(|e| (e.key, e.count, e.error))
            .collect();
        assert_eq!(top, [("c".into(), 7, 0), ("a".into(), 6, 0)]);
        // Full: a new key takes the lightest's place and its count as error.
        summary.offer(&"d".to_owned(), 1);
        let d = summary.top(4).into_iter().find(|e| e.key == "d").unwrap();
        assert_eq!((d.count, d.error), (3, 2));
        assert!(summary.top(4).iter().all(|e| e.key != "b"));
    }
}
