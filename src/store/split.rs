//! Per-second counters on a store of their own (the reference service's `REDIS_PERSECOND`):
//! operations whose window is one second go to `per_second`, every other to `main`, each
//! behind its own failure policy, so that one Redis failing leaves the other's counters
//! exact.
//!
//! A request whose counters live on both stays all-or-nothing: both halves are decided at
//! once, each admitting on its own (quota operations as shadow ones, decided over the whole
//! request below), then the request's rule is applied to all decisions, and a half that
//! charged for a request the other half rejects gets its hits back, within the windows they
//! were charged to.

use futures_util::future::join_all;
use std::sync::Arc;

use super::{
    Admission, Applied, Batch, BoxFuture, CounterOp, Grant, LeaseAsk, Role, Shared, Store,
    StoreError, StoreStatus, admitted,
};
use crate::algorithm::{Decision, SECOND};
use crate::logging::Every;

/// Two stores, split by window.
pub struct PerSecondSplit {
    main: Arc<dyn Shared>,
    per_second: Arc<dyn Shared>,
}

/// Whether `op` counts on the per-second store.
fn per_second(op: &CounterOp) -> bool {
    op.limit.window == SECOND
}

/// One half of a request: the indices of its operations in the request, and its batch.
struct Half {
    indices: Vec<usize>,
    batch: Batch,
}

impl Half {
    fn of(batch: &Batch, indices: Vec<usize>, split: bool) -> Self {
        let ops = indices
            .iter()
            .map(|&i| {
                let mut op = batch.ops[i].clone();
                // A half cannot know whether every quota operation of the request is over.
                if split && op.role == Role::Quota {
                    op.role = Role::Shadow;
                }
                op
            })
            .collect();
        Self {
            indices,
            batch: Batch {
                ops,
                admission: batch.admission,
                deadline: batch.deadline,
                charged_at: batch.charged_at,
            },
        }
    }
}

impl PerSecondSplit {
    /// Counts one-second windows in `per_second`, the others in `main`.
    pub fn new(main: Arc<dyn Shared>, per_second: Arc<dyn Shared>) -> Self {
        Self { main, per_second }
    }

    async fn apply_batch(&self, batch: &Batch) -> Result<Applied, StoreError> {
        let (fast, slow): (Vec<usize>, Vec<usize>) =
            (0..batch.ops.len()).partition(|&i| per_second(&batch.ops[i]));
        if fast.is_empty() {
            return self.main.apply(batch).await;
        }
        if slow.is_empty() {
            return self.per_second.apply(batch).await;
        }
        let halves = [Half::of(batch, slow, true), Half::of(batch, fast, true)];
        let stores = [&self.main, &self.per_second];
        let replies: Vec<Result<Applied, StoreError>> = join_all(
            halves
                .iter()
                .zip(stores)
                .map(|(half, store)| store.apply(&half.batch)),
        )
        .await;

        let mut decisions: Vec<Option<Decision>> = vec![None; batch.ops.len()];
        let mut failure = None;
        let (mut degraded, mut cached) = (false, Vec::new());
        let mut calls = super::Calls::default();
        for (half, reply) in halves.iter().zip(&replies) {
            match reply {
                Ok(applied) => {
                    for (&i, d) in half.indices.iter().zip(&applied.decisions) {
                        decisions[i] = Some(*d);
                    }
                    degraded |= applied.degraded;
                    calls = calls.and(applied.calls);
                    cached.extend(applied.cached.iter().map(|&c| half.indices[c]));
                }
                Err(e) => failure = Some(e.clone()),
            }
        }
        let decisions: Option<Vec<Decision>> = decisions.into_iter().collect();
        let admitted = match (&decisions, &failure) {
            (Some(d), None) => admitted(&batch.ops, d, batch.admission),
            _ => false,
        };
        if !admitted {
            for ((half, reply), store) in halves.iter().zip(&replies).zip(stores) {
                if let Ok(applied) = reply
                    && applied.admitted
                {
                    refund(store.as_ref(), half, applied).await;
                }
            }
        }
        match (decisions, failure) {
            (Some(decisions), None) => Ok(Applied {
                decisions,
                admitted,
                degraded,
                cached,
                decided_at: None,
                calls,
            }),
            (_, Some(e)) => Err(e),
            (None, None) => Err(StoreError::Internal(
                "a store returned fewer decisions than operations".into(),
            )),
        }
    }
}

/// Takes back what `half` charged (its allowed hits) for a request the other half rejected.
async fn refund(store: &dyn Store, half: &Half, applied: &Applied) {
    let ops: Vec<CounterOp> = half
        .batch
        .ops
        .iter()
        .zip(&applied.decisions)
        .filter(|(_, d)| d.allowed)
        .filter_map(|(op, _)| op.refund())
        .collect();
    if ops.is_empty() {
        return;
    }
    let refunds = Batch {
        ops,
        admission: Admission::ByRule,
        deadline: half.batch.deadline,
        charged_at: applied.decided_at,
    };
    static LOGGED: Every = Every::new(std::time::Duration::from_secs(10));
    if let Err(e) = store.apply(&refunds).await
        && LOGGED.ready()
    {
        tracing::warn!(error = %e, "could not refund the hits of a rejected request; they expire with their window");
    }
}

impl Store for PerSecondSplit {
    fn apply<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<Applied, StoreError>> {
        Box::pin(self.apply_batch(batch))
    }

    fn status(&self) -> StoreStatus {
        let (main, fast) = (self.main.status(), self.per_second.status());
        let detail = |s: &StoreStatus| s.detail.clone().unwrap_or_else(|| "ok".into());
        let answers = main.failure_mode_answers.and(fast.failure_mode_answers);
        StoreStatus {
            kind: main.kind,
            tracked_keys: None,
            max_keys: None,
            evicted_keys: 0,
            bytes: None,
            full: false,
            healthy: main.healthy && fast.healthy,
            detail: Some(format!(
                "main: {}; per-second: {}",
                detail(&main),
                detail(&fast)
            )),
            failure_mode_answers: answers,
            leases: None,
            region: None,
            evicts_counters: match (main.evicts_counters, fast.evicts_counters) {
                (Some(a), Some(b)) => Some(a || b),
                (a, b) => a.filter(|e| *e).or(b.filter(|e| *e)),
            },
        }
    }

    fn reset<'a>(&'a self, ops: &'a [CounterOp]) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let (fast, slow): (Vec<CounterOp>, Vec<CounterOp>) = ops
                .iter()
                .cloned()
                .partition(|op| op.limit.window == SECOND);
            let mut cleared = 0;
            if !fast.is_empty() {
                cleared += self.per_second.reset(&fast).await?;
            }
            if !slow.is_empty() {
                cleared += self.main.reset(&slow).await?;
            }
            Ok(cleared)
        })
    }

    fn shut_down(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {
            join_all(vec![self.main.shut_down(), self.per_second.shut_down()]).await;
        })
    }

    fn store_key(&self, op: &CounterOp) -> String {
        if op.limit.window == SECOND {
            self.per_second.store_key(op)
        } else {
            self.main.store_key(op)
        }
    }
}

impl Shared for PerSecondSplit {
    fn lease<'a>(&'a self, asks: &'a [LeaseAsk]) -> BoxFuture<'a, Result<Vec<Grant>, StoreError>> {
        Box::pin(async move {
            // Each ask to the store its counter lives in, both halves at once.
            let (fast, slow): (Vec<usize>, Vec<usize>) =
                (0..asks.len()).partition(|&i| asks[i].limit.window == SECOND);
            let pick = |indices: &[usize]| indices.iter().map(|&i| asks[i].clone()).collect();
            let (fast_asks, slow_asks): (Vec<LeaseAsk>, Vec<LeaseAsk>) = (pick(&fast), pick(&slow));
            let (fast_grants, slow_grants) = futures_util::future::join(
                async {
                    if fast_asks.is_empty() {
                        Ok(Vec::new())
                    } else {
                        self.per_second.lease(&fast_asks).await
                    }
                },
                async {
                    if slow_asks.is_empty() {
                        Ok(Vec::new())
                    } else {
                        self.main.lease(&slow_asks).await
                    }
                },
            )
            .await;
            let calls = [(&fast[..], fast_grants), (&slow[..], slow_grants)];
            super::in_ask_order(asks.len(), calls, "a lease")
        })
    }

    fn instances<'a>(
        &'a self,
        instance: &'a str,
        within: std::time::Duration,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.main.instances(instance, within)
    }

    /// Pools live in the main store.
    fn pool<'a>(
        &'a self,
        ops: &'a [super::PoolOp],
    ) -> BoxFuture<'a, Result<Vec<super::PoolAnswer>, StoreError>> {
        self.main.pool(ops)
    }

    /// Claims live in the main store.
    fn claim<'a>(
        &'a self,
        asks: &'a [super::ClaimAsk],
    ) -> BoxFuture<'a, Result<Vec<super::ClaimGrant>, StoreError>> {
        self.main.claim(asks)
    }

    /// Refused keys live in the main store.
    fn add_refused<'a>(
        &'a self,
        adds: &'a [super::RefusedAdd],
    ) -> BoxFuture<'a, Result<Vec<u32>, StoreError>> {
        self.main.add_refused(adds)
    }

    fn close_refused<'a>(
        &'a self,
        closes: &'a [super::RefusedClose],
    ) -> BoxFuture<'a, Result<Vec<super::RefusedCounts>, StoreError>> {
        self.main.close_refused(closes)
    }

    fn probe(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async {
            self.main.probe().await?;
            self.per_second.probe().await
        })
    }

    fn warm_up(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {
            join_all(vec![self.main.warm_up(), self.per_second.warm_up()]).await;
        })
    }
}
