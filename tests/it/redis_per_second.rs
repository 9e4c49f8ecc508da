//! `REDIS_PERSECOND`: the limits whose unit is `second` count on a Redis of their own, the
//! others on the main one, as in the reference service; a request with counters on both
//! stays all-or-nothing, and each Redis is behind its own failure policy. Against two real
//! Redis servers.

use std::sync::Arc;
use std::time::Duration;

use crate::common::counters::{self, batch};
use crate::common::redis::RedisServer;
use crate::common::{TestServer, config_dir, http_get};
use sluice::algorithm::{Algorithm, Limit, Micros, SECOND};
use sluice::clock::{Clock, ManualClock};
use sluice::settings::{Backend, Settings};
use sluice::store::memory::MemoryOptions;
use sluice::store::redis::{RedisKind, RedisOptions};
use sluice::store::resilient::ResilienceOptions;
use sluice::store::{
    Batch, CounterOp, MemoryStore, PerSecondSplit, RedisStore, Role, Shared, Store,
};

const HOUR: Micros = 3600 * SECOND;
/// A pinned time in the middle of a second, so that nothing here crosses a window by chance.
const T0: Micros = 1_800_000_000 * SECOND + SECOND / 2;

fn op(name: &str, window: Micros, requests: u64, hits: i64, role: Role) -> CounterOp {
    let limit = Limit::new(requests, window, Algorithm::FixedWindow);
    counters::op("split", [("k", name)], limit, hits, role)
}

struct Pair {
    main: RedisServer,
    fast: RedisServer,
    store: PerSecondSplit,
}

fn pair() -> Pair {
    let (main, fast) = (RedisServer::start(), RedisServer::start());
    let clock = Arc::new(ManualClock::new(T0));
    let redis = |server: &RedisServer| -> Arc<dyn Shared> {
        let store = RedisStore::new(&RedisOptions::new(server.url(), RedisKind::Single)).unwrap();
        Arc::new(store.with_clock(clock.clone()))
    };
    let store = PerSecondSplit::new(redis(&main), redis(&fast));
    Pair { main, fast, store }
}

/// What a counter has left, read without charging.
async fn left(store: &dyn Store, name: &str, window: Micros, requests: u64) -> u64 {
    let read = store
        .apply(&batch(vec![op(name, window, requests, 0, Role::Enforce)]))
        .await
        .unwrap();
    read.decisions[0].remaining
}

/// How many keys of `server` contain `part` (from the raw reply to KEYS: `*<count>`).
fn keys(server: &RedisServer, part: &str) -> usize {
    let reply = server.command(&["KEYS", &format!("*{part}*")]);
    reply
        .lines()
        .next()
        .and_then(|l| l.trim().strip_prefix('*'))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected reply {reply:?}"))
}

#[tokio::test]
async fn per_second_counters_live_on_their_own_redis_and_the_rest_on_the_main_one() {
    let p = pair();
    let applied = p
        .store
        .apply(&batch(vec![
            op("hourly", HOUR, 5, 1, Role::Enforce),
            op("fast", SECOND, 5, 1, Role::Enforce),
        ]))
        .await
        .unwrap();
    assert!(applied.admitted);
    assert_eq!((keys(&p.main, "hourly"), keys(&p.main, "fast")), (1, 0));
    assert_eq!((keys(&p.fast, "hourly"), keys(&p.fast, "fast")), (0, 1));
    assert_eq!(left(&p.store, "hourly", HOUR, 5).await, 4);
    assert_eq!(left(&p.store, "fast", SECOND, 5).await, 4);
}

#[tokio::test]
async fn a_request_refused_on_one_redis_charges_nothing_on_the_other() {
    let p = pair();
    // The main Redis refuses: the per-second charge is taken back.
    let full = || op("hourly-full", HOUR, 1, 1, Role::Enforce);
    assert!(p.store.apply(&batch(vec![full()])).await.unwrap().admitted);
    let refused = p
        .store
        .apply(&batch(vec![
            full(),
            op("fast-a", SECOND, 5, 2, Role::Enforce),
        ]))
        .await
        .unwrap();
    assert!(!refused.admitted);
    assert!(!refused.decisions[0].allowed && refused.decisions[1].allowed);
    assert_eq!(left(&p.store, "fast-a", SECOND, 5).await, 5);

    // The per-second Redis refuses: the main charge is taken back.
    let refused = p
        .store
        .apply(&batch(vec![
            op("hourly-b", HOUR, 5, 3, Role::Enforce),
            op("fast-b", SECOND, 1, 2, Role::Enforce),
        ]))
        .await
        .unwrap();
    assert!(!refused.admitted);
    assert_eq!(left(&p.store, "hourly-b", HOUR, 5).await, 5);
}

#[tokio::test]
async fn quota_descriptors_are_decided_over_both_redis_servers() {
    let p = pair();
    let closed = |name: &str, window| op(name, window, 0, 1, Role::Quota);
    // One quota counter over (main), one not (per-second): admitted, both charged that fit.
    let some_left = p
        .store
        .apply(&batch(vec![
            closed("q-main", HOUR),
            op("q-fast", SECOND, 5, 1, Role::Quota),
        ]))
        .await
        .unwrap();
    assert!(some_left.admitted);
    assert_eq!(left(&p.store, "q-fast", SECOND, 5).await, 4);
    // Every quota counter over: refused.
    let all_over = p
        .store
        .apply(&batch(vec![
            closed("q-main", HOUR),
            closed("q-fast-2", SECOND),
            op("e", HOUR, 5, 1, Role::Enforce),
        ]))
        .await
        .unwrap();
    assert!(!all_over.admitted);
    assert_eq!(left(&p.store, "e", HOUR, 5).await, 5);
}

/// A refund names the time of its charge: once the counter's window has moved on, the refund
/// leaves the new window alone (else a request refused at the end of a second would give
/// the next second more than its limit). On Redis and on the memory store.
#[tokio::test]
async fn a_refund_never_takes_from_a_later_window() {
    let p = pair();
    let clock = Arc::new(ManualClock::new(T0));
    let memory: Arc<dyn Store> =
        Arc::new(MemoryStore::new(MemoryOptions::default(), clock.clone()));
    let redis: Arc<dyn Store> = Arc::new(
        RedisStore::new(&RedisOptions::new(p.fast.url(), RedisKind::Single))
            .unwrap()
            .with_clock(clock.clone()),
    );
    for store in [memory, redis] {
        clock.set(T0);
        let charged = store
            .apply(&batch(vec![op("w", SECOND, 5, 2, Role::Enforce)]))
            .await
            .unwrap();
        let charged_at = charged.decided_at.expect("one clock, one time");
        // The next second: a fresh window, charged once.
        clock.advance(SECOND);
        store
            .apply(&batch(vec![op("w", SECOND, 5, 1, Role::Enforce)]))
            .await
            .unwrap();
        let stale = Batch {
            charged_at: Some(charged_at),
            ..batch(vec![op("w", SECOND, 5, -2, Role::Enforce)])
        };
        store.apply(&stale).await.unwrap();
        assert_eq!(left(store.as_ref(), "w", SECOND, 5).await, 4);
        // Within the same window the refund applies.
        let fresh = Batch {
            charged_at: Some(clock.now()),
            ..batch(vec![op("w", SECOND, 5, -1, Role::Enforce)])
        };
        store.apply(&fresh).await.unwrap();
        assert_eq!(left(store.as_ref(), "w", SECOND, 5).await, 5);
    }
}

const CONFIG: &str = "domain: split
descriptors:
  - key: hourly
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: burst
    failure_mode: deny
    rate_limit: {unit: second, requests_per_unit: 1000}
";

async fn server(main: &RedisServer, fast: &RedisServer) -> TestServer {
    let mut settings = Settings::for_tests(config_dir("per-second", &[("split.yaml", CONFIG)]));
    settings.backend = Backend::Redis;
    let options = |server: &RedisServer| RedisOptions {
        connections: 1,
        connect_timeout: Duration::from_secs(1),
        ..RedisOptions::new(server.url(), RedisKind::Single)
    };
    settings.redis = Some(options(main));
    settings.redis_per_second = Some(options(fast));
    settings.resilience = ResilienceOptions {
        deadline: Duration::from_millis(100),
        breaker_failures: 3,
        breaker_cooldown: Duration::from_millis(100),
        local_instances: 1,
    };
    settings.local_cache_keys = 1000;
    TestServer::start_with(settings).await
}

/// With the per-second Redis down, its rules answer by their failure_mode while the main
/// Redis's rules keep counting exactly: one Redis's outage is not the other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_per_second_redis_leaves_the_main_redis_exact() {
    let main = RedisServer::start();
    let mut fast = RedisServer::start();
    let server = server(&main, &fast).await;
    let split = server.domain("split");
    assert!(split.hit("burst=b").await.is_ok());
    fast.kill();
    // Denied by the failure policy (failure_mode: deny), however often.
    for _ in 0..5 {
        assert!(split.hit("burst=b").await.is_over_limit());
    }
    // The main Redis still decides: exactly 3 of 5 pass, with the true remaining.
    let mut remaining = Vec::new();
    for _ in 0..5 {
        let answer = split.hit("hourly=h").await;
        remaining.push((answer.is_ok(), answer.remaining()[0]));
    }
    assert_eq!(
        remaining,
        [(true, 2), (true, 1), (true, 0), (false, 0), (false, 0)]
    );
    let (_, page) = http_get(server.http_addr, "/rlconfig").await.unwrap();
    assert!(
        page.contains("main: ok") && page.contains("per-second: failing"),
        "{page}"
    );
}

#[tokio::test]
async fn leases_go_to_the_redis_their_counter_lives_on() {
    use sluice::algorithm::Ask;
    use sluice::store::{LeaseAsk, Take};
    let p = pair();
    let ask = |name: &str, window: Micros| {
        let op = op(name, window, 100, 1, Role::Enforce);
        LeaseAsk {
            key: op.key,
            limit: op.limit,
            take: Take::Lease(Ask {
                want: 30,
                need: 1,
                instances: 1,
            }),
            report: Default::default(),
            not_after: 0,
            id: Default::default(),
            start: 0,
        }
    };
    let grants = p
        .store
        .lease(&[ask("hourly-lease", HOUR), ask("fast-lease", SECOND)])
        .await
        .unwrap();
    // Each granted what the share allows (half of what is left, one instance) up to the ask.
    assert_eq!(grants.iter().map(|g| g.units).collect::<Vec<_>>(), [30, 30]);
    assert_eq!(
        (keys(&p.main, "hourly-lease"), keys(&p.main, "fast-lease")),
        (1, 0)
    );
    assert_eq!(
        (keys(&p.fast, "hourly-lease"), keys(&p.fast, "fast-lease")),
        (0, 1)
    );
    assert_eq!(left(&p.store, "hourly-lease", HOUR, 100).await, 70);
    assert_eq!(left(&p.store, "fast-lease", SECOND, 100).await, 70);
}
