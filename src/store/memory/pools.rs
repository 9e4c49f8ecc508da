//! Regions' pools of global counters in memory ([`crate::store::pool`]): the model of a
//! region's Redis that tests run several regions over.

use std::collections::HashMap;

use crate::algorithm::Micros;
use crate::store::CounterKey;
use crate::store::pool::{Pool, PoolAnswer, PoolKind, PoolOp};

/// Most pools kept; past it, ended ones are dropped, and a new pool is refused while none
/// has ended (its takes answer nothing: under, never over).
const MAX_POOLS: usize = 100_000;

#[derive(Default)]
pub(super) struct Pools {
    pools: HashMap<CounterKey, Pool>,
}

impl Pools {
    pub(super) fn apply(&mut self, ops: &[PoolOp], now: Micros) -> Vec<PoolAnswer> {
        ops.iter().map(|op| self.apply_one(op, now)).collect()
    }

    fn apply_one(&mut self, op: &PoolOp, now: Micros) -> PoolAnswer {
        if !self.pools.contains_key(&op.key) && self.pools.len() >= MAX_POOLS {
            self.pools.retain(|_, pool| pool.keep_until() > now);
            if self.pools.len() >= MAX_POOLS {
                return Pool::default().apply(&PoolKind::Withdraw { idle: 0 }, now);
            }
        }
        let pool = self.pools.entry(op.key.clone()).or_default();
        pool.apply(&op.kind, now)
    }
}
