//! A fast hasher for the limiter's maps keyed by what the config names (rules' stats keys)
//! or by hashes already uniform (refused keys' hashes): FNV-1a over bytes, a multiply for a
//! `u64`. Not for keys a request chooses, which could be aimed at one bucket: those go
//! through the std hasher's random keys (or a keyed digest, in the stores).

use std::hash::{BuildHasherDefault, Hasher};

/// FNV-1a (see the module).
#[derive(Clone, Copy)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, n: u64) {
        // Spread a uniform value over every bit (the table reads the top ones too).
        self.0 = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// Builds [`Fnv`] hashers.
pub type FnvBuild = BuildHasherDefault<Fnv>;

/// A map with [`Fnv`] (see the module for what keys it is for).
pub type FnvMap<K, V> = std::collections::HashMap<K, V, FnvBuild>;
