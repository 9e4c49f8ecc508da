// Why one long file: the admin API's three questions (explain, get, reset) over its two
// interfaces and both stores, sharing the clients and configs at the top.
//! The admin API (`sluice.admin.v1.Admin` on the gRPC port; `POST /explain`, `GET` and
//! `DELETE /counters` on the admin port), against a running server: explanations follow the
//! reference's matching rules, counters read and reset on every algorithm on the memory store
//! and on a real Redis, and resets need the token or the client certificate.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::redis::RedisServer;
use common::{TestServer, config_dir, http, http_get, metric, temp_dir};
use sluice::admin::ResetSettings;
use sluice::admin::api::proto::{
    self, CountersRequest, RateLimitDescriptor, admin_client::AdminClient,
    descriptor_explanation::Outcome, rate_limit_descriptor::Entry, step::Kind,
};
use sluice::settings::{Backend, Settings};
use sluice::store::redis::{RedisKind, RedisOptions};
use tonic::Code;
use tonic::transport::Channel;

const MATCHING: &str = "
domain: m
descriptors:
  - key: k
    value: exact
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: k
    value: ex*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: white
  - key: parent
    descriptors:
      - key: child
        rate_limit: {unit: hour, requests_per_unit: 4}
  - key: free
    rate_limit: {unlimited: true}
  - key: big
    rate_limit: {unit: minute, requests_per_unit: 100, name: big}
  - key: small
    rate_limit: {unit: minute, requests_per_unit: 10, name: small, replaces: [{name: big}]}
";

const ALGORITHMS: &str = "
domain: a
descriptors:
  - key: fw
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: sw
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window}
  - key: tb
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: token_bucket}
  - key: cc
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: concurrency}
  - key: multi
    rate_limits:
      - {unit: minute, requests_per_unit: 5}
      - {unit: hour, requests_per_unit: 50}
";

fn settings(reset: ResetSettings) -> Settings {
    let mut settings = Settings::for_tests(config_dir(
        "admin-api",
        &[("m.yaml", MATCHING), ("a.yaml", ALGORITHMS)],
    ));
    settings.admin_reset = reset;
    settings
}

fn on_redis(mut settings: Settings, redis: &RedisServer) -> Settings {
    settings.backend = Backend::Redis;
    settings.redis = Some(RedisOptions {
        call_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        ..RedisOptions::new(redis.url(), RedisKind::Single)
    });
    settings.resilience.deadline = Duration::from_secs(5);
    settings
}

fn token_file(name: &str, token: &str) -> PathBuf {
    let path = temp_dir(name).join("token");
    std::fs::write(&path, format!("{token}\n")).unwrap();
    path
}

fn with_token(path: &std::path::Path) -> ResetSettings {
    ResetSettings {
        token_file: Some(path.to_owned()),
        client_san: None,
    }
}

async fn admin(server: &TestServer) -> AdminClient<Channel> {
    AdminClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap()
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        limit: None,
    }
}

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
            let (status, text) = common::http_with_headers(
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
async fn resets_are_refused_unless_enabled_and_need_the_token() {
    // Off by default: nobody can reset, on either port.
    let server = TestServer::start_with(settings(ResetSettings::default())).await;
    let m = server.domain("m");
    assert!(m.hit("k=exact").await.is_ok());
    let request = CountersRequest {
        domain: "m".into(),
        descriptor: Some(descriptor(&[("k", "exact")])),
    };
    let mut client = admin(&server).await;
    let mut attempt = tonic::Request::new(request.clone());
    attempt
        .metadata_mut()
        .insert("authorization", "Bearer anything".parse().unwrap());
    let refused = client.reset_counters(attempt).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(
        refused.message().contains("ADMIN_RESET_TOKEN_FILE"),
        "{refused:?}"
    );
    let (status, _) = http(
        server.http_addr,
        "DELETE",
        "/counters?domain=m&entry=k=exact",
        "",
    )
    .await
    .unwrap();
    assert_eq!(status, 403);
    assert!(m.hit("k=exact").await.is_over_limit(), "nothing was reset");
    drop(server);

    // With a token file: the exact token, re-read on each reset (a rotated Secret).
    let token = token_file("admin-token-rotation", "first");
    let server = TestServer::start_with(settings(with_token(&token))).await;
    let mut client = admin(&server).await;
    let send = |token: Option<&str>| {
        let mut attempt = tonic::Request::new(request.clone());
        if let Some(token) = token {
            attempt
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        attempt
    };
    for wrong in [None, Some("firs"), Some("first2"), Some("")] {
        let refused = client.reset_counters(send(wrong)).await.unwrap_err();
        assert_eq!(refused.code(), Code::Unauthenticated, "{wrong:?}");
    }
    assert!(client.reset_counters(send(Some("first"))).await.is_ok());
    std::fs::write(&token, "second").unwrap();
    let refused = client
        .reset_counters(send(Some("first")))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    assert!(client.reset_counters(send(Some("second"))).await.is_ok());
    let (status, _) = common::http_with_headers(
        server.http_addr,
        "DELETE",
        "/counters?domain=m&entry=k=exact",
        &[("authorization", "Bearer first")],
        "",
    )
    .await
    .unwrap();
    assert_eq!(status, 401);

    // Every attempt is counted.
    let (_, page) = http_get(server.http_addr, "/metrics").await.unwrap();
    let count = |via: &str, outcome: &str| {
        metric::<u64>(
            &page,
            &format!("sluice_counter_resets_total{{outcome=\"{outcome}\",via=\"{via}\"}}"),
        )
    };
    assert_eq!(count("grpc", "unauthenticated"), Some(5));
    assert_eq!(count("grpc", "reset"), Some(2));
    assert_eq!(count("http", "unauthenticated"), Some(1));
}

#[tokio::test]
async fn a_client_certificate_for_the_named_san_may_reset_on_the_mutual_tls_port() {
    let certs = temp_dir("admin-certs");
    common::certs::make(&certs);
    for (san, admitted) in [("client.sluice.test", true), ("ops.sluice.test", false)] {
        let mut settings = settings(ResetSettings {
            token_file: None,
            client_san: Some(san.into()),
        });
        settings.grpc_tls = Some(sluice::tls::TlsFiles {
            cert: certs.join("server.crt"),
            key: certs.join("server.key"),
            client_ca: Some(certs.join("ca.crt")),
            client_san: None,
        });
        let server = TestServer::start_with(settings).await;
        let tls = tonic::transport::ClientTlsConfig::new()
            .domain_name("localhost")
            .ca_certificate(tonic::transport::Certificate::from_pem(
                std::fs::read(certs.join("ca.crt")).unwrap(),
            ))
            .identity(tonic::transport::Identity::from_pem(
                std::fs::read(certs.join("client.crt")).unwrap(),
                std::fs::read(certs.join("client.key")).unwrap(),
            ));
        let channel = tonic::transport::Endpoint::from_shared(format!(
            "https://localhost:{}",
            server.grpc_addr.port()
        ))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
        let answer = AdminClient::new(channel)
            .reset_counters(CountersRequest {
                domain: "m".into(),
                descriptor: Some(descriptor(&[("k", "exact")])),
            })
            .await;
        match answer {
            Ok(answer) => {
                assert!(admitted, "{san}");
                assert_eq!(answer.into_inner().counters, ["m|k=exact|60s:fw"]);
            }
            Err(status) => {
                assert!(!admitted, "{san}: {status:?}");
                assert_eq!(status.code(), Code::Unauthenticated);
            }
        }
    }
}

// Two threads: the CLI runs as a process the test waits for, while the server answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_explains_reads_and_resets() {
    let token = token_file("admin-token-cli", "cli-token");
    let server = TestServer::start_with(settings(with_token(&token))).await;
    assert!(server.domain("m").hit("k=other").await.is_ok());
    let addr = server.grpc_addr.to_string();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(args)
            .args(["--addr", &addr, "--domain", "m"])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = run(&[
        "explain",
        "--descriptor",
        "k=other",
        "--descriptor",
        "parent=p",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("MATCHED: rule `m.k` applies"), "{out}");
    assert!(out.contains("level 1 k=other: KEY_ONLY"), "{out}");
    assert!(out.contains("counter m|k=other|60s:fw"), "{out}");
    assert!(out.contains("DEPTH"), "{out}");
    let (code, out, err) = run(&["counters", "get", "--descriptor", "k=other"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("used 1, remaining 2"), "{out}");
    let (code, _, err) = run(&["counters", "reset", "--descriptor", "k=other"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("Unauthenticated"), "{err}");
    let token = token.to_str().unwrap();
    let (code, out, err) = run(&[
        "counters",
        "reset",
        "--descriptor",
        "k=other",
        "--token-file",
        token,
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("reset 1 counters of k=other (1 held state)"),
        "{out}"
    );
    let (_, out, _) = run(&["counters", "get", "--descriptor", "k=other", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["counters"][0]["used"], "0", "{out}");
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
