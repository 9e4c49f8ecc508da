//! What the RLQS state shows: the per-rule gauges, one bucket explained (`sluice explain
//! --bucket`, `GET /counters?bucket=`) and the `/rlconfig` lines.

use super::{Quotas, State, bucket_key};
use crate::quota::bucket::{BucketKey, Quota};
use crate::quota::budget::StreamId;
use crate::quota::share::Share;

impl Quotas {
    pub(super) fn observe(&self, state: &State) {
        let Some(m) = &self.metrics else { return };
        m.demand.reset();
        m.granted.reset();
        for entry in state.budgets.values() {
            let labels = [entry.domain.as_str(), entry.rule.as_str()];
            let window = entry.state.budget.window as f64;
            m.demand
                .with_label_values(&labels)
                .add(entry.state.demand() / window);
            if !entry.shadow {
                m.granted
                    .with_label_values(&labels)
                    .add(entry.state.held().rate as f64 / window);
            }
        }
        m.buckets.set(state.buckets as i64);
    }

    /// What the bucket `key` of `domain` gets: its rule and order, and what this instance
    /// knows of its budget.
    pub fn explain(&self, domain: &str, key: &BucketKey) -> BucketView {
        let policy = self.rules.policy();
        let pairs: Vec<(&str, &str)> = key
            .pairs()
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let order = policy
            .domain(domain)
            .and_then(|d| d.find_unordered(&pairs))
            .map(|(order, _)| {
                order
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        let quota = Quota::of(&policy, domain, key, self.rules.shadow_mode());
        let state = self.state.lock();
        let budget = state
            .budgets
            .get(&bucket_key(domain, key))
            .map(|e| BudgetView {
                claim: e.state.claim(),
                held: e.state.held(),
                demand: e.state.demand(),
                shares: e.state.shares(),
            });
        let tracked = budget.is_some()
            || state
                .streams
                .values()
                .any(|s| s.buckets.contains_key(&bucket_key(domain, key)));
        BucketView {
            order,
            quota,
            tracked,
            budget,
        }
    }

    /// One line per budget for `/rlconfig`: rule, bucket, budget, this instance's claim,
    /// what it hands out, the demand and the streams.
    pub fn dump(&self) -> String {
        use std::fmt::Write as _;
        let state = self.state.lock();
        let mut lines: Vec<String> = state
            .budgets
            .iter()
            .map(|(key, e)| {
                let b = e.state.budget;
                let mut line = String::new();
                let _ = write!(
                    line,
                    "rlqs {}: bucket {} budget {} per {} s burst {}{}: claim {} held {} demand {:.1} streams {}",
                    e.rule,
                    key.split_once('\n').map_or(key.as_str(), |(_, b)| b),
                    b.rate,
                    b.window,
                    b.burst,
                    if e.shadow { " (shadow)" } else { "" },
                    e.state.claim().rate,
                    e.state.held().rate,
                    e.state.demand(),
                    e.state.streams(),
                );
                line
            })
            .collect();
        lines.sort();
        let mut out = lines.join("\n");
        if !out.is_empty() {
            out.push('\n');
        }
        out
    }
}

/// What [`Quotas::explain`] answers.
#[derive(Debug, Clone)]
pub struct BucketView {
    /// The pairs in the descriptor tree's order (empty: no rule).
    pub order: Vec<(String, String)>,
    /// What the bucket gets.
    pub quota: Quota,
    /// Whether an Envoy on this instance reports it.
    pub tracked: bool,
    /// This instance's part of its budget, for a divided quota.
    pub budget: Option<BudgetView>,
}

/// This instance's part of a budget.
#[derive(Debug, Clone)]
pub struct BudgetView {
    /// Its claim (the whole budget alone).
    pub claim: Share,
    /// What its Envoys hold, closed streams' shares included.
    pub held: Share,
    /// Their demand, requests per window.
    pub demand: f64,
    /// Each stream's last share (`None` before its first) and demand.
    pub shares: Vec<(StreamId, Option<Share>, f64)>,
}
