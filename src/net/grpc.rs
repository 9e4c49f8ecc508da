//! What a gRPC request's message may cost before a handler sees it, for the gRPC server's
//! routes:
//!
//! - every request is tied to its connection's [`Peer`] (in its [`PeerInfo`], the request's
//!   connection info), which handlers take their [`Turn`](super::turns::Turn) with once the
//!   message is in;
//! - the message of a unary call must arrive whole within a deadline of its headers, or the
//!   call ends with `DEADLINE_EXCEEDED`; a stream that sends headers and nothing else holds
//!   a stream of its connection (at most `SETTINGS_MAX_CONCURRENT_STREAMS`) until then, and
//!   nothing else;
//! - the messages still arriving on one connection hold at most [`MAX_READING_BYTES`]: past
//!   it, the next frame stays unread (HTTP/2 flow control then stops the sender) until a
//!   message is in or its deadline ends it.
//!
//! Streaming calls (the paths given) read their messages one at a time for as long as they
//! live, so neither bound applies to them.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{Bytes, http};

use rustls::pki_types::CertificateDer;
use tonic::transport::server::{Connected, TcpConnectInfo, TlsConnectInfo};

use super::connection::Guarded;
use super::turns::{MAX_READING_BYTES, Peer, Turns};

/// Ties requests to their connection and bounds their messages (see the module docs).
#[derive(Clone)]
pub struct MessagesLayer {
    /// The peer of the connections that have none of their own (a unix socket's).
    local: Arc<Peer>,
    deadline: Duration,
    streaming: &'static [&'static str],
}

impl MessagesLayer {
    /// Requests of `turns`' connections, whose message must arrive within `deadline`, but
    /// for the streaming calls under the path prefixes `streaming`.
    pub fn new(turns: Arc<Turns>, deadline: Duration, streaming: &'static [&'static str]) -> Self {
        Self {
            local: turns.peer(),
            deadline,
            streaming,
        }
    }
}

impl<S> tower::Layer<S> for MessagesLayer {
    type Service = Messages<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Messages {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`MessagesLayer`] wraps around the gRPC routes.
#[derive(Clone)]
pub struct Messages<S> {
    inner: S,
    layer: MessagesLayer,
}

impl<S> tower::Service<http::Request<Body>> for Messages<S>
where
    S: tower::Service<http::Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        let peer = match PeerInfo::of(&request).and_then(|info| info.peer.as_ref()) {
            Some(peer) => peer.clone(),
            // A unix socket's connections: one peer for all.
            None => {
                let local = self.layer.local.clone();
                request.extensions_mut().insert(PeerInfo {
                    remote_addr: None,
                    certs: None,
                    peer: Some(local.clone()),
                });
                local
            }
        };
        let path = request.uri().path();
        if self.layer.streaming.iter().any(|p| path.starts_with(p)) {
            return self.inner.call(request);
        }
        let deadline = Instant::now() + self.layer.deadline;
        let request = request.map(|inner| {
            Body::new(Reading {
                inner,
                peer,
                held: 0,
                deadline,
                timer: None,
            })
        });
        self.inner.call(request)
    }
}

/// A unary call's body: its bytes count against its connection's, and it ends at its
/// deadline if not whole by then.
struct Reading {
    inner: Body,
    peer: Arc<Peer>,
    /// Bytes read so far, counted in the peer's.
    held: usize,
    deadline: Instant,
    /// Armed the first time the body waits.
    timer: Option<Pin<Box<Sleep>>>,
}

impl Reading {
    /// Whether the connection has room for another frame of this body: under the bound, or
    /// all of what it holds is this body's.
    fn has_room(&self) -> bool {
        let reading = self.peer.reading.load(Ordering::SeqCst);
        reading < MAX_READING_BYTES || reading <= self.held
    }

    /// Waiting: `Pending`, or the deadline's error once it has passed.
    fn wait(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let deadline = self.deadline;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.release();
        Poll::Ready(Some(Err(Status::deadline_exceeded(
            "the request's message did not arrive whole in time",
        ))))
    }

    fn release(&mut self) {
        if self.held > 0 {
            self.peer.reading.fetch_sub(self.held, Ordering::SeqCst);
            self.held = 0;
            self.peer.wake_readers_if_any();
        }
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        self.release();
    }
}

impl http_body::Body for Reading {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if !this.has_room() {
            {
                let mut readers = this.peer.readers.lock();
                if !readers.iter().any(|w| w.will_wake(cx.waker())) {
                    readers.push(cx.waker().clone());
                    this.peer.waiting_readers.fetch_add(1, Ordering::SeqCst);
                }
            }
            // Room made between the check and the waker's registration is seen here.
            if !this.has_room() {
                return this.wait(cx);
            }
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.held += data.len();
                    this.peer.reading.fetch_add(data.len(), Ordering::SeqCst);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                this.release();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Pending => this.wait(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// What a gRPC request knows of its connection (its connection info, in the request's
/// extensions): the remote address, the client's certificates under mutual TLS, and the
/// [`Peer`] its requests take their turns as.
#[derive(Clone)]
pub struct PeerInfo {
    /// The remote address.
    pub remote_addr: Option<std::net::SocketAddr>,
    /// The client's certificate chain, when it sent one over TLS.
    pub certs: Option<Arc<Vec<CertificateDer<'static>>>>,
    /// The connection's turns and reading room, when the listener gives them.
    pub peer: Option<Arc<Peer>>,
}

impl PeerInfo {
    /// The connection info of `request`, if it came over one of these listeners.
    pub fn of<B>(request: &tonic::codegen::http::Request<B>) -> Option<&PeerInfo> {
        request.extensions().get::<PeerInfo>()
    }
}

/// What the transports' own connection info says of the remote end.
pub trait Describe {
    /// The remote address.
    fn remote_addr(&self) -> Option<std::net::SocketAddr>;
    /// The client's certificates, under TLS.
    fn certs(&self) -> Option<Arc<Vec<CertificateDer<'static>>>> {
        None
    }
}

impl Describe for TcpConnectInfo {
    fn remote_addr(&self) -> Option<std::net::SocketAddr> {
        TcpConnectInfo::remote_addr(self)
    }
}

impl Describe for TlsConnectInfo<TcpConnectInfo> {
    fn remote_addr(&self) -> Option<std::net::SocketAddr> {
        self.get_ref().remote_addr()
    }

    fn certs(&self) -> Option<Arc<Vec<CertificateDer<'static>>>> {
        self.peer_certs()
    }
}

impl<IO: Connected> Connected for Guarded<IO>
where
    IO::ConnectInfo: Describe,
{
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        let info = self.io().connect_info();
        PeerInfo {
            remote_addr: info.remote_addr(),
            certs: info.certs(),
            peer: self.peer().cloned(),
        }
    }
}

/// Prefix of the message tonic's protobuf codec gives a message it cannot decode.
const UNDECODABLE: &str = "failed to decode Protobuf message";
/// Prefix of the message tonic gives a message over `max_decoding_message_size`.
const TOO_LARGE: &str = "Error, decoded message length too large";

/// A transport error that is the client's fault, as gRPC's status code guide answers it:
/// a message that does not decode (bad protobuf, a string that is not UTF-8, a truncated
/// message) is `INVALID_ARGUMENT` naming `what` was malformed, one over the size limit
/// `RESOURCE_EXHAUSTED`; with the kind to count it as (`invalid_request`,
/// `request_too_large`). tonic answers them INTERNAL and OUT_OF_RANGE.
pub fn client_fault(status: &Status, what: &str) -> Option<(Status, &'static str)> {
    let message = status.message();
    match status.code() {
        tonic::Code::Internal if message.starts_with(UNDECODABLE) => Some((
            Status::invalid_argument(format!("malformed {what}: {message}")),
            "invalid_request",
        )),
        tonic::Code::OutOfRange if message.starts_with(TOO_LARGE) => Some((
            Status::resource_exhausted(message.to_owned()),
            "request_too_large",
        )),
        _ => None,
    }
}
