//! The global counters an instance has seen (for its sweeps, `/rlconfig` and its metrics).

use super::{Core, Known, LISTED_POOLS, MAX_KNOWN, options};
use crate::algorithm::Limit;
use crate::store::CounterKey;
use crate::store::pool::PoolAnswer;

impl Core {
    /// Remembers a global counter seen now, with its limit (for the sweeps).
    pub(super) fn remember(&self, key: &CounterKey, limit: &Limit) {
        let now = self.clock.now();
        let mut known = self.known.lock();
        if known.len() >= MAX_KNOWN && !known.contains_key(key) {
            let horizon = now.saturating_sub(crate::store::pool::KEEP);
            known.retain(|_, k| k.seen > horizon);
            if known.len() >= MAX_KNOWN {
                return;
            }
        }
        let entry = known.entry(key.clone()).or_insert(Known {
            limit: *limit,
            seen: now,
            free: 0,
            ends_at: 0,
        });
        entry.limit = *limit;
        entry.seen = now;
    }

    /// What a pool answered, for `/rlconfig`.
    pub(super) fn saw(&self, key: &CounterKey, answer: &PoolAnswer) {
        let now = self.clock.now();
        if let Some(known) = self.known.lock().get_mut(key) {
            known.free = answer.free;
            known.ends_at = now.saturating_add(answer.until.saturating_sub(answer.now));
        }
    }

    /// Free units in the live pools this instance knows, as last answered.
    pub(super) fn pools_free(&self) -> u64 {
        let now = self.clock.now();
        self.known
            .lock()
            .values()
            .filter(|k| k.ends_at > now)
            .map(|k| k.free)
            .sum()
    }

    /// The pools with the most free units, as last answered.
    pub(super) fn top_pools(&self) -> Vec<options::PoolView> {
        let now = self.clock.now();
        let mut pools: Vec<options::PoolView> = self
            .known
            .lock()
            .iter()
            .filter(|(_, k)| k.ends_at > now)
            .map(|(key, k)| options::PoolView {
                key: key.to_string(),
                free: k.free,
                ends_in: k.ends_at - now,
            })
            .collect();
        pools.sort_by(|a, b| b.free.cmp(&a.free).then_with(|| a.key.cmp(&b.key)));
        pools.truncate(LISTED_POOLS);
        pools
    }
}
