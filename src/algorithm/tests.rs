//! Usage budgets (`Limit::overdraft`) on every algorithm, through [`decide`] and the rule
//! every store follows: a transition is kept when its hits were allowed, or always when
//! [`applies_unconditionally`] says so.

use super::*;

const MINUTE: Micros = 60 * SECOND;

/// A counter as a store keeps it.
#[derive(Default)]
struct Counter(Option<State>);

impl Counter {
    fn charge(&mut self, limit: &Limit, now: Micros, hits: i64) -> Decision {
        let t = decide(self.0.as_ref(), limit, now, hits);
        if (t.decision.allowed && hits != 0) || applies_unconditionally(limit, hits) {
            self.0 = Some(t.next);
        }
        t.decision
    }
}

fn budget(algorithm: Algorithm, requests: u64) -> Limit {
    Limit::new(requests, MINUTE, algorithm).with_overdraft(true)
}

const WINDOWS: [Algorithm; 2] = [Algorithm::FixedWindow, Algorithm::SlidingWindow];

#[test]
fn a_charge_that_crosses_the_budget_counts_and_the_next_check_is_refused() {
    for algorithm in WINDOWS.into_iter().chain([Algorithm::TokenBucket]) {
        let limit = budget(algorithm, 100);
        let mut counter = Counter::default();
        let now = 10 * MINUTE;
        let first = counter.charge(&limit, now, 80);
        assert!(first.allowed, "{algorithm:?}");
        assert_eq!(first.remaining, 20, "{algorithm:?}");
        let crossing = counter.charge(&limit, now, 50);
        assert!(!crossing.allowed, "{algorithm:?}");
        assert_eq!(crossing.remaining, 0, "{algorithm:?}");
        let check = counter.charge(&limit, now, 0);
        assert!(
            !check.allowed,
            "{algorithm:?}: 130 of 100 used, nothing may pass"
        );
        assert_eq!(check.remaining, 0, "{algorithm:?}");
        // A refund of the 50 brings it back under: exactly 80 were charged before it.
        let refund = counter.charge(&limit, now, -50);
        assert_eq!(refund.remaining, 20, "{algorithm:?}");
    }
}

#[test]
fn a_budget_is_spent_at_its_limit_where_a_plain_limit_still_admits_a_check() {
    for algorithm in WINDOWS.into_iter().chain([Algorithm::TokenBucket]) {
        let plain = Limit::new(100, MINUTE, algorithm);
        let mut counter = Counter::default();
        assert!(counter.charge(&plain, MINUTE, 100).allowed);
        assert!(counter.charge(&plain, MINUTE, 0).allowed, "{algorithm:?}");
        let budget = plain.with_overdraft(true);
        let mut counter = Counter::default();
        assert!(counter.charge(&budget, MINUTE, 100).allowed);
        assert!(!counter.charge(&budget, MINUTE, 0).allowed, "{algorithm:?}");
    }
}

#[test]
fn a_plain_limit_charges_nothing_when_refused() {
    for algorithm in WINDOWS.into_iter().chain([Algorithm::TokenBucket]) {
        let limit = Limit::new(100, MINUTE, algorithm);
        let mut counter = Counter::default();
        counter.charge(&limit, MINUTE, 80);
        assert!(!counter.charge(&limit, MINUTE, 50).allowed);
        assert_eq!(
            counter.charge(&limit, MINUTE, 0).remaining,
            20,
            "{algorithm:?}"
        );
    }
}

#[test]
fn a_windows_overdraft_stays_until_it_ages_out() {
    let fixed = budget(Algorithm::FixedWindow, 100);
    let mut counter = Counter::default();
    counter.charge(&fixed, 0, 250);
    let refused = counter.charge(&fixed, 59 * SECOND, 0);
    assert!(!refused.allowed);
    assert_eq!(
        refused.retry_after,
        Some(SECOND),
        "the next window starts afresh"
    );
    assert!(counter.charge(&fixed, MINUTE, 0).allowed);

    // A sliding window carries the overdraft into the next window, weighted by what is left
    // of it: 250 at three quarters' weight is still 187.5 of 100.
    let sliding = budget(Algorithm::SlidingWindow, 100);
    let mut counter = Counter::default();
    counter.charge(&sliding, 0, 250);
    assert!(!counter.charge(&sliding, MINUTE + 15 * SECOND, 0).allowed);
    // At 0.6 of the next window 250 * 0.4 = 100 estimate: still spent; past 0.604 it is not.
    assert!(!counter.charge(&sliding, MINUTE + 36 * SECOND, 0).allowed);
    assert!(counter.charge(&sliding, MINUTE + 37 * SECOND, 0).allowed);
    assert!(counter.charge(&sliding, 2 * MINUTE, 0).allowed);
}

#[test]
fn a_token_bucket_goes_into_debt_and_refills_out_of_it() {
    // 60 a minute: one token a second, 60 at most.
    let limit = budget(Algorithm::TokenBucket, 60);
    let mut counter = Counter::default();
    let start = 100 * MINUTE;
    let crossing = counter.charge(&limit, start, 90);
    assert!(!crossing.allowed);
    // 30 tokens of debt: 30 s to be even, 31 s until one token is there to spend.
    assert_eq!(crossing.reset_after, 90 * SECOND);
    let check = counter.charge(&limit, start + 30 * SECOND, 0);
    assert!(!check.allowed);
    assert_eq!(check.retry_after, Some(SECOND));
    assert!(counter.charge(&limit, start + 31 * SECOND, 0).allowed);
    assert!(counter.charge(&limit, start + 31 * SECOND, 1).allowed);
    assert!(!counter.charge(&limit, start + 31 * SECOND, 1).allowed);
}

#[test]
fn refused_charges_of_a_request_refused_elsewhere_count_on_a_budget() {
    let limit = budget(Algorithm::FixedWindow, 10);
    assert!(applies_unconditionally(&limit, 5));
    assert!(
        !applies_unconditionally(&limit, 0),
        "a check changes nothing"
    );
    assert!(!applies_unconditionally(
        &Limit::new(10, MINUTE, Algorithm::FixedWindow),
        5
    ));
}
