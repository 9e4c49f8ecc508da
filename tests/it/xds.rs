// Why one long file: one control plane scenario per test, sharing the Envoy Gateway rules and
// settings at the top.
//! The xDS config source against a control plane in the test (`crate::common::xds`), as Envoy
//! Gateway's serves it.

use crate::common::xds::Running;
use crate::common::{TestServer, config_dir, http_get};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use prost::Name;
use sluice::settings::Settings;
use sluice::source::xds::XdsSettings;

/// Envoy Gateway's shape: a route descriptor whose value is the route name, nested
/// `rule-N-match-M` descriptors; `per_hour` hits an hour.
fn gateway(per_hour: u32) -> RateLimitConfig {
    RateLimitConfig {
        name: "default/eg/http".into(),
        domain: "default/eg/http".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "httproute/default/backend/rule/0/match/0/example_com".into(),
            value: "httproute/default/backend/rule/0/match/0/example_com".into(),
            descriptors: vec![
                RateLimitDescriptor {
                    key: "rule-0-match-0".into(),
                    value: "rule-0-match-0".into(),
                    rate_limit: Some(RateLimitPolicy {
                        unit: RateLimitUnit::Hour as i32,
                        requests_per_unit: per_hour,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                RateLimitDescriptor {
                    key: "rule-0-match-1".into(),
                    rate_limit: Some(RateLimitPolicy {
                        unlimited: true,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ],
            ..Default::default()
        }],
    }
}

const ROUTE: &str = "httproute/default/backend/rule/0/match/0/example_com";

fn settings(plane: &Running, force_start: bool) -> Settings {
    let mut settings = Settings::for_tests(config_dir("xds-unused", &[]));
    settings.xds = Some(XdsSettings {
        node_metadata: vec![("zone".into(), "a".into())],
        headers: vec![("x-test".into(), "1".into())],
        force_start,
        ..plane.client()
    });
    settings
}

/// The limit (hits per unit) that answered `decision`'s first descriptor.
fn limit_of(decision: &crate::common::Decision) -> u32 {
    decision.statuses[0]
        .current_limit
        .as_ref()
        .unwrap()
        .requests_per_unit
}

fn spec(rule: &str) -> String {
    format!("{ROUTE}={ROUTE},{rule}={rule}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_from_the_control_plane_are_enforced_and_acked() {
    let plane = Running::start().await;
    plane.serve("1", &[gateway(2)]);
    let server = TestServer::start_with(settings(&plane, false)).await;
    let ack = plane.reply_to("1").await;
    assert_eq!(ack.version_info, "1");
    assert!(ack.error_detail.is_none(), "{ack:?}");
    let first = plane.plane.seen.lock()[0].clone();
    assert_eq!(first.type_url, RateLimitConfig::type_url());
    let node = first.node.unwrap();
    assert_eq!(node.id, "envoy-ratelimit");
    let domain = server.domain("default/eg/http");
    let limited = spec("rule-0-match-0");
    assert!(domain.hit(&limited).await.is_ok());
    assert!(domain.hit(&limited).await.is_ok());
    assert!(domain.hit(&limited).await.is_over_limit());
    // Unlimited arrives as unit UNKNOWN.
    let unlimited = domain
        .hit(&format!("{ROUTE}={ROUTE},rule-0-match-1=x"))
        .await;
    assert_eq!(unlimited.remaining(), [u32::MAX]);
    // A new snapshot changes what is enforced.
    plane.serve("2", &[gateway(100)]);
    assert_eq!(plane.reply_to("2").await.version_info, "2");
    assert_eq!(
        domain.hit(&limited).await.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        100
    );
    let (_, page) = http_get(server.http_addr, "/rlconfig").await.unwrap();
    assert!(page.contains("xds 127.0.0.1:"), "{page}");
    assert!(
        page.contains("# source: subscribed to 127.0.0.1:"),
        "{page}"
    );
    assert!(
        page.contains("# last reload: ok at") && page.contains("(xds version 2)"),
        "{page}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_snapshot_is_nacked_and_the_previous_one_stays() {
    let plane = Running::start().await;
    plane.serve("1", &[gateway(2)]);
    let server = TestServer::start_with(settings(&plane, false)).await;
    plane.reply_to("1").await;
    let mut bad = gateway(2);
    bad.domain.clear();
    plane.serve("2", &[bad]);
    let nack = plane.reply_to("2").await;
    assert_eq!(nack.version_info, "1", "the last accepted version");
    let detail = nack.error_detail.expect("a NACK says why");
    assert!(detail.message.contains("empty domain"), "{detail:?}");
    // A resource that does not decode, and one of the wrong type.
    plane.serve_any(
        "3",
        vec![
            Any {
                type_url: RateLimitConfig::type_url(),
                value: vec![0xff, 0xff, 0xff],
            },
            Any {
                type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
                value: Vec::new(),
            },
        ],
    );
    let nack = plane.reply_to("3").await;
    assert_eq!(nack.version_info, "1");
    let message = nack.error_detail.unwrap().message;
    assert!(
        message.contains("does not decode") && message.contains("unexpected type_url"),
        "{message}"
    );
    // Counted as the reference counts config loads: one success, two rejections.
    let (_, page) = http_get(server.http_addr, "/metrics").await.unwrap();
    assert_eq!(
        crate::common::metric::<u64>(&page, "ratelimit_service_config_load_success"),
        Some(1)
    );
    assert_eq!(
        crate::common::metric::<u64>(&page, "ratelimit_service_config_load_error"),
        Some(2)
    );
    let (_, page) = http_get(server.http_addr, "/rlconfig").await.unwrap();
    assert!(page.contains("# last reload: rejected at"), "{page}");
    // Version 1 is still in force.
    let domain = server.domain("default/eg/http");
    let limited = spec("rule-0-match-0");
    assert!(domain.hit(&limited).await.is_ok());
    assert!(domain.hit(&limited).await.is_ok());
    assert!(domain.hit(&limited).await.is_over_limit());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_control_plane_is_picked_up_and_the_policy_stays_meanwhile() {
    let plane = Running::start().await;
    let addr = plane.addr;
    plane.serve("1", &[gateway(2)]);
    let server = TestServer::start_with(settings(&plane, false)).await;
    plane.reply_to("1").await;
    drop(plane);
    // Gone: the policy in force still decides.
    let domain = server.domain("default/eg/http");
    let limited = spec("rule-0-match-0");
    assert!(domain.hit(&limited).await.is_ok());
    // Back on the same address, with a new version: Sluice reconnects within its backoff.
    let plane = Running::start_on(addr).await;
    plane.serve("2", &[gateway(100)]);
    assert_eq!(plane.reply_to("2").await.version_info, "2");
    let r = domain.hit(&limited).await;
    assert_eq!(limit_of(&r), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_force_start_readiness_waits_for_the_first_config() {
    let plane = Running::start().await;
    let server = TestServer::start_unready(settings(&plane, false)).await;
    let (status, body) = http_get(server.http_addr, "/healthcheck").await.unwrap();
    assert_eq!(status, 503, "{body}");
    let error = server
        .domain("default/eg/http")
        .try_hits(&spec("rule-0-match-0"), 1)
        .await
        .unwrap_err();
    assert_eq!(error.message(), "no rate limit configuration loaded");
    plane.serve("1", &[gateway(2)]);
    crate::common::eventually("ready once the first config is in", || async {
        http_get(server.http_addr, "/healthcheck").await.unwrap().0 == 200
    })
    .await;
    assert!(
        server
            .domain("default/eg/http")
            .hit(&spec("rule-0-match-0"))
            .await
            .is_ok()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_force_start_it_serves_at_once_and_errors_until_the_first_config() {
    let plane = Running::start().await;
    let server = TestServer::start_with(settings(&plane, true)).await;
    assert_eq!(
        http_get(server.http_addr, "/healthcheck").await.unwrap().0,
        200
    );
    let domain = server.domain("default/eg/http");
    let error = domain
        .try_hits(&spec("rule-0-match-0"), 1)
        .await
        .unwrap_err();
    assert_eq!(error.code(), tonic::Code::Unavailable);
    plane.serve("1", &[gateway(2)]);
    plane.reply_to("1").await;
    crate::common::eventually("decisions once the first config is in", || async {
        domain.try_hits(&spec("rule-0-match-0"), 1).await.is_ok()
    })
    .await;
    // 2 an hour: the hit that found the config in force, this one, then no more.
    assert_eq!(domain.hit(&spec("rule-0-match-0")).await.remaining(), [0]);
    let r = domain.hit(&spec("rule-0-match-0")).await;
    assert_eq!(r.code(), Code::OverLimit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_is_reached_over_mutual_tls() {
    let certs = crate::common::certs::fresh("xds-certs");
    let plane = Running::start_mutual_tls(&certs).await;
    plane.serve("1", &[gateway(2)]);
    let tls = |cert: bool| sluice::source::xds::XdsTls {
        ca: Some(certs.join("ca.crt")),
        cert: cert.then(|| certs.join("client.crt")),
        key: cert.then(|| certs.join("client.key")),
        server_name: Some("localhost".into()),
    };
    let mut with_cert = settings(&plane, false);
    with_cert.xds.as_mut().unwrap().tls = Some(tls(true));
    let server = TestServer::start_with(with_cert).await;
    assert!(plane.reply_to("1").await.error_detail.is_none());
    let domain = server.domain("default/eg/http");
    assert!(domain.hit(&spec("rule-0-match-0")).await.is_ok());
    // Without a client certificate the control plane lets nobody in: never ready.
    let plane = Running::start_mutual_tls(&certs).await;
    plane.serve("1", &[gateway(2)]);
    let mut without = settings(&plane, false);
    without.xds.as_mut().unwrap().tls = Some(tls(false));
    let refused = TestServer::start_unready(without).await;
    crate::common::eventually("/rlconfig says the control plane refused", || async {
        let (_, page) = http_get(refused.http_addr, "/rlconfig").await.unwrap();
        page.contains("# source: unreachable")
    })
    .await;
    assert_eq!(
        http_get(refused.http_addr, "/healthcheck").await.unwrap().0,
        503
    );
    assert!(
        plane.plane.seen.lock().is_empty(),
        "no subscription got through"
    );
}

/// A node id the control plane has no snapshot for gets nothing: Sluice stays up, unready,
/// asking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_node_id_gets_nothing_and_sluice_stays_up() {
    let plane = Running::start().await;
    plane.only_for("envoy-ratelimit");
    plane.serve("1", &[gateway(2)]);
    let mut wrong = settings(&plane, false);
    wrong.xds.as_mut().unwrap().node_id = "someone-else".into();
    let server = TestServer::start_unready(wrong).await;
    crate::common::eventually("subscribed", || {
        std::future::ready(!plane.plane.seen.lock().is_empty())
    })
    .await;
    let (status, body) = http_get(server.http_addr, "/healthcheck").await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("no rate limit configuration"), "{body}");
    let (status, _) = http_get(server.http_addr, "/rlconfig").await.unwrap();
    assert_eq!(status, 200, "up and answering");
}

/// A response over `XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES` is refused by the transport: the
/// stream fails, the policy in force stays, and Sluice says so and asks again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_over_the_size_limit_changes_nothing() {
    let plane = Running::start().await;
    plane.serve("1", &[gateway(2)]);
    let mut small = settings(&plane, false);
    small.xds.as_mut().unwrap().max_message_bytes = 2048;
    let server = TestServer::start_with(small).await;
    plane.reply_to("1").await;
    let mut huge = gateway(100);
    huge.name = "x".repeat(4096);
    plane.serve("2", &[huge]);
    crate::common::eventually("/rlconfig says the stream failed", || async {
        let (_, page) = http_get(server.http_addr, "/rlconfig").await.unwrap();
        page.contains("# source: unreachable")
    })
    .await;
    let r = server
        .domain("default/eg/http")
        .hit(&spec("rule-0-match-0"))
        .await;
    assert_eq!(limit_of(&r), 2);
}

/// Envoy Gateway's environment for the reference, verbatim but for paths and ports, against a
/// control plane that requires client certificates: the rules it pushes are enforced over
/// mutual TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateways_environment_works_unchanged() {
    let certs = crate::common::certs::fresh("xds-eg-certs");
    let file = |name: &str| certs.join(name).to_str().unwrap().to_owned();
    let plane = Running::start_mutual_tls(&certs).await;
    plane.only_for("envoy-ratelimit");
    plane.serve("1", &[gateway(2)]);
    let url = format!("localhost:{}", plane.addr.port());
    let (cert, key, ca) = (file("server.crt"), file("server.key"), file("ca.crt"));
    let (client_cert, client_key) = (file("client.crt"), file("client.key"));
    let dir = config_dir("xds-eg", &[]);
    let env = [
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("LOG_LEVEL", "info"),
        ("USE_STATSD", "false"),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", url.as_str()),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", cert.as_str()),
        ("GRPC_SERVER_TLS_KEY", key.as_str()),
        ("GRPC_SERVER_TLS_CA_CERT", ca.as_str()),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", client_cert.as_str()),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", client_key.as_str()),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ca.as_str()),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
    ];
    let served = crate::common::SluiceProcess::spawn_with_env(&dir, &[], &env);
    served.assert_no_unsupported_variable();
    plane.reply_to("1").await;
    let check = || {
        let descriptor = spec("rule-0-match-0");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args([
                "check",
                "--addr",
                &served.grpc,
                "--domain",
                "default/eg/http",
            ])
            .args(["--descriptor", &descriptor, "--tls-ca", &ca])
            .args(["--tls-cert", &client_cert, "--tls-key", &client_key])
            .args(["--tls-server-name", "localhost"])
            .output()
            .unwrap();
        out.status.code()
    };
    assert_eq!(check(), Some(0));
    assert_eq!(check(), Some(0));
    assert_eq!(check(), Some(2), "OVER_LIMIT: two an hour");
}

/// Envoy Gateway's usage budgets (`cost.response`) arrive as plain rules: the proto cannot
/// say "budget". With the domain in `XDS_USAGE_BUDGET_DOMAINS` its rules are usage budgets:
/// the stream-done report that crosses the limit counts, the next check is refused; another
/// domain's rules still charge nothing when refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_domains_named_as_usage_budgets_count_every_report() {
    let plane = Running::start().await;
    let other = RateLimitConfig {
        name: "default/eg/other".into(),
        domain: "default/eg/other".into(),
        ..gateway(100)
    };
    plane.serve("1", &[gateway(100), other]);
    let mut settings = settings(&plane, false);
    if let Some(xds) = settings.xds.as_mut() {
        xds.usage_budget_domains = vec!["default/eg/http".into()];
    }
    let server = TestServer::start_with(settings).await;
    assert_eq!(plane.reply_to("1").await.version_info, "1");
    let limited = spec("rule-0-match-0");
    for (domain, counted) in [("default/eg/http", 130), ("default/eg/other", 80)] {
        let client = server.domain(domain);
        assert!(client.charges(&[(&limited, 80)]).await.is_ok());
        // The crossing report: refused either way, counted only on the budget.
        assert!(client.charges(&[(&limited, 50)]).await.is_over_limit());
        let check = client.charges(&[(&limited, 0)]).await;
        let left = check.remaining()[0];
        assert_eq!(
            (check.is_over_limit(), left),
            (counted > 100, 100u32.saturating_sub(counted)),
            "{domain}: {counted} used"
        );
    }
    let (_, page) = http_get(server.http_addr, "/rlconfig").await.unwrap();
    assert!(page.contains("overdraft: true"), "{page}");
}
