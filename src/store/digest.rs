//! Counters identified in memory by a fixed-size keyed digest of their key, so that what
//! an in-process map holds per counter does not grow with the descriptor values.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher, RandomState};

use parking_lot::Mutex;

use super::CounterKey;

/// 128 bits of a keyed hash of a counter's key. The hash keys are random per process, so
/// nobody can aim two keys at one digest; by chance, two of a million counters share one with
/// a probability around 10^-27.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Digest(pub(crate) [u64; 2]);

impl Hash for Digest {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Already a keyed hash: its first word spreads over the buckets as well as any.
        state.write_u64(self.0[0]);
    }
}

/// Passes a digest's first word through (see [`Digest`]'s `Hash`).
#[derive(Default)]
pub(crate) struct DigestHasher(u64);

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Not used by `Digest`; folds anything else in.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Digests of counter keys, with hash keys random to this process.
pub(crate) struct Digester([RandomState; 2]);

impl Digester {
    pub(crate) fn new() -> Self {
        Self([RandomState::new(), RandomState::new()])
    }

    pub(crate) fn digest(&self, key: &CounterKey) -> Digest {
        let [a, b] = &self.0;
        Digest([a.hash_one(key.as_str()), b.hash_one(key.as_str())])
    }

    /// The digest of a key together with two numbers (e.g. the limit a block leases under).
    pub(crate) fn digest_with(&self, key: &CounterKey, numbers: [u64; 2]) -> Digest {
        let [a, b] = &self.0;
        let value = (key.as_str(), numbers);
        Digest([a.hash_one(value), b.hash_one(value)])
    }
}

/// A hash map keyed by digest (the digest is its own hash).
pub(crate) type DigestMap<V> = HashMap<Digest, V, BuildHasherDefault<DigestHasher>>;

/// The in-process maps keyed by digest (the memory store's counters, leased blocks, remembered
/// refusals): `S`, one per shard, each behind its own lock, so that requests on different
/// counters rarely wait for each other. A digest's shard is picked by its second word (the
/// first one picks the bucket inside a shard's table). Derefs to the shards, in order.
pub(crate) struct Sharded<S> {
    shards: Box<[Mutex<S>]>,
}

impl<S> Sharded<S> {
    /// `count` shards (at least one), the `i`-th made by `make(i)`.
    pub(crate) fn new(count: usize, make: impl FnMut(usize) -> S) -> Self {
        Self {
            shards: (0..count.max(1)).map(make).map(Mutex::new).collect(),
        }
    }

    /// The index of `digest`'s shard.
    pub(crate) fn index(&self, digest: &Digest) -> usize {
        (digest.0[1] % self.shards.len() as u64) as usize
    }

    /// `digest`'s shard.
    pub(crate) fn of(&self, digest: &Digest) -> &Mutex<S> {
        &self.shards[self.index(digest)]
    }
}

impl<S> std::ops::Deref for Sharded<S> {
    type Target = [Mutex<S>];

    fn deref(&self) -> &[Mutex<S>] {
        &self.shards
    }
}
