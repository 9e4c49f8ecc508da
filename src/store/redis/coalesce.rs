//! Requests that arrive while script calls are in flight wait, and go to Redis together in
//! the next call: one EVALSHA carries every counter of many requests (each still decided
//! all-or-nothing, in arrival order; see `lua/batch.lua`). Each connection carries at most one
//! call at a time, so an idle store sends a request at once, and a busy one sends fewer,
//! larger calls instead of queueing many small ones: Redis's cost per call (parsing, the
//! script's setup, a write and a read) and Sluice's are paid once per call, not per request.
//! A call takes the queue only after the tasks already runnable have run (microseconds), so
//! the requests read from the network together go together, and their answers come back
//! together: with the first request of a burst sent alone, calls carried 13 requests on
//! average under load, and 21 since (docs/performance.md).

use parking_lot::{Mutex, MutexGuard};
use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::{Part, Reply, Shared, decode};
use crate::store::StoreError;

/// Counters one call may carry: Lua's `unpack` of KEYS stops near 8,000, and a long script
/// would hold Redis (single-threaded) for everyone else.
const MAX_KEYS_PER_CALL: usize = 512;

/// Requests waiting for a call, and how many calls are in flight.
pub(super) struct Queue {
    state: Mutex<State>,
    max_in_flight: usize,
}

struct State {
    waiting: VecDeque<Waiting>,
    in_flight: usize,
}

struct Waiting {
    part: Part,
    reply: oneshot::Sender<Result<Reply, StoreError>>,
}

impl Queue {
    /// A queue allowing `max_in_flight` calls at once (one per connection).
    pub fn new(max_in_flight: usize) -> Self {
        Self {
            state: Mutex::new(State {
                waiting: VecDeque::new(),
                in_flight: 0,
            }),
            max_in_flight,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }
}

impl State {
    /// The next call's requests, oldest first, skipping those whose caller gave up.
    fn take(&mut self) -> Vec<Waiting> {
        let mut calls = Vec::new();
        let mut keys = 0;
        while let Some(next) = self.waiting.front() {
            if next.reply.is_closed() {
                self.waiting.pop_front();
                continue;
            }
            if !calls.is_empty() && keys + next.part.keys.len() > MAX_KEYS_PER_CALL {
                break;
            }
            keys += next.part.keys.len();
            calls.extend(self.waiting.pop_front());
        }
        calls
    }
}

impl Shared {
    /// Decides `part` in the next script call, starting one if a connection is free.
    pub(super) async fn submit(shared: &Arc<Self>, part: Part) -> Result<Reply, StoreError> {
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut state = shared.queue.lock();
            state.waiting.push_back(Waiting { part, reply });
            let free = state.in_flight < shared.queue.max_in_flight;
            if free {
                state.in_flight += 1;
            }
            free
        };
        if start {
            // A task of its own: the caller may give up at its deadline, the others in the
            // call still need their answers. It takes the waiting requests when it first
            // runs, after the tasks already runnable (typically the other requests read from
            // the same HTTP/2 frames): they go in one call, and their answers come back
            // together instead of the first one alone.
            tokio::spawn(shared.clone().run());
        }
        answer
            .await
            .unwrap_or_else(|_| Err(StoreError::Internal("the script call was abandoned".into())))
    }

    /// Makes calls until no request is waiting, then gives up its connection slot.
    async fn run(self: Arc<Self>) {
        loop {
            // Taking the next requests and giving up the slot happen under one lock, so a
            // request queued meanwhile is either taken here or starts a call of its own.
            let mut requests = {
                let mut state = self.queue.lock();
                let requests = state.take();
                if requests.is_empty() {
                    state.in_flight -= 1;
                    return;
                }
                requests
            };
            let result = {
                let parts: Vec<&Part> = requests.iter().map(|w| &w.part).collect();
                match tokio::time::timeout(self.call_timeout, self.invoke(&parts)).await {
                    Ok(result) => result.and_then(|values| decode(&values, &parts)),
                    Err(_) => Err(StoreError::Unavailable(format!(
                        "no answer from redis within {:?}",
                        self.call_timeout
                    ))),
                }
            };
            match result {
                Ok(replies) => {
                    for (waiting, reply) in requests.drain(..).zip(replies) {
                        let _ = waiting.reply.send(reply);
                    }
                }
                Err(error) => {
                    for waiting in requests.drain(..) {
                        let _ = waiting.reply.send(Err(error.clone()));
                    }
                }
            }
            // The requests woken by these answers finish first, and those read meanwhile
            // join the queue, before the next call takes it.
            tokio::task::yield_now().await;
        }
    }
}
