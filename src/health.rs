//! Serving state shared by the gRPC health service and the admin endpoints.

use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the process accepts work: ready once the policy is loaded and servers are bound,
/// not ready again from the moment it starts draining. With
/// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, also not ready while the policy in force has
/// no domain; with `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`, while the store does not answer.
#[derive(Debug)]
pub struct Health {
    serving: AtomicBool,
    needs_config: AtomicBool,
    has_config: AtomicBool,
    needs_store: AtomicBool,
    store_up: AtomicBool,
    /// An xDS source has not delivered its first valid configuration yet.
    awaiting_first: AtomicBool,
    /// Readiness waits for it too (xDS without `FORCE_START_WITHOUT_INITIAL_CONFIG`).
    first_gates_readiness: AtomicBool,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            serving: AtomicBool::new(false),
            needs_config: AtomicBool::new(false),
            has_config: AtomicBool::new(false),
            needs_store: AtomicBool::new(false),
            store_up: AtomicBool::new(true),
            awaiting_first: AtomicBool::new(false),
            first_gates_readiness: AtomicBool::new(false),
        }
    }
}

impl Health {
    /// Marks the process ready (or not).
    pub fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::SeqCst);
    }

    /// Requires a policy with at least one domain before the process reports ready.
    pub fn require_config(&self, required: bool) {
        self.needs_config.store(required, Ordering::SeqCst);
    }

    /// Records whether the policy in force has at least one domain.
    pub fn set_config_loaded(&self, loaded: bool) {
        self.has_config.store(loaded, Ordering::SeqCst);
    }

    /// Requires the store to answer for the process to report ready.
    pub fn require_store(&self, required: bool) {
        self.needs_store.store(required, Ordering::SeqCst);
    }

    /// Records whether the store answers (its circuit breaker is closed).
    pub fn set_store_up(&self, up: bool) {
        self.store_up.store(up, Ordering::SeqCst);
    }

    /// An xDS source is to deliver the first configuration; readiness waits for it unless
    /// `force_start` (`FORCE_START_WITHOUT_INITIAL_CONFIG`).
    pub fn await_first_config(&self, force_start: bool) {
        self.awaiting_first.store(true, Ordering::SeqCst);
        self.first_gates_readiness
            .store(!force_start, Ordering::SeqCst);
    }

    /// Records that a configuration from the source is in force.
    pub fn set_first_config_in(&self, arrived: bool) {
        if arrived {
            self.awaiting_first.store(false, Ordering::SeqCst);
        }
    }

    /// Whether no configuration has arrived yet from a source that is to deliver one: the
    /// decisions are errors until then.
    pub fn awaits_first_config(&self) -> bool {
        self.awaiting_first.load(Ordering::SeqCst)
    }

    fn first_gates(&self) -> bool {
        self.first_gates_readiness.load(Ordering::SeqCst) && self.awaits_first_config()
    }

    /// Whether readiness waits for the store.
    pub fn waits_for_store(&self) -> bool {
        self.needs_store.load(Ordering::SeqCst) && !self.store_up.load(Ordering::SeqCst)
    }

    /// Whether the process is ready and not draining (and, where required, has a config and
    /// a store that answers).
    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::SeqCst)
            && !self.waits_for_config()
            && !self.waits_for_store()
            && !self.first_gates()
    }

    /// Whether readiness waits for a config with at least one domain.
    pub fn waits_for_config(&self) -> bool {
        self.needs_config.load(Ordering::SeqCst) && !self.has_config.load(Ordering::SeqCst)
    }

    /// Why the process is not ready, for health check bodies.
    pub fn reason(&self) -> &'static str {
        if !self.serving.load(Ordering::SeqCst) {
            "draining"
        } else if self.waits_for_config() {
            "no rate limit config loaded"
        } else if self.first_gates() {
            "no rate limit configuration received from the control plane yet"
        } else if self.waits_for_store() {
            "the store does not answer"
        } else {
            "ok"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Health;

    #[test]
    fn a_required_config_keeps_the_process_unready_until_it_is_loaded() {
        let health = Health::default();
        health.set_serving(true);
        assert!(health.is_serving());
        health.require_config(true);
        assert!(!health.is_serving());
        assert_eq!(health.reason(), "no rate limit config loaded");
        health.set_config_loaded(true);
        assert!(health.is_serving());
        health.set_serving(false);
        assert_eq!(health.reason(), "draining");
    }
}
