//! Client faults caught by the gRPC transport, answered as client faults.
//!
//! tonic rejects a message it cannot decode (bad protobuf, a string that is not UTF-8) with
//! INTERNAL, and one over the size limit with OUT_OF_RANGE, before any handler sees it. Both
//! are the caller's fault: this layer answers them INVALID_ARGUMENT and RESOURCE_EXHAUSTED
//! (what gRPC's status code guide prescribes for them) and counts them in
//! `sluice_errors_total` as `invalid_request` and `request_too_large`, so an alert on
//! internal errors does not fire because a client sent garbage.

use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::Status;
use tonic::codegen::http;

use super::RlsMetrics;

/// Remaps the transport's decode errors (see the module docs).
#[derive(Clone, Default)]
pub struct ClientFaultsLayer {
    metrics: Option<Arc<RlsMetrics>>,
}

impl ClientFaultsLayer {
    /// A layer counting what it remaps in `metrics`.
    pub fn new(metrics: Option<Arc<RlsMetrics>>) -> Self {
        Self { metrics }
    }
}

impl<S> tower::Layer<S> for ClientFaultsLayer {
    type Service = ClientFaults<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ClientFaults {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service [`ClientFaultsLayer`] wraps around the gRPC routes.
#[derive(Clone)]
pub struct ClientFaults<S> {
    inner: S,
    metrics: Option<Arc<RlsMetrics>>,
}

impl<S, Req, B> tower::Service<Req> for ClientFaults<S>
where
    S: tower::Service<Req, Response = http::Response<B>>,
    S::Future: Send + 'static,
    B: Default,
{
    type Response = http::Response<B>;
    type Error = S::Error;
    type Future = crate::store::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let future = self.inner.call(request);
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let response = future.await?;
            // tonic puts the status of a failed call in the response's extensions.
            let Some(status) = response.extensions().get::<Status>() else {
                return Ok(response);
            };
            let Some((remapped, kind)) = remap(status) else {
                return Ok(response);
            };
            if let Some(metrics) = &metrics {
                metrics.error(kind);
            }
            Ok(remapped.into_http())
        })
    }
}

/// The client-fault status for a transport error, and its error kind; `None` for any other.
fn remap(status: &Status) -> Option<(Status, &'static str)> {
    crate::net::grpc::client_fault(status, "RateLimitRequest")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn decode_errors_become_client_faults_and_nothing_else_changes() {
        let undecodable =
            Status::internal("failed to decode Protobuf message: invalid string value");
        assert_eq!(
            remap(&undecodable).map(|(s, k)| (s.code(), k)),
            Some((Code::InvalidArgument, "invalid_request"))
        );
        let large = Status::out_of_range(
            "Error, decoded message length too large: found 5000000 bytes, the limit is: 4194304 bytes",
        );
        assert_eq!(
            remap(&large).map(|(s, k)| (s.code(), k)),
            Some((Code::ResourceExhausted, "request_too_large"))
        );
        // Our own errors keep their codes.
        assert!(
            remap(&Status::internal(
                "internal error while answering the request"
            ))
            .is_none()
        );
        assert!(remap(&Status::unavailable("store unavailable")).is_none());
    }
}
