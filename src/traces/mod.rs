//! OpenTelemetry traces (`TRACING_ENABLED`): one span per `ShouldRateLimit` and `/json`
//! call, a child of the caller's span when its headers carry one (W3C `traceparent` and
//! `tracestate`, B3 single or multiple headers, and W3C `baggage` are read, as the reference
//! reads them), and a child span for the store call. Spans are exported over OTLP (HTTP or
//! gRPC) from a bounded queue by a task of their own (`export.rs`); with tracing off there is
//! no [`Tracing`] and the request path only tests an `Option`.

mod b3;
mod export;
mod span;

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::propagation::{Extractor, TextMapCompositePropagator, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider, SpanExporter};
use parking_lot::Mutex;
use prometheus::Registry;
use tokio_util::sync::CancellationToken;

pub use span::{Method, RequestSpan};

/// The OTLP trace exporter and its queue.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingSettings {
    /// Transport.
    pub protocol: OtlpProtocol,
    /// The collector's URL for traces (with `/v1/traces` for HTTP).
    pub endpoint: String,
    /// Headers sent with every export.
    pub headers: Vec<(String, String)>,
    /// Longest wait for one export.
    pub timeout: Duration,
    /// `service.name`.
    pub service_name: String,
    /// `service.namespace` (empty: none).
    pub service_namespace: String,
    /// `service.instance.id` (`None`: a random UUID).
    pub service_instance_id: Option<String>,
    /// Share of traces started here that are sampled (a caller's decision wins).
    pub sampling_rate: f64,
    /// Whether spans carry descriptor values (`TRACING_DESCRIPTOR_VALUES`).
    pub descriptor_values: bool,
    /// Spans waiting for export at most (`OTEL_BSP_MAX_QUEUE_SIZE`).
    pub max_queue: usize,
    /// Spans in one export at most (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`).
    pub max_batch: usize,
    /// Longest wait of a span for its batch (`OTEL_BSP_SCHEDULE_DELAY`).
    pub schedule_delay: Duration,
}

/// OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// Protobuf over HTTP (`http/protobuf`).
    Http,
    /// gRPC.
    Grpc,
}

/// The tracer, the propagators and the export task.
pub struct Tracing {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TextMapCompositePropagator,
    descriptor_values: bool,
    stop: CancellationToken,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    timeout: std::time::Duration,
    gate: export::Gate,
}

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracing").finish_non_exhaustive()
    }
}

impl Tracing {
    /// Builds the exporter `settings` describe and starts its task (on the current Tokio
    /// runtime). Nothing is sent until a span ends; a collector that is not there is not an
    /// error here.
    pub fn start(settings: &TracingSettings, registry: &Registry) -> Result<Arc<Self>, String> {
        let mut exporter = exporter(settings)?;
        let instance = settings
            .service_instance_id
            .clone()
            .unwrap_or_else(random_uuid);
        let mut attributes = vec![
            KeyValue::new("service.name", settings.service_name.clone()),
            KeyValue::new("service.instance.id", instance.clone()),
        ];
        if !settings.service_namespace.is_empty() {
            attributes.push(KeyValue::new(
                "service.namespace",
                settings.service_namespace.clone(),
            ));
        }
        let resource = Resource::builder_empty()
            .with_attributes(attributes)
            .build();
        exporter.set_resource(&resource);
        let stop = CancellationToken::new();
        let limits = export::Limits {
            max_queue: settings.max_queue,
            max_batch: settings.max_batch,
            schedule_delay: settings.schedule_delay,
            timeout: settings.timeout,
        };
        let (processor, gate, task) =
            export::QueueProcessor::start(exporter, limits, registry, stop.clone());
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                settings.sampling_rate,
            ))))
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("sluice");
        let propagator = TextMapCompositePropagator::new(vec![
            Box::new(TraceContextPropagator::new()),
            Box::new(b3::B3::new(settings.sampling_rate)),
            Box::new(BaggagePropagator::new()),
        ]);
        tracing::info!(
            endpoint = %settings.endpoint,
            protocol = ?settings.protocol,
            service = %settings.service_name,
            instance = %instance,
            sampling_rate = settings.sampling_rate,
            "exporting traces"
        );
        Ok(Arc::new(Self {
            provider,
            tracer,
            propagator,
            descriptor_values: settings.descriptor_values,
            stop,
            task: Mutex::new(Some(task)),
            timeout: settings.timeout,
            gate,
        }))
    }

    /// The span of one call arriving by `method`, a child of the caller's span in `headers`
    /// if they carry one; `None` while the export queue is full (the span would be dropped).
    pub fn request_span(
        &self,
        method: Method,
        headers: &tonic::codegen::http::HeaderMap,
    ) -> Option<RequestSpan> {
        if !self.gate.admits() {
            return None;
        }
        let parent = self
            .propagator
            .extract_with_context(&Context::new(), &Headers(headers));
        Some(RequestSpan::start(
            &self.tracer,
            method,
            &parent,
            self.descriptor_values,
        ))
    }

    /// Exports what is queued (within the export timeout) and stops the task.
    pub async fn shutdown(&self) {
        self.stop.cancel();
        let task = self.task.lock().take();
        if let Some(task) = task {
            let _ = tokio::time::timeout(self.timeout, task).await;
        }
        let _ = self.provider.shutdown();
    }
}

/// The OTLP exporter `settings` ask for.
fn exporter(settings: &TracingSettings) -> Result<opentelemetry_otlp::SpanExporter, String> {
    let built = match settings.protocol {
        OtlpProtocol::Http => {
            if settings.endpoint.starts_with("https://") {
                return Err(format!(
                    "'{}': OTLP over HTTP is sent without TLS here; use an http:// collector, or TRACING_EXPORTER_PROTOCOL=grpc for TLS",
                    settings.endpoint
                ));
            }
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_endpoint(settings.endpoint.clone())
                .with_timeout(settings.timeout)
                .with_headers(settings.headers.iter().cloned().collect())
                .build()
        }
        OtlpProtocol::Grpc => {
            let mut metadata = tonic::metadata::MetadataMap::new();
            for (name, value) in &settings.headers {
                let key = tonic::metadata::MetadataKey::from_bytes(name.as_bytes())
                    .map_err(|e| format!("header '{name}': {e}"))?;
                let value = value
                    .parse()
                    .map_err(|_| format!("the value of header '{name}' is not valid"))?;
                metadata.insert(key, value);
            }
            let mut builder = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(settings.endpoint.clone())
                .with_timeout(settings.timeout)
                .with_metadata(metadata);
            if settings.endpoint.starts_with("https://") {
                builder = builder
                    .with_tls_config(tonic::transport::ClientTlsConfig::new().with_webpki_roots());
            }
            builder.build()
        }
    };
    built.map_err(|e| format!("the OTLP exporter for '{}': {e}", settings.endpoint))
}

/// A version 4 UUID, the reference's `service.instance.id` when none is given.
fn random_uuid() -> String {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 16];
    if ring::rand::SystemRandom::new().fill(&mut b).is_err() {
        // No randomness: the process id and time are unique enough for an instance id.
        let seed = (std::process::id() as u128) << 64
            | std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
        b = seed.to_be_bytes();
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Request headers (gRPC metadata or HTTP), read by the propagators.
struct Headers<'a>(&'a tonic::codegen::http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)?.to_str().ok()
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn instance_ids_are_version_4_uuids() {
        let id = super::random_uuid();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert_ne!(id, super::random_uuid());
    }
}
