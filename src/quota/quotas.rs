// Why one long file: the instance's RLQS state and the operations that change it under one
// lock (a report's, the tick's and a reload's are in quotas/).
//! Every RLQS stream and budget of this instance: reports in, assignments out, the tick that
//! moves shares and renews TTLs and claims, reloads, abandons and the drain.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::algorithm::{Algorithm, Limit, Micros, SECOND, token_bucket};
use crate::clock::{Clock, MonotonicClock};
use crate::limiter::Limiter;
use crate::policy::{MAX_LIMIT, Policy};
use crate::store::{ClaimAsk, ClaimGrant, Shared};

use super::bucket::{BucketKey, Quota, Rejected};
use super::budget::{BudgetState, PeerId, StreamId};
use super::metrics::RlqsMetrics;
use super::outbox::{Action, Assigned, Outbox};
use super::share::{Budget, Share};

mod lifecycle;
mod report;
mod view;

pub use view::{BucketView, BudgetView};

/// What an operator sets for the RLQS face.
#[derive(Debug, Clone, PartialEq)]
pub struct RlqsOptions {
    /// The TTL of every assignment, whole seconds (Envoy 1.40 drops fractions); renewed
    /// when half of it is left.
    pub assignment_ttl: Duration,
    /// A bucket without requests for this many report intervals (5 s each) is abandoned.
    pub abandon_after_reports: u32,
    /// Buckets tracked per stream; past it a new bucket is answered DENY_ALL, untracked.
    pub max_buckets_per_stream: usize,
    /// Buckets tracked on all streams together; past it the same.
    pub max_buckets: usize,
    /// Streams open at once; past it a new stream is refused (RESOURCE_EXHAUSTED).
    pub max_streams: usize,
    /// This process among the instances sharing a store (claims are per process).
    pub instance: String,
    /// Reports a stream may send per second (and at once); more are dropped and counted.
    pub reports_per_second: u64,
}

impl Default for RlqsOptions {
    fn default() -> Self {
        Self {
            assignment_ttl: Duration::from_secs(10),
            abandon_after_reports: 12,
            max_buckets_per_stream: 10_000,
            max_buckets: 100_000,
            max_streams: 1_000,
            instance: format!("sluice-{}", std::process::id()),
            reports_per_second: REPORTS_PER_SECOND,
        }
    }
}

/// Reports a stream may send per second (and at once) by default.
pub const REPORTS_PER_SECOND: u64 = 100;

/// What RLQS reads of the rules in force: the policy (swapped whole on reload) and the
/// process-wide shadow mode. The limiter is one.
pub trait Rules: Send + Sync {
    /// The policy in force.
    fn policy(&self) -> Arc<Policy>;
    /// Whether every rule is in shadow mode (`SHADOW_MODE`).
    fn shadow_mode(&self) -> bool;
}

impl Rules for Limiter {
    fn policy(&self) -> Arc<Policy> {
        Limiter::policy(self)
    }

    fn shadow_mode(&self) -> bool {
        self.options().shadow_mode
    }
}

/// How often each budget's claim is renewed, which is also how soon an instance learns of
/// the others' demand (one store call per budget each time).
const CLAIM_REFRESH: f64 = 2.0;

/// The TTL of the assignments sent while draining.
pub const DRAIN_TTL: Duration = Duration::from_secs(2);

/// The RLQS state of this instance.
pub struct Quotas {
    rules: Arc<dyn Rules>,
    /// Where the claims on shared budgets are recorded.
    store: Arc<dyn Shared>,
    options: RlqsOptions,
    metrics: Option<Arc<RlqsMetrics>>,
    /// The clock every time of the RLQS state is read from, and its reading at the start.
    clock: Arc<dyn Clock>,
    origin: Micros,
    ids: AtomicU64,
    state: Mutex<State>,
}

struct State {
    policy: Arc<Policy>,
    streams: HashMap<StreamId, StreamState>,
    budgets: HashMap<String, Entry>,
    buckets: usize,
    draining: bool,
}

/// A budget and what names it.
struct Entry {
    state: BudgetState,
    domain: String,
    rule: String,
    shadow: bool,
    /// A claim was answered at least once.
    claimed: bool,
    claim_due: f64,
}

impl Entry {
    /// A budget first seen at `now`, not claimed yet.
    fn new(budget: Budget, domain: &str, rule: &str, shadow: bool, now: f64) -> Self {
        Self {
            state: BudgetState::new(budget, Share::default(), now, false),
            domain: domain.to_owned(),
            rule: rule.to_owned(),
            shadow,
            claimed: false,
            claim_due: now,
        }
    }
}

struct StreamState {
    outbox: Arc<Outbox>,
    /// Where the stream came from: its peer's streams count as one Envoy.
    peer: PeerId,
    /// By [`bucket_key`] (the budget's key too, when divided).
    buckets: HashMap<String, Tracked>,
    /// The report rate limit's token bucket (none before the first report).
    reports: Option<token_bucket::Bucket>,
}

/// A bucket on a stream.
struct Tracked {
    domain: String,
    bucket: BucketKey,
    /// What it gets; when divided, the bucket's key is its budget's.
    quota: Quota,
    assigned: Option<Assigned>,
    ttl_until: f64,
    /// When it last had requests (or was first seen).
    active_at: f64,
}

impl Quotas {
    /// The RLQS state over `rules` (the limiter's), claiming budgets in `store`, on a
    /// monotonic clock.
    pub fn new(rules: Arc<dyn Rules>, store: Arc<dyn Shared>, options: RlqsOptions) -> Self {
        let policy = rules.policy();
        let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
        Self {
            rules,
            store,
            options,
            metrics: None,
            origin: clock.now(),
            clock,
            ids: AtomicU64::new(1),
            state: Mutex::new(State {
                policy,
                streams: HashMap::new(),
                budgets: HashMap::new(),
                buckets: 0,
                draining: false,
            }),
        }
    }

    /// Reads the time from `clock` (tests move a manual one).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.origin = clock.now();
        self.clock = clock;
        self
    }

    /// Counts what happens in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<RlqsMetrics>) -> Self {
        let cap = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        metrics.max_streams.set(cap(self.options.max_streams));
        metrics.max_buckets.set(cap(self.options.max_buckets));
        self.metrics = Some(metrics);
        self
    }

    /// Counts a report that ended its stream as the client's fault, of `kind`
    /// (`invalid_request`, `request_too_large`).
    pub fn refused_report(&self, kind: &str) {
        if let Some(m) = &self.metrics {
            m.refused_reports.with_label_values(&[kind]).inc();
        }
    }

    /// The options in force.
    pub fn options(&self) -> &RlqsOptions {
        &self.options
    }

    /// Seconds on this instance's clock since the start, which every time in the RLQS
    /// state is on.
    pub fn now(&self) -> f64 {
        self.clock.now().saturating_sub(self.origin) as f64 / SECOND as f64
    }

    /// The report rate limit of a stream, as a token bucket of the algorithm's.
    fn report_limit(&self) -> Limit {
        let rate = self.options.reports_per_second.clamp(1, MAX_LIMIT);
        Limit::new(rate, SECOND, Algorithm::TokenBucket)
    }

    fn ttl(&self) -> u64 {
        self.options.assignment_ttl.as_secs().max(1)
    }

    /// A new stream from `peer`, or why not.
    pub fn open(&self, peer: PeerId) -> Result<(StreamId, Arc<Outbox>), tonic::Status> {
        let mut state = self.state.lock();
        let refused = |reason: &str| {
            if let Some(m) = &self.metrics {
                m.refused_streams.with_label_values(&[reason]).inc();
            }
        };
        if state.draining {
            refused("draining");
            return Err(tonic::Status::unavailable("shutting down"));
        }
        if state.streams.len() >= self.options.max_streams {
            refused("over_cap");
            return Err(tonic::Status::resource_exhausted(format!(
                "{} RLQS streams are open, the most this instance takes (RLQS_MAX_STREAMS)",
                self.options.max_streams
            )));
        }
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let outbox = Arc::new(Outbox::default());
        state.streams.insert(
            id,
            StreamState {
                outbox: outbox.clone(),
                peer,
                buckets: HashMap::new(),
                reports: None,
            },
        );
        if let Some(m) = &self.metrics {
            m.streams.set(state.streams.len() as i64);
        }
        Ok((id, outbox))
    }

    /// The stream ended: its shares stay counted until their TTL.
    pub fn close(&self, stream: StreamId) {
        let now = self.now();
        let mut state = self.state.lock();
        let Some(gone) = state.streams.remove(&stream) else {
            return;
        };
        gone.outbox.close();
        state.buckets -= gone.buckets.len();
        for (key, tracked) in gone.buckets {
            if tracked.quota.is_divided() {
                leave(&mut state.budgets, &key, stream, tracked.ttl_until.max(now));
            }
        }
        if let Some(m) = &self.metrics {
            m.streams.set(state.streams.len() as i64);
            m.buckets.set(state.buckets as i64);
        }
    }

    /// Sends `assigned` for `tracked` on `outbox`, with a TTL of `ttl` seconds from `now`.
    fn send(&self, outbox: &Outbox, tracked: &mut Tracked, assigned: Assigned, ttl: u64, now: f64) {
        tracked.assigned = Some(assigned);
        tracked.ttl_until = now + ttl as f64;
        outbox.push(tracked.bucket.clone(), Action::Assign(assigned, ttl));
        self.count_assignment(assigned);
    }

    /// Claims for `keys` (those not claimed yet), then steps them and sends what changed;
    /// answers how many actions that queued.
    async fn claim_and_step(&self, keys: Vec<String>, now: f64) -> usize {
        let asks: Vec<ClaimAsk> = {
            let state = self.state.lock();
            keys.iter()
                .filter_map(|k| {
                    state
                        .budgets
                        .get(k)
                        .filter(|e| !e.claimed)
                        .map(|e| self.ask(k, e))
                })
                .collect()
        };
        let grants = self.claims(&asks).await;
        let mut state = self.state.lock();
        apply_grants(&mut state, &asks, grants, now);
        keys.iter()
            .map(|key| self.step_budget(&mut state, key, now))
            .sum()
    }

    /// The claim this instance asks for `entry`: what it holds, or more for its demand.
    fn ask(&self, key: &str, entry: &Entry) -> ClaimAsk {
        let total = entry.state.budget.rate;
        let held = entry.state.held().rate;
        ClaimAsk {
            key: key.to_owned(),
            instance: self.options.instance.clone(),
            total,
            want: held.max(entry.state.fair_want(total)),
            demand: entry.state.demand(),
            peers: entry.state.peers() as u64,
            ttl: self.claim_ttl(),
        }
    }

    /// How long a claim lives: past the TTL of every assignment sent under it.
    fn claim_ttl(&self) -> Duration {
        self.options.assignment_ttl + Duration::from_secs(5)
    }

    async fn claims(&self, asks: &[ClaimAsk]) -> Option<Vec<ClaimGrant>> {
        if asks.is_empty() {
            return Some(Vec::new());
        }
        match self.store.claim(asks).await {
            Ok(grants) if grants.len() == asks.len() => Some(grants),
            Ok(_) | Err(_) => {
                if let Some(m) = &self.metrics {
                    m.claim_errors.inc();
                }
                None
            }
        }
    }

    /// Steps one budget and queues what changed; answers how many actions.
    fn step_budget(&self, state: &mut State, key: &str, now: f64) -> usize {
        let State {
            streams, budgets, ..
        } = state;
        let Some(entry) = budgets.get_mut(key) else {
            return 0;
        };
        if entry.shadow || !entry.claimed {
            return 0;
        }
        let mut queued = 0;
        let drained = |s: StreamId| streams.get(&s).and_then(|s| s.outbox.drained_at());
        let changes = entry.state.step(now, &drained);
        let window = entry.state.budget.window;
        let ttl = self.ttl();
        for (stream, share) in changes {
            let Some(s) = streams.get_mut(&stream) else {
                continue;
            };
            let Some(tracked) = s.buckets.get_mut(key) else {
                continue;
            };
            let assigned = encodable(tracked.assigned, share, window);
            self.send(&s.outbox, tracked, assigned, ttl, now);
            queued += 1;
        }
        queued
    }

    /// Once a second: reloads, claims, shares, TTLs, abandons, metrics.
    pub async fn tick(&self) {
        let now = self.now();
        let asks: Vec<ClaimAsk> = {
            let mut state = self.state.lock();
            if state.draining {
                return;
            }
            self.follow_policy(&mut state, now);
            state
                .budgets
                .iter()
                .filter(|(_, e)| !e.shadow)
                .filter(|(_, e)| {
                    let ask_rate = e
                        .state
                        .held()
                        .rate
                        .max(e.state.fair_want(e.state.budget.rate));
                    !e.claimed || now >= e.claim_due || ask_rate != e.state.claim().rate
                })
                .map(|(k, e)| self.ask(k, e))
                .collect()
        };
        let grants = self.claims(&asks).await;
        let mut state = self.state.lock();
        apply_grants(&mut state, &asks, grants, now);
        let keys: Vec<String> = state.budgets.keys().cloned().collect();
        for key in &keys {
            let _ = self.step_budget(&mut state, key, now);
        }
        self.renew_and_abandon(&mut state, now);
        state
            .budgets
            .retain(|_, e| e.state.streams() > 0 || e.state.held().rate > 0);
        self.observe(&state);
    }

    /// Counts `n` usages of one report past the stream's bucket cap, skipped unread.
    pub fn rejected_past_stream_cap(&self, n: usize) {
        if n > 0
            && let Some(m) = &self.metrics
        {
            m.rejected
                .with_label_values(&["over_stream_cap"])
                .inc_by(n as u64);
        }
    }

    fn rejected(&self, reason: &str) {
        if let Some(m) = &self.metrics {
            m.rejected.with_label_values(&[reason]).inc();
        }
    }

    fn count_assignment(&self, assigned: Assigned) {
        if let Some(m) = &self.metrics {
            m.assignments.with_label_values(&[assigned.label()]).inc();
        }
    }
}

/// What one report did, for its span.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReportSummary {
    /// Buckets it listed.
    pub buckets: usize,
    /// Of those, new on the stream (and tracked).
    pub new_buckets: usize,
    /// Actions it queued at once.
    pub actions: usize,
    /// Dropped: the stream sent reports faster than its rate.
    pub dropped: bool,
}

/// One bucket of a report, checked.
pub struct Usage {
    /// The bucket id, or why it is refused.
    pub bucket: Result<BucketKey, Rejected>,
    /// Requests allowed since the last report.
    pub allowed: u64,
    /// Requests denied since the last report.
    pub denied: u64,
    /// `time_elapsed` is 0 (or unset): Envoy's immediate report of a bucket it has just seen,
    /// where a report after a reconnect says 1 s or more.
    pub first_sight: bool,
}

/// The blanket rule a quota is answered with at once: all but a divided quota outside
/// shadow mode, whose token bucket comes from its budget.
fn blanket(quota: &Quota) -> Option<Assigned> {
    match quota {
        Quota::AllowAll { .. } | Quota::Divided { shadow: true, .. } => Some(Assigned::AllowAll),
        Quota::DenyAll { .. } => Some(Assigned::DenyAll),
        Quota::Divided { .. } => None,
    }
}

/// A bucket's key on a stream, and its budget's when it is divided: the domain and the
/// canonical bucket id.
fn bucket_key(domain: &str, key: &BucketKey) -> String {
    format!("{domain}\n{}", key.as_str())
}

fn leave(budgets: &mut HashMap<String, Entry>, key: &str, stream: StreamId, until: f64) {
    if let Some(entry) = budgets.get_mut(key) {
        entry.state.leave(stream, until);
    }
}

/// The claims answered: each budget's part for this instance (its first tells whether it
/// may hand out its burst at once).
fn apply_grants(state: &mut State, asks: &[ClaimAsk], grants: Option<Vec<ClaimGrant>>, now: f64) {
    let Some(grants) = grants else { return };
    for (ask, grant) in asks.iter().zip(grants) {
        let Some(entry) = state.budgets.get_mut(&ask.key) else {
            continue;
        };
        let budget = entry.state.budget;
        let claim = budget.share_of(grant.granted.min(budget.rate));
        if entry.claimed {
            entry.state.set_claim(claim, budget);
        } else {
            entry.state.first_claim(claim, grant.others_hold == 0);
            entry.claimed = true;
        }
        entry.state.others_demand = grant.others_demand;
        entry.state.others = grant.others;
        entry.state.others_peers = grant.others_peers;
        entry.claim_due = now + CLAIM_REFRESH;
    }
}

/// What is sent for `share` in a budget of `window` seconds. Envoy 1.40 keeps a token
/// bucket whose capacity and fill are unchanged even when the fill interval changed, so a
/// new window with the same numbers is sent one token lower (lowering is always safe).
fn encodable(before: Option<Assigned>, share: Share, window: u64) -> Assigned {
    if share.is_empty() {
        return Assigned::DenyAll;
    }
    let mut share = share;
    if let Some(Assigned::Bucket(old, old_window)) = before
        && old_window != window
        && old == share
    {
        if share.burst > 1 {
            share.burst -= 1;
        } else if share.rate > 1 {
            share.rate -= 1;
        } else {
            return Assigned::DenyAll;
        }
    }
    Assigned::Bucket(share, window)
}

#[cfg(test)]
mod tests;
