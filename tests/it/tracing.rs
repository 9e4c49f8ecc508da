//! OpenTelemetry traces: Sluice's span of each decision joins the caller's trace (W3C
//! `traceparent`, B3 single and multiple headers), carries the decision's attributes and no
//! descriptor values, and has a child span for the store call. An OTLP receiver in the test
//! (`crate::common::otlp`) stands in for the collector, over HTTP and over gRPC.

use std::time::Duration;

use crate::common::otlp::{Collector, Span};
use crate::common::{TestServer, config_dir, descriptors, eventually, request};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::settings::{Backend, Settings};
use sluice::store::redis::{RedisKind, RedisOptions};
use sluice::traces::{OtlpProtocol, TracingSettings};

const CONFIG: &str = r#"
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
"#;

const SERVER_SPAN: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

/// The tests' settings, with a header, a namespace and an instance id.
fn tracing(protocol: OtlpProtocol, endpoint: String) -> TracingSettings {
    TracingSettings {
        headers: vec![("x-tenant".into(), "edge team".into())],
        service_namespace: "gateway".into(),
        service_instance_id: Some("pod-7".into()),
        ..crate::common::otlp::tracing_settings(protocol, endpoint)
    }
}

fn settings(tracing: TracingSettings) -> Settings {
    let mut settings = Settings::for_tests(config_dir("tracing", &[("shop.yaml", CONFIG)]));
    settings.tracing = Some(tracing);
    settings
}

async fn http_traced(collector: &Collector) -> TestServer {
    let endpoint = format!("http://{}/v1/traces", collector.http);
    TestServer::start_with(settings(tracing(OtlpProtocol::Http, endpoint))).await
}

/// `ShouldRateLimit` with extra metadata.
async fn call(
    server: &TestServer,
    request: RateLimitRequest,
    metadata: &[(&'static str, String)],
) -> i32 {
    let mut call = tonic::Request::new(request);
    for (k, v) in metadata {
        call.metadata_mut().insert(*k, v.parse().unwrap());
    }
    server
        .client()
        .await
        .should_rate_limit(call)
        .await
        .unwrap()
        .into_inner()
        .overall_code
}

fn user(id: &str) -> RateLimitRequest {
    request("shop", descriptors(&format!("user={id}")))
}

/// No attribute of any span carries `value`.
fn assert_no_value(spans: &[Span], value: &str) {
    for span in spans {
        for (k, v) in &span.attributes {
            assert!(!v.contains(value), "{k}={v} in {}", span.name);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_span_joins_the_w3c_trace_with_its_attributes_and_a_store_child() {
    let collector = Collector::start().await;
    let server = http_traced(&collector).await;
    let traceparent = format!("00-{TRACE}-{PARENT}-01");
    for _ in 0..3 {
        call(
            &server,
            user("user-4711"),
            &[("traceparent", traceparent.clone())],
        )
        .await;
    }
    let refused = collector
        .span("the refused decision's span", |s| {
            s.name == SERVER_SPAN && s.attr("ratelimit.code") == Some("OVER_LIMIT")
        })
        .await;
    assert_eq!(refused.trace_id, TRACE);
    assert_eq!(refused.parent_span_id, PARENT);
    assert_eq!(refused.kind, 2, "a server span");
    assert_eq!(refused.service, "ratelimit");
    assert_eq!(
        refused
            .resource
            .get("service.namespace")
            .map(String::as_str),
        Some("gateway")
    );
    assert_eq!(
        refused
            .resource
            .get("service.instance.id")
            .map(String::as_str),
        Some("pod-7")
    );
    assert_eq!(refused.attr("ratelimit.domain"), Some("shop"));
    assert_eq!(refused.attr("ratelimit.descriptors"), Some("1"));
    assert_eq!(refused.attr("ratelimit.rule"), Some("shop.user"));
    assert_eq!(refused.attr("ratelimit.answered_by"), Some("store"));
    assert_eq!(refused.attr("rpc.system"), Some("grpc"));
    assert_eq!(refused.attr("rpc.grpc.status_code"), Some("0"));
    let store = collector
        .span("the store call's span", |s| {
            s.name == "store call" && s.parent_span_id == refused.span_id
        })
        .await;
    assert_eq!(store.trace_id, TRACE);
    assert!(
        store.start_unix_nano >= refused.start_unix_nano
            && store.end_unix_nano <= refused.end_unix_nano
    );
    let admitted = collector
        .span("an admitted decision's span", |s| {
            s.name == SERVER_SPAN && s.attr("ratelimit.code") == Some("OK")
        })
        .await;
    assert_eq!(admitted.trace_id, TRACE);
    // Descriptor values are often user ids: not in spans by default.
    assert_no_value(&collector.spans(), "user-4711");
    // OTEL_EXPORTER_OTLP_HEADERS go with every export.
    assert!(
        collector
            .export_headers()
            .iter()
            .all(|h| h.get("x-tenant").map(String::as_str) == Some("edge team"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b3_single_and_multiple_headers_are_parents_too_over_otlp_grpc() {
    let collector = Collector::start().await;
    let endpoint = format!("http://{}", collector.grpc);
    let server = TestServer::start_with(settings(tracing(OtlpProtocol::Grpc, endpoint))).await;
    let single_trace = "80f198ee56343ba864fe8b2a57d3eff7";
    call(
        &server,
        user("a"),
        &[(
            "b3",
            format!("{single_trace}-e457b5a2e4d86bd1-1-05e3ac9a4f6e3b90"),
        )],
    )
    .await;
    let multi_trace = "463ac35c9f6413ad48485a3953bb6124";
    call(
        &server,
        user("b"),
        &[
            ("x-b3-traceid", multi_trace.to_owned()),
            ("x-b3-spanid", "a2fb4a1d1a96d312".to_owned()),
            ("x-b3-sampled", "1".to_owned()),
        ],
    )
    .await;
    let single = collector
        .span("the b3 single-header child", |s| {
            s.trace_id == single_trace && s.name == SERVER_SPAN
        })
        .await;
    assert_eq!(single.parent_span_id, "e457b5a2e4d86bd1");
    let multi = collector
        .span("the b3 multi-header child", |s| {
            s.trace_id == multi_trace && s.name == SERVER_SPAN
        })
        .await;
    assert_eq!(multi.parent_span_id, "a2fb4a1d1a96d312");
    // A caller that decided not to sample is followed: no span of its trace.
    let unsampled = "11111111111111111111111111111111";
    call(
        &server,
        user("c"),
        &[("traceparent", format!("00-{unsampled}-{PARENT}-00"))],
    )
    .await;
    call(&server, user("d"), &[]).await;
    collector
        .span("the root span of a call without a parent", |s| {
            s.attr("ratelimit.descriptors") == Some("1") && s.parent_span_id.is_empty()
        })
        .await;
    assert!(!collector.spans().iter().any(|s| s.trace_id == unsampled));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_calls_are_traced_and_descriptor_values_are_opt_in() {
    let collector = Collector::start().await;
    let mut tracing = tracing(
        OtlpProtocol::Http,
        format!("http://{}/v1/traces", collector.http),
    );
    tracing.descriptor_values = true;
    let server = TestServer::start_with(settings(tracing)).await;
    let body = r#"{"domain":"shop","descriptors":[{"entries":[{"key":"user","value":"u-9"}]}]}"#;
    let traceparent = format!("00-{TRACE}-{PARENT}-01");
    let (status, _) = crate::common::http_with_headers(
        server.http_addr,
        "POST",
        "/json",
        &[("traceparent", traceparent.as_str())],
        body,
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    let span = collector
        .span("the /json span", |s| s.name == "POST /json")
        .await;
    assert_eq!(span.trace_id, TRACE);
    assert_eq!(span.parent_span_id, PARENT);
    assert_eq!(span.attr("ratelimit.code"), Some("OK"));
    assert_eq!(span.attr("ratelimit.descriptor_values"), Some("user=u-9"));
    let (status, _) = crate::common::http(server.http_addr, "POST", "/json", "{not json")
        .await
        .unwrap();
    assert_eq!(status, 400);
    let bad = collector
        .span("the bad /json call's span", |s| {
            s.name == "POST /json" && s.attr("ratelimit.code") == Some("InvalidArgument")
        })
        .await;
    assert_eq!(bad.status, 2, "an error status");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_collector_costs_decisions_nothing_and_drops_are_counted() {
    let port = crate::common::redis::free_port();
    let server = TestServer::start_with(settings(tracing(
        OtlpProtocol::Grpc,
        format!("http://127.0.0.1:{port}"),
    )))
    .await;
    let shop = server.domain("shop");
    assert!(shop.hit("user=x").await.is_ok());
    assert!(shop.hit("user=x").await.is_ok());
    assert!(shop.hit("user=x").await.is_over_limit());
    eventually("the failed export is counted", || async {
        let (_, page) = crate::common::http_get(server.http_addr, "/metrics")
            .await
            .unwrap();
        crate::common::metric::<u64>(
            &page,
            r#"sluice_trace_spans_dropped_total{reason="export_failed"}"#,
        )
        .is_some_and(|n| n >= 3)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_spans_say_how_many_requests_shared_a_script_call_and_what_answered() {
    let collector = Collector::start().await;
    let mut redis = crate::common::redis::RedisServer::start();
    let mut settings = settings(tracing(
        OtlpProtocol::Http,
        format!("http://{}/v1/traces", collector.http),
    ));
    settings.backend = Backend::Redis;
    settings.redis = Some(RedisOptions {
        key_prefix: "traced:".into(),
        connections: 1,
        ..RedisOptions::new(redis.url(), RedisKind::Single)
    });
    settings.local_cache_keys = 1000;
    let server = TestServer::start_with(settings).await;
    // Requests sent together share script calls (one connection: one call at a time).
    let client = server.client().await;
    let calls = (0..40).map(|i| {
        let mut client = client.clone();
        async move {
            client
                .should_rate_limit(user(&format!("u{i}")))
                .await
                .unwrap()
        }
    });
    futures_util::future::join_all(calls).await;
    let shared = collector
        .span("a store call shared by several requests", |s| {
            s.name == "store call"
                && s.attr("ratelimit.store.requests_per_call")
                    .is_some_and(|n| n.parse::<u32>().unwrap() > 1)
        })
        .await;
    assert_eq!(shared.attr("ratelimit.store.script_calls"), Some("1"));
    assert_eq!(shared.attr("ratelimit.answered_by"), Some("store"));
    // A counter known to be over its limit is answered by the over-limit cache.
    let shop = server.domain("shop");
    for _ in 0..4 {
        shop.hit("user=hot").await;
    }
    collector
        .span("a decision of the over-limit cache", |s| {
            s.name == SERVER_SPAN && s.attr("ratelimit.answered_by") == Some("over_limit_cache")
        })
        .await;
    // With Redis gone, the failure mode answers, and the store span says it failed.
    redis.kill();
    assert!(shop.hit("user=cold").await.is_ok());
    let failed = collector
        .span("a decision of the failure mode", |s| {
            s.name == "store call" && s.attr("ratelimit.answered_by") == Some("failure_mode")
        })
        .await;
    assert_eq!(failed.status, 2, "an error status");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_still_queued_at_shutdown_are_sent_before_the_process_exits() {
    let collector = Collector::start().await;
    let mut tracing = tracing(
        OtlpProtocol::Http,
        format!("http://{}/v1/traces", collector.http),
    );
    // A batch would wait a minute: only the shutdown sends it.
    tracing.schedule_delay = Duration::from_secs(60);
    let mut settings = settings(tracing);
    settings.shutdown_delay = Duration::ZERO;
    let server = TestServer::start_with(settings).await;
    server.domain("shop").hit("user=last").await;
    assert!(collector.spans().is_empty());
    server.stop().await.unwrap();
    assert!(
        collector.spans().iter().any(|s| s.name == SERVER_SPAN),
        "{:?}",
        collector.spans()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlqs_reports_are_traced_in_the_streams_trace() {
    let collector = Collector::start().await;
    let server = http_traced(&collector).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let traceparent = format!("00-{TRACE}-{PARENT}-01");
    let mut stream =
        crate::common::rlqs::Stream::over_with(channel, &[("traceparent", traceparent)])
            .await
            .unwrap();
    let usage = crate::common::rlqs::usage;
    stream
        .report(
            "shop",
            vec![usage(&[("user", "a")], 1, 0), usage(&[("user", "b")], 1, 0)],
        )
        .await;
    stream.next().await;
    let span = collector
        .span("the report's span", |s| {
            s.name
                == "envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"
        })
        .await;
    assert_eq!(span.trace_id, TRACE, "{span:?}");
    assert_eq!(span.parent_span_id, PARENT, "{span:?}");
    assert_eq!(span.attr("ratelimit.domain"), Some("shop"));
    assert_eq!(span.attr("rlqs.buckets"), Some("2"));
    assert_eq!(span.attr("rlqs.new_buckets"), Some("2"));
    assert_eq!(span.attr("rlqs.assignments"), Some("2"), "{span:?}");
    assert_eq!(span.attr("ratelimit.code"), Some("OK"));
}
