//! Serving state shared by the gRPC health service and the admin endpoints.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Whether the process accepts work: ready once the policy is loaded and servers are bound,
/// not ready again from the moment it starts draining. With
/// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, also not ready while the policy in force has
/// no domain; with `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`, while the store does not answer.
#[derive(Debug)]
pub struct Health {
    serving: AtomicBool,
    /// A policy with at least one domain (`HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`).
    config: Gate,
    /// A store that answers (`REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`).
    store: Gate,
    /// The first configuration from an xDS source (without `FORCE_START_WITHOUT_INITIAL_CONFIG`
    /// it gates readiness; either way decisions wait for it).
    first: Gate,
    /// Whether `first` gates readiness too.
    first_gates_readiness: AtomicBool,
    /// Seconds gRPC requests have waited for turns without a break, plus one (0: they do
    /// not): readiness (not liveness) fails meanwhile.
    busy: AtomicU64,
}

/// A condition readiness may require: waits while required and not met.
#[derive(Debug)]
struct Gate {
    required: AtomicBool,
    met: AtomicBool,
}

impl Gate {
    fn new(met: bool) -> Self {
        Self {
            required: AtomicBool::new(false),
            met: AtomicBool::new(met),
        }
    }

    fn waits(&self) -> bool {
        self.required.load(Ordering::SeqCst) && !self.met.load(Ordering::SeqCst)
    }
}

impl Default for Health {
    fn default() -> Self {
        Self {
            serving: AtomicBool::new(false),
            config: Gate::new(false),
            store: Gate::new(true),
            first: Gate::new(false),
            first_gates_readiness: AtomicBool::new(false),
            busy: AtomicU64::new(0),
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
        self.config.required.store(required, Ordering::SeqCst);
    }

    /// Records whether the policy in force has at least one domain.
    pub fn set_config_loaded(&self, loaded: bool) {
        self.config.met.store(loaded, Ordering::SeqCst);
    }

    /// Requires the store to answer for the process to report ready.
    pub fn require_store(&self, required: bool) {
        self.store.required.store(required, Ordering::SeqCst);
    }

    /// Records whether the store answers (its circuit breaker is closed).
    pub fn set_store_up(&self, up: bool) {
        self.store.met.store(up, Ordering::SeqCst);
    }

    /// An xDS source is to deliver the first configuration; readiness waits for it unless
    /// `force_start` (`FORCE_START_WITHOUT_INITIAL_CONFIG`).
    pub fn await_first_config(&self, force_start: bool) {
        self.first.required.store(true, Ordering::SeqCst);
        self.first_gates_readiness
            .store(!force_start, Ordering::SeqCst);
    }

    /// Records that a configuration from the source is in force.
    pub fn set_first_config_in(&self, arrived: bool) {
        if arrived {
            self.first.met.store(true, Ordering::SeqCst);
        }
    }

    /// Whether no configuration has arrived yet from a source that is to deliver one: the
    /// decisions are errors until then.
    pub fn awaits_first_config(&self) -> bool {
        self.first.waits()
    }

    fn first_gates(&self) -> bool {
        self.first_gates_readiness.load(Ordering::SeqCst) && self.first.waits()
    }

    /// Records for how long gRPC requests have waited for turns (`GRPC_MAX_IN_FLIGHT`)
    /// without a break, when long enough to matter; `None` when they do not wait.
    pub fn set_busy(&self, seconds: Option<u64>) {
        self.busy
            .store(seconds.map_or(0, |s| s.saturating_add(1)), Ordering::SeqCst);
    }

    /// For how long every gRPC turn has been taken with requests waiting, if it is long
    /// enough that readiness fails.
    pub fn busy_for(&self) -> Option<u64> {
        self.busy.load(Ordering::SeqCst).checked_sub(1)
    }

    /// Whether readiness waits for the store.
    pub fn waits_for_store(&self) -> bool {
        self.store.waits()
    }

    /// Whether readiness waits for a config with at least one domain.
    pub fn waits_for_config(&self) -> bool {
        self.config.waits()
    }

    /// Whether the process is ready and not draining (and, where required, has a config and
    /// a store that answers).
    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::SeqCst)
            && !self.waits_for_config()
            && !self.waits_for_store()
            && !self.first_gates()
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
