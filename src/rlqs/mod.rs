//! Envoy's Rate Limit Quota Service (`rate_limit_quota` filter), the stream face: Envoy
//! streams usage per bucket, Sluice answers each bucket with the share of its rule's budget
//! that Envoy then enforces by itself. The decision is [`crate::quota`]'s; this module and
//! [`crate::rls`] are the faces that know the protos.
//!
//! Endpoints: `RateLimitQuotaService/StreamRateLimitQuotas`.
//!
//! - `convert`: reports → [`Usage`](crate::quota::Usage)s, [`Action`](crate::quota::Action)s → Envoy's bucket actions;
//! - `pace`: how many bucket usages a stream and the instance work through a second;
//! - `lane`: the thread reports are read and worked through on;
//! - `server`: the hand-written gRPC server that sends answers already encoded.

mod convert;
mod lane;
mod pace;
mod server;

use std::sync::Arc;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use prost::Message as _;
use tonic::{Request, Response, Status, Streaming};

use crate::quota::{Outbox, PeerId, Quotas};
use crate::traces::{Method, Tracing};

pub use convert::encode;
pub use lane::Lane;

/// Largest report message taken, in bytes: gRPC's usual 4 MiB, which holds the 10,000 buckets
/// a stream may have at up to 400 bytes each (Envoy's ids of a few pairs take 50 or so).
pub const MAX_REPORT_BYTES: usize = 4 * 1024 * 1024;

/// Most bucket actions in one answer: a renewal of a stream's 10,000 buckets goes out as
/// twenty messages, so that the connection writes it in pieces between other streams' frames.
const ANSWER_ACTIONS: usize = 500;

/// The gRPC service over [`Quotas`].
#[derive(Clone)]
pub struct RlqsService {
    quotas: Arc<Quotas>,
    /// The instance's pace of work over all streams.
    pace: Arc<parking_lot::Mutex<pace::Pace>>,
    /// A span per report, when tracing is on.
    tracing: Option<Arc<Tracing>>,
    /// Where reports are read and worked through (the caller's runtime if none).
    lane: Option<tokio::runtime::Handle>,
}

impl RlqsService {
    /// The service answering from `quotas`.
    pub fn new(quotas: Arc<Quotas>) -> Self {
        let options = quotas.options();
        let pace = pace::of_instance(options.max_buckets, options.max_buckets_per_stream);
        Self {
            quotas,
            pace: Arc::new(parking_lot::Mutex::new(pace)),
            tracing: None,
            lane: None,
        }
    }

    /// Traces every report (`TRACING_ENABLED`), each a child of the trace context the stream
    /// was opened with.
    pub fn with_tracing(mut self, tracing: Arc<Tracing>) -> Self {
        self.tracing = Some(tracing);
        self
    }

    /// Reads and works through reports on `lane`, away from the runtime that answers
    /// decisions.
    pub fn on_lane(mut self, lane: &Lane) -> Self {
        self.lane = Some(lane.handle());
        self
    }

    /// Runs `work` on the lane (or the caller's runtime without one).
    fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        match &self.lane {
            Some(lane) => drop(lane.spawn(work)),
            None => drop(tokio::spawn(work)),
        }
    }

    /// The tonic server wrapping this service.
    pub fn into_server(self) -> server::RlqsServer {
        server::RlqsServer::new(self)
    }
}

impl RlqsService {
    /// Opens a stream: its reports are read and its answers built and encoded on the lane.
    fn stream(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<server::Answers>, Status> {
        let (id, outbox) = self.quotas.open(peer_of(&request))?;
        // Why the stream ends, when it is the client's fault: the answers end with it.
        let ending = Arc::new(parking_lot::Mutex::new(None::<Status>));
        let cap = self.quotas.options().max_buckets_per_stream;
        let reader = Reader {
            quotas: self.quotas.clone(),
            id,
            headers: request.metadata().clone().into_headers(),
            tracing: self.tracing.clone(),
            ending: ending.clone(),
            cap,
            stream_pace: pace::of_stream(cap),
            instance_pace: self.pace.clone(),
        };
        self.spawn(reader.run(request.into_inner()));
        // The answers are built on the lane too (a renewal of 10,000 buckets is that many
        // actions), one at a time: the next is taken only once the last was handed to the
        // connection, which is when its actions count as sent.
        let (built, answers) = tokio::sync::mpsc::channel(1);
        self.spawn(answer(outbox.clone(), self.quotas.clone(), ending, built));
        let answers = tonic::codegen::tokio_stream::StreamExt::map(
            tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(answers),
            move |(at, answer)| {
                if let Some(at) = at {
                    outbox.mark_drained(at);
                }
                answer
            },
        );
        Ok(Response::new(Box::pin(answers)))
    }
}

/// What reads one stream's reports.
struct Reader {
    quotas: Arc<Quotas>,
    id: u64,
    /// The stream's headers, for the trace context of each report's span.
    headers: tonic::codegen::http::HeaderMap,
    tracing: Option<Arc<Tracing>>,
    ending: Arc<parking_lot::Mutex<Option<Status>>>,
    /// The stream's bucket cap: usages past it in one report are not looked at.
    cap: usize,
    stream_pace: pace::Pace,
    instance_pace: Arc<parking_lot::Mutex<pace::Pace>>,
}

impl Reader {
    /// Reads and works through reports until the stream ends.
    async fn run(mut self, mut inbound: Streaming<RateLimitQuotaUsageReports>) {
        // The stream's shares are released however this task ends.
        let _closing = Closing(self.quotas.clone(), self.id);
        loop {
            match inbound.message().await {
                Ok(Some(reports)) => self.report(reports).await,
                Ok(None) => return,
                Err(status) => return refuse(&self.quotas, &status, &self.ending),
            }
        }
    }

    /// One report: paid for at the paces before it is worked through, and traced.
    async fn report(&mut self, reports: RateLimitQuotaUsageReports) {
        // Past the stream's cap nothing is tracked: counted, not looked at.
        let listed = reports.bucket_quota_usages.len();
        self.quotas
            .rejected_past_stream_cap(listed.saturating_sub(self.cap));
        // Paid before the work: the stream is not read while in debt.
        let units = listed.min(self.cap).max(1) as f64;
        tokio::time::sleep(self.stream_pace.spend(units)).await;
        let wait = self.instance_pace.lock().spend(units);
        tokio::time::sleep(wait).await;
        let usages = convert::usages(reports.bucket_quota_usages, self.cap);
        let span = self
            .tracing
            .as_ref()
            .and_then(|t| t.request_span(Method::RlqsReport, &self.headers));
        let summary = self.quotas.report(self.id, &reports.domain, usages).await;
        if let Some(mut span) = span {
            span.rlqs_report(
                &reports.domain,
                summary.buckets,
                summary.new_buckets,
                summary.actions,
            );
            span.end(if summary.dropped { "DROPPED" } else { "OK" }, None);
        }
    }
}

/// Builds and encodes a stream's answers from `outbox` into `built`, in messages of at most
/// [`ANSWER_ACTIONS`], each with the time its batch was taken on its last message; ends with
/// the client's fault in `ending`, if any, once the outbox closes.
async fn answer(
    outbox: Arc<Outbox>,
    clock: Arc<Quotas>,
    ending: Arc<parking_lot::Mutex<Option<Status>>>,
    built: tokio::sync::mpsc::Sender<(Option<f64>, Result<tonic::codegen::Bytes, Status>)>,
) {
    while let Some((at, actions)) = outbox.take(|| clock.now()).await {
        // Encoded here: the connection's task (on the runtime that answers decisions) only
        // copies their bytes.
        let mut actions = actions.into_iter().peekable();
        while actions.peek().is_some() {
            let response = RateLimitQuotaResponse {
                bucket_action: actions
                    .by_ref()
                    .take(ANSWER_ACTIONS)
                    .map(|(b, a)| encode(&b, a))
                    .collect(),
            };
            let response = tonic::codegen::Bytes::from(response.encode_to_vec());
            let last = actions.peek().is_none().then_some(at);
            if built.send((last, Ok(response))).await.is_err() {
                return; // the client went away
            }
        }
    }
    // Closed: a client's fault ends the answers with its status.
    let status = ending.lock().take();
    if let Some(status) = status {
        let _ = built.send((None, Err(status))).await;
    }
}

/// A stream's read failed with `status`: when it is the client's fault (a report that does
/// not decode, or is over the size limit), counted, logged (at most once per 10 s) and kept
/// in `ending` for the answers to end with; otherwise (the client went away) nothing.
fn refuse(quotas: &Quotas, status: &Status, ending: &parking_lot::Mutex<Option<Status>>) {
    let Some((refusal, kind)) =
        crate::net::grpc::client_fault(status, "RateLimitQuotaUsageReports")
    else {
        return;
    };
    quotas.refused_report(kind);
    static LOGGED: crate::logging::Every =
        crate::logging::Every::new(std::time::Duration::from_secs(10));
    if LOGGED.ready() {
        tracing::warn!(error = %refusal.message(), "RLQS report refused: the stream ends");
    }
    *ending.lock() = Some(refusal);
}

/// The peer a stream comes from: its client's address (IPv4 mapped into IPv6), not its port
/// or connection, which a client multiplies at will; 0 for a unix socket. Not the client
/// certificate under mutual TLS either: Envoys commonly share one, and would then share one
/// part of every budget.
fn peer_of<T>(request: &Request<T>) -> PeerId {
    let info = request.extensions().get::<crate::net::grpc::PeerInfo>();
    let Some(addr) = info.and_then(|i| i.remote_addr) else {
        return 0;
    };
    let ip = match addr.ip() {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        std::net::IpAddr::V6(v6) => v6,
    };
    u128::from(ip)
}

/// Closes a stream in [`Quotas`] when dropped.
struct Closing(Arc<Quotas>, u64);

impl Drop for Closing {
    fn drop(&mut self) {
        self.0.close(self.1);
    }
}
