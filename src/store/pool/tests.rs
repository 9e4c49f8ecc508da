//! The pool's state machine, walked step by step.

use super::*;

const TIMING: Timing = Timing {
    lead: 100_000,
    period: 2_000_000,
    ask_ttl: 2_000_000,
    window: 60_000_000,
    floor: 1,
    advance: false,
};

fn take(pool: &mut Pool, want: u64, need: u64, now: Micros) -> PoolAnswer {
    pool.apply(
        &PoolKind::Take {
            want,
            need,
            instances: 1,
            demand: 0,
            timing: TIMING,
        },
        now,
    )
}

fn grant(units: u64, asked_at: Micros) -> PoolKind {
    PoolKind::Install(Install {
        units,
        guard: 60_000_000,
        epoch: 7,
        asked_at,
        offset: 1_000,
        left: 2_000_000,
        ..Install::default()
    })
}

#[test]
fn an_empty_pool_refuses_and_makes_one_caller_ask_the_root() {
    let mut pool = Pool::default();
    let first = take(&mut pool, 5, 1, 61_000_000);
    assert_eq!(first.units, 0);
    assert_eq!(first.ask.map(|a| a.units), Some(1));
    let second = take(&mut pool, 5, 1, 61_000_001);
    assert!(second.ask.is_none() && second.asking);
    let installed = pool.apply(&grant(10, 61_000_000), 61_050_000);
    assert_eq!(installed.units, 10);
    assert_eq!(take(&mut pool, 5, 1, 61_050_000).units, 5);
    // The pool ends a region lease period after the ask, timed from before it.
    assert_eq!(take(&mut pool, 1, 1, 63_000_000).units, 0);
}

#[test]
fn a_grant_after_its_pool_would_have_ended_goes_back() {
    let mut pool = Pool::default();
    take(&mut pool, 5, 1, 61_000_000);
    let late = pool.apply(&grant(10, 61_000_000), 63_000_000);
    assert_eq!(late.units, 0);
    assert_eq!(late.ask.map(|a| a.units), Some(10));
    assert_eq!(pool.free(63_000_000), 0);
}

#[test]
fn returns_and_withdrawals_are_guarded() {
    let mut pool = Pool::default();
    take(&mut pool, 5, 1, 61_000_000);
    pool.apply(&grant(10, 61_000_000), 61_000_100);
    let taken = take(&mut pool, 4, 4, 61_000_200);
    assert_eq!(taken.units, 4);
    let stale = PoolKind::Return {
        units: 4,
        generation: taken.generation + 1,
        guard: taken.guard,
    };
    assert_eq!(pool.apply(&stale, 61_000_300).units, 0);
    let back = PoolKind::Return {
        units: 4,
        generation: taken.generation,
        guard: taken.guard,
    };
    assert_eq!(pool.apply(&back, 61_000_300).units, 4);
    // Idle for less than asked: nothing withdrawn; then all of it, once (the units taken
    // came back: nothing to report).
    let idle = PoolKind::Withdraw { idle: 500_000 };
    assert_eq!(pool.apply(&idle, 61_100_000).units, 0);
    let out = pool.apply(&idle, 61_600_000);
    assert_eq!(out.units, 10);
    assert_eq!(out.ask.map(|a| (a.units, a.admitted)), Some((10, 0)));
    assert_eq!(pool.apply(&idle, 61_600_001).units, 0);
}

/// A token bucket's grant (10 ms a token) whose arrival time at the root is `tat`.
fn tokens(units: u64, tat: Micros, asked_at: Micros) -> PoolKind {
    PoolKind::Install(Install {
        units,
        guard: tat,
        interval: 10_000_000,
        epoch: 7,
        asked_at,
        left: 2_000_000,
        ..Install::default()
    })
}

#[test]
fn a_token_buckets_pool_holds_only_what_the_root_has_not_refilled() {
    let mut pool = Pool::default();
    take(&mut pool, 5, 1, 61_000_000);
    // 100 tokens up to the root's arrival time a second ahead, 10 ms apart.
    assert_eq!(
        pool.apply(&tokens(100, 62_000_000, 61_000_000), 61_000_000)
            .free,
        100
    );
    // 300 ms on, the root has refilled the first 30: they are gone from the pool.
    assert_eq!(pool.free(61_300_000), 70);
    // A take gets the earliest of the rest: its 5 end 350 ms on at the latest.
    let taken = take(&mut pool, 5, 5, 61_300_000);
    assert_eq!((taken.units, taken.tokens_end), (5, 61_350_000));
    // Put back by its mark, where they were, once.
    let back = PoolKind::Return {
        units: 5,
        generation: taken.generation,
        guard: taken.mark,
    };
    assert_eq!(pool.apply(&back, 61_300_000).units, 5);
    assert_eq!(pool.apply(&back, 61_300_000).units, 0);
    // A grant that follows on at the root joins the run.
    let joined = pool.apply(&tokens(50, 62_500_000, 61_300_000), 61_300_000);
    assert_eq!(joined.free, 120);
    // One after a gap (another region's tokens) shorter than the run: the new tokens move
    // back to follow the old ones.
    let moved = pool.apply(&tokens(10, 63_000_000, 61_300_000), 61_300_000);
    assert_eq!((moved.free, moved.tokens_end), (130, 61_300_000));
    // A hand-back returns the last grant's tokens only: the root bucket's last.
    let out = pool.apply(&PoolKind::Withdraw { idle: 0 }, 61_300_000);
    assert_eq!(
        (out.units, out.ask.map(|a| a.guard)),
        (10, Some(63_000_000))
    );
}

#[test]
fn a_failed_ask_says_so_and_a_refusal_waits_before_asking_again() {
    let mut pool = Pool::default();
    take(&mut pool, 5, 1, 61_000_000);
    let failed = PoolKind::Install(Install {
        failed: true,
        retry_at: 61_500_000,
        ..Install::default()
    });
    assert!(pool.apply(&failed, 61_000_100).root_failed);
    assert!(take(&mut pool, 5, 1, 61_100_000).ask.is_none());
    assert!(take(&mut pool, 5, 1, 61_500_000).ask.is_some());
}

/// A pool whose grants came over a slow call ends early by that call's time (its offset
/// overestimates the root's lead); the grant for the next window, over a quick one, tells it
/// when its window really ends at the earliest: it lasts until then, and no longer. A grant
/// of another root epoch, or for a window that does not follow the pool's, changes nothing.
#[test]
fn a_next_windows_grant_over_a_quicker_call_lets_the_pool_last_to_its_windows_end() {
    let next = |epoch: Micros, prev_guard: Micros| {
        PoolKind::Install(Install {
            units: 50,
            guard: 120_000_000,
            epoch,
            asked_at: 118_900_000,
            // Root clock 10 ms ahead at most (the call took 10 ms).
            offset: 10_000,
            left: 2_000_000,
            from: 120_000_000,
            prev_guard,
            ..Install::default()
        })
    };
    let slow = |pool: &mut Pool| {
        take(pool, 5, 1, 118_000_000);
        // Granted at root time 118.5 s for an ask made at 118 s: it ends 1.5 s after the
        // ask, half a second before the root's window does if the clocks agree.
        let grant = PoolKind::Install(Install {
            offset: 500_000,
            left: 1_500_000,
            ..match grant(100, 118_000_000) {
                PoolKind::Install(i) => i,
                _ => unreachable!(),
            }
        });
        pool.apply(&grant, 118_500_000);
    };
    let mut pool = Pool::default();
    slow(&mut pool);
    assert_eq!(
        take(&mut pool, 1, 1, 119_600_000).units,
        0,
        "ended at 119.5 s"
    );

    let mut pool = Pool::default();
    slow(&mut pool);
    pool.apply(&next(7, 60_000_000), 118_950_000);
    assert_eq!(take(&mut pool, 1, 1, 119_600_000).units, 1);
    assert_eq!(take(&mut pool, 1, 1, 119_989_999).units, 1);
    assert_eq!(
        take(&mut pool, 1, 1, 119_990_000).units,
        0,
        "the window may be over"
    );
    // The next pool, from its start.
    assert_eq!(take(&mut pool, 1, 1, 120_000_000).units, 1);

    for (epoch, prev_guard) in [(8, 60_000_000), (7, 0), (7, 30_000_000)] {
        let mut pool = Pool::default();
        slow(&mut pool);
        pool.apply(&next(epoch, prev_guard), 118_950_000);
        assert_eq!(
            take(&mut pool, 1, 1, 119_600_000).units,
            0,
            "{epoch} {prev_guard}"
        );
    }
}
