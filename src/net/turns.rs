//! The turns of gRPC work (`GRPC_MAX_IN_FLIGHT`), shared fairly between connections, and
//! what each connection may hold of messages still arriving.
//!
//! - A request takes a turn only once its message has arrived whole, so streams that send
//!   headers and nothing else hold none (their message has a deadline instead, see
//!   [`super::grpc`]).
//! - While turns are free a request takes one at once. Once all are taken, a request waits,
//!   and each turn given back goes to the connection holding the fewest among those waiting
//!   (the oldest request of that connection first): a connection that piles up requests
//!   waits behind its own, and a fresh connection is served next.
//! - Each connection is a [`Peer`], made when it is accepted and carried in its requests'
//!   connection info (one peer for all of a unix socket's).
//!
//! The fast path (a turn free, nobody waiting) is one short lock and two counters.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::oneshot;

/// The bytes of messages still arriving that one connection may hold (one message of the
/// largest size, 4 MiB, and its 5-byte gRPC prefix, fit with room to spare).
pub const MAX_READING_BYTES: usize = 4 * 1024 * 1024 + 64 * 1024;

/// How often a line says that requests wait for a turn.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// The turns of a server, and its connections.
pub struct Turns {
    capacity: usize,
    state: Mutex<State>,
    metrics: Option<TurnMetrics>,
    /// Identifies peers for the wait queues.
    ids: AtomicUsize,
    /// Peers alive.
    peers: AtomicUsize,
}

/// What the turns report to Prometheus.
#[derive(Clone)]
pub struct TurnMetrics {
    /// Turns taken now.
    in_flight: prometheus::IntGauge,
    /// Requests that waited for a turn.
    waited: prometheus::IntCounter,
}

impl TurnMetrics {
    /// Registers the turns' metrics into `registry`, with their capacity.
    pub fn register(registry: &prometheus::Registry, capacity: usize) -> Self {
        use crate::metrics::{counter, gauge};
        gauge(
            registry,
            "sluice_grpc_in_flight_limit",
            "gRPC requests answered at once at most (GRPC_MAX_IN_FLIGHT)",
        )
        .set(i64::try_from(capacity).unwrap_or(i64::MAX));
        Self {
            in_flight: gauge(
                registry,
                "sluice_grpc_in_flight",
                "gRPC requests being answered (their message in, holding a turn)",
            ),
            waited: counter(
                registry,
                "sluice_grpc_in_flight_waits_total",
                "gRPC requests that waited for a turn because all GRPC_MAX_IN_FLIGHT were taken",
            ),
        }
    }
}

struct State {
    free: usize,
    /// By peer id: the peer and its requests waiting, oldest first. Free turns mean nobody
    /// waits.
    waiting: HashMap<usize, (Arc<Peer>, VecDeque<oneshot::Sender<Turn>>)>,
    /// Since when requests have waited without a break.
    saturated_since: Option<Instant>,
}

/// One connection: the turns it holds and the bytes of its messages still arriving.
pub struct Peer {
    id: usize,
    turns: Arc<Turns>,
    /// Turns held; changed under the turns' lock only.
    held: AtomicUsize,
    /// Bytes of messages still arriving (see [`super::grpc`]).
    pub(super) reading: AtomicUsize,
    /// Bodies waiting for the reading bytes to fall, and how many (read without the lock).
    pub(super) readers: Mutex<Vec<std::task::Waker>>,
    pub(super) waiting_readers: AtomicUsize,
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.turns.peers.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Peer {
    /// A turn of the server this connection came to (see [`Turns::take`]).
    pub async fn turn(self: &Arc<Self>) -> Turn {
        self.turns.take(self).await
    }

    /// Wakes the bodies waiting for reading room, if any.
    pub(super) fn wake_readers_if_any(&self) {
        if self.waiting_readers.load(Ordering::SeqCst) > 0 {
            self.wake_readers();
        }
    }

    /// Wakes the bodies waiting for reading room.
    pub(super) fn wake_readers(&self) {
        let readers = std::mem::take(&mut *self.readers.lock());
        self.waiting_readers.store(0, Ordering::Release);
        readers.into_iter().for_each(std::task::Waker::wake);
    }
}

/// A turn, given back when dropped.
pub struct Turn {
    peer: Arc<Peer>,
    turns: Arc<Turns>,
    /// False for a turn that went back while it was handed over.
    armed: bool,
}

impl Drop for Turn {
    fn drop(&mut self) {
        if self.armed {
            self.turns.give_back(&self.peer);
        }
    }
}

impl Turns {
    /// `capacity` turns.
    pub fn new(capacity: usize, metrics: Option<TurnMetrics>) -> Arc<Self> {
        Arc::new(Self {
            capacity,
            state: Mutex::new(State {
                free: capacity,
                waiting: HashMap::new(),
                saturated_since: None,
            }),
            metrics,
            ids: AtomicUsize::new(0),
            peers: AtomicUsize::new(0),
        })
    }

    /// The turns in all.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// A new connection.
    pub fn peer(self: &Arc<Self>) -> Arc<Peer> {
        self.peers.fetch_add(1, Ordering::Relaxed);
        Arc::new(Peer {
            id: self.ids.fetch_add(1, Ordering::Relaxed),
            turns: self.clone(),
            held: AtomicUsize::new(0),
            reading: AtomicUsize::new(0),
            readers: Mutex::default(),
            waiting_readers: AtomicUsize::new(0),
        })
    }

    /// Connections alive.
    pub fn peers(&self) -> usize {
        self.peers.load(Ordering::Relaxed)
    }

    /// A turn for `peer`, at once if one is free, else when it is this peer's.
    pub async fn take(self: &Arc<Self>, peer: &Arc<Peer>) -> Turn {
        let waiting = {
            let mut state = self.state.lock();
            if state.free > 0 {
                state.free -= 1;
                peer.held.fetch_add(1, Ordering::Relaxed);
                drop(state);
                if let Some(m) = &self.metrics {
                    m.in_flight.inc();
                }
                return Turn {
                    peer: peer.clone(),
                    turns: self.clone(),
                    armed: true,
                };
            }
            let (tx, rx) = oneshot::channel();
            state
                .waiting
                .entry(peer.id)
                .or_insert_with(|| (peer.clone(), VecDeque::new()))
                .1
                .push_back(tx);
            state.saturated_since.get_or_insert_with(Instant::now);
            rx
        };
        if let Some(m) = &self.metrics {
            m.waited.inc();
        }
        static LOGGED: crate::logging::Every = crate::logging::Every::new(LOG_EVERY);
        if LOGGED.ready() {
            tracing::warn!(
                turns = self.capacity,
                connections = self.peers(),
                "every gRPC request turn is taken (GRPC_MAX_IN_FLIGHT): requests wait, served fairly by connection"
            );
        }
        // The sender lives in the queue until it is given a turn; the queue is never dropped
        // while the turns live, and they live while this future can be polled.
        waiting
            .await
            .expect("a waiting request is given a turn, never dropped")
    }

    /// How long requests have waited for turns without a break, if they do now.
    pub fn saturated_for(&self) -> Option<Duration> {
        self.state.lock().saturated_since.map(|s| s.elapsed())
    }

    /// Gives back `peer`'s turn: to the waiting connection holding the fewest, or to the
    /// free turns.
    fn give_back(self: &Arc<Self>, peer: &Arc<Peer>) {
        let mut state = self.state.lock();
        peer.held.fetch_sub(1, Ordering::Relaxed);
        loop {
            let next = state
                .waiting
                .iter()
                .min_by_key(|(_, (p, _))| p.held.load(Ordering::Relaxed))
                .map(|(&id, _)| id);
            let Some(id) = next else {
                state.free += 1;
                state.saturated_since = None;
                drop(state);
                if let Some(m) = &self.metrics {
                    m.in_flight.dec();
                }
                return;
            };
            let entry = state.waiting.get_mut(&id).expect("just found");
            let sender = entry.1.pop_front();
            let receiver = entry.0.clone();
            if entry.1.is_empty() {
                state.waiting.remove(&id);
            }
            let Some(sender) = sender else { continue };
            if sender.is_closed() {
                continue;
            }
            receiver.held.fetch_add(1, Ordering::Relaxed);
            let turn = Turn {
                peer: receiver,
                turns: self.clone(),
                armed: true,
            };
            match sender.send(turn) {
                Ok(()) => return,
                Err(mut turn) => {
                    // Its request went away as it was handed over: try the next.
                    turn.armed = false;
                    turn.peer.held.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls `future` once: its output, if done.
    fn poll_once<F: Future + Unpin>(future: &mut F) -> Option<F::Output> {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match std::pin::Pin::new(future).poll(&mut cx) {
            std::task::Poll::Ready(output) => Some(output),
            std::task::Poll::Pending => None,
        }
    }

    #[tokio::test]
    async fn a_freed_turn_goes_to_the_waiting_connection_holding_the_fewest() {
        let turns = Turns::new(2, None);
        let greedy = turns.peer();
        let fresh = turns.peer();
        let a = turns.take(&greedy).await;
        let b = turns.take(&greedy).await;
        // The greedy connection queues a third request first, then the fresh one asks.
        let mut greedy_waits = Box::pin(turns.take(&greedy));
        assert!(poll_once(&mut greedy_waits).is_none());
        let mut fresh_waits = Box::pin(turns.take(&fresh));
        assert!(poll_once(&mut fresh_waits).is_none());
        assert!(turns.saturated_for().is_some());
        drop(a);
        let served = poll_once(&mut fresh_waits);
        assert!(
            served.is_some(),
            "the fresh connection holds none: it is served first"
        );
        assert!(poll_once(&mut greedy_waits).is_none());
        drop(b);
        let c = greedy_waits.await;
        drop(c);
        assert!(turns.saturated_for().is_none());
    }

    #[tokio::test]
    async fn a_request_that_went_away_while_waiting_takes_no_turn() {
        let turns = Turns::new(1, None);
        let peer = turns.peer();
        let held = turns.take(&peer).await;
        let mut gone = Box::pin(turns.take(&peer));
        assert!(poll_once(&mut gone).is_none());
        drop(gone);
        drop(held);
        // The turn is free again: taken at once.
        let again = Box::pin(turns.take(&peer));
        assert!(futures_util::FutureExt::now_or_never(again).is_some());
    }

    #[test]
    fn a_connection_is_counted_while_it_lives() {
        let turns = Turns::new(1, None);
        let peer = turns.peer();
        assert_eq!(turns.peers(), 1);
        drop(peer);
        assert_eq!(turns.peers(), 0);
    }
}
