//! Rate limit algorithms as pure functions of `(state, limit, now, hits)`.
//!
//! Nothing here reads a clock, takes a lock or does I/O: the stores call [`decide`] under
//! their own atomicity (a shard lock in memory, a Lua script in Redis that mirrors each file
//! line by line) and persist the returned state. Every algorithm lives in its own file;
//! [`Algorithm`] selects one.

pub mod concurrency;
pub mod fixed_window;
pub mod sliding_window;
pub mod token_bucket;

/// Time in integer microseconds since the Unix epoch (or a duration in microseconds).
///
/// Integer microseconds are what Redis `TIME` gives, so every store computes with the same
/// resolution and no floating point drift.
pub type Micros = u64;

/// One second in [`Micros`].
pub const SECOND: Micros = 1_000_000;

/// Which algorithm a limit is enforced with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    /// Windows aligned to the Unix epoch; one count per window (the reference behaviour).
    FixedWindow,
    /// Weighted two-window counter: no boundary burst.
    SlidingWindow,
    /// GCRA token bucket: a burst size and a sustained rate.
    TokenBucket,
    /// Requests in flight: hits acquire, refunds release.
    Concurrency,
}

impl Algorithm {
    /// Every algorithm.
    pub const ALL: [Algorithm; 4] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::Concurrency,
    ];

    /// The name used in config files and in `/rlconfig`.
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::Concurrency => "concurrency",
        }
    }

    /// A short, stable tag used inside counter keys so that two algorithms never share state.
    pub fn key_tag(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fw",
            Algorithm::SlidingWindow => "sw",
            Algorithm::TokenBucket => "tb",
            Algorithm::Concurrency => "cc",
        }
    }

    // What the rest of the crate may ask of an algorithm. Each is an exhaustive `match`, so
    // that a new algorithm is a compile error at every fact it must decide.

    /// Counts in windows of time aligned to the epoch: a count ends with its window.
    pub fn windowed(self) -> bool {
        match self {
            Algorithm::FixedWindow | Algorithm::SlidingWindow => true,
            Algorithm::TokenBucket | Algorithm::Concurrency => false,
        }
    }

    /// Refills continuously: capacity comes back a token at a time, and a limit has a
    /// `burst` of its own beside its rate.
    pub fn refills(self) -> bool {
        match self {
            Algorithm::TokenBucket => true,
            Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::Concurrency => false,
        }
    }

    /// Counts requests in flight, not a rate: hits acquire, refunds release, and the
    /// window is only a safety TTL.
    pub fn in_flight(self) -> bool {
        match self {
            Algorithm::Concurrency => true,
            Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::TokenBucket => false,
        }
    }

    /// Its units may be leased in blocks and spent in memory (a release would not reach
    /// the shared count).
    pub fn leasable(self) -> bool {
        !self.in_flight()
    }

    /// A refusal lasts until the counter's reset, so it may be remembered (the over-limit
    /// cache); a count in flight can fall at any release.
    pub fn cacheable(self) -> bool {
        !self.in_flight()
    }

    /// Its rate can be divided among Envoys as token buckets (RLQS).
    pub fn divisible(self) -> bool {
        !self.in_flight()
    }

    /// It may be a usage budget (`overdraft: true`): requests in flight are not spent.
    pub fn takes_overdraft(self) -> bool {
        !self.in_flight()
    }

    /// The reference (envoyproxy/ratelimit) has the same counter, under its own key layout.
    pub fn in_reference_layout(self) -> bool {
        match self {
            Algorithm::FixedWindow => true,
            Algorithm::SlidingWindow | Algorithm::TokenBucket | Algorithm::Concurrency => false,
        }
    }
}

/// The numbers an algorithm needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Limit {
    /// Hits allowed per window (token bucket: the sustained rate per window; concurrency:
    /// requests in flight); 0 means every request is over the limit.
    pub requests: u64,
    /// Window length in microseconds; never 0 (concurrency: the safety TTL of a counter).
    pub window: Micros,
    /// The algorithm that enforces this limit.
    pub algorithm: Algorithm,
    /// Token bucket capacity (equal to `requests` for the other algorithms).
    pub burst: u64,
    /// A usage budget (`overdraft: true`): every charge is recorded, also one that crosses
    /// the limit or is refused, and the budget is spent (checks refused too) from the limit
    /// on. A window keeps the overdraft until it ages out; a token bucket goes into debt
    /// and refills out of it. Never on concurrency limits.
    pub overdraft: bool,
}

impl Limit {
    /// A limit whose burst equals its rate.
    pub const fn new(requests: u64, window: Micros, algorithm: Algorithm) -> Self {
        Self {
            requests,
            window,
            algorithm,
            burst: requests,
            overdraft: false,
        }
    }

    /// This limit as a usage budget (see [`Limit::overdraft`]).
    pub const fn with_overdraft(self, overdraft: bool) -> Self {
        Self { overdraft, ..self }
    }

    /// The most hits that can pass at once: a token bucket's burst, the others' limit.
    pub const fn capacity(&self) -> u64 {
        self.burst
    }

    /// The hits `hits` must fit with to be allowed: themselves, except that a usage budget
    /// is spent at its limit, so a check (0 hits) there needs room for one.
    pub(crate) fn room_for(&self, hits: u64) -> u64 {
        if self.overdraft { hits.max(1) } else { hits }
    }

    /// Whether a refused charge of `hits` is recorded anyway (a usage budget's).
    pub(crate) fn records_refused(&self, hits: i64) -> bool {
        self.overdraft && hits > 0
    }
}

impl Limit {
    /// Time from `now` to the end of the epoch-aligned window containing it.
    pub fn window_left(&self, now: Micros) -> Micros {
        self.window - now % self.window
    }
}

/// The answer for one counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Whether the hits fit within the limit.
    pub allowed: bool,
    /// Hits still available after this decision (after charging, when allowed).
    pub remaining: u64,
    /// Time until the counter is fully restored.
    pub reset_after: Micros,
    /// When rejected: the earliest time after which the same hits could pass. `None` when
    /// allowed, or when the hits can never pass (more hits than the limit).
    pub retry_after: Option<Micros>,
    /// A usage budget's overdraft when rejected: the units used past its limit (a window's
    /// count past it, a token bucket's debt in tokens); 0 otherwise.
    pub overdraft: u64,
}

/// The stored state of one counter, whatever its algorithm.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum State {
    /// See [`fixed_window::Window`].
    FixedWindow(fixed_window::Window),
    /// See [`sliding_window::Windows`].
    SlidingWindow(sliding_window::Windows),
    /// See [`token_bucket::Bucket`].
    TokenBucket(token_bucket::Bucket),
    /// See [`concurrency::InFlight`].
    Concurrency(concurrency::InFlight),
}

/// What [`decide`] returns: the decision, and the state to store if the hits are charged.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Transition {
    /// The answer for this counter.
    pub decision: Decision,
    /// The state after charging the hits (equal to the old state when nothing changes).
    pub next: State,
    /// Instant after which `next` is equivalent to no state at all (the key's TTL).
    pub expires_at: Micros,
}

/// Applies `hits` (negative: a refund) to a counter of `limit` at time `now`.
///
/// `state` is the stored state, `None` when the counter is new or expired. A state of
/// another algorithm than `limit.algorithm` is treated as absent.
pub fn decide(state: Option<&State>, limit: &Limit, now: Micros, hits: i64) -> Transition {
    match limit.algorithm {
        Algorithm::FixedWindow => step::<fixed_window::Window>(state, limit, now, hits),
        Algorithm::SlidingWindow => step::<sliding_window::Windows>(state, limit, now, hits),
        Algorithm::TokenBucket => step::<token_bucket::Bucket>(state, limit, now, hits),
        Algorithm::Concurrency => step::<concurrency::InFlight>(state, limit, now, hits),
    }
}

/// One algorithm's state as [`decide`] drives it: its decision, its place in [`State`], and
/// when it becomes equal to no state.
trait Counter: Sized {
    fn decide(state: Option<&Self>, limit: &Limit, now: Micros, hits: i64) -> (Decision, Self);
    fn of(state: &State) -> Option<&Self>;
    fn into_state(self) -> State;
    fn expires_at(&self, limit: &Limit, now: Micros) -> Micros;
}

/// [`decide`] for the algorithm whose state is `C` (a stored state of another is absent).
fn step<C: Counter>(state: Option<&State>, limit: &Limit, now: Micros, hits: i64) -> Transition {
    let (decision, next) = C::decide(state.and_then(C::of), limit, now, hits);
    Transition {
        decision,
        expires_at: next.expires_at(limit, now),
        next: next.into_state(),
    }
}

/// [`Counter`] for `$module`'s state `$state`, held in `State::$variant`, expiring at
/// `$expires` (of the state, the limit and now).
macro_rules! counter {
    ($module:ident: $state:ident => $variant:ident, |$s:ident, $limit:ident, $now:ident| $expires:expr) => {
        impl Counter for $module::$state {
            fn decide(
                state: Option<&Self>,
                limit: &Limit,
                now: Micros,
                hits: i64,
            ) -> (Decision, Self) {
                $module::decide(state, limit, now, hits)
            }
            fn of(state: &State) -> Option<&Self> {
                match state {
                    State::$variant(s) => Some(s),
                    _ => None,
                }
            }
            fn into_state(self) -> State {
                State::$variant(self)
            }
            fn expires_at(&self, $limit: &Limit, $now: Micros) -> Micros {
                let $s = self;
                $expires
            }
        }
    };
}

counter!(fixed_window: Window => FixedWindow, |w, limit, _now| w.end(limit));
counter!(sliding_window: Windows => SlidingWindow, |w, limit, _now| w.expires_at(limit));
counter!(token_bucket: Bucket => TokenBucket, |b, _limit, _now| b.expires_at());
counter!(concurrency: InFlight => Concurrency, |_c, limit, now| now.saturating_add(limit.window));

/// Whether an operation changes its counter even when refused, and even when its request
/// is refused as a whole: refunds always do, and so do concurrency acquisitions, because
/// every acquisition is released later whether it was admitted or not (Envoy sends its
/// stream-done release for refused requests too); counting only admitted ones would let
/// those releases hand out capacity that was never taken. So do a usage budget's charges:
/// they report usage that already happened (and an estimate Envoy returns at stream done
/// whether or not it was admitted).
pub fn applies_unconditionally(limit: &Limit, hits: i64) -> bool {
    hits < 0
        || (hits > 0 && limit.algorithm == Algorithm::Concurrency)
        || limit.records_refused(hits)
}

/// Whether `hits` can ever pass `limit` (a request larger than the limit never can).
fn can_ever_pass(limit: u64, hits: u64) -> bool {
    limit > 0 && hits <= limit
}

/// What an instance asks of a shared counter for a lease (see [`lease`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ask {
    /// The most units it would take: what it expects to use in one lease period.
    pub want: u64,
    /// The fewest units worth taking: the hits of the request waiting for them. Fewer left
    /// than that, and nothing is taken.
    pub need: u64,
    /// Instances seen taking leases recently (at least 1): a block is at most the remaining
    /// budget divided by twice this number, so that every instance finds some left.
    pub instances: u64,
}

/// Takes a block of units from a counter at once: a charge of many hits, of at most what is
/// left. Returns the units granted (0: refused, nothing charged) and the transition of
/// charging them, whose decision is the counter's answer to `ask.need` hits.
///
/// The block is `min(want, max(need, ⌊left / (2·instances)⌋))`, where `left` is what the
/// counter would still admit: near the limit blocks shrink to the request's own hits, so
/// leasing decides exactly there. Concurrency counters are never leased (their releases must
/// reach the shared count); asked anyway, a lease of one is an ordinary charge of `need`.
pub fn lease(state: Option<&State>, limit: &Limit, now: Micros, ask: Ask) -> (u64, Transition) {
    let need = ask.need.max(1);
    let peek = decide(state, limit, now, 0).decision;
    let left = if peek.allowed { peek.remaining } else { 0 };
    if limit.algorithm == Algorithm::Concurrency || left < need {
        let t = decide(state, limit, now, need as i64);
        return (if t.decision.allowed { need } else { 0 }, t);
    }
    let share = left / (2 * ask.instances.max(1));
    let block = ask.want.min(share).max(need).min(left);
    let t = decide(state, limit, now, block as i64);
    if t.decision.allowed || block == need {
        return (if t.decision.allowed { block } else { 0 }, t);
    }
    // `remaining` is rounded down, so this is rare: a fractional estimate that a whole block
    // just misses. The request's own hits decide then.
    let t = decide(state, limit, now, need as i64);
    (if t.decision.allowed { need } else { 0 }, t)
}

#[cfg(test)]
mod tests;
