//! Claims on a shared budget: each instance records the part of a budget it hands out and
//! the demand behind it, and gets at most what the others leave (Envoy's `rate_limit_quota`
//! filter: see `crate::rlqs`). A claim lives until its TTL unless it is renewed, so the part
//! of an instance that stopped goes back to the others.

use std::time::Duration;

/// One claim: `instance` asks to hold `want` of the `total` of the budget `key`, for
/// `demand` requests per window, until `ttl` from now.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimAsk {
    /// The budget's key (without the store's prefix).
    pub key: String,
    /// This instance, unique per process.
    pub instance: String,
    /// The budget: tokens per window.
    pub total: u64,
    /// What this instance wants to hold.
    pub want: u64,
    /// The demand behind it, requests per window.
    pub demand: f64,
    /// The peers (Envoys) behind it.
    pub peers: u64,
    /// How long the claim holds without renewal.
    pub ttl: Duration,
}

/// What a claim got.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClaimGrant {
    /// What this instance may hold: at most `want`, and at most what the others leave.
    pub granted: u64,
    /// The other instances' demand, requests per window.
    pub others_demand: f64,
    /// The other instances holding a claim.
    pub others: u64,
    /// The other instances' peers (each instance that does not say counted as one).
    pub others_peers: u64,
    /// What the others hold.
    pub others_hold: u64,
}

impl ClaimGrant {
    /// The answer of a store with no other instance: all that is asked, within the total.
    pub fn alone(ask: &ClaimAsk) -> Self {
        Self {
            granted: ask.want.min(ask.total),
            others_demand: 0.0,
            others: 0,
            others_peers: 0,
            others_hold: 0,
        }
    }
}
