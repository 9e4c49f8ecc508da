//! Arbitrary input thrown at the service layer, as an attacker would: random bytes decoded as
//! a `RateLimitRequest` (what the gRPC transport does), random structured requests (every
//! field, extreme hits, bad units, separators and wildcards in values, too many descriptors),
//! and random bodies at `POST /json`. Each must be answered (a response with one status per
//! descriptor, or a client-fault status), never panic, never be called an internal error, and
//! cost work bounded by the request bounds. A bounded number of cases per run (proptest, with
//! its regressions committed beside this file), so CI stays fast.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use http_body_util::BodyExt;
use proptest::prelude::*;
use prost::Message;
use sluice::admin::{AdminState, ConfigInfo, router};
use sluice::app::{Metrics, Scrape};
use sluice::clock::SystemClock;
use sluice::config::{LoadOptions, load_sources};
use sluice::health::Health;
use sluice::limiter::{Limiter, LimiterOptions};
use sluice::rls::RlsService;
use sluice::store::MemoryStore;
use sluice::store::memory::MemoryOptions;
use tower::ServiceExt;

const CONFIG: &str = r#"
domain: fuzz
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 3}
    descriptors:
      - key: b
        value: "x*y"
        rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window}
      - key: b
        rate_limit: {unit: hour, requests_per_unit: 0}
  - key: c
    value: "*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: token_bucket, burst: 4}
  - key: d
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: concurrency}
  - key: e
    rate_limits:
      - {unit: second, requests_per_unit: 1}
      - {unit: day, requests_per_unit: 100, algorithm: sliding_window}
  - key: p
    priorities: {high: 1.0, low: 0.5}
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: q
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: s
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
"#;

fn service() -> (RlsService, AdminState) {
    let policy = load_sources(
        &[("fuzz.yaml".into(), CONFIG.into())],
        LoadOptions::default(),
    )
    .expect("the fuzz config is valid");
    let store = MemoryStore::new(MemoryOptions { max_keys: 2_000 }, Arc::new(SystemClock));
    let limiter = Arc::new(Limiter::new(
        Arc::new(policy),
        Arc::new(store),
        LimiterOptions::default(),
    ));
    let metrics = Arc::new(Metrics::new(0.8, 100));
    let limiter = Arc::new(
        Arc::try_unwrap(limiter)
            .ok()
            .expect("not shared yet")
            .with_observer(metrics.clone()),
    );
    let rls = RlsService::new(limiter.clone());
    let health = Arc::new(Health::default());
    health.set_serving(true);
    let state = AdminState {
        rls: rls.clone(),
        limiter: limiter.clone(),
        health,
        metrics: Arc::new(Scrape {
            metrics,
            limiter: limiter.clone(),
        }),
        config: Arc::new(parking_lot::RwLock::new(ConfigInfo::default())),
        reset: Arc::new(sluice::admin::ResetAccess::new(
            Default::default(),
            &prometheus::Registry::new(),
        )),
        rlqs: None,
    };
    (rls, state)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Checks one answer: a response with a status per descriptor, or a client fault.
fn check_answer(
    request_descriptors: usize,
    answer: Result<
        envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse,
        tonic::Status,
    >,
) -> Result<(), TestCaseError> {
    match answer {
        Ok(response) => {
            prop_assert_eq!(response.statuses.len(), request_descriptors);
            prop_assert!(response.overall_code == 1 || response.overall_code == 2);
        }
        Err(status) => prop_assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{}",
            status.message()
        ),
    }
    Ok(())
}

/// Strings an attacker would try: the key separators, wildcards, empty, long, non-ASCII.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec!["a", "b", "c", "d", "e", "p", "q", "s", "high", "low", "x", "xy", "xzy"])
            .prop_map(str::to_owned),
        2 => "[a-z|=\\\\*_.]{0,12}",
        1 => Just(String::new()),
        1 => (1usize..4).prop_map(|n| "v".repeat(n * 100)),
        1 => "\\PC{0,8}",
    ]
}

fn entry() -> impl Strategy<Value = Entry> {
    (text(), text()).prop_map(|(key, value)| Entry { key, value })
}

fn descriptor() -> impl Strategy<Value = RateLimitDescriptor> {
    (
        prop::collection::vec(entry(), 0..4),
        prop::option::weighted(
            0.1,
            (any::<u32>(), prop_oneof![0i32..8, any::<i32>()]).prop_map(
                |(requests_per_unit, unit)| RateLimitOverride {
                    requests_per_unit,
                    unit,
                },
            ),
        ),
        prop::option::weighted(
            0.3,
            prop_oneof![
                Just(0u64),
                1u64..10,
                Just(u64::MAX),
                Just(i64::MAX as u64),
                any::<u64>()
            ],
        ),
        any::<bool>(),
    )
        .prop_map(|(entries, limit, hits, negative)| RateLimitDescriptor {
            entries,
            limit,
            hits_addend: hits.map(|value| UInt64Value { value }),
            is_negative_hits: negative,
        })
}

fn request() -> impl Strategy<Value = RateLimitRequest> {
    (
        prop_oneof![4 => Just("fuzz".to_owned()), 1 => text()],
        prop_oneof![
            8 => prop::collection::vec(descriptor(), 0..6),
            1 => prop::collection::vec(descriptor(), 60..70),
        ],
        prop_oneof![Just(0u32), 1u32..5, Just(u32::MAX)],
    )
        .prop_map(|(domain, descriptors, hits_addend)| RateLimitRequest {
            domain,
            descriptors,
            hits_addend,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn arbitrary_requests_are_answered_or_refused_as_client_faults(
        requests in prop::collection::vec(request(), 1..8)
    ) {
        let (rls, state) = service();
        let tracked = || state.limiter.store().status().tracked_keys.unwrap();
        runtime().block_on(async {
            for request in requests {
                let n = request.descriptors.len();
                let before = tracked();
                check_answer(n, rls.answer(request, None).await)?;
                // Bounded work: at most 64 descriptors of at most 2 limits each were counted.
                prop_assert!(tracked() <= before + 64 * 2);
            }
            Ok::<(), TestCaseError>(())
        })?;
    }

    #[test]
    fn arbitrary_bytes_decode_to_an_answer_or_a_decode_error(
        bytes in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..256),
            request().prop_map(|r| r.encode_to_vec()).prop_flat_map(|bytes| {
                // A valid message with a few bytes changed: the decoder's corner cases.
                let len = bytes.len().max(1);
                (Just(bytes), prop::collection::vec((0..len, any::<u8>()), 0..4))
            }).prop_map(|(mut bytes, flips)| {
                for (at, byte) in flips {
                    if let Some(b) = bytes.get_mut(at) {
                        *b = byte;
                    }
                }
                bytes
            }),
        ]
    ) {
        let (rls, _) = service();
        // What the gRPC transport does: decode, and only a decoded message reaches the service.
        if let Ok(request) = RateLimitRequest::decode(bytes.as_slice()) {
            let n = request.descriptors.len();
            runtime().block_on(async { check_answer(n, rls.answer(request, None).await) })?;
        }
    }

    #[test]
    fn arbitrary_json_bodies_get_200_429_or_400(
        body in prop_oneof![
            "\\PC{0,64}",
            request().prop_map(|r| {
                // The proto3 JSON of a random request (the fields /json reads).
                let descriptors: Vec<String> = r.descriptors.iter().map(|d| {
                    let entries: Vec<String> = d.entries.iter().map(|e| format!(
                        r#"{{"key":{},"value":{}}}"#,
                        serde_json::to_string(&e.key).unwrap(),
                        serde_json::to_string(&e.value).unwrap()
                    )).collect();
                    let hits = d.hits_addend.as_ref().map_or(String::new(), |h| format!(r#","hits_addend":{}"#, h.value));
                    format!(r#"{{"entries":[{}]{hits}}}"#, entries.join(","))
                }).collect();
                format!(
                    r#"{{"domain":{},"descriptors":[{}],"hits_addend":{}}}"#,
                    serde_json::to_string(&r.domain).unwrap(),
                    descriptors.join(","),
                    r.hits_addend
                )
            }),
        ]
    ) {
        let (_, state) = service();
        let app = router(state);
        let post = |path: &'static str| {
            let app = app.clone();
            let body = body.clone();
            async move {
                let response = app
                    .oneshot(Request::post(path).body(Body::from(body)).unwrap())
                    .await
                    .unwrap();
                let status = response.status();
                let _ = response.into_body().collect().await;
                status
            }
        };
        let (json, explain) = runtime().block_on(async { (post("/json").await, post("/explain").await) });
        prop_assert!(
            [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS, StatusCode::BAD_REQUEST].contains(&json),
            "{} for {}", json, body
        );
        // Explain reads the same request and charges nothing: OK, or the same bad request.
        prop_assert!(
            explain == StatusCode::OK || (explain == StatusCode::BAD_REQUEST && json == StatusCode::BAD_REQUEST),
            "/explain {} (/json {}) for {}", explain, json, body
        );
    }

    /// Any query on `/counters`: read, or refused as a bad query; a reset is refused (resets
    /// are off by default) before the query is even read.
    #[test]
    fn any_counters_query_gets_a_clear_answer(query in "[a-z=&%+_./0-9A-F-]{0,80}") {
        let (_, state) = service();
        let app = router(state);
        let uri = format!("/counters?{query}");
        let (get, delete) = runtime().block_on(async {
            let mut statuses = Vec::new();
            for method in ["GET", "DELETE"] {
                let request = Request::builder().method(method).uri(&uri).body(Body::empty());
                let Ok(request) = request else { return (StatusCode::BAD_REQUEST, StatusCode::FORBIDDEN) };
                let response = app.clone().oneshot(request).await.unwrap();
                statuses.push(response.status());
                let _ = response.into_body().collect().await;
            }
            (statuses[0], statuses[1])
        });
        prop_assert!([StatusCode::OK, StatusCode::BAD_REQUEST].contains(&get), "GET {} for {}", get, query);
        prop_assert_eq!(delete, StatusCode::FORBIDDEN, "DELETE for {}", query);
    }
}

/// The shipped and fixture configs, the seeds of the config mutations.
fn seed_configs() -> Vec<String> {
    let mut seeds = vec![CONFIG.to_owned()];
    for dir in [
        "config",
        "deploy/envoy/sluice-config",
        "tests/fixtures/config/valid",
    ] {
        let dir = crate::common::repo_path(dir);
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            if entry
                .path()
                .extension()
                .is_some_and(|e| e == "yaml" || e == "yml")
            {
                seeds.push(std::fs::read_to_string(entry.path()).unwrap());
            }
        }
    }
    seeds
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// A config edited by mistake (or by an attacker with write access to the ConfigMap):
    /// bytes replaced, lines dropped or repeated, YAML's special characters inserted. Every
    /// mutation loads or is refused with errors; none panics, and what loads answers.
    #[test]
    fn mutated_configs_load_or_are_refused_and_never_panic(
        seed in 0usize..16,
        edits in prop::collection::vec(
            (any::<prop::sample::Index>(), prop_oneof![
                prop::sample::select(vec![
                    ":", "-", " ", "\n", "  ", "*", "&a", "*a", "!!str", "[", "]", "{", "}",
                    "'", "\"", "#", "0", "-1", "4294967296", "~", "null", "? ", "|", ">",
                    "key:", "value:", "descriptors:", "rate_limit:", "unit:", "requests_per_unit:",
                    "unlimited: true", "replaces: [{name: x}]", "share_threshold: true",
                    "algorithm: token_bucket", "burst: 0", "priorities: {a: 2}", "rate_limits: []",
                    "failure_mode: x", "metadata: 1", "domain:", "\t", "\u{feff}", "é",
                ]).prop_map(str::to_owned),
                Just(String::new()),
            ], any::<bool>()),
            1..6,
        ),
    ) {
        let seeds = seed_configs();
        let mut text = seeds[seed % seeds.len()].clone();
        for (at, insert, replace_line) in edits {
            let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
            if lines.is_empty() {
                lines.push(String::new());
            }
            let i = at.index(lines.len());
            if replace_line {
                lines[i] = insert;
            } else {
                let line = &lines[i];
                let mut cut = at.index(line.len() + 1);
                while !line.is_char_boundary(cut) {
                    cut -= 1;
                }
                lines[i] = format!("{}{insert}{}", &line[..cut], &line[cut..]);
            }
            text = lines.join("\n");
        }
        match load_sources(&[("mutated.yaml".into(), text.clone())], LoadOptions::default()) {
            Ok(policy) => {
                let store = MemoryStore::new(MemoryOptions::default(), Arc::new(SystemClock));
                let limiter = Arc::new(Limiter::new(
                    Arc::new(policy),
                    Arc::new(store),
                    LimiterOptions::default(),
                ));
                let rls = RlsService::new(limiter);
                let request = RateLimitRequest {
                    domain: "fuzz".into(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry { key: "a".into(), value: "x".into() }],
                        ..Default::default()
                    }],
                    hits_addend: 1,
                };
                runtime().block_on(async { check_answer(1, rls.answer(request, None).await) })?;
            }
            Err(errors) => prop_assert!(!errors.is_empty(), "refused without a reason: {text}"),
        }
    }
}

proptest! {
    // Each case sends up to 200 requests: fewer cases.
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn arbitrary_overrides_keep_the_metric_series_bounded(
        requests in prop::collection::vec(
            (prop::collection::vec(text(), 1..4), 1u32..1000).prop_map(|(keys, requests_per_unit)| {
                let entries = keys.into_iter().map(|key| Entry { key, value: "v".into() }).collect();
                RateLimitRequest {
                    domain: "fuzz".into(),
                    descriptors: vec![RateLimitDescriptor {
                        entries,
                        limit: Some(RateLimitOverride { requests_per_unit, unit: 2 }),
                        ..Default::default()
                    }],
                    hits_addend: 1,
                }
            }),
            1..200,
        )
    ) {
        // Series of overrides count against the detailed cap (100 here): past it, one
        // overflow series; every label within the 128-byte bound.
        let (rls, state) = service();
        runtime().block_on(async {
            for request in requests {
                let n = request.descriptors.len();
                check_answer(n, rls.answer(request, None).await)?;
            }
            Ok::<(), TestCaseError>(())
        })?;
        let page = sluice::metrics::Exposition::render(&*state.metrics);
        let series: Vec<&str> = page
            .lines()
            .filter(|l| l.starts_with("ratelimit_service_rate_limit_total_hits{"))
            .collect();
        prop_assert!(series.len() <= 100 + 1, "{} series", series.len());
        // Four labels of at most 128 bytes each, twice that once escaped, and the name.
        for line in &series {
            prop_assert!(line.len() <= 4 * 2 * 128 + 200, "{}", line);
        }
    }
}
