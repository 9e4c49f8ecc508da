// Why one long file: the shared test vocabulary (servers, the domain client, eventually,
// processes), kept in one place tests import from.
//! Test helpers: a real Sluice server on 127.0.0.1:0, clients for it, and real Redis.

pub mod admin;
pub mod certs;
pub mod counters;
pub mod envoy;
pub mod faultproxy;
pub mod health;
pub mod otlp;
pub mod process;
pub mod prometheus;
pub mod redis;
pub mod reference;
pub mod rlqs;
pub mod xds;

pub use process::{SluiceProcess, drive_processes};

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice::app::{self, Listeners};
use sluice::clock::{Clock, ManualClock, SystemClock};
use sluice::settings::Settings;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::transport::Channel;

/// Taken by the tests that load this machine with many processes and measure under that load
/// (a planet of regions: four Redis servers, six Sluice processes and their drivers), for as
/// long as they run: two of them at once on two cores measure the machine, not Sluice (a
/// median answer of 200 ms where one alone sees 3 ms). A failed test does not poison it.
pub async fn alone() -> tokio::sync::MutexGuard<'static, ()> {
    static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    ALONE.lock().await
}

/// `relative` in the checkout under test. Read when the test runs (cargo sets
/// `CARGO_MANIFEST_DIR` for it), not baked in when it was built: a test binary that cargo
/// reuses from a build in another checkout of the same commit (one target directory, as
/// CI shares) must still read this checkout's files.
pub fn repo_path(relative: &str) -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join(relative)
}

/// A fresh, empty directory under the system temp dir.
pub fn temp_dir(name: &str) -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(sweep_temp_dirs);
    let dir = std::env::temp_dir().join(format!(
        "sluice-test-{}-{}-{}",
        name,
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Removes the directories earlier test runs left in the temporary directory (those of test
/// processes no longer running), so that runs do not pile them up.
fn sweep_temp_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("sluice-test-") else {
            continue;
        };
        // `<name>-<pid>-<n>`: the process is the next to last part.
        let pid = rest.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && pid != std::process::id()
            && !std::path::Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Writes `files` (name, YAML) into a fresh config directory.
pub fn config_dir(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = temp_dir(name);
    for (file, text) in files {
        std::fs::write(dir.join(file), text).unwrap();
    }
    dir
}

/// A running server; stops (and drains) when dropped or on [`TestServer::stop`].
pub struct TestServer {
    pub grpc_addr: std::net::SocketAddr,
    pub http_addr: std::net::SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), app::AppError>>>,
    /// The connection `domain` clients share, made on first use.
    channel: std::sync::OnceLock<Channel>,
}

impl TestServer {
    /// Starts a server over a config directory holding `files`, and waits until `/ready`.
    pub async fn start(files: &[(&str, &str)]) -> Self {
        let settings = Settings::for_tests(config_dir("server", files));
        Self::start_with(settings).await
    }

    /// Starts a server over one config file holding `yaml`.
    pub async fn with_config(yaml: &str) -> Self {
        Self::start(&[("config.yaml", yaml)]).await
    }

    /// Starts a server over one config file holding `yaml`, whose in-process counters follow
    /// a manual clock (returned) instead of the wall clock: tests move it rather than sleep.
    pub async fn with_config_and_clock(yaml: &str) -> (Self, Arc<ManualClock>) {
        let settings = Settings::for_tests(config_dir("server", &[("config.yaml", yaml)]));
        Self::start_with_clock(settings).await
    }

    /// Starts a server with `settings` whose stores (Redis's script too) read a manual clock,
    /// returned, that starts at the wall clock's time.
    pub async fn start_with_clock(settings: Settings) -> (Self, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(SystemClock.now()));
        let server = Self::spawn(settings, Some(clock.clone())).await;
        server.wait_ready().await;
        (server, clock)
    }

    /// Starts a server with `settings` (its addresses are ignored: port 0 on loopback).
    pub async fn start_with(settings: Settings) -> Self {
        let server = Self::spawn(settings, None).await;
        server.wait_ready().await;
        server
    }

    /// Starts a server and waits only until its admin port answers (ready or not).
    pub async fn start_unready(settings: Settings) -> Self {
        let server = Self::spawn(settings, None).await;
        let addr = server.http_addr;
        eventually("the admin port answers", || async move {
            http_get(addr, "/healthcheck").await.is_ok()
        })
        .await;
        server
    }

    async fn spawn(settings: Settings, clock: Option<Arc<ManualClock>>) -> Self {
        let listeners = Listeners {
            grpc: app::GrpcListener::Tcp(TcpListener::bind("127.0.0.1:0").await.unwrap()),
            http: TcpListener::bind("127.0.0.1:0").await.unwrap(),
            metrics: None,
            debug: None,
        };
        let app::GrpcListener::Tcp(grpc) = &listeners.grpc else {
            unreachable!()
        };
        let grpc_addr = grpc.local_addr().unwrap();
        let http_addr = listeners.http.local_addr().unwrap();
        let prepared = match clock {
            Some(clock) => app::prepare_with_clock(settings, clock),
            None => app::prepare(settings),
        }
        .expect("valid test config");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(prepared.serve(listeners, async {
            let _ = stopped.await;
        }));
        Self {
            grpc_addr,
            http_addr,
            stop: Some(stop),
            task: Some(task),
            channel: std::sync::OnceLock::new(),
        }
    }

    async fn wait_ready(&self) {
        let addr = self.http_addr;
        eventually("the server is ready", || async move {
            matches!(http_get(addr, "/ready").await, Ok((200, _)))
        })
        .await;
    }

    /// A client for the rate limits of `domain` (connects on first use; the server must
    /// outlive it).
    pub fn domain(&self, domain: &str) -> DomainClient {
        // One connection for every client of this server, as Envoy multiplexes its calls.
        let channel = self
            .channel
            .get_or_init(|| {
                tonic::transport::Endpoint::from_shared(format!("http://{}", self.grpc_addr))
                    .unwrap()
                    .connect_lazy()
            })
            .clone();
        DomainClient {
            client: RateLimitServiceClient::new(channel),
            domain: domain.into(),
        }
    }

    /// A gRPC client.
    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc_addr))
            .await
            .unwrap()
    }

    /// Triggers shutdown and waits for the drain to finish.
    pub async fn stop(mut self) -> Result<(), app::AppError> {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A `ShouldRateLimit` client bound to one domain, whose requests are written as text:
/// `"k=v"` is one descriptor of one entry, `"k=v,k2=v2"` one of two entries, and
/// `"a=1 | b=2"` two descriptors.
#[derive(Clone)]
pub struct DomainClient {
    client: RateLimitServiceClient<Channel>,
    domain: String,
}

impl DomainClient {
    /// A client for `domain` on the gRPC listener at `addr` (`127.0.0.1:PORT`, e.g. a
    /// [`SluiceProcess`]'s), connecting on first use.
    pub fn connect(addr: &str, domain: &str) -> Self {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy();
        Self {
            client: RateLimitServiceClient::new(channel),
            domain: domain.to_owned(),
        }
    }

    /// One hit on the descriptors `spec` names; panics on a gRPC error.
    pub async fn hit(&self, spec: &str) -> Decision {
        self.hits(spec, 1).await
    }

    /// `hits` hits (the request's `hits_addend`) on the descriptors `spec` names.
    pub async fn hits(&self, spec: &str, hits: u32) -> Decision {
        self.try_hits(spec, hits)
            .await
            .unwrap_or_else(|status| panic!("{spec}: {status}"))
    }

    /// `hits` hits, or the gRPC error.
    pub async fn try_hits(&self, spec: &str, hits: u32) -> Result<Decision, tonic::Status> {
        let request = RateLimitRequest {
            hits_addend: hits,
            ..self.request(spec)
        };
        self.send(request).await.map(Decision)
    }

    /// Gives one unit back on each descriptor `spec` names (`is_negative_hits`, as Envoy
    /// sends when a stream ends).
    pub async fn release(&self, spec: &str) -> Decision {
        let mut request = self.request(spec);
        for descriptor in &mut request.descriptors {
            descriptor.is_negative_hits = true;
            descriptor.hits_addend =
                Some(envoy_types::pb::google::protobuf::UInt64Value { value: 1 });
        }
        let answer = self.send(request).await;
        Decision(answer.unwrap_or_else(|status| panic!("release {spec}: {status}")))
    }

    /// One request of the descriptors `(spec, hits)`, each charged its own `hits` (negative:
    /// a refund), as Envoy sends a `hits_addend` per descriptor (0 arrives as a present 0: a
    /// check); panics on a gRPC error.
    pub async fn charges(&self, descriptors: &[(&str, i64)]) -> Decision {
        let mut request = self.request("");
        for (spec, hits) in descriptors {
            let mut d = self::descriptors(spec).remove(0);
            d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value {
                value: hits.unsigned_abs(),
            });
            d.is_negative_hits = *hits < 0;
            request.descriptors.push(d);
        }
        let answer = self.send(request).await;
        Decision(answer.unwrap_or_else(|status| panic!("{descriptors:?}: {status}")))
    }

    /// The request of one hit `spec` names, for tests that change it before sending.
    pub fn request(&self, spec: &str) -> RateLimitRequest {
        request(&self.domain, descriptors(spec))
    }

    /// Sends `request` as it is.
    pub async fn send(
        &self,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        let mut client = self.client.clone();
        client
            .should_rate_limit(request)
            .await
            .map(|r| r.into_inner())
    }
}

/// The descriptors of a [`DomainClient`] spec.
pub fn descriptors(spec: &str) -> Vec<RateLimitDescriptor> {
    spec.split('|')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| {
            let entries: Vec<(&str, &str)> = d
                .split(',')
                .map(|entry| entry.trim().split_once('=').unwrap_or((entry.trim(), "")))
                .collect();
            descriptor(&entries)
        })
        .collect()
}

/// What the service answered.
#[derive(Debug, Clone)]
pub struct Decision(pub RateLimitResponse);

impl Decision {
    /// The overall code.
    pub fn code(&self) -> Code {
        self.0.overall_code()
    }

    /// Whether the request may pass.
    pub fn is_ok(&self) -> bool {
        self.code() == Code::Ok
    }

    /// Whether the request is refused.
    pub fn is_over_limit(&self) -> bool {
        self.code() == Code::OverLimit
    }

    /// The code of each descriptor.
    pub fn codes(&self) -> Vec<Code> {
        self.0.statuses.iter().map(|s| s.code()).collect()
    }

    /// The remaining budget of each descriptor.
    pub fn remaining(&self) -> Vec<u32> {
        self.0.statuses.iter().map(|s| s.limit_remaining).collect()
    }
}

impl std::ops::Deref for Decision {
    type Target = RateLimitResponse;

    fn deref(&self) -> &RateLimitResponse {
        &self.0
    }
}

/// Polls until `ready` holds, for at most twenty seconds, then fails naming `what`.
pub async fn eventually<F: Future<Output = bool>>(what: &str, ready: impl FnMut() -> F) {
    eventually_within(Duration::from_secs(20), what, ready).await;
}

/// [`eventually`] for at most `limit` (a Sentinel failover takes longer); returns how long
/// it took.
pub async fn eventually_within<F: Future<Output = bool>>(
    limit: Duration,
    what: &str,
    mut ready: impl FnMut() -> F,
) -> Duration {
    let started = Instant::now();
    while !ready().await {
        assert!(started.elapsed() < limit, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    started.elapsed()
}

/// [`eventually`] on a plain thread, for conditions that block (a process, a socket).
pub fn eventually_blocking(what: &str, mut ready: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(started.elapsed() < Duration::from_secs(20), "never: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `k=v` pairs as the entries of a descriptor, made by `entry` from a key and a value (one
/// helper for Envoy's descriptor and the admin API's).
pub fn entries<E>(pairs: &[(&str, &str)], entry: impl Fn(String, String) -> E) -> Vec<E> {
    pairs
        .iter()
        .map(|(k, v)| entry((*k).into(), (*v).into()))
        .collect()
}

/// A descriptor from `k=v` pairs.
pub fn descriptor(pairs: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries(pairs, |key, value| Entry { key, value }),
        ..Default::default()
    }
}

/// A request for `domain` with one hit.
pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 1,
    }
}

/// Sends `request`, panicking on a gRPC error.
pub async fn should_rate_limit(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
) -> RateLimitResponse {
    client
        .should_rate_limit(request)
        .await
        .unwrap()
        .into_inner()
}

/// Sends `total` requests for one descriptor of `entries` in `domain`, round-robin over
/// `clients`, `concurrency` at a time; counts each answer ("OK", "OVER_LIMIT", or the gRPC
/// error code).
pub async fn drive(
    clients: &[RateLimitServiceClient<Channel>],
    domain: &str,
    entries: &[(&str, &str)],
    total: usize,
    concurrency: usize,
) -> std::collections::HashMap<String, usize> {
    let mut counts = std::collections::HashMap::new();
    let mut sent = 0;
    while sent < total {
        let wave = concurrency.min(total - sent);
        let mut tasks = Vec::with_capacity(wave);
        for i in 0..wave {
            let mut client = clients[(sent + i) % clients.len()].clone();
            let request = request(domain, vec![descriptor(entries)]);
            tasks.push(tokio::spawn(async move {
                match client.should_rate_limit(request).await {
                    Ok(r) => r.into_inner().overall_code().as_str_name().to_owned(),
                    Err(status) => format!("{:?}", status.code()),
                }
            }));
        }
        for task in tasks {
            *counts.entry(task.await.unwrap()).or_default() += 1;
        }
        sent += wave;
    }
    counts
}

/// The value of one Prometheus `series` (name and labels exactly as printed) on `page`.
pub fn metric<T: std::str::FromStr>(page: &str, series: &str) -> Option<T> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

/// A minimal HTTP/1.1 request over a fresh connection: (status, body).
pub async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<(u16, String)> {
    http_with_headers(addr, method, path, &[], body).await
}

/// [`http`] with extra request headers.
pub async fn http_with_headers(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad response: {text}")))?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    // Responses from axum are small; undo chunked encoding if present.
    let body = if text
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        sluice::tools::http::dechunk(body)
    } else {
        body.to_owned()
    };
    Ok((status, body))
}

/// GET `path`.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    http(addr, "GET", path, "").await
}

/// Writes `text` to `dir/name` beside the file, then renames it over: how tools and ConfigMaps
/// replace files atomically.
pub fn replace_file(dir: &std::path::Path, name: &str, text: &str) {
    let temp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&temp, text).unwrap();
    std::fs::rename(temp, dir.join(name)).unwrap();
}

/// `mkfifo path` (replacing what is there): a FIFO, whose plain read waits for a writer
/// forever.
pub fn mkfifo(path: &std::path::Path) {
    let _ = std::fs::remove_file(path);
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(made.success());
}
