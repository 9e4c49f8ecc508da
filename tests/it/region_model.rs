//! Global counters across regions (`scope: global`) on their memory-backed model: a root
//! [`MemoryStore`] standing for the home region's Redis, a region store per region (its
//! pools), leasing instances in each ([`Leased`] over [`Regions`]), and between each region
//! and the root a [`Link`] that delays calls on the pinned clock, cuts them, and loses
//! replies (a call applied at the root whose answer never comes back). Random traffic,
//! faults and root wipes (proptest; failures are persisted under `proptest-regressions/`):
//!
//! - never over: per window, the planet admits at most the limit (plus, in a window whose
//!   root was wiped, what it had admitted before the wipe: the learning rule);
//! - no wait: a request is answered whatever the links do (a link that never delivers
//!   stalls nothing but the background ask);
//! - without faults, the planet admits the whole limit once every region has drained it.
//!
//! `lua/pool.lua` is checked against the same arithmetic in `tests/it/redis_pool.rs`.

use std::sync::Arc;
use std::time::Duration;

use crate::common::counters::{self, batch, limit};
use futures_util::future::join_all;
use parking_lot::Mutex;
use proptest::prelude::*;
use sluice::algorithm::{Algorithm, Limit, Micros, SECOND};
use sluice::clock::{Clock, ManualClock};
use sluice::store::lease::LeaseOptions;
use sluice::store::memory::MemoryOptions;
use sluice::store::{
    Applied, Batch, BoxFuture, ClaimAsk, ClaimGrant, Consistency, CounterOp, FailureMode, Grant,
    LeaseAsk, Leased, MemoryStore, PoolAnswer, PoolOp, RefusedAdd, RefusedClose, RefusedCounts,
    RegionOptions, Regions, Role, Shared, Store, StoreError, StoreStatus,
};

mod asks;
mod buckets;
mod cuts;

const START: Micros = 1_700_000_040 * SECOND;
const WINDOW: Micros = 60 * SECOND;

/// What a link does to the calls that cross it now.
#[derive(Debug, Default)]
struct LinkState {
    /// One-way delay each way: a call lands `delay` after it is sent, its answer `delay`
    /// later (pinned time).
    delay: Micros,
    /// Calls fail (nothing reaches the root).
    cut: bool,
    /// Replies still to lose: the call is applied at the root, its answer fails.
    lose: u32,
}

/// A region's path to the root.
struct Link {
    root: Arc<MemoryStore>,
    clock: Arc<ManualClock>,
    state: Mutex<LinkState>,
}

impl Link {
    /// Until pinned time `delay` after now (or a cut): whether the call goes through.
    async fn travel(&self) -> Result<(), StoreError> {
        let due = self.clock.now() + self.state.lock().delay;
        loop {
            if self.state.lock().cut {
                return Err(StoreError::Unavailable("the link is cut".into()));
            }
            if self.clock.now() >= due {
                return Ok(());
            }
            tokio::task::yield_now().await;
        }
    }

    /// A root call across the link: there, applied, and back (or lost).
    async fn call<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.travel().await?;
        let answer = call.await;
        {
            let mut state = self.state.lock();
            if state.lose > 0 {
                state.lose -= 1;
                return Err(StoreError::Unavailable("the reply was lost".into()));
            }
        }
        self.travel().await?;
        answer
    }
}

impl Store for Link {
    fn apply<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<Applied, StoreError>> {
        Box::pin(self.call(self.root.apply(batch)))
    }
    fn reset<'a>(&'a self, ops: &'a [CounterOp]) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(self.call(self.root.reset(ops)))
    }
    fn shut_down(&self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }
    fn status(&self) -> StoreStatus {
        self.root.status()
    }
}

impl Shared for Link {
    fn lease<'a>(&'a self, asks: &'a [LeaseAsk]) -> BoxFuture<'a, Result<Vec<Grant>, StoreError>> {
        Box::pin(self.call(self.root.lease(asks)))
    }
    fn pool<'a>(&'a self, ops: &'a [PoolOp]) -> BoxFuture<'a, Result<Vec<PoolAnswer>, StoreError>> {
        Box::pin(self.call(self.root.pool(ops)))
    }
    fn instances<'a>(
        &'a self,
        instance: &'a str,
        within: Duration,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(self.call(self.root.instances(instance, within)))
    }
    fn claim<'a>(
        &'a self,
        asks: &'a [ClaimAsk],
    ) -> BoxFuture<'a, Result<Vec<ClaimGrant>, StoreError>> {
        self.root.claim(asks)
    }
    fn add_refused<'a>(
        &'a self,
        adds: &'a [RefusedAdd],
    ) -> BoxFuture<'a, Result<Vec<u32>, StoreError>> {
        self.root.add_refused(adds)
    }
    fn close_refused<'a>(
        &'a self,
        closes: &'a [RefusedClose],
    ) -> BoxFuture<'a, Result<Vec<RefusedCounts>, StoreError>> {
        self.root.close_refused(closes)
    }
}

/// One leasing instance of a region: its blocks over its view of the region's pools.
struct Instance {
    regions: Arc<Regions>,
    leased: Leased,
}

struct Region {
    store: Arc<MemoryStore>,
    link: Arc<Link>,
    instances: Vec<Instance>,
}

struct Planet {
    clock: Arc<ManualClock>,
    root: Arc<MemoryStore>,
    regions: Vec<Region>,
}

const PERIOD: Duration = Duration::from_secs(2);
const LEASE_PERIOD: Duration = Duration::from_secs(1);

fn instance(
    region: usize,
    i: usize,
    store: &Arc<MemoryStore>,
    link: &Arc<Link>,
    clock: &Arc<ManualClock>,
) -> Instance {
    let options = RegionOptions {
        region: format!("r{region}"),
        period: PERIOD,
        // (Real time: a call the driver leaves undelivered this long is a cut.)
        root_deadline: Duration::from_secs(5),
        lease_period: LEASE_PERIOD,
        partition_share: 0.0,
    };
    let regions = Arc::new(Regions::new(
        store.clone(),
        link.clone(),
        options,
        clock.clone(),
    ));
    let lease = LeaseOptions {
        period: LEASE_PERIOD,
        instance: format!("r{region}-{i}"),
        ..LeaseOptions::default()
    };
    let leased = Leased::new(regions.clone(), lease, clock.clone());
    Instance { regions, leased }
}

fn planet(sizes: &[usize]) -> Planet {
    let clock = Arc::new(ManualClock::new(START));
    let root = Arc::new(MemoryStore::new(MemoryOptions::default(), clock.clone()));
    let regions = sizes
        .iter()
        .enumerate()
        .map(|(r, &n)| {
            let store = Arc::new(MemoryStore::new(MemoryOptions::default(), clock.clone()));
            let link = Arc::new(Link {
                root: root.clone(),
                clock: clock.clone(),
                state: Mutex::default(),
            });
            let instances = (0..n)
                .map(|i| instance(r, i, &store, &link, &clock))
                .collect();
            Region {
                store,
                link,
                instances,
            }
        })
        .collect();
    Planet {
        clock,
        root,
        regions,
    }
}

fn op(limit: &Limit, hits: i64, failure_mode: FailureMode) -> CounterOp {
    let op = counters::op("model", [("tenant", "hot")], *limit, hits, Role::Enforce);
    CounterOp {
        key: op.key.clone().global(),
        consistency: Consistency::Leased,
        failure_mode,
        ..op
    }
}

/// `hits` on the global key through `instance`: whether admitted.
async fn hit(instance: &Instance, limit: &Limit, hits: i64, mode: FailureMode) -> bool {
    let applied = instance
        .leased
        .apply(&batch(vec![op(limit, hits, mode)]))
        .await
        .unwrap();
    applied.admitted
}

/// Lets the background asks run as far as they can now.
async fn settle() {
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
}

/// A fault on a region's link, or on the root.
#[derive(Debug, Clone, Copy)]
enum Fault {
    None,
    /// One-way delay to the root from now on.
    Delay(Micros),
    Cut,
    Heal,
    /// The next replies lost.
    Lose(u32),
    /// The instance crashes (its blocks are lost) and a new one takes its place.
    Crash,
    /// The root restarts empty.
    Wipe,
}

#[derive(Debug, Clone, Copy)]
struct Wave {
    region: usize,
    instance: usize,
    gap: Micros,
    concurrency: usize,
    hits: i64,
    fault: Fault,
}

fn waves() -> impl Strategy<Value = Vec<Wave>> {
    let fault = prop_oneof![
        20 => Just(Fault::None),
        2 => (0..150_000u64).prop_map(Fault::Delay),
        2 => Just(Fault::Cut),
        1 => Just(Fault::Heal),
        1 => (1..3u32).prop_map(Fault::Lose),
        1 => Just(Fault::Crash),
        1 => Just(Fault::Wipe),
    ];
    let wave = (
        0..4usize,
        0..4usize,
        prop_oneof![4 => Just(0u64), 4 => 0..SECOND, 2 => SECOND..4 * SECOND, 2 => WINDOW / 2..WINDOW, 1 => 0..2 * WINDOW],
        prop_oneof![2 => Just(1usize), 2 => 2usize..16, 1 => 16usize..48],
        prop_oneof![8 => Just(1i64), 2 => 2i64..=4],
        fault,
    )
        .prop_map(|(region, instance, gap, concurrency, hits, fault)| Wave {
            region,
            instance,
            gap,
            concurrency,
            hits,
            fault,
        });
    proptest::collection::vec(wave, 1..80)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// What a run admitted: each charge as (pinned time, hits), when the root was wiped, and
/// each charge of a region cut off from the root as (pinned time, hits, since when it was
/// cut).
struct Run {
    admitted: Vec<(Micros, u64)>,
    wipes: Vec<Micros>,
    cut_off: Vec<(Micros, u64, Micros)>,
    /// What each wipe erased of the root's counters: (window, units charged), for the wipe's
    /// window and a fixed window's next (charged ahead of it).
    erased: Vec<(Micros, u64)>,
}

/// Runs `waves` on a planet of `sizes` instances per region, global rules answering by
/// `deny` once cut off.
fn run(limit: Limit, sizes: &[usize], waves: &[Wave]) -> Run {
    runtime().block_on(async {
        let mut planet = planet(sizes);
        let mut admitted = Vec::new();
        let mut wipes = Vec::new();
        let mut erased = Vec::new();
        let mut cut_off = Vec::new();
        let mut cut_since: Vec<Option<Micros>> = vec![None; sizes.len()];
        for wave in waves {
            let r = wave.region % sizes.len();
            let i = wave.instance % sizes[r];
            planet.clock.advance(wave.gap);
            let now = planet.clock.now();
            match wave.fault {
                Fault::None => {}
                Fault::Delay(d) => planet.regions[r].link.state.lock().delay = d,
                Fault::Cut => {
                    planet.regions[r].link.state.lock().cut = true;
                    cut_since[r].get_or_insert(now);
                }
                Fault::Heal => {
                    planet.regions[r].link.state.lock().cut = false;
                    cut_since[r] = None;
                }
                Fault::Lose(n) => planet.regions[r].link.state.lock().lose += n,
                Fault::Crash => {
                    let region = &mut planet.regions[r];
                    region.instances[i] =
                        instance(r, i, &region.store, &region.link, &planet.clock);
                }
                Fault::Wipe => {
                    let start = now - now % limit.window;
                    let windows = match limit.algorithm {
                        Algorithm::FixedWindow => vec![start, start + limit.window],
                        Algorithm::SlidingWindow => vec![start],
                        _ => Vec::new(),
                    };
                    for window in windows {
                        let left = root_left_at(&planet, &limit, window).await;
                        erased.push((window / limit.window, limit.requests.saturating_sub(left)));
                    }
                    planet.root.wipe();
                    wipes.push(now);
                }
            }
            settle().await;
            sweep(&planet).await;
            settle().await;
            let instance = &planet.regions[r].instances[i];
            let answers = join_all(
                (0..wave.concurrency).map(|_| hit(instance, &limit, wave.hits, FailureMode::Deny)),
            )
            .await;
            let ok = answers.iter().filter(|a| **a).count() as u64;
            if ok > 0 {
                admitted.push((now, ok * wave.hits as u64));
                if let Some(since) = cut_since[r] {
                    cut_off.push((now, ok * wave.hits as u64, since));
                }
            }
            settle().await;
        }
        Run {
            admitted,
            wipes,
            cut_off,
            erased,
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Never over: per window, the planet admits at most the limit (fixed and sliding
    /// windows), whatever the regions,
    /// instances, delays, cuts, lost replies and crashes. In a window whose root was wiped,
    /// at most the limit plus what it had admitted before the (last) wipe: the erased count,
    /// what a wipe costs exact counting. A region cut off from the root admits nothing once
    /// its pool and blocks have ended (`deny`).
    #[test]
    fn the_planet_never_admits_more_than_the_limit_per_window(
        requests in prop_oneof![1u64..20, 20u64..2000],
        sliding in any::<bool>(),
        sizes in proptest::collection::vec(1usize..4, 1..4),
        waves in waves(),
        // (Short windows too: many window starts, each with blocks and pools ending.)
        window in prop_oneof![Just(WINDOW), Just(4 * SECOND)],
    ) {
        let algorithm = if sliding { Algorithm::SlidingWindow } else { Algorithm::FixedWindow };
        let limit = limit(requests, window, algorithm, requests);
        let Run { admitted, wipes, cut_off, erased: charged } = run(limit, &sizes, &waves);
        prop_assert_eq!(admitted_past_holdings(&cut_off), None);
        let mut per_window = std::collections::BTreeMap::new();
        for &(t, hits) in &admitted {
            *per_window.entry(t / window).or_insert(0u64) += hits;
        }
        for (window, hits) in per_window {
            let last_wipe = wipes.iter().filter(|w| **w / limit.window == window).max();
            let admitted_before: u64 = last_wipe.map_or(0, |wipe| {
                admitted
                    .iter()
                    .filter(|(t, _)| t / limit.window == window && t < wipe)
                    .map(|(_, h)| h)
                    .sum()
            });
            // (The root's count when wiped: units charged ahead of admission, a fixed
            // window's next included.)
            let at_root: u64 = charged.iter().filter(|(w, _)| *w == window).map(|(_, c)| c).sum();
            let erased = admitted_before.max(at_root);
            prop_assert!(
                hits <= requests + erased,
                "{hits} admitted in window {window} of a limit of {requests} ({erased} before a wipe)"
            );
        }
    }
}

/// A charge of a cut-off region past what it held, described: its pool ends a region lease
/// period after its last grant (asked before the cut), a block a lease period after it was
/// taken.
fn admitted_past_holdings(cut_off: &[(Micros, u64, Micros)]) -> Option<String> {
    let tail = (PERIOD + LEASE_PERIOD).as_micros() as Micros;
    cut_off
        .iter()
        .find(|(t, _, since)| *t >= since + tail)
        .map(|(t, hits, since)| {
            format!(
                "{hits} admitted {} ms into a cut, past the pool and block lifetimes",
                (t - since) / 1000
            )
        })
}

/// Rounds of `per_instance` hits on every instance, the clock moving `step` after each and
/// the background asks landing between: what each region admitted.
async fn rounds(
    planet: &Planet,
    limit: &Limit,
    rounds: usize,
    per_instance: usize,
    step: Micros,
) -> Vec<u64> {
    let mut admitted = vec![0; planet.regions.len()];
    for _ in 0..rounds {
        for (r, region) in planet.regions.iter().enumerate() {
            for instance in &region.instances {
                for _ in 0..per_instance {
                    if hit(instance, limit, 1, FailureMode::Deny).await {
                        admitted[r] += 1;
                    }
                }
            }
        }
        settle().await;
        planet.clock.advance(step);
        sweep(planet).await;
        settle().await;
    }
    admitted
}

/// The sweeps, as their background tasks run them: each instance's blocks back to its pool
/// now (in the region), idle pools back to the root across the link (landing when the link
/// delivers).
async fn sweep(planet: &Planet) {
    for region in &planet.regions {
        for instance in &region.instances {
            instance.leased.sweep_now().await;
            let regions = instance.regions.clone();
            tokio::spawn(async move { regions.sweep_now().await });
        }
    }
}

/// Three regions of `sizes` instances, 0, 40 and 75 ms (one way) from the root.
fn planet_afar(sizes: &[usize; 3]) -> Planet {
    let planet = planet(sizes);
    for (r, delay) in [0, 40_000, 75_000].into_iter().enumerate() {
        planet.regions[r].link.state.lock().delay = delay;
    }
    planet
}

/// What the root counter has left (a fixed window's: its counter for the current window).
async fn root_left(planet: &Planet, limit: &Limit) -> u64 {
    let now = planet.clock.now();
    root_left_at(planet, limit, now - now % limit.window).await
}

/// What the root counter has left, a fixed window's for the window starting at `start`.
async fn root_left_at(planet: &Planet, limit: &Limit, start: Micros) -> u64 {
    let mut peek = op(limit, 0, FailureMode::Deny);
    if limit.algorithm == Algorithm::FixedWindow {
        peek.key = peek.key.windowed(start);
    }
    let peek = batch(vec![peek]);
    planet.root.apply(&peek).await.unwrap().decisions[0].remaining
}

#[tokio::test(flavor = "current_thread")]
async fn without_faults_the_planet_admits_the_whole_limit() {
    let planet = planet_afar(&[2, 3, 1]);
    let limit = limit(3000, WINDOW, Algorithm::FixedWindow, 3000);
    // Demand above the limit everywhere for 10 s: the budget goes in about 3.1 s.
    let admitted = rounds(&planet, &limit, 400, 4, 25_000).await;
    let mut total: u64 = admitted.iter().sum();
    // What instances and pools still hold goes back once they are idle, and is admitted
    // by whoever asks next.
    rounds(&planet, &limit, 20, 0, 250_000).await;
    total += rounds(&planet, &limit, 100, 4, 25_000)
        .await
        .iter()
        .sum::<u64>();
    assert_eq!(root_left(&planet, &limit).await, 0);
    assert_eq!(total, 3000, "{admitted:?}");
}
