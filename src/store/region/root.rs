//! The region's calls to the root: asks for a pool (top-ups), in the background, and
//! hand-backs of idle pools, every quarter region lease period.

use std::sync::Arc;
use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Core, micros};
use crate::algorithm::{Algorithm, Ask, Limit, Micros};
use crate::store::lease::AskId;
use crate::store::pool::{Install, MAX_INTERVAL, PoolAnswer, PoolKind, PoolOp, RootAsk};
use crate::store::{CounterKey, Grant, LeaseAsk, Report, StoreError, Take};

/// Pools withdrawn per call.
const PER_CALL: usize = 512;

impl Core {
    /// Starts the sweeper, once.
    pub(super) fn start(self: &Arc<Self>) {
        if self.started.load(Ordering::Relaxed) || self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(sweeper(Arc::downgrade(self)));
        }
    }

    /// Asks the root for the pool `answer` (a take's) made this instance ask for, in the
    /// background; installs what comes back. Outside a runtime (never in the service), it
    /// does nothing: the pool's marker lapses and another take asks.
    pub(super) fn ask_root(self: &Arc<Self>, key: CounterKey, limit: Limit, answer: PoolAnswer) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let core = self.clone();
        runtime.spawn(async move { core.top_up(key, limit, answer).await });
    }

    async fn top_up(&self, key: CounterKey, limit: Limit, answer: PoolAnswer) {
        let Some(ask) = answer.ask else { return };
        let lease = self.lease_ask(&key, &limit, &answer, &ask);
        let start = lease.start;
        let started = self.clock.now();
        let due = self.count_due(started).await;
        let (_, mut grants) = futures_util::future::join(
            async {
                if due {
                    self.count_regions().await;
                }
            },
            self.root_call(self.root.lease(std::slice::from_ref(&lease))),
        )
        .await;
        let mut elapsed = self.clock.now().saturating_sub(started);
        if grants.is_err() && elapsed < micros(self.options.root_deadline) / 2 {
            // A call that failed fast (a reset connection) may have been applied with its
            // reply lost: asked again, the same ask gets what it was granted, once.
            let retry = LeaseAsk {
                not_after: match lease.not_after {
                    0 => 0,
                    not_after => not_after + elapsed,
                },
                ..lease
            };
            grants = self
                .root_call(self.root.lease(std::slice::from_ref(&retry)))
                .await;
            elapsed = self.clock.now().saturating_sub(started);
        }
        let retry = |after: Micros| answer.now + elapsed + after.min(self.period / 4);
        let install = match grants.map(|g| g.first().copied()) {
            Ok(Some(grant)) => {
                self.round_trip.store(elapsed, Ordering::Relaxed);
                self.totals
                    .granted
                    .fetch_add(grant.units, Ordering::Relaxed);
                let asked = (&answer, &ask, start, elapsed);
                installed(&grant, &limit, asked, self.period, retry)
            }
            _ => Install {
                failed: true,
                retry_at: retry(self.period / 4),
                ..Install::default()
            },
        };
        let op = PoolOp {
            key: key.clone(),
            kind: PoolKind::Install(install),
        };
        let Ok(installed) = self.region.pool(std::slice::from_ref(&op)).await else {
            // The region's store failed: the units are lost to it until the window ends
            // (under, never over); the marker lapses.
            self.totals
                .lost_region_store
                .fetch_add(install.units, Ordering::Relaxed);
            return;
        };
        if let Some(late) = installed.first().and_then(|a| a.ask) {
            // The grant came after its pool would have ended: straight back.
            self.totals.late.fetch_add(late.units, Ordering::Relaxed);
            self.hand_back(&[(key, limit, late)]).await;
        }
    }

    /// The root lease of the ask `answer` (a take's) made.
    fn lease_ask(
        &self,
        key: &CounterKey,
        limit: &Limit,
        answer: &PoolAnswer,
        ask: &RootAsk,
    ) -> LeaseAsk {
        let start = ask_start(limit, answer, ask);
        LeaseAsk {
            key: root_key(key, start),
            start,
            limit: *limit,
            take: Take::Lease(Ask {
                want: ask.units.max(1),
                need: 1,
                instances: self.regions.load(Ordering::Relaxed),
            }),
            report: self.report(ask),
            // The root's time as the pool knows it (never behind it) plus the deadline:
            // an ask delivered later (held by a partition) grants nothing. Without a grant
            // yet, the root's clock is not known: no such limit.
            not_after: if answer.generation == 0 {
                0
            } else {
                answer.root_now + micros(self.options.root_deadline)
            },
            id: AskId {
                asker: self.asker,
                seq: self.next_seq(),
            },
        }
    }

    /// A new ask's number (never 0).
    fn next_seq(&self) -> u64 {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed).wrapping_add(1) & super::SEQ_MASK;
        seq.max(1)
    }

    /// Whether this region's count is due alongside an ask sent at `started` (local time).
    /// The root counts the regions that asked within three region lease periods: this one
    /// says so once a period, alongside an ask; before its first ask, on its own, so that
    /// the first ask is not sized as if this region were alone.
    async fn count_due(&self, started: Micros) -> bool {
        if self.counted_at.load(Ordering::Relaxed) == 0 && self.count_regions().await {
            self.counted_at.store(started.max(1), Ordering::Relaxed);
        }
        let due = started.saturating_sub(self.counted_at.load(Ordering::Relaxed)) >= self.period;
        if due {
            self.counted_at.store(started.max(1), Ordering::Relaxed);
        }
        due
    }

    /// Tells the root this region takes leases and learns how many do: whether it answered.
    async fn count_regions(&self) -> bool {
        let within = 3 * self.options.period;
        match self
            .root_call(self.root.instances(&self.options.region, within))
            .await
        {
            Ok(n) => {
                self.regions.store(n.max(1), Ordering::Relaxed);
                true
            }
            Err(_) => false,
        }
    }

    /// The learning rule's report with an ask: what the pool gave out since its last one.
    fn report(&self, ask: &RootAsk) -> Report {
        Report {
            epoch: ask.epoch,
            admitted: ask.admitted,
            hold: self.hold,
        }
    }

    /// A call to the root within its deadline; the root's reachability follows the answer.
    async fn root_call<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let result = match tokio::time::timeout(self.options.root_deadline, call).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Unavailable(format!(
                "the root did not answer within {:?}",
                self.options.root_deadline
            ))),
        };
        let ok = result.is_ok();
        let counter = if ok {
            &self.totals.calls_ok
        } else {
            &self.totals.calls_failed
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if self.reachable.swap(ok, Ordering::Relaxed) != ok {
            match &result {
                Ok(_) => tracing::info!(region = %self.options.region, "the root answers again"),
                Err(error) => {
                    tracing::warn!(region = %self.options.region, %error, "the root does not answer: global rules answer from the pools, then by their failure_mode")
                }
            }
        }
        result
    }

    /// Hands `units` back to the root, each guarded by its root window, with its report.
    async fn hand_back(&self, backs: &[(CounterKey, Limit, RootAsk)]) -> u64 {
        let asks: Vec<LeaseAsk> = backs
            .iter()
            .map(|(key, limit, back)| LeaseAsk {
                key: root_key(key, back_start(limit, back)),
                start: back_start(limit, back),
                limit: *limit,
                take: Take::GiveBack {
                    units: back.units,
                    guard: back.guard,
                },
                report: self.report(back),
                not_after: 0,
                id: Default::default(),
            })
            .collect();
        let offered: u64 = backs.iter().map(|(_, _, back)| back.units).sum();
        let Ok(grants) = self.root_call(self.root.lease(&asks)).await else {
            // Lost until their window ends: under, never over.
            self.totals
                .lost_hand_back
                .fetch_add(offered, Ordering::Relaxed);
            return 0;
        };
        let units = grants.iter().map(|g| g.units).sum();
        self.totals
            .lost_hand_back
            .fetch_add(offered.saturating_sub(units), Ordering::Relaxed);
        self.totals.returned.fetch_add(units, Ordering::Relaxed);
        units
    }

    /// Withdraws the free units of the pools this instance knows that nobody took from for
    /// a lease period and a quarter region lease period (`all`: whatever their idleness)
    /// and hands them back to the root. Returns the units handed back.
    pub(super) async fn sweep(&self, all: bool) -> u64 {
        let now = self.clock.now();
        let horizon = now.saturating_sub(crate::store::pool::KEEP);
        let known: Vec<(CounterKey, Limit)> = {
            let mut known = self.known.lock();
            known.retain(|_, k| k.seen > horizon);
            known
                .iter()
                .map(|(key, k)| (key.clone(), k.limit))
                .collect()
        };
        // Idle: no instance took units for a lease period (one holding a block comes back
        // within it) and a quarter region lease period.
        let idle = if all {
            0
        } else {
            super::micros(self.options.lease_period) + self.period / 4
        };
        let mut returned = 0;
        for chunk in known.chunks(PER_CALL) {
            let ops: Vec<PoolOp> = chunk
                .iter()
                .map(|(key, _)| PoolOp {
                    key: key.clone(),
                    kind: PoolKind::Withdraw { idle },
                })
                .collect();
            let Ok(answers) = self.region.pool(&ops).await else {
                return returned;
            };
            let backs: Vec<(CounterKey, Limit, RootAsk)> = chunk
                .iter()
                .zip(answers)
                .filter_map(|((key, limit), a)| a.ask.map(|ask| (key.clone(), *limit, ask)))
                .collect();
            if !backs.is_empty() {
                returned += self.hand_back(&backs).await;
            }
        }
        returned
    }
}

/// The pool install of the root's `grant` for the ask `answer` made: valid from the ask,
/// for a region lease period at most and never past the root's window.
fn installed(
    grant: &Grant,
    limit: &Limit,
    (answer, ask, start, elapsed): (&PoolAnswer, &RootAsk, Micros, Micros),
    period: Micros,
    retry: impl Fn(Micros) -> Micros,
) -> Install {
    let window = limit.window.max(1);
    let bucket = limit.algorithm == Algorithm::TokenBucket;
    // A token bucket's root short of what was asked: the regions share its refill, each
    // asking at most every quarter region lease period (a region near the root would
    // otherwise ask again at once and take nearly all of it).
    let short = bucket && grant.units < ask.units;
    Install {
        units: grant.units,
        // A token bucket's: its arrival time after the grant (what a hand-back names).
        guard: if bucket {
            grant.now.saturating_add(grant.decision.reset_after)
        } else if start != 0 {
            start
        } else {
            grant.now - grant.now % window
        },
        interval: if bucket { interval(limit) } else { 0 },
        epoch: grant.epoch,
        asked_at: answer.now,
        offset: grant.now as i64 - answer.now as i64,
        // Units charged to the root's current window die with it (a sliding window's
        // included: in the next one they count only weighted). A token bucket's tokens end
        // with their time (the pool counts them), its pool a region lease period after the
        // ask.
        left: if bucket {
            period
        } else if start != 0 {
            period.min((start + window).saturating_sub(grant.now))
        } else {
            period.min(limit.window_left(grant.now))
        },
        // A fixed window's units from the latest its start can be in region time: the root's
        // clock is at least its answer's time less the reply's time ahead of the region's.
        from: if start != 0 {
            (start + answer.now + elapsed).saturating_sub(grant.now)
        } else {
            0
        },
        prev_guard: if start != 0 {
            start.saturating_sub(window)
        } else {
            0
        },
        reported: ask.used,
        retry_at: if grant.units == 0
            && answer.generation == 0
            && start != 0
            && grant.now >= start + window
        {
            // A new key's first ask, for a window over at the root when it arrived (asked
            // across a window start): the next take asks for the root's current one at once.
            // (A pool with a grant knows the root's clock: its asks wait as below.)
            0
        } else if grant.units == 0 {
            retry(
                grant
                    .decision
                    .retry_after
                    .unwrap_or(grant.decision.reset_after),
            )
        } else if short {
            // (From the ask: a region far from the root asks as often as a near one.)
            answer.now + period / 4
        } else {
            0
        },
        failed: false,
    }
}

/// The root window a pool's ask is for (a fixed window's: one root counter per window; 0
/// otherwise): the next one for an ask ahead, else the one the root's time as the pool knows
/// it (never behind) falls in.
fn ask_start(limit: &Limit, answer: &PoolAnswer, ask: &RootAsk) -> Micros {
    if limit.algorithm != Algorithm::FixedWindow {
        return 0;
    }
    let window = limit.window.max(1);
    if ask.next {
        answer.guard + window
    } else {
        answer.root_now - answer.root_now % window
    }
}

/// The window a hand-back names (a fixed window's; 0 otherwise): its guard.
fn back_start(limit: &Limit, back: &RootAsk) -> Micros {
    if limit.algorithm == Algorithm::FixedWindow {
        back.guard
    } else {
        0
    }
}

/// The root's counter for the window starting at `start` (0: the counter's own key).
fn root_key(key: &CounterKey, start: Micros) -> CounterKey {
    if start == 0 {
        key.clone()
    } else {
        key.clone().windowed(start)
    }
}

/// A token bucket's emission interval in nanoseconds, rounded up (fewer tokens, never more),
/// within what a pool counts with.
fn interval(limit: &Limit) -> u64 {
    let ns = (limit.window as u128 * 1_000).div_ceil(limit.requests.max(1) as u128);
    ns.clamp(1, MAX_INTERVAL as u128) as u64
}

/// Sweeps every quarter region lease period; stops when the layer is dropped.
async fn sweeper(core: Weak<Core>) {
    let Some(period) = core.upgrade().map(|c| c.options.period) else {
        return;
    };
    let every = (period / 4).clamp(Duration::from_millis(10), Duration::from_secs(5));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(core) = core.upgrade() else { return };
        core.sweep(false).await;
    }
}
