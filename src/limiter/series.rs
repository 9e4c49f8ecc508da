// Why one long file: one observer whose series (hits, limits, bursts, detailed values) share
// their labels, their cap and the policy swap that resets them.
//! Per-rule metrics, the limiter's observer: hits by rule as the reference service counts
//! them (`ratelimit_service_rate_limit_*`), requests for unknown domains, and the global
//! shadow mode's saves. Series of rules with `detailed_metric`/`value_to_metric`, and of
//! requests' limit overrides (named by the request's keys), carry request text and are
//! capped together (past the cap: one `__overflow__` series, counted); an override's series
//! goes away once no request has used it for [`OVERRIDE_IDLE`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use prometheus::{IntCounter, IntCounterVec, Registry};

use super::distinct::RefusedKeyGauges;
use super::ladder::{LadderCollector, Ladders};
use super::{LimitEvent, Observer};
use crate::metrics::{counter, counter_vec, gauge_vec};
use crate::policy::Policy;

/// Label value of the series that takes hits past the detailed-series cap.
pub const OVERFLOW: &str = "__overflow__";

/// An override's series unused this long is removed (at the next scrape, or the next new
/// series), freeing its place under the cap.
pub const OVERRIDE_IDLE: std::time::Duration = std::time::Duration::from_secs(600);

/// How often (seconds) a full cap looks for idle override series to remove.
const SWEEP_EVERY: u64 = 10;

/// Most unknown domains counted in `ratelimit_service_domain_not_found` series of their own
/// (they come from requests); the rest are counted under `domain="__overflow__"`.
pub const MAX_UNKNOWN_DOMAINS: usize = 100;

/// The per-rule series and what finds them fast.
pub struct RuleSeries {
    near_limit_ratio: f64,
    rules: RuleMetrics,
    /// Per-rule series handles by label tuple (so the hot path does one map lookup), with the
    /// stats key of the rule that owns them (`None` for request overrides).
    handles: RwLock<HashMap<Labels, Series>>,
    /// The same handles for plain rules, by stats key: the hot path's lookup, which borrows
    /// the key and allocates nothing.
    by_rule: RwLock<super::fnv::FnvMap<String, Arc<RuleHandles>>>,
    /// Detailed series created so far, against `max_detailed`.
    detailed: Mutex<HashSet<[String; 4]>>,
    max_detailed: usize,
    series_overflow: IntCounter,
    domain_not_found: IntCounterVec,
    /// Unknown domains with a series of their own, against [`MAX_UNKNOWN_DOMAINS`].
    unknown_domains: Mutex<HashSet<String>>,
    global_shadow_mode: IntCounter,
    /// What override series' last use is measured from.
    started: std::time::Instant,
    /// Each rule's configured limits: hits per window, and a token bucket's burst.
    limits: prometheus::IntGaugeVec,
    bursts: prometheus::IntGaugeVec,
    /// When a full cap last looked for idle override series (seconds from `started`).
    last_sweep: std::sync::atomic::AtomicU64,
    /// Seconds added to `started`'s clock (tests move it; 0 otherwise).
    skew: std::sync::atomic::AtomicU64,
    /// What candidate limits would have refused (a collector in the registry).
    ladders: Arc<Ladders>,
    /// Distinct keys refused in each rule's last completed window, and of those the new.
    refused_keys: RefusedKeyGauges,
}

struct RuleMetrics {
    total_hits: IntCounterVec,
    within_limit: IntCounterVec,
    over_limit: IntCounterVec,
    near_limit: IntCounterVec,
    over_limit_with_local_cache: IntCounterVec,
    shadow_mode: IntCounterVec,
    budget_units: IntCounterVec,
    budget_overdraft: IntCounterVec,
}

struct RuleHandles {
    total_hits: IntCounter,
    within_limit: IntCounter,
    over_limit: IntCounter,
    near_limit: IntCounter,
    over_limit_with_local_cache: IntCounter,
    shadow_mode: IntCounter,
    /// A usage budget's: units charged, and of those the units past its limit (series only
    /// for rules with a budget).
    budget: Option<(IntCounter, IntCounter)>,
    /// For an override's series: when a request last used it (seconds from `started`).
    last_used: std::sync::atomic::AtomicU64,
}

const RULE_LABELS: [&str; 4] = ["domain", "rule", "key1", "key2"];

/// The rule's labels, its window (`60s`) and its algorithm.
const LIMIT_LABELS: [&str; 6] = ["domain", "rule", "key1", "key2", "window", "algorithm"];

/// Values of [`RULE_LABELS`].
type Labels = [String; 4];

/// A rule's series: the stats key of the rule that owns it (`None` for request overrides)
/// and its counter handles.
type Series = (Option<String>, Arc<RuleHandles>);

impl RuleSeries {
    /// Registers the per-rule metrics into `r`. `max_detailed` caps the series of
    /// `detailed_metric`/`value_to_metric` rules.
    pub fn register(r: &Registry, near_limit_ratio: f64, max_detailed: usize) -> Self {
        let ladders = Arc::new(Ladders::new(Some(crate::policy::Ladder::default())));
        crate::metrics::register_counters(r, Box::new(LadderCollector(ladders.clone())));
        let rule = |name: &str, help: &str| {
            counter_vec(
                r,
                &format!("ratelimit_service_rate_limit_{name}"),
                help,
                &RULE_LABELS,
            )
        };
        Self {
            near_limit_ratio,
            rules: RuleMetrics {
                total_hits: rule("total_hits", "Hits counted against the rule"),
                within_limit: rule("within_limit", "Hits within the limit"),
                over_limit: rule("over_limit", "Hits over the limit"),
                near_limit: rule(
                    "near_limit",
                    "Hits within the limit beyond NEAR_LIMIT_RATIO of it",
                ),
                over_limit_with_local_cache: rule(
                    "over_limit_with_local_cache",
                    "Hits over the limit answered by the local over-limit cache",
                ),
                shadow_mode: rule(
                    "shadow_mode",
                    "Hits over the limit let through by shadow mode",
                ),
                budget_units: counter_vec(
                    r,
                    "sluice_budget_units_total",
                    "Units charged to a usage budget (overdraft: true), every charge counting",
                    &RULE_LABELS,
                ),
                budget_overdraft: counter_vec(
                    r,
                    "sluice_budget_overdraft_units_total",
                    "Units charged to a usage budget past its limit",
                    &RULE_LABELS,
                ),
            },
            handles: RwLock::default(),
            by_rule: RwLock::default(),
            detailed: Mutex::default(),
            max_detailed,
            series_overflow: counter(
                r,
                "sluice_metric_series_overflow_total",
                "Hits counted in __overflow__ series past the detailed-series cap",
            ),
            domain_not_found: counter_vec(
                r,
                "ratelimit_service_domain_not_found",
                "Requests for a domain no config declares, by domain",
                &["domain"],
            ),
            unknown_domains: Mutex::default(),
            global_shadow_mode: counter(
                r,
                "ratelimit_service_global_shadow_mode",
                "Requests over the limit that the global SHADOW_MODE answered OK",
            ),
            started: std::time::Instant::now(),
            limits: gauge_vec(
                r,
                "sluice_rule_limit",
                "Each rule's configured limit: hits per window (labels: the rule's, its window, its algorithm)",
                &LIMIT_LABELS,
            ),
            bursts: gauge_vec(
                r,
                "sluice_rule_burst",
                "Each token bucket rule's burst (its capacity)",
                &LIMIT_LABELS,
            ),
            last_sweep: Default::default(),
            skew: Default::default(),
            ladders,
            refused_keys: RefusedKeyGauges::register(r),
        }
    }

    /// A rule's counts of refused keys for its last completed window.
    pub fn refused_keys(&self, published: &super::Published) {
        self.refused_keys.set(published);
    }

    /// Replaces the process's ladder of candidate limits (before the first policy).
    pub fn set_ladder(&self, ladder: Option<crate::policy::Ladder>) {
        self.ladders.set_default(ladder);
    }

    fn now_secs(&self) -> u64 {
        self.started.elapsed().as_secs() + self.skew.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Moves this series' clock `secs` ahead (for tests of idle series).
    #[cfg(test)]
    pub(crate) fn advance(&self, secs: u64) {
        self.skew
            .fetch_add(secs, std::sync::atomic::Ordering::Relaxed);
    }

    /// Removes the override series no request has used for [`OVERRIDE_IDLE`], and their
    /// places under the cap.
    pub fn sweep_idle_overrides(&self) {
        let now = self.now_secs();
        let idle = OVERRIDE_IDLE.as_secs();
        let mut handles = self.handles.write();
        let mut detailed = self.detailed.lock();
        handles.retain(|labels, (owner, h)| {
            let last = h.last_used.load(std::sync::atomic::Ordering::Relaxed);
            let keep = owner.is_some() || labels[1] == OVERFLOW || now.saturating_sub(last) < idle;
            if !keep {
                self.remove_series(labels);
                detailed.remove(labels);
            }
            keep
        });
    }

    fn remove_series(&self, labels: &Labels) {
        let values: Vec<&str> = labels.iter().map(String::as_str).collect();
        for vec in self.rules.all() {
            let _ = vec.remove_label_values(&values);
        }
    }

    /// The configured limits of `policy`'s rules as gauges, replacing those of the policy
    /// before (one series per limit of a rule: bounded by the config, never by requests).
    fn set_limits(&self, policy: &Policy) {
        self.limits.reset();
        self.bursts.reset();
        for (domain, rule) in policy.rules_by_domain() {
            let crate::policy::RuleLimit::Limited(limits) = &rule.limit else {
                continue;
            };
            let parts: Vec<String> = rule
                .levels
                .iter()
                .map(|level| match &level.value {
                    Some(value) => format!("{}_{value}", level.key),
                    None => level.key.clone(),
                })
                .collect();
            let part = |i: usize| parts.get(i).map_or("", String::as_str);
            for limit in limits {
                let window = format!("{}s", limit.window() / crate::algorithm::SECOND);
                let values = [
                    domain,
                    rule.stats_key.as_str(),
                    part(0),
                    part(1),
                    window.as_str(),
                    limit.algorithm.as_str(),
                ];
                let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                self.limits
                    .with_label_values(&values)
                    .set(clamp(limit.requests_per_unit));
                if limit.algorithm.refills() {
                    self.bursts
                        .with_label_values(&values)
                        .set(clamp(limit.capacity()));
                }
            }
        }
    }

    /// Drops the series of rules that `policy` no longer has (after a reload).
    fn retain(&self, policy: &Policy) {
        let live: HashSet<&str> = policy
            .rules()
            .iter()
            .map(|r| r.stats_key.as_str())
            .collect();
        // The fast-path cache refills itself from `handles`; rules may have changed flags.
        self.by_rule.write().clear();
        let mut handles = self.handles.write();
        let mut detailed = self.detailed.lock();
        handles.retain(|labels, (owner, _)| {
            let keep = owner.as_deref().is_none_or(|o| live.contains(o));
            if !keep {
                self.remove_series(labels);
                detailed.remove(labels);
            }
            keep
        });
    }

    fn handles(
        &self,
        labels: [String; 4],
        owner: Option<&crate::policy::Rule>,
    ) -> Arc<RuleHandles> {
        if let Some((_, h)) = self.handles.read().get(&labels) {
            return h.clone();
        }
        let values: Vec<&str> = labels.iter().map(String::as_str).collect();
        let r = &self.rules;
        let handles = Arc::new(RuleHandles {
            total_hits: r.total_hits.with_label_values(&values),
            within_limit: r.within_limit.with_label_values(&values),
            over_limit: r.over_limit.with_label_values(&values),
            near_limit: r.near_limit.with_label_values(&values),
            over_limit_with_local_cache: r.over_limit_with_local_cache.with_label_values(&values),
            shadow_mode: r.shadow_mode.with_label_values(&values),
            budget: owner.filter(|rule| has_budget(rule)).map(|_| {
                (
                    r.budget_units.with_label_values(&values),
                    r.budget_overdraft.with_label_values(&values),
                )
            }),
            last_used: self.now_secs().into(),
        });
        self.handles
            .write()
            .entry(labels)
            .or_insert((owner.map(|r| r.stats_key.clone()), handles))
            .1
            .clone()
    }

    /// The labels of an event's series, capping the detailed ones (and the length of the
    /// runtime values they carry).
    fn labels(&self, event: &LimitEvent<'_>) -> ([String; 4], bool) {
        let Some(rule) = event.rule else {
            // A request override: name it by its keys, never its values. The keys are request
            // text too: shortened, and capped with the detailed series.
            let keys: Vec<std::borrow::Cow<'_, str>> = event
                .descriptor
                .entries
                .iter()
                .map(|e| label_value(&e.key))
                .collect();
            let rule = label_value(&format!("{}.{}", event.domain, keys.join("."))).into_owned();
            let key = |i: usize| keys.get(i).map_or(String::new(), |k| k.to_string());
            let domain = label_value(event.domain).into_owned();
            return ([domain, rule, key(0), key(1)], true);
        };
        let detailed = rule.detailed_metric || rule.value_to_metric;
        let detailed_empty = rule.detailed_metric && rule.shared.iter().all(Option::is_none);
        let parts: Vec<String> = rule
            .levels
            .iter()
            .enumerate()
            .map(|(depth, level)| {
                let (key, configured) = (&level.key, &level.value);
                let shared = rule.shared.get(depth).is_some_and(Option::is_some);
                let runtime = event
                    .descriptor
                    .entries
                    .get(depth)
                    .map(|e| e.value.as_str());
                let wildcard = configured.as_deref().is_some_and(|v| v.contains('*'));
                let use_runtime = !shared
                    && (rule.detailed_metric
                        || (level.value_to_metric && (configured.is_none() || wildcard)));
                match (use_runtime, runtime, configured) {
                    // The reference writes `key_value` for every detailed level, `key_` for
                    // an empty value (unless the path shares a counter), and leaves an empty
                    // value_to_metric value out.
                    (true, Some(v), _) if !v.is_empty() || detailed_empty => {
                        format!("{key}_{}", label_value(v))
                    }
                    (_, _, Some(c)) => format!("{key}_{c}"),
                    _ => key.clone(),
                }
            })
            .collect();
        let name = if detailed {
            format!("{}.{}", event.domain, parts.join("."))
        } else {
            rule.stats_key.clone()
        };
        let part = |i: usize| parts.get(i).cloned().unwrap_or_default();
        ([event.domain.to_owned(), name, part(0), part(1)], detailed)
    }

    /// The series of an event not yet cached: labels computed, detailed ones capped.
    fn series(
        &self,
        event: &LimitEvent<'_>,
        hits: u64,
        plain: Option<&crate::policy::Rule>,
    ) -> Arc<RuleHandles> {
        let (mut labels, detailed) = self.labels(event);
        if detailed {
            let full = {
                let seen = self.detailed.lock();
                !seen.contains(&labels) && seen.len() >= self.max_detailed
            };
            // A full cap may hold idle override series: look for them at most every
            // [`SWEEP_EVERY`] (not on every request of a flood of new key sets).
            let now = self.now_secs();
            let last = self.last_sweep.load(std::sync::atomic::Ordering::Relaxed);
            if full
                && now.saturating_sub(last) >= SWEEP_EVERY
                && self
                    .last_sweep
                    .compare_exchange(
                        last,
                        now,
                        std::sync::atomic::Ordering::Relaxed,
                        std::sync::atomic::Ordering::Relaxed,
                    )
                    .is_ok()
            {
                self.sweep_idle_overrides();
            }
            let mut seen = self.detailed.lock();
            if !seen.contains(&labels) {
                if seen.len() >= self.max_detailed {
                    labels = [
                        labels[0].clone(),
                        OVERFLOW.to_owned(),
                        String::new(),
                        String::new(),
                    ];
                    self.series_overflow.inc_by(hits);
                } else {
                    seen.insert(labels.clone());
                }
            }
        }
        let h = self.handles(labels, event.rule);
        if event.rule.is_none() {
            h.last_used
                .store(self.now_secs(), std::sync::atomic::Ordering::Relaxed);
        }
        if let Some(rule) = plain {
            self.by_rule
                .write()
                .insert(rule.stats_key.clone(), h.clone());
        }
        h
    }

    /// Counts an event's hits as the reference does (`src/limiter/base_limiter.go`): all
    /// within the limit or all over, and of a refusal that crossed the limit, only the part
    /// past it over and the part between the near-limit threshold and the limit near.
    fn count(&self, h: &RuleHandles, event: &LimitEvent<'_>, hits: u64) {
        h.total_hits.inc_by(hits);
        let d = event.decision;
        if let Some((units, overdraft)) = h.budget.as_ref().filter(|_| event.limit.overdraft) {
            units.inc_by(hits);
            overdraft.inc_by(if d.allowed { 0 } else { d.overdraft.min(hits) });
        }
        if event.from_cache {
            h.over_limit.inc_by(hits);
            h.over_limit_with_local_cache.inc_by(hits);
            if event.rule.is_some_and(|r| r.shadow_mode) {
                h.shadow_mode.inc_by(hits);
            }
            return;
        }
        let limit = event.limit.algorithm_limit();
        let quota = limit.capacity();
        let near = (quota as f64 * self.near_limit_ratio).floor() as u64;
        if d.allowed {
            h.within_limit.inc_by(hits);
            // The count after these hits; for hits that fit in a request another descriptor
            // refused, which were not charged, the count as it stays (the reference's
            // STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT accounting).
            let after = quota.saturating_sub(d.remaining);
            let after = if event.charged {
                after
            } else {
                after.saturating_sub(hits)
            };
            if after > near {
                h.near_limit.inc_by((after - near).min(hits));
            }
            return;
        }
        // A refused counter was not charged: its remaining is what it had before; a shadow
        // rule's counter records the refused charge, and its count past the limit is the
        // decision's overdraft.
        let before = if event.rule.is_some_and(|r| r.shadow_mode) && d.overdraft > 0 {
            quota.saturating_add(d.overdraft).saturating_sub(hits)
        } else {
            quota.saturating_sub(d.remaining)
        };
        let (over, near_hits) = if before >= quota {
            (hits, 0)
        } else {
            let over = before
                .saturating_add(hits)
                .saturating_sub(quota)
                .clamp(1, hits);
            (
                over,
                quota.saturating_sub(near.max(before)).min(hits - over),
            )
        };
        h.over_limit.inc_by(over);
        h.near_limit.inc_by(near_hits);
        if event.rule.is_some_and(|r| r.shadow_mode) {
            h.shadow_mode.inc_by(over);
        }
    }
}

impl RuleMetrics {
    fn all(&self) -> [&IntCounterVec; 8] {
        [
            &self.total_hits,
            &self.within_limit,
            &self.over_limit,
            &self.near_limit,
            &self.over_limit_with_local_cache,
            &self.shadow_mode,
            &self.budget_units,
            &self.budget_overdraft,
        ]
    }
}

/// Whether any limit of `rule` is a usage budget.
fn has_budget(rule: &crate::policy::Rule) -> bool {
    matches!(&rule.limit, crate::policy::RuleLimit::Limited(limits) if limits.iter().any(|l| l.overdraft))
}

/// Runtime values longer than this many bytes are shortened in labels.
const MAX_LABEL_VALUE: usize = 128;

impl Observer for RuleSeries {
    fn limit_decided(&self, event: &LimitEvent<'_>) {
        let hits = event.descriptor.hits;
        if hits <= 0 {
            return; // refunds and peeks are not hits
        }
        let hits = hits as u64;
        let plain = event
            .rule
            .filter(|r| !r.detailed_metric && !r.value_to_metric);
        let cached = plain.and_then(|rule| self.by_rule.read().get(&rule.stats_key).cloned());
        let h = match cached {
            Some(h) => h,
            None => self.series(event, hits, plain),
        };
        self.count(&h, event, hits);
    }

    fn each_limit(&self, event: &LimitEvent<'_>) {
        self.ladders.decided(event);
    }

    fn domain_not_found(&self, domain: &str) {
        let domain = label_value(domain);
        let known = {
            let mut seen = self.unknown_domains.lock();
            seen.contains(domain.as_ref())
                || (seen.len() < MAX_UNKNOWN_DOMAINS && seen.insert(domain.clone().into_owned()))
        };
        let label = if known { domain.as_ref() } else { OVERFLOW };
        self.domain_not_found.with_label_values(&[label]).inc();
    }

    fn global_shadow_mode(&self) {
        self.global_shadow_mode.inc();
    }

    fn policy_swapped(&self, policy: &Policy) {
        self.retain(policy);
        self.set_limits(policy);
        self.ladders.policy_swapped(policy);
        self.refused_keys.follow(policy);
    }
}

/// A runtime value as a label carries it: as is, or, past [`MAX_LABEL_VALUE`] bytes, its first
/// 64 bytes, `~` and 16 hex digits of its SHA-256 (still one series per value, and a 1 MB header
/// value cannot make a 1 MB label; the detailed-series cap bounds how many there are).
pub(super) fn label_value(value: &str) -> std::borrow::Cow<'_, str> {
    if value.len() <= MAX_LABEL_VALUE {
        return value.into();
    }
    let mut end = 64;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = format!("{}~", &value[..end]);
    crate::store::push_sha256_hex(&mut out, value, 8);
    out.into()
}

#[cfg(test)]
mod tests;
