//! The gRPC server of `RateLimitQuotaService`, written out instead of generated so that an
//! answer goes to the connection already encoded: the connection's task, on the runtime that
//! answers decisions, copies bytes, while the encoding of a stream's answers (a renewal of
//! 10,000 buckets) happens on the RLQS thread.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic::codegen::{Bytes, http};
use tonic::{Request, Response, Status, Streaming};

use super::RlqsService;

/// The service's gRPC name.
const NAME: &str = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService";

/// The method's path.
const STREAM: &str =
    "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas";

/// Reports decoded with prost, answers already encoded.
#[derive(Default)]
struct Encoded;

/// Writes an answer's bytes as they are.
struct Verbatim;

impl Encoder for Verbatim {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        prost::bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl Codec for Encoded {
    type Encode = Bytes;
    type Decode = RateLimitQuotaUsageReports;
    type Encoder = Verbatim;
    type Decoder = tonic_prost::ProstDecoder<RateLimitQuotaUsageReports>;

    fn encoder(&mut self) -> Verbatim {
        Verbatim
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::default()
    }
}

/// The answers of one stream, encoded.
pub type Answers = Pin<Box<dyn futures_util::Stream<Item = Result<Bytes, Status>> + Send>>;

/// The tonic server of [`RlqsService`].
#[derive(Clone)]
pub struct RlqsServer {
    service: RlqsService,
}

impl RlqsServer {
    pub(super) fn new(service: RlqsService) -> Self {
        Self { service }
    }
}

impl tonic::server::NamedService for RlqsServer {
    const NAME: &'static str = NAME;
}

/// The one method, for tonic's streaming machinery.
struct Method(RlqsService);

impl tonic::server::StreamingService<RateLimitQuotaUsageReports> for Method {
    type Response = Bytes;
    type ResponseStream = Answers;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Answers>, Status>> + Send>>;

    fn call(&mut self, request: Request<Streaming<RateLimitQuotaUsageReports>>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { service.stream(request) })
    }
}

impl<B> tower::Service<http::Request<B>> for RlqsServer
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != STREAM {
            return Box::pin(async { Ok(Status::unimplemented("").into_http()) });
        }
        let method = Method(self.service.clone());
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(Encoded)
                .apply_max_message_size_config(Some(super::MAX_REPORT_BYTES), None);
            Ok(grpc.streaming(method, request).await)
        })
    }
}
