//! What waits to be sent on one stream: the latest action per bucket (a newer one replaces
//! an older one, so a client that does not read holds at most one action per bucket), and
//! when everything queued was last taken for sending.

use std::collections::HashMap;

use parking_lot::Mutex;
use tokio::sync::Notify;

use super::bucket::BucketKey;
use super::share::Share;

/// An assignment as Envoy 1.40 enforces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assigned {
    /// `blanket_rule: ALLOW_ALL`.
    AllowAll,
    /// `blanket_rule: DENY_ALL`.
    DenyAll,
    /// A token bucket: the share, refilled over the window (whole seconds).
    Bucket(Share, u64),
}

impl Assigned {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Assigned::AllowAll => "allow_all",
            Assigned::DenyAll => "deny_all",
            Assigned::Bucket(..) => "token_bucket",
        }
    }
}

/// One bucket's action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// An assignment with a TTL in whole seconds.
    Assign(Assigned, u64),
    /// `AbandonAction`.
    Abandon,
}

/// The actions waiting for one stream.
#[derive(Default)]
pub struct Outbox {
    inner: Mutex<Inner>,
    notify: Notify,
}

#[derive(Default)]
struct Inner {
    actions: HashMap<BucketKey, Action>,
    /// When the queue was last emptied for sending, on the instance's clock (seconds).
    drained_at: Option<f64>,
    closed: bool,
}

impl Outbox {
    /// Queues `action` for `bucket`, replacing what was queued for it.
    pub fn push(&self, bucket: BucketKey, action: Action) {
        let mut inner = self.inner.lock();
        if inner.closed {
            return;
        }
        inner.actions.insert(bucket, action);
        drop(inner);
        self.notify.notify_one();
    }

    /// No more actions: the stream ends once what is queued was taken.
    pub fn close(&self) {
        self.inner.lock().closed = true;
        self.notify.notify_one();
    }

    /// When everything queued was last taken for sending.
    pub fn drained_at(&self) -> Option<f64> {
        self.inner.lock().drained_at
    }

    /// Everything queued up to `at` was handed on for sending.
    pub fn mark_drained(&self, at: f64) {
        let mut inner = self.inner.lock();
        if inner.drained_at.is_none_or(|d| d < at) {
            inner.drained_at = Some(at);
        }
    }

    /// Waits for actions and takes them all, with the time `now()` gives; `None` once closed
    /// and empty. The caller marks them sent ([`Outbox::mark_drained`]) once they are.
    pub async fn take(&self, now: impl Fn() -> f64) -> Option<(f64, Vec<(BucketKey, Action)>)> {
        loop {
            let notified = self.notify.notified();
            {
                let mut inner = self.inner.lock();
                if !inner.actions.is_empty() {
                    return Some((now(), inner.actions.drain().collect()));
                }
                if inner.closed {
                    return None;
                }
            }
            notified.await;
        }
    }
}
