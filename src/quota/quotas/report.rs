//! A usage report: the stream's report rate, each bucket tracked (or refused past a cap),
//! its usage counted in its budget, and the new buckets answered.

use std::collections::HashMap;
use std::collections::hash_map::Entry as Slot;

use super::{
    Entry, Quotas, ReportSummary, State, StreamState, Tracked, Usage, blanket, bucket_key,
};
use crate::algorithm::token_bucket;
use crate::quota::bucket::BucketKey;
use crate::quota::bucket::Quota;
use crate::quota::budget::{PeerId, StreamId};
use crate::quota::outbox::Outbox;
use crate::quota::outbox::{Action, Assigned};

/// A bucket of a report, on its stream.
enum Tracking<'s> {
    /// Tracked already.
    Known(&'s mut Tracked),
    /// Tracked from this report on.
    New(&'s mut Tracked),
    /// Past a cap: answered DENY_ALL, untracked.
    OverCap,
}

impl Quotas {
    /// A usage report from `stream`: new buckets are answered at once.
    pub async fn report(
        &self,
        stream: StreamId,
        domain: &str,
        usages: Vec<Usage>,
    ) -> ReportSummary {
        let now = self.now();
        let (unclaimed, mut summary) = {
            let mut state = self.state.lock();
            self.record(&mut state, stream, domain, usages, now)
        };
        if !unclaimed.is_empty() {
            summary.actions += self.claim_and_step(unclaimed, now).await;
        }
        summary
    }

    /// Applies a report; answers the budgets that need a first claim, and what it did.
    fn record(
        &self,
        state: &mut State,
        stream: StreamId,
        domain: &str,
        usages: Vec<Usage>,
        now: f64,
    ) -> (Vec<String>, ReportSummary) {
        let mut summary = ReportSummary {
            buckets: usages.len(),
            ..ReportSummary::default()
        };
        let State {
            policy,
            streams,
            budgets,
            buckets,
            ..
        } = state;
        let Some(s) = streams.get_mut(&stream) else {
            return (Vec::new(), summary);
        };
        if !self.admit_report(s) {
            summary.dropped = true;
            return (Vec::new(), summary);
        }
        let ttl = self.ttl();
        let mut fresh = Vec::new();
        let mut touched = Vec::new();
        for usage in &usages {
            let key = match &usage.bucket {
                Ok(key) => key,
                Err(reason) => {
                    self.rejected(reason.label());
                    continue;
                }
            };
            let id = bucket_key(domain, key);
            let tracked = match self.track(
                (&mut s.buckets, &s.outbox),
                buckets,
                (policy, domain),
                key,
                &id,
                now,
            ) {
                Tracking::Known(tracked) => tracked,
                Tracking::New(tracked) => {
                    fresh.push(id.clone());
                    tracked
                }
                Tracking::OverCap => {
                    summary.actions += 1;
                    continue;
                }
            };
            if usage.allowed > 0 || usage.denied > 0 {
                tracked.active_at = now;
            }
            if self.report_budget(budgets, (stream, s.peer), &id, tracked, usage, now) {
                touched.push(id);
            }
        }
        summary.new_buckets = fresh.len();
        summary.actions += self.answer_new(s, &fresh, ttl, now);
        if let Some(m) = &self.metrics {
            m.buckets.set(*buckets as i64);
        }
        touched.sort_unstable();
        touched.dedup();
        let unclaimed = touched
            .into_iter()
            .filter(|k| budgets.get(k).is_some_and(|e| !e.shadow))
            .collect();
        (unclaimed, summary)
    }

    /// The bucket `key` (by its `id`) on stream `s`: tracked already, tracked from now on, or
    /// answered DENY_ALL untracked past a cap (`total` buckets on all streams).
    fn track<'s>(
        &self,
        (tracked, outbox): (&'s mut HashMap<String, Tracked>, &Outbox),
        total: &mut usize,
        (policy, domain): (&crate::policy::Policy, &str),
        key: &BucketKey,
        id: &str,
        now: f64,
    ) -> Tracking<'s> {
        let on_stream = tracked.len();
        match tracked.entry(id.to_owned()) {
            Slot::Occupied(known) => Tracking::Known(known.into_mut()),
            Slot::Vacant(new) => {
                if let Some(reason) = self.over_cap(on_stream, *total) {
                    self.rejected(reason);
                    let ttl = self.ttl();
                    outbox.push(key.clone(), Action::Assign(Assigned::DenyAll, ttl));
                    self.count_assignment(Assigned::DenyAll);
                    return Tracking::OverCap;
                }
                *total += 1;
                let shadow = self.rules.shadow_mode();
                Tracking::New(new.insert(Tracked {
                    domain: domain.to_owned(),
                    bucket: key.clone(),
                    quota: Quota::of(policy, domain, key, shadow),
                    assigned: None,
                    ttl_until: now,
                    active_at: now,
                }))
            }
        }
    }

    /// Answers the new buckets `fresh` of `s` that need no division (a blanket rule);
    /// answers how many.
    fn answer_new(&self, s: &mut StreamState, fresh: &[String], ttl: u64, now: f64) -> usize {
        let mut answered = 0;
        for id in fresh {
            let tracked = s.buckets.get_mut(id).expect("tracked");
            if let Some(assigned) = blanket(&tracked.quota) {
                self.send(&s.outbox, tracked, assigned, ttl, now);
                answered += 1;
            }
        }
        answered
    }

    /// The stream's report rate limit: whether this report at `now` counts (a dropped one is
    /// counted in the metrics).
    fn admit_report(&self, s: &mut StreamState) -> bool {
        let limit = self.report_limit();
        let now = self.clock.now();
        let (decision, bucket) = token_bucket::decide(s.reports.as_ref(), &limit, now, 1);
        let admitted = decision.allowed;
        if admitted {
            s.reports = Some(bucket);
        }
        if let Some(m) = &self.metrics {
            if admitted {
                m.reports.inc();
            } else {
                m.reports_dropped.inc();
            }
        }
        admitted
    }

    /// Why a new bucket is not tracked, with `on_stream` tracked on its stream and `total` on
    /// all: the cap it would pass.
    fn over_cap(&self, on_stream: usize, total: usize) -> Option<&'static str> {
        if on_stream >= self.options.max_buckets_per_stream {
            Some("over_stream_cap")
        } else if total >= self.options.max_buckets {
            Some("over_instance_cap")
        } else {
            None
        }
    }

    /// A divided bucket's usage reaches its budget `id` (made on first sight); shadow mode
    /// counts what it would have denied. Answers whether the stream waits for its first
    /// share.
    fn report_budget(
        &self,
        budgets: &mut HashMap<String, Entry>,
        (stream, peer): (StreamId, PeerId),
        id: &str,
        tracked: &Tracked,
        usage: &Usage,
        now: f64,
    ) -> bool {
        let Quota::Divided {
            rule,
            budget,
            shadow,
        } = &tracked.quota
        else {
            return false;
        };
        let entry = budgets
            .entry(id.to_owned())
            .or_insert_with(|| Entry::new(*budget, &tracked.domain, rule, *shadow, now));
        entry.state.report_seen(
            (stream, peer),
            usage.allowed,
            usage.denied,
            now,
            usage.first_sight,
        );
        if entry.shadow {
            let over = entry.state.shadow_admitted(usage.allowed, now);
            if let (Some(m), true) = (&self.metrics, over > 0) {
                m.shadow_denied
                    .with_label_values(&[&tracked.domain, &entry.rule])
                    .inc_by(over);
            }
        }
        entry.state.sent(stream).is_none()
    }
}
