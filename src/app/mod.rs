// Why one long file: the bootstrap read top to bottom in the order it runs; the listeners, the
// metrics, the store stack, the ticking tasks and the running service are in app/.
//! Bootstrap, the only place that builds: settings → config → registry and metrics → store
//! stack → limiter → faces (gRPC, admin, config source) → tasks, and the ordered shutdown.
//!
//! Everything that can be wrong with the settings or the config is found by [`prepare`],
//! before any port is bound; [`Prepared::serve`] takes already-bound listeners, so tests
//! bind `127.0.0.1:0`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::admin::{self, AdminState};
use crate::clock::Clock;
use crate::config::{self, ConfigError, LoadOptions};
use crate::health::Health;
use crate::limiter::Limiter;
use crate::net::grpc::MessagesLayer;
use crate::net::http;
use crate::net::tls::ReloadingTls;
use crate::net::turns::{TurnMetrics, Turns};
use crate::quota::Quotas;
use crate::rlqs::RlqsService;
use crate::rls::{ClientFaultsLayer, RlsService};
use crate::settings::Settings;
use crate::source::{
    ConfigInfo, LOAD_DEADLINE, PolicySwap, ReloadOptions, Reloader, SharedConfigInfo, XdsSource,
};

mod listeners;
mod metrics;
mod running;
mod store;
mod tasks;

pub use listeners::{GrpcListener, Listeners};
pub use metrics::{Metrics, Scrape};
use running::{Running, follow_requirements, report_health};
use store::{Time, build_store};
use tasks::{spawn_quota_ticks, spawn_refused_ticks, spawn_turn_watch};

/// Why the service could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The config directory has errors; every one is listed.
    #[error("invalid rate limit config ({} errors)", .0.len())]
    Config(Vec<ConfigError>),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// A server failed while running.
    #[error("server error: {0}")]
    Serve(String),
    /// The trace exporter could not be built from its settings.
    #[error("cannot export traces: {0}")]
    Tracing(String),
}

/// HTTP/2 flow-control windows of gRPC streams and connections, in bytes.
const GRPC_STREAM_WINDOW: u32 = 64 * 1024;
const GRPC_CONNECTION_WINDOW: u32 = 512 * 1024;

/// Longest wait at startup for the store's connections and scripts.
const WARM_UP_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Interval of HTTP/2 pings on a quiet gRPC connection, and how long the answer may take:
/// a peer that vanished without closing is found within a minute and a half.
const GRPC_KEEPALIVE: (std::time::Duration, std::time::Duration) = (
    std::time::Duration::from_secs(60),
    std::time::Duration::from_secs(20),
);

/// Concurrent streams per gRPC connection (`SETTINGS_MAX_CONCURRENT_STREAMS`), well below
/// `GRPC_MAX_IN_FLIGHT`'s default: Envoy multiplexes every request of a worker thread over
/// one connection and opens another when a peer's limit is reached, so this only bounds what
/// one client can pile up (HTTP/2 asks for at least 100).
const GRPC_MAX_STREAMS: u32 = 128;

/// The gRPC calls that stream their messages for as long as they live: their messages have
/// no deadline and are read one at a time (see [`MessagesLayer`]).
const STREAMING_CALLS: &[&str] = &["/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/"];

/// How long requests wait for turns without a break before `/ready` says the server is busy.
const SATURATED_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// The largest header list a gRPC request may have: above the 60 KiB Envoy itself accepts
/// (its `max_request_headers_kb`), so nothing Envoy forwards is refused. HTTP/2 cannot refuse
/// a header block that spans CONTINUATION frames without closing the connection (the
/// compression state must see every byte), so at 16 KiB (hyper's default) a large trace or
/// baggage header from Envoy cost the whole connection and every request in flight on it.
const GRPC_MAX_HEADER_LIST: u32 = 64 * 1024;

/// A service ready to serve: config loaded, store and limiter built.
pub struct Prepared {
    settings: Settings,
    limiter: Arc<Limiter>,
    /// The shared store under the limiter's stack (see `store::Stores`).
    shared: Arc<dyn crate::store::Shared>,
    config: SharedConfigInfo,
    metrics: Arc<Metrics>,
    reset: Arc<admin::ResetAccess>,
    /// The gRPC requests' turns (`GRPC_MAX_IN_FLIGHT`).
    turns: Arc<Turns>,
    hurry: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

/// Loads and validates the config and builds the store and limiter; binds nothing.
pub fn prepare(settings: Settings) -> Result<Prepared, AppError> {
    prepare_on(settings, Time::System)
}

/// [`prepare`] on `clock` instead of the wall clock: the stores in process (the memory store,
/// the failure policy's local counters, the over-limit cache) and Redis's script (instead of
/// its `TIME`) all read it, so tests move a manual clock instead of sleeping. Never in
/// production, where every instance must share Redis's clock.
pub fn prepare_with_clock(settings: Settings, clock: Arc<dyn Clock>) -> Result<Prepared, AppError> {
    prepare_on(settings, Time::Pinned(clock))
}

fn prepare_on(settings: Settings, time: Time) -> Result<Prepared, AppError> {
    let options = LoadOptions {
        merge_domains: settings.merge_domains,
    };
    let metrics = Arc::new(
        Metrics::new(
            settings.near_limit_ratio,
            settings.metrics_max_detailed_series,
        )
        .with_response_time_in_milliseconds(settings.response_time_in_milliseconds)
        .with_ladder(settings.ladder),
    );
    let (loaded, source) = match &settings.xds {
        // The control plane sends the rules once the service runs.
        Some(xds) => (
            config::Loaded {
                policy: crate::policy::Policy::default(),
                files: Vec::new(),
            },
            format!("xds {} (node {})", xds.server_url, xds.node_id),
        ),
        None => {
            let loaded = config::load_dir_within(&settings.config_dir, options, LOAD_DEADLINE)
                .map_err(AppError::Config)?;
            metrics.config().loaded(true);
            (loaded, settings.config_dir.display().to_string())
        }
    };
    let stores = build_store(&settings, &time)?;
    tracing::info!(
        source = %source,
        files = loaded.files.len(),
        domains = loaded.policy.domain_count(),
        store = stores.top.status().kind,
        "rate limit config loaded"
    );
    log_compatibility(&settings);
    let config = Arc::new(parking_lot::RwLock::new(ConfigInfo {
        directory: source,
        files: loaded.files,
        last_reload: None,
        connection: None,
    }));
    let limiter = Arc::new(
        Limiter::new(Arc::new(loaded.policy), stores.top, settings.limiter)
            .with_observer(metrics.clone()),
    );
    let reset = Arc::new(admin::ResetAccess::new(
        settings.admin_reset.clone(),
        metrics.registry(),
    ));
    let in_flight = settings.grpc_max_in_flight;
    let turns = Turns::new(
        in_flight,
        Some(TurnMetrics::register(metrics.registry(), in_flight)),
    );
    Ok(Prepared {
        settings,
        limiter,
        shared: stores.shared,
        config,
        metrics,
        reset,
        turns,
        hurry: None,
    })
}

/// What the reference's users should know at start-up: the failure mode and the defaults that
/// differ, under the reference's name; the reference's key layout, when chosen.
fn log_compatibility(settings: &Settings) {
    if settings.as_reference {
        tracing::info!(
            failure_mode = settings.limiter.failure_mode.as_str(),
            "running as envoyproxy/ratelimit (/bin/ratelimit): rules without a failure_mode answer a store failure by failure_mode {} ({}); defaults that differ from the reference: USE_STATSD false (Prometheus /metrics is native), the :6070 debug listener off (set DEBUG_PORT), LOCAL_CACHE_SIZE_IN_BYTES 16 MiB (the over-limit cache), refused requests charge nothing, a bad config exits 64",
            settings.limiter.failure_mode.as_str(),
            match settings.limiter.failure_mode {
                crate::store::FailureMode::Envoy =>
                    "a prompt gRPC UNAVAILABLE: Envoy's failure_mode_deny decides, as with the reference",
                crate::store::FailureMode::Allow => "admit",
                crate::store::FailureMode::Deny => "refuse",
                crate::store::FailureMode::Local => "count in this instance's memory",
            }
        );
    }
    if settings.limiter.reference_keys {
        tracing::info!(
            "fixed-window counters use envoyproxy/ratelimit's Redis keys and integers (REDIS_KEY_FORMAT=reference)"
        );
    }
}

impl Prepared {
    /// Makes `hurry` (the operator's second Ctrl-C) cut the shutdown delay short: draining
    /// starts at once.
    pub fn hurry_on(mut self, hurry: impl Future<Output = ()> + Send + 'static) -> Self {
        self.hurry = Some(Box::pin(hurry));
        self
    }

    /// The limiter, e.g. for tests that inspect the policy.
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }

    /// Serves gRPC and HTTP on `listeners` until `shutdown` resolves, then drains: health
    /// NOT_SERVING, stop accepting, let in-flight requests finish within the grace period.
    pub async fn serve(
        mut self,
        listeners: Listeners,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), AppError> {
        self.warm_up().await;
        let mut running = self.start(listeners).await?;
        tokio::select! {
            _ = shutdown => {}
            result = &mut running.grpc => return Err(AppError::Serve(format!("gRPC server stopped: {result:?}"))),
            result = &mut running.http => return Err(AppError::Serve(format!("HTTP server stopped: {result:?}"))),
        }
        let hurry = self
            .hurry
            .take()
            .unwrap_or_else(|| Box::pin(std::future::pending()));
        running.shut_down(&self.settings, hurry).await;
        Ok(())
    }

    /// Connections and scripts first, within [`WARM_UP_LIMIT`]: an unreachable store must
    /// not stop the service from starting; it then serves by its failure policy. (`&mut`:
    /// `hurry` is `Send` but not `Sync`, so `&self` could not be held across an await.)
    async fn warm_up(&mut self) {
        let startup = self.settings.store_startup;
        let store = &self.shared;
        if startup.max_elapsed.is_zero() {
            if tokio::time::timeout(WARM_UP_LIMIT, store.warm_up())
                .await
                .is_err()
            {
                tracing::warn!(limit = ?WARM_UP_LIMIT, "store not ready at startup; serving by failure_mode until it is");
            }
            return;
        }
        // REDIS_STARTUP_*: retry with a doubling wait, within the time given.
        let attempts = async {
            let mut wait = startup.initial;
            loop {
                store.warm_up().await;
                match store.probe().await {
                    Ok(()) => return,
                    Err(error) => {
                        tracing::info!(%error, retry_in = ?wait, "store not ready at startup")
                    }
                }
                tokio::time::sleep(wait).await;
                wait = wait.saturating_mul(2).min(startup.max_interval);
            }
        };
        if tokio::time::timeout(startup.max_elapsed, attempts)
            .await
            .is_err()
        {
            tracing::warn!(limit = ?startup.max_elapsed, "store not ready after REDIS_STARTUP_MAX_ELAPSED_TIME; serving by failure_mode until it is");
        }
    }

    /// Starts the servers, the reloader and the health reports on `listeners`.
    async fn start(&mut self, listeners: Listeners) -> Result<Running, AppError> {
        let health = Arc::new(Health::default());
        health.require_config(self.settings.require_config);
        health.set_config_loaded(self.limiter.policy().domain_count() > 0);
        health.require_store(self.settings.require_store);
        health.set_store_up(self.limiter.store().status().healthy);
        if let Some(xds) = &self.settings.xds {
            health.await_first_config(xds.force_start);
        }
        let drain = CancellationToken::new();
        let (rls, traces) = self.rls_service(&health)?;
        let local = |l: &TcpListener| l.local_addr().map_err(|e| AppError::Serve(e.to_string()));
        let (grpc_addr, http_addr) = (listeners.grpc.describe()?, local(&listeners.http)?);
        let (rlqs, quotas, lane) = self.rlqs_face(traces.as_ref(), &drain)?;
        spawn_turn_watch(self.turns.clone(), health.clone(), &drain);
        if self.settings.limiter.distinct_refused_keys {
            spawn_refused_ticks(
                self.limiter.clone(),
                self.shared.clone(),
                self.metrics.clone(),
                &drain,
            );
        }
        let (reporter, grpc) =
            self.grpc_server(listeners.grpc, rls.clone(), (rlqs, quotas.clone()), &drain)?;
        let router = admin::router(AdminState {
            rls,
            limiter: self.limiter.clone(),
            health: health.clone(),
            config: self.config.clone(),
            metrics: Arc::new(self.scrape()),
            reset: self.reset.clone(),
            rlqs: Some(quotas.clone()),
        });
        if let Some(listener) = listeners.debug {
            tracing::info!(addr = ?listener.local_addr().ok(), "serving the admin endpoints on the debug listener too");
            tokio::spawn(http::serve(
                listener,
                router.clone(),
                self.settings.admin_connections,
                drain.clone().cancelled_owned(),
            ));
        }
        let http = http::serve(
            listeners.http,
            router,
            self.settings.admin_connections,
            drain.clone().cancelled_owned(),
        );
        let reloading = self.spawn_config_source(&health, &drain);
        if let Some(listener) = listeners.metrics {
            self.spawn_prometheus(listener, &drain);
        }
        let running = Running {
            grpc: tokio::spawn(grpc),
            http: tokio::spawn(http),
            reloading,
            health,
            reporter,
            drain,
            tracing: traces,
            statsd: self.spawn_statsd(),
            store: self.limiter.store().clone(),
            quotas,
            _lane: lane,
        };
        running.health.set_serving(true);
        report_health(&running.reporter, &running.health).await;
        if self.settings.require_config
            || self.settings.require_store
            || self.settings.xds.is_some()
        {
            tokio::spawn(follow_requirements(
                running.reporter.clone(),
                running.health.clone(),
                self.limiter.clone(),
                running.drain.clone().cancelled_owned(),
            ));
        }
        tracing::info!(grpc = %grpc_addr, http = %http_addr, "serving");
        Ok(running)
    }

    /// The RLQS face: its state, the thread its reports and ticks run on (until `drain` for
    /// the ticks), and the service, traced with `traces`.
    fn rlqs_face(
        &self,
        traces: Option<&Arc<crate::traces::Tracing>>,
        drain: &CancellationToken,
    ) -> Result<(RlqsService, Arc<Quotas>, crate::rlqs::Lane), AppError> {
        let quotas = Arc::new(
            Quotas::new(
                self.limiter.clone(),
                self.shared.clone(),
                self.settings.rlqs.clone(),
            )
            .with_metrics(self.metrics.rlqs()),
        );
        let lane = crate::rlqs::Lane::start()
            .map_err(|e| AppError::Serve(format!("cannot start the RLQS thread: {e}")))?;
        spawn_quota_ticks(quotas.clone(), &lane, drain);
        let mut rlqs = RlqsService::new(quotas.clone()).on_lane(&lane);
        if let Some(traces) = traces {
            rlqs = rlqs.with_tracing(traces.clone());
        }
        Ok((rlqs, quotas, lane))
    }

    /// The rate limit service answering from the limiter, traced when `TRACING_ENABLED` asks,
    /// and the trace exporter.
    fn rls_service(
        &self,
        health: &Arc<Health>,
    ) -> Result<(RlsService, Option<Arc<crate::traces::Tracing>>), AppError> {
        let rls = RlsService::with_options(self.limiter.clone(), self.settings.response.clone())
            .with_metrics(self.metrics.rls())
            .with_health(health.clone());
        let Some(settings) = &self.settings.tracing else {
            return Ok((rls, None));
        };
        let traces = crate::traces::Tracing::start(settings, self.metrics.registry())
            .map_err(AppError::Tracing)?;
        Ok((rls.with_tracing(traces.clone()), Some(traces)))
    }

    /// The statsd exporter (`USE_STATSD`, `USE_DOG_STATSD`) and what stops it: after the
    /// drain, so that its last flush has every request's counts.
    fn spawn_statsd(&self) -> Option<(CancellationToken, tokio::task::JoinHandle<()>)> {
        let statsd = self.settings.statsd.clone()?;
        let stop = CancellationToken::new();
        let task = tokio::spawn(crate::metrics::statsd::run(
            statsd,
            self.metrics.registry().clone(),
            stop.clone().cancelled_owned(),
        ));
        Some((stop, task))
    }

    /// The gRPC server: health and the rate limit service behind the client-fault and
    /// in-flight layers, over plain TCP or TLS, stopping when `drain` is cancelled; and the
    /// reporter of its health.
    fn grpc_server(
        &self,
        listener: GrpcListener,
        rls: RlsService,
        (rlqs, quotas): (RlqsService, Arc<Quotas>),
        drain: &CancellationToken,
    ) -> Result<(tonic_health::server::HealthReporter, ServerFuture), AppError> {
        let (reporter, health_service) = tonic_health::server::health_reporter();
        // GOAWAY at the age (tonic), the connection closed after the grace (`Guarded`): tonic's
        // own grace replaces the GOAWAY by a bare close at age plus grace.
        let (age, grace) = self.settings.grpc_max_connection_age;
        // ±10 % per process: tonic takes one age for all of a server's connections (the
        // reference jitters each), so pods started together do not all reconnect at once.
        let age = crate::clock::jittered(age, 0.1);
        let lifetime = Some(age.saturating_add(grace));
        let server = tonic::transport::Server::builder()
            .max_connection_age(age)
            .http2_keepalive_interval(Some(GRPC_KEEPALIVE.0))
            .http2_keepalive_timeout(Some(GRPC_KEEPALIVE.1))
            .max_concurrent_streams(GRPC_MAX_STREAMS)
            .http2_max_header_list_size(Some(GRPC_MAX_HEADER_LIST))
            // What a client may send that is not read yet (requests waiting for their turn):
            // HTTP/2's default per stream, and half a megabyte per connection instead of
            // hyper's 1 MiB, plenty for requests of a few hundred bytes.
            .initial_stream_window_size(Some(GRPC_STREAM_WINDOW))
            .initial_connection_window_size(Some(GRPC_CONNECTION_WINDOW))
            .layer(ClientFaultsLayer::new(Some(self.metrics.rls())))
            // Each request tied to its connection, its message bounded in time and bytes; its
            // turn of GRPC_MAX_IN_FLIGHT is taken once the message is in.
            .layer(MessagesLayer::new(
                self.turns.clone(),
                self.settings.grpc_connections.handshake_timeout,
                STREAMING_CALLS,
            ))
            .add_service(health_service)
            .add_service(rls.into_server())
            .add_service(rlqs.into_server())
            .add_service(
                admin::AdminService::new(self.limiter.clone(), self.reset.clone())
                    .with_quotas(quotas.clone())
                    .into_server(),
            );
        let stop = drain.clone().cancelled_owned();
        let limits = self.settings.grpc_connections;
        let listener = match listener {
            GrpcListener::Tcp(listener) => listener,
            GrpcListener::Unix(listener, _) => {
                let incoming =
                    tonic::codegen::tokio_stream::wrappers::UnixListenerStream::new(listener);
                let future: ServerFuture =
                    Box::pin(server.serve_with_incoming_shutdown(incoming, stop));
                return Ok((reporter, future));
            }
        };
        let future: ServerFuture = match &self.settings.grpc_tls {
            None => {
                let incoming = crate::net::connection::incoming(
                    listener,
                    limits,
                    lifetime,
                    self.turns.clone(),
                );
                Box::pin(server.serve_with_incoming_shutdown(incoming, stop))
            }
            Some(files) => {
                let tls = Arc::new(ReloadingTls::new(files.clone()).map_err(AppError::Serve)?);
                tracing::info!(mutual = files.client_ca.is_some(), "gRPC over TLS");
                let incoming =
                    crate::net::tls::incoming(listener, tls, limits, lifetime, self.turns.clone());
                Box::pin(server.serve_with_incoming_shutdown(incoming, stop))
            }
        };
        Ok((reporter, future))
    }

    /// The config source that swaps policies until `drain`: the xDS client, or the watcher of
    /// the config directory.
    fn spawn_config_source(
        &self,
        health: &Arc<Health>,
        drain: &CancellationToken,
    ) -> JoinHandle<()> {
        let stop = drain.clone().cancelled_owned();
        let Some(xds) = &self.settings.xds else {
            return tokio::spawn(self.reloader(health).run(stop));
        };
        let swap = self.policy_swap(health);
        let load = LoadOptions {
            merge_domains: self.settings.merge_domains,
        };
        tokio::spawn(XdsSource::new(xds.clone(), load, swap, health.clone()).run(stop))
    }

    /// Watches the config directory (and SIGHUP) and swaps the policy.
    fn reloader(&self, health: &Arc<Health>) -> Reloader {
        Reloader::new(
            ReloadOptions {
                dir: self.settings.config_dir.clone(),
                load: LoadOptions {
                    merge_domains: self.settings.merge_domains,
                },
                interval: self.settings.config_watch_interval,
                settle: std::time::Duration::from_millis(250),
                deadline: LOAD_DEADLINE,
                keep_when_empty: !self.settings.require_config,
            },
            self.policy_swap(health),
        )
    }

    /// The swap every config source goes through, into the limiter.
    fn policy_swap(&self, health: &Arc<Health>) -> PolicySwap {
        PolicySwap::new(
            self.limiter.clone(),
            self.metrics.config(),
            self.config.clone(),
        )
        .with_health(health.clone())
    }

    /// What the metrics endpoints render.
    fn scrape(&self) -> Scrape {
        Scrape {
            metrics: self.metrics.clone(),
            limiter: self.limiter.clone(),
        }
    }

    /// Serves the metrics alone on `listener` (`USE_PROMETHEUS`), until `drain`.
    fn spawn_prometheus(&self, listener: TcpListener, drain: &CancellationToken) {
        let Some(prometheus) = &self.settings.prometheus else {
            return;
        };
        let scrape = Arc::new(self.scrape());
        let router = axum::Router::new().route(
            &prometheus.path,
            axum::routing::get(move || {
                let scrape = scrape.clone();
                async move { admin::metrics_text(&*scrape) }
            }),
        );
        tracing::info!(addr = %prometheus.addr, path = %prometheus.path, "serving Prometheus metrics");
        tokio::spawn(http::serve(
            listener,
            router,
            self.settings.admin_connections,
            drain.clone().cancelled_owned(),
        ));
    }
}

/// A server running until it is told to stop.
type ServerFuture = Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>>;
