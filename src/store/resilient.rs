// Why one long file: the deadline, breaker, probe and failure modes are one policy whose states
// change each other.
//! The failure policy around a shared store: a deadline on every call, a circuit breaker so
//! an outage costs no waiting, and per-rule `failure_mode` answers while the store fails:
//! `allow` (fail open), `deny` (fail closed) or `local` (count in this instance's memory
//! with the limit divided by the number of instances).
//!
//! The breaker opens after `breaker_failures` consecutive failures; while open, requests are
//! answered at once, and a background task probes the store every `breaker_cooldown` (a call
//! no request waits for); its success closes the breaker, so service resumes within a
//! cooldown of the store's return.
//!
//! A slow store is not a dead one, and overload is when limits matter most. A call that
//! misses its deadline is not abandoned: it runs to its end in the background (within
//! `background_limit`), and its answers reach the [`LateAnswers`] sink (the over-limit
//! cache), so a key that went over while answers were late is refused locally from then on.
//! While the breaker is open, requests the failure policy admits are still sent to the store
//! in the background (at most `max_background` at once), so they are counted, and their
//! refusals learnt, even though nobody waits for them.

mod breaker;

use breaker::Breaker;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::{
    Applied, Batch, BoxFuture, CounterOp, FailureMode, FailureModeAnswers, Grant, LateAnswers,
    LeaseAsk, MemoryStore, Shared, Store, StoreError, StoreStatus, Take, admitted,
};
use crate::algorithm::{Decision, Limit, Micros, SECOND};
use crate::clock::Clock;
use crate::logging::Every;
use crate::store::memory::MemoryOptions;

/// Failure policy settings.
#[derive(Debug, Clone, Copy)]
pub struct ResilienceOptions {
    /// Deadline of every store call.
    pub deadline: Duration,
    /// Consecutive failures that open the breaker.
    pub breaker_failures: u32,
    /// How long the open breaker waits between probes.
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

impl ResilienceOptions {
    /// How long a call that missed its deadline may still run in the background.
    pub fn background_limit(&self) -> Duration {
        (self.deadline * 20).max(Duration::from_secs(1))
    }
}

/// Store calls running in the background at most (late ones, and those of requests the open
/// breaker answered): beyond it, a request answered by the failure policy is not counted.
const MAX_BACKGROUND: usize = 1024;
/// The share of the caller's remaining time kept to answer it (encode and send), at least
/// [`MIN_CALLER_MARGIN`].
const CALLER_MARGIN_DIVISOR: u32 = 10;
const MIN_CALLER_MARGIN: Duration = Duration::from_millis(1);
/// Store failures are logged at most this often.
const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// A store wrapped in the failure policy.
pub struct Resilient {
    shared: Arc<Core>,
    options: ResilienceOptions,
    local: MemoryStore,
    /// Counters answered by the failure policy.
    answered: AnsweredBy,
}

/// Counters answered by the failure policy so far, by mode.
#[derive(Default)]
struct AnsweredBy {
    allow: AtomicU64,
    deny: AtomicU64,
    local: AtomicU64,
    envoy: AtomicU64,
}

impl AnsweredBy {
    fn of(&self, mode: FailureMode) -> &AtomicU64 {
        match mode {
            FailureMode::Allow => &self.allow,
            FailureMode::Deny => &self.deny,
            FailureMode::Local => &self.local,
            FailureMode::Envoy => &self.envoy,
        }
    }

    fn count(&self, mode: FailureMode) {
        self.of(mode).fetch_add(1, Ordering::Relaxed);
    }

    fn now(&self) -> FailureModeAnswers {
        let mut answers = FailureModeAnswers::default();
        for mode in FailureMode::ALL {
            *answers.of_mut(mode) = self.of(mode).load(Ordering::Relaxed);
        }
        answers
    }
}

/// `call`, or an `Unavailable` error naming `what` when it has not answered within
/// `deadline`.
async fn within<T>(
    deadline: Duration,
    what: &str,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(deadline, call)
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::Unavailable(format!(
                "no answer to {what} within {deadline:?}"
            )))
        })
}

/// What background calls and the prober share with the requests.
struct Core {
    primary: Arc<dyn Shared>,
    breaker: Breaker,
    clock: Arc<dyn Clock>,
    late: OnceLock<Arc<dyn LateAnswers>>,
    background: AtomicUsize,
    background_limit: Duration,
    probe_deadline: Duration,
    failures_logged: Every,
}

impl Resilient {
    /// Wraps `primary`; `clock` drives the windows of `allow`/`deny` answers and the local
    /// fallback store.
    pub fn new(
        primary: Arc<dyn Shared>,
        options: ResilienceOptions,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            shared: Arc::new(Core {
                primary,
                breaker: Breaker::new(options.breaker_failures, options.breaker_cooldown),
                clock: clock.clone(),
                late: OnceLock::new(),
                background: AtomicUsize::new(0),
                background_limit: options.background_limit(),
                probe_deadline: options.deadline,
                failures_logged: Every::new(LOG_INTERVAL),
            }),
            options,
            local: MemoryStore::new(MemoryOptions::default(), clock),
            answered: AnsweredBy::default(),
        }
    }

    /// Sends the answers that arrive after their caller gave up to `sink`.
    pub fn on_late_answers(&self, sink: Arc<dyn LateAnswers>) {
        let _ = self.shared.late.set(sink);
    }

    /// The deadline of a call for `batch`: the configured one, or less when the caller
    /// stops waiting sooner.
    fn deadline_of(&self, batch: &Batch) -> Duration {
        match batch.deadline {
            Some(at) => {
                let left = at.saturating_duration_since(tokio::time::Instant::now());
                let margin = (left / CALLER_MARGIN_DIVISOR).max(MIN_CALLER_MARGIN);
                left.saturating_sub(margin).min(self.options.deadline)
            }
            None => self.options.deadline,
        }
    }

    async fn apply_batch(&self, batch: &Batch) -> Result<Applied, StoreError> {
        let shared = &self.shared;
        if shared.breaker.is_open() {
            let applied = self.fallback(batch).await?;
            if applied.admitted {
                Core::in_background(shared, batch);
            }
            return Ok(applied);
        }
        let asked_at = shared.clock.now();
        let deadline = self.deadline_of(batch);
        // The call owns its batch, so that it can go on after the deadline.
        let owned = Arc::new(batch.clone());
        let mut call = Box::pin(Core::call(shared.clone(), owned.clone()));
        let error = match tokio::time::timeout(deadline, &mut call).await {
            Ok(Ok(applied)) => {
                shared.breaker.succeeded();
                return Ok(applied);
            }
            // Every failure to run the call is answered by the failure policy, whatever its
            // cause (unreachable, out of memory, MISCONF, BUSY, a refused login, an answer
            // that makes no sense): the rule's `failure_mode` is what the operator chose for
            // the time the store cannot decide.
            Ok(Err(e)) => e,
            Err(_) => {
                Core::finish_late(shared, call, owned, asked_at);
                if deadline < self.options.deadline {
                    // The caller's own deadline was shorter: that says nothing about the
                    // store, and a client sending tiny timeouts must not open the breaker
                    // for everyone.
                    return self.fallback(batch).await;
                }
                StoreError::Unavailable(format!("no answer within the {deadline:?} deadline"))
            }
        };
        Core::failed(shared, &error);
        self.fallback(batch).await
    }

    /// Answers by each operation's failure mode; a request with an operation whose mode
    /// leaves the decision to Envoy fails as a whole, at once.
    async fn fallback(&self, batch: &Batch) -> Result<Applied, StoreError> {
        if batch
            .ops
            .iter()
            .any(|op| op.failure_mode == FailureMode::Envoy)
        {
            self.answered.count(FailureMode::Envoy);
            return Err(StoreError::Unavailable(
                "the store is failing; failure_mode envoy leaves the decision to Envoy's failure_mode_deny".into(),
            ));
        }
        let now = self.shared.clock.now();
        let mut decisions: Vec<Option<Decision>> = vec![None; batch.ops.len()];
        let mut local_ops = Vec::new();
        let mut local_index = Vec::new();
        for (i, op) in batch.ops.iter().enumerate() {
            decisions[i] = match op.failure_mode {
                // (`envoy` was answered above.)
                FailureMode::Allow | FailureMode::Envoy | FailureMode::Deny => {
                    Some(fixed_answer(op, now))
                }
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
            self.answered.count(op.failure_mode);
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
                admission: batch.admission,
                deadline: None,
                charged_at: None,
            };
            let applied = self.local.apply(&local_batch).await?;
            for (i, d) in local_index.into_iter().zip(applied.decisions) {
                decisions[i] = Some(d);
            }
        }
        let decisions: Vec<Decision> = decisions.into_iter().flatten().collect();
        Ok(Applied {
            admitted: admitted(&batch.ops, &decisions, batch.admission),
            decisions,
            degraded: true,
            cached: Vec::new(),
            decided_at: None,
            calls: Default::default(),
        })
    }
}

/// What `allow` and `deny` answer for `op` at `now`, without a store.
pub(super) fn fixed_answer(op: &CounterOp, now: crate::algorithm::Micros) -> Decision {
    let reset = op.limit.window_left(now);
    if op.failure_mode == FailureMode::Deny {
        // A check of 0 hits is refused too: it is how a usage budget admits a stream
        // (`hits_addend: 0`), whose usage could not be charged while the store fails.
        // Releases and refunds (negative hits) pass: they only give back.
        Decision {
            overdraft: 0,
            allowed: op.hits < 0,
            remaining: 0,
            reset_after: reset,
            // The outage's end is unknown; a second is a polite first retry.
            retry_after: (op.hits >= 0).then_some(reset.min(SECOND)),
        }
    } else {
        Decision {
            overdraft: 0,
            allowed: true,
            remaining: op.limit.requests,
            reset_after: reset,
            retry_after: None,
        }
    }
}

impl Store for Resilient {
    fn apply<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<Applied, StoreError>> {
        Box::pin(self.apply_batch(batch))
    }

    /// Resets the local fallback's counters too (what `failure_mode: local` counted), then
    /// the store's within the deadline; a failing store is an error (nothing to fall back on).
    fn reset<'a>(&'a self, ops: &'a [CounterOp]) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            self.local.reset(ops).await?;
            let deadline = self.options.background_limit();
            within(deadline, "the reset", self.shared.primary.reset(ops)).await
        })
    }

    fn store_key(&self, op: &CounterOp) -> String {
        self.shared.primary.store_key(op)
    }

    /// The local fallback holds nothing of the shared counters; the store behind may.
    fn shut_down(&self) -> BoxFuture<'_, ()> {
        self.shared.primary.shut_down()
    }

    fn status(&self) -> StoreStatus {
        let mut status = self.shared.primary.status();
        let answers = self.answered.now();
        let open = self.shared.breaker.is_open();
        status.detail = Some(format!(
            "{}; answered by failure_mode: {} allow, {} deny, {} local, {} envoy",
            if open {
                "failing (circuit breaker open)"
            } else {
                "ok"
            },
            answers.allow,
            answers.deny,
            answers.local,
            answers.envoy,
        ));
        status.healthy = !open;
        status.failure_mode_answers = answers;
        status
    }
}

impl Resilient {
    /// `call`, which nobody waits for, within the background deadline; refused at once while
    /// the breaker is open.
    fn in_background<'a, T: Send + 'a>(
        &'a self,
        what: &'static str,
        call: BoxFuture<'a, Result<T, StoreError>>,
    ) -> BoxFuture<'a, Result<T, StoreError>> {
        Box::pin(async move {
            if self.shared.breaker.is_open() {
                return Err(StoreError::Unavailable("circuit breaker open".into()));
            }
            within(self.options.background_limit(), what, call).await
        })
    }

    /// `call` within `deadline`, counted by the breaker like a request's; while the breaker
    /// is open, an error at once.
    fn counted<'a, T: Send + 'a>(
        &'a self,
        deadline: Duration,
        what: &'static str,
        call: BoxFuture<'a, Result<T, StoreError>>,
    ) -> BoxFuture<'a, Result<T, StoreError>> {
        Box::pin(async move {
            let shared = &self.shared;
            if shared.breaker.is_open() {
                return Err(StoreError::Unavailable("circuit breaker open".into()));
            }
            let result = within(deadline, what, call).await;
            match &result {
                Ok(_) => shared.breaker.succeeded(),
                Err(error) => Core::failed(shared, error),
            }
            result
        })
    }
}

impl Shared for Resilient {
    /// Leases within the deadline, counted by the breaker like any call; while the breaker
    /// is open, an error at once (the leasing layer answers by the failure mode then).
    /// Hand-backs get the background limit: nobody waits for them.
    fn lease<'a>(&'a self, asks: &'a [LeaseAsk]) -> BoxFuture<'a, Result<Vec<Grant>, StoreError>> {
        let background = asks.iter().all(|a| matches!(a.take, Take::GiveBack { .. }));
        let deadline = if background {
            self.options.background_limit()
        } else {
            self.options.deadline
        };
        self.counted(deadline, "the lease", self.shared.primary.lease(asks))
    }

    /// A take within the request deadline, the rest within the background one; an open
    /// breaker refuses at once.
    fn pool<'a>(
        &'a self,
        ops: &'a [super::PoolOp],
    ) -> BoxFuture<'a, Result<Vec<super::PoolAnswer>, StoreError>> {
        let takes = ops
            .iter()
            .any(|op| matches!(op.kind, super::pool::PoolKind::Take { .. }));
        let deadline = if takes {
            self.options.deadline
        } else {
            self.options.background_limit()
        };
        self.counted(deadline, "the pools", self.shared.primary.pool(ops))
    }

    fn instances<'a>(
        &'a self,
        instance: &'a str,
        within: Duration,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        let deadline = self.options.background_limit();
        let call = self.shared.primary.instances(instance, within);
        Box::pin(self::within(deadline, "counting instances", call))
    }

    fn warm_up(&self) -> BoxFuture<'_, ()> {
        self.shared.primary.warm_up()
    }

    /// Within the background deadline; an open breaker refuses at once (the claims then stay
    /// as they are until the store answers again).
    fn claim<'a>(
        &'a self,
        asks: &'a [super::ClaimAsk],
    ) -> BoxFuture<'a, Result<Vec<super::ClaimGrant>, StoreError>> {
        self.in_background("the claims", self.shared.primary.claim(asks))
    }

    /// As the claims: the hashes stay for the next tick.
    fn add_refused<'a>(
        &'a self,
        adds: &'a [super::RefusedAdd],
    ) -> BoxFuture<'a, Result<Vec<u32>, StoreError>> {
        self.in_background("the refused keys", self.shared.primary.add_refused(adds))
    }

    fn close_refused<'a>(
        &'a self,
        closes: &'a [super::RefusedClose],
    ) -> BoxFuture<'a, Result<Vec<super::RefusedCounts>, StoreError>> {
        self.in_background(
            "the refused keys",
            self.shared.primary.close_refused(closes),
        )
    }

    fn probe(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        self.shared.primary.probe()
    }
}

// === impl Core ===

impl Core {
    /// One call to the primary store, owning what it needs so that it may outlive its caller.
    async fn call(self: Arc<Self>, batch: Arc<Batch>) -> Result<Applied, StoreError> {
        self.primary.apply(&batch).await
    }

    /// Lets a call that missed its deadline finish, and hands its answer to the late sink.
    fn finish_late(
        shared: &Arc<Self>,
        call: std::pin::Pin<
            Box<impl Future<Output = Result<Applied, StoreError>> + Send + 'static>,
        >,
        batch: Arc<Batch>,
        asked_at: Micros,
    ) {
        if shared.background.fetch_add(1, Ordering::AcqRel) >= MAX_BACKGROUND {
            shared.background.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        let shared = shared.clone();
        tokio::spawn(async move {
            if let Ok(Ok(applied)) = tokio::time::timeout(shared.background_limit, call).await
                && let Some(late) = shared.late.get()
            {
                late.answered(&batch, &applied, asked_at);
            }
            shared.background.fetch_sub(1, Ordering::AcqRel);
        });
    }

    /// Sends a request the failure policy admitted to the store anyway, nobody waiting: its
    /// hits are counted and a refusal is learnt.
    fn in_background(shared: &Arc<Self>, batch: &Batch) {
        if shared.background.load(Ordering::Acquire) >= MAX_BACKGROUND {
            return;
        }
        let asked_at = shared.clock.now();
        let batch = Arc::new(batch.clone());
        let call = Box::pin(Core::call(shared.clone(), batch.clone()));
        Core::finish_late(shared, call, batch, asked_at);
    }

    /// Records a failed call; the call that opens the breaker starts the prober.
    fn failed(shared: &Arc<Self>, error: &StoreError) {
        if shared.breaker.failed() {
            if shared.failures_logged.ready() {
                tracing::warn!(error = %error, "store failing: circuit breaker open, answering by failure_mode");
            }
            Core::start_prober(shared);
        }
    }

    /// Probes the store every cooldown until it answers, then closes the breaker. No request
    /// waits for a probe.
    fn start_prober(shared: &Arc<Self>) {
        if shared.breaker.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let shared = shared.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(shared.breaker.cooldown).await;
                match tokio::time::timeout(shared.probe_deadline, shared.primary.probe()).await {
                    Ok(Ok(())) => {
                        shared.breaker.probing.store(false, Ordering::Release);
                        shared.breaker.succeeded();
                        return;
                    }
                    Ok(Err(error)) if shared.failures_logged.ready() => {
                        tracing::warn!(error = %error, "store still failing");
                    }
                    _ => {}
                }
            }
        });
    }
}
