//! The Redis store: one limit for the whole fleet.
//!
//! Every request's counters go to Redis in one Lua script call (`lua/*.lua`) that reads
//! Redis's clock, decides every counter and charges them all or none. On a single node (or
//! the Sentinel master) that is one call per request. In a Cluster, counters are grouped by
//! hash slot, one call per group; when the request is rejected as a whole, the hits already
//! charged in other groups are refunded (the error is conservative: briefly counting hits that
//! were not admitted, never admitting more than the limit).

mod connect;
mod slot;

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use redis::Script;

use connect::{ConnHandle, Connector};
pub use connect::{RedisKind, RedisOptions};

use super::{Applied, Batch, BoxFuture, CounterOp, Role, Store, StoreError, StoreStatus, admitted};
use crate::algorithm::{self, Algorithm, Decision, Micros};
use crate::clock::Clock;

/// The script: one function per algorithm (each mirroring its Rust file) and the batch
/// driver. `redis::Script` sends EVALSHA and falls back to EVAL (loading it again) after
/// NOSCRIPT, e.g. when Redis restarted empty.
pub const SCRIPT: &str = concat!(
    include_str!("lua/fixed_window.lua"),
    include_str!("lua/sliding_window.lua"),
    include_str!("lua/token_bucket.lua"),
    include_str!("lua/concurrency.lua"),
    include_str!("lua/batch.lua"),
);

static COUNTERS: LazyLock<Script> = LazyLock::new(|| Script::new(SCRIPT));

/// Counters in Redis.
pub struct RedisStore {
    connector: Connector,
    prefix: String,
    kind: RedisKind,
    /// Time sent to the script instead of Redis's `TIME` (tests and simulations only).
    clock: Option<Arc<dyn Clock>>,
}

/// One script call's answer.
struct Reply {
    admitted: bool,
    now: Micros,
    decisions: Vec<Decision>,
}

impl RedisStore {
    /// Validates `options` and prepares the clients; connections are made on first use.
    pub fn new(options: &RedisOptions) -> Result<Self, String> {
        Ok(Self {
            connector: Connector::new(options)?,
            prefix: options.key_prefix.clone(),
            kind: options.kind,
            clock: None,
        })
    }

    /// Makes the script use `clock` instead of Redis's own `TIME`. For tests that need a
    /// pinned clock (the same worked cases on every store); never in production, where the
    /// whole fleet must share Redis's clock.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Runs the script over `ops` (all in one slot in a Cluster).
    async fn call(
        &self,
        ops: &[&CounterOp],
        always_admit: bool,
        quota_as_shadow: bool,
        guards: Option<&[i64]>,
    ) -> Result<Reply, StoreError> {
        let mut invocation = COUNTERS.prepare_invoke();
        invocation
            .arg(u8::from(always_admit))
            .arg(self.clock.as_ref().map_or(0, |c| c.now()));
        let mut key = String::with_capacity(self.prefix.len() + 64);
        for (i, op) in ops.iter().enumerate() {
            key.clear();
            key.push_str(&self.prefix);
            key.push_str(op.key.as_str());
            invocation.key(key.as_str());
            let role = match op.role {
                Role::Enforce => 0,
                Role::Shadow => 1,
                Role::Quota if quota_as_shadow => 1,
                Role::Quota => 2,
            };
            let algorithm = match op.limit.algorithm {
                Algorithm::FixedWindow => 1,
                Algorithm::SlidingWindow => 2,
                Algorithm::TokenBucket => 3,
                Algorithm::Concurrency => 4,
            };
            invocation
                .arg(algorithm)
                .arg(op.limit.requests)
                .arg(op.limit.window)
                .arg(op.limit.burst)
                .arg(op.hits)
                .arg(role)
                .arg(guards.map_or(-1, |g| g[i]));
        }
        let (index, conn) = self.connector.get().await?;
        let result: Result<Vec<i64>, redis::RedisError> = match conn {
            ConnHandle::Node(mut c) => invocation.invoke_async(&mut c).await,
            ConnHandle::Cluster(mut c) => invocation.invoke_async(&mut c).await,
        };
        let values = result.map_err(|e| {
            let error = StoreError::from(e);
            if error.is_transient() {
                self.connector.reset(index);
            }
            error
        })?;
        decode(&values, ops.len())
    }

    async fn apply_batch(&self, batch: &Batch) -> Result<Applied, StoreError> {
        if batch.ops.is_empty() {
            return Ok(Applied {
                decisions: Vec::new(),
                admitted: true,
                degraded: false,
                from_cache: false,
            });
        }
        if !self.connector.is_cluster() {
            let ops: Vec<&CounterOp> = batch.ops.iter().collect();
            let reply = self.call(&ops, batch.always_admit, false, None).await?;
            return Ok(Applied {
                decisions: reply.decisions,
                admitted: reply.admitted,
                degraded: false,
                from_cache: false,
            });
        }

        // Cluster: one call per hash slot. Each group admits on its own (quota operations
        // decided globally below), then the request's rule is applied to all decisions.
        let mut groups: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (i, op) in batch.ops.iter().enumerate() {
            let key = format!("{}{}", self.prefix, op.key);
            groups
                .entry(slot::slot(key.as_bytes()))
                .or_default()
                .push(i);
        }
        let mut decisions: Vec<Option<Decision>> = vec![None; batch.ops.len()];
        let mut charged: Vec<(Vec<usize>, Micros)> = Vec::new();
        let mut failure = None;
        for indices in groups.values() {
            let ops: Vec<&CounterOp> = indices.iter().map(|&i| &batch.ops[i]).collect();
            match self.call(&ops, batch.always_admit, true, None).await {
                Ok(reply) => {
                    for (&i, d) in indices.iter().zip(reply.decisions) {
                        decisions[i] = Some(d);
                    }
                    if reply.admitted {
                        charged.push((indices.clone(), reply.now));
                    }
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let decisions: Option<Vec<Decision>> = decisions.into_iter().collect();
        let admitted = match (&decisions, &failure) {
            (Some(d), None) => admitted(&batch.ops, d, batch.always_admit),
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
                from_cache: false,
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
            let refunds: Vec<CounterOp> = indices
                .iter()
                .filter(|&&i| {
                    let op = &batch.ops[i];
                    // Concurrency acquisitions stay counted: their releases will come.
                    op.hits > 0
                        && !algorithm::applies_unconditionally(&op.limit, op.hits)
                        && decisions.is_none_or(|d| d[i].allowed)
                })
                .map(|&i| CounterOp {
                    hits: -batch.ops[i].hits,
                    role: Role::Enforce,
                    ..batch.ops[i].clone()
                })
                .collect();
            if refunds.is_empty() {
                continue;
            }
            let guards: Vec<i64> = refunds
                .iter()
                .map(|op| (now - now % op.limit.window) as i64)
                .collect();
            let ops: Vec<&CounterOp> = refunds.iter().collect();
            if let Err(e) = self.call(&ops, true, false, Some(&guards)).await {
                tracing::warn!(error = %e, "could not refund the hits of a rejected request; they expire with their window");
            }
        }
    }
}

fn decode(values: &[i64], n: usize) -> Result<Reply, StoreError> {
    if values.len() != 2 + 4 * n {
        return Err(StoreError::Internal(format!(
            "script returned {} values for {n} counters",
            values.len()
        )));
    }
    let micros = |v: i64| v.max(0) as Micros;
    let decisions = values[2..]
        .chunks_exact(4)
        .map(|c| Decision {
            allowed: c[0] == 1,
            remaining: c[1].max(0) as u64,
            reset_after: micros(c[2]),
            retry_after: (c[3] >= 0).then(|| micros(c[3])),
        })
        .collect();
    Ok(Reply {
        admitted: values[0] == 1,
        now: micros(values[1]),
        decisions,
    })
}

impl Store for RedisStore {
    fn apply<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<Applied, StoreError>> {
        Box::pin(self.apply_batch(batch))
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
            healthy: true,
            detail: None,
            failure_mode_answers: [0; 3],
        }
    }
}
