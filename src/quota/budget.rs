// Why one long file: the three rules of the bound act on the same holdings in one step.
//! One budget on this instance: what each Envoy holds of it, and the step that moves the
//! shares toward demand without ever handing out more than the budget. Time is seconds on
//! the instance's monotonic clock, passed in.
//!
//! The guarantee rests on three rules (docs/configuration/rlqs.md states the bound):
//!
//! 1. **Lower before raise.** What an Envoy holds is counted at its old share until the
//!    lower one has been delivered and [`SETTLE`] has passed; only what is not counted can
//!    be handed out. The rates and the capacities counted never add up past the budget
//!    (this instance's claim on it, with several instances).
//! 2. **Count what a replacement bucket starts with.** Envoy 1.40 starts a replacement token
//!    bucket at the old one's fill fraction, and a new one full, so raising a capacity hands
//!    out tokens at once. Each holding keeps an upper bound of the tokens its bucket has
//!    (its capacity, refilled at its rate, less what its reports say it admitted), and
//!    the tokens a raise would hand out must be covered by the budget's reserve: a lower
//!    bound of the tokens the fleet could still admit within the bound and does not hold.
//! 3. **Holdings outlive streams.** A closed stream's shares stay counted until the TTL of
//!    what its Envoy was last sent (Envoy keeps enforcing it until then).
//!
//! One exception, bounded: **a newcomer's floor in advance.** An Envoy new to a budget that
//! others hold would otherwise wait, denying its traffic, until the lowerings that make room
//! for it have settled (a second on one instance, up to a claim renewal and more across
//! replicas). Its first assignment is its floor at once, ahead of those lowerings: for one
//! newcomer at a time per budget, the fleet may pass the bound by that floor's capacity and
//! its rate until the room is made (at most [`ADVANCE_LIMIT`]).
//!
//! The division is by peer, not by stream: the streams of one peer (one client address)
//! count as one Envoy, whose demand is at most the budget, so a client that opens many
//! streams gets what one Envoy would, split among its streams.

use std::collections::HashMap;

use super::share::{Budget, Share, divide, floor};

/// A stream's number on this instance.
pub type StreamId = u64;

/// The peer a stream came from: its client's address, as an IPv6 address (IPv4 mapped) in
/// a number; 0 for a unix socket.
pub type PeerId = u128;

/// How long after its delivery a lowered share is still counted at its old value: the time
/// the message may take to reach Envoy and be applied.
pub const SETTLE: f64 = 1.0;

/// How much the refill of a bucket between two reports is over-estimated, in seconds: the
/// jitter of report times against the instance's clock.
const REPORT_JITTER: f64 = 0.5;

/// How long a newcomer's floor in advance may stay uncovered (the lowerings that make room
/// for it not settled, or this instance's claim not grown to cover it): after this it is a
/// share like any other, lowered to its target.
pub const ADVANCE_LIMIT: f64 = 15.0;

/// The interval Envoy 1.40 reports at, whatever its config says (a first report's demand is
/// counted over it).
pub const REPORT_INTERVAL: f64 = 5.0;

/// What one Envoy (one stream) holds of the budget.
#[derive(Debug, Clone)]
pub struct Holding {
    /// The peer of the stream.
    peer: PeerId,
    /// What the Envoy was last sent: `None` before the first assignment; an empty share is
    /// DENY_ALL.
    sent: Option<Share>,
    /// What the budget counts: `sent`, or more while a lowering settles.
    counted: Share,
    /// A lowering queued at this time is not counted yet.
    lowered_at: Option<f64>,
    /// Upper bound of the tokens in the Envoy's bucket at `tokens_at`, not capped since the
    /// last report (a cap in between would hide admissions the next report subtracts).
    tokens: f64,
    tokens_at: f64,
    /// The least factor by which an admission since the last report reaches `tokens`: each
    /// replacement since scaled the tokens of before it by its capacity ratio (a new bucket
    /// by 0: it starts full whatever was admitted).
    discount: f64,
    /// Requests per window (allowed + denied), smoothed; `None` before the first report.
    demand: Option<f64>,
    last_report: Option<f64>,
    /// Its first report was not a first sight of the bucket (`time_elapsed` > 0): an Envoy
    /// that had the bucket before, reconnected on a new stream.
    reconnected: bool,
    /// It holds its floor in advance, not lowered while the advance is open.
    advanced: bool,
}

/// What changed in one [`BudgetState::step`]: the shares to send, per stream.
pub type Changes = Vec<(StreamId, Share)>;

/// A budget on this instance.
#[derive(Debug)]
pub struct BudgetState {
    /// The whole fleet's budget.
    pub budget: Budget,
    /// This instance's part of it (the whole budget with one instance).
    claim: Share,
    /// Tokens that can be handed out at once without passing the bound (see rule 2).
    reserve: f64,
    /// When a newcomer was given its floor in advance, while the room for it is not made.
    advance: Option<f64>,
    last_step: f64,
    holdings: HashMap<StreamId, Holding>,
    /// Shares of closed streams, counted until their TTL ends.
    ghosts: Vec<(Share, f64)>,
    /// The tokens a shadow-mode budget would have now (what it would have denied is counted).
    shadow_tokens: (f64, f64),
    /// The other instances' demand (requests per window), number and peers, from the last
    /// claim.
    pub others_demand: f64,
    pub others: u64,
    pub others_peers: u64,
}

impl BudgetState {
    /// A budget first seen at `now`, with `claim` of it for this instance; `fresh`: nobody
    /// else holds any of it, so its whole burst may be handed out at once.
    pub fn new(budget: Budget, claim: Share, now: f64, fresh: bool) -> Self {
        Self {
            budget,
            claim,
            reserve: if fresh { claim.burst as f64 } else { 0.0 },
            advance: None,
            last_step: now,
            holdings: HashMap::new(),
            ghosts: Vec::new(),
            shadow_tokens: (budget.burst as f64, now),
            others_demand: 0.0,
            others: 0,
            others_peers: 0,
        }
    }

    /// The first claim answered: `claim` of the budget; `fresh`: nobody else holds any of it,
    /// so its whole burst may be handed out at once (a fresh budget has admitted nothing).
    pub fn first_claim(&mut self, claim: Share, fresh: bool) {
        self.claim = claim;
        self.reserve = if fresh { claim.burst as f64 } else { 0.0 };
    }

    /// What this instance should hold of `total`: its peers' max-min fair part among every
    /// peer of the fleet, the other instances' peers counted as equal (each other instance
    /// as one peer at least); what nobody asks for is spread by the number of peers.
    pub fn fair_want(&self, total: u64) -> u64 {
        if self.others == 0 {
            return total;
        }
        let mine: Vec<f64> = self.peer_demands().into_iter().map(|(_, d)| d).collect();
        let others = self.others_peers.max(self.others) as f64;
        let part = fair_part(total as f64, &mine, self.others_demand.max(0.0), others);
        (part.round() as u64).min(total)
    }

    /// Each peer's demand (its streams' together, at most the budget), by peer.
    pub fn peer_demands(&self) -> Vec<(PeerId, f64)> {
        let mut streams: Vec<(PeerId, f64)> = self
            .holdings
            .values()
            .map(|h| (h.peer, h.demand.unwrap_or(0.0)))
            .collect();
        streams.sort_unstable_by_key(|(p, _)| *p);
        let mut peers: Vec<(PeerId, f64)> = Vec::with_capacity(streams.len());
        for (peer, demand) in streams {
            match peers.last_mut() {
                Some((p, d)) if *p == peer => *d += demand,
                _ => peers.push((peer, demand)),
            }
        }
        let cap = self.budget.rate as f64;
        peers.iter_mut().for_each(|(_, d)| *d = d.min(cap));
        peers
    }

    /// The peers holding (or about to hold) a share.
    pub fn peers(&self) -> usize {
        self.peer_demands().len()
    }

    /// Number of streams holding (or about to hold) a share.
    pub fn streams(&self) -> usize {
        self.holdings.len()
    }

    /// This instance's part of the budget.
    pub fn claim(&self) -> Share {
        self.claim
    }

    /// A new part of the budget for this instance (a claim answered, a reload). More than
    /// before adds nothing to the reserve: the new part starts as if spent.
    pub fn set_claim(&mut self, claim: Share, budget: Budget) {
        self.claim = claim;
        self.budget = budget;
    }

    /// What this instance holds: every share counted, the closed streams' included.
    pub fn held(&self) -> Share {
        let mut sum = Share::default();
        for h in self.holdings.values() {
            sum.rate += h.counted.rate;
            sum.burst += h.counted.burst;
        }
        for (share, _) in &self.ghosts {
            sum.rate += share.rate;
            sum.burst += share.burst;
        }
        sum
    }

    /// The demand of this instance's Envoys, in requests per window: each peer's at most
    /// the budget.
    pub fn demand(&self) -> f64 {
        self.peer_demands().into_iter().map(|(_, d)| d).sum()
    }

    /// Each stream's last share (`None` before its first) and demand, by stream.
    pub fn shares(&self) -> Vec<(StreamId, Option<Share>, f64)> {
        let mut all: Vec<_> = self
            .holdings
            .iter()
            .map(|(s, h)| (*s, h.sent, h.demand.unwrap_or(0.0)))
            .collect();
        all.sort_by_key(|(s, ..)| *s);
        all
    }

    /// The share last sent to `stream`, if any.
    pub fn sent(&self, stream: StreamId) -> Option<Share> {
        self.holdings.get(&stream).and_then(|h| h.sent)
    }

    /// `stream` reports for this budget (a new one is added): `allowed` and `denied` since
    /// its last report, received at `now`; `first_sight`: Envoy's immediate report of a
    /// bucket it has just seen (`time_elapsed` 0), not a report after a reconnect.
    pub fn report(&mut self, stream: StreamId, allowed: u64, denied: u64, now: f64) {
        self.report_seen((stream, PeerId::from(stream)), allowed, denied, now, true);
    }

    /// [`BudgetState::report`], saying whether it is the Envoy's first sight of the bucket.
    pub fn report_seen(
        &mut self,
        (stream, peer): (StreamId, PeerId),
        allowed: u64,
        denied: u64,
        now: f64,
        first_sight: bool,
    ) {
        let window = self.budget.window as f64;
        let h = self.holdings.entry(stream).or_insert_with(|| Holding {
            peer,
            sent: None,
            counted: Share::default(),
            lowered_at: None,
            tokens: 0.0,
            tokens_at: now,
            discount: 0.0,
            demand: None,
            last_report: None,
            reconnected: !first_sight,
            advanced: false,
        });
        let requests = allowed as f64 + denied as f64;
        let rate = match h.last_report {
            Some(at) => requests / (now - at).max(1.0) * window,
            // Envoy's immediate report of a bucket it has just seen counts one request and
            // says nothing of a rate: a newcomer counts as busy until its first real report
            // (which corrects it at once), so that its share, and its instance's claim, do
            // not wait a report interval to grow.
            None if first_sight => self.budget.rate as f64,
            None => requests / REPORT_INTERVAL * window,
        };
        // No Envoy can use more than the whole budget: demand past it says nothing more (and
        // a flood's denials would take long to fade). A rise counts at once, a fall mostly.
        let rate = rate.min(self.budget.rate as f64);
        h.demand = Some(match h.demand {
            Some(old) if rate < old => 0.25 * old + 0.75 * rate,
            _ => rate,
        });
        h.last_report = Some(now);
        if let Some(share) = h.sent.filter(|s| !s.is_empty()) {
            let per_second = self.budget.per_second(share.rate);
            let projected = h.tokens + per_second * (now - h.tokens_at + REPORT_JITTER);
            h.tokens = (projected - h.discount * allowed as f64).clamp(0.0, share.burst as f64);
            h.tokens_at = now;
            h.discount = 1.0;
        }
    }

    /// `stream` closed (or its bucket was abandoned) at `now`: what it was sent stays counted
    /// until `until`.
    pub fn leave(&mut self, stream: StreamId, until: f64) {
        if let Some(h) = self.holdings.remove(&stream) {
            let held = h.counted.max(h.sent.unwrap_or_default());
            if !held.is_empty() {
                self.ghosts.push((held, until));
            }
        }
    }

    /// Moves the shares toward demand at `now`; `drained(stream)` is when the stream last
    /// delivered everything queued for it. Answers the shares to send.
    pub fn step(&mut self, now: f64, drained: &dyn Fn(StreamId) -> Option<f64>) -> Changes {
        self.ghosts.retain(|(_, until)| *until > now);
        self.settle(now, drained);
        let mut changes = Vec::new();
        self.close_advance(now, &mut changes);
        self.refill_reserve(now);
        let targets = self.targets();
        self.lower(&targets, now, &mut changes);
        self.raise(&targets, now, &mut changes);
        changes
    }

    /// Lowerings delivered long enough ago stop being counted at their old value.
    fn settle(&mut self, now: f64, drained: &dyn Fn(StreamId) -> Option<f64>) {
        for (stream, h) in &mut self.holdings {
            if let (Some(at), Some(sent)) = (h.lowered_at, h.sent)
                && drained(*stream).is_some_and(|d| d >= at && now - d >= SETTLE)
            {
                h.counted = sent;
                h.lowered_at = None;
            }
        }
    }

    /// The open advance ends once the room for it is made (no lowering left to settle, and
    /// what is held within the claim); after [`ADVANCE_LIMIT`] without room, the floor is
    /// taken back (DENY_ALL until shares free up, like any newcomer).
    fn close_advance(&mut self, now: f64, changes: &mut Changes) {
        let Some(at) = self.advance else { return };
        let settling = self.holdings.values().any(|h| h.lowered_at.is_some());
        let covered = !settling && self.held().rate <= self.claim.rate;
        if !covered && now - at < ADVANCE_LIMIT {
            return;
        }
        self.advance = None;
        for (stream, h) in &mut self.holdings {
            if std::mem::take(&mut h.advanced) && !covered {
                let sent = h.sent.unwrap_or_default();
                replace(h, sent, Share::default(), self.budget, now);
                h.lowered_at = Some(now);
                changes.push((*stream, Share::default()));
            }
        }
    }

    /// The floor `stream` may be given in advance: it has never been sent anything, is its
    /// Envoy's first sight of the bucket, the only stream of its peer here, and no other
    /// advance is open. The floor is among every peer of the fleet.
    fn advance_for(&self, stream: StreamId) -> Option<Share> {
        let h = &self.holdings[&stream];
        if self.advance.is_some() || h.sent.is_some() || h.reconnected {
            return None;
        }
        if self.holdings.values().filter(|o| o.peer == h.peer).count() > 1 {
            return None;
        }
        let peers = self.peers() as u64 + self.others_peers.max(self.others);
        let rate = floor(self.budget.rate, peers);
        (rate > 0).then(|| self.budget.share_of(rate))
    }

    /// Each stream's target share, by stream: what this instance divides (its claim, or less
    /// when its fair part of the fleet's budget is smaller; the claim follows once the Envoys
    /// hold less), by demand among peers, then each peer's among its streams.
    fn targets(&self) -> Vec<(StreamId, Share)> {
        let fair = self.fair_want(self.budget.rate);
        let part = self
            .budget
            .share_of(self.claim.rate.min(fair))
            .min(self.claim);
        let peers = self.peer_demands();
        let demands: Vec<f64> = peers.iter().map(|(_, d)| *d).collect();
        // Every stream by peer, in the peers' order.
        let mut streams: Vec<(PeerId, StreamId, f64)> = self
            .holdings
            .iter()
            .map(|(s, h)| (h.peer, *s, h.demand.unwrap_or(0.0)))
            .collect();
        streams.sort_unstable_by_key(|(p, s, _)| (*p, *s));
        let mut targets = Vec::with_capacity(streams.len());
        let mut rest = streams.as_slice();
        for ((peer, _), rate) in peers.iter().zip(divide(part.rate, &demands)) {
            let n = rest.iter().take_while(|(p, ..)| p == peer).count();
            let (own, after) = rest.split_at(n);
            rest = after;
            let demands: Vec<f64> = own.iter().map(|(.., d)| *d).collect();
            for ((_, stream, _), rate) in own.iter().zip(divide(rate, &demands)) {
                targets.push((*stream, self.budget.share_of(rate).min(part)));
            }
        }
        targets
    }

    /// Rule 1, first half: lowers whatever is above its target (counted at its old value
    /// until it settles).
    fn lower(&mut self, targets: &[(StreamId, Share)], now: f64, changes: &mut Changes) {
        for &(stream, target) in targets {
            let h = self.holdings.get_mut(&stream).expect("listed");
            let Some(sent) = h.sent else { continue };
            if h.advanced {
                continue; // its floor stands until the room for it is made
            }
            let lower = sent.min(target);
            if lower != sent {
                replace(h, sent, lower, self.budget, now);
                h.lowered_at = Some(now);
                changes.push((stream, lower));
            }
        }
    }

    /// Rule 1, second half, and rule 2: raises, largest unmet demand first, within what is not
    /// counted and what the reserve covers.
    fn raise(&mut self, targets: &[(StreamId, Share)], now: f64, changes: &mut Changes) {
        let held = self.held();
        let mut free = Share {
            rate: self.claim.rate.saturating_sub(held.rate),
            burst: self.claim.burst.saturating_sub(held.burst),
        };
        let mut order: Vec<(StreamId, Share, f64)> = targets
            .iter()
            .map(|&(s, target)| {
                let h = &self.holdings[&s];
                let short = h.demand.unwrap_or(0.0) - h.sent.map_or(0, |x| x.rate) as f64;
                (s, target, short)
            })
            .collect();
        order.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)));
        for (stream, target, _) in order {
            let advance = self.advance_for(stream);
            let h = self.holdings.get_mut(&stream).expect("listed");
            if h.lowered_at.is_some() {
                continue; // raised once its lowering settled
            }
            let sent = h.sent.unwrap_or_default();
            if h.sent.is_some() && target.rate <= sent.rate && target.burst <= sent.burst {
                continue;
            }
            let wanted = Share {
                rate: sent.rate.max(target.rate.min(sent.rate + free.rate)),
                burst: sent.burst.max(target.burst.min(sent.burst + free.burst)),
            };
            let tokens_now = current_tokens(h, sent, self.budget, now);
            let up = covered(sent, wanted, tokens_now, self.reserve.max(0.0));
            if let Some(floor) = advance.filter(|f| up.rate < f.rate) {
                // A newcomer's floor at once, ahead of the room being made for it.
                self.reserve -= gain(sent, floor.burst, tokens_now);
                replace(h, sent, floor, self.budget, now);
                h.counted = floor;
                h.advanced = true;
                self.advance = Some(now);
                free.rate = free.rate.saturating_sub(floor.rate);
                free.burst = free.burst.saturating_sub(floor.burst);
                changes.push((stream, floor));
                continue;
            }
            if h.sent == Some(up) {
                continue;
            }
            if up.is_empty() {
                // Nothing to give yet. A newcomer is answered DENY_ALL until shares free up;
                // but an Envoy that reconnected while a closed stream's shares are still
                // counted (likely its own) still enforces what it holds: it is left to that
                // until they expire.
                if h.sent.is_none() && (!h.reconnected || self.ghosts.is_empty()) {
                    h.sent = Some(up);
                    changes.push((stream, up));
                }
                continue;
            }
            self.reserve -= gain(sent, up.burst, tokens_now);
            free.rate -= up.rate - sent.rate;
            free.burst = free.burst.saturating_sub(up.burst - sent.burst);
            replace(h, sent, up, self.budget, now);
            h.counted = h.counted.max(up);
            changes.push((stream, up));
        }
    }

    /// Rule 2's reserve at `now`: it grows by the rate nobody holds, and never past the
    /// capacity nobody holds.
    fn refill_reserve(&mut self, now: f64) {
        let elapsed = (now - self.last_step).max(0.0);
        self.last_step = now;
        let held = self.held();
        let spare_rate = self.claim.rate.saturating_sub(held.rate);
        let spare_burst = self.claim.burst.saturating_sub(held.burst) as f64;
        self.reserve =
            (self.reserve + self.budget.per_second(spare_rate) * elapsed).min(spare_burst);
    }

    /// Shadow mode: the fleet admitted `allowed` more at `now`; answers how many of them the
    /// budget would have denied.
    pub fn shadow_admitted(&mut self, allowed: u64, now: f64) -> u64 {
        let (tokens, at) = self.shadow_tokens;
        let refill = self.budget.per_second(self.budget.rate) * (now - at).max(0.0);
        let tokens = (tokens + refill).min(self.budget.burst as f64);
        let over = (allowed as f64 - tokens).max(0.0);
        self.shadow_tokens = ((tokens - allowed as f64).max(0.0), now);
        over.ceil() as u64
    }
}

/// The part of `total` (tokens per window) max-min fair for peers of demands `mine` among
/// them and `others` more peers of `others_demand` together, counted as equal: the water
/// level `L` where every peer gets `min(demand, L)` and the parts add up to `total`; when
/// every demand is met, what is left is spread by the number of peers.
fn fair_part(total: f64, mine: &[f64], others_demand: f64, others: f64) -> f64 {
    let level = |l: f64| -> f64 {
        mine.iter().map(|d| d.min(l)).sum::<f64>() + others_demand.min(others * l)
    };
    let asked: f64 = mine.iter().sum();
    if asked + others_demand <= total {
        let spare = total - asked - others_demand;
        let k = mine.len().max(1) as f64;
        return asked + spare * k / (k + others);
    }
    let (mut low, mut high) = (0.0, total);
    for _ in 0..64 {
        let mid = (low + high) / 2.0;
        if level(mid) < total {
            low = mid;
        } else {
            high = mid;
        }
    }
    mine.iter().map(|d| d.min(high)).sum()
}

/// The tokens a bucket of capacity `burst` starts with beyond what `sent` (holding
/// `tokens`) had: a new bucket (or one after DENY_ALL) starts full, a replacement at the old
/// one's fill fraction.
fn gain(sent: Share, burst: u64, tokens: f64) -> f64 {
    if sent.is_empty() {
        burst as f64
    } else {
        tokens * (burst as f64 / sent.burst as f64) - tokens
    }
}

/// `wanted`, with as much capacity over `sent` (holding `tokens`) as `reserve` covers; a
/// share with a rate has at least one token of capacity (0 refuses everything), and one
/// without a rate is empty.
fn covered(sent: Share, wanted: Share, tokens: f64, reserve: f64) -> Share {
    let mut up = wanted;
    if gain(sent, up.burst, tokens) > reserve {
        up.burst = if sent.is_empty() {
            (reserve.floor() as u64).min(up.burst)
        } else {
            // tokens × b / sent.burst − tokens ≤ reserve
            let covered = (reserve + tokens) * sent.burst as f64 / tokens;
            (covered.floor() as u64).clamp(sent.burst, up.burst)
        };
    }
    if up.rate == 0 {
        up = Share::default();
    } else if up.burst == 0 {
        // A bucket of capacity 0 refuses everything: one token, past the reserve.
        up.burst = 1;
    }
    up
}

/// The upper bound of `h`'s tokens at `now`, its bucket being `sent`.
fn current_tokens(h: &Holding, sent: Share, budget: Budget, now: f64) -> f64 {
    if sent.is_empty() {
        return 0.0;
    }
    let refill = budget.per_second(sent.rate) * (now - h.tokens_at).max(0.0);
    (h.tokens + refill).min(sent.burst as f64)
}

/// Envoy replaces `h`'s bucket `from` by `to` at `now`: a new bucket starts full, a
/// replacement at the old one's fill fraction.
fn replace(h: &mut Holding, from: Share, to: Share, budget: Budget, now: f64) {
    if from.is_empty() || to.is_empty() {
        h.tokens = if to.is_empty() { 0.0 } else { to.burst as f64 };
        h.discount = 0.0;
    } else {
        let ratio = to.burst as f64 / from.burst as f64;
        let projected = h.tokens + budget.per_second(from.rate) * (now - h.tokens_at).max(0.0);
        h.tokens = projected * ratio;
        h.discount = (h.discount * ratio).min(1.0);
    }
    h.tokens_at = now;
    h.sent = Some(to);
}

#[cfg(test)]
mod tests;
