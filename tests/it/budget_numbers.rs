//! Usage budgets' big numbers: limits past 32 bits, 10^9-hit reports and sums past 2^53 (the
//! largest integer a double, and so Redis's Lua, holds exactly) stay exact and decidable on
//! both stores; counts saturate at 2^64 - 1 instead of overflowing; the status says what
//! Envoy's 32-bit fields can carry.

use std::sync::Arc;
use std::time::Duration;

use crate::common::counters;
use crate::common::redis::RedisServer;
use crate::common::{TestServer, config_dir, http_get};
use sluice::algorithm::{Algorithm, Decision, Limit, SECOND};
use sluice::clock::{Clock, ManualClock, SystemClock};
use sluice::store::memory::MemoryOptions;
use sluice::store::redis::{RedisKind, RedisOptions};
use sluice::store::{CounterOp, MemoryStore, RedisStore, Role, Store};

/// 2^53: past it a double skips integers.
const TWO_TO_53: u64 = 1 << 53;

fn budget(algorithm: Algorithm) -> Limit {
    Limit::new(100, 60 * SECOND, algorithm).with_overdraft(true)
}

/// A store on `redis` with a call deadline long enough for a loaded machine: these tests
/// check arithmetic, and one of them sends 2,100 script calls in one batch (50 ms here when
/// quiet; under a full CI run the default one-second deadline failed it once).
fn redis_store(redis: &RedisServer, clock: Arc<ManualClock>) -> RedisStore {
    let mut options = RedisOptions::new(redis.url(), RedisKind::Single);
    options.call_timeout = Duration::from_secs(30);
    RedisStore::new(&options).unwrap().with_clock(clock)
}

fn charge(namespace: &str, limit: Limit, hits: i64) -> CounterOp {
    counters::op(namespace, [("tenant", "big")], limit, hits, Role::Enforce)
}

async fn apply(store: &dyn Store, ops: Vec<CounterOp>) -> Vec<Decision> {
    store.apply(&counters::batch(ops)).await.unwrap().decisions
}

/// The same charges on the memory store and on Redis (one pinned clock): every decision
/// agrees, the overdraft past 2^53 is exact to the unit, and Redis stores the exact digits.
#[tokio::test]
async fn sums_past_two_to_the_53_stay_exact_on_both_stores() {
    let redis = RedisServer::start();
    let day = 86_400 * SECOND;
    let clock = Arc::new(ManualClock::new((SystemClock.now() / day + 1) * day));
    let memory = MemoryStore::new(MemoryOptions::default(), clock.clone());
    let on_redis = redis_store(&redis, clock.clone());
    let ns = format!("numbers-{}", std::process::id());
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let limit = budget(algorithm);
        let op = |hits| charge(&ns, limit, hits);
        // Just under 2^53 at once (the store takes what the limiter passes it), then three
        // charges of 10^9 that carry the sum past it, a check, and a refund.
        // Odd sums past 2^53: a double cannot hold them (its integers there are even).
        let start = TWO_TO_53 - 999;
        let steps: [(i64, u64); 6] = [
            (start as i64, start),
            (1_000_000_000, start + 1_000_000_000),
            (1_000_000_000, start + 2_000_000_000),
            (1_000_000_000, start + 3_000_000_000),
            (0, start + 3_000_000_000),
            (-500_000_000, start + 2_500_000_000),
        ];
        for (i, (hits, used)) in steps.into_iter().enumerate() {
            let from_memory = apply(&memory, vec![op(hits)]).await;
            let from_redis = apply(&on_redis, vec![op(hits)]).await;
            assert_eq!(from_memory, from_redis, "{algorithm:?} step {i}");
            let d = from_memory[0];
            if hits >= 0 {
                assert!(!d.allowed, "{algorithm:?} step {i}: {used} of 100 used");
                assert_eq!(d.remaining, 0);
                assert_eq!(d.overdraft, used - 100, "{algorithm:?} step {i}");
            }
        }
        let key = on_redis.store_key(&op(0));
        let stored = redis.command(&["GET", &key]);
        let digits = (start + 2_500_000_000).to_string();
        assert!(
            stored.contains(&digits),
            "{algorithm:?}: Redis holds {stored:?}, not the exact count {digits}"
        );
    }
}

/// Whatever the sum, a count saturates at 2^64 - 1 on both stores, and the budget stays
/// spent: no overflow wraps it back into room.
#[tokio::test]
async fn a_count_saturates_at_two_to_the_64_and_stays_spent() {
    let redis = RedisServer::start();
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let memory = MemoryStore::new(MemoryOptions::default(), clock.clone());
    let on_redis = redis_store(&redis, clock.clone());
    let ns = format!("saturate-{}", std::process::id());
    let limit = budget(Algorithm::FixedWindow);
    // 2^53 - 1 hits, 2,100 times: past 2^64 (a Redis script clamps one charge to 2^53).
    let big = (TWO_TO_53 - 1) as i64;
    let ops: Vec<CounterOp> = (0..2_100).map(|_| charge(&ns, limit, big)).collect();
    for store in [&memory as &dyn Store, &on_redis] {
        let decisions = apply(store, ops.clone()).await;
        let last = decisions.last().unwrap();
        assert_eq!(last.overdraft, u64::MAX - 100);
        let check = apply(store, vec![charge(&ns, limit, 0)]).await[0];
        assert!(!check.allowed && check.remaining == 0, "{check:?}");
        assert_eq!(check.overdraft, u64::MAX - 100);
    }
    let stored = redis.command(&["GET", &on_redis.store_key(&charge(&ns, limit, 0))]);
    assert!(stored.contains(&u64::MAX.to_string()), "{stored:?}");
}

const CONFIG: &str = "
domain: ai
descriptors:
  - key: tenant
    rate_limit: {unit: month, requests_per_unit: 10000000000, overdraft: true, name: tokens}
";

/// A limit past 32 bits through gRPC on both stores: 10^9-hit reports count in full; the
/// status (whose fields are 32-bit) carries no current_limit and a remaining that saturates
/// at 4294967295; `GET /counters` has the exact numbers.
#[tokio::test]
async fn a_limit_past_32_bits_counts_10e9_reports_exactly() {
    let redis = RedisServer::start();
    for on_redis in [false, true] {
        let dir = config_dir("budget-numbers", &[("ai.yaml", CONFIG)]);
        let mut settings = sluice::settings::Settings::for_tests(dir);
        if on_redis {
            settings.backend = sluice::settings::Backend::Redis;
            settings.redis = Some(RedisOptions::new(redis.url(), RedisKind::Single));
        }
        let server = TestServer::start_with(settings).await;
        let ai = server.domain("ai");
        let first = ai.charges(&[("tenant=t", 1_000_000_000)]).await;
        assert!(first.is_ok());
        assert_eq!(
            first.statuses[0].current_limit, None,
            "no 32-bit limit to report"
        );
        assert_eq!(first.remaining(), vec![u32::MAX], "9e9 left saturates");
        for _ in 0..8 {
            assert!(ai.charges(&[("tenant=t", 1_000_000_000)]).await.is_ok());
        }
        let ninth = ai.charges(&[("tenant=t", 0)]).await;
        assert_eq!(ninth.remaining(), vec![1_000_000_000]);
        // 10^9 fits exactly; the next report crosses by 10^9 - 1 and counts in full.
        assert!(ai.charges(&[("tenant=t", 1_000_000_000)]).await.is_ok());
        let crossing = ai.charges(&[("tenant=t", 999_999_999)]).await;
        assert!(crossing.is_over_limit());
        let (status, body) = http_get(server.http_addr, "/counters?domain=ai&entry=tenant=t")
            .await
            .unwrap();
        assert_eq!(status, 200, "{body}");
        let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
        let counter = &answer["counters"][0];
        assert_eq!(counter["used"], "10999999999", "{body}");
        assert_eq!(counter["overdraft"], "999999999", "{body}");
        assert_eq!(
            counter["limit"]["requestsPerUnit"], 10_000_000_000u64,
            "{body}"
        );
        assert_eq!(counter["limit"]["overdraft"], true, "{body}");
        server.stop().await.unwrap();
    }
}
