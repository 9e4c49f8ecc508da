//! Counters identified in memory by a fixed-size keyed digest of their key, so that what
//! an in-process map holds per counter does not grow with the descriptor values.

use std::hash::{BuildHasher, Hash, Hasher, RandomState};

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
