// Why one long file: single node, Cluster and Sentinel share connecting, TLS and reconnecting;
// split, each file would repeat them.
//! Connections to Redis: a single node (TCP, TLS or unix socket), a Cluster, or the master
//! named by Sentinel. Connections are multiplexed and pipelined (every request shares a few
//! of them), made lazily, and remade after failures, so Sluice starts and serves by its
//! failure policy even while Redis is down.

use parking_lot::{Mutex, RwLock};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, TlsCertificates};

use crate::store::StoreError;

/// How Redis is deployed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RedisKind {
    /// One server (or a proxy in front of several).
    Single,
    /// Redis Cluster: counters spread over the masters by hash slot.
    Cluster,
    /// A master found through Sentinel.
    Sentinel,
}

/// Where and how to connect.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// `redis://`, `rediss://`, `unix:///path`, `/path`, `host:port`; for Cluster a
    /// comma-separated seed list; for Sentinel `master-name,sentinel1:port,sentinel2:port`.
    pub url: String,
    /// Single, Cluster or Sentinel.
    pub kind: RedisKind,
    /// `password` or `user:password` (`REDIS_AUTH`).
    pub auth: Option<String>,
    /// Password for the Sentinels themselves (`REDIS_SENTINEL_AUTH`).
    pub sentinel_auth: Option<String>,
    /// Use TLS for addresses given without a scheme (`REDIS_TLS`).
    pub tls: bool,
    /// PEM CA bundle to trust instead of the system roots.
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate (mutual TLS).
    pub tls_cert: Option<PathBuf>,
    /// PEM client key (mutual TLS).
    pub tls_key: Option<PathBuf>,
    /// Skip hostname verification (`REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`).
    pub tls_insecure: bool,
    /// Prefix of every key (`CACHE_KEY_PREFIX`).
    pub key_prefix: String,
    /// Multiplexed connections per node.
    pub connections: usize,
    /// Time allowed to establish a connection.
    pub connect_timeout: Duration,
    /// Longest wait for a script call's answer (the store deadline, `REDIS_DEADLINE`).
    pub call_timeout: Duration,
    /// Most random time added to a reference-layout counter's expiry
    /// (`EXPIRATION_JITTER_MAX_SECONDS`; whole seconds).
    pub expiration_jitter: Duration,
    /// Replicas that must hold a script call's writes before its answer counts
    /// (`REDIS_WAIT_REPLICAS`; 0: none waited for). Single node and Sentinel only.
    pub wait_replicas: u32,
}

/// Makes and keeps connections.
pub(super) struct Connector {
    inner: Arc<Inner>,
    next: AtomicUsize,
}

struct Inner {
    target: Target,
    slots: Vec<Slot>,
    connect_timeout: Duration,
    /// Sentinel: the master the latest connection was made to (`host:port`), compared with
    /// what the Sentinels name by [`follow_sentinel`].
    master: Mutex<Option<String>>,
    /// Sentinel: whether [`follow_sentinel`] runs.
    following: AtomicBool,
}

/// How often a Sentinel is asked which master it names. Connections move to a new master
/// within this of its promotion, even while the old one still accepts writes (Sentinel
/// demotes a reachable old master only seconds later, and what it counted meanwhile is lost
/// with it).
const SENTINEL_POLL: Duration = Duration::from_millis(500);

/// One connection, made in the background: a request waiting for it may give up at its
/// deadline without abandoning the connection attempt (a slow TLS handshake still finishes).
struct Slot {
    conn: RwLock<Option<ConnHandle>>,
    connecting: AtomicBool,
    ready: Notify,
    last_error: Mutex<String>,
}

impl RedisOptions {
    /// Options for `url`: no auth, no TLS, no prefix, two connections, a two-second connect
    /// timeout, a one-second call timeout (`sluice serve` sets it to the store deadline).
    pub fn new(url: impl Into<String>, kind: RedisKind) -> Self {
        Self {
            url: url.into(),
            kind,
            auth: None,
            sentinel_auth: None,
            tls: false,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            tls_insecure: false,
            key_prefix: String::new(),
            connections: 2,
            connect_timeout: Duration::from_secs(2),
            call_timeout: Duration::from_secs(1),
            expiration_jitter: Duration::ZERO,
            wait_replicas: 0,
        }
    }
}

/// A multiplexed connection handle, cheap to clone.
#[derive(Clone)]
pub(super) enum ConnHandle {
    Node(ConnectionManager),
    Cluster(ClusterConnection),
}

enum Target {
    Node(Client),
    Cluster(ClusterClient),
    Sentinel {
        client: tokio::sync::Mutex<SentinelClient>,
        /// The master's name in the Sentinels' configuration.
        name: String,
    },
}

impl Connector {
    /// Validates the options and prepares clients; connects nothing yet.
    pub fn new(options: &RedisOptions) -> Result<Self, String> {
        let certs = tls_certificates(options)?;
        let target = match options.kind {
            RedisKind::Single => {
                let info = connection_info(options, options.url.trim())?;
                Target::Node(build_client(info, &certs)?)
            }
            RedisKind::Cluster => {
                let seeds = options
                    .url
                    .split(',')
                    .map(|s| connection_info(options, s.trim()))
                    .collect::<Result<Vec<_>, _>>()?;
                let tls = seeds
                    .first()
                    .is_some_and(|i| matches!(i.addr(), ConnectionAddr::TcpTls { .. }));
                let mut builder = ClusterClient::builder(seeds)
                    .connection_timeout(options.connect_timeout)
                    .retries(1);
                if tls {
                    builder = builder.certs(certs.clone());
                }
                Target::Cluster(
                    builder
                        .build()
                        .map_err(|e| format!("invalid cluster seeds: {e}"))?,
                )
            }
            RedisKind::Sentinel => {
                let mut parts = options.url.split(',').map(str::trim);
                let master = parts
                    .next()
                    .filter(|m| !m.is_empty() && !m.contains(':'))
                    .ok_or(
                        "sentinel REDIS_URL must be 'master-name,host:port[,host:port...]'"
                            .to_owned(),
                    )?;
                let sentinels = parts
                    .map(|s| {
                        let mut info = connection_info(options, s)?;
                        if let Some(auth) = &options.sentinel_auth {
                            info = with_auth(info, auth);
                        }
                        Ok(info)
                    })
                    .collect::<Result<Vec<_>, String>>()?;
                if sentinels.is_empty() {
                    return Err("sentinel REDIS_URL names no sentinel address".into());
                }
                let node = connection_info(options, "127.0.0.1:6379")?;
                let mut node_info = SentinelNodeConnectionInfo::default();
                node_info = node_info.set_redis_connection_info(node.redis_settings().clone());
                let client = SentinelClient::build(
                    sentinels,
                    master,
                    Some(node_info),
                    SentinelServerType::Master,
                )
                .map_err(|e| format!("invalid sentinel settings: {e}"))?;
                Target::Sentinel {
                    client: tokio::sync::Mutex::new(client),
                    name: master.to_owned(),
                }
            }
        };
        let slots = (0..options.connections.max(1))
            .map(|_| Slot {
                conn: RwLock::new(None),
                connecting: AtomicBool::new(false),
                ready: Notify::new(),
                last_error: Mutex::new("not connected yet".into()),
            })
            .collect();
        Ok(Self {
            inner: Arc::new(Inner {
                target,
                slots,
                connect_timeout: options.connect_timeout,
                master: Mutex::new(None),
                following: AtomicBool::new(false),
            }),
            next: AtomicUsize::new(0),
        })
    }

    /// A connection (round robin over the slots), waiting for it to be made if needed.
    pub async fn get(&self) -> Result<(usize, ConnHandle), StoreError> {
        self.follow();
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.inner.slots.len();
        let slot = &self.inner.slots[i];
        if let Some(conn) = slot.current() {
            return Ok((i, conn));
        }
        // Registered before the attempt starts, so its completion cannot be missed.
        let ready = slot.ready.notified();
        if !slot.connecting.swap(true, Ordering::AcqRel) {
            let inner = self.inner.clone();
            tokio::spawn(async move {
                let result = tokio::time::timeout(inner.connect_timeout, inner.connect()).await;
                let slot = &inner.slots[i];
                match result {
                    Ok(Ok(conn)) => {
                        *slot.conn.write() = Some(conn);
                        tracing::info!(connection = i, "connected to redis");
                    }
                    Ok(Err(e)) => slot.failed(e.to_string()),
                    Err(_) => slot.failed("timed out connecting to redis".into()),
                }
                slot.connecting.store(false, Ordering::Release);
                slot.ready.notify_waiters();
            });
        }
        ready.await;
        slot.current()
            .map(|conn| (i, conn))
            .ok_or_else(|| StoreError::Unavailable(slot.last_error.lock().clone()))
    }

    /// Forgets connection `i` so that the next use makes a new one (after errors that
    /// reconnecting the same address will not fix, e.g. a Sentinel failover).
    pub fn reset(&self, i: usize) {
        if matches!(self.inner.target, Target::Sentinel { .. }) {
            *self.inner.slots[i].conn.write() = None;
        }
    }

    /// Starts [`follow_sentinel`] once, for a Sentinel target (from the first use: it needs
    /// the runtime).
    fn follow(&self) {
        if matches!(self.inner.target, Target::Sentinel { .. })
            && !self.inner.following.swap(true, Ordering::AcqRel)
        {
            tokio::spawn(follow_sentinel(Arc::downgrade(&self.inner)));
        }
    }

    /// Number of connections (per node).
    pub fn len(&self) -> usize {
        self.inner.slots.len()
    }

    /// Whether this is a Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner.target, Target::Cluster(_))
    }
}

impl Slot {
    fn current(&self) -> Option<ConnHandle> {
        self.conn.read().clone()
    }

    fn failed(&self, error: String) {
        // Every connection retries while Redis is down: one line every few seconds is enough.
        static LOGGED: crate::logging::Every =
            crate::logging::Every::new(std::time::Duration::from_secs(10));
        if LOGGED.ready() {
            tracing::warn!(%error, "cannot connect to redis");
        }
        *self.last_error.lock() = error;
    }
}

impl Inner {
    async fn connect(&self) -> Result<ConnHandle, StoreError> {
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(None)
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(200));
        match &self.target {
            Target::Node(client) => client
                .get_connection_manager_with_config(manager_config)
                .await
                .map(ConnHandle::Node)
                .map_err(StoreError::from),
            Target::Cluster(client) => client
                .get_async_connection()
                .await
                .map(ConnHandle::Cluster)
                .map_err(StoreError::from),
            Target::Sentinel { client, .. } => {
                let client = client.lock().await.async_get_client().await?;
                *self.master.lock() = Some(client.get_connection_info().addr().to_string());
                client
                    .get_connection_manager_with_config(manager_config)
                    .await
                    .map(ConnHandle::Node)
                    .map_err(StoreError::from)
            }
        }
    }
}

/// Asks a Sentinel every [`SENTINEL_POLL`] which master it names and, when that is not the
/// one the connections were made to, drops them all so that the next use connects to the new
/// master. Without it a connection follows a failover only at its first error, and an old
/// master that is still reachable answers without error until Sentinel demotes it. Ends with
/// the store.
async fn follow_sentinel(inner: std::sync::Weak<Inner>) {
    let mut sentinel: Option<redis::aio::MultiplexedConnection> = None;
    loop {
        tokio::time::sleep(SENTINEL_POLL).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let Target::Sentinel { client, name } = &inner.target else {
            return;
        };
        let asked = tokio::time::timeout(inner.connect_timeout, async {
            if sentinel.is_none() {
                let client = client.lock().await.async_get_sentinel_client().await?;
                sentinel = Some(client.get_multiplexed_async_connection().await?);
            }
            let conn = sentinel.as_mut().expect("connected above");
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(name)
                .query_async::<Option<(String, u16)>>(conn)
                .await
        })
        .await;
        let named = match asked {
            Ok(Ok(Some((host, port)))) => format!("{host}:{port}"),
            // Not known (yet), or this Sentinel failed: the next poll asks again (another
            // Sentinel when this one cannot be reached).
            Ok(Ok(None)) => continue,
            Ok(Err(_)) | Err(_) => {
                sentinel = None;
                continue;
            }
        };
        let mut master = inner.master.lock();
        if let Some(old) = master.as_deref()
            && old != named
        {
            tracing::warn!(old, new = %named, "sentinel names a new redis master: reconnecting");
            *master = None;
            for slot in &inner.slots {
                *slot.conn.write() = None;
            }
        }
    }
}

impl From<redis::RedisError> for StoreError {
    fn from(e: redis::RedisError) -> Self {
        // Refused credentials: Redis cannot be used until REDIS_AUTH or Redis's ACL is fixed,
        // an outage as far as requests are concerned (the failure policy answers, logged).
        let text = e.to_string();
        if e.kind() == redis::ErrorKind::AuthenticationFailed
            || e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
            || ["NOAUTH", "WRONGPASS", "unauthenticated"]
                .iter()
                .any(|m| text.contains(m))
        {
            return StoreError::Unavailable(format!(
                "redis refused the credentials (check REDIS_AUTH): {text}"
            ));
        }
        // Connection, timeout and cluster-topology errors pass; a script or data error will
        // not go away by retrying.
        if e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_cluster_error()
            || matches!(
                e.kind(),
                redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading)
                    | redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain)
                    | redis::ErrorKind::Server(redis::ServerErrorKind::ClusterDown)
                    | redis::ErrorKind::Server(redis::ServerErrorKind::MasterDown)
                    | redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
            )
        {
            StoreError::Unavailable(e.to_string())
        } else {
            StoreError::Internal(e.to_string())
        }
    }
}

/// Parses one address of `REDIS_URL`, applying `REDIS_TLS` and `REDIS_AUTH`.
fn connection_info(options: &RedisOptions, text: &str) -> Result<ConnectionInfo, String> {
    if text.is_empty() {
        return Err("REDIS_URL is empty".into());
    }
    let url = if text.contains("://") {
        text.to_owned()
    } else if text.starts_with('/') {
        format!("unix://{text}")
    } else if options.tls {
        format!("rediss://{text}")
    } else {
        format!("redis://{text}")
    };
    let mut info = url
        .as_str()
        .into_connection_info()
        .map_err(|e| format!("invalid redis address '{text}': {e}"))?;
    if options.tls_insecure
        && let ConnectionAddr::TcpTls {
            host,
            port,
            tls_params,
            ..
        } = info.addr().clone()
    {
        info = info.set_addr(ConnectionAddr::TcpTls {
            host,
            port,
            insecure: true,
            tls_params,
        });
    }
    if let Some(auth) = &options.auth {
        info = with_auth(info, auth);
    }
    Ok(info)
}

fn with_auth(info: ConnectionInfo, auth: &str) -> ConnectionInfo {
    let settings = info.redis_settings().clone();
    let settings = match auth.split_once(':') {
        Some((user, password)) => settings.set_username(user).set_password(password),
        None => settings.set_password(auth),
    };
    info.set_redis_settings(settings)
}

fn tls_certificates(options: &RedisOptions) -> Result<TlsCertificates, String> {
    let read = |what: &str, path: &PathBuf| {
        std::fs::read(path).map_err(|e| format!("cannot read {what} '{}': {e}", path.display()))
    };
    let root_cert = options
        .tls_ca
        .as_ref()
        .map(|p| read("REDIS_TLS_CACERT", p))
        .transpose()?;
    let client_tls = match (&options.tls_cert, &options.tls_key) {
        (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
            client_cert: read("REDIS_TLS_CLIENT_CERT", cert)?,
            client_key: read("REDIS_TLS_CLIENT_KEY", key)?,
        }),
        (None, None) => None,
        _ => return Err("REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY go together".into()),
    };
    Ok(TlsCertificates {
        client_tls,
        root_cert,
    })
}

fn build_client(info: ConnectionInfo, certs: &TlsCertificates) -> Result<Client, String> {
    let result = if matches!(info.addr(), ConnectionAddr::TcpTls { .. })
        && (certs.root_cert.is_some() || certs.client_tls.is_some())
    {
        Client::build_with_tls(info, certs.clone())
    } else {
        Client::open(info)
    };
    result.map_err(|e| format!("invalid redis settings: {e}"))
}
