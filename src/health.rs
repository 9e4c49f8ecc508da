//! Serving state shared by the gRPC health service and the admin endpoints.

use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the process accepts work: ready once the policy is loaded and servers are bound,
/// not ready again from the moment it starts draining.
#[derive(Debug, Default)]
pub struct Health {
    serving: AtomicBool,
}

impl Health {
    /// Marks the process ready (or not).
    pub fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::SeqCst);
    }

    /// Whether the process is ready and not draining.
    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::SeqCst)
    }
}
