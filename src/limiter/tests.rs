// Why one long file: DESIGN §3's request semantics, one test each, sharing the manual clock and
// request builders.
//! Request semantics of DESIGN §3, against the memory store and a manual clock.

use super::*;
use crate::algorithm::SECOND;
use crate::clock::ManualClock;
use crate::policy::Unit;

const CONFIG: &str = r#"
domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3, name: per_user}
  - key: vip
    rate_limit: {unit: minute, requests_per_unit: 100, name: vip, replaces: [{name: per_user}]}
  - key: free
    metadata: {tier: free}
    rate_limit: {unlimited: true}
  - key: open
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota_a
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota_b
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: closed
    rate_limit: {unit: second, requests_per_unit: 0}
"#;

/// 10 s into a minute window.
const START: u64 = 1_700_000_000 * SECOND - (1_700_000_000 % 60) * SECOND + 10 * SECOND;

fn limiter_with(options: LimiterOptions) -> (Limiter, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(START));
    (Limiter::for_tests(CONFIG, options, clock.clone()), clock)
}

fn limiter() -> (Limiter, Arc<ManualClock>) {
    limiter_with(LimiterOptions::default())
}

fn descriptor(entries: &[(&str, &str)], hits: i64) -> Descriptor {
    Descriptor::of(entries, hits)
}

fn request(descriptors: Vec<Descriptor>) -> Request {
    Request::of("d", descriptors)
}

async fn check(limiter: &Limiter, descriptors: Vec<Descriptor>) -> Response {
    limiter.check(&request(descriptors)).await.unwrap()
}

fn one(key: &str, value: &str) -> Vec<Descriptor> {
    vec![descriptor(&[(key, value)], 1)]
}

#[tokio::test]
async fn over_limit_after_requests_per_unit_hits() {
    let (limiter, _) = limiter();
    for remaining in [2, 1, 0] {
        let r = check(&limiter, one("user", "alice")).await;
        assert_eq!(r.code, Code::Ok);
        assert_eq!(r.statuses[0].remaining, remaining);
        assert_eq!(r.statuses[0].reset_after, Some(50 * SECOND));
    }
    let r = check(&limiter, one("user", "alice")).await;
    assert_eq!(r.code, Code::OverLimit);
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    assert_eq!(r.retry_after(), Some(50 * SECOND));
    assert_eq!(
        r.statuses[0].limit,
        Some(ReportedLimit {
            requests_per_unit: 3,
            unit: Unit::Minute,
            name: Some("per_user".into())
        })
    );
    // Another value of the same key has its own counter.
    assert_eq!(check(&limiter, one("user", "bob")).await.code, Code::Ok);
}

#[tokio::test]
async fn the_next_window_restores_the_budget() {
    let (limiter, clock) = limiter();
    for _ in 0..3 {
        check(&limiter, one("user", "alice")).await;
    }
    clock.advance(50 * SECOND);
    let r = check(&limiter, one("user", "alice")).await;
    assert_eq!((r.code, r.statuses[0].remaining), (Code::Ok, 2));
}

#[tokio::test]
async fn a_rejected_request_charges_nothing_on_any_descriptor() {
    let (limiter, _) = limiter();
    check(&limiter, one("shadow", "x")).await; // unrelated warm-up
    for _ in 0..3 {
        check(&limiter, one("user", "full")).await;
    }
    // `user=fresh` fits, `user=full` does not: the request is rejected and `fresh` keeps
    // its whole budget.
    let r = check(
        &limiter,
        vec![
            descriptor(&[("user", "fresh")], 1),
            descriptor(&[("user", "full")], 1),
        ],
    )
    .await;
    assert_eq!(r.code, Code::OverLimit);
    assert_eq!(r.statuses[0].code, Code::Ok);
    assert_eq!(r.statuses[0].remaining, 3);
    let r = check(&limiter, one("user", "fresh")).await;
    assert_eq!(r.statuses[0].remaining, 2);
}

#[tokio::test]
async fn zero_descriptor_hits_checks_without_charging() {
    let (limiter, _) = limiter();
    check(&limiter, one("user", "alice")).await;
    for _ in 0..5 {
        let r = check(&limiter, vec![descriptor(&[("user", "alice")], 0)]).await;
        assert_eq!((r.code, r.statuses[0].remaining), (Code::Ok, 2));
    }
}

#[tokio::test]
async fn hits_above_one_are_charged_whole_or_not_at_all() {
    let (limiter, _) = limiter();
    let r = check(&limiter, vec![descriptor(&[("user", "alice")], 2)]).await;
    assert_eq!(r.statuses[0].remaining, 1);
    // Refused: the status says 0 left, as the reference's does, though 1 hit would fit.
    let r = check(&limiter, vec![descriptor(&[("user", "alice")], 2)]).await;
    assert_eq!((r.code, r.statuses[0].remaining), (Code::OverLimit, 0));
    let r = check(&limiter, one("user", "alice")).await;
    assert_eq!((r.code, r.statuses[0].remaining), (Code::Ok, 0));
}

#[tokio::test]
async fn negative_hits_refund_the_budget() {
    let (limiter, _) = limiter();
    for _ in 0..3 {
        check(&limiter, one("user", "alice")).await;
    }
    let r = check(&limiter, vec![descriptor(&[("user", "alice")], -2)]).await;
    assert_eq!((r.code, r.statuses[0].remaining), (Code::Ok, 2));
    // Refunds never create capacity beyond the limit.
    let r = check(&limiter, vec![descriptor(&[("user", "alice")], -100)]).await;
    assert_eq!(r.statuses[0].remaining, 3);
}

#[tokio::test]
async fn unlimited_whitelisted_and_unmatched_descriptors_are_ok_without_a_limit() {
    let (limiter, _) = limiter();
    let r = check(
        &limiter,
        vec![
            descriptor(&[("free", "x")], 1),
            descriptor(&[("open", "x")], 1),
            descriptor(&[("nothing", "x")], 1),
            descriptor(&[("user", "x"), ("too", "deep")], 1),
        ],
    )
    .await;
    assert_eq!(r.code, Code::Ok);
    let remaining: Vec<_> = r
        .statuses
        .iter()
        .map(|s| (s.remaining, s.limit.is_none()))
        .collect();
    assert_eq!(
        remaining,
        [(UNLIMITED_REMAINING, true), (0, true), (0, true), (0, true)]
    );
}

#[tokio::test]
async fn unknown_domain_is_ok_and_counts_nothing() {
    let (limiter, _) = limiter();
    let mut req = request(one("user", "alice"));
    req.domain = "other".into();
    let r = limiter.check(&req).await.unwrap();
    assert_eq!(r.code, Code::Ok);
    assert!(r.statuses[0].limit.is_none());
    assert!(limiter.store().status().tracked_keys == Some(0));
}

#[tokio::test]
async fn replaced_limits_are_dropped_within_one_request() {
    let (limiter, _) = limiter();
    for _ in 0..3 {
        check(&limiter, one("user", "alice")).await;
    }
    // Alone, `user=alice` is over; with a `vip` descriptor that replaces `per_user`, not.
    let r = check(
        &limiter,
        vec![
            descriptor(&[("user", "alice")], 1),
            descriptor(&[("vip", "alice")], 1),
        ],
    )
    .await;
    assert_eq!(r.code, Code::Ok);
    assert!(r.statuses[0].limit.is_none());
    assert_eq!(r.statuses[1].remaining, 99);
}

#[tokio::test]
async fn shadow_mode_rules_count_but_never_reject() {
    let (limiter, _) = limiter();
    assert_eq!(
        check(&limiter, one("shadow", "x")).await.statuses[0].remaining,
        0
    );
    let r = check(&limiter, one("shadow", "x")).await;
    assert_eq!((r.code, r.statuses[0].code), (Code::Ok, Code::Ok));
    assert_eq!(r.statuses[0].remaining, 0);
}

#[tokio::test]
async fn global_shadow_mode_answers_ok_but_keeps_statuses() {
    let (limiter, _) = limiter_with(LimiterOptions {
        shadow_mode: true,
        ..Default::default()
    });
    let r = check(&limiter, one("closed", "x")).await;
    assert_eq!(r.code, Code::Ok);
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    assert_eq!(r.retry_after(), None);
}

#[tokio::test]
async fn quota_descriptors_reject_only_when_all_are_over() {
    let (limiter, _) = limiter();
    check(&limiter, one("quota_a", "x")).await;
    let both = || {
        vec![
            descriptor(&[("quota_a", "x")], 1),
            descriptor(&[("quota_b", "x")], 1),
        ]
    };
    let r = check(&limiter, both()).await;
    assert_eq!(r.code, Code::Ok);
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    assert_eq!(r.statuses[1].code, Code::Ok);
    let r = check(&limiter, both()).await;
    assert_eq!(r.code, Code::OverLimit);
}

#[tokio::test]
async fn zero_requests_per_unit_is_always_over_and_retry_points_at_the_window_end() {
    let (limiter, _) = limiter();
    let r = check(&limiter, one("closed", "x")).await;
    assert_eq!(r.code, Code::OverLimit);
    assert_eq!(r.retry_after(), Some(SECOND));
}

#[tokio::test]
async fn a_request_override_replaces_the_configured_limit() {
    let (limiter, _) = limiter();
    let mut d = descriptor(&[("user", "alice")], 1);
    d.limit = Some(LimitOverride {
        requests_per_unit: 1,
        unit: Unit::Hour,
    });
    let r = check(&limiter, vec![d.clone()]).await;
    assert_eq!(r.statuses[0].limit.as_ref().unwrap().unit, Unit::Hour);
    assert_eq!(r.statuses[0].limit.as_ref().unwrap().name, None);
    assert_eq!(check(&limiter, vec![d]).await.code, Code::OverLimit);
    // The configured per-minute counter is separate and untouched.
    assert_eq!(
        check(&limiter, one("user", "alice")).await.statuses[0].remaining,
        2
    );
}

#[tokio::test]
async fn malformed_requests_are_invalid_arguments() {
    let (limiter, _) = limiter();
    let cases = [
        (
            Request::of("", one("user", "a")),
            "domain must not be empty",
        ),
        (request(vec![]), "descriptor list must not be empty"),
        (
            request(vec![descriptor(&[], 1)]),
            "descriptor 0 has no entries",
        ),
        (
            request(vec![Descriptor {
                limit: Some(LimitOverride {
                    requests_per_unit: 0,
                    unit: Unit::Second,
                }),
                ..descriptor(&[("user", "a")], 1)
            }]),
            "requests_per_unit > 0",
        ),
    ];
    for (request, expected) in cases {
        match limiter.check(&request).await {
            Err(LimitError::InvalidRequest(message)) => {
                assert!(message.contains(expected), "{message}")
            }
            other => panic!("expected an invalid request error, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_new_policy_applies_to_the_next_request() {
    let (limiter, _) = limiter();
    let strict = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
    limiter.set_policy(Arc::new(crate::config::policy_for_tests(strict)));
    assert_eq!(
        check(&limiter, one("user", "z")).await.statuses[0].remaining,
        0
    );
}

#[tokio::test]
async fn global_quota_mode_treats_unlimited_descriptors_as_within_quota() {
    let (limiter, _) = limiter_with(LimiterOptions {
        quota_mode: true,
        ..Default::default()
    });
    let closed = || descriptor(&[("closed", "x")], 1);
    // Alone, the always-over descriptor is every quota descriptor of the request.
    let r = check(&limiter, vec![closed()]).await;
    assert_eq!(r.code, Code::OverLimit);
    // With a descriptor that has no limit (a quota descriptor never over), it is not.
    let r = check(&limiter, vec![closed(), descriptor(&[("nothing", "x")], 1)]).await;
    assert_eq!(r.code, Code::Ok);
    assert_eq!(r.statuses[0].code, Code::OverLimit);
}

#[tokio::test]
async fn priority_classes_share_one_counter_up_to_their_share() {
    let yaml = "domain: shed\ndescriptors:\n  - key: priority\n    priorities: {critical: 1.0, low: 0.5}\n    rate_limit: {unit: minute, requests_per_unit: 4, algorithm: concurrency}\n";
    let clock = Arc::new(ManualClock::new(START));
    let limiter = Limiter::for_tests(yaml, LimiterOptions::default(), clock);
    let ask = |class: &str, hits: i64| {
        Request::of("shed", vec![descriptor(&[("priority", class)], hits)])
    };
    // Every acquisition is released afterwards, refused ones too, as Envoy does.
    let request = |class: &'static str| {
        let limiter = &limiter;
        async move {
            let code = limiter.check(&ask(class, 1)).await.unwrap().code;
            if code == Code::OverLimit {
                limiter.check(&ask(class, -1)).await.unwrap();
            }
            code
        }
    };
    // Low may fill half of the shared capacity ...
    assert_eq!(request("low").await, Code::Ok);
    assert_eq!(request("low").await, Code::Ok);
    let shed = limiter.check(&ask("low", 1)).await.unwrap();
    assert_eq!(shed.code, Code::OverLimit);
    assert_eq!(
        shed.statuses[0].limit.as_ref().unwrap().requests_per_unit,
        2
    );
    limiter.check(&ask("low", -1)).await.unwrap();
    // ... an unnamed class gets the lowest share ...
    assert_eq!(request("batch").await, Code::OverLimit);
    // ... while critical still has the top half.
    assert_eq!(request("critical").await, Code::Ok);
    assert_eq!(request("critical").await, Code::Ok);
    assert_eq!(request("critical").await, Code::OverLimit);
    // A release by any class frees capacity for everyone.
    limiter.check(&ask("critical", -3)).await.unwrap();
    assert_eq!(request("low").await, Code::Ok);
}

#[tokio::test]
async fn a_shadow_rule_reports_what_it_would_have_said() {
    let (limiter, _) = limiter();
    // `shadow` allows 1 a minute: 2 hits on a fresh counter are over, reported OK with 0
    // left (not the 1 the counter still holds).
    let r = check(&limiter, vec![descriptor(&[("shadow", "s")], 2)]).await;
    assert_eq!(
        (r.code, r.statuses[0].code, r.statuses[0].remaining),
        (Code::Ok, Code::Ok, 0)
    );
}

/// envoyproxy/ratelimit leaves `unlimited` rules out of the dynamic metadata (it drops
/// unlimited limits before merging); a counted rule's metadata is merged.
#[tokio::test]
async fn unlimited_rules_bring_no_metadata() {
    let (limiter, _) = limiter();
    let r = check(&limiter, vec![descriptor(&[("free", "x")], 1)]).await;
    assert_eq!(r.statuses[0].remaining, UNLIMITED_REMAINING);
    assert_eq!(r.metadata, None);
}

/// A window of N units: the headers' policy has its exact length, and the status reports no
/// unit (Envoy's `RateLimit` cannot say "per 30 s").
#[tokio::test]
async fn a_window_of_thirty_seconds_is_described_exactly() {
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, unit_multiplier: 30, requests_per_unit: 5}\n";
    let limiter = Limiter::for_tests(
        yaml,
        LimiterOptions::default(),
        Arc::new(crate::clock::SystemClock),
    );
    let response = check(&limiter, vec![descriptor(&[("k", "v")], 1)]).await;
    assert_eq!(response.statuses[0].limit, None);
    assert_eq!(response.statuses[0].remaining, 4);
    assert_eq!(response.limits[0].window, Some(30 * SECOND));
}
