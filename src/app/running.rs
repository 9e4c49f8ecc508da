//! A started service: its servers and tasks, the health it reports, and the ordered
//! shutdown.

use std::future::Future;
use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;

use crate::health::Health;
use crate::limiter::Limiter;
use crate::rls::RlsService;
use crate::settings::Settings;

/// The gRPC health service name of envoyproxy/ratelimit.
const REFERENCE_HEALTH_NAME: &str = "ratelimit";
/// The longest wait at shutdown for leased units to go back.
const HAND_BACK_LIMIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The servers and tasks of a started service.
pub(super) struct Running {
    pub(super) grpc: JoinHandle<Result<(), tonic::transport::Error>>,
    pub(super) http: JoinHandle<()>,
    pub(super) reloading: JoinHandle<()>,
    pub(super) health: Arc<Health>,
    pub(super) reporter: tonic_health::server::HealthReporter,
    /// Tells servers to stop accepting and drain.
    pub(super) drain: CancellationToken,
    /// The trace exporter, flushed last.
    pub(super) tracing: Option<Arc<crate::traces::Tracing>>,
    /// The statsd exporter and what stops it (after the drain, for a last flush).
    pub(super) statsd: Option<(CancellationToken, JoinHandle<()>)>,
    /// The store: after the drain it hands back what it holds (leased units).
    pub(super) store: Arc<dyn crate::store::Store>,
    /// The RLQS streams, sent short TTLs and closed when the drain starts.
    pub(super) quotas: Arc<crate::quota::Quotas>,
    /// The thread RLQS reports are read on, ended with the service.
    pub(super) _lane: crate::rlqs::Lane,
}

impl Running {
    /// Tells health checks at once; keeps serving for the shutdown delay (cut short by
    /// `hurry`) while load balancers notice; then stops accepting and lets in-flight requests
    /// finish within the grace period.
    pub(super) async fn shut_down(self, settings: &Settings, hurry: impl Future<Output = ()>) {
        tracing::info!(delay = ?settings.shutdown_delay, "shutting down: health checks now report not serving");
        self.health.set_serving(false);
        report_health(&self.reporter, &self.health).await;
        tokio::select! {
            _ = tokio::time::sleep(settings.shutdown_delay) => {}
            _ = hurry => {}
        }
        tracing::info!(grace = ?settings.shutdown_grace, "draining: no new connections");
        self.drain.cancel();
        // RLQS streams never end by themselves: short TTLs, then they close (Envoy reopens
        // them on another replica) and this instance's claims end soon after.
        let _ = tokio::time::timeout(HAND_BACK_LIMIT, self.quotas.drain()).await;
        let (grpc, http) = (self.grpc, self.http);
        let drained = tokio::time::timeout(settings.shutdown_grace, async {
            let _ = grpc.await;
            let _ = http.await;
        })
        .await;
        let _ = self.reloading.await;
        // Leased units back to the shared counters, bounded: at most the store's background
        // limit per call, a few seconds in all.
        let _ = tokio::time::timeout(HAND_BACK_LIMIT, self.store.shut_down()).await;
        if let Some((stop, task)) = self.statsd {
            stop.cancel();
            let last_flush = 2 * crate::metrics::statsd::IO_TIMEOUT;
            let _ = tokio::time::timeout(last_flush, task).await;
        }
        if let Some(tracing) = &self.tracing {
            tracing.shutdown().await;
        }
        match drained {
            Ok(()) => tracing::info!("drained; exiting"),
            Err(_) => tracing::warn!("grace period over with requests still in flight; exiting"),
        }
    }
}

/// Sets the gRPC health of `""`, `ratelimit` (the name the reference service registers, which
/// Kubernetes probes and Envoy health checks written for it ask) and the rate limit service to
/// what `health` says.
pub(super) async fn report_health(
    reporter: &tonic_health::server::HealthReporter,
    health: &Health,
) {
    let status = if health.is_serving() {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    for name in ["", REFERENCE_HEALTH_NAME] {
        reporter.set_service_status(name, status).await;
    }
    type Rls = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer<RlsService>;
    match status {
        ServingStatus::Serving => reporter.set_serving::<Rls>().await,
        _ => reporter.set_not_serving::<Rls>().await,
    }
}

/// With `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`: follows whether the policy in force has a
/// domain (a reload may bring the first or take the last); with
/// `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`, whether the store answers; until draining starts.
pub(super) async fn follow_requirements(
    reporter: tonic_health::server::HealthReporter,
    health: Arc<Health>,
    limiter: Arc<Limiter>,
    drain: impl Future<Output = ()>,
) {
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(200));
    tokio::pin!(drain);
    let mut reported = health.is_serving();
    loop {
        tokio::select! {
            _ = &mut drain => return,
            _ = tick.tick() => {}
        }
        health.set_config_loaded(limiter.policy().domain_count() > 0);
        health.set_store_up(limiter.store().status().healthy);
        let serving = health.is_serving();
        if serving != reported {
            tracing::info!(serving, reason = health.reason(), "health follows");
            report_health(&reporter, &health).await;
            reported = serving;
        }
    }
}
