//! Process signals and the drain signal fanned out to every server.

/// Resolves on SIGTERM or SIGINT (Ctrl-C). The listeners are registered at the call, so a
/// signal that arrives before the future is first polled still counts.
pub fn signal() -> impl Future<Output = ()> + Send + 'static {
    let signals = signals(1);
    async move {
        let name = signals.await;
        tracing::info!("{name} received");
    }
}

/// Resolves once `count` SIGTERM or SIGINT signals have arrived since the call (the
/// listeners are registered at once, not when first polled): `signals(2)` is the operator's
/// second Ctrl-C, which skips the shutdown delay. Returns the last signal's name.
pub fn signals(count: usize) -> impl Future<Output = &'static str> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let listeners = signal(SignalKind::terminate())
            .and_then(|term| Ok((term, signal(SignalKind::interrupt())?)));
        async move {
            let (mut term, mut int) = match listeners {
                Ok(listeners) => listeners,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for SIGTERM and SIGINT; only Ctrl-C stops the server");
                    for _ in 0..count {
                        let _ = tokio::signal::ctrl_c().await;
                    }
                    return "SIGINT";
                }
            };
            let mut last = "SIGTERM";
            for _ in 0..count {
                last = tokio::select! {
                    _ = term.recv() => "SIGTERM",
                    _ = int.recv() => "SIGINT",
                };
            }
            last
        }
    }
    #[cfg(not(unix))]
    async move {
        for _ in 0..count {
            let _ = tokio::signal::ctrl_c().await;
        }
        "Ctrl-C"
    }
}
