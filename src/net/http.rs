//! The HTTP server of the admin and Prometheus listeners, with the bounds a port that
//! anyone on the network can reach needs (`axum::serve` has none of them):
//!
//! - at most `max_connections` open at once (past it, new ones wait in the listen backlog);
//! - a header timeout: a connection must send its first bytes within `handshake_timeout`
//!   of being accepted, and a complete request head within `handshake_timeout` of starting
//!   one, or it is closed. A slow-loris client that sends one byte every few seconds is cut
//!   off instead of holding its connection forever;
//! - the same limit between requests on an HTTP/1 keep-alive connection (hyper's header
//!   timer runs while it waits for the next request), and HTTP/2 keep-alive pings;
//! - request bodies: a declared `Content-Length` over [`MAX_BODY_BYTES`] is answered 413 at
//!   once, unread, and a body must arrive whole within `handshake_timeout` of its head (408
//!   otherwise), so a body that trickles or never comes holds nothing for long;
//! - graceful shutdown: once `shutdown` resolves, the listener closes, idle connections
//!   close, and requests in flight are answered before the future resolves.
//!
//! HTTP/1.1 and HTTP/2 (prior knowledge) are served alike, as `axum::serve` does.

use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

use axum::extract::ConnectInfo;

use super::connection::{Acceptor, Busy, ConnectionLimits, Guarded};

/// The largest request body read (axum's own default limit for its body extractors).
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

/// Interval of HTTP/2 pings to a quiet peer, and how long its answer may take.
const HTTP2_KEEPALIVE: (Duration, Duration) = (Duration::from_secs(60), Duration::from_secs(20));

/// Serves `router` on `listener` within `limits` until `shutdown` resolves, then drains.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.handshake_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(HTTP2_KEEPALIVE.0)
        .keep_alive_timeout(HTTP2_KEEPALIVE.1);
    let deadline = limits.handshake_timeout;
    let router = router.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            bounded_body(request, next, deadline)
        },
    ));
    let mut acceptor = Acceptor::new(listener, limits);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = acceptor.accept() => accepted,
            _ = &mut shutdown => break,
        };
        let peer = accepted.stream.peer_addr().ok();
        let busy = accepted.ticket.busy();
        // The deadline covers the bytes HTTP version detection waits for, which hyper's
        // header timer does not. Until it answers a request, the connection may be closed
        // to make room for a new one (a health check behind silent or slow clients).
        let io = Guarded::new(
            accepted.stream,
            accepted.permit,
            accepted.deadline,
            accepted.ticket,
        )
        .evictable_when_idle()
        .stalling_after(limits.handshake_timeout);
        let service = TowerToHyperService::new(answering(router.clone(), busy, peer));
        let connection = builder
            .serve_connection(TokioIo::new(io), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                // Timeouts and clients that go away mid-request: theirs to notice, not ours.
                tracing::debug!(?peer, %error, "admin connection ended with an error");
            }
        });
    }
    // Stop accepting: new connections are refused from here on.
    drop(acceptor);
    graceful.shutdown().await;
}

/// `router` for one connection from `peer`, counting the requests it answers in `busy`.
/// Handlers that log who asked (counter resets) read the peer's address.
fn answering<B>(
    router: Router,
    busy: Busy,
    peer: Option<std::net::SocketAddr>,
) -> impl tower::Service<
    axum::http::Request<B>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<axum::response::Response, std::convert::Infallible>>
             + Send
             + 'static,
> + Clone
where
    B: http_body::Body<Data = axum::body::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    tower::service_fn(move |mut request: axum::http::Request<B>| {
        if let Some(peer) = peer {
            request.extensions_mut().insert(ConnectInfo(peer));
        }
        let answering = busy.enter();
        let answer = tower::ServiceExt::oneshot(router.clone(), request.map(axum::body::Body::new));
        async move {
            let response = answer.await;
            drop(answering);
            response
        }
    })
}

/// Reads the request's body whole, within `deadline` and [`MAX_BODY_BYTES`], before the
/// handler runs: 413 for a declared length over the bound (unread) or a body that grows past
/// it, 408 for one that does not arrive in time.
async fn bounded_body(
    request: axum::extract::Request,
    next: axum::middleware::Next,
    deadline: Duration,
) -> axum::response::Response {
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let too_large = || {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body over {MAX_BODY_BYTES} bytes\n"),
        )
            .into_response()
    };
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return too_large();
    }
    let (parts, body) = request.into_parts();
    match tokio::time::timeout(deadline, axum::body::to_bytes(body, MAX_BODY_BYTES)).await {
        Ok(Ok(bytes)) => {
            let request = axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes));
            next.run(request).await
        }
        Ok(Err(_)) => too_large(),
        Err(_) => (
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "request body not received within {} s\n",
                deadline.as_secs_f64()
            ),
        )
            .into_response(),
    }
}
