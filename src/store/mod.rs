//! Counter stores. Two async, object-safe traits, by capability: [`Store`], what every layer
//! of the stack decides itself (apply a request's batch, reset, the counter's key, status,
//! shut down), and [`Shared`], what only a store shared by the fleet does beside counting
//! (lease, count instances, claim RLQS budgets, probe, warm up). A store applies all of a
//! request's counter operations in one call, atomically, so that a request answered
//! OVER_LIMIT charges nothing on any of its descriptors.
//!
//! The stores, then the layers that wrap a shared one, from the inside out (the order in
//! which `app` stacks them):
//!
//! - [`memory`]: sharded in-process map, the embedded default (one instance only). Shared.
//! - [`redis`]: Redis, Redis Cluster or Sentinel: one limit for the whole fleet. Shared.
//! - [`resilient`]: deadline, circuit breaker and `failure_mode` around a shared store.
//!   Shared.
//! - [`split`]: per-second counters on a Redis of their own (`REDIS_PERSECOND`). Shared.
//! - [`region`]: global counters (`scope: global`) through this region's [`pool`]s, granted
//!   by a root counter in another store (`ROOT_REDIS_URL`). Shared.
//! - [`lease`]: leased quota: blocks of units taken from a shared counter, admitted in
//!   memory. A `Store` over a `Shared`.
//! - [`overlimit`]: answers keys known to be over the limit without a store round trip. A
//!   `Store` over a `Store`.
//!
//! The app keeps the handle of the shared store (under the lease layer) for those that ask
//! it more than counting: the lease layer, RLQS, the warm-up and probe at startup.

mod batch;
pub mod claim;
mod digest;
mod key;
pub mod lease;
pub mod memory;
mod metrics;
pub mod overlimit;
pub mod pool;
pub mod redis;
pub mod refused;
pub mod region;
pub mod resilient;
pub mod split;

use std::future::Future;
use std::pin::Pin;

pub use batch::{
    Admission, Applied, Batch, Calls, Consistency, CounterOp, FailureMode, FailureModeAnswers,
    Role, admitted,
};
pub use claim::{ClaimAsk, ClaimGrant};
pub use key::CounterKey;
pub(crate) use key::push_sha256_hex;
pub use lease::{Grant, LeaseAsk, Leased, Report, Take};
pub use memory::MemoryStore;
pub use metrics::StoreMetrics;
pub use overlimit::OverLimitCache;
pub use pool::{PoolAnswer, PoolOp};
pub use redis::RedisStore;
pub use refused::{RefusedAdd, RefusedClose, RefusedCounts};
pub use region::{RegionOptions, Regions};
pub use resilient::Resilient;
pub use split::PerSecondSplit;

/// A boxed future, so that [`Store`] stays object-safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where counters live: what every layer of the stack decides for itself. A layer that wraps
/// another says what it does with each method (pass it on, act on what it keeps itself, or
/// both); there are no defaults but [`Store::store_key`].
pub trait Store: Send + Sync + 'static {
    /// Decides every operation of `batch` against the current counters and, when the request
    /// is admitted (see [`admitted`]), charges the allowed ones. Refunds always apply.
    fn apply<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<Applied, StoreError>>;

    /// A snapshot for `/rlconfig`, logs and metrics.
    fn status(&self) -> StoreStatus;

    /// Clears the counters of `ops` (an operator's reset): each starts again from no state.
    /// Answers how many of them held state. Stores that wrap another clear what they keep
    /// of these counters themselves (remembered refusals, leased blocks) and pass it on.
    fn reset<'a>(&'a self, ops: &'a [CounterOp]) -> BoxFuture<'a, Result<u64, StoreError>>;

    /// Gives back what this instance holds of shared counters (leased units), after the
    /// drain: nothing is lost to a rolling restart. A layer passes it on once it has given
    /// back what it holds itself.
    fn shut_down(&self) -> BoxFuture<'_, ()>;

    /// The key `op`'s counter is kept under in the store now (for `redis-cli`: the key prefix,
    /// and for the reference layout the window start, included).
    fn store_key(&self, op: &CounterOp) -> String {
        op.key.to_string()
    }
}

/// What a store shared by the fleet can do beside counting (the backends, the failure policy
/// around one, the per-second split of two), asked by the layers and rooms that need it: the
/// lease layer leases and counts instances, RLQS claims budgets, the app probes and warms
/// up. Layers above the shared store (the lease layer, the over-limit cache) do not have it:
/// the app hands out the shared store's handle itself.
pub trait Shared: Store {
    /// Takes (or hands back) blocks of units, one per ask, each on its own: a lease is a
    /// charge of at most what is left ([`crate::algorithm::lease`]).
    fn lease<'a>(&'a self, asks: &'a [LeaseAsk]) -> BoxFuture<'a, Result<Vec<Grant>, StoreError>>;

    /// Operates on this region's pools of global counters ([`pool`]), each operation on its
    /// own and atomically.
    fn pool<'a>(&'a self, ops: &'a [PoolOp]) -> BoxFuture<'a, Result<Vec<PoolAnswer>, StoreError>>;

    /// Records that `instance` takes leases now and answers how many instances did within
    /// `within` (at least 1): blocks are shared among them.
    fn instances<'a>(
        &'a self,
        instance: &'a str,
        within: std::time::Duration,
    ) -> BoxFuture<'a, Result<u64, StoreError>>;

    /// Records this instance's claims on shared budgets (RLQS) and answers what each may
    /// hold ([`claim`]): a store with no other instance grants what is asked.
    fn claim<'a>(
        &'a self,
        asks: &'a [ClaimAsk],
    ) -> BoxFuture<'a, Result<Vec<ClaimGrant>, StoreError>>;

    /// Adds hashes of refused keys to their rules' sets for a window ([`refused`]); answers
    /// each set's sampling level.
    fn add_refused<'a>(
        &'a self,
        adds: &'a [RefusedAdd],
    ) -> BoxFuture<'a, Result<Vec<u32>, StoreError>>;

    /// Counts completed windows of refused keys ([`refused`]): distinct keys, and those not
    /// refused in the history before; the same answer to every instance.
    fn close_refused<'a>(
        &'a self,
        closes: &'a [RefusedClose],
    ) -> BoxFuture<'a, Result<Vec<RefusedCounts>, StoreError>>;

    /// Checks that the store answers, without counting anything (the circuit breaker's probe).
    fn probe(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// Prepares what the first requests would otherwise wait for (connections, scripts), so
    /// that they are not answered by the failure policy for a cold start. Failing to warm up
    /// is not an error: the store is then used as it comes back.
    fn warm_up(&self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }
}

/// Where a shared store's answers go that no request waited for: a call that outlived its
/// requests' deadline still counted in the store, and what it answered still teaches the
/// layers above it (the over-limit cache). [`Resilient`] feeds it.
pub trait LateAnswers: Send + Sync {
    /// `batch`, sent at `asked_at`, got `applied` from the store after its caller was
    /// answered by the failure policy.
    fn answered(&self, batch: &Batch, applied: &Applied, asked_at: crate::algorithm::Micros);
}

/// What a store reports about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreStatus {
    /// `memory`, `redis`, ...
    pub kind: &'static str,
    /// Counters currently tracked (where known).
    pub tracked_keys: Option<u64>,
    /// The cap on tracked counters (where there is one).
    pub max_keys: Option<u64>,
    /// Live counters dropped because the cap was reached.
    pub evicted_keys: u64,
    /// Heap bytes the counters take (where known).
    pub bytes: Option<u64>,
    /// Whether the store is evicting live counters (it did within the last minute).
    pub full: bool,
    /// Whether the store answers (false while a failure policy is in force).
    pub healthy: bool,
    /// A line on the store's state, e.g. the breaker and failure-mode answers.
    pub detail: Option<String>,
    /// Counters answered by the failure policy so far, by mode.
    pub failure_mode_answers: FailureModeAnswers,
    /// Leased quota, where the store leases.
    pub leases: Option<lease::LeaseStatus>,
    /// Global rules' pools and the root, in a region under a root (ROOT_REDIS_URL).
    pub region: Option<region::RegionStatus>,
    /// Whether the store can evict live counters of its own accord (Redis with a `maxmemory`
    /// and a policy other than `noeviction`); `None` when unknown or not applicable.
    pub evicts_counters: Option<bool>,
}

/// The answers of calls that each took some of `n` asks (their indices), back in the asks'
/// order: the first failed call's error, or an error naming `what` when an ask got no answer.
pub(crate) fn in_ask_order<'a, T>(
    n: usize,
    calls: impl IntoIterator<Item = (&'a [usize], Result<Vec<T>, StoreError>)>,
    what: &str,
) -> Result<Vec<T>, StoreError> {
    let mut answers: Vec<Option<T>> = (0..n).map(|_| None).collect();
    for (indices, reply) in calls {
        for (&i, answer) in indices.iter().zip(reply?) {
            answers[i] = Some(answer);
        }
    }
    answers
        .into_iter()
        .collect::<Option<Vec<T>>>()
        .ok_or_else(|| StoreError::Internal(format!("{what} got no answer")))
}

/// A store call that failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The store did not answer in time, or could not be reached; retrying may succeed.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store answered with something that makes no sense; retrying will not help.
    #[error("store error: {0}")]
    Internal(String),
}

impl StoreError {
    /// Whether a retry could succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}
