//! The admin API (`sluice.admin.v1.Admin` on the gRPC port; `POST /explain`, `GET` and
//! `DELETE /counters` on the admin port), against a running server: explanations follow the
//! reference's matching rules, counters read and reset on every algorithm on the memory store
//! and on a real Redis (resets themselves, who may make them: `admin_reset.rs`).

use crate::common::admin::{admin, descriptor, on_redis, settings, token_file, with_token};
use crate::common::redis::RedisServer;
use crate::common::{TestServer, config_dir, http, http_get};
use sluice::admin::ResetSettings;
use sluice::admin::api::proto::{
    self, CountersRequest, admin_client::AdminClient, descriptor_explanation::Outcome, step::Kind,
};
use sluice::settings::Settings;
use tonic::Code;
use tonic::transport::Channel;

async fn explain(
    client: &mut AdminClient<Channel>,
    domain: &str,
    descriptors: &[&[(&str, &str)]],
) -> proto::ExplainResponse {
    client
        .explain(proto::RateLimitRequest {
            domain: domain.into(),
            descriptors: descriptors.iter().map(|d| descriptor(d)).collect(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// The kinds and patterns of an explanation's path.
fn path(e: &proto::DescriptorExplanation) -> Vec<(Kind, &str)> {
    e.path
        .iter()
        .map(|s| (s.kind(), s.pattern.as_str()))
        .collect()
}

#[tokio::test]
async fn explain_names_the_rule_and_path_the_reference_would_match() {
    let server = TestServer::start_with(settings(ResetSettings::default())).await;
    let mut client = admin(&server).await;

    // Exact beats wildcard beats key-only.
    let r = explain(
        &mut client,
        "m",
        &[&[("k", "exact")], &[("k", "example")], &[("k", "other")]],
    )
    .await;
    assert!(r.domain_found);
    let [exact, wildcard, key_only] = &r.descriptors[..] else {
        panic!("{r:?}")
    };
    assert_eq!(exact.outcome(), Outcome::Matched);
    assert_eq!(exact.rule, "m.k_exact");
    assert_eq!(path(exact), [(Kind::Exact, "exact")]);
    assert_eq!(exact.limits[0].requests_per_unit, 1);
    assert_eq!(wildcard.rule, "m.k_ex*");
    assert_eq!(path(wildcard), [(Kind::Wildcard, "ex*")]);
    assert_eq!(wildcard.limits[0].requests_per_unit, 2);
    assert_eq!(key_only.rule, "m.k");
    assert_eq!(path(key_only), [(Kind::KeyOnly, "")]);
    assert_eq!(key_only.limits[0].counter, "m|k=other|60s:fw");
    assert_eq!(key_only.limits[0].store_key, "m|k=other|60s:fw");
    assert_eq!(key_only.limits[0].algorithm, "fixed_window");

    // Depth: a rule applies only at the depth of the request's entries.
    let r = explain(
        &mut client,
        "m",
        &[
            &[("parent", "p")],
            &[("parent", "p"), ("child", "c")],
            &[("parent", "p"), ("other", "o")],
            &[("nothing", "n")],
        ],
    )
    .await;
    let outcomes: Vec<Outcome> = r.descriptors.iter().map(|d| d.outcome()).collect();
    assert_eq!(
        outcomes,
        [
            Outcome::Depth,
            Outcome::Matched,
            Outcome::NoMatch,
            Outcome::NoMatch
        ]
    );
    assert_eq!(r.descriptors[1].rule, "m.parent.child");
    assert_eq!(
        path(&r.descriptors[2]),
        [(Kind::KeyOnly, ""), (Kind::None, "")]
    );
    assert!(
        r.descriptors[2].reason.contains("at level 2"),
        "{}",
        r.descriptors[2].reason
    );

    // Whitelists, unlimited rules, replaces, overrides and unknown domains.
    let r = explain(
        &mut client,
        "m",
        &[
            &[("white", "w")],
            &[("free", "f")],
            &[("big", "b")],
            &[("small", "s")],
        ],
    )
    .await;
    let outcomes: Vec<Outcome> = r.descriptors.iter().map(|d| d.outcome()).collect();
    assert_eq!(
        outcomes,
        [
            Outcome::Whitelisted,
            Outcome::Unlimited,
            Outcome::Replaced,
            Outcome::Matched
        ]
    );
    assert_eq!(r.descriptors[2].replaced_by, "m.small");
    assert!(r.descriptors[2].limits.is_empty());
    let mut overridden = descriptor(&[("k", "other")]);
    overridden.limit = Some(proto::rate_limit_descriptor::Override {
        requests_per_unit: 7,
        unit: 3, // HOUR
    });
    let r = client
        .explain(proto::RateLimitRequest {
            domain: "m".into(),
            descriptors: vec![overridden],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.descriptors[0].outcome(), Outcome::Override);
    assert_eq!(r.descriptors[0].limits[0].unit, "HOUR");
    let r = explain(&mut client, "nowhere", &[&[("k", "v")]]).await;
    assert!(!r.domain_found);
    assert_eq!(r.descriptors[0].outcome(), Outcome::UnknownDomain);

    // A bad request is refused as ShouldRateLimit refuses it.
    let empty = client
        .explain(proto::RateLimitRequest {
            domain: "m".into(),
            descriptors: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(empty.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn explain_over_http_answers_the_same_json_and_charges_nothing() {
    let server = TestServer::start_with(settings(ResetSettings::default())).await;
    let body = r#"{"domain":"m","descriptors":[{"entries":[{"key":"k","value":"example"}]}]}"#;
    for _ in 0..3 {
        let (status, text) = http(server.http_addr, "POST", "/explain", body)
            .await
            .unwrap();
        assert_eq!(status, 200, "{text}");
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let d = &json["descriptors"][0];
        assert_eq!(d["outcome"], "MATCHED");
        assert_eq!(d["rule"], "m.k_ex*");
        assert_eq!(d["path"][0]["kind"], "WILDCARD");
        assert_eq!(d["path"][0]["pattern"], "ex*");
        assert_eq!(d["limits"][0]["requestsPerUnit"], 2);
    }
    // Three explanations later, the rule's two requests are all still there.
    let decision = server.domain("m").hit("k=example").await;
    assert_eq!(decision.remaining(), [1]);
    let (status, text) = http(server.http_addr, "POST", "/explain", "{\"domain\":1}")
        .await
        .unwrap();
    assert_eq!(status, 400, "{text}");
}

/// Each algorithm's counter after three hits, read and reset through both interfaces.
async fn get_and_reset_every_algorithm(settings: Settings) {
    let token = token_file("admin-token-algorithms", "let-me-reset");
    let mut settings = settings;
    settings.admin_reset = with_token(&token);
    let (server, _clock) = TestServer::start_with_clock(settings).await;
    let mut client = admin(&server).await;
    let a = server.domain("a");
    for key in ["fw", "sw", "tb", "cc", "multi"] {
        for _ in 0..3 {
            assert!(a.hit(&format!("{key}=x")).await.is_ok());
        }
        let request = CountersRequest {
            domain: "a".into(),
            descriptor: Some(descriptor(&[(key, "x")])),
        };
        let got = client
            .get_counters(request.clone())
            .await
            .unwrap()
            .into_inner();
        let limits = if key == "multi" { 2 } else { 1 };
        assert_eq!(got.counters.len(), limits, "{key}: {got:?}");
        for c in &got.counters {
            assert_eq!(
                (c.used, c.over, c.degraded),
                (3, false, false),
                "{key}: {c:?}"
            );
        }
        assert_eq!(got.counters[0].remaining, 2, "{key}");
        // Windows and buckets restore with time; in-flight requests only by their release.
        assert_eq!(got.counters[0].reset_after_ms > 0, key != "cc", "{key}");
        // Reading charged nothing.
        let again = client
            .get_counters(request.clone())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(again.counters[0].used, 3, "{key}");

        // Reset over gRPC for some, over HTTP for the others.
        if key.len() == 2 {
            let mut reset = tonic::Request::new(request.clone());
            reset
                .metadata_mut()
                .insert("authorization", "Bearer let-me-reset".parse().unwrap());
            let answer = client.reset_counters(reset).await.unwrap().into_inner();
            assert_eq!(answer.counters.len(), limits, "{key}");
            assert_eq!(answer.deleted, limits as u64, "{key}");
        } else {
            let (status, text) = crate::common::http_with_headers(
                server.http_addr,
                "DELETE",
                &format!("/counters?domain=a&entry={key}%3Dx"),
                &[("authorization", "Bearer let-me-reset")],
                "",
            )
            .await
            .unwrap();
            assert_eq!(status, 200, "{text}");
            assert!(text.contains("\"deleted\":\"2\""), "{text}");
        }
        let (status, text) = http_get(
            server.http_addr,
            &format!("/counters?domain=a&entry={key}=x"),
        )
        .await
        .unwrap();
        assert_eq!(status, 200, "{text}");
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["counters"][0]["used"], "0", "{key}: {text}");
        assert_eq!(json["counters"][0]["remaining"], "5", "{key}: {text}");
        // The budget is whole again.
        assert_eq!(a.hit(&format!("{key}=x")).await.remaining(), [4], "{key}");
    }
}

#[tokio::test]
async fn get_and_reset_on_every_algorithm_in_memory() {
    get_and_reset_every_algorithm(settings(ResetSettings::default())).await;
}

#[tokio::test]
async fn get_and_reset_on_every_algorithm_on_redis() {
    let redis = RedisServer::start();
    get_and_reset_every_algorithm(on_redis(settings(ResetSettings::default()), &redis)).await;
    let keys = redis.command(&["KEYS", "*"]);
    assert!(keys.contains("a|fw=x|60s:fw"), "{keys}");
}

#[tokio::test]
async fn a_reset_forgets_the_refusals_the_over_limit_cache_remembers() {
    let redis = RedisServer::start();
    let token = token_file("admin-token-cache", "t0ken");
    let mut settings = on_redis(settings(with_token(&token)), &redis);
    settings.local_cache_keys = 1000;
    let server = TestServer::start_with(settings).await;
    let m = server.domain("m");
    assert!(m.hit("k=exact").await.is_ok());
    for _ in 0..3 {
        assert!(m.hit("k=exact").await.is_over_limit());
    }
    let mut reset = tonic::Request::new(CountersRequest {
        domain: "m".into(),
        descriptor: Some(descriptor(&[("k", "exact")])),
    });
    reset
        .metadata_mut()
        .insert("authorization", "Bearer t0ken".parse().unwrap());
    admin(&server).await.reset_counters(reset).await.unwrap();
    assert!(m.hit("k=exact").await.is_ok());
    assert!(m.hit("k=exact").await.is_over_limit());
}

#[tokio::test]
async fn a_reset_of_a_leased_counter_drops_this_instance_block_too() {
    let redis = RedisServer::start();
    let token = token_file("admin-token-leased", "lease-tok");
    let leased = "domain: l\nconsistency: leased\ndescriptors:\n  - key: hot\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n";
    let mut settings = Settings::for_tests(config_dir("admin-leased", &[("l.yaml", leased)]));
    settings.admin_reset = with_token(&token);
    let server = TestServer::start_with(on_redis(settings, &redis)).await;
    let l = server.domain("l");
    for _ in 0..20 {
        assert!(l.hit("hot=x").await.is_ok());
    }
    let request = CountersRequest {
        domain: "l".into(),
        descriptor: Some(descriptor(&[("hot", "x")])),
    };
    let mut client = admin(&server).await;
    let explained = client
        .get_counters(request.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        explained.counters[0].limit.as_ref().unwrap().consistency,
        "leased"
    );
    // The shared counter holds what the instance leased: at least the 20 admitted.
    assert!(explained.counters[0].used >= 20, "{explained:?}");
    let mut reset = tonic::Request::new(request.clone());
    reset
        .metadata_mut()
        .insert("authorization", "Bearer lease-tok".parse().unwrap());
    client.reset_counters(reset).await.unwrap();
    let after = client
        .get_counters(request.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(after.counters[0].used, 0, "{after:?}");
    // The next request leases afresh from the cleared counter.
    assert!(l.hit("hot=x").await.is_ok());
    let again = client.get_counters(request).await.unwrap().into_inner();
    assert!((1..1000).contains(&again.counters[0].used), "{again:?}");
}

#[tokio::test]
async fn get_and_reset_reach_every_cluster_slot_and_the_per_second_redis() {
    use crate::common::redis::RedisCluster;
    use sluice::store::redis::{RedisKind, RedisOptions};
    // A Cluster: the two counters of one descriptor live in different slots.
    let cluster = RedisCluster::start();
    let token = token_file("admin-token-cluster", "c");
    let mut clustered = on_redis(settings(with_token(&token)), &cluster.nodes[0]);
    clustered.redis = Some(RedisOptions {
        kind: RedisKind::Cluster,
        url: cluster.url(),
        ..clustered.redis.unwrap()
    });
    // A per-second Redis beside a main one.
    let (main, fast) = (RedisServer::start(), RedisServer::start());
    let mut split = on_redis(settings(with_token(&token)), &main);
    split.redis_per_second = Some(RedisOptions::new(fast.url(), RedisKind::Single));
    let split_config = "domain: s\ndescriptors:\n  - key: both\n    rate_limits:\n      - {unit: second, requests_per_unit: 100}\n      - {unit: hour, requests_per_unit: 1000}\n";
    split.config_dir = config_dir("admin-split", &[("s.yaml", split_config)]);
    for (settings, domain, key) in [(clustered, "a", "multi"), (split, "s", "both")] {
        let server = TestServer::start_with(settings).await;
        // A per-second counter is gone once its second has ended: start early in a second, so
        // that the charges, the read and the reset below fall in one (each takes milliseconds).
        use sluice::clock::Clock as _;
        let into_second = || sluice::clock::SystemClock.now() % sluice::algorithm::SECOND;
        while into_second() > sluice::algorithm::SECOND / 4 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        for _ in 0..2 {
            assert!(server.domain(domain).hit(&format!("{key}=y")).await.is_ok());
        }
        let request = CountersRequest {
            domain: domain.into(),
            descriptor: Some(descriptor(&[(key, "y")])),
        };
        let mut client = admin(&server).await;
        let got = client
            .get_counters(request.clone())
            .await
            .unwrap()
            .into_inner();
        let used: Vec<u64> = got.counters.iter().map(|c| c.used).collect();
        assert_eq!(used, [2, 2], "{domain}: {got:?}");
        if domain == "s" {
            assert!(fast.command(&["KEYS", "*"]).contains("s|both=y|1s:fw"));
            assert!(main.command(&["KEYS", "*"]).contains("s|both=y|3600s:fw"));
        }
        let mut reset = tonic::Request::new(request.clone());
        reset
            .metadata_mut()
            .insert("authorization", "Bearer c".parse().unwrap());
        let answer = client.reset_counters(reset).await.unwrap().into_inner();
        assert_eq!(answer.deleted, 2, "{domain}");
        let got = client.get_counters(request).await.unwrap().into_inner();
        let used: Vec<u64> = got.counters.iter().map(|c| c.used).collect();
        assert_eq!(used, [0, 0], "{domain}");
    }
    // Each per-second counter went to, and was deleted from, its own Redis.
    assert!(fast.command(&["KEYS", "*"]).starts_with("*0"));
    assert!(main.command(&["KEYS", "*"]).starts_with("*0"));
}

/// A shadow rule of 2 an hour.
const SHADOW: &str = "domain: sh
descriptors:
  - key: k
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
";

/// A shadow rule counts every hit, past its limit too (the probe: 5 hits on a shadow rule of
/// 2 showed `used` 2): what a lower or higher limit would refuse is measured while nothing is
/// refused. On the memory store and on Redis (with the over-limit cache on, its default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_rule_counts_every_hit_past_its_limit() {
    let redis = RedisServer::start();
    let memory = Settings::for_tests(config_dir("admin-shadow", &[("sh.yaml", SHADOW)]));
    let on_redis = on_redis(
        Settings::for_tests(config_dir("admin-shadow-redis", &[("sh.yaml", SHADOW)])),
        &redis,
    );
    for settings in [memory, on_redis] {
        let server = TestServer::start_with(settings).await;
        let sh = server.domain("sh");
        for _ in 0..5 {
            assert!(sh.hit("k=x").await.is_ok(), "a shadow rule refuses nothing");
        }
        let (status, text) = http_get(server.http_addr, "/counters?domain=sh&entry=k=x")
            .await
            .unwrap();
        assert_eq!(status, 200, "{text}");
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["counters"][0]["used"], "5", "{text}");
    }
}

/// `GET /top`: a rule's top refused keys over its current window, heaviest first, with what
/// each had refused; a shadow rule's are the keys it would refuse. Bad parameters are 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_top_refused_keys_of_a_rule_are_served_as_json() {
    const RULES: &str = "domain: t
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
";
    let server = TestServer::start_with(Settings::for_tests(config_dir(
        "admin-top",
        &[("t.yaml", RULES)],
    )))
    .await;
    let t = server.domain("t");
    for (key, times) in [("user=a", 4), ("user=b", 2), ("user=c", 1), ("trial=x", 3)] {
        for _ in 0..times {
            t.hit(key).await;
        }
    }
    let (status, text) = http_get(server.http_addr, "/top?domain=t").await.unwrap();
    assert_eq!(status, 200, "{text}");
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let rules = json["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 2, "{text}");
    let trial = &rules[0];
    assert_eq!(
        (trial["rule"].as_str(), trial["shadow"].as_bool()),
        (Some("t.trial"), Some(true))
    );
    assert_eq!(trial["windows"][0]["keys"][0]["key"], "trial=x", "{text}");
    assert_eq!(trial["windows"][0]["keys"][0]["refused"], 2, "{text}");
    let user = &rules[1];
    assert_eq!(user["window_seconds"], 3600.0, "{text}");
    let keys: Vec<(&str, u64)> = user["windows"][0]["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k["key"].as_str().unwrap(), k["refused"].as_u64().unwrap()))
        .collect();
    assert_eq!(keys, [("user=a", 3), ("user=b", 1)], "{text}");
    assert_eq!(user["windows"][0]["refused_hits"], 4, "{text}");
    for bad in [
        "/top?n=0",
        "/top?n=101",
        "/top?domain=t&domain=u",
        "/top?who=me",
    ] {
        let (status, text) = http_get(server.http_addr, bad).await.unwrap();
        assert_eq!(status, 400, "{bad}: {text}");
    }
    // The same over the gRPC admin API.
    let mut client = admin(&server).await;
    let top = client
        .top_refused(proto::TopRequest {
            domain: "t".into(),
            rule: "t.user".into(),
            n: 1,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(top.rules.len(), 1, "{top:?}");
    let window = &top.rules[0].windows[0];
    assert_eq!((window.refused_hits, window.keys.len()), (4, 1), "{top:?}");
    assert_eq!(
        (window.keys[0].key.as_str(), window.keys[0].refused),
        ("user=a", 3)
    );
    let refused = client
        .top_refused(proto::TopRequest {
            n: 101,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
}

/// The switches: `SHADOW_COUNTS_PAST_LIMIT=false` stops a shadow rule's count at its limit
/// (5 hits on a rule of 2: used 2), `TOP_REFUSED_KEYS=false` keeps no refused keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn measuring_past_the_limit_and_keeping_refused_keys_can_be_switched_off() {
    let mut settings = Settings::for_tests(config_dir("admin-switches", &[("sh.yaml", SHADOW)]));
    settings.limiter.shadow_counts_past_limit = false;
    settings.limiter.top_refused_keys = false;
    let server = TestServer::start_with(settings).await;
    for _ in 0..5 {
        server.domain("sh").hit("k=x").await;
    }
    let (_, text) = http_get(server.http_addr, "/counters?domain=sh&entry=k=x")
        .await
        .unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["counters"][0]["used"], "2", "{text}");
    let (_, text) = http_get(server.http_addr, "/top").await.unwrap();
    assert_eq!(text, r#"{"rules":[]}"#);
}
