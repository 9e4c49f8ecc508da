//! RLQS claims in Redis: one hash per budget, a field per instance holding its claim, its
//! demand and when the claim ends (Redis's clock), and a field `INSTANCE#peers` holding the
//! number of peers behind the demand (a field of its own, so that instances of an earlier
//! version, which drop what they cannot read, lose only that and count the instance as one
//! peer, while their own claims keep their format). One script call renews every claim of a
//! node (of a hash slot, in a Cluster), at most [`PER_CALL`] at a time, all sent at once.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use futures_util::future::join_all;
use redis::{Cmd, Script};

use super::{RedisStore, slot};
use crate::store::{ClaimAsk, ClaimGrant, StoreError};

/// KEYS: the budgets' hashes. ARGV[1]: the instance; then per key its total, want, demand
/// (requests per window, in thousandths), ttl (ms) and peers. For each key: drops the claims
/// that ended, grants at most what the others leave, records this instance's claim and
/// peers; answers five integers per key: granted, the others' demand (thousandths), how many
/// others, what they hold, their peers (an instance that names none counted as one). A
/// script (`lua/claim.lua`): reading the others and writing ours must be one step, or two
/// instances could each take what the other left.
const CLAIM_SCRIPT: &str = include_str!("lua/claim.lua");

static CLAIMS: LazyLock<Script> = LazyLock::new(|| Script::new(CLAIM_SCRIPT));

/// The largest total a claim carries: Lua's doubles format integers exactly below 2^53,
/// and Envoy's token buckets hold at most 2^32 - 1 anyway.
const MAX_TOTAL: u64 = u32::MAX as u64;

/// Most claims one script call renews: each is a few hash operations, so a call stays
/// within a few milliseconds of Redis's time.
pub const PER_CALL: usize = 512;

impl RedisStore {
    /// Every claim: grouped by instance and, in a Cluster, by hash slot; one script call per
    /// group of at most [`PER_CALL`], all at once.
    pub(super) async fn claim_asks(
        &self,
        asks: &[ClaimAsk],
    ) -> Result<Vec<ClaimGrant>, StoreError> {
        let cluster = self.shared.connector.is_cluster();
        let mut groups: BTreeMap<(&str, u16), Vec<usize>> = BTreeMap::new();
        for (i, ask) in asks.iter().enumerate() {
            let slot = if cluster {
                slot::slot(self.key(ask).as_bytes())
            } else {
                0
            };
            groups
                .entry((ask.instance.as_str(), slot))
                .or_default()
                .push(i);
        }
        let calls: Vec<&[usize]> = groups
            .values()
            .flat_map(|indices| indices.chunks(PER_CALL))
            .collect();
        let replies = join_all(calls.iter().map(|indices| self.claim_call(asks, indices))).await;
        let calls = calls.iter().copied().zip(replies);
        crate::store::in_ask_order(asks.len(), calls, "a claim")
    }

    fn key(&self, ask: &ClaimAsk) -> String {
        format!("{}sluice_rlqs_{}", self.shared.prefix, ask.key)
    }

    /// One script call over the asks at `indices` (one instance, one node or slot).
    async fn claim_call(
        &self,
        asks: &[ClaimAsk],
        indices: &[usize],
    ) -> Result<Vec<ClaimGrant>, StoreError> {
        let mut cmd = Cmd::new();
        cmd.arg("EVALSHA").arg(CLAIMS.get_hash()).arg(indices.len());
        for &i in indices {
            cmd.arg(self.key(&asks[i]));
        }
        cmd.arg(&asks[indices[0]].instance);
        for &i in indices {
            let ask = &asks[i];
            cmd.arg(ask.total.min(MAX_TOTAL))
                .arg(ask.want.min(MAX_TOTAL))
                .arg((ask.demand.clamp(0.0, 1e12) * 1000.0) as u64)
                .arg(ask.ttl.as_millis().max(1) as u64)
                .arg(ask.peers);
        }
        let values: Vec<i64> = self.shared.run_script(&CLAIMS, &cmd).await?;
        if values.len() != 5 * indices.len() {
            return Err(StoreError::Internal(format!(
                "the claim script answered {} values for {} claims",
                values.len(),
                indices.len()
            )));
        }
        Ok(values
            .chunks_exact(5)
            .map(|v| ClaimGrant {
                granted: v[0].max(0) as u64,
                others_demand: v[1].max(0) as f64 / 1000.0,
                others: v[2].max(0) as u64,
                others_hold: v[3].max(0) as u64,
                others_peers: v[4].max(0) as u64,
            })
            .collect())
    }
}
