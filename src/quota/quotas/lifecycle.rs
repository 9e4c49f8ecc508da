//! What happens to buckets and streams over time: TTL renewals and abandons, a reload's new
//! quotas, the drain.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::{DRAIN_TTL, Entry, Quotas, State, StreamState, Tracked, blanket, encodable, leave};
use crate::quota::bucket::Quota;
use crate::quota::budget::{REPORT_INTERVAL, SETTLE, StreamId};
use crate::quota::outbox::{Action, Assigned};
use crate::store::ClaimAsk;

impl Quotas {
    /// Re-sends assignments with half their TTL left; abandons idle buckets.
    pub(super) fn renew_and_abandon(&self, state: &mut State, now: f64) {
        let ttl = self.ttl();
        let idle_for = f64::from(self.options.abandon_after_reports) * REPORT_INTERVAL;
        let State {
            streams,
            budgets,
            buckets,
            ..
        } = state;
        for (&stream, s) in streams.iter_mut() {
            let mut abandoned = Vec::new();
            for (id, tracked) in &mut s.buckets {
                if now - tracked.active_at >= idle_for {
                    abandoned.push(id.clone());
                    continue;
                }
                if let Some(assigned) = tracked.assigned
                    && tracked.ttl_until - now < ttl as f64 / 2.0
                {
                    self.send(&s.outbox, tracked, assigned, ttl, now);
                }
            }
            for id in abandoned {
                let tracked = s.buckets.remove(&id).expect("listed");
                *buckets -= 1;
                if tracked.quota.is_divided() {
                    // Envoy forgets the bucket when the action arrives.
                    leave(budgets, &id, stream, now + 2.0 * SETTLE);
                }
                s.outbox.push(tracked.bucket, Action::Abandon);
                if let Some(m) = &self.metrics {
                    m.abandoned.inc();
                }
            }
        }
    }

    /// A reload: every bucket's quota again; changed ones are re-sent.
    pub(super) fn follow_policy(&self, state: &mut State, now: f64) {
        let policy = self.rules.policy();
        if Arc::ptr_eq(&policy, &state.policy) {
            return;
        }
        state.policy = policy.clone();
        let shadow = self.rules.shadow_mode();
        let ttl = self.ttl();
        let State {
            streams, budgets, ..
        } = state;
        for (&stream, s) in streams.iter_mut() {
            let StreamState {
                outbox, buckets, ..
            } = s;
            for (id, tracked) in buckets.iter_mut() {
                let quota = Quota::of(&policy, &tracked.domain, &tracked.bucket, shadow);
                if quota == tracked.quota {
                    continue;
                }
                if let Some(assigned) = requota(budgets, stream, id, tracked, quota, now) {
                    self.send(outbox, tracked, assigned, ttl, now);
                }
            }
        }
    }

    /// Short TTLs on every stream, then the streams close and the claims end soon after.
    pub async fn drain(&self) {
        let ttl = DRAIN_TTL.as_secs();
        let asks: Vec<ClaimAsk> = {
            let mut state = self.state.lock();
            state.draining = true;
            for s in state.streams.values() {
                for tracked in s.buckets.values() {
                    if let Some(assigned) = tracked.assigned {
                        s.outbox
                            .push(tracked.bucket.clone(), Action::Assign(assigned, ttl));
                    }
                }
                s.outbox.close();
            }
            state
                .budgets
                .iter()
                .filter(|(_, e)| e.claimed && !e.shadow)
                .map(|(k, e)| ClaimAsk {
                    ttl: DRAIN_TTL + Duration::from_secs(1),
                    ..self.ask(k, e)
                })
                .collect()
        };
        let _ = self.claims(&asks).await;
    }
}

/// `tracked` (on `stream`, key `id`) gets `quota` on a reload: its budget takes the new
/// numbers, is left, or is made. Answers what to send at once: a blanket rule, or a share
/// whose window alone changed (Envoy 1.40 would keep it as it was: it goes one token lower).
fn requota(
    budgets: &mut HashMap<String, Entry>,
    stream: StreamId,
    id: &str,
    tracked: &mut Tracked,
    quota: Quota,
    now: f64,
) -> Option<Assigned> {
    let mut send = None;
    match (&tracked.quota, &quota) {
        (
            Quota::Divided { .. },
            Quota::Divided {
                budget: b,
                rule,
                shadow,
            },
        ) => {
            if let Some(entry) = budgets.get_mut(id) {
                let claim = entry.state.claim().min(b.share_of(b.rate));
                entry.state.set_claim(b.share_of(claim.rate), *b);
                entry.rule = rule.clone();
                entry.shadow = *shadow;
                entry.claim_due = now;
                if let Some(Assigned::Bucket(share, window)) = tracked.assigned
                    && window != b.window
                    && !*shadow
                {
                    send = Some(encodable(tracked.assigned, share, b.window));
                }
            }
        }
        (Quota::Divided { .. }, _) => leave(budgets, id, stream, tracked.ttl_until.max(now)),
        _ => {}
    }
    if let Quota::Divided {
        budget: b,
        rule,
        shadow,
    } = &quota
    {
        budgets
            .entry(id.to_owned())
            .or_insert_with(|| Entry::new(*b, &tracked.domain, rule, *shadow, now))
            .state
            .report(stream, 0, 0, now);
    }
    tracked.quota = quota;
    send.or_else(|| blanket(&tracked.quota))
}
