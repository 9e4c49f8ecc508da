//! The store-wide circuit breaker: opened by consecutive failures, closed again by the
//! background prober.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

/// Consecutive-failure circuit breaker, closed again by the background prober.
pub(super) struct Breaker {
    threshold: u32,
    pub(super) cooldown: Duration,
    failures: AtomicU32,
    open: AtomicBool,
    /// Whether the prober runs.
    pub(super) probing: AtomicBool,
}

impl Breaker {
    pub(super) fn new(threshold: u32, cooldown: Duration) -> Self {
        Self {
            threshold,
            cooldown,
            failures: AtomicU32::new(0),
            open: AtomicBool::new(false),
            probing: AtomicBool::new(false),
        }
    }

    pub(super) fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    pub(super) fn succeeded(&self) {
        self.failures.store(0, Ordering::Release);
        if self.open.swap(false, Ordering::AcqRel) {
            tracing::info!("store answering again: circuit breaker closed");
        }
    }

    /// Records a failure; true when this failure opened the breaker.
    pub(super) fn failed(&self) -> bool {
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        failures >= self.threshold && !self.open.swap(true, Ordering::AcqRel)
    }
}
