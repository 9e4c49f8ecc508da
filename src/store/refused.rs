//! Sets of refused keys, shared by the fleet: per rule and window, the hashes of the keys it
//! refused, and per rule the keys refused in the recent past, so that "how many distinct keys
//! were refused in the last window, and how many of them were not refused before" has one
//! answer whichever instances refused them.
//!
//! Bounded whatever the number of keys: a window's set keeps at most [`WINDOW_CAP`] hashes
//! and the history at most [`HISTORY_CAP`]. Past a cap the set is *sampled*: it keeps only
//! the hashes whose low `level` bits are zero (each level halves it), and a count is the
//! sample's size times 2^level. Below the caps every count is exact; past them it is an
//! estimate with a relative standard error of about 1/√(sampled keys) (4.4 % for a window's
//! 512 or more).
//!
//! The memory store keeps them in [`Sets`]; Redis in a set and a sorted set per rule (scripts
//! `lua/refused_add.lua` and `lua/refused_close.lua`), with the same arithmetic.

use std::collections::HashMap;

use crate::algorithm::Micros;

/// Most hashes a window's set keeps (then it is sampled).
pub const WINDOW_CAP: usize = 1024;

/// Most hashes the history keeps (then it is sampled).
pub const HISTORY_CAP: usize = 16_384;

/// Most windows of one rule not closed yet that the memory store keeps (the current one and
/// the last completed, with room for an instance that closes late).
const MAX_OPEN_WINDOWS: usize = 8;

/// Hashes are 52 bits: Redis's scripts compute in doubles.
pub const HASH_BITS: u32 = 52;

/// Hashes of keys a rule refused in one window, to add to its set.
#[derive(Debug, Clone, PartialEq)]
pub struct RefusedAdd {
    /// The rule's sets (a name unique per rule, without the store's prefix).
    pub set: String,
    /// The window's start.
    pub start: Micros,
    /// How long the window's set is kept: past the window's close.
    pub ttl: std::time::Duration,
    /// The sampling level the sender kept them at: the set's level becomes at least this.
    pub level: u32,
    /// Key hashes, each below 2^[`HASH_BITS`].
    pub hashes: Vec<u64>,
}

/// A completed window to count: its keys, and those of them the history did not hold (keys
/// refused in the windows that started within `history` before it).
#[derive(Debug, Clone, PartialEq)]
pub struct RefusedClose {
    /// The rule's sets.
    pub set: String,
    /// The window's start.
    pub start: Micros,
    /// How far back "refused before" looks.
    pub history: std::time::Duration,
    /// How long the counts are kept for the instances that ask after the first.
    pub counts_ttl: std::time::Duration,
}

/// A completed window's counts, the same for every instance that asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RefusedCounts {
    /// Distinct keys refused in the window.
    pub distinct: u64,
    /// Of those, keys not refused in the history before it.
    pub new: u64,
}

/// Whether `hash` is in a sample at `level`.
pub fn sampled(hash: u64, level: u32) -> bool {
    level >= 64 || hash.trailing_zeros() >= level
}

/// One rule's sets in memory.
#[derive(Debug, Default)]
struct RuleSets {
    /// Per window start: its level and hashes.
    windows: HashMap<Micros, (u32, std::collections::HashSet<u64>)>,
    /// Each hash of the history with the start of the last window that refused it.
    history: HashMap<u64, Micros>,
    history_level: u32,
    /// Counts of windows already closed, by start (the first close computes, the rest read).
    closed: HashMap<Micros, RefusedCounts>,
}

/// Every rule's sets, for the memory store.
#[derive(Debug, Default)]
pub struct Sets {
    rules: HashMap<String, RuleSets>,
}

impl Sets {
    /// Adds `add`'s hashes; answers the window's level.
    pub fn add(&mut self, add: &RefusedAdd) -> u32 {
        let rule = self.rules.entry(add.set.clone()).or_default();
        let (level, set) = rule.windows.entry(add.start).or_default();
        if add.level > *level {
            *level = add.level;
            let l = *level;
            set.retain(|&h| sampled(h, l));
        }
        set.extend(add.hashes.iter().filter(|&&h| sampled(h, *level)));
        while set.len() > WINDOW_CAP {
            *level += 1;
            let l = *level;
            set.retain(|&h| sampled(h, l));
        }
        *level
    }

    /// Counts `close`'s window (once: later closes read the same counts), records its keys in
    /// the history and forgets what the history no longer covers. `now` drops windows whose
    /// time to live passed.
    pub fn close(&mut self, close: &RefusedClose, now: Micros) -> RefusedCounts {
        let rule = self.rules.entry(close.set.clone()).or_default();
        if let Some(counts) = rule.closed.get(&close.start) {
            return *counts;
        }
        let history = close.history.as_micros() as Micros;
        let cutoff = close.start.saturating_sub(history);
        rule.history.retain(|_, &mut last| last >= cutoff);
        let (level, hashes) = rule.windows.remove(&close.start).unwrap_or_default();
        let both = level.max(rule.history_level);
        let distinct = (hashes.len() as u64) << level.min(63);
        let new = hashes
            .iter()
            .filter(|&&h| sampled(h, both) && !rule.history.contains_key(&h))
            .count() as u64;
        let counts = RefusedCounts {
            distinct,
            new: (new << both.min(63)).min(distinct),
        };
        for &h in hashes.iter().filter(|&&h| sampled(h, rule.history_level)) {
            rule.history.insert(h, close.start);
        }
        while rule.history.len() > HISTORY_CAP {
            rule.history_level += 1;
            let l = rule.history_level;
            rule.history.retain(|&h, _| sampled(h, l));
        }
        rule.closed.insert(close.start, counts);
        let keep = close.counts_ttl.as_micros() as Micros;
        rule.closed
            .retain(|&start, _| start.saturating_add(keep) >= close.start);
        rule.windows
            .retain(|&start, _| start.saturating_add(history) >= now);
        while rule.windows.len() > MAX_OPEN_WINDOWS {
            let oldest = *rule.windows.keys().min().expect("not empty");
            rule.windows.remove(&oldest);
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const MINUTE: Micros = 60_000_000;

    fn add(sets: &mut Sets, start: Micros, hashes: impl IntoIterator<Item = u64>) -> u32 {
        sets.add(&RefusedAdd {
            set: "r".into(),
            start,
            ttl: Duration::from_secs(120),
            level: 0,
            hashes: hashes.into_iter().collect(),
        })
    }

    fn close(sets: &mut Sets, start: Micros) -> RefusedCounts {
        let close = RefusedClose {
            set: "r".into(),
            start,
            history: Duration::from_secs(86_400),
            counts_ttl: Duration::from_secs(600),
        };
        sets.close(&close, start + MINUTE)
    }

    /// A mixer, so that consecutive numbers make hashes with random low bits.
    fn h(i: u64) -> u64 {
        let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) >> (64 - HASH_BITS)
    }

    #[test]
    fn small_sets_count_exactly_and_a_key_refused_before_is_not_new() {
        let mut sets = Sets::default();
        // Window 1: keys 0..10, the same keys sent by three instances.
        for _ in 0..3 {
            add(&mut sets, 0, (0..10).map(h));
        }
        assert_eq!(
            close(&mut sets, 0),
            RefusedCounts {
                distinct: 10,
                new: 10
            }
        );
        // Closing again reads the same counts.
        assert_eq!(
            close(&mut sets, 0),
            RefusedCounts {
                distinct: 10,
                new: 10
            }
        );
        // Window 2: keys 5..12: 7 distinct, 2 new.
        add(&mut sets, MINUTE, (5..12).map(h));
        assert_eq!(
            close(&mut sets, MINUTE),
            RefusedCounts {
                distinct: 7,
                new: 2
            }
        );
        // A day after window 1: key 0 (refused then only) is new again, key 11 is not.
        let later = 86_400_000_000 + MINUTE;
        add(&mut sets, later, [h(0), h(11)]);
        assert_eq!(
            close(&mut sets, later),
            RefusedCounts {
                distinct: 2,
                new: 1
            }
        );
    }

    #[test]
    fn a_flood_of_keys_is_sampled_within_its_caps_and_counted_within_a_few_percent() {
        let mut sets = Sets::default();
        let n = 200_000;
        let level = add(&mut sets, 0, (0..n).map(h));
        assert!(level > 0);
        let counts = close(&mut sets, 0);
        let error = (counts.distinct as f64 - n as f64).abs() / n as f64;
        assert!(error < 0.15, "{counts:?}");
        assert_eq!(counts.new, counts.distinct);
        let rule = &sets.rules["r"];
        assert!(rule.history.len() <= HISTORY_CAP);
        // The next window: half the keys again, half new.
        add(&mut sets, MINUTE, (n / 2..n + n / 2).map(h));
        let counts = close(&mut sets, MINUTE);
        let new_error = (counts.new as f64 - (n / 2) as f64).abs() / (n / 2) as f64;
        assert!(new_error < 0.25, "{counts:?}");
    }
}
