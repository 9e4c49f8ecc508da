//! One shard's counters: a dense array of fixed-size entries plus an index by digest.
//!
//! A counter is identified by a 128-bit keyed digest of its key, never by the key itself, so
//! its memory is the same whatever the descriptor values (a 1 MB header value costs what
//! `a` costs). The dense array gives eviction what a hash map cannot: a uniformly random
//! sample of the live counters in O(1) per draw, whatever the insertion order.

use std::collections::HashMap;

pub(super) use crate::store::digest::{Digest, DigestMap};

/// Counters of one shard, each an entry `(digest, value)`.
pub(super) struct Table<V> {
    index: DigestMap<u32>,
    entries: Vec<(Digest, V)>,
    /// The most counters the shard may hold: growth stops there instead of doubling past it.
    max: usize,
    /// xorshift64 state for eviction samples.
    rng: u64,
}

impl<V> Table<V> {
    /// An empty table for at most `max` counters, whose eviction samples start from `seed`.
    pub(super) fn new(max: usize, seed: u64) -> Self {
        Self {
            index: HashMap::default(),
            entries: Vec::new(),
            max: max.max(1),
            rng: seed | 1,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn get(&self, digest: &Digest) -> Option<&V> {
        let at = *self.index.get(digest)?;
        Some(&self.entries[at as usize].1)
    }

    pub(super) fn get_mut(&mut self, digest: &Digest) -> Option<&mut V> {
        let at = *self.index.get(digest)?;
        Some(&mut self.entries[at as usize].1)
    }

    /// Adds a counter known to be absent.
    pub(super) fn insert_new(&mut self, digest: Digest, value: V) {
        let len = self.entries.len();
        let at = u32::try_from(len).expect("a shard holds under 2^32 counters");
        if len == self.entries.capacity() {
            // Doubling, but never past the cap: a full shard holds no spare half.
            let more = len.max(4).min(self.max.saturating_sub(len)).max(1);
            self.entries.reserve_exact(more);
            self.index.reserve(self.entries.capacity() - len);
        }
        self.index.insert(digest, at);
        self.entries.push((digest, value));
    }

    /// The counter at position `at` (from [`Table::sample`]).
    pub(super) fn at(&self, at: usize) -> &V {
        &self.entries[at].1
    }

    /// Removes the counter with `digest`; answers it, if there was one.
    pub(super) fn remove(&mut self, digest: &Digest) -> Option<V>
    where
        V: Copy,
    {
        let at = *self.index.get(digest)? as usize;
        let value = self.entries[at].1;
        self.remove_at(at);
        Some(value)
    }

    /// Removes the counter at position `at`; the last one takes its place.
    pub(super) fn remove_at(&mut self, at: usize) {
        let (digest, _) = self.entries.swap_remove(at);
        self.index.remove(&digest);
        if let Some((moved, _)) = self.entries.get(at) {
            self.index.insert(*moved, at as u32);
        }
    }

    /// Keeps the counters for which `keep` is true; returns how many were removed.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&V) -> bool) -> usize {
        let before = self.entries.len();
        let mut at = 0;
        while at < self.entries.len() {
            if keep(&self.entries[at].1) {
                at += 1;
            } else {
                self.remove_at(at);
            }
        }
        before - self.entries.len()
    }

    /// `n` positions drawn uniformly at random (with replacement); none when empty.
    pub(super) fn sample(&mut self, n: usize) -> impl Iterator<Item = usize> + '_ {
        let len = self.entries.len() as u64;
        (0..if len == 0 { 0 } else { n }).map(move |_| {
            // xorshift64: fast, and unpredictability is not needed (the digests are keyed).
            let mut x = self.rng;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.rng = x;
            // Lemire's multiply-shift: uniform enough over a shard's few thousand entries.
            ((u128::from(x) * u128::from(len)) >> 64) as usize
        })
    }

    /// Heap bytes this table holds (allocated capacity, not only what is in use).
    pub(super) fn heap_bytes(&self) -> usize {
        // The index is a SwissTable: a bucket (digest and position) and a control byte per
        // bucket, with buckets = capacity × 8/7 (its load factor).
        let bucket = size_of::<(Digest, u32)>() + 1;
        let buckets = (self.index.capacity() * 8).div_ceil(7);
        buckets * bucket + self.entries.capacity() * size_of::<(Digest, V)>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(n: u64) -> Digest {
        Digest([n.wrapping_mul(0x9e37_79b9_7f4a_7c15), n])
    }

    #[test]
    fn removal_keeps_every_other_counter_reachable() {
        let mut table = Table::new(100, 7);
        for n in 0..100 {
            table.insert_new(digest(n), n);
        }
        assert_eq!(table.retain(|v| v % 3 != 0), 34);
        for n in 0..100 {
            assert_eq!(table.get(&digest(n)).copied(), (n % 3 != 0).then_some(n));
        }
        *table.get_mut(&digest(1)).unwrap() = 1000;
        assert_eq!(table.get(&digest(1)), Some(&1000));
    }

    #[test]
    fn a_full_table_holds_no_spare_capacity() {
        let mut table = Table::new(1000, 3);
        for n in 0..1000 {
            table.insert_new(digest(n), n);
        }
        assert_eq!(table.entries.capacity(), 1000);
        // 1000 × 8/7 rounds up to 2048 buckets of 25 bytes, plus 48 bytes per entry.
        assert!(
            table.heap_bytes() <= 1000 * 48 + 2048 * 25,
            "{}",
            table.heap_bytes()
        );
    }

    #[test]
    fn samples_reach_every_position() {
        let mut table = Table::new(64, 42);
        for n in 0..64 {
            table.insert_new(digest(n), n);
        }
        let mut seen = [false; 64];
        for at in table.sample(2_000) {
            seen[at] = true;
        }
        assert!(seen.iter().all(|s| *s));
        assert_eq!(Table::<u64>::new(8, 1).sample(8).count(), 0);
    }
}
