// Why one long file: the single-node and Cluster paths share the script's argument encoder, kept
// beside both (the reply decoder is in reply.rs, the keys in keys.rs).
//! The Redis store: one limit for the whole fleet.
//!
//! Every request's counters go to Redis in one Lua script call (`lua/*.lua`) that reads
//! Redis's clock, decides every counter and charges them all or none. On a single node (or
//! the Sentinel master) that is at most one call per request: requests that arrive while a
//! call is out share the next one (`coalesce.rs`). In a Cluster, counters are grouped by
//! hash slot, one call per group, all sent at once; when the request is rejected as a whole,
//! the hits already charged in other groups are refunded (the error is conservative: briefly
//! counting hits that were not admitted, never admitting more than the limit).

/// A script: the prelude, one function per algorithm and their dispatch table, then `driver`
/// (the counter script's `batch.lua` or the lease script's `lease.lua`).
macro_rules! with_algorithms {
    ($driver:literal) => {
        concat!(
            include_str!("lua/prelude.lua"),
            include_str!("lua/fixed_window.lua"),
            include_str!("lua/sliding_window.lua"),
            include_str!("lua/token_bucket.lua"),
            include_str!("lua/concurrency.lua"),
            include_str!("lua/dispatch.lua"),
            include_str!($driver),
        )
    };
}

mod claim;
mod coalesce;
mod connect;
mod eviction;
mod keys;
mod lease;
mod pool;
mod refused;
mod reply;
mod slot;

use futures_util::future::join_all;
use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

use redis::{Cmd, Script};

use coalesce::Queue;
use connect::{ConnHandle, Connector};
pub use connect::{RedisKind, RedisOptions};
use reply::decode;

use super::{
    Admission, Applied, Batch, BoxFuture, Calls, CounterOp, Role, Store, StoreError, StoreStatus,
    admitted,
};
use crate::algorithm::{Decision, Micros};
use crate::clock::Clock;

/// The script: one function per algorithm (each mirroring its Rust file) and the batch
/// driver. Sent with EVALSHA; after NOSCRIPT (e.g. when Redis restarted empty) it is loaded
/// again and the call repeated.
pub const SCRIPT: &str = with_algorithms!("lua/batch.lua");

static COUNTERS: LazyLock<Script> = LazyLock::new(|| Script::new(SCRIPT));

/// Counters in Redis.
pub struct RedisStore {
    shared: Arc<Shared>,
    kind: RedisKind,
}

/// What the store and its script calls in flight share.
struct Shared {
    connector: Connector,
    prefix: String,
    /// Time sent to the script instead of Redis's `TIME` (tests and simulations only).
    clock: OnceLock<Arc<dyn Clock>>,
    /// Expiry jitter of reference-layout counters.
    jitter: keys::Jitter,
    /// Longest wait for one script call's answer.
    call_timeout: Duration,
    /// Requests waiting for the next script call (single node and Sentinel).
    queue: Queue,
    /// Whether Redis's eviction policy can evict counters (read at start-up).
    eviction: eviction::Eviction,
    /// Replicas every script call waits for (`REDIS_WAIT_REPLICAS`).
    wait_replicas: u32,
}

/// The script's arguments after the time (`ARGV[1]`), defined once: per request a header of
/// [`HEADER`](args::HEADER) values (admission, number of counters), then
/// [`PER_COUNTER`](args::PER_COUNTER) values per counter at these offsets. The other half is
/// `lua/batch.lua`, which reads them under the same names (as 1-based Lua locals).
mod args {
    pub const HEADER: usize = 2;
    pub const PER_COUNTER: usize = 7;
    pub const ALGORITHM: usize = 0;
    pub const LIMIT: usize = 1;
    pub const WINDOW: usize = 2;
    pub const BURST: usize = 3;
    pub const HITS: usize = 4;
    pub const ROLE: usize = 5;
    /// The window start a refund must still be in, or -1.
    pub const GUARD: usize = 6;

    pub const ADMIT_BY_RULE: i64 = 0;
    pub const ADMIT_ALWAYS: i64 = 1;
    pub const ADMIT_NEVER: i64 = 2;
    pub const FIXED_WINDOW: i64 = 1;
    pub const SLIDING_WINDOW: i64 = 2;
    pub const TOKEN_BUCKET: i64 = 3;
    pub const CONCURRENCY: i64 = 4;
    /// A fixed window in the reference's layout (`REDIS_KEY_FORMAT=reference`): a plain
    /// integer, with its expiry (s) in the burst slot. Counter script only.
    pub const REFERENCE_WINDOW: i64 = 5;
    /// Added to a usage budget's algorithm code (`Limit::overdraft`): its charges are
    /// recorded even when refused. Counter script only (budgets are never leased).
    pub const OVERDRAFT: i64 = 16;
    pub const ROLE_ENFORCE: i64 = 0;
    pub const ROLE_SHADOW: i64 = 1;
    pub const ROLE_QUOTA: i64 = 2;

    /// An algorithm's code in both scripts (`lua/dispatch.lua`).
    pub fn algorithm_code(algorithm: crate::algorithm::Algorithm) -> i64 {
        use crate::algorithm::Algorithm;
        match algorithm {
            Algorithm::FixedWindow => FIXED_WINDOW,
            Algorithm::SlidingWindow => SLIDING_WINDOW,
            Algorithm::TokenBucket => TOKEN_BUCKET,
            Algorithm::Concurrency => CONCURRENCY,
        }
    }
}

/// One request's share of a script call: its keys and arguments (see `lua/batch.lua`).
struct Part {
    keys: Vec<String>,
    /// Admission (0 by rule, 1 always, 2 never), number of counters, then seven values per
    /// counter.
    args: Vec<i64>,
}

/// One request's answer.
struct Reply {
    admitted: bool,
    now: Micros,
    decisions: Vec<Decision>,
    /// Requests in the script call that decided it.
    shared: usize,
}

impl RedisStore {
    /// Validates `options` and prepares the clients; connections are made by
    /// [`Shared::warm_up`](crate::store::Shared::warm_up) or on first use.
    pub fn new(options: &RedisOptions) -> Result<Self, String> {
        if options.wait_replicas > 0 && options.kind == RedisKind::Cluster {
            return Err(
                "REDIS_WAIT_REPLICAS is for a single Redis or Sentinel: WAIT cannot cover a Cluster's writes (each master has its own replicas)".into(),
            );
        }
        Ok(Self {
            shared: Arc::new(Shared {
                connector: Connector::new(options)?,
                prefix: options.key_prefix.clone(),
                clock: OnceLock::new(),
                jitter: keys::Jitter::new(options.expiration_jitter.as_secs()),
                call_timeout: options.call_timeout,
                queue: Queue::new(options.connections.max(1)),
                eviction: Default::default(),
                wait_replicas: options.wait_replicas,
            }),
            kind: options.kind,
        })
    }

    /// Makes the script use `clock` instead of Redis's own `TIME`. For tests that need a
    /// pinned clock (the same worked cases on every store); never in production, where the
    /// whole fleet must share Redis's clock.
    pub fn with_clock(self, clock: Arc<dyn Clock>) -> Self {
        let _ = self.shared.clock.set(clock);
        self
    }

    /// Encodes one request's `ops` (all in one slot in a Cluster) for the script, in the
    /// layout of [`args`].
    fn part(
        &self,
        ops: &[&CounterOp],
        admission: Admission,
        quota_as_shadow: bool,
        guards: Option<&[i64]>,
    ) -> Part {
        let now = self.shared.keys_now(ops.iter().copied());
        let mut args = Vec::with_capacity(args::HEADER + args::PER_COUNTER * ops.len());
        let admission = match admission {
            Admission::ByRule => args::ADMIT_BY_RULE,
            Admission::Always => args::ADMIT_ALWAYS,
            Admission::Never => args::ADMIT_NEVER,
        };
        args.extend([admission, ops.len() as i64]);
        let keys = ops
            .iter()
            .enumerate()
            .map(|(i, op)| {
                let role = match op.role {
                    Role::Enforce => args::ROLE_ENFORCE,
                    Role::Shadow => args::ROLE_SHADOW,
                    Role::Quota if quota_as_shadow => args::ROLE_SHADOW,
                    Role::Quota => args::ROLE_QUOTA,
                };
                let (algorithm, burst) = self.shared.script_algorithm(op);
                let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
                let mut counter = [0; args::PER_COUNTER];
                counter[args::ALGORITHM] = algorithm
                    + if op.limit.overdraft {
                        args::OVERDRAFT
                    } else {
                        0
                    };
                counter[args::LIMIT] = clamp(op.limit.requests);
                counter[args::WINDOW] = clamp(op.limit.window);
                counter[args::BURST] = burst;
                counter[args::HITS] = op.hits;
                counter[args::ROLE] = role;
                counter[args::GUARD] = guards.map_or(-1, |g| g[i]);
                args.extend(counter);
                self.shared.key_of(op, now)
            })
            .collect();
        Part { keys, args }
    }

    /// Runs one request's `ops` in a script call of their own (a Cluster slot group, or a
    /// refund).
    async fn call(
        &self,
        ops: &[&CounterOp],
        admission: Admission,
        quota_as_shadow: bool,
        guards: Option<&[i64]>,
    ) -> Result<Reply, StoreError> {
        let part = self.part(ops, admission, quota_as_shadow, guards);
        let values = self.shared.invoke(&[&part]).await?;
        decode(&values, &[&part])?
            .pop()
            .ok_or_else(|| StoreError::Internal("the script returned no answer".into()))?
    }

    async fn apply_batch(&self, batch: &Batch) -> Result<Applied, StoreError> {
        if batch.ops.is_empty() {
            return Ok(Applied {
                decisions: Vec::new(),
                admitted: true,
                degraded: false,
                cached: Vec::new(),
                decided_at: None,
                calls: Default::default(),
            });
        }
        // Refunds of a charge made at a known time stay in its windows.
        let guards: Option<Vec<i64>> = batch.charged_at.map(|_| {
            batch
                .ops
                .iter()
                .map(|op| batch.refund_guard(op).map_or(-1, |g| g as i64))
                .collect()
        });
        if self.shared.connector.is_cluster() {
            self.apply_cluster(batch, guards).await
        } else {
            self.apply_single(batch, guards).await
        }
    }

    /// One node (or Sentinel's master): one call per request at most; requests that arrive
    /// while a call is in flight go together in the next.
    async fn apply_single(
        &self,
        batch: &Batch,
        guards: Option<Vec<i64>>,
    ) -> Result<Applied, StoreError> {
        let ops: Vec<&CounterOp> = batch.ops.iter().collect();
        let part = self.part(&ops, batch.admission, false, guards.as_deref());
        let reply = Shared::submit(&self.shared, part).await?;
        Ok(Applied {
            decisions: reply.decisions,
            admitted: reply.admitted,
            degraded: false,
            cached: Vec::new(),
            decided_at: Some(reply.now),
            calls: Calls::one(reply.shared),
        })
    }

    /// A Cluster: one call per hash slot, the calls of a request sent together, and refunds
    /// of the groups that charged when the request as a whole is rejected.
    async fn apply_cluster(
        &self,
        batch: &Batch,
        guards: Option<Vec<i64>>,
    ) -> Result<Applied, StoreError> {
        // One call per hash slot. Each group admits on its own (quota operations
        // decided globally below), then the request's rule is applied to all decisions.
        let mut groups: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        let now = self.shared.keys_now(batch.ops.iter());
        for (i, op) in batch.ops.iter().enumerate() {
            let key = self.shared.key_of(op, now);
            groups
                .entry(slot::slot(key.as_bytes()))
                .or_default()
                .push(i);
        }
        // The groups' calls go out together (each to its slot's node): one round trip.
        type Group<'b> = (Vec<usize>, Vec<&'b CounterOp>, Option<Vec<i64>>);
        let groups: Vec<Group<'_>> = groups
            .into_values()
            .map(|indices| {
                let ops = indices.iter().map(|&i| &batch.ops[i]).collect();
                let group_guards = guards
                    .as_ref()
                    .map(|g| indices.iter().map(|&i| g[i]).collect());
                (indices, ops, group_guards)
            })
            .collect();
        let groups_sent = groups.len().min(u32::MAX as usize) as u32;
        let replies: Vec<Result<Reply, StoreError>> = join_all(
            groups
                .iter()
                .map(|(_, ops, guards)| self.call(ops, batch.admission, true, guards.as_deref())),
        )
        .await;
        let mut decisions: Vec<Option<Decision>> = vec![None; batch.ops.len()];
        let mut charged: Vec<(Vec<usize>, Micros)> = Vec::new();
        let mut failure = None;
        for ((indices, _, _), reply) in groups.into_iter().zip(replies) {
            match reply {
                Ok(reply) => {
                    for (&i, d) in indices.iter().zip(reply.decisions) {
                        decisions[i] = Some(d);
                    }
                    if reply.admitted {
                        charged.push((indices, reply.now));
                    }
                }
                Err(e) => failure = Some(e),
            }
        }
        let decisions: Option<Vec<Decision>> = decisions.into_iter().collect();
        let admitted = match (&decisions, &failure) {
            (Some(d), None) => admitted(&batch.ops, d, batch.admission),
            _ => false,
        };
        if !admitted {
            self.refund(batch, &charged, decisions.as_deref()).await;
        }
        match (decisions, failure) {
            (Some(decisions), None) => Ok(Applied {
                decisions,
                admitted,
                degraded: false,
                cached: Vec::new(),
                // One clock per node, all within a few milliseconds: the earliest stands for
                // them (a later refund's window check is then at most that far off).
                decided_at: charged.iter().map(|(_, now)| *now).min(),
                calls: Calls {
                    script_calls: groups_sent,
                    requests_per_call: 1,
                },
            }),
            (_, Some(e)) => Err(e),
            (None, None) => Err(StoreError::Internal(
                "a cluster group returned no decision".into(),
            )),
        }
    }

    /// Takes back the hits that groups of a rejected request charged, within the same window.
    async fn refund(
        &self,
        batch: &Batch,
        charged: &[(Vec<usize>, Micros)],
        decisions: Option<&[Decision]>,
    ) {
        for (indices, now) in charged {
            let refunds = Batch {
                ops: indices
                    .iter()
                    .filter(|&&i| decisions.is_none_or(|d| d[i].allowed))
                    .filter_map(|&i| batch.ops[i].refund())
                    .collect(),
                admission: Admission::Always,
                deadline: None,
                charged_at: Some(*now),
            };
            if refunds.ops.is_empty() {
                continue;
            }
            let guards: Vec<i64> = refunds
                .ops
                .iter()
                .map(|op| refunds.refund_guard(op).map_or(-1, |g| g as i64))
                .collect();
            let ops: Vec<&CounterOp> = refunds.ops.iter().collect();
            static LOGGED: crate::logging::Every =
                crate::logging::Every::new(std::time::Duration::from_secs(10));
            if let Err(e) = self
                .call(&ops, Admission::Always, false, Some(&guards))
                .await
                && LOGGED.ready()
            {
                tracing::warn!(error = %e, "could not refund the hits of a rejected request; they expire with their window");
            }
        }
    }
}

impl Shared {
    /// One EVALSHA over the counters of `parts`; after NOSCRIPT the script is loaded and the
    /// call repeated. A transient error makes a Sentinel connection look for the master again.
    async fn invoke(&self, parts: &[&Part]) -> Result<Vec<i64>, StoreError> {
        let now = self.clock.get().map_or(0, |c| c.now());
        self.run_script(&COUNTERS, &command(parts, now)).await
    }
}

fn command(parts: &[&Part], now: Micros) -> Cmd {
    let keys: usize = parts.iter().map(|p| p.keys.len()).sum();
    let args: usize = parts.iter().map(|p| p.args.len()).sum();
    let bytes: usize = parts
        .iter()
        .flat_map(|p| &p.keys)
        .map(|k| k.len())
        .sum::<usize>()
        + 12 * args
        + 80;
    let mut cmd = Cmd::with_capacity(4 + keys + args, bytes);
    cmd.arg("EVALSHA").arg(COUNTERS.get_hash()).arg(keys);
    for key in parts.iter().flat_map(|p| &p.keys) {
        cmd.arg(key.as_str());
    }
    cmd.arg(now);
    for &arg in parts.iter().flat_map(|p| &p.args) {
        cmd.arg(arg);
    }
    cmd
}

async fn query<T: redis::FromRedisValue>(
    script: &Script,
    cmd: &Cmd,
    conn: &mut impl redis::aio::ConnectionLike,
) -> redis::RedisResult<T> {
    match cmd.query_async(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.prepare_invoke().load_async(conn).await?;
            cmd.query_async(conn).await
        }
        result => result,
    }
}

impl Store for RedisStore {
    fn apply<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<Applied, StoreError>> {
        Box::pin(self.apply_batch(batch))
    }

    fn reset<'a>(&'a self, ops: &'a [CounterOp]) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(self.delete(ops))
    }

    /// Holds nothing: every count is in Redis already (connections close when dropped).
    fn shut_down(&self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }

    fn store_key(&self, op: &CounterOp) -> String {
        self.shared.key_of(op, self.shared.local_now())
    }

    fn status(&self) -> StoreStatus {
        StoreStatus {
            kind: match self.kind {
                RedisKind::Single => "redis",
                RedisKind::Cluster => "redis-cluster",
                RedisKind::Sentinel => "redis-sentinel",
            },
            tracked_keys: None,
            max_keys: None,
            evicted_keys: 0,
            bytes: None,
            full: false,
            healthy: true,
            detail: None,
            failure_mode_answers: Default::default(),
            leases: None,
            region: None,
            evicts_counters: self.shared.eviction.evicts(),
        }
    }
}

impl crate::store::Shared for RedisStore {
    fn lease<'a>(
        &'a self,
        asks: &'a [super::LeaseAsk],
    ) -> BoxFuture<'a, Result<Vec<super::Grant>, StoreError>> {
        Box::pin(self.lease_asks(asks))
    }

    fn instances<'a>(
        &'a self,
        instance: &'a str,
        within: Duration,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(self.count_instances(instance, within))
    }

    fn pool<'a>(
        &'a self,
        ops: &'a [crate::store::PoolOp],
    ) -> BoxFuture<'a, Result<Vec<crate::store::PoolAnswer>, StoreError>> {
        Box::pin(self.pool_ops(ops))
    }

    fn claim<'a>(
        &'a self,
        asks: &'a [crate::store::ClaimAsk],
    ) -> BoxFuture<'a, Result<Vec<crate::store::ClaimGrant>, StoreError>> {
        Box::pin(self.claim_asks(asks))
    }

    fn add_refused<'a>(
        &'a self,
        adds: &'a [crate::store::RefusedAdd],
    ) -> BoxFuture<'a, Result<Vec<u32>, StoreError>> {
        Box::pin(self.add_refused_sets(adds))
    }

    fn close_refused<'a>(
        &'a self,
        closes: &'a [crate::store::RefusedClose],
    ) -> BoxFuture<'a, Result<Vec<crate::store::RefusedCounts>, StoreError>> {
        Box::pin(self.close_refused_sets(closes))
    }

    fn probe(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        // The script with no counters: Redis answers it only when it runs scripts at all
        // (not paused, not BUSY, not LOADING), and it loads the script if it must.
        Box::pin(async move { self.shared.invoke(&[]).await.map(|_| ()) })
    }

    fn warm_up(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            // Every connection made and the script loaded: the first requests of a fresh
            // instance (a rollout, a scale-up) then cost one round trip like any other.
            for _ in 0..self.shared.connector.len() {
                let result = match self.shared.connector.get().await {
                    Ok((_, ConnHandle::Node(mut c))) => {
                        COUNTERS.prepare_invoke().load_async(&mut c).await
                    }
                    Ok((_, ConnHandle::Cluster(mut c))) => {
                        COUNTERS.prepare_invoke().load_async(&mut c).await
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "redis not reachable at startup; serving by failure_mode until it is");
                        return;
                    }
                };
                if let Err(e) = result {
                    tracing::warn!(error = %e, "could not load the script into redis at startup");
                    return;
                }
            }
            tracing::info!("redis connections ready, script loaded");
            self.check_eviction().await;
        })
    }
}
