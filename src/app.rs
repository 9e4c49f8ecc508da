// Why one long file: the whole bootstrap and the ordered shutdown, read top to bottom in the order
// they run.
//! Bootstrap: settings → config → store → limiter → servers, and the ordered shutdown.
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
use tonic_health::ServingStatus;

use crate::admin::{self, AdminState};
use crate::clock::{Clock, SystemClock};
use crate::config::{self, ConfigError, LoadOptions};
use crate::health::Health;
use crate::limiter::Limiter;
use crate::metrics::Metrics;
use crate::reload::{ConfigInfo, PolicySwap, ReloadOptions, Reloader, SharedConfigInfo};
use crate::rls::{ClientFaultsLayer, RlsService};
use crate::settings::{Backend, Settings};
use crate::store::redis::RedisOptions;
use crate::store::{MemoryStore, OverLimitCache, PerSecondSplit, RedisStore, Resilient, Store};
use crate::tls::ReloadingTls;
use crate::xds::XdsSource;

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
}

/// The gRPC listener: TCP, or a unix socket (`GRPC_UDS`).
pub enum GrpcListener {
    /// TCP, with the connection bounds and TLS if configured.
    Tcp(TcpListener),
    /// A unix socket at this path: local clients, plaintext, without the TCP bounds.
    Unix(tokio::net::UnixListener, std::path::PathBuf),
}

impl GrpcListener {
    fn describe(&self) -> Result<String, AppError> {
        match self {
            Self::Tcp(l) => l
                .local_addr()
                .map(|a| a.to_string())
                .map_err(|e| AppError::Serve(e.to_string())),
            Self::Unix(_, path) => Ok(format!("unix:{}", path.display())),
        }
    }
}

/// The bound sockets of a server.
pub struct Listeners {
    /// gRPC.
    pub grpc: GrpcListener,
    /// Admin HTTP.
    pub http: TcpListener,
    /// A separate Prometheus listener (`USE_PROMETHEUS`), if configured.
    pub metrics: Option<TcpListener>,
    /// The reference's debug listener (`DEBUG_HOST`, `DEBUG_PORT`), if configured.
    pub debug: Option<TcpListener>,
}

impl Listeners {
    /// Binds the addresses of `settings`.
    pub async fn bind(settings: &Settings) -> Result<Self, AppError> {
        let bind = |addr: std::net::SocketAddr| async move {
            // A backlog of 1,024 (the kernel caps it at somaxconn): past a connection cap the
            // listener stops accepting, and the connections waiting meanwhile queue here.
            let socket = if addr.is_ipv4() {
                tokio::net::TcpSocket::new_v4()
            } else {
                tokio::net::TcpSocket::new_v6()
            };
            socket
                .and_then(|socket| {
                    socket.set_reuseaddr(true)?;
                    socket.bind(addr)?;
                    socket.listen(LISTEN_BACKLOG)
                })
                .map_err(|source| AppError::Bind { addr, source })
        };
        let metrics = match &settings.prometheus {
            Some(p) => Some(bind(p.addr).await?),
            None => None,
        };
        let debug = match settings.debug_addr {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        Ok(Self {
            grpc: match &settings.grpc_uds {
                Some(path) => {
                    // A socket left by an earlier process would refuse the bind.
                    let _ = std::fs::remove_file(path);
                    let listener = tokio::net::UnixListener::bind(path).map_err(|source| {
                        AppError::Serve(format!("GRPC_UDS '{}': {source}", path.display()))
                    })?;
                    GrpcListener::Unix(listener, path.clone())
                }
                None => GrpcListener::Tcp(bind(settings.grpc_addr).await?),
            },
            http: bind(settings.http_addr).await?,
            metrics,
            debug,
        })
    }
}

/// The gRPC health service name of envoyproxy/ratelimit.
const REFERENCE_HEALTH_NAME: &str = "ratelimit";

/// HTTP/2 flow-control windows of gRPC streams and connections, in bytes.
const GRPC_STREAM_WINDOW: u32 = 64 * 1024;
const GRPC_CONNECTION_WINDOW: u32 = 512 * 1024;

/// Connections the kernel queues for each listener before Sluice accepts them.
const LISTEN_BACKLOG: u32 = 1024;

/// Longest wait at startup for the store's connections and scripts.
const WARM_UP_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Interval of HTTP/2 pings on a quiet gRPC connection, and how long the answer may take:
/// a peer that vanished without closing is found within a minute and a half.
const GRPC_KEEPALIVE: (std::time::Duration, std::time::Duration) = (
    std::time::Duration::from_secs(60),
    std::time::Duration::from_secs(20),
);

/// Concurrent streams per gRPC connection. Envoy multiplexes every request of a worker
/// thread over one connection and opens another when a peer's limit is reached, so this
/// only bounds what one client can pile up, far above what one connection carries.
const GRPC_MAX_STREAMS: u32 = 1024;

/// A service ready to serve: config loaded, store and limiter built.
pub struct Prepared {
    settings: Settings,
    limiter: Arc<Limiter>,
    config: SharedConfigInfo,
    metrics: Arc<Metrics>,
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

/// Where the stores take the time from.
enum Time {
    /// The wall clock in process, Redis's own `TIME` in Redis.
    System,
    /// One clock for every store, Redis's script included.
    Pinned(Arc<dyn Clock>),
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
        .with_response_time_in_milliseconds(settings.response_time_in_milliseconds),
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
            let loaded =
                config::load_dir(&settings.config_dir, options).map_err(AppError::Config)?;
            metrics.config.loaded(true);
            (loaded, settings.config_dir.display().to_string())
        }
    };
    let store = build_store(&settings, &time)?;
    tracing::info!(
        source = %source,
        files = loaded.files.len(),
        domains = loaded.policy.domain_count(),
        store = store.status().kind,
        "rate limit config loaded"
    );
    let config = Arc::new(parking_lot::RwLock::new(ConfigInfo {
        directory: source,
        files: loaded.files,
        last_reload: None,
        connection: None,
    }));
    let limiter = Arc::new(
        Limiter::new(Arc::new(loaded.policy), store, settings.limiter)
            .with_observer(metrics.clone()),
    );
    Ok(Prepared {
        settings,
        limiter,
        config,
        metrics,
        hurry: None,
    })
}

/// The store stack `settings` ask for: the memory store, or Redis behind its failure policy
/// (two with `REDIS_PERSECOND`), behind the over-limit cache when it is on.
fn build_store(settings: &Settings, time: &Time) -> Result<Arc<dyn Store>, AppError> {
    let clock: Arc<dyn Clock> = match time {
        Time::System => Arc::new(SystemClock),
        Time::Pinned(clock) => clock.clone(),
    };
    Ok(match settings.backend {
        Backend::Memory => {
            if settings.kubernetes {
                tracing::warn!(
                    "memory store under Kubernetes: each replica counts on its own, so N replicas admit up to N times every limit; use a shared store for fleet-wide limits"
                );
            }
            Arc::new(MemoryStore::new(settings.memory, clock))
        }
        Backend::Redis => {
            let options = settings
                .redis
                .as_ref()
                .ok_or_else(|| AppError::Serve("the redis backend needs REDIS_URL".into()))?;
            // Each Redis behind its own failure policy: one failing leaves the other exact.
            let resilient = |options: &RedisOptions| -> Result<Arc<Resilient>, AppError> {
                // A script call may outlive its requests' deadline: its answers still count
                // (see `Resilient`), up to the background limit.
                let mut redis = RedisStore::new(&RedisOptions {
                    call_timeout: settings.resilience.background_limit(),
                    ..options.clone()
                })
                .map_err(AppError::Serve)?;
                if let Time::Pinned(clock) = time {
                    redis = redis.with_clock(clock.clone());
                }
                Ok(Arc::new(Resilient::new(
                    Arc::new(redis),
                    settings.resilience,
                    clock.clone(),
                )))
            };
            let main = resilient(options)?;
            tracing::info!(kind = ?options.kind, prefix = %options.key_prefix, "counting in redis");
            let mut shared = vec![main.clone()];
            let store: Arc<dyn Store> = match &settings.redis_per_second {
                None => main,
                Some(fast) => {
                    let per_second = resilient(fast)?;
                    tracing::info!(kind = ?fast.kind, "counting limits per second in their own redis (REDIS_PERSECOND)");
                    shared.push(per_second.clone());
                    Arc::new(PerSecondSplit::new(main, per_second))
                }
            };
            if settings.local_cache_keys > 0 {
                let cache = OverLimitCache::new(store, settings.local_cache_keys, clock);
                // Answers that arrive after their deadline still teach the cache.
                for resilient in &shared {
                    resilient.on_late_answers(cache.late_answers());
                }
                Arc::new(cache)
            } else {
                store
            }
        }
    })
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
        let store = self.limiter.store();
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
        let rls = RlsService::with_options(self.limiter.clone(), self.settings.response.clone())
            .with_metrics(self.metrics.rls())
            .with_health(health.clone());
        let local = |l: &TcpListener| l.local_addr().map_err(|e| AppError::Serve(e.to_string()));
        let (grpc_addr, http_addr) = (listeners.grpc.describe()?, local(&listeners.http)?);
        let (reporter, grpc) = self.grpc_server(listeners.grpc, rls.clone(), &drain)?;
        let router = admin::router(AdminState {
            rls,
            limiter: self.limiter.clone(),
            health: health.clone(),
            config: self.config.clone(),
            metrics: self.metrics.clone(),
        });
        if let Some(listener) = listeners.debug {
            tracing::info!(addr = ?listener.local_addr().ok(), "serving the admin endpoints on the debug listener too");
            tokio::spawn(admin::serve(
                listener,
                router.clone(),
                self.settings.admin_connections,
                drain.clone().cancelled_owned(),
            ));
        }
        let http = admin::serve(
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

    /// The gRPC server: health and the rate limit service behind the client-fault and
    /// in-flight layers, over plain TCP or TLS, stopping when `drain` is cancelled; and the
    /// reporter of its health.
    fn grpc_server(
        &self,
        listener: GrpcListener,
        rls: RlsService,
        drain: &CancellationToken,
    ) -> Result<(tonic_health::server::HealthReporter, ServerFuture), AppError> {
        let (reporter, health_service) = tonic_health::server::health_reporter();
        // GOAWAY at the age (tonic), the connection closed after the grace (`Guarded`): tonic's
        // own grace replaces the GOAWAY by a bare close at age plus grace.
        let (age, grace) = self.settings.grpc_max_connection_age;
        let age = jittered(age);
        let lifetime = Some(age.saturating_add(grace));
        let server = tonic::transport::Server::builder()
            .max_connection_age(age)
            .http2_keepalive_interval(Some(GRPC_KEEPALIVE.0))
            .http2_keepalive_timeout(Some(GRPC_KEEPALIVE.1))
            .max_concurrent_streams(GRPC_MAX_STREAMS)
            // What a client may send that is not read yet (requests waiting for their turn):
            // HTTP/2's default per stream, and half a megabyte per connection instead of
            // hyper's 1 MiB, plenty for requests of a few hundred bytes.
            .initial_stream_window_size(Some(GRPC_STREAM_WINDOW))
            .initial_connection_window_size(Some(GRPC_CONNECTION_WINDOW))
            .layer(ClientFaultsLayer::new(Some(self.metrics.rls())))
            // Requests wait for a turn before their message is read, so at most this many
            // messages (of at most 4 MiB each) are held at once.
            .layer(tower::limit::GlobalConcurrencyLimitLayer::new(
                self.settings.grpc_max_in_flight,
            ))
            .add_service(health_service)
            .add_service(rls.into_server());
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
                let incoming = crate::connection::incoming(listener, limits, lifetime);
                Box::pin(server.serve_with_incoming_shutdown(incoming, stop))
            }
            Some(files) => {
                let tls = Arc::new(ReloadingTls::new(files.clone()).map_err(AppError::Serve)?);
                tracing::info!(mutual = files.client_ca.is_some(), "gRPC over TLS");
                let incoming = crate::tls::incoming(listener, tls, limits, lifetime);
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
            return tokio::spawn(self.reloader().run(stop));
        };
        let swap = PolicySwap::new(
            self.limiter.clone(),
            self.metrics.clone(),
            self.config.clone(),
        );
        let load = LoadOptions {
            merge_domains: self.settings.merge_domains,
        };
        tokio::spawn(XdsSource::new(xds.clone(), load, swap, health.clone()).run(stop))
    }

    /// Watches the config directory (and SIGHUP) and swaps the policy.
    fn reloader(&self) -> Reloader {
        Reloader::new(
            ReloadOptions {
                dir: self.settings.config_dir.clone(),
                load: LoadOptions {
                    merge_domains: self.settings.merge_domains,
                },
                interval: self.settings.config_watch_interval,
                settle: std::time::Duration::from_millis(250),
            },
            self.limiter.clone(),
            self.metrics.clone(),
            self.config.clone(),
        )
    }

    /// Serves the metrics alone on `listener` (`USE_PROMETHEUS`), until `drain`.
    fn spawn_prometheus(&self, listener: TcpListener, drain: &CancellationToken) {
        let Some(prometheus) = &self.settings.prometheus else {
            return;
        };
        let (limiter, metrics) = (self.limiter.clone(), self.metrics.clone());
        let router = axum::Router::new().route(
            &prometheus.path,
            axum::routing::get(move || {
                let (limiter, metrics) = (limiter.clone(), metrics.clone());
                async move { admin::metrics_text(&metrics, &limiter) }
            }),
        );
        tracing::info!(addr = %prometheus.addr, path = %prometheus.path, "serving Prometheus metrics");
        tokio::spawn(admin::serve(
            listener,
            router,
            self.settings.admin_connections,
            drain.clone().cancelled_owned(),
        ));
    }
}

/// A server running until it is told to stop.
/// `age` moved by up to ±10 %, differently in each process, so that the connections of pods
/// started together do not all close at once. (The reference jitters each connection; tonic
/// takes one age for all of a server's connections.)
fn jittered(age: std::time::Duration) -> std::time::Duration {
    use std::hash::BuildHasher as _;
    // A random number without a dependency: the standard library seeds each RandomState.
    let random = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
    let factor = 0.9 + 0.2 * (random % 10_000) as f64 / 10_000.0;
    age.mul_f64(factor)
}

/// The servers and tasks of a started service.
struct Running {
    grpc: JoinHandle<Result<(), tonic::transport::Error>>,
    http: JoinHandle<()>,
    reloading: JoinHandle<()>,
    health: Arc<Health>,
    reporter: tonic_health::server::HealthReporter,
    /// Tells servers to stop accepting and drain.
    drain: CancellationToken,
}

impl Running {
    /// Tells health checks at once; keeps serving for the shutdown delay (cut short by
    /// `hurry`) while load balancers notice; then stops accepting and lets in-flight requests
    /// finish within the grace period.
    async fn shut_down(self, settings: &Settings, hurry: impl Future<Output = ()>) {
        tracing::info!(delay = ?settings.shutdown_delay, "shutting down: health checks now report not serving");
        self.health.set_serving(false);
        report_health(&self.reporter, &self.health).await;
        tokio::select! {
            _ = tokio::time::sleep(settings.shutdown_delay) => {}
            _ = hurry => {}
        }
        tracing::info!(grace = ?settings.shutdown_grace, "draining: no new connections");
        self.drain.cancel();
        let (grpc, http) = (self.grpc, self.http);
        let drained = tokio::time::timeout(settings.shutdown_grace, async {
            let _ = grpc.await;
            let _ = http.await;
        })
        .await;
        let _ = self.reloading.await;
        match drained {
            Ok(()) => tracing::info!("drained; exiting"),
            Err(_) => tracing::warn!("grace period over with requests still in flight; exiting"),
        }
    }
}

type ServerFuture = Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>>;

/// Sets the gRPC health of `""`, `ratelimit` (the name the reference service registers, which
/// Kubernetes probes and Envoy health checks written for it ask) and the rate limit service to
/// what `health` says.
async fn report_health(reporter: &tonic_health::server::HealthReporter, health: &Health) {
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
async fn follow_requirements(
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
