// Why one file: a request's global counters, the pool calls they share and the failure
// mode of a cut-off region move the same units; the root's side is in region/root.rs.
//! Global counters across regions (`scope: global`; docs/configuration/leased-quota.md,
//! "Across regions"): this region's pools between the root counter and the instances'
//! blocks. To the root (one counter in the home region's store, run by the lease protocol
//! as it is), a region is one leasing instance; its block lives in the region's store (a
//! [`pool`](super::pool)), where every instance of the region takes blocks from it
//! atomically. No request waits on the root:
//!
//! - A request's global counters are decided from its instance's block ([`super::Leased`],
//!   above this layer), or from the region's pool (this layer, in the region's store).
//! - A take that leaves a pool low makes its instance ask the root, in the background, for
//!   what the region uses in a region lease period; one ask per pool is in flight
//!   (the pool's marker). The answer is installed in the pool, valid from before the ask for
//!   a region lease period at most, never past the root's window.
//! - A request that finds its block and its pool empty is refused (under, never a wait).
//!   While the root does not answer and the pool has ended, the rule's `failure_mode`
//!   answers: `deny` refuses, `allow` admits, `local` counts in the region's store with
//!   its share of the limit.
//! - Units nobody in the region takes for a quarter region lease period go back to the root
//!   (withdrawn from the pool first), guarded by the root window.
//!
//! Every unit admitted anywhere was granted by the root first: the planet never admits more
//! than one exact counter would. Region-scope counters pass through to the region's store.

mod known;
mod options;
mod root;
mod stack;
mod timing;

pub use options::{PoolView, RegionOptions, RegionStatus, held_at_own_rate};

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use super::pool::{PoolAnswer, PoolKind, PoolOp};
use super::{
    Admission, Applied, Batch, CounterOp, FailureMode, Grant, LeaseAsk, Role, Shared, StoreError,
    Take, admitted,
};
use crate::algorithm::{Decision, Limit, Micros};
use crate::clock::Clock;

/// Global counters this instance remembers (for hand-backs to the root); past it, the
/// oldest are forgotten (their pools' units then go back only when another instance sees
/// them, or die with their window: under, never over).
const MAX_KNOWN: usize = 100_000;
/// Pools listed in `/rlconfig`.
const LISTED_POOLS: usize = 20;

/// The region layer over this region's store and the root's.
pub struct Regions {
    core: Arc<Core>,
}

struct Core {
    region: Arc<dyn Shared>,
    root: Arc<dyn Shared>,
    options: RegionOptions,
    period: Micros,
    /// How long the root grants nothing after a wipe under pools: every pool of the old
    /// epoch has ended (a region lease period), its blocks too (a lease period), a sweep
    /// has reported it (a quarter period) and the report has landed (the root deadline).
    hold: Micros,
    clock: Arc<dyn Clock>,
    regions: AtomicU64,
    /// This region's name hashed: who asks the root (see [`super::lease::AskId`]).
    asker: u64,
    /// This instance's asks: numbered from a random start, so that two instances of the
    /// region never name two asks alike (below 2^52: exact in the root script's numbers).
    seq: AtomicU64,
    /// When this instance last told the root its region takes leases (local time).
    counted_at: AtomicU64,
    round_trip: AtomicU64,
    reachable: AtomicBool,
    /// Global counters seen: their limit and when (local time), for the sweeps.
    known: Mutex<HashMap<super::CounterKey, Known>>,
    started: AtomicBool,
    totals: Totals,
}

/// A global counter this instance has seen: its limit, when (local time), and its pool as
/// last answered (free units, and when it ends, local time).
#[derive(Clone, Copy)]
struct Known {
    limit: Limit,
    seen: Micros,
    free: u64,
    ends_at: Micros,
}

#[derive(Default)]
struct Totals {
    calls_ok: AtomicU64,
    calls_failed: AtomicU64,
    granted: AtomicU64,
    returned: AtomicU64,
    late: AtomicU64,
    pool: AtomicU64,
    failure_mode: AtomicU64,
    lost_hand_back: AtomicU64,
    lost_put_back: AtomicU64,
    lost_region_store: AtomicU64,
}

/// A random start for an instance's ask numbers.
fn first_seq() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(std::process::id().into());
    hasher.finish() & SEQ_MASK
}

/// Ask numbers stay below 2^52.
const SEQ_MASK: u64 = (1 << 52) - 1;

/// A region's name as the root's asker: FNV-1a, never 0.
fn asker(region: &str) -> u64 {
    let hash = region.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    hash.max(1)
}

fn micros(d: Duration) -> Micros {
    d.as_micros().min(u64::MAX as u128) as Micros
}

impl Regions {
    /// Global counters through this region's pools in `region` (behind its failure policy),
    /// granted by `root` (with the root deadline as its call timeout); `clock` times the
    /// sweeps (local durations).
    pub fn new(
        region: Arc<dyn Shared>,
        root: Arc<dyn Shared>,
        options: RegionOptions,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let period = micros(options.period).max(10_000);
        let hold = period
            + micros(options.lease_period)
            + period / 4
            + micros(options.root_deadline)
            + 500_000;
        Self {
            core: Arc::new(Core {
                region,
                root,
                period,
                hold,
                clock,
                regions: AtomicU64::new(1),
                asker: asker(&options.region),
                seq: AtomicU64::new(first_seq()),
                counted_at: AtomicU64::new(0),
                round_trip: AtomicU64::new(100_000),
                reachable: AtomicBool::new(true),
                known: Mutex::default(),
                started: AtomicBool::new(false),
                totals: Totals::default(),
                options,
            }),
        }
    }

    /// What the region's pools and the root look like from this instance.
    pub fn region_status(&self) -> RegionStatus {
        let c = &self.core;
        // (One lock at a time: a guard in the literal below would live through it.)
        let pools = c.known.lock().len() as u64;
        let pool_free = c.pools_free();
        let top = c.top_pools();
        let t = &c.totals;
        RegionStatus {
            region: c.options.region.clone(),
            root_reachable: c.reachable.load(Ordering::Relaxed),
            regions: c.regions.load(Ordering::Relaxed),
            root_calls_ok: t.calls_ok.load(Ordering::Relaxed),
            root_calls_failed: t.calls_failed.load(Ordering::Relaxed),
            units_granted: t.granted.load(Ordering::Relaxed),
            units_returned: t.returned.load(Ordering::Relaxed),
            units_late: t.late.load(Ordering::Relaxed),
            pool_decisions: t.pool.load(Ordering::Relaxed),
            failure_mode_decisions: t.failure_mode.load(Ordering::Relaxed),
            round_trip: c.round_trip.load(Ordering::Relaxed),
            units_lost: [
                t.lost_hand_back.load(Ordering::Relaxed),
                t.lost_put_back.load(Ordering::Relaxed),
                t.lost_region_store.load(Ordering::Relaxed),
            ],
            pool_free,
            pools,
            top,
        }
    }

    /// Does what the background sweep does every quarter region lease period, now: idle
    /// pools' units back to the root. For tests on a manual clock. Returns the units handed
    /// back.
    pub async fn sweep_now(&self) -> u64 {
        self.core.sweep(false).await
    }

    async fn apply_batch(&self, batch: &Batch) -> Result<Applied, StoreError> {
        let core = &self.core;
        let global: Vec<usize> = (0..batch.ops.len())
            .filter(|&i| batch.ops[i].key.is_global())
            .collect();
        if global.is_empty() {
            return core.region.apply(batch).await;
        }
        core.start();
        let Global {
            mut decisions,
            taken,
            cut,
        } = core.decide_global(batch, &global).await?;
        let refused_here = batch
            .ops
            .iter()
            .zip(&decisions)
            .any(|(op, d)| op.role == Role::Enforce && d.is_some_and(|d| !d.allowed));
        let rest: Vec<usize> = (0..batch.ops.len())
            .filter(|&i| decisions[i].is_none())
            .collect();
        let mut inner_admitted = true;
        if !rest.is_empty() {
            let inner = Batch {
                ops: rest.iter().map(|&i| batch.ops[i].clone()).collect(),
                admission: match batch.admission {
                    Admission::ByRule if refused_here => Admission::Never,
                    admission => admission,
                },
                deadline: batch.deadline,
                charged_at: batch.charged_at,
            };
            let applied = core.region.apply(&inner).await;
            let applied = match applied {
                Ok(applied) => applied,
                Err(e) => {
                    core.put_back(taken).await;
                    return Err(e);
                }
            };
            inner_admitted = applied.admitted;
            for (&i, d) in rest.iter().zip(applied.decisions) {
                decisions[i] = Some(d);
            }
        }
        let decisions: Vec<Decision> = decisions.into_iter().flatten().collect();
        let admitted = admitted(&batch.ops, &decisions, batch.admission)
            && (inner_admitted || batch.admission == Admission::Always);
        if !admitted {
            core.put_back(taken).await;
        }
        Ok(Applied {
            admitted,
            decisions,
            degraded: cut,
            cached: Vec::new(),
            decided_at: None,
            calls: Default::default(),
        })
    }

    async fn lease_asks(&self, asks: &[LeaseAsk]) -> Result<Vec<Grant>, StoreError> {
        let core = &self.core;
        let (global, region): (Vec<usize>, Vec<usize>) =
            (0..asks.len()).partition(|&i| asks[i].key.is_global());
        if global.is_empty() {
            return core.region.lease(asks).await;
        }
        core.start();
        let ops: Vec<PoolOp> = global.iter().map(|&i| core.pool_op(&asks[i])).collect();
        let answers = core.region.pool(&ops).await?;
        let mut cut = false;
        let mut taken = Vec::new();
        for (&i, answer) in global.iter().zip(&answers) {
            let ask = &asks[i];
            if !matches!(ask.take, Take::Lease(_)) {
                continue;
            }
            core.saw(&ask.key, answer);
            if answer.ask.is_some() {
                core.ask_root(ask.key.clone(), ask.limit, *answer);
            }
            if answer.units > 0 {
                taken.push((ask.key.clone(), answer.units, *answer));
            }
            cut |= core.cut_off(answer);
        }
        if cut {
            // The root is away and a pool has ended: the rule's failure mode answers, in the
            // exact path (`apply`). What the other asks took goes back to their pools, and
            // the region-scope asks are not sent.
            core.put_back(taken).await;
            return Err(StoreError::Unavailable(
                "the root does not answer and this region's pool has ended".into(),
            ));
        }
        let region_asks: Vec<LeaseAsk> = region.iter().map(|&i| asks[i].clone()).collect();
        let leased = if region_asks.is_empty() {
            Vec::new()
        } else {
            match core.region.lease(&region_asks).await {
                Ok(leased) => leased,
                Err(e) => {
                    core.put_back(taken).await;
                    return Err(e);
                }
            }
        };
        let grants = global.iter().zip(&answers).map(|(&i, answer)| {
            let window = asks[i].limit.window;
            let decision = answer.decision(window, core.retry(answer));
            let grant = Grant {
                units: answer.units,
                decision,
                now: timing::block_now(answer, &asks[i].limit),
                epoch: answer.generation,
            };
            (i, grant)
        });
        let mut out: Vec<Option<Grant>> = vec![None; asks.len()];
        for (i, grant) in grants {
            out[i] = Some(grant);
        }
        for (&i, grant) in region.iter().zip(leased) {
            out[i] = Some(grant);
        }
        out.into_iter()
            .map(|g| g.ok_or_else(|| StoreError::Internal("a lease got no answer".into())))
            .collect()
    }
}

/// A request's global counters decided from the region's pools (or by their failure mode).
struct Global {
    /// Per operation of the request: the global ones' decisions.
    decisions: Vec<Option<Decision>>,
    /// Units taken from pools: back to them if the request is refused.
    taken: Vec<(super::CounterKey, u64, PoolAnswer)>,
    /// Whether a failure mode answered.
    cut: bool,
}

impl Core {
    /// Takes the `global` operations' hits from their pools (one call to the region's
    /// store), asks the root where a take says so, and decides each: from its pool, or by its
    /// failure mode when the root is away and the pool has ended.
    async fn decide_global(
        self: &Arc<Self>,
        batch: &Batch,
        global: &[usize],
    ) -> Result<Global, StoreError> {
        let need = |op: &CounterOp| match batch.admission {
            Admission::Never => 0,
            _ => op.hits.max(0) as u64,
        };
        let takes: Vec<PoolOp> = global
            .iter()
            .map(|&i| {
                let op = &batch.ops[i];
                let need = need(op);
                self.take_op(op.key.clone(), &op.limit, (need, need, need), 1)
            })
            .collect();
        let answers = self.region.pool(&takes).await?;
        self.asks(
            &global.iter().map(|&i| &batch.ops[i]).collect::<Vec<_>>(),
            &answers,
        );
        let mut out = Global {
            decisions: vec![None; batch.ops.len()],
            taken: Vec::new(),
            cut: false,
        };
        for (answer, take) in answers.iter().zip(&takes) {
            self.saw(&take.key, answer);
            if answer.units > 0 {
                out.taken.push((take.key.clone(), answer.units, *answer));
            }
        }
        for (&i, answer) in global.iter().zip(&answers) {
            let op = &batch.ops[i];
            if self.cut_off(answer) && op.hits >= 0 {
                out.cut = true;
                match self.failure_mode(op).await {
                    Ok(decision) => out.decisions[i] = decision,
                    Err(e) => {
                        self.put_back(std::mem::take(&mut out.taken)).await;
                        return Err(e);
                    }
                }
                continue;
            }
            self.totals.pool.fetch_add(1, Ordering::Relaxed);
            let mut decision = answer.decision(op.limit.window, self.retry(answer));
            // A look (0 hits, or a request already refused) is allowed while units are free.
            if need(op) == 0 {
                decision.allowed = answer.free > 0;
            }
            out.decisions[i] = Some(decision);
        }
        Ok(out)
    }

    /// The pool operation of a block's lease or hand-back.
    fn pool_op(&self, ask: &LeaseAsk) -> PoolOp {
        match ask.take {
            Take::Lease(a) => {
                let demand = self.refused_demand(a.want);
                let amounts = (a.want, a.need.max(1), demand);
                self.take_op(ask.key.clone(), &ask.limit, amounts, a.instances)
            }
            Take::GiveBack { units, guard } => PoolOp {
                key: ask.key.clone(),
                kind: PoolKind::Return {
                    units,
                    generation: ask.report.epoch,
                    guard,
                },
            },
        }
    }

    /// A take of (`want`, `need`, the demand a refusal stands for) units.
    fn take_op(
        &self,
        key: super::CounterKey,
        limit: &Limit,
        (want, need, demand): (u64, u64, u64),
        instances: u64,
    ) -> PoolOp {
        self.remember(&key, limit);
        PoolOp {
            key,
            kind: PoolKind::Take {
                want,
                need,
                instances,
                demand,
                timing: self.timing(limit),
            },
        }
    }

    /// Whether the pool answers no more and the root does not either: the failure mode's.
    fn cut_off(&self, answer: &PoolAnswer) -> bool {
        answer.units == 0 && answer.free == 0 && answer.root_failed
    }

    /// The asks to the root that `answers` (to takes of `ops`) made this instance's.
    fn asks(self: &Arc<Self>, ops: &[&CounterOp], answers: &[PoolAnswer]) {
        for (op, answer) in ops.iter().zip(answers) {
            if answer.ask.is_some() {
                self.ask_root(op.key.clone(), op.limit, *answer);
            }
        }
    }

    /// What a cut-off region answers for `op`: its failure mode's.
    async fn failure_mode(&self, op: &CounterOp) -> Result<Option<Decision>, StoreError> {
        self.totals.failure_mode.fetch_add(1, Ordering::Relaxed);
        let now = self.clock.now();
        match op.failure_mode {
            FailureMode::Envoy => Err(StoreError::Unavailable(
                "the root does not answer; failure_mode envoy leaves the decision to Envoy".into(),
            )),
            FailureMode::Allow | FailureMode::Deny => {
                Ok(Some(super::resilient::fixed_answer(op, now)))
            }
            FailureMode::Local => {
                let share = if self.options.partition_share > 0.0 {
                    self.options.partition_share
                } else {
                    1.0 / self.regions.load(Ordering::Relaxed).max(1) as f64
                };
                let scaled = |n: u64| (n as f64 * share).floor() as u64;
                let local = CounterOp {
                    limit: Limit {
                        requests: scaled(op.limit.requests),
                        burst: scaled(op.limit.burst),
                        ..op.limit
                    },
                    ..op.clone()
                };
                let batch = Batch {
                    ops: vec![local],
                    admission: Admission::ByRule,
                    deadline: None,
                    charged_at: None,
                };
                let applied = self.region.apply(&batch).await?;
                Ok(applied.decisions.first().copied())
            }
        }
    }

    /// Units a refused request took from pools, back to them.
    async fn put_back(&self, taken: Vec<(super::CounterKey, u64, PoolAnswer)>) {
        if taken.is_empty() {
            return;
        }
        let offered: u64 = taken.iter().map(|(_, units, _)| units).sum();
        let ops: Vec<PoolOp> = taken
            .into_iter()
            .map(|(key, units, answer)| PoolOp {
                key,
                kind: PoolKind::Return {
                    units,
                    generation: answer.generation,
                    // (A token bucket's pool: the take's mark.)
                    guard: if answer.tokens_end > 0 {
                        answer.mark
                    } else {
                        answer.guard
                    },
                },
            })
            .collect();
        // Not given back: under, never over.
        let back: u64 = match self.region.pool(&ops).await {
            Ok(answers) => answers.iter().map(|a| a.units).sum(),
            Err(_) => 0,
        };
        self.totals
            .lost_put_back
            .fetch_add(offered.saturating_sub(back), Ordering::Relaxed);
    }
}
