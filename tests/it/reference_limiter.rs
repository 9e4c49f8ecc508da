// Why one long file: a port of two reference files, case for case, so that a reader can compare
// them side by side.
//! Port of envoyproxy/ratelimit's `test/redis/fixed_cache_impl_test.go` and
//! `test/limiter/base_limiter_test.go`, black-box. The reference feeds its fixed-window
//! cache canned Redis answers ("the counter is now 13"); here real requests bring a real
//! counter to the count before the case's hits, then the case's request is sent and the
//! per-rule statistics it moved are read from `/metrics` (as a difference, so that the
//! preparing hits do not count). Exact Redis commands, key formats, expiry jitter and
//! tracer spans are the reference's internals and are not ported.
//!
//! The reference's limits are mostly per second; the unit is not what these cases test
//! (their arithmetic is), so they count per hour here: no window can end between preparing
//! a counter and the request that finds it.

use crate::common::redis::command_calls;
use crate::common::reference::{
    RuleStats, Store, answer, desc_hits, no_limit, on_each_store, req, rule_stats, stats, status,
};
use crate::common::{TestServer, request, should_rate_limit};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

const CONFIG: &str = "
domain: domain
descriptors:
  - key: key
    value: value
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: key2
    value: value2
    descriptors:
      - key: subkey2
        value: subvalue2
        rate_limit: {unit: hour, requests_per_unit: 10}
  - key: key3
    value: value3
    rate_limit: {unit: hour, requests_per_unit: 10}
    descriptors:
      - key: subkey3
        value: subvalue3
        rate_limit: {unit: day, requests_per_unit: 10}
  - key: key4
    value: value4
    rate_limit: {unit: hour, requests_per_unit: 15}
  - key: shadow4
    value: value4
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 15}
  - key: key5
    value: value5
    rate_limit: {unit: hour, requests_per_unit: 20}
  - key: key6
    value: value6
    rate_limit: {unit: hour, requests_per_unit: 8}
  - key: key7
    value: value7
    rate_limit: {unit: hour, requests_per_unit: 20}
  - key: key8
    value: value8
    rate_limit: {unit: hour, requests_per_unit: 20}
  - key: key9
    value: value9
    rate_limit: {unit: hour, requests_per_unit: 20}
  - key: key10
    value: value10
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: five
    value: value
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: five
    value: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: ten
    value: value
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: ten
    value: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: parent
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: hour, requests_per_unit: 10}
  - key: files
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: hour, requests_per_unit: 10}
";

/// `TestOverLimitWithStopCacheKeyIncrementWhenOverlimitConfig`'s two limits.
const STOP: &str = "
domain: stop
descriptors:
  - key: key4
    value: value4
    rate_limit: {unit: hour, requests_per_unit: 15}
  - key: key5
    value: value5
    rate_limit: {unit: hour, requests_per_unit: 14}
";

type Client = RateLimitServiceClient<Channel>;

/// A server on `store` with both configs, and a client.
async fn start(store: &Store) -> (TestServer, Client) {
    let server = store
        .server(&[("domain.yaml", CONFIG), ("stop.yaml", STOP)])
        .await;
    let client = server.client().await;
    (server, client)
}

/// Charges `n` hits to `entries` in one admitted request: the counter the reference's mock
/// returns, minus the case's own hits.
async fn prepare(client: &mut Client, entries: &[(&str, &str)], n: u64) {
    if n > 0 {
        let r = should_rate_limit(client, request("domain", vec![desc_hits(entries, n)])).await;
        assert_eq!(r.overall_code, Code::Ok as i32, "preparing {entries:?}");
    }
}

/// Sends `request` and returns its answer and what it moved in `rule`'s statistics.
async fn measured(
    server: &TestServer,
    client: &mut Client,
    rule: &str,
    request: envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest,
) -> (RateLimitResponse, RuleStats) {
    let before = rule_stats(server, rule).await;
    let response = should_rate_limit(client, request).await;
    let after = rule_stats(server, rule).await;
    (response, after - before)
}

fn hour(n: u32) -> Option<(u32, Unit)> {
    Some((n, Unit::Hour))
}

fn with_cache(mut s: RuleStats, over_limit_with_local_cache: u64) -> RuleStats {
    s.over_limit_with_local_cache = over_limit_with_local_cache;
    s
}

fn shadowed(mut s: RuleStats, shadow_mode: u64) -> RuleStats {
    s.shadow_mode = shadow_mode;
    s
}

const KEY4: &[(&str, &str)] = &[("key4", "value4")];

// === fixed_cache_impl_test.go ===

/// fixed_cache_impl_test.go:32 TestRedis/WithoutPerSecondRedis (which Redis takes a
/// per-second limit is `reference_integration`'s per-second case): a counter at 4 of 10
/// takes a hit (5 left); a full counter refuses the one descriptor charged (with hits 0 on
/// the other, which has no limit); and a peek (hits 0) beside a refused descriptor.
async fn fixed_window_answers(store: &Store) {
    let (server, mut client) = start(store).await;
    let key = [("key", "value")];
    prepare(&mut client, &key, 4).await;
    let (r, moved) = measured(
        &server,
        &mut client,
        "domain.key_value",
        req("domain", &[&key]),
    )
    .await;
    assert_eq!(answer(&r), (Code::Ok, vec![status(Code::Ok, hour(10), 5)]));
    assert_eq!(moved, stats(1, 1, 0, 0));

    let sub = [("key2", "value2"), ("subkey2", "subvalue2")];
    prepare(&mut client, &sub, 10).await;
    let (r, moved) = measured(
        &server,
        &mut client,
        "domain.key2_value2.subkey2_subvalue2",
        request(
            "domain",
            vec![desc_hits(&[("key2", "value2")], 0), desc_hits(&sub, 1)],
        ),
    )
    .await;
    assert_eq!(
        answer(&r),
        (
            Code::OverLimit,
            vec![no_limit(), status(Code::OverLimit, hour(10), 0)]
        )
    );
    assert_eq!(moved, stats(1, 0, 1, 0));

    // The reference's counters stand at 11 and 13: its refused hits were charged. Here the
    // same history (filled, then one more hit refused) leaves both at 10.
    let top = [("key3", "value3")];
    let deep = [("key3", "value3"), ("subkey3", "subvalue3")];
    for entries in [&top[..], &deep[..]] {
        prepare(&mut client, entries, 10).await;
        let r = should_rate_limit(&mut client, req("domain", &[entries])).await;
        assert_eq!(r.overall_code, Code::OverLimit as i32);
    }
    let before_top = rule_stats(&server, "domain.key3_value3").await;
    let (r, moved) = measured(
        &server,
        &mut client,
        "domain.key3_value3.subkey3_subvalue3",
        request("domain", vec![desc_hits(&top, 0), desc_hits(&deep, 1)]),
    )
    .await;
    // Difference: a refused request charges nothing, so the peek finds its counter at the
    // limit, where 0 hits fit (OK, 0 left); the reference's, past it, says OVER_LIMIT.
    assert_eq!(
        answer(&r),
        (
            Code::OverLimit,
            vec![
                status(Code::Ok, hour(10), 0),
                status(Code::OverLimit, Some((10, Unit::Day)), 0)
            ]
        )
    );
    // With the over-limit cache, the refusal just seen is remembered and answers this one.
    assert_eq!(
        moved,
        with_cache(stats(1, 0, 1, 0), u64::from(store.local_cache()))
    );
    // A peek is no hit.
    assert_eq!(
        rule_stats(&server, "domain.key3_value3").await - before_top,
        RuleStats::default()
    );
}

/// The three steps shared by TestOverLimitWithLocalCache, TestNearLimit and
/// TestOverLimitWithLocalCacheShadowRule on a 15-an-hour limit: at 10, a hit leaves 4; at
/// 12, a hit crosses the near-limit threshold (12) by one; at 15, a hit is over.
async fn near_then_over(
    server: &TestServer,
    client: &mut Client,
    entries: &[(&str, &str)],
    rule: &str,
    shadow: bool,
) {
    let over_code = if shadow { Code::Ok } else { Code::OverLimit };
    prepare(client, entries, 10).await;
    let (r, moved) = measured(server, client, rule, req("domain", &[entries])).await;
    assert_eq!(answer(&r), (Code::Ok, vec![status(Code::Ok, hour(15), 4)]));
    assert_eq!(moved, stats(1, 1, 0, 0));
    prepare(client, entries, 1).await;
    let (r, moved) = measured(server, client, rule, req("domain", &[entries])).await;
    assert_eq!(answer(&r), (Code::Ok, vec![status(Code::Ok, hour(15), 2)]));
    assert_eq!(moved, stats(1, 1, 0, 1));
    prepare(client, entries, 2).await;
    let (r, moved) = measured(server, client, rule, req("domain", &[entries])).await;
    assert_eq!(
        answer(&r),
        (over_code, vec![status(over_code, hour(15), 0)])
    );
    assert_eq!(moved, shadowed(stats(1, 0, 1, 0), u64::from(shadow)));
}

/// fixed_cache_impl_test.go:188 TestOverLimitWithLocalCache: once Redis has refused a
/// counter, the over-limit cache refuses it without asking Redis, counted in `over_limit`
/// and `over_limit_with_local_cache`. (The reference's freecache hit/miss gauges have no
/// counterpart.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_over_limit_cache_refuses_without_redis() {
    let store = Store::redis_with_local_cache();
    let (server, mut client) = start(&store).await;
    near_then_over(&server, &mut client, KEY4, "domain.key4_value4", false).await;
    let redis = store.redis_server().unwrap();
    let calls = command_calls(redis, "evalsha");
    let (r, moved) = measured(
        &server,
        &mut client,
        "domain.key4_value4",
        req("domain", &[KEY4]),
    )
    .await;
    assert_eq!(
        answer(&r),
        (Code::OverLimit, vec![status(Code::OverLimit, hour(15), 0)])
    );
    assert_eq!(moved, with_cache(stats(1, 0, 1, 0), 1));
    assert_eq!(
        command_calls(redis, "evalsha"),
        calls,
        "answered without Redis"
    );
}

/// fixed_cache_impl_test.go:293 TestNearLimit: how the hits of one request split into
/// within, near and over the limit (near: past 80% of it), hits_addend 1 and more.
async fn near_limit(store: &Store) {
    let (server, mut client) = start(store).await;
    near_then_over(&server, &mut client, KEY4, "domain.key4_value4", false).await;
    // (key, limit, count before, hits, status, remaining, (total, within, over, near))
    let cases: [(&str, u32, u64, u32, Code, u32, RuleStats); 6] = [
        // all of it under limit, under near limit
        ("key5", 20, 2, 3, Code::Ok, 15, stats(3, 3, 0, 0)),
        // all of it under limit, some over near limit
        ("key6", 8, 5, 2, Code::Ok, 1, stats(2, 2, 0, 1)),
        // all of it under limit, all of it over near limit
        ("key7", 20, 16, 3, Code::Ok, 1, stats(3, 3, 0, 3)),
        // some of it over limit, all of it over near limit
        ("key8", 20, 19, 3, Code::OverLimit, 0, stats(3, 0, 2, 1)),
        // some of it in all three places
        ("key9", 20, 15, 7, Code::OverLimit, 0, stats(7, 0, 2, 4)),
        // all of it over limit (the reference's counter stood at 27; here a full one)
        ("key10", 10, 10, 3, Code::OverLimit, 0, stats(3, 0, 3, 0)),
    ];
    for (key, limit, before, hits, code, remaining, want) in cases {
        let value = key.replace("key", "value");
        let entries = [(key, value.as_str())];
        prepare(&mut client, &entries, before).await;
        let rule = format!("domain.{key}_{value}");
        let (r, moved) = measured(
            &server,
            &mut client,
            &rule,
            crate::common::reference::req_hits("domain", &[&entries], hits),
        )
        .await;
        assert_eq!(
            answer(&r),
            (code, vec![status(code, hour(limit), remaining)]),
            "{key}"
        );
        assert_eq!(moved, want, "{key}");
    }
}

/// fixed_cache_impl_test.go:496 TestOverLimitWithLocalCacheShadowRule: a shadow rule past its
/// limit says OK (0 left), counting `over_limit` and `shadow_mode`, and goes on doing so.
/// (Whether the over-limit cache answers it: the next test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_rule_past_its_limit_stays_ok() {
    let store = Store::redis_with_local_cache();
    let (server, mut client) = start(&store).await;
    let entries = [("shadow4", "value4")];
    let rule = "domain.shadow4_value4";
    near_then_over(&server, &mut client, &entries, rule, true).await;
    let (r, moved) = measured(&server, &mut client, rule, req("domain", &[&entries])).await;
    assert_eq!(answer(&r), (Code::Ok, vec![status(Code::Ok, hour(15), 0)]));
    assert_eq!(
        (
            moved.total_hits,
            moved.within_limit,
            moved.over_limit,
            moved.near_limit,
            moved.shadow_mode
        ),
        (1, 0, 1, 0, 1)
    );
}

/// fixed_cache_impl_test.go:583 TestOverLimitWithLocalCacheShadowRule, where the reference's
/// local cache answers a shadow rule past its limit (no Redis call, the hit not counted in
/// Redis). A difference (docs/reference/differences.md): a shadow rule counts every hit in
/// its counter, past its limit too, so what other limits would refuse is measured: Redis
/// answers it, and its count goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_rule_past_its_limit_is_counted_in_redis() {
    let store = Store::redis_with_local_cache();
    let (server, mut client) = start(&store).await;
    let entries = [("shadow4", "value4")];
    let rule = "domain.shadow4_value4";
    near_then_over(&server, &mut client, &entries, rule, true).await;
    let redis = store.redis_server().unwrap();
    let calls = command_calls(redis, "evalsha");
    let (r, moved) = measured(&server, &mut client, rule, req("domain", &[&entries])).await;
    assert_eq!(answer(&r), (Code::Ok, vec![status(Code::Ok, hour(15), 0)]));
    assert_eq!(moved, shadowed(stats(1, 0, 1, 0), 1));
    assert_eq!(
        command_calls(redis, "evalsha"),
        calls + 1,
        "counted in Redis"
    );
}

/// fixed_cache_impl_test.go:639 TestOverLimitWithStopCacheKeyIncrementWhenOverlimitConfig:
/// once one descriptor of a request is refused, the other's counter is not charged (what
/// Sluice always does: a refused request charges nothing), while its status and statistics
/// count its hits as within the limit and near it by what the uncharged count says, as the
/// reference's do. Per-descriptor hits, two
/// descriptors starting at 10 of 15 and 10 of 14.
async fn a_refused_request_charges_no_descriptor(store: &Store) {
    let (server, mut client) = start(store).await;
    let key4 = [("key4", "value4")];
    let key5 = [("key5", "value5")];
    for entries in [&key4[..], &key5[..]] {
        let r = should_rate_limit(&mut client, request("stop", vec![desc_hits(entries, 10)])).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
    }
    let both = |hits: u64| request("stop", vec![desc_hits(&key4, hits), desc_hits(&key5, hits)]);
    // (hits on each, overall code, (code, remaining) of each, what each's statistics moved)
    type Step = (u64, Code, [(Code, u32); 2], [RuleStats; 2]);
    let steps: [Step; 3] = [
        (
            1,
            Code::Ok,
            [(Code::Ok, 4), (Code::Ok, 3)],
            [stats(1, 1, 0, 0), stats(1, 1, 0, 0)],
        ),
        (
            2,
            Code::Ok,
            [(Code::Ok, 2), (Code::Ok, 1)],
            [stats(2, 2, 0, 1), stats(2, 2, 0, 2)],
        ),
        (
            2,
            Code::OverLimit,
            [(Code::Ok, 2), (Code::OverLimit, 0)],
            // key4's 2 hits were not charged: near the limit by 1 (13 of 15, the threshold
            // 12), as the reference counts them (fixed_cache_impl_test.go:742).
            [stats(2, 2, 0, 1), stats(2, 0, 1, 1)],
        ),
    ];
    for (hits, overall, [(c4, r4), (c5, r5)], [want4, want5]) in steps {
        let before4 = rule_stats(&server, "stop.key4_value4").await;
        let before5 = rule_stats(&server, "stop.key5_value5").await;
        let r = should_rate_limit(&mut client, both(hits)).await;
        assert_eq!(
            answer(&r),
            (
                overall,
                vec![status(c4, hour(15), r4), status(c5, hour(14), r5)]
            ),
            "{hits} hits"
        );
        assert_eq!(
            rule_stats(&server, "stop.key4_value4").await - before4,
            want4
        );
        assert_eq!(
            rule_stats(&server, "stop.key5_value5").await - before5,
            want5
        );
    }
    // key4 was not charged by the refused request: 2 left, as the last answer said.
    let r = should_rate_limit(&mut client, request("stop", vec![desc_hits(&key4, 2)])).await;
    assert_eq!(answer(&r), (Code::Ok, vec![status(Code::Ok, hour(15), 0)]));
}

// === base_limiter_test.go ===

/// base_limiter_test.go:40 TestGenerateCacheKeysPrefix: with `CACHE_KEY_PREFIX`, every
/// counter key in Redis starts with the prefix. (The rest of the key's format is a
/// Difference: counter keys.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_keys_carry_the_cache_key_prefix() {
    let store = Store::redis();
    let mut settings = store.settings(&[("domain.yaml", CONFIG)]);
    settings.redis.as_mut().unwrap().key_prefix = "prefix:".into();
    let server = TestServer::start_with(settings).await;
    let mut client = server.client().await;
    let r = should_rate_limit(&mut client, req("domain", &[&[("key", "value")]])).await;
    assert_eq!(r.statuses[0].limit_remaining, 9);
    let keys = store.redis_server().unwrap().command(&["KEYS", "*"]);
    let keys: Vec<&str> = keys
        .lines()
        .filter(|l| !l.starts_with('*') && !l.starts_with('$'))
        .collect();
    assert!(!keys.is_empty(), "no counter in Redis");
    assert!(
        keys.iter()
            .all(|k| k.starts_with("prefix:") && k.contains("domain")),
        "{keys:?}"
    );
}

/// base_limiter_test.go:59 TestGenerateCacheKeysWithShareThreshold: values matching a
/// `share_threshold` pattern share one counter, at the first level, at the second (under
/// one parent value; another parent value has its own), and at both.
async fn share_threshold_shares_one_counter(store: &Store) {
    let (_server, mut client) = start(store).await;
    async fn remaining(client: &mut Client, entries: &[(&str, &str)]) -> u32 {
        should_rate_limit(client, req("domain", &[entries]))
            .await
            .statuses[0]
            .limit_remaining
    }
    let mut seen = Vec::new();
    for value in [
        "files/a.pdf",
        "files/b.csv",
        "files/c.txt",
        "files/d.json",
        "files/e.xml",
        "files/subdir/f.txt",
    ] {
        seen.push(remaining(&mut client, &[("files", value)]).await);
    }
    assert_eq!(seen, [9, 8, 7, 6, 5, 4]);
    let mut seen = Vec::new();
    for (parent, file) in [
        ("value1", "nested/file1.txt"),
        ("value1", "nested/file2.csv"),
        ("value2", "nested/file1.txt"),
    ] {
        seen.push(remaining(&mut client, &[("parent", parent), ("files", file)]).await);
    }
    assert_eq!(seen, [9, 8, 9]);
    let mut seen = Vec::new();
    for (top, nested) in [
        ("top/file1.txt", "nested/sub1.txt"),
        ("top/file2.pdf", "nested/sub2.csv"),
    ] {
        seen.push(remaining(&mut client, &[("files", top), ("files", nested)]).await);
    }
    assert_eq!(seen, [9, 8]);
}

/// base_limiter_test.go:166 TestGetResponseStatusEmptyKey: a descriptor without a limit is
/// OK with 0 remaining. :272 TestGetResponseStatusBelowLimit and :293
/// TestGetResponseStatusBelowLimitShadowMode: a hit on a counter at 5 of 10 leaves 4, within
/// the limit, shadow mode or not.
async fn status_below_the_limit(store: &Store) {
    let (server, mut client) = start(store).await;
    let r = should_rate_limit(&mut client, req("domain", &[&[("nothing", "here")]])).await;
    assert_eq!(answer(&r), (Code::Ok, vec![no_limit()]));
    for value in ["value", "shadow"] {
        let entries = [("ten", value)];
        prepare(&mut client, &entries, 5).await;
        let rule = format!("domain.ten_{value}");
        let (r, moved) = measured(&server, &mut client, &rule, req("domain", &[&entries])).await;
        assert_eq!(
            answer(&r),
            (Code::Ok, vec![status(Code::Ok, hour(10), 4)]),
            "{value}"
        );
        assert_eq!(moved, stats(1, 1, 0, 0), "{value}");
    }
}

/// base_limiter_test.go:223 TestGetResponseStatusOverLimit and :248
/// TestGetResponseStatusOverLimitShadowMode: 5 hits on a counter at 2 of 5 are refused
/// (the shadow rule says OK), 2 of them over the limit and 1 near it; with the over-limit
/// cache on, the refusal is remembered (the next request is answered from it).
async fn status_over_the_limit(store: &Store) {
    let (server, mut client) = start(store).await;
    for (value, shadow) in [("value", false), ("shadow", true)] {
        let code = if shadow { Code::Ok } else { Code::OverLimit };
        let entries = [("five", value)];
        prepare(&mut client, &entries, 2).await;
        let rule = format!("domain.five_{value}");
        let (r, moved) = measured(
            &server,
            &mut client,
            &rule,
            crate::common::reference::req_hits("domain", &[&entries], 5),
        )
        .await;
        assert_eq!(
            answer(&r),
            (code, vec![status(code, hour(5), 0)]),
            "{value}"
        );
        assert_eq!(
            moved,
            shadowed(stats(5, 0, 2, 1), if shadow { 2 } else { 0 }),
            "{value}"
        );
        // (A shadow rule's refusal is not remembered: see
        // `a_shadow_rule_past_its_limit_is_answered_from_the_cache`.)
        if store.local_cache() && !shadow {
            let (_, moved) = measured(
                &server,
                &mut client,
                &rule,
                crate::common::reference::req_hits("domain", &[&entries], 5),
            )
            .await;
            assert_eq!(moved.over_limit_with_local_cache, 5, "{value}: remembered");
        }
    }
}

/// A request of 2 hits on a full 5-an-hour counter that Redis has refused once: answered
/// from the over-limit cache, without Redis; a shadow rule's is counted in Redis instead (a
/// shadow rule counts every hit).
async fn answered_from_the_cache(value: &str, shadow: bool) {
    let store = Store::redis_with_local_cache();
    let (server, mut client) = start(&store).await;
    let redis = store.redis_server().unwrap();
    let code = if shadow { Code::Ok } else { Code::OverLimit };
    let entries = [("five", value)];
    prepare(&mut client, &entries, 5).await;
    // Redis refuses a hit: the cache learns it.
    let r = should_rate_limit(&mut client, req("domain", &[&entries])).await;
    assert_eq!(r.statuses[0].limit_remaining, 0);
    let calls = command_calls(redis, "evalsha");
    let rule = format!("domain.five_{value}");
    let (r, moved) = measured(
        &server,
        &mut client,
        &rule,
        crate::common::reference::req_hits("domain", &[&entries], 2),
    )
    .await;
    if shadow {
        assert_eq!(
            command_calls(redis, "evalsha"),
            calls + 1,
            "counted in Redis"
        );
        assert_eq!(moved, shadowed(stats(2, 0, 2, 0), 2));
    } else {
        assert_eq!(
            command_calls(redis, "evalsha"),
            calls,
            "answered without Redis"
        );
        assert_eq!(moved, with_cache(stats(2, 0, 2, 0), 2));
    }
    assert_eq!(answer(&r), (code, vec![status(code, hour(5), 0)]));
}

/// base_limiter_test.go:177 TestGetResponseStatusOverLimitWithLocalCache: a request of 2
/// hits answered from the over-limit cache: OVER_LIMIT, 0 left, its 2 hits over the limit,
/// and over it from the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_from_the_over_limit_cache() {
    answered_from_the_cache("value", false).await;
}

/// base_limiter_test.go:199 TestGetResponseStatusOverLimitWithLocalCacheShadowMode: the same
/// for a shadow rule: OK, 0 left, 2 hits over and in shadow mode; counted in Redis, not
/// answered from the cache (a difference: a shadow rule counts every hit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_status_from_the_over_limit_cache() {
    answered_from_the_cache("shadow", true).await;
}

// === every case on each store ===

on_each_store!([memory, redis, redis_with_local_cache] [fixed_window_answers,
    near_limit,
    a_refused_request_charges_no_descriptor,
    share_threshold_shares_one_counter,
    status_below_the_limit,
    status_over_the_limit]);
