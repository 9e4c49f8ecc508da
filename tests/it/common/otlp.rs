//! An OTLP receiver standing in for an OpenTelemetry collector (none can be installed
//! here): OTLP/gRPC (`TraceService/Export`) and OTLP/HTTP (`POST /v1/traces`, protobuf),
//! decoded with the `opentelemetry-proto` types, keeping every span it is sent; and, for
//! Envoy's Zipkin tracer, Zipkin's JSON v2 (`POST /api/v2/spans`) on the HTTP port.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use parking_lot::Mutex;
use prost::Message;

/// One span as received.
#[derive(Debug, Clone)]
pub struct Span {
    /// The resource's `service.name`.
    pub service: String,
    /// Every resource attribute, as text.
    pub resource: BTreeMap<String, String>,
    pub name: String,
    /// Hex, as in `traceparent`.
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// OTLP's span kind (2: server, 1: internal, 3: client).
    pub kind: i32,
    /// Every attribute, as text.
    pub attributes: BTreeMap<String, String>,
    /// OTLP's status code (2: error).
    pub status: i32,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
}

impl Span {
    /// The attribute `key`, as text.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// The receiver: its two addresses and what it got.
#[derive(Clone)]
pub struct Collector {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
    requests: Arc<Mutex<Vec<BTreeMap<String, String>>>>,
}

#[derive(Clone)]
struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
    requests: Arc<Mutex<Vec<BTreeMap<String, String>>>>,
}

impl Receiver {
    fn keep(&self, request: ExportTraceServiceRequest, headers: BTreeMap<String, String>) {
        self.requests.lock().push(headers);
        let mut spans = self.spans.lock();
        for resource_spans in request.resource_spans {
            let resource: BTreeMap<String, String> = resource_spans
                .resource
                .map(|r| attributes(&r.attributes))
                .unwrap_or_default();
            let service = resource.get("service.name").cloned().unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for s in scope.spans {
                    spans.push(Span {
                        service: service.clone(),
                        resource: resource.clone(),
                        name: s.name,
                        trace_id: hex(&s.trace_id),
                        span_id: hex(&s.span_id),
                        parent_span_id: hex(&s.parent_span_id),
                        kind: s.kind,
                        attributes: attributes(&s.attributes),
                        status: s.status.map_or(0, |st| st.code),
                        start_unix_nano: s.start_time_unix_nano,
                        end_unix_nano: s.end_time_unix_nano,
                    });
                }
            }
        }
    }
}

impl Receiver {
    fn keep_zipkin(&self, spans: &[serde_json::Value]) {
        let text = |v: &serde_json::Value, k: &str| v[k].as_str().unwrap_or_default().to_owned();
        let mut kept = self.spans.lock();
        for s in spans {
            let attributes = s["tags"]
                .as_object()
                .map(|t| {
                    t.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                        .collect()
                })
                .unwrap_or_default();
            kept.push(Span {
                service: text(&s["localEndpoint"], "serviceName"),
                resource: BTreeMap::new(),
                name: text(s, "name"),
                trace_id: text(s, "traceId"),
                span_id: text(s, "id"),
                parent_span_id: text(s, "parentId"),
                kind: match s["kind"].as_str() {
                    Some("SERVER") => 2,
                    Some("CLIENT") => 3,
                    _ => 1,
                },
                attributes,
                status: 0,
                start_unix_nano: s["timestamp"].as_u64().unwrap_or(0) * 1000,
                end_unix_nano: (s["timestamp"].as_u64().unwrap_or(0)
                    + s["duration"].as_u64().unwrap_or(0))
                    * 1000,
            });
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attributes(
    kvs: &[opentelemetry_proto::tonic::common::v1::KeyValue],
) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(i)) => i.to_string(),
                Some(Value::BoolValue(b)) => b.to_string(),
                Some(Value::DoubleValue(d)) => d.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let headers = request
            .metadata()
            .iter()
            .filter_map(|kv| match kv {
                tonic::metadata::KeyAndValueRef::Ascii(k, v) => {
                    Some((k.to_string(), v.to_str().ok()?.to_owned()))
                }
                _ => None,
            })
            .collect();
        self.keep(request.into_inner(), headers);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Collector {
    /// Starts both endpoints on loopback ports.
    pub async fn start() -> Self {
        let receiver = Receiver {
            spans: Arc::default(),
            requests: Arc::default(),
        };
        let grpc_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let grpc = grpc_listener.local_addr().unwrap();
        let service = TraceServiceServer::new(receiver.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(grpc_listener)),
        );
        let http_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http = http_listener.local_addr().unwrap();
        let http_receiver = receiver.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let receiver = http_receiver.clone();
                    async move {
                        let request = match ExportTraceServiceRequest::decode(body) {
                            Ok(r) => r,
                            Err(_) => return (axum::http::StatusCode::BAD_REQUEST, Vec::new()),
                        };
                        let headers = headers
                            .iter()
                            .filter_map(|(k, v)| Some((k.to_string(), v.to_str().ok()?.to_owned())))
                            .collect();
                        receiver.keep(request, headers);
                        (
                            axum::http::StatusCode::OK,
                            ExportTraceServiceResponse::default().encode_to_vec(),
                        )
                    }
                },
            ),
        );
        // Zipkin's JSON v2 (Envoy's Zipkin tracer, for B3 through a real Envoy), kept as spans.
        let zipkin_receiver = receiver.clone();
        let app = app.route(
            "/api/v2/spans",
            axum::routing::post(move |body: axum::body::Bytes| {
                let receiver = zipkin_receiver.clone();
                async move {
                    let spans: Vec<serde_json::Value> =
                        serde_json::from_slice(&body).unwrap_or_default();
                    receiver.keep_zipkin(&spans);
                    axum::http::StatusCode::ACCEPTED
                }
            }),
        );
        tokio::spawn(async move { axum::serve(http_listener, app).await });
        Self {
            grpc,
            http,
            spans: receiver.spans,
            requests: receiver.requests,
        }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().clone()
    }

    /// The headers of every export request received so far.
    pub fn export_headers(&self) -> Vec<BTreeMap<String, String>> {
        self.requests.lock().clone()
    }

    /// Waits (within 20 s) until a span matches `wanted`, and returns it.
    pub async fn span(&self, what: &str, wanted: impl Fn(&Span) -> bool) -> Span {
        let found: Arc<Mutex<Option<Span>>> = Arc::default();
        super::eventually_within(std::time::Duration::from_secs(20), what, || {
            let hit = self.spans().into_iter().find(|s| wanted(s));
            let found = found.clone();
            async move {
                let ok = hit.is_some();
                *found.lock() = hit;
                ok
            }
        })
        .await;
        found.lock().take().unwrap()
    }
}

/// Sluice's trace settings for tests: export to `endpoint` by `protocol` at once (a 50 ms
/// batch delay), as service `ratelimit`.
pub fn tracing_settings(
    protocol: sluice::traces::OtlpProtocol,
    endpoint: String,
) -> sluice::traces::TracingSettings {
    sluice::traces::TracingSettings {
        protocol,
        endpoint,
        headers: Vec::new(),
        timeout: std::time::Duration::from_secs(2),
        service_name: "ratelimit".into(),
        service_namespace: String::new(),
        service_instance_id: None,
        sampling_rate: 1.0,
        descriptor_values: false,
        max_queue: 2048,
        max_batch: 512,
        schedule_delay: std::time::Duration::from_millis(50),
    }
}
