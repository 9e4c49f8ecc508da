// Why one long file: the accept loop, the eviction table and the guarded socket are one bound
// whose parts hand connections to each other.
//! Bounds on the connections a listener accepts, shared by the gRPC and admin servers (one
//! file: the acceptor and the connections it hands out share the table of those that may be
//! closed to make room):
//!
//! - at most `max_connections` open at once: past it the listener is not polled until one
//!   closes, so the excess waits in the kernel's accept backlog instead of holding file
//!   descriptors (one port flooded with connections cannot take the other's);
//! - a handshake deadline: a connection must have sent its first [`FIRST_BYTES`] bytes (the
//!   HTTP/2 client preface, or the start of an HTTP/1 request) within `handshake_timeout` of
//!   being accepted, TLS handshake included, or its reads fail and the server drops it;
//! - at most [`MAX_HANDSHAKING`] connections still in their handshake at once: past it,
//!   whenever `accept` fails for want of a file descriptor, and when a new connection comes
//!   while `max_connections` are open, the oldest of them is closed, so a flood of
//!   connections that send nothing cycles through a bounded set of descriptors and a fresh
//!   client is accepted within moments instead of after a handshake timeout;
//! - on the admin ports ([`Guarded::evictable_when_idle`]) a connection stays among those
//!   that can be closed for as long as it is not answering a request (a slow request head,
//!   an idle keep-alive), so silent or slow clients never keep a health check out;
//! - a write deadline ([`Guarded::stalling_after`]): a write that waits that long for the
//!   peer to read fails, and the connection with it, so a client that never reads its
//!   answers holds neither them nor its connection;
//! - TCP keepalive on every accepted socket, so connections to vanished peers end.
//!
//! Once the first bytes are in, reads go straight to the socket: the hot path pays one
//! branch.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::codegen::tokio_stream::StreamExt as _;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::TcpIncoming;

use super::turns::{Peer, Turns};

/// What a new connection must send before its handshake deadline: the length of the
/// HTTP/2 client preface `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`, shorter than any HTTP/1 request
/// with a `Host` header.
pub const FIRST_BYTES: usize = 24;

/// Idle time before the kernel probes a silent peer.
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// Pause after a failed `accept` (e.g. out of file descriptors) before the next, when no
/// connection in its handshake can be closed to make room.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Most connections of one listener still in their handshake (TLS and the first bytes).
pub const MAX_HANDSHAKING: usize = 256;

/// The connections of one listener that may be closed to make room, oldest first.
#[derive(Default)]
struct Handshaking {
    next: u64,
    open: std::collections::BTreeMap<u64, Evictable>,
}

/// One connection that may be closed to make room.
struct Evictable {
    /// Closes it.
    evict: CancellationToken,
    /// The requests it is answering: while above zero it is not closed.
    busy: Arc<AtomicUsize>,
    /// Cancelled once it is closed (its ticket dropped, after its socket).
    closed: CancellationToken,
}

impl Handshaking {
    /// Closes the oldest connection answering no request: what resolves once it is closed,
    /// if there was one.
    fn evict_oldest(&mut self) -> Option<WaitForCancellationFutureOwned> {
        let oldest = self
            .open
            .iter()
            .find(|(_, e)| e.busy.load(Ordering::Acquire) == 0)
            .map(|(&id, _)| id)?;
        let evicted = self.open.remove(&oldest)?;
        evicted.evict.cancel();
        Some(evicted.closed.cancelled_owned())
    }

    /// Whether a connection answering no request can be closed.
    fn any_idle(&self) -> bool {
        self.open
            .values()
            .any(|e| e.busy.load(Ordering::Acquire) == 0)
    }
}

/// A connection's place among those that may be closed to make room: dropped when its
/// handshake is over (or the connection is), cancelled when the listener needs the room.
pub struct Ticket {
    id: u64,
    token: CancellationToken,
    busy: Arc<AtomicUsize>,
    closed: CancellationToken,
    table: Arc<parking_lot::Mutex<Handshaking>>,
}

impl Ticket {
    /// Resolves when the listener closes this connection to make room.
    pub fn evicted(&self) -> WaitForCancellationFutureOwned {
        self.token.clone().cancelled_owned()
    }

    /// The count of requests the connection is answering: while above zero it is not closed
    /// to make room.
    pub fn busy(&self) -> Busy {
        Busy(self.busy.clone())
    }
}

/// Counts the requests a connection is answering (see [`Ticket::busy`]).
#[derive(Clone)]
pub struct Busy(Arc<AtomicUsize>);

impl Busy {
    /// One request more until the guard is dropped.
    pub fn enter(&self) -> BusyGuard {
        self.0.fetch_add(1, Ordering::AcqRel);
        BusyGuard(self.0.clone())
    }
}

/// A request being answered.
pub struct BusyGuard(Arc<AtomicUsize>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.table.lock().open.remove(&self.id);
        self.closed.cancel();
    }
}

/// How many connections a listener keeps, and how long a new one has to start talking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Open connections at most; more wait in the listen backlog.
    pub max_connections: usize,
    /// Time from accept to the first [`FIRST_BYTES`] bytes (TLS handshake included).
    pub handshake_timeout: Duration,
}

/// A listener that hands out connections while fewer than the limit are open.
pub struct Acceptor {
    incoming: TcpIncoming,
    permits: Arc<Semaphore>,
    handshake_timeout: Duration,
    handshaking: Arc<parking_lot::Mutex<Handshaking>>,
}

/// An accepted connection, holding its place under the limit until dropped.
pub struct Accepted {
    /// The socket.
    pub stream: TcpStream,
    /// The place under the limit.
    pub permit: OwnedSemaphorePermit,
    /// When the handshake must be over.
    pub deadline: Instant,
    /// Its place among the connections in their handshake.
    pub ticket: Ticket,
}

impl Acceptor {
    /// Accepts on `listener` within `limits`.
    pub fn new(listener: TcpListener, limits: ConnectionLimits) -> Self {
        Self {
            incoming: TcpIncoming::from(listener)
                .with_nodelay(Some(true))
                .with_keepalive(Some(TCP_KEEPALIVE)),
            permits: Arc::new(Semaphore::new(limits.max_connections)),
            handshake_timeout: limits.handshake_timeout,
            handshaking: Arc::default(),
        }
    }

    /// Closes the oldest connection that may be closed: what resolves once it is closed, if
    /// there was one.
    fn evict_oldest(&self) -> Option<WaitForCancellationFutureOwned> {
        self.handshaking.lock().evict_oldest()
    }

    /// A place among the connections that may be closed, making room if they are many.
    fn ticket(&self) -> Ticket {
        let mut table = self.handshaking.lock();
        if table.open.len() >= MAX_HANDSHAKING {
            table.evict_oldest();
        }
        let id = table.next;
        table.next += 1;
        let (token, closed) = (CancellationToken::new(), CancellationToken::new());
        let busy = Arc::new(AtomicUsize::new(0));
        let evictable = Evictable {
            evict: token.clone(),
            busy: busy.clone(),
            closed: closed.clone(),
        };
        table.open.insert(id, evictable);
        Ticket {
            id,
            token,
            busy,
            closed,
            table: self.handshaking.clone(),
        }
    }

    /// The next connection, once there is room for it: at the cap, a new connection closes
    /// the oldest that may be closed (silent, slow or idle) and takes its place; when none
    /// may, the listener waits for one to close. Accept errors (a peer that reset while
    /// queued, no file descriptor left) are logged and waited out, never returned.
    pub async fn accept(&mut self) -> Accepted {
        let free = Arc::clone(&self.permits).try_acquire_owned().ok();
        let free = match free {
            Some(permit) => Some(permit),
            None if self.handshaking.lock().any_idle() => None,
            None => Some(self.wait_for_room().await),
        };
        let stream = self.next_stream().await;
        let permit = match free {
            Some(permit) => permit,
            None => {
                self.evict_oldest();
                self.wait_for_room().await
            }
        };
        Accepted {
            stream,
            permit,
            deadline: Instant::now() + self.handshake_timeout,
            ticket: self.ticket(),
        }
    }

    async fn wait_for_room(&self) -> OwnedSemaphorePermit {
        Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }

    async fn next_stream(&mut self) -> TcpStream {
        loop {
            match self.incoming.next().await {
                Some(Ok(stream)) => return stream,
                Some(Err(e)) => {
                    // Out of file descriptors: the oldest silent connection makes room, and
                    // the next accept waits until it has (retried at once, it would find
                    // no descriptor yet and close every idle connection, newest included).
                    let no_descriptor = matches!(e.raw_os_error(), Some(23 | 24)); // ENFILE, EMFILE
                    match no_descriptor.then(|| self.evict_oldest()).flatten() {
                        Some(closed) => {
                            let _ = tokio::time::timeout(ACCEPT_BACKOFF, closed).await;
                        }
                        None => {
                            tracing::warn!(error = %e, "accept failed");
                            tokio::time::sleep(ACCEPT_BACKOFF).await;
                        }
                    }
                }
                // TcpIncoming never ends; should it, wait rather than spin.
                None => std::future::pending::<()>().await,
            }
        }
    }
}

/// Plaintext connections accepted within `limits`, for tonic's `serve_with_incoming`.
/// The accept loop ends when the server drops the stream.
/// Each connection is closed `lifetime` after it was accepted, if given.
pub fn incoming(
    listener: TcpListener,
    limits: ConnectionLimits,
    lifetime: Option<Duration>,
    turns: Arc<Turns>,
) -> ReceiverStream<io::Result<Guarded<TcpStream>>> {
    accept_into(listener, limits, 16, move |accepted, tx| {
        let peer = turns.peer();
        async move {
            let guarded = Guarded::new(
                accepted.stream,
                accepted.permit,
                accepted.deadline,
                accepted.ticket,
            )
            .living(lifetime)
            .stalling_after(limits.handshake_timeout)
            .of_peer(peer);
            tx.send(Ok(guarded)).await.is_ok()
        }
    })
}

/// Accepts on `listener` within `limits` and hands each connection to `each`, with the
/// sending half of the returned stream (`capacity` connections deep), until `each` answers
/// `false` or the server drops the stream. Shared by the plaintext and TLS listeners.
pub fn accept_into<T, F>(
    listener: TcpListener,
    limits: ConnectionLimits,
    capacity: usize,
    mut each: impl FnMut(Accepted, tokio::sync::mpsc::Sender<T>) -> F + Send + 'static,
) -> ReceiverStream<T>
where
    T: Send + 'static,
    F: std::future::Future<Output = bool> + Send,
{
    let (tx, rx) = tokio::sync::mpsc::channel(capacity);
    let mut acceptor = Acceptor::new(listener, limits);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = acceptor.accept() => accepted,
                _ = tx.closed() => return,
            };
            if !each(accepted, tx.clone()).await {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}

// === impl Guarded ===

/// A connection that holds its place under the limit and whose reads fail once its
/// handshake deadline passes with fewer than [`FIRST_BYTES`] bytes read, or once it has
/// lived past its lifetime, if it has one.
pub struct Guarded<IO> {
    // Dropped before the permit: the socket is closed by the time its place is given on.
    io: IO,
    handshake: Option<Handshake>,
    /// While the connection may be closed to make room: its place and what tells it.
    eviction: Option<Eviction>,
    /// Whether `eviction` outlives the handshake (the admin ports).
    evictable_after_handshake: bool,
    /// How long a write may wait for the peer to read, if bounded; and the timer of the
    /// write waiting now.
    stall_limit: Option<Duration>,
    stalled: Option<Pin<Box<Sleep>>>,
    /// The connection's turns and reading room (gRPC).
    peer: Option<Arc<Peer>>,
    /// When the connection is closed whatever it is doing (`GRPC_MAX_CONNECTION_AGE` plus its
    /// grace: the server asked it to go at the age).
    end_of_life: Option<Pin<Box<Sleep>>>,
    _permit: OwnedSemaphorePermit,
}

struct Handshake {
    deadline: Pin<Box<Sleep>>,
    missing: usize,
}

struct Eviction {
    evicted: Pin<Box<WaitForCancellationFutureOwned>>,
    _ticket: Ticket,
}

impl<IO> Guarded<IO> {
    /// Wraps `io`, which must send its first bytes by `deadline` (and is closed earlier if
    /// its `ticket` is evicted to make room).
    pub fn new(io: IO, permit: OwnedSemaphorePermit, deadline: Instant, ticket: Ticket) -> Self {
        Self {
            io,
            handshake: Some(Handshake {
                deadline: Box::pin(tokio::time::sleep_until(deadline)),
                missing: FIRST_BYTES,
            }),
            eviction: Some(Eviction {
                evicted: Box::pin(ticket.evicted()),
                _ticket: ticket,
            }),
            evictable_after_handshake: false,
            stall_limit: None,
            stalled: None,
            peer: None,
            end_of_life: None,
            _permit: permit,
        }
    }

    /// Keeps the connection among those that may be closed to make room after its
    /// handshake too, while it answers no request (its ticket's [`Ticket::busy`] count).
    pub fn evictable_when_idle(mut self) -> Self {
        self.evictable_after_handshake = true;
        self
    }

    /// Makes the connection `peer`, whose requests take their turns as one.
    pub fn of_peer(mut self, peer: Arc<Peer>) -> Self {
        self.peer = Some(peer);
        self
    }

    /// Fails the connection's writes once one has waited `limit` for the peer to read (a
    /// client that never reads its answers holds them, and the connection, no longer).
    pub fn stalling_after(mut self, limit: Duration) -> Self {
        self.stall_limit = Some(limit);
        self
    }

    /// A write's outcome, or its failure once it has waited past the stall limit.
    fn unless_stalled<T>(
        &mut self,
        cx: &mut Context<'_>,
        written: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if written.is_ready() {
            self.stalled = None;
            return written;
        }
        let Some(limit) = self.stall_limit else {
            return written;
        };
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the peer read nothing of what was sent for the write deadline",
            )));
        }
        Poll::Pending
    }

    /// Fails the connection's reads from `lifetime` after now on, if given.
    pub fn living(mut self, lifetime: Option<Duration>) -> Self {
        self.end_of_life = lifetime.map(|l| Box::pin(tokio::time::sleep(l)));
        self
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(handshake) = &mut this.handshake else {
            let read = Pin::new(&mut this.io).poll_read(cx, buf);
            // Checked only while waiting for bytes (as the handshake deadline is), so that
            // reads that find data cost nothing more; the timer wakes the waiting read.
            if read.is_pending()
                && let Some(end) = &mut this.end_of_life
                && end.as_mut().poll(cx).is_ready()
            {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connection past its maximum age and grace",
                )));
            }
            if read.is_pending()
                && let Some(eviction) = &mut this.eviction
                && eviction.evicted.as_mut().poll(cx).is_ready()
            {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "closed while idle to make room for newer connections",
                )));
            }
            return read;
        };
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = buf.filled().len() - before;
                handshake.missing = handshake.missing.saturating_sub(read);
                // Done, or at end of stream (the server will close it anyway).
                if handshake.missing == 0 || read == 0 {
                    this.handshake = None;
                    if !this.evictable_after_handshake {
                        this.eviction = None;
                    }
                }
                Poll::Ready(Ok(()))
            }
            // Waiting for bytes: wake at the deadline too.
            Poll::Pending if handshake.deadline.as_mut().poll(cx).is_ready() => Poll::Ready(Err(
                io::Error::new(io::ErrorKind::TimedOut, "no handshake before the deadline"),
            )),
            // ...and when the listener needs the room.
            Poll::Pending
                if this
                    .eviction
                    .as_mut()
                    .is_some_and(|e| e.evicted.as_mut().poll(cx).is_ready()) =>
            {
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "closed in its handshake to make room for newer connections",
                )))
            }
            other => other,
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.io).poll_write(cx, buf);
        this.unless_stalled(cx, written)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.unless_stalled(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let flushed = Pin::new(&mut this.io).poll_flush(cx);
        this.unless_stalled(cx, flushed)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<IO> Guarded<IO> {
    /// The connection underneath.
    pub fn io(&self) -> &IO {
        &self.io
    }

    /// The connection's peer, on the gRPC listeners.
    pub fn peer(&self) -> Option<&Arc<Peer>> {
        self.peer.as_ref()
    }
}
