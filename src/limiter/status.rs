//! A request's answer, from its decisions: each descriptor's status (the limit that decides
//! it), the limits the response headers describe, and the merged metadata.

use std::collections::BTreeMap;

use crate::algorithm::Decision;
use crate::policy::{MetaValue, RateLimit, Rule, merge_into};

use super::{AppliedLimit, Code, Descriptor, DescriptorStatus, Plan, ReportedLimit};

/// What [`status`] needs to know about a counted descriptor.
pub(super) struct Described<'a> {
    pub(super) index: usize,
    pub(super) rule: Option<&'a Rule>,
    pub(super) policy: &'a str,
    pub(super) quota_mode: bool,
}

/// The status of a descriptor with one decision per limit: over if any limit is over
/// (reporting the one that makes the client wait longest), else the limit with the least
/// remaining. Every limit is also described in `applied` for the response headers.
pub(super) fn status(
    described: &Described<'_>,
    limits: &[RateLimit],
    decisions: &[Decision],
    uncharged: u64,
    applied: &mut Vec<AppliedLimit>,
) -> DescriptorStatus {
    let rule = described.rule;
    let shadow = rule.is_some_and(|r| r.shadow_mode);
    // A refused decision reports 0 left, as the reference does, whatever the counter still
    // holds for fewer hits (Envoy's X-RateLimit-Remaining on the 429 then says 0), shadow
    // rules included (they report what the rule would have said).
    let remaining = |limit: &RateLimit, d: &Decision| {
        if !d.allowed {
            return 0;
        }
        d.remaining
            .saturating_add(uncharged)
            .min(limit.requests_per_unit.max(limit.burst.unwrap_or(0)))
    };
    let over = |d: &Decision| !d.allowed && !shadow;
    let wait = |d: &Decision| {
        if over(d) {
            d.retry_after.unwrap_or(d.reset_after)
        } else {
            d.reset_after
        }
    };
    // A rule with `response_headers: false` is left out of what the client is told.
    let hidden = rule.is_some_and(|r| !r.response_headers);
    for (limit, d) in limits.iter().zip(decisions).filter(|_| !hidden) {
        let algorithm_limit = limit.algorithm_limit();
        applied.push(AppliedLimit {
            descriptor: described.index,
            policy: limit_name(limit, described),
            quota: algorithm_limit.capacity(),
            window: (!limit.algorithm.in_flight()).then_some(algorithm_limit.window),
            remaining: remaining(limit, d),
            reset_after: wait(d),
            over: over(d) && !described.quota_mode,
            quota_mode: described.quota_mode,
            shedding: rule.is_some_and(|r| r.priorities.is_some()),
        });
    }
    let pairs = limits.iter().zip(decisions);
    let chosen = pairs
        .clone()
        .filter(|(_, d)| over(d))
        .max_by_key(|(_, d)| wait(d))
        .or_else(|| pairs.min_by_key(|(l, d)| remaining(l, d)));
    let Some((limit, decision)) = chosen else {
        return DescriptorStatus {
            code: Code::Ok,
            limit: None,
            rule: None,
            remaining: 0,
            reset_after: None,
            hidden,
        };
    };
    DescriptorStatus {
        code: if over(decision) {
            Code::OverLimit
        } else {
            Code::Ok
        },
        limit: reported(limit),
        rule: Some(limit_name(limit, described)),
        remaining: clamp_u32(remaining(limit, decision)),
        reset_after: Some(wait(decision)),
        hidden,
    }
}

/// What names `limit` to the client and in the dynamic metadata: its `name:`, else the
/// rule's stats key (the policy).
fn limit_name(limit: &RateLimit, described: &Described<'_>) -> String {
    limit
        .name
        .clone()
        .unwrap_or_else(|| described.policy.to_owned())
}

/// `limit` as the status's `current_limit` says it. Envoy's `RateLimit` has no multiplier: a
/// unit would state a window the limit does not have, and Envoy's x-ratelimit-* headers would
/// lie, so a window of N units reports none (Sluice's own RateLimit-Policy and Retry-After
/// carry its exact length). Its `requests_per_unit` is 32-bit: a larger limit (a usage
/// budget's) reports none either, rather than a smaller limit than the real one, and the
/// remaining budget saturates at 4294967295 ("at least").
fn reported(limit: &RateLimit) -> Option<ReportedLimit> {
    let requests_per_unit = u32::try_from(limit.requests_per_unit).ok()?;
    (limit.unit_multiplier == 1).then(|| ReportedLimit {
        requests_per_unit,
        unit: limit.unit,
        name: limit.name.clone(),
    })
}

/// The `metadata` of every counted rule whose descriptor is not over the limit, merged in
/// request order (the reference's dynamic metadata, which leaves `unlimited` rules out);
/// `None` when there is none.
pub(super) fn merged_metadata(
    plans: &[Plan<'_>],
    statuses: &[DescriptorStatus],
) -> Option<BTreeMap<String, MetaValue>> {
    let mut merged: Option<BTreeMap<String, MetaValue>> = None;
    for (plan, status) in plans.iter().zip(statuses) {
        let Plan::Counted {
            rule: Some(rule), ..
        } = plan
        else {
            continue;
        };
        if let Some(metadata) = &rule.metadata
            && status.code != Code::OverLimit
        {
            merge_into(merged.get_or_insert_with(BTreeMap::new), metadata);
        }
    }
    merged
}

/// The reference's key for a request override: `domain.key_value.key2_value2`.
pub(super) fn override_key(domain: &str, descriptor: &Descriptor) -> String {
    let mut key = domain.to_owned();
    for entry in &descriptor.entries {
        key.push('.');
        key.push_str(&entry.key);
        if !entry.value.is_empty() {
            key.push('_');
            key.push_str(&entry.value);
        }
    }
    key
}

fn clamp_u32(n: u64) -> u32 {
    n.min(u64::from(u32::MAX)) as u32
}
