//! Process signals and the drain signal fanned out to every server.

use tokio::sync::watch;

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
pub async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(term) => term,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the server");
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Tells servers to stop accepting and drain.
#[derive(Debug, Clone)]
pub struct Drain {
    tx: watch::Sender<bool>,
}

impl Drain {
    /// A drain signal not yet given.
    pub fn new() -> Self {
        Self {
            tx: watch::channel(false).0,
        }
    }

    /// Starts draining.
    pub fn start(&self) {
        self.tx.send_replace(true);
    }

    /// Resolves once draining has started.
    pub fn started(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.tx.subscribe();
        async move {
            let _ = rx.wait_for(|draining| *draining).await;
        }
    }
}

impl Default for Drain {
    fn default() -> Self {
        Self::new()
    }
}
