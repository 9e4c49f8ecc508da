//! Leases in Redis: `lua/lease.lua`, one call per single node (one per hash slot in a
//! Cluster, sent together), and the count of instances taking leases.

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

use futures_util::future::join_all;
use redis::aio::ConnectionManager;
use redis::{Cmd, Script};

use super::{ConnHandle, RedisStore, Shared, query, slot};
use crate::algorithm::{Decision, Micros};
use crate::store::{Grant, LeaseAsk, StoreError, Take};

/// The lease script: the algorithms of the counter script, then the lease driver.
pub const LEASE_SCRIPT: &str = with_algorithms!("lua/lease.lua");

pub(super) static LEASES: LazyLock<Script> = LazyLock::new(|| Script::new(LEASE_SCRIPT));

/// Records an instance in a sorted set scored by Redis's time (ms), drops those older than
/// `ARGV[2]` ms, and answers how many are left.
const INSTANCES_SCRIPT: &str = include_str!("lua/instances.lua");

pub(super) static INSTANCES: LazyLock<Script> = LazyLock::new(|| Script::new(INSTANCES_SCRIPT));

/// The lease script's arguments after the time (`ARGV[1]`), defined once: [`PER_ASK`]
/// values per ask at these offsets. The other half is `lua/lease.lua`, which reads them
/// under the same names.
mod args {
    pub const PER_ASK: usize = 14;
    pub const ALGORITHM: usize = 0;
    pub const LIMIT: usize = 1;
    pub const WINDOW: usize = 2;
    pub const BURST: usize = 3;
    /// The most units to take; negative: units handed back.
    pub const WANT: usize = 4;
    pub const NEED: usize = 5;
    pub const INSTANCES: usize = 6;
    /// The window start a hand-back must still be in, or -1.
    pub const GUARD: usize = 7;
    /// The learning rule ([`crate::store::Report`]): the epoch of the block's units, what it
    /// admitted since its last call, how long a wiped store grants nothing.
    pub const EPOCH: usize = 8;
    pub const ADMITTED: usize = 9;
    pub const HOLD: usize = 10;
    /// For a lease: the time after which nothing is granted (0: none).
    pub const NOT_AFTER: usize = 11;
    /// For a lease: which ask of its asker ([`crate::store::AskId`]; 0: none), kept under
    /// the ask's second key (the asker's) for a retry.
    pub const SEQ: usize = 12;
    /// A fixed window's start the ask is for (0: the current one).
    pub const START: usize = 13;
    /// Values per ask in the answer: units, allowed, remaining, reset, retry, the time of
    /// the grant (a retry's: the first one's; 0: the call's).
    pub const PER_GRANT: usize = 6;
}

impl RedisStore {
    /// Every ask, one script call per node or hash slot, all sent at once.
    pub(super) async fn lease_asks(&self, asks: &[LeaseAsk]) -> Result<Vec<Grant>, StoreError> {
        if !self.shared.connector.is_cluster() {
            let epoch = format!("{}sluice_epoch", self.shared.prefix);
            return self.shared.lease_call(asks, epoch).await;
        }
        let mut groups: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (i, ask) in asks.iter().enumerate() {
            let key = format!("{}{}", self.shared.prefix, ask.key);
            groups
                .entry(slot::slot(key.as_bytes()))
                .or_default()
                .push(i);
        }
        let groups: Vec<(Vec<usize>, Vec<LeaseAsk>)> = groups
            .into_values()
            .map(|indices| {
                let part = indices.iter().map(|&i| asks[i].clone()).collect();
                (indices, part)
            })
            .collect();
        let replies = join_all(groups.iter().map(|(_, part)| {
            let key = format!("{}{}", self.shared.prefix, part[0].key);
            let slot = slot::slot(key.as_bytes());
            let epoch = format!(
                "{}sluice_epoch{{{}}}",
                self.shared.prefix,
                slot::tag_for(slot)
            );
            self.shared.lease_call(part, epoch)
        }))
        .await;
        let calls = groups.iter().map(|(indices, _)| &indices[..]).zip(replies);
        crate::store::in_ask_order(asks.len(), calls, "a lease")
    }

    /// Records `instance` and counts the instances seen within `within`.
    pub(super) async fn count_instances(
        &self,
        instance: &str,
        within: Duration,
    ) -> Result<u64, StoreError> {
        let key = format!("{}sluice_lease_instances", self.shared.prefix);
        let mut cmd = Cmd::new();
        cmd.arg("EVALSHA")
            .arg(INSTANCES.get_hash())
            .arg(1)
            .arg(key)
            .arg(instance)
            .arg(within.as_millis().max(1) as u64);
        let count: i64 = self.shared.run_script(&INSTANCES, &cmd).await?;
        Ok(count.max(1) as u64)
    }
}

impl Shared {
    /// Where an ask with an id is kept for its retry: beside its counter (its hash slot),
    /// per asker. (An ask without one names its counter, which the script leaves alone.)
    fn ask_key(&self, ask: &LeaseAsk) -> String {
        let counter = format!("{}{}", self.prefix, ask.key);
        if ask.id.seq == 0 {
            return counter;
        }
        let tag = slot::tag_for(slot::slot(counter.as_bytes()));
        format!(
            "{}sluice_ask{{{tag}}}|{}|{}",
            self.prefix, ask.id.asker, ask.key
        )
    }

    /// One lease script call over `asks` (all on one node, one slot), with the key of the
    /// store's epoch there (`epoch`).
    async fn lease_call(&self, asks: &[LeaseAsk], epoch: String) -> Result<Vec<Grant>, StoreError> {
        let now = self.clock.get().map_or(0, |c| c.now());
        let mut cmd = Cmd::with_capacity(5 + asks.len() * (2 + args::PER_ASK), 96 * asks.len());
        cmd.arg("EVALSHA")
            .arg(LEASES.get_hash())
            .arg(2 * asks.len() + 1);
        for ask in asks {
            cmd.arg(format!("{}{}", self.prefix, ask.key));
        }
        for ask in asks {
            cmd.arg(self.ask_key(ask));
        }
        cmd.arg(epoch);
        cmd.arg(now);
        for ask in asks {
            cmd.arg(&encode(ask)[..]);
        }
        let values: Vec<i64> = self.run_script(&LEASES, &cmd).await?;
        decode(&values, asks.len())
    }

    /// Runs `cmd` (an EVALSHA of `script`) on a connection, loading the script after
    /// NOSCRIPT; a transient error makes a connection (a Sentinel's: the master) be found
    /// again.
    pub(super) async fn run_script<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        cmd: &Cmd,
    ) -> Result<T, StoreError> {
        let (index, conn) = self.connector.get().await?;
        let result = match conn {
            ConnHandle::Node(mut c) => match query(script, cmd, &mut c).await {
                Ok(value) => self.wait_for_replicas(&mut c).await.map(|()| value),
                Err(e) => Err(e),
            },
            ConnHandle::Cluster(mut c) => query(script, cmd, &mut c).await,
        };
        result.map_err(|e| {
            let error = StoreError::from(e);
            if error.is_transient() {
                self.connector.reset(index);
            }
            error
        })
    }
}

impl Shared {
    /// With `REDIS_WAIT_REPLICAS`, waits (`WAIT`, at most the call timeout) until that many
    /// replicas hold what this connection wrote so far, the script call just made included;
    /// fewer is an error (the failure mode answers): a count only the master holds can be
    /// lost by a failover.
    async fn wait_for_replicas(&self, conn: &mut ConnectionManager) -> redis::RedisResult<()> {
        if self.wait_replicas == 0 {
            return Ok(());
        }
        let acknowledged: u32 = redis::cmd("WAIT")
            .arg(self.wait_replicas)
            .arg(self.call_timeout.as_millis().max(1) as u64)
            .query_async(conn)
            .await?;
        if acknowledged >= self.wait_replicas {
            return Ok(());
        }
        Err(redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::MasterDown),
            "REDIS_WAIT_REPLICAS not met",
            format!(
                "{acknowledged} of {} replicas acknowledged the write",
                self.wait_replicas
            ),
        )))
    }
}

/// One ask's values, in the layout of [`args`].
fn encode(ask: &LeaseAsk) -> [i64; args::PER_ASK] {
    let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let mut values = [0; args::PER_ASK];
    values[args::ALGORITHM] = super::args::algorithm_code(ask.limit.algorithm);
    values[args::LIMIT] = clamp(ask.limit.requests);
    values[args::WINDOW] = clamp(ask.limit.window);
    values[args::BURST] = clamp(ask.limit.burst);
    values[args::GUARD] = ask.guard().map_or(-1, clamp);
    values[args::EPOCH] = clamp(ask.report.epoch);
    values[args::ADMITTED] = clamp(ask.report.admitted);
    values[args::HOLD] = clamp(ask.report.hold);
    values[args::NOT_AFTER] = clamp(ask.not_after);
    values[args::SEQ] = clamp(ask.id.seq);
    values[args::START] = clamp(ask.start);
    // (A hand-back names what the counter must still be at: its window's start, or the
    // bucket's arrival time the lease left; lua/lease.lua checks it.)
    match ask.take {
        Take::Lease(want) => {
            values[args::WANT] = clamp(want.want);
            values[args::NEED] = clamp(want.need.max(1));
            values[args::INSTANCES] = clamp(want.instances.max(1));
        }
        Take::GiveBack { units, .. } => {
            // No units: only the report (want 0, need 0).
            values[args::WANT] = -clamp(units);
            values[args::NEED] = i64::from(units > 0);
            values[args::INSTANCES] = 1;
        }
    }
    values
}

/// The grants of `asks` asks from the script's answer (layout in `lua/lease.lua`).
fn decode(values: &[i64], asks: usize) -> Result<Vec<Grant>, StoreError> {
    let [now, epoch, rest @ ..] = values else {
        return Err(StoreError::Internal(
            "the lease script returned no time and epoch".into(),
        ));
    };
    let (now, epoch) = (*now, *epoch);
    if rest.len() != asks * args::PER_GRANT {
        return Err(StoreError::Internal(format!(
            "the lease script answered {} values for {asks} asks",
            rest.len()
        )));
    }
    let micros = |v: i64| v.max(0) as Micros;
    Ok(rest
        .chunks_exact(args::PER_GRANT)
        .map(|g| Grant {
            units: g[0].max(0) as u64,
            decision: Decision {
                overdraft: 0,
                allowed: g[1] == 1,
                remaining: g[2].max(0) as u64,
                reset_after: micros(g[3]),
                retry_after: (g[1] != 1 && g[4] >= 0).then(|| micros(g[4])),
            },
            now: micros(if g[5] > 0 { g[5] } else { now }),
            epoch: micros(epoch),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_that_do_not_add_up_are_refused() {
        assert!(decode(&[], 0).is_err());
        assert!(decode(&[5, 1, 1, 1, 0, 0], 1).is_err());
        let grants = decode(&[7, 6, 3, 1, 9, 100, -1, 5, 0, 0, 0, 50, 40, 0], 2).unwrap();
        assert_eq!(grants[0].units, 3);
        assert!(grants[0].decision.allowed);
        assert_eq!(grants[0].decision.retry_after, None);
        assert!(!grants[1].decision.allowed);
        assert_eq!(grants[1].decision.retry_after, Some(40));
        assert_eq!((grants[0].now, grants[1].now), (5, 7));
        assert_eq!(grants[1].epoch, 6);
    }
}
