//! The failure policy around a shared store: a deadline on every call, a circuit breaker so
//! an outage costs no waiting, and per-rule `failure_mode` answers while the store fails:
//! `allow` (fail open), `deny` (fail closed) or `local` (count in this instance's memory
//! with the limit divided by the number of instances).
//!
//! The breaker opens after `breaker_failures` consecutive failures; while open, calls fail
//! at once. After `breaker_cooldown` one call probes the store; its success closes the
//! breaker, so service resumes within a cooldown of the store's return.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{
    Applied, Batch, BoxFuture, CounterOp, FailureMode, MemoryStore, Store, StoreError, StoreStatus,
    admitted,
};
use crate::algorithm::{Decision, Limit, SECOND};
use crate::clock::Clock;
use crate::store::memory::MemoryOptions;

/// Failure policy settings.
#[derive(Debug, Clone, Copy)]
pub struct ResilienceOptions {
    /// Deadline of every store call.
    pub deadline: Duration,
    /// Consecutive failures that open the breaker.
    pub breaker_failures: u32,
    /// How long the open breaker waits before a probe.
    pub breaker_cooldown: Duration,
    /// Instances sharing the limits; `local` divides each limit by it.
    pub local_instances: u64,
}

impl Default for ResilienceOptions {
    fn default() -> Self {
        Self {
            deadline: Duration::from_millis(15),
            breaker_failures: 3,
            breaker_cooldown: Duration::from_millis(250),
            local_instances: 1,
        }
    }
}

/// A store wrapped in the failure policy.
pub struct Resilient {
    primary: Arc<dyn Store>,
    options: ResilienceOptions,
    breaker: Breaker,
    local: MemoryStore,
    clock: Arc<dyn Clock>,
    /// Requests answered by the failure policy, by mode: allow, deny, local.
    degraded: [AtomicU64; 3],
}

impl Resilient {
    /// Wraps `primary`; `clock` drives the windows of `allow`/`deny` answers and the local
    /// fallback store.
    pub fn new(primary: Arc<dyn Store>, options: ResilienceOptions, clock: Arc<dyn Clock>) -> Self {
        Self {
            primary,
            options,
            breaker: Breaker::new(options.breaker_failures, options.breaker_cooldown),
            local: MemoryStore::new(MemoryOptions::default(), clock.clone()),
            clock,
            degraded: Default::default(),
        }
    }

    async fn apply_batch(&self, batch: &Batch) -> Result<Applied, StoreError> {
        // Held across the call: a probe whose caller gives up (Envoy's timeout, a reset)
        // lets the next call probe instead of leaving the breaker open for good.
        let Some(_permit) = self.breaker.permit() else {
            return self.fallback(batch).await;
        };
        let error = {
            match tokio::time::timeout(self.options.deadline, self.primary.apply(batch)).await {
                Ok(Ok(applied)) => {
                    self.breaker.succeeded();
                    return Ok(applied);
                }
                // Every failure to run the call is answered by the failure policy, whatever
                // its cause (unreachable, out of memory, MISCONF, BUSY, a refused login, an
                // answer that makes no sense): the rule's `failure_mode` is what the operator
                // chose for the time the store cannot decide.
                Ok(Err(e)) => e,
                Err(_) => StoreError::Unavailable(format!(
                    "no answer within the {:?} deadline",
                    self.options.deadline
                )),
            }
        };
        if self.breaker.failed() {
            tracing::warn!(error = %error, "store failing: circuit breaker open, answering by failure_mode");
        }
        self.fallback(batch).await
    }

    /// Answers by each operation's failure mode.
    async fn fallback(&self, batch: &Batch) -> Result<Applied, StoreError> {
        let now = self.clock.now();
        let mut decisions: Vec<Option<Decision>> = vec![None; batch.ops.len()];
        let mut local_ops = Vec::new();
        let mut local_index = Vec::new();
        for (i, op) in batch.ops.iter().enumerate() {
            let reset = op.limit.window_left(now);
            decisions[i] = match op.failure_mode {
                FailureMode::Allow => Some(Decision {
                    allowed: true,
                    remaining: op.limit.requests,
                    reset_after: reset,
                    retry_after: None,
                }),
                FailureMode::Deny => Some(Decision {
                    allowed: op.hits <= 0,
                    remaining: 0,
                    reset_after: reset,
                    // The outage's end is unknown; a second is a polite first retry.
                    retry_after: (op.hits > 0).then_some(reset.min(SECOND)),
                }),
                FailureMode::Local => {
                    local_index.push(i);
                    local_ops.push(CounterOp {
                        limit: Limit {
                            requests: op.limit.requests / self.options.local_instances,
                            burst: op.limit.burst / self.options.local_instances,
                            ..op.limit
                        },
                        ..op.clone()
                    });
                    None
                }
            };
            let mode = op.failure_mode as usize;
            self.degraded[mode].fetch_add(1, Ordering::Relaxed);
        }
        if !local_ops.is_empty() {
            // A `deny` answer that rejects the request anyway must not charge local counters.
            let rejected_anyway =
                batch.ops.iter().zip(&decisions).any(|(op, d)| {
                    op.role == super::Role::Enforce && d.is_some_and(|d| !d.allowed)
                });
            if rejected_anyway {
                for op in &mut local_ops {
                    op.hits = op.hits.min(0);
                }
            }
            let local_batch = Batch {
                ops: local_ops,
                always_admit: batch.always_admit,
            };
            let applied = self.local.apply(&local_batch).await?;
            for (i, d) in local_index.into_iter().zip(applied.decisions) {
                decisions[i] = Some(d);
            }
        }
        let decisions: Vec<Decision> = decisions.into_iter().flatten().collect();
        Ok(Applied {
            admitted: admitted(&batch.ops, &decisions, batch.always_admit),
            decisions,
            degraded: true,
            from_cache: false,
        })
    }
}

impl Store for Resilient {
    fn apply<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<Applied, StoreError>> {
        Box::pin(self.apply_batch(batch))
    }

    fn warm_up(&self) -> BoxFuture<'_, ()> {
        self.primary.warm_up()
    }

    fn status(&self) -> StoreStatus {
        let mut status = self.primary.status();
        let [allow, deny, local] = &self.degraded;
        status.detail = Some(format!(
            "{}; answered by failure_mode: {} allow, {} deny, {} local",
            if self.breaker.is_open() {
                "failing (circuit breaker open)"
            } else {
                "ok"
            },
            allow.load(Ordering::Relaxed),
            deny.load(Ordering::Relaxed),
            local.load(Ordering::Relaxed),
        ));
        status.healthy = !self.breaker.is_open();
        status.failure_mode_answers = [
            allow.load(Ordering::Relaxed),
            deny.load(Ordering::Relaxed),
            local.load(Ordering::Relaxed),
        ];
        status
    }
}

/// A call's leave from the breaker. Dropping a probe's permit ends the probe: if the call
/// recorded no verdict (its future was dropped), the next call probes again.
struct Permit<'a> {
    breaker: &'a Breaker,
    probe: bool,
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if self.probe {
            self.breaker.probing.store(false, Ordering::Release);
        }
    }
}

// === impl Breaker ===

/// Consecutive-failure circuit breaker with a single half-open probe.
struct Breaker {
    threshold: u32,
    cooldown: Duration,
    epoch: Instant,
    failures: AtomicU32,
    /// Microseconds since `epoch` until which the breaker is open; 0 when closed.
    open_until: AtomicU64,
    probing: AtomicBool,
}

impl Breaker {
    fn new(threshold: u32, cooldown: Duration) -> Self {
        Self {
            threshold,
            cooldown,
            epoch: Instant::now(),
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
        }
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64 + 1
    }

    fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }

    /// Leave for a call to go to the store now, if the breaker gives it.
    fn permit(&self) -> Option<Permit<'_>> {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Some(Permit {
                breaker: self,
                probe: false,
            });
        }
        // Half-open: after the cooldown exactly one call probes the store.
        (self.now() >= until && !self.probing.swap(true, Ordering::AcqRel)).then_some(Permit {
            breaker: self,
            probe: true,
        })
    }

    fn succeeded(&self) {
        self.failures.store(0, Ordering::Release);
        self.probing.store(false, Ordering::Release);
        if self.open_until.swap(0, Ordering::AcqRel) != 0 {
            tracing::info!("store answering again: circuit breaker closed");
        }
    }

    /// Records a failure; true when this failure opened the breaker.
    fn failed(&self) -> bool {
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        let was_open = self.is_open();
        if was_open || failures >= self.threshold {
            self.open_until.store(
                self.now() + self.cooldown.as_micros() as u64,
                Ordering::Release,
            );
            self.probing.store(false, Ordering::Release);
        }
        !was_open && failures >= self.threshold
    }
}
