//! The Envoy `envoy.service.ratelimit.v3.RateLimitService` over gRPC: decode, ask the
//! [`Limiter`], encode. This module and [`crate::admin`] are the only ones that know the
//! proto types.
//!
//! Endpoints: `RateLimitService/ShouldRateLimit`.

pub mod convert;
mod faults;
pub mod headers;
mod metadata;
mod metrics;
mod unwind;

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

use futures_util::FutureExt;

use crate::limiter::{LimitError, Limiter};
use crate::traces::{Method, RequestSpan, Tracing};

pub use faults::ClientFaultsLayer;
pub use headers::{ReferenceHeaders, ResponseOptions};
pub use metrics::RlsMetrics;
pub use unwind::panic_message;

/// The gRPC service, a thin adapter over the [`Limiter`].
#[derive(Clone)]
pub struct RlsService {
    limiter: Arc<Limiter>,
    options: Arc<ResponseOptions>,
    metrics: Option<Arc<RlsMetrics>>,
    /// Decisions are errors while it awaits the first configuration from a control plane.
    health: Option<Arc<crate::health::Health>>,
    /// A span per call, when tracing is on.
    tracing: Option<Arc<Tracing>>,
}

impl RlsService {
    /// A service answering with `limiter`, with the default response headers.
    pub fn new(limiter: Arc<Limiter>) -> Self {
        Self::with_options(limiter, ResponseOptions::default())
    }

    /// A service answering with `limiter` and the headers and body `options` ask for.
    pub fn with_options(limiter: Arc<Limiter>, options: ResponseOptions) -> Self {
        Self {
            limiter,
            options: Arc::new(options),
            metrics: None,
            health: None,
            tracing: None,
        }
    }

    /// Answers every decision with an error until `health` has its first configuration (an
    /// xDS source), so that Envoy applies its own failure mode.
    pub fn with_health(mut self, health: Arc<crate::health::Health>) -> Self {
        self.health = Some(health);
        self
    }

    /// Traces every call (`TRACING_ENABLED`).
    pub fn with_tracing(mut self, tracing: Arc<Tracing>) -> Self {
        self.tracing = Some(tracing);
        self
    }

    /// The span of a call arriving by `method` with `headers`, when tracing is on.
    pub fn span(
        &self,
        method: Method,
        headers: &tonic::codegen::http::HeaderMap,
    ) -> Option<RequestSpan> {
        self.tracing.as_ref()?.request_span(method, headers)
    }

    /// Counts requests, answers and errors in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<RlsMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Answers a request arriving by `method` (`ShouldRateLimit`, `json`), counting it and
    /// telling `span`; its caller stops waiting at `deadline`, if it said.
    pub async fn answer_counted(
        &self,
        method: &str,
        request: RateLimitRequest,
        deadline: Option<tokio::time::Instant>,
        span: Option<RequestSpan>,
    ) -> Result<RateLimitResponse, Status> {
        let started = std::time::Instant::now();
        // Two instances of one path: without a span it is the path of an untraced service.
        let result = match span {
            None => self.answer_told(request, deadline, &mut ()).await,
            Some(mut span) => {
                let result = self.answer_told(request, deadline, &mut span).await;
                end_span(span, &result);
                result
            }
        };
        if let Some(metrics) = &self.metrics {
            let code = match &result {
                Ok(r) if r.overall_code == Code::OverLimit as i32 => "OVER_LIMIT",
                Ok(_) => "OK",
                Err(status) => {
                    // The reference's two kinds: its store's errors (counted where the store
                    // call fails, answered by the failure policy or not), and the others.
                    if status.code() != tonic::Code::Unavailable {
                        metrics.should_rate_limit_error("service_error");
                    }
                    metrics.error(match status.code() {
                        tonic::Code::InvalidArgument => "invalid_request",
                        tonic::Code::ResourceExhausted => "request_too_large",
                        tonic::Code::Unavailable => "store_unavailable",
                        _ => "internal",
                    });
                    "ERROR"
                }
            };
            metrics.request(method, code, started.elapsed());
        }
        result
    }

    /// The tonic server wrapping this service.
    pub fn into_server(self) -> RateLimitServiceServer<Self> {
        RateLimitServiceServer::new(self)
    }

    /// Answers a decoded request; shared with the `/json` endpoint.
    pub async fn answer(
        &self,
        request: RateLimitRequest,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<RateLimitResponse, Status> {
        self.answer_told(request, deadline, &mut ()).await
    }

    /// Answers a decoded request, telling `told` what was asked and how it was decided.
    async fn answer_told<T: Told>(
        &self,
        request: RateLimitRequest,
        deadline: Option<tokio::time::Instant>,
        told: &mut T,
    ) -> Result<RateLimitResponse, Status> {
        told.request(&request);
        if self
            .health
            .as_ref()
            .is_some_and(|h| h.awaits_first_config())
        {
            return Err(Status::unavailable("no rate limit configuration loaded"));
        }
        let summary = self
            .options
            .dynamic_metadata
            .then(|| metadata::RequestSummary::of(&request));
        let request = convert::request_from_proto(request).map_err(Status::invalid_argument)?;
        // A panic while answering one request is a bug; it must cost that request only.
        let check = std::panic::AssertUnwindSafe(self.limiter.check_until(&request, deadline));
        let response = check
            .catch_unwind()
            .await
            .map_err(|payload| {
                let panic = panic_message(payload.as_ref());
                tracing::error!(domain = %request.domain, %panic, "panic while answering a request");
                Status::internal("internal error while answering the request")
            })?
            .map_err(status_from_error)?;
        told.decided(&response);
        let mut proto = convert::response_to_proto(&response, &self.options);
        proto.dynamic_metadata =
            summary.map(|s| s.into_struct(&response.statuses, response.metadata.as_ref()));
        Ok(proto)
    }
}

/// Maps a limiter error to the gRPC status Envoy acts on: INVALID_ARGUMENT for a bad request,
/// UNAVAILABLE for a store failure (Envoy's `failure_mode_deny` then decides).
pub fn status_from_error(error: LimitError) -> Status {
    match error {
        LimitError::InvalidRequest(message) => Status::invalid_argument(message),
        LimitError::Store(e) => {
            static LOGGED: crate::logging::Every =
                crate::logging::Every::new(std::time::Duration::from_secs(10));
            if LOGGED.ready() {
                tracing::warn!(error = %e, "store failure");
            }
            Status::unavailable(e.to_string())
        }
    }
}

#[tonic::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let deadline = grpc_timeout(request.metadata()).map(|t| tokio::time::Instant::now() + t);
        // The message is in: a turn of GRPC_MAX_IN_FLIGHT, fairly between connections.
        let peer = request
            .extensions()
            .get::<crate::net::grpc::PeerInfo>()
            .and_then(|info| info.peer.as_ref());
        let _turn = match peer {
            Some(peer) => Some(peer.turn().await),
            None => None,
        };
        let span = self.span(Method::ShouldRateLimit, request.metadata().as_ref());
        self.answer_counted("ShouldRateLimit", request.into_inner(), deadline, span)
            .await
            .map(Response::new)
    }
}

/// What is told about a request as it is answered: nothing (`()`), or its span.
trait Told: Send {
    fn request(&mut self, request: &RateLimitRequest);
    fn decided(&mut self, response: &crate::limiter::Response);
}

impl Told for () {
    fn request(&mut self, _: &RateLimitRequest) {}
    fn decided(&mut self, _: &crate::limiter::Response) {}
}

impl Told for RequestSpan {
    fn request(&mut self, request: &RateLimitRequest) {
        RequestSpan::request(self, &request.domain, request.descriptors.len(), || {
            convert::describe_values(request)
        });
    }

    fn decided(&mut self, response: &crate::limiter::Response) {
        RequestSpan::decided(self, response);
    }
}

/// Ends `span` with the answer's code (or the error's).
fn end_span(span: RequestSpan, result: &Result<RateLimitResponse, Status>) {
    match result {
        Ok(r) => {
            span.grpc_status(0);
            let code = if r.overall_code == Code::OverLimit as i32 {
                "OVER_LIMIT"
            } else {
                "OK"
            };
            span.end(code, None);
        }
        Err(status) => {
            span.grpc_status(status.code() as i64);
            span.end(&format!("{:?}", status.code()), Some(status.message()));
        }
    }
}

/// The caller's deadline from its `grpc-timeout` header (Envoy sends its filter's `timeout`,
/// 20 ms by default): at most 8 digits and a unit, per the gRPC HTTP/2 protocol; anything
/// else is ignored.
fn grpc_timeout(metadata: &tonic::metadata::MetadataMap) -> Option<std::time::Duration> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    use std::time::Duration;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
