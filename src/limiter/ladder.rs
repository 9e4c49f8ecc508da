//! What candidate limits would have refused: per rule and limit, counts on a ladder of ratios
//! of the configured limit, taken from the counter's value before and after each decision (the
//! store's answer, so exact fleet-wide on a shared store), with no per-key state.
//!
//! A *key-window* is one counter's run from empty: a fixed window's key in one window; a
//! sliding window's key from an empty estimate; a token bucket's key from a full bucket; a
//! concurrency key from nothing in flight. Its *peak* is the highest count it reached. For
//! each rung `r` (the count `floor(r × limit)`), two counters:
//! - key-windows whose count went past the rung (their peak is above it: a limit there would
//!   have refused them at least once);
//! - hits counted past the rung (a limit there would have refused them).
//!
//! Each decision touches the rungs its count crossed (usually none or one) and one band of
//! hits; the cumulative counts are summed when scraped.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::RwLock;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, LabelPair, Metric, MetricFamily, MetricType};

use super::LimitEvent;
use super::fnv::FnvMap;
use crate::policy::{Ladder, LadderChoice, Policy, RuleLimit, ratio_label};

/// `sluice_rule_key_windows_total`: key-windows seen.
pub const KEY_WINDOWS: &str = "sluice_rule_key_windows_total";
/// `sluice_rule_key_windows_past_total{le}`: key-windows whose count went past `le` × limit.
pub const KEY_WINDOWS_PAST: &str = "sluice_rule_key_windows_past_total";
/// `sluice_rule_hits_past_total{le}`: hits counted past `le` × limit.
pub const HITS_PAST: &str = "sluice_rule_hits_past_total";
/// `sluice_rule_hits_measured_total`: hits placed on the ladder.
pub const HITS_MEASURED: &str = "sluice_rule_hits_measured_total";

const LABELS: [&str; 4] = ["domain", "rule", "window", "algorithm"];

/// Every rule's ladder counts; a [`Collector`] of them.
pub struct Ladders {
    /// The process's ladder (`LIMIT_LADDER*`); `None`: rules are measured only with a
    /// ladder of their own.
    default: RwLock<Option<Ladder>>,
    /// By stats key: one ladder per limit of the rule.
    rules: RwLock<FnvMap<String, Vec<Arc<RuleLadder>>>>,
    descs: Vec<Desc>,
}

/// One limit's ladder.
struct RuleLadder {
    /// [`LABELS`]' values.
    labels: [String; 4],
    /// The limit's window and algorithm, to find it from a decision's limit.
    window: crate::algorithm::Micros,
    algorithm: crate::algorithm::Algorithm,
    /// The configured capacity the ratios apply to, and the ladder: rebuilt when either changes.
    capacity: u64,
    ladder: Ladder,
    /// Each rung's ratio as its `le` label.
    les: Vec<String>,
    /// Each rung as a count: `floor(ratio × capacity)`, ascending.
    rungs: Vec<u64>,
    seen: AtomicU64,
    /// Per rung: key-windows whose count went past it.
    past: Box<[AtomicU64]>,
    /// Hits by band: band `j` holds the hits counted at positions in `(rungs[j-1], rungs[j]]`
    /// (band 0 from 0, the last one past the top rung).
    bands: Box<[AtomicU64]>,
}

impl RuleLadder {
    fn new(labels: [String; 4], limit: &crate::policy::RateLimit, ladder: Ladder) -> Self {
        let capacity = limit.algorithm_limit().capacity();
        let ratios = ladder.ratios();
        let rungs = ratios
            .iter()
            .map(|r| (r * capacity as f64).floor() as u64)
            .collect::<Vec<_>>();
        let zeros = |n: usize| (0..n).map(|_| AtomicU64::new(0)).collect();
        Self {
            labels,
            window: limit.window(),
            algorithm: limit.algorithm,
            capacity,
            ladder,
            les: ratios.iter().map(|&r| ratio_label(r)).collect(),
            past: zeros(rungs.len()),
            bands: zeros(rungs.len() + 1),
            rungs,
            seen: AtomicU64::new(0),
        }
    }

    /// A counter went from `before` to `after` (`before < after`): one key-window more when it
    /// was empty, every rung crossed, the hits by band.
    fn moved(&self, before: u64, after: u64) {
        if before == 0 {
            self.seen.fetch_add(1, Relaxed);
        }
        let first = self.rungs.partition_point(|&r| r < before);
        for (k, &rung) in self.rungs.iter().enumerate().skip(first) {
            if rung >= after {
                break;
            }
            self.past[k].fetch_add(1, Relaxed);
        }
        self.place(before, after);
    }

    /// Hits at positions `(before, after]`, by band.
    fn place(&self, before: u64, after: u64) {
        let first = self.rungs.partition_point(|&r| r <= before);
        let last = self.rungs.partition_point(|&r| r < after);
        for j in first..=last {
            let lo = if j == 0 {
                before
            } else {
                before.max(self.rungs[j - 1])
            };
            let hi = self.rungs.get(j).map_or(after, |&r| after.min(r));
            if hi > lo {
                self.bands[j].fetch_add(hi - lo, Relaxed);
            }
        }
    }

    /// `(le, key-windows past, hits past)` per rung, then `+Inf` (nothing past it).
    fn cumulative(&self) -> Vec<(&str, u64, u64)> {
        let mut hits_above: u64 = self.bands.iter().map(|b| b.load(Relaxed)).sum();
        let mut out = Vec::with_capacity(self.rungs.len() + 1);
        for (k, le) in self.les.iter().enumerate() {
            hits_above -= self.bands[k].load(Relaxed).min(hits_above);
            out.push((le.as_str(), self.past[k].load(Relaxed), hits_above));
        }
        out.push(("+Inf", 0, 0));
        out
    }
}

impl Ladders {
    /// Empty, measuring with `default` (the process's ladder).
    pub fn new(default: Option<Ladder>) -> Self {
        let desc = |name: &str, help: &str, le: bool| {
            let mut labels: Vec<String> = LABELS.iter().map(|l| (*l).to_owned()).collect();
            if le {
                labels.push("le".into());
            }
            Desc::new(name.into(), help.into(), labels, HashMap::new())
                .expect("the ladder's metric names are valid")
        };
        Self {
            default: RwLock::new(default),
            rules: RwLock::default(),
            descs: vec![
                desc(
                    KEY_WINDOWS,
                    "Key-windows seen: counters that went from empty to a count (see the docs: a key in one window)",
                    false,
                ),
                desc(
                    KEY_WINDOWS_PAST,
                    "Key-windows whose count went past le times the configured limit: a limit there would have refused them",
                    true,
                ),
                desc(
                    HITS_PAST,
                    "Hits counted past le times the configured limit: a limit there would have refused them",
                    true,
                ),
                desc(HITS_MEASURED, "Hits placed on the ladder", false),
            ],
        }
    }

    /// Replaces the process's ladder (before the first policy).
    pub fn set_default(&self, default: Option<Ladder>) {
        *self.default.write() = default;
    }

    /// The ladders of `policy`'s rules; a limit whose capacity and ladder did not change
    /// keeps its counts.
    pub fn policy_swapped(&self, policy: &Policy) {
        let default = *self.default.read();
        let mut old = std::mem::take(&mut *self.rules.write());
        let mut rules = FnvMap::default();
        for (domain, rule) in policy.rules_by_domain() {
            let RuleLimit::Limited(limits) = &rule.limit else {
                continue;
            };
            let ladder = match rule.ladder {
                LadderChoice::Default => default,
                LadderChoice::Off => None,
                LadderChoice::Own(l) => Some(l),
            };
            let Some(ladder) = ladder else { continue };
            let kept = old.remove(&rule.stats_key).unwrap_or_default();
            let ladders = limits
                .iter()
                .map(|limit| {
                    let found = kept.iter().find(|l| {
                        l.window == limit.window()
                            && l.algorithm == limit.algorithm
                            && l.capacity == limit.algorithm_limit().capacity()
                            && l.ladder == ladder
                    });
                    found.cloned().unwrap_or_else(|| {
                        let window = format!("{}s", limit.window() / crate::algorithm::SECOND);
                        let labels = [
                            domain.to_owned(),
                            rule.stats_key.clone(),
                            window,
                            limit.algorithm.as_str().to_owned(),
                        ];
                        Arc::new(RuleLadder::new(labels, limit, ladder))
                    })
                })
                .collect();
            rules.insert(rule.stats_key.clone(), ladders);
        }
        *self.rules.write() = rules;
    }

    /// Places one counted limit's decision on its rule's ladder.
    pub fn decided(&self, event: &LimitEvent<'_>) {
        let Some(rule) = event.rule else { return };
        if event.leased || event.descriptor.hits <= 0 {
            return; // a block's count is not the shared one; refunds and peeks are not hits
        }
        let hits = event.descriptor.hits as u64;
        let rules = self.rules.read();
        let Some(ladder) = rules.get(&rule.stats_key).and_then(|ls| {
            ls.iter()
                .find(|l| l.window == event.limit.window() && l.algorithm == event.limit.algorithm)
        }) else {
            return;
        };
        let d = event.decision;
        let quota = event.limit.algorithm_limit().capacity();
        if d.allowed && !event.charged {
            return; // another descriptor refused the request: this counter did not move
        }
        if !d.allowed && (event.from_cache || d.overdraft == 0) {
            // Refused and not counted: the counter stays at its limit, so these hits are past
            // every rung below it and nothing above it is known.
            let at = quota.saturating_sub(d.remaining);
            ladder.place(at, at.saturating_add(hits));
            return;
        }
        let after = if d.allowed {
            quota.saturating_sub(d.remaining)
        } else {
            quota.saturating_add(d.overdraft)
        };
        let before = after.saturating_sub(hits);
        if after > before {
            ladder.moved(before, after);
        }
    }
}

impl Collector for Ladders {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let rules = self.rules.read();
        let mut ladders: Vec<&Arc<RuleLadder>> = rules.values().flatten().collect();
        ladders.sort_by(|a, b| a.labels.cmp(&b.labels));
        let mut families: Vec<MetricFamily> = self
            .descs
            .iter()
            .map(|d| {
                let mut f = MetricFamily::default();
                f.set_name(d.fq_name.clone());
                f.set_help(d.help.clone());
                f.set_field_type(MetricType::COUNTER);
                f
            })
            .collect();
        for l in ladders {
            let measured: u64 = l.bands.iter().map(|b| b.load(Relaxed)).sum();
            families[0]
                .mut_metric()
                .push(metric(&l.labels, None, l.seen.load(Relaxed)));
            for (le, windows, hits) in l.cumulative() {
                families[1]
                    .mut_metric()
                    .push(metric(&l.labels, Some(le), windows));
                families[2]
                    .mut_metric()
                    .push(metric(&l.labels, Some(le), hits));
            }
            families[3]
                .mut_metric()
                .push(metric(&l.labels, None, measured));
        }
        families
    }
}

/// The ladders as the registry collects them (the registry owns its collectors).
pub struct LadderCollector(pub Arc<Ladders>);

impl Collector for LadderCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.0.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.0.collect()
    }
}

fn metric(labels: &[String; 4], le: Option<&str>, value: u64) -> Metric {
    let pair = |name: &str, value: &str| {
        let mut p = LabelPair::default();
        p.set_name(name.to_owned());
        p.set_value(value.to_owned());
        p
    };
    let mut pairs: Vec<LabelPair> = LABELS.iter().zip(labels).map(|(n, v)| pair(n, v)).collect();
    if let Some(le) = le {
        pairs.push(pair("le", le));
    }
    let mut counter = Counter::default();
    counter.set_value(value as f64);
    let mut m = Metric::from_label(pairs);
    m.set_counter(counter);
    m
}

#[cfg(test)]
mod tests;
