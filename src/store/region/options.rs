//! A region's settings, its status, and the under bound's term per region.

use std::time::Duration;

use super::micros;
use crate::algorithm::Micros;

/// Settings of a region under a root.
#[derive(Debug, Clone, PartialEq)]
pub struct RegionOptions {
    /// This region's name (`REGION`): the root counts regions by it.
    pub region: String,
    /// How long a region's pool lives after a grant (`REGION_LEASE_PERIOD`); asks want what
    /// the region uses in this time.
    pub period: Duration,
    /// How long a call to the root may take (`ROOT_DEADLINE`).
    pub root_deadline: Duration,
    /// The instances' lease period (`LEASE_PERIOD`): a block taken from a pool lives this
    /// much longer than it.
    pub lease_period: Duration,
    /// What `failure_mode: local` admits per window in a region cut off from the root, as a
    /// share of the limit (`PARTITION_SHARE`; 0: one over the number of regions).
    pub partition_share: f64,
}

impl Default for RegionOptions {
    fn default() -> Self {
        Self {
            region: "default".into(),
            period: Duration::from_secs(2),
            root_deadline: Duration::from_secs(1),
            lease_period: Duration::from_secs(1),
            partition_share: 0.0,
        }
    }
}

/// What a region holds of a global limit of `requests` per `window` at most (its pool's low
/// water mark, an ask, and its instances' blocks: `lw_r + g_r + Σ b_i`), when it admits at
/// the limit's own rate, with the root `round_trip` away, and no more than `capacity` (the
/// limit, or a token bucket's burst): the under bound's term per region that `sluice
/// validate` prints.
pub fn held_at_own_rate(
    (requests, capacity): (u64, u64),
    window: Micros,
    options: &RegionOptions,
    round_trip: Micros,
) -> u64 {
    let rate = requests as f64 / window.max(1) as f64;
    let (period, lease_period) = (micros(options.period), micros(options.lease_period));
    let low_water = rate * (round_trip + lease_period + period / 4) as f64;
    let ask = (rate * period as f64)
        .max((requests as u128 * period as u128 / window.max(1) as u128) as f64);
    let blocks = rate * lease_period as f64;
    (low_water.ceil() + ask.ceil() + blocks.ceil()).min(capacity as f64) as u64
}

/// A region's view of its pools and of the root.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RegionStatus {
    /// This region's name.
    pub region: String,
    /// Whether the root answered the last call.
    pub root_reachable: bool,
    /// Regions the root counted at the last ask (at least 1).
    pub regions: u64,
    /// Root calls by result.
    pub root_calls_ok: u64,
    /// See above.
    pub root_calls_failed: u64,
    /// Units the root granted to this instance's asks, and handed back by it.
    pub units_granted: u64,
    /// See above.
    pub units_returned: u64,
    /// Units granted that arrived after their pool would have ended (handed back).
    pub units_late: u64,
    /// Global counters this instance decided from its pools, by failure mode, or refused.
    pub pool_decisions: u64,
    /// See above.
    pub failure_mode_decisions: u64,
    /// The last root round trip (µs).
    pub round_trip: Micros,
    /// Units lost to the planet until their window ends (a token bucket's: until the root
    /// refills them), by reason: withdrawn from a pool and not taken back by the root (its
    /// window moved on, a token bucket charged since, or the call failed); taken by a
    /// refused request and not taken back by its pool; granted and not installed (the
    /// region's store failed). Under, never over.
    pub units_lost: [u64; 3],
    /// Free units in the region's pools of the global counters this instance knows, as it
    /// last saw them.
    pub pool_free: u64,
    /// Global counters this instance knows of.
    pub pools: u64,
    /// The pools with the most free units, as this instance last saw them.
    pub top: Vec<PoolView>,
}

/// A region's pool as an instance last saw it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PoolView {
    /// The global counter's key.
    pub key: String,
    /// Free units.
    pub free: u64,
    /// Time until the pool ends (µs).
    pub ends_in: Micros,
}
