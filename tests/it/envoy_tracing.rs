//! One trace from Envoy into Sluice: a real Envoy with its OpenTelemetry tracer and Sluice
//! with tracing on both export to the OTLP receiver in the test (Envoy over gRPC, Sluice over
//! HTTP); one request through Envoy gives Envoy's spans and Sluice's in one trace, Sluice's
//! span a child of Envoy's rate limit call. The same with Envoy's Zipkin tracer, which passes
//! the trace on in B3 headers.

use crate::common::envoy::{self, Bootstrap, Envoy};
use crate::common::otlp::Collector;
use crate::common::{TestServer, config_dir};
use sluice::settings::Settings;
use sluice::traces::OtlpProtocol;

const CONFIG: &str = r#"
domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 1}
"#;

/// Envoy's OpenTelemetry tracer, exporting to the receiver's gRPC port.
fn opentelemetry_tracer() -> &'static str {
    r#"name: envoy.tracers.opentelemetry
              typed_config:
                "@type": type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig
                grpc_service:
                  envoy_grpc: {cluster_name: otlp}
                  timeout: 2s
                service_name: front-envoy"#
}

/// Envoy's Zipkin tracer (B3 headers), exporting to the receiver's HTTP port.
fn zipkin_tracer() -> &'static str {
    r#"name: envoy.tracers.zipkin
              typed_config:
                "@type": type.googleapis.com/envoy.config.trace.v3.ZipkinConfig
                collector_cluster: zipkin
                collector_endpoint: /api/v2/spans
                collector_endpoint_version: HTTP_JSON
                trace_id_128bit: true"#
}

/// Sluice exporting to the receiver over OTLP/HTTP.
async fn traced_sluice(collector: &Collector) -> TestServer {
    let mut settings = Settings::for_tests(config_dir("envoy-tracing", &[("edge.yaml", CONFIG)]));
    settings.tracing = Some(crate::common::otlp::tracing_settings(
        OtlpProtocol::Http,
        format!("http://{}/v1/traces", collector.http),
    ));
    TestServer::start_with(settings).await
}

/// A traced Sluice behind an Envoy tracing with `tracer`, both exporting to `collector`.
struct Edge {
    _sluice: TestServer,
    _envoy: Envoy,
    /// Envoy's front listener.
    front: u16,
}

async fn traced_edge(collector: &Collector, tracer: &str) -> Edge {
    let sluice = traced_sluice(collector).await;
    let (envoy, front) = Bootstrap::new(sluice.grpc_addr.port())
        .preamble(
            "node: {id: edge-1, cluster: front-envoy}
layered_runtime:
  layers:
  - name: flush-now
    static_layer:
      tracing.opentelemetry.flush_interval_ms: 100
      tracing.opentelemetry.min_flush_spans: 1
      tracing.zipkin.flush_interval_ms: 100
      tracing.zipkin.min_flush_spans: 1",
        )
        .connection_manager(&format!(
            "          tracing:
            random_sampling: {{value: 100}}
            provider:
              {tracer}"
        ))
        .cluster("otlp", collector.grpc.port(), true)
        .cluster("zipkin", collector.http.port(), false)
        .start()
        .await;
    Edge {
        _envoy: envoy,
        _sluice: sluice,
        front,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_through_envoy_is_one_trace_with_sluices_span_under_envoys_rate_limit_call() {
    let collector = Collector::start().await;
    let edge = traced_edge(&collector, opentelemetry_tracer()).await;
    let front = edge.front;

    let (status, _, _) = envoy::get(front, "/", &[("x-api-key", "secret-key-1")]).await;
    assert_eq!(status, 200);
    let (status, _, _) = envoy::get(front, "/", &[("x-api-key", "secret-key-1")]).await;
    assert_eq!(status, 429);

    let ours = collector
        .span("Sluice's span of the refused request", |s| {
            s.service == "ratelimit" && s.attr("ratelimit.code") == Some("OVER_LIMIT")
        })
        .await;
    let call = collector
        .span("Envoy's span of that rate limit call", |s| {
            s.service == "front-envoy" && s.span_id == ours.parent_span_id
        })
        .await;
    assert_eq!(call.trace_id, ours.trace_id, "one trace");
    assert!(call.name.contains("ShouldRateLimit"), "{call:?}");
    let ingress = collector
        .span("Envoy's span of the request", |s| {
            s.service == "front-envoy" && s.span_id == call.parent_span_id
        })
        .await;
    assert_eq!(ingress.trace_id, ours.trace_id);
    assert_eq!(ours.attr("ratelimit.domain"), Some("edge"));
    assert_eq!(ours.attr("ratelimit.rule"), Some("edge.api_key"));
    assert_eq!(ours.attr("ratelimit.answered_by"), Some("store"));
    collector
        .span("Sluice's store call under its span", |s| {
            s.name == "store call" && s.parent_span_id == ours.span_id
        })
        .await;
    for span in collector
        .spans()
        .iter()
        .filter(|s| s.service == "ratelimit")
    {
        assert!(
            span.attributes
                .values()
                .all(|v| !v.contains("secret-key-1")),
            "{span:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_envoys_zipkin_tracer_b3_headers_make_sluices_span_a_child_too() {
    let collector = Collector::start().await;
    let edge = traced_edge(&collector, zipkin_tracer()).await;
    let front = edge.front;
    // The client's own B3 trace, which Envoy continues and passes on in B3 headers.
    let trace = "6e0c63257de34c926f9efcd03927272e";
    let (status, _, _) = envoy::get(
        front,
        "/",
        &[
            ("x-api-key", "b3-key"),
            ("x-b3-traceid", trace),
            ("x-b3-spanid", "e457b5a2e4d86bd1"),
            ("x-b3-sampled", "1"),
        ],
    )
    .await;
    assert_eq!(status, 200);
    let ours = collector
        .span("Sluice's span in the client's B3 trace", |s| {
            s.service == "ratelimit" && s.name.ends_with("/ShouldRateLimit") && s.trace_id == trace
        })
        .await;
    assert_ne!(
        ours.parent_span_id, "e457b5a2e4d86bd1",
        "Envoy's span sits between"
    );
    let call = collector
        .span("Envoy's Zipkin span of the rate limit call", |s| {
            s.service == "front-envoy" && s.span_id == ours.parent_span_id
        })
        .await;
    assert_eq!(call.trace_id, trace);
    assert!(call.name.contains("ShouldRateLimit"), "{call:?}");
}
