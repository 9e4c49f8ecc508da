//! Config sources side by side, and the all-or-nothing swap they all go through:
//!
//! - [`watch`]: the config directory, polled and reloaded on SIGHUP;
//! - [`xds`]: the xDS client, for rules a control plane pushes (Envoy Gateway).
//!
//! Each hands what it loaded to [`PolicySwap`]: a valid policy replaces the one in force, an
//! invalid one is logged, counted (`ratelimit_service_config_load_{success,error}`) and shown
//! in `/rlconfig` while the one in force stays.

pub mod watch;
pub mod xds;

use parking_lot::RwLock;
use std::sync::Arc;
use std::time::SystemTime;

use prometheus::{IntCounter, Registry};

use crate::config::{ConfigError, Loaded};
use crate::limiter::Limiter;
use crate::metrics::counter;

pub use watch::{LOAD_DEADLINE, ReloadOptions, Reloader};
pub use xds::XdsSource;

/// Where the policy in force came from, and how the last reload went (for `/rlconfig`).
#[derive(Debug, Clone, Default)]
pub struct ConfigInfo {
    /// The config directory.
    pub directory: String,
    /// Files of the policy in force, relative to the directory.
    pub files: Vec<String>,
    /// The last reload's outcome, if there was one.
    pub last_reload: Option<String>,
    /// The config source's connection (xDS: subscribed, or why not), if it has one.
    pub connection: Option<String>,
}

/// Shared, updated by reloads.
pub type SharedConfigInfo = Arc<RwLock<ConfigInfo>>;

/// The all-or-nothing swap every config source goes through (the directory watcher, the xDS
/// client): a valid policy replaces the one in force, an invalid one is logged, counted and
/// shown in `/rlconfig` while the one in force stays.
#[derive(Clone)]
pub struct PolicySwap {
    limiter: Arc<Limiter>,
    metrics: ConfigMetrics,
    info: SharedConfigInfo,
    /// Told whether the policy in force has a domain, in the step that swaps it in (before
    /// the load is counted: a probe that waits for the metric then sees the health too).
    health: Option<Arc<crate::health::Health>>,
}

/// Config loads, as the reference counts them.
#[derive(Clone)]
pub struct ConfigMetrics {
    success: IntCounter,
    error: IntCounter,
}

impl ConfigMetrics {
    /// Registers the config-load counters into `registry`.
    pub fn register(registry: &Registry) -> Self {
        Self {
            success: counter(
                registry,
                "ratelimit_service_config_load_success",
                "Config loads that succeeded",
            ),
            error: counter(
                registry,
                "ratelimit_service_config_load_error",
                "Config loads that failed (the old config stayed)",
            ),
        }
    }

    /// A config load's outcome.
    pub fn loaded(&self, ok: bool) {
        if ok {
            self.success.inc();
        } else {
            self.error.inc();
        }
    }
}

impl PolicySwap {
    /// Records the source's connection state for `/rlconfig`.
    pub fn connection(&self, state: String) {
        self.info.write().connection = Some(state);
    }

    /// A swap into `limiter` (whose observer hears of each new policy), counted in `metrics`
    /// and shown in `info`.
    pub fn new(limiter: Arc<Limiter>, metrics: ConfigMetrics, info: SharedConfigInfo) -> Self {
        Self {
            limiter,
            metrics,
            info,
            health: None,
        }
    }

    /// The same swap, also telling `health` whether the policy in force has a domain.
    pub fn with_health(self, health: Arc<crate::health::Health>) -> Self {
        Self {
            health: Some(health),
            ..self
        }
    }

    /// The domains of the policy in force.
    pub fn domain_count(&self) -> usize {
        self.limiter.policy().domain_count()
    }

    /// Swaps in a loaded policy, or keeps the old one and says why; returns whether it swapped.
    /// `reason` says what brought it (a file change, SIGHUP, an xDS version).
    pub fn apply(&self, loaded: Result<Loaded, Vec<ConfigError>>, reason: &str) -> bool {
        match loaded {
            Ok(loaded) => {
                let domains = loaded.policy.domain_count();
                let policy = Arc::new(loaded.policy);
                self.limiter.set_policy(policy);
                if let Some(health) = &self.health {
                    health.set_config_loaded(domains > 0);
                }
                self.metrics.loaded(true);
                tracing::info!(
                    reason,
                    files = loaded.files.len(),
                    domains,
                    "config reloaded"
                );
                let mut info = self.info.write();
                info.last_reload = Some(format!("ok at {} ({reason})", timestamp()));
                info.files = loaded.files;
                true
            }
            Err(errors) => {
                self.metrics.loaded(false);
                for error in &errors {
                    tracing::warn!(%error, "config reload rejected; the previous config stays");
                }
                let mut info = self.info.write();
                info.last_reload = Some(format!(
                    "rejected at {} ({reason}), previous config kept: {}",
                    timestamp(),
                    errors
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                ));
                false
            }
        }
    }
}

fn timestamp() -> String {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("unix time {secs}")
}
