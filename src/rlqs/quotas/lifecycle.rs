//! What happens to buckets and streams over time: TTL renewals and abandons, a reload's new
//! quotas, the drain.

use std::sync::Arc;
use std::time::Duration;

use super::{DRAIN_TTL, Entry, Quotas, State, encodable, leave};
use crate::rlqs::bucket::Quota;
use crate::rlqs::budget::{BudgetState, REPORT_INTERVAL, SETTLE};
use crate::rlqs::outbox::{Action, Assigned};
use crate::rlqs::share::Share;
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
                    tracked.ttl_until = now + ttl as f64;
                    s.outbox
                        .push(tracked.bucket.clone(), Action::Assign(assigned, ttl));
                    self.count_assignment(assigned);
                }
            }
            for id in abandoned {
                let tracked = s.buckets.remove(&id).expect("listed");
                *buckets -= 1;
                if tracked.divided {
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
        let policy = self.limiter.policy();
        if Arc::ptr_eq(&policy, &state.policy) {
            return;
        }
        state.policy = policy.clone();
        let shadow = self.limiter.options().shadow_mode;
        let ttl = self.ttl();
        let State {
            streams, budgets, ..
        } = state;
        for (&stream, s) in streams.iter_mut() {
            for (id, tracked) in &mut s.buckets {
                let quota = Quota::of(&policy, &tracked.domain, &tracked.bucket, shadow);
                if quota == tracked.quota {
                    continue;
                }
                let divided = matches!(quota, Quota::Divided { .. });
                if tracked.divided {
                    if divided {
                        if let (
                            Some(entry),
                            Quota::Divided {
                                budget: b,
                                rule,
                                shadow,
                            },
                        ) = (budgets.get_mut(id), &quota)
                        {
                            let claim = entry.state.claim().min(b.share_of(b.rate));
                            entry.state.set_claim(b.share_of(claim.rate), *b);
                            entry.rule = rule.clone();
                            entry.shadow = *shadow;
                            entry.claim_due = now;
                            // A new window with the same share would be kept by Envoy 1.40
                            // as it was: it is sent now, one token lower.
                            if let Some(Assigned::Bucket(share, window)) = tracked.assigned
                                && window != b.window
                                && !*shadow
                            {
                                let assigned = encodable(tracked.assigned, share, b.window);
                                tracked.assigned = Some(assigned);
                                tracked.ttl_until = now + ttl as f64;
                                s.outbox
                                    .push(tracked.bucket.clone(), Action::Assign(assigned, ttl));
                                self.count_assignment(assigned);
                            }
                        }
                    } else {
                        leave(budgets, id, stream, tracked.ttl_until.max(now));
                    }
                }
                if let Quota::Divided {
                    budget: b,
                    rule,
                    shadow,
                } = &quota
                {
                    let entry = budgets.entry(id.clone()).or_insert_with(|| Entry {
                        state: BudgetState::new(*b, Share::default(), now, false),
                        domain: tracked.domain.clone(),
                        rule: rule.clone(),
                        shadow: *shadow,
                        claimed: false,
                        claim_due: now,
                    });
                    entry.state.report(stream, 0, 0, now);
                }
                let assigned = match &quota {
                    Quota::AllowAll { .. } | Quota::Divided { shadow: true, .. } => {
                        Some(Assigned::AllowAll)
                    }
                    Quota::DenyAll { .. } => Some(Assigned::DenyAll),
                    Quota::Divided { .. } => None,
                };
                if let Some(assigned) = assigned {
                    tracked.assigned = Some(assigned);
                    tracked.ttl_until = now + ttl as f64;
                    s.outbox
                        .push(tracked.bucket.clone(), Action::Assign(assigned, ttl));
                    self.count_assignment(assigned);
                }
                tracked.quota = quota;
                tracked.divided = divided;
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
