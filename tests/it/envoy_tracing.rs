//! One trace from Envoy into Sluice: a real Envoy with its OpenTelemetry tracer and Sluice
//! with tracing on both export to the OTLP receiver in the test (Envoy over gRPC, Sluice over
//! HTTP); one request through Envoy gives Envoy's spans and Sluice's in one trace, Sluice's
//! span a child of Envoy's rate limit call. The same with Envoy's Zipkin tracer, which passes
//! the trace on in B3 headers.

use std::net::TcpListener as StdListener;

use crate::common::envoy::{self, Envoy};
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

fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

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

/// Envoy: a traced front listener whose route asks Sluice, proxying to a direct response.
fn bootstrap(
    front: u16,
    upstream: u16,
    admin: u16,
    sluice: u16,
    collector: &Collector,
    tracer: &str,
) -> String {
    let (otlp, zipkin) = (collector.grpc.port(), collector.http.port());
    let cluster = |name: &str, port: u16, h2: bool| {
        let h2 = if h2 {
            r#"
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}"#
        } else {
            ""
        };
        format!(
            r#"
  - name: {name}
    type: STATIC{h2}
    load_assignment:
      cluster_name: {name}
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]"#
        )
    };
    let clusters = [
        cluster("upstream", upstream, false),
        cluster("sluice", sluice, true),
        cluster("otlp", otlp, true),
        cluster("zipkin", zipkin, false),
    ]
    .concat();
    format!(
        r#"
node: {{id: edge-1, cluster: front-envoy}}
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
layered_runtime:
  layers:
  - name: flush-now
    static_layer:
      tracing.opentelemetry.flush_interval_ms: 100
      tracing.opentelemetry.min_flush_spans: 1
      tracing.zipkin.flush_interval_ms: 100
      tracing.zipkin.min_flush_spans: 1
static_resources:
  listeners:
  - name: front
    address: {{socket_address: {{address: 127.0.0.1, port_value: {front}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: front
          tracing:
            random_sampling: {{value: 100}}
            provider:
              {tracer}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions:
                    - request_headers: {{header_name: x-api-key, descriptor_key: api_key}}
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: edge
              failure_mode_deny: true
              timeout: 2s
              rate_limit_service:
                transport_api_version: V3
                grpc_service:
                  envoy_grpc: {{cluster_name: sluice}}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  - name: upstream
    address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: upstream
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                direct_response: {{status: 200, body: {{inline_string: "hello"}}}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:{clusters}
"#
    )
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
    let (front, upstream, admin) = (free_port(), free_port(), free_port());
    let config = bootstrap(
        front,
        upstream,
        admin,
        sluice.grpc_addr.port(),
        collector,
        tracer,
    );
    Edge {
        _envoy: Envoy::start(&config, admin).await,
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
