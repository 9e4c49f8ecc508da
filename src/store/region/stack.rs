//! The region layer in the store stack: what it decides itself (global counters) and what
//! it passes to the region's store.

use std::time::Duration;

use super::Regions;
use crate::store::pool::{PoolAnswer, PoolOp};
use crate::store::{
    Applied, Batch, BoxFuture, ClaimAsk, ClaimGrant, CounterOp, Grant, LeaseAsk, RefusedAdd,
    RefusedClose, RefusedCounts, Shared, Store, StoreError, StoreStatus,
};

impl Store for Regions {
    fn apply<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<Applied, StoreError>> {
        Box::pin(self.apply_batch(batch))
    }

    fn status(&self) -> StoreStatus {
        StoreStatus {
            region: Some(self.region_status()),
            ..self.core.region.status()
        }
    }

    /// A global counter is reset at the root (its pools keep what they hold until they
    /// end); the rest in the region's store.
    fn reset<'a>(&'a self, ops: &'a [CounterOp]) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let (global, region): (Vec<CounterOp>, Vec<CounterOp>) =
                ops.iter().cloned().partition(|op| op.key.is_global());
            let mut cleared = 0;
            if !global.is_empty() {
                cleared += self.core.root.reset(&global).await?;
            }
            if !region.is_empty() {
                cleared += self.core.region.reset(&region).await?;
            }
            Ok(cleared)
        })
    }

    fn store_key(&self, op: &CounterOp) -> String {
        if op.key.is_global() {
            return self.core.root.store_key(op);
        }
        self.core.region.store_key(op)
    }

    /// Idle pools' units back to the root, then the region's store and the root shut down.
    fn shut_down(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.core.sweep(false).await;
            self.core.region.shut_down().await;
            self.core.root.shut_down().await;
        })
    }
}

impl Shared for Regions {
    fn lease<'a>(&'a self, asks: &'a [LeaseAsk]) -> BoxFuture<'a, Result<Vec<Grant>, StoreError>> {
        Box::pin(self.lease_asks(asks))
    }

    fn pool<'a>(&'a self, ops: &'a [PoolOp]) -> BoxFuture<'a, Result<Vec<PoolAnswer>, StoreError>> {
        self.core.region.pool(ops)
    }

    fn instances<'a>(
        &'a self,
        instance: &'a str,
        within: Duration,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.core.region.instances(instance, within)
    }

    fn claim<'a>(
        &'a self,
        asks: &'a [ClaimAsk],
    ) -> BoxFuture<'a, Result<Vec<ClaimGrant>, StoreError>> {
        self.core.region.claim(asks)
    }

    fn add_refused<'a>(
        &'a self,
        adds: &'a [RefusedAdd],
    ) -> BoxFuture<'a, Result<Vec<u32>, StoreError>> {
        self.core.region.add_refused(adds)
    }

    fn close_refused<'a>(
        &'a self,
        closes: &'a [RefusedClose],
    ) -> BoxFuture<'a, Result<Vec<RefusedCounts>, StoreError>> {
        self.core.region.close_refused(closes)
    }

    fn probe(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        self.core.region.probe()
    }

    fn warm_up(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.core.region.warm_up().await;
            self.core.root.warm_up().await;
        })
    }
}
