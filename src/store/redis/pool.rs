//! Regions' pools of global counters in Redis ([`crate::store::pool`]): `lua/pool.lua`, one
//! call per single node (one per hash slot in a Cluster, sent together). A pool's key is its
//! counter's under `pool|`: `<prefix>pool|<counter key>`.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use futures_util::future::join_all;
use redis::{Cmd, Script};

use super::{RedisStore, slot};
use crate::algorithm::Micros;
use crate::store::StoreError;
use crate::store::pool::{PoolAnswer, PoolKind, PoolOp, RootAsk};

const POOL_SCRIPT: &str = include_str!("lua/pool.lua");

static POOLS: LazyLock<Script> = LazyLock::new(|| Script::new(POOL_SCRIPT));

/// The script's layout, defined once; `lua/pool.lua` reads it under the same names.
mod args {
    /// Values per operation: its kind, then twelve.
    pub const PER_OP: usize = 13;
    pub const TAKE: i64 = 1;
    pub const RETURN: i64 = 2;
    pub const INSTALL: i64 = 3;
    pub const WITHDRAW: i64 = 4;
    /// Values per answer.
    pub const PER_ANSWER: usize = 15;
    pub const ROOT_FAILED: i64 = 1;
    pub const ASKING: i64 = 2;
    pub const ASKS: i64 = 4;
    pub const ASKS_NEXT: i64 = 8;
}

impl RedisStore {
    /// Every operation, one script call per node or hash slot, all sent at once.
    pub(super) async fn pool_ops(&self, ops: &[PoolOp]) -> Result<Vec<PoolAnswer>, StoreError> {
        if !self.shared.connector.is_cluster() {
            let all: Vec<usize> = (0..ops.len()).collect();
            return self.pool_call(ops, &all).await;
        }
        let mut groups: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (i, op) in ops.iter().enumerate() {
            groups
                .entry(slot::slot(self.pool_key(op).as_bytes()))
                .or_default()
                .push(i);
        }
        let replies = join_all(groups.values().map(|indices| self.pool_call(ops, indices))).await;
        let calls = groups.values().map(|indices| &indices[..]).zip(replies);
        crate::store::in_ask_order(ops.len(), calls, "a pool operation")
    }

    fn pool_key(&self, op: &PoolOp) -> String {
        format!("{}pool|{}", self.shared.prefix, op.key)
    }

    async fn pool_call(
        &self,
        ops: &[PoolOp],
        indices: &[usize],
    ) -> Result<Vec<PoolAnswer>, StoreError> {
        let now = self.shared.clock.get().map_or(0, |c| c.now());
        let mut cmd = Cmd::with_capacity(4 + indices.len() * (1 + args::PER_OP), 64);
        cmd.arg("EVALSHA").arg(POOLS.get_hash()).arg(indices.len());
        for &i in indices {
            cmd.arg(self.pool_key(&ops[i]));
        }
        cmd.arg(now);
        for &i in indices {
            cmd.arg(&encode(&ops[i].kind)[..]);
        }
        let values: Vec<i64> = self.shared.run_script(&POOLS, &cmd).await?;
        decode(&values, indices.len())
    }
}

fn encode(kind: &PoolKind) -> [i64; args::PER_OP] {
    let c = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let mut values = [0; args::PER_OP];
    match *kind {
        PoolKind::Take {
            want,
            need,
            instances,
            demand,
            timing,
        } => {
            values.copy_from_slice(&[
                args::TAKE,
                c(want),
                c(need),
                c(instances.max(1)),
                c(demand),
                c(timing.lead),
                c(timing.period),
                c(timing.ask_ttl),
                c(timing.window.max(1)),
                c(timing.floor),
                i64::from(timing.advance),
                0,
                0,
            ]);
        }
        PoolKind::Return {
            units,
            generation,
            guard,
        } => values[..4].copy_from_slice(&[args::RETURN, c(units), c(generation), c(guard)]),
        PoolKind::Install(i) => {
            values = [
                args::INSTALL,
                c(i.units),
                c(i.guard),
                c(i.epoch),
                c(i.asked_at),
                i.offset,
                c(i.left),
                c(i.reported),
                c(i.retry_at),
                i64::from(i.failed),
                c(i.interval.min(crate::store::pool::MAX_INTERVAL)),
                c(i.from),
                c(i.prev_guard),
            ];
        }
        PoolKind::Withdraw { idle } => values[..2].copy_from_slice(&[args::WITHDRAW, c(idle)]),
    }
    values
}

fn decode(values: &[i64], ops: usize) -> Result<Vec<PoolAnswer>, StoreError> {
    let [now, rest @ ..] = values else {
        return Err(StoreError::Internal(
            "the pool script returned no time".into(),
        ));
    };
    if rest.len() != ops * args::PER_ANSWER {
        return Err(StoreError::Internal(format!(
            "the pool script answered {} values for {ops} operations",
            rest.len()
        )));
    }
    let u = |v: i64| v.max(0) as Micros;
    Ok(rest
        .chunks_exact(args::PER_ANSWER)
        .map(|a| PoolAnswer {
            units: u(a[0]),
            free: u(a[1]),
            now: u(*now),
            root_now: u(a[2]),
            until: u(a[3]),
            guard: u(a[4]),
            epoch: u(a[5]),
            generation: u(a[6]),
            mark: u(a[13]),
            tokens_end: u(a[14]),
            root_failed: a[7] & args::ROOT_FAILED != 0,
            asking: a[7] & args::ASKING != 0,
            ask: (a[7] & args::ASKS != 0).then(|| RootAsk {
                units: u(a[8]),
                epoch: u(a[9]),
                admitted: u(a[10]),
                used: u(a[11]),
                guard: u(a[12]),
                next: a[7] & args::ASKS_NEXT != 0,
            }),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_that_do_not_add_up_are_refused() {
        assert!(decode(&[], 0).is_err());
        assert!(decode(&[5, 1, 1], 1).is_err());
        let answers = decode(&[7, 3, 9, 100, 200, 60, 2, 50, 2, 0, 0, 0, 0, 0, 4, 0], 1).unwrap();
        assert_eq!(answers[0].units, 3);
        assert_eq!(answers[0].root_now, 100);
        assert!(answers[0].asking && answers[0].ask.is_none() && !answers[0].root_failed);
        assert_eq!(answers[0].now, 7);
        assert_eq!(answers[0].mark, 4);
    }
}
