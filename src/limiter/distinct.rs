//! How many distinct keys each rule refused in its last completed window, fleet-wide, and how
//! many of them it had not refused in the history before (24 hours by default): the signal
//! that a limit is wrong (many keys at once) or that a quiet client started being limited (a
//! new one), which an aggregate refusal count hides.
//!
//! On the request path a refused decision hashes its key into the rule's sample of the
//! window (nothing happens on an allowed one, and nothing reaches the store); once a second
//! [`DistinctRefused::tick`] sends the new hashes to the shared store's sets and, `GRACE` (3 s)
//! after a window ends, has the store count it (once for the fleet: see
//! [`crate::store::refused`]). An instance that refused nothing in a window says 0 for it;
//! the fleet's figure is the largest any instance says.
//!
//! Bounds: per rule, at most `WINDOW_CAP` (1,024) hashes (8 bytes each) in each of at most
//! `MAX_OPEN` (4) windows, whatever the number of keys.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::Descriptor;
use super::fnv::{FnvBuild, FnvMap};
use crate::algorithm::{Decision, Micros, SECOND};
use crate::clock::{Clock, SystemClock};
use crate::policy::{Policy, RateLimit, Rule};
use crate::store::refused::{HASH_BITS, WINDOW_CAP, sampled};
use crate::store::{RefusedAdd, RefusedClose, RefusedCounts, Shared};

/// How long after a window's end it is counted: every instance has sent its hashes by then
/// (each sends once a second).
pub const GRACE: Duration = Duration::from_secs(3);

/// Most windows of one rule not counted yet (the current one, the last, and room for a store
/// that did not answer for a while).
const MAX_OPEN: usize = 4;

/// Every rule's samples of refused keys on this instance.
pub struct DistinctRefused {
    clock: Arc<dyn Clock>,
    history: Duration,
    rules: Mutex<FnvMap<String, RuleSample>>,
}

struct RuleSample {
    domain: String,
    /// The rule's sets in the store: a name unique per domain and rule.
    set: String,
    window: Micros,
    /// Windows not counted yet, by start.
    open: BTreeMap<Micros, Sample>,
    /// The start of the last window whose counts this instance published, and whether they
    /// were not zero.
    published: Option<(Micros, bool)>,
}

#[derive(Default)]
struct Sample {
    level: u32,
    seen: HashSet<u64, FnvBuild>,
    /// Hashes not sent to the store yet.
    pending: Vec<u64>,
}

impl Sample {
    fn raise(&mut self, level: u32) {
        if level > self.level {
            self.level = level;
            self.seen.retain(|&h| sampled(h, level));
            self.pending.retain(|&h| sampled(h, level));
        }
    }
}

/// A rule's counts for its last completed window, for its gauges.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    /// The rule's domain.
    pub domain: String,
    /// The rule's stats key.
    pub rule: String,
    /// Its counts (zeros when this instance refused nothing in the window).
    pub counts: RefusedCounts,
}

impl Default for DistinctRefused {
    fn default() -> Self {
        Self::new(Arc::new(SystemClock), Duration::from_secs(86_400))
    }
}

impl DistinctRefused {
    /// Windows on `clock`; "refused before" looks back `history`.
    pub fn new(clock: Arc<dyn Clock>, history: Duration) -> Self {
        Self {
            clock,
            history,
            rules: Mutex::default(),
        }
    }

    /// `rule` of `domain` decided `descriptor` under `limit`: a refused key is sampled.
    pub fn decided(
        &self,
        domain: &str,
        rule: &Rule,
        limit: &RateLimit,
        decision: &Decision,
        descriptor: &Descriptor,
    ) {
        if decision.allowed || descriptor.hits <= 0 {
            return;
        }
        let hash = key_hash(descriptor);
        // The rule's own window: its first limit's, whichever of its limits refused.
        let first = match &rule.limit {
            crate::policy::RuleLimit::Limited(limits) => limits.first().unwrap_or(limit),
            crate::policy::RuleLimit::Unlimited => limit,
        };
        let window = first.window().max(SECOND);
        let now = self.clock.now();
        let start = now - now % window;
        let mut rules = self.rules.lock();
        let sample = match rules.get_mut(&rule.stats_key) {
            Some(s) if s.window == window => s,
            _ => {
                rules.insert(
                    rule.stats_key.clone(),
                    RuleSample {
                        domain: domain.to_owned(),
                        set: set_name(domain, &rule.stats_key),
                        window,
                        open: BTreeMap::new(),
                        published: None,
                    },
                );
                rules.get_mut(&rule.stats_key).expect("inserted above")
            }
        };
        if !sample.open.contains_key(&start) && sample.open.len() >= MAX_OPEN {
            sample.open.pop_first();
        }
        let s = sample.open.entry(start).or_default();
        if sampled(hash, s.level) && s.seen.insert(hash) {
            s.pending.push(hash);
            if s.seen.len() > WINDOW_CAP {
                s.raise(s.level + 1);
            }
        }
    }

    /// Forgets the rules `policy` no longer has.
    pub fn follow(&self, policy: &Policy) {
        let kept: HashSet<&str> = policy
            .rules()
            .iter()
            .map(|r| r.stats_key.as_str())
            .collect();
        self.rules
            .lock()
            .retain(|rule, _| kept.contains(rule.as_str()));
    }

    /// Sends the new hashes to `store`, has it count the windows that ended `GRACE` (3 s) ago,
    /// and answers the counts to publish (zeros for a rule whose last completed window this
    /// instance refused nothing in, after counts that were not). A store that fails keeps the
    /// hashes for the next tick.
    pub async fn tick(&self, store: &dyn Shared) -> Vec<Published> {
        let now = self.clock.now();
        let due = self.due(now);
        if !due.adds.is_empty() {
            self.send(store, &due.add_rules, due.adds).await;
        }
        let mut out = Vec::new();
        if !due.closes.is_empty() {
            out = self.count(store, &due.close_rules, &due.closes).await;
        }
        out.extend(self.zeros(now));
        out
    }

    /// What this tick has to do: the new hashes of each open window, the windows to count.
    fn due(&self, now: Micros) -> Due {
        let grace = GRACE.as_micros() as Micros;
        let mut due = Due::default();
        for (rule, r) in self.rules.lock().iter_mut() {
            for (&start, s) in r.open.iter_mut() {
                if !s.pending.is_empty() {
                    due.add_rules.push(rule.clone());
                    due.adds.push(RefusedAdd {
                        set: r.set.clone(),
                        start,
                        ttl: Duration::from_micros(3 * r.window) + 2 * GRACE,
                        level: s.level,
                        hashes: std::mem::take(&mut s.pending),
                    });
                }
                if start + r.window + grace <= now {
                    due.close_rules.push(rule.clone());
                    due.closes.push(RefusedClose {
                        set: r.set.clone(),
                        start,
                        history: self.history,
                        counts_ttl: Duration::from_micros(4 * r.window)
                            .max(Duration::from_secs(60)),
                    });
                }
            }
        }
        due
    }

    /// Sends `adds` (of `rules`, in order); raises each sample to the store's level, or keeps
    /// its hashes for the next tick when the store fails.
    async fn send(&self, store: &dyn Shared, rules: &[String], adds: Vec<RefusedAdd>) {
        let answer = store.add_refused(&adds).await;
        if let Err(e) = &answer {
            tracing::debug!(error = %e, "refused keys not sent to the store; next tick");
        }
        let mut samples = self.rules.lock();
        for (i, (rule, add)) in rules.iter().zip(adds).enumerate() {
            let Some(s) = samples
                .get_mut(rule)
                .and_then(|r| r.open.get_mut(&add.start))
            else {
                continue;
            };
            match &answer {
                Ok(levels) => s.raise(levels.get(i).copied().unwrap_or(0)),
                Err(_) => s.pending.extend(add.hashes),
            }
        }
    }

    /// Has the store count `closes` (of `rules`, in order); the counts not published yet.
    async fn count(
        &self,
        store: &dyn Shared,
        rules: &[String],
        closes: &[RefusedClose],
    ) -> Vec<Published> {
        let counts = match store.close_refused(closes).await {
            Ok(counts) => counts,
            Err(e) => {
                tracing::debug!(error = %e, "refused keys not counted; next tick");
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        let mut samples = self.rules.lock();
        for ((rule, close), counts) in rules.iter().zip(closes).zip(counts) {
            let Some(r) = samples.get_mut(rule) else {
                continue;
            };
            r.open.remove(&close.start);
            if r.published.is_none_or(|(p, _)| p < close.start) {
                r.published = Some((close.start, counts.distinct > 0));
                out.push(Published {
                    domain: r.domain.clone(),
                    rule: rule.clone(),
                    counts,
                });
            }
        }
        out
    }

    /// Zeros for the rules whose last completed window had no refusal here, after counts that
    /// were not zero.
    fn zeros(&self, now: Micros) -> Vec<Published> {
        let counted = now.saturating_sub(GRACE.as_micros() as Micros);
        let mut out = Vec::new();
        for (rule, r) in self.rules.lock().iter_mut() {
            let Some((published, true)) = r.published else {
                continue;
            };
            let last = (counted - counted % r.window).saturating_sub(r.window);
            let waiting = r.open.keys().any(|&start| start <= last);
            if last > published && !waiting {
                r.published = Some((last, false));
                out.push(Published {
                    domain: r.domain.clone(),
                    rule: rule.clone(),
                    counts: RefusedCounts::default(),
                });
            }
        }
        out
    }
}

/// One tick's work: what to add and what to count, each with its rule (same order).
#[derive(Default)]
struct Due {
    add_rules: Vec<String>,
    adds: Vec<RefusedAdd>,
    close_rules: Vec<String>,
    closes: Vec<RefusedClose>,
}

/// Each rule's gauges of distinct and new refused keys (`sluice_rule_refused_keys`,
/// `sluice_rule_newly_refused_keys`), set from [`Published`] counts.
pub struct RefusedKeyGauges {
    distinct: prometheus::IntGaugeVec,
    new: prometheus::IntGaugeVec,
}

impl RefusedKeyGauges {
    /// Registers the gauges into `r`.
    pub fn register(r: &prometheus::Registry) -> Self {
        let gauge =
            |name: &str, help: &str| crate::metrics::gauge_vec(r, name, help, &["domain", "rule"]);
        Self {
            distinct: gauge(
                "sluice_rule_refused_keys",
                "Distinct keys the rule refused (a shadow rule: would have refused) in its last completed window, fleet-wide: take the max over instances",
            ),
            new: gauge(
                "sluice_rule_newly_refused_keys",
                "Of those, keys it had not refused within REFUSED_KEYS_HISTORY before the window, fleet-wide: take the max over instances",
            ),
        }
    }

    /// A rule's counts for its last completed window.
    pub fn set(&self, published: &Published) {
        let labels = [published.domain.as_str(), published.rule.as_str()];
        let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.distinct
            .with_label_values(&labels)
            .set(clamp(published.counts.distinct));
        self.new
            .with_label_values(&labels)
            .set(clamp(published.counts.new));
    }

    /// Every counted rule of `policy` at 0 until a window of its refuses a key (a series that
    /// exists, so that an alert can tell "none refused" from "not scraped"); a removed rule's
    /// series go.
    pub fn follow(&self, policy: &Policy) {
        self.distinct.reset();
        self.new.reset();
        for (domain, rule) in policy.rules_by_domain() {
            if matches!(rule.limit, crate::policy::RuleLimit::Limited(_)) {
                let labels = [domain, rule.stats_key.as_str()];
                self.distinct.with_label_values(&labels).set(0);
                self.new.with_label_values(&labels).set(0);
            }
        }
    }
}

/// The name of a rule's sets: 16 hex digits of the SHA-256 of its domain and stats key (short,
/// and free of the braces a Cluster hash tag would trip on).
fn set_name(domain: &str, rule: &str) -> String {
    let mut out = String::new();
    crate::store::push_sha256_hex(&mut out, &format!("{domain}\u{0}{rule}"), 8);
    out
}

/// A stable 52-bit hash of a descriptor's entries (the same on every instance and version:
/// FNV-1a, then a 64-bit finalizer so that its low bits, which sampling reads, are uniform).
pub fn key_hash(descriptor: &Descriptor) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for e in &descriptor.entries {
        eat(e.key.as_bytes());
        eat(&[0]);
        eat(e.value.as_bytes());
        eat(&[1]);
    }
    let mut z = h;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) >> (64 - HASH_BITS)
}

#[cfg(test)]
mod tests;
