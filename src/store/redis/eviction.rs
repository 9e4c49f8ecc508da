//! Whether Redis may evict Sluice's counters: with a `maxmemory` set, every policy but
//! `noeviction` evicts keys when memory is full, and Sluice's counters all carry a TTL, so the
//! `volatile-*` policies take them as readily as the `allkeys-*` ones. An evicted counter
//! starts again from zero: its limit admits more than it says. Read once at start-up with
//! `CONFIG GET` (a managed Redis that renames CONFIG leaves it unknown).

use std::sync::atomic::{AtomicU8, Ordering};

use redis::Cmd;

use super::{ConnHandle, RedisStore};

/// What is known of the eviction policy: 0 not read yet (or unreadable), [`SAFE`], or
/// [`EVICTS`].
#[derive(Debug, Default)]
pub(super) struct Eviction(AtomicU8);

const SAFE: u8 = 1;
const EVICTS: u8 = 2;

impl Eviction {
    /// `Some(true)` when Redis can evict counters, `Some(false)` when it cannot, `None` unknown.
    pub(super) fn evicts(&self) -> Option<bool> {
        match self.0.load(Ordering::Relaxed) {
            SAFE => Some(false),
            EVICTS => Some(true),
            _ => None,
        }
    }
}

/// Whether `policy` with `maxmemory` bytes can evict keys that carry a TTL.
pub(super) fn can_evict(policy: &str, maxmemory: u64) -> bool {
    maxmemory > 0 && policy != "noeviction"
}

impl RedisStore {
    /// Reads `maxmemory` and `maxmemory-policy`, records what they mean and warns when Redis
    /// can evict counters.
    pub(super) async fn check_eviction(&self) {
        let config = |name: &str| {
            let mut cmd = Cmd::new();
            cmd.arg("CONFIG").arg("GET").arg(name);
            cmd
        };
        let read = async {
            let (_, conn) = self.shared.connector.get().await.ok()?;
            let (policy, memory): (Vec<String>, Vec<String>) = match conn {
                ConnHandle::Node(mut c) => (
                    config("maxmemory-policy").query_async(&mut c).await.ok()?,
                    config("maxmemory").query_async(&mut c).await.ok()?,
                ),
                ConnHandle::Cluster(mut c) => (
                    config("maxmemory-policy").query_async(&mut c).await.ok()?,
                    config("maxmemory").query_async(&mut c).await.ok()?,
                ),
            };
            Some((policy.get(1)?.clone(), memory.get(1)?.parse::<u64>().ok()?))
        };
        let Some((policy, maxmemory)) = read.await else {
            tracing::info!(
                "could not read redis's maxmemory-policy (CONFIG GET refused?): check it is noeviction, or that maxmemory is 0"
            );
            return;
        };
        let evicts = can_evict(&policy, maxmemory);
        self.shared
            .eviction
            .0
            .store(if evicts { EVICTS } else { SAFE }, Ordering::Relaxed);
        if evicts {
            tracing::warn!(
                policy = %policy,
                maxmemory,
                "redis can evict rate limit counters when its memory is full (maxmemory-policy {policy}, maxmemory {maxmemory}): an evicted counter starts again from zero and its limit admits more; set maxmemory-policy noeviction (docs/configuration/stores.md)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::can_evict;

    #[test]
    fn only_noeviction_or_no_maxmemory_keeps_counters() {
        assert!(!can_evict("noeviction", 1 << 30));
        assert!(!can_evict("allkeys-lru", 0));
        for policy in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
        ] {
            assert!(can_evict(policy, 100 << 20), "{policy}");
        }
    }
}
