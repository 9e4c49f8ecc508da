//! RLQS claims in Redis: one hash per budget, a field per instance holding its claim, its
//! demand and when the claim ends (Redis's clock); one script call per budget, all sent at
//! once (each budget is one key, so a Cluster routes each call by itself).

use std::sync::LazyLock;

use futures_util::future::join_all;
use redis::{Cmd, Script};

use super::RedisStore;
use crate::store::{ClaimAsk, ClaimGrant, StoreError};

/// KEYS[1]: the budget's hash. ARGV: instance, total, want, demand (requests per window,
/// in thousandths), ttl (ms). Drops the claims that ended, grants at most what the others
/// leave, records this instance's claim and answers `{granted, others' demand (thousandths),
/// others, what the others hold}`. A script: reading the others and writing ours must be
/// one step, or two instances could each take what the other left.
const CLAIM_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held, demand, count = 0, 0, 0
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  if fields[i] ~= ARGV[1] then
    local c, d, e = string.match(fields[i + 1], '^(%d+):(%d+):(%d+)$')
    if c == nil or tonumber(e) <= now then
      redis.call('HDEL', KEYS[1], fields[i])
    else
      held = held + tonumber(c)
      demand = demand + tonumber(d)
      count = count + 1
    end
  end
end
local granted = math.min(tonumber(ARGV[3]), math.max(0, tonumber(ARGV[2]) - held))
local ttl = tonumber(ARGV[5])
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d:%d:%d', granted, tonumber(ARGV[4]), now + ttl))
redis.call('PEXPIRE', KEYS[1], ttl * 2)
return {granted, demand, count, held}
";

static CLAIMS: LazyLock<Script> = LazyLock::new(|| Script::new(CLAIM_SCRIPT));

/// The largest total a claim carries: Lua's doubles format integers exactly below 2^53,
/// and Envoy's token buckets hold at most 2^32 - 1 anyway.
const MAX_TOTAL: u64 = u32::MAX as u64;

impl RedisStore {
    /// Every claim, one script call each, all at once.
    pub(super) async fn claim_asks(
        &self,
        asks: &[ClaimAsk],
    ) -> Result<Vec<ClaimGrant>, StoreError> {
        let calls = asks.iter().map(|ask| async move {
            let mut cmd = Cmd::new();
            cmd.arg("EVALSHA")
                .arg(CLAIMS.get_hash())
                .arg(1)
                .arg(format!("{}sluice_rlqs_{}", self.shared.prefix, ask.key))
                .arg(&ask.instance)
                .arg(ask.total.min(MAX_TOTAL))
                .arg(ask.want.min(MAX_TOTAL))
                .arg((ask.demand.clamp(0.0, 1e12) * 1000.0) as u64)
                .arg(ask.ttl.as_millis().max(1) as u64);
            let values: Vec<i64> = self.shared.run_script(&CLAIMS, &cmd).await?;
            match values[..] {
                [granted, demand, others, held] => Ok(ClaimGrant {
                    granted: granted.max(0) as u64,
                    others_demand: demand.max(0) as f64 / 1000.0,
                    others: others.max(0) as u64,
                    others_hold: held.max(0) as u64,
                }),
                _ => Err(StoreError::Internal(format!(
                    "the claim script answered {} values",
                    values.len()
                ))),
            }
        });
        join_all(calls).await.into_iter().collect()
    }
}
