//! Test helpers: a real Sluice server on 127.0.0.1:0, clients for it, and real Redis.
#![allow(dead_code)]

pub mod certs;
pub mod envoy;
pub mod redis;
pub mod reference;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice::app::{self, Listeners};
use sluice::settings::Settings;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::transport::Channel;

/// A fresh, empty directory under the system temp dir.
pub fn temp_dir(name: &str) -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
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
}

impl TestServer {
    /// Starts a server over a config directory holding `files`, and waits until `/ready`.
    pub async fn start(files: &[(&str, &str)]) -> Self {
        let settings = Settings::for_tests(config_dir("server", files));
        Self::start_with(settings).await
    }

    /// Starts a server with `settings` (its addresses are ignored: port 0 on loopback).
    pub async fn start_with(settings: Settings) -> Self {
        let server = Self::spawn(settings).await;
        server.wait_ready().await;
        server
    }

    /// Starts a server and waits only until its admin port answers (ready or not).
    pub async fn start_unready(settings: Settings) -> Self {
        let server = Self::spawn(settings).await;
        for _ in 0..500 {
            if http_get(server.http_addr, "/healthcheck").await.is_ok() {
                return server;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("server never answered");
    }

    async fn spawn(settings: Settings) -> Self {
        let listeners = Listeners {
            grpc: TcpListener::bind("127.0.0.1:0").await.unwrap(),
            http: TcpListener::bind("127.0.0.1:0").await.unwrap(),
            metrics: None,
        };
        let grpc_addr = listeners.grpc.local_addr().unwrap();
        let http_addr = listeners.http.local_addr().unwrap();
        let prepared = app::prepare(settings).expect("valid test config");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(prepared.serve(listeners, async {
            let _ = stopped.await;
        }));
        Self {
            grpc_addr,
            http_addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    async fn wait_ready(&self) {
        for _ in 0..500 {
            if let Ok((200, _)) = http_get(self.http_addr, "/ready").await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("server never became ready");
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

/// A descriptor from `k=v` pairs.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
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
        dechunk(body)
    } else {
        body.to_owned()
    };
    Ok((status, body))
}

/// GET `path`.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    http(addr, "GET", path, "").await
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// A `sluice serve` process on ports chosen by the OS; killed on drop.
pub struct SluiceProcess {
    pub child: std::process::Child,
    /// `127.0.0.1:PORT` of its gRPC listener.
    pub grpc: String,
    /// `127.0.0.1:PORT` of its admin HTTP listener.
    pub http: String,
}

impl SluiceProcess {
    /// Runs `sluice serve --config DIR` with `args`, and waits for its "serving" log line
    /// (the readiness signal, which names the bound ports).
    pub fn spawn(dir: &std::path::Path, args: &[&str]) -> Self {
        Self::run(
            std::process::Command::new(env!("CARGO_BIN_EXE_sluice")),
            dir,
            args,
        )
    }

    /// [`SluiceProcess::spawn`] with at most `files` open file descriptors (`ulimit -n`).
    pub fn spawn_with_file_limit(dir: &std::path::Path, args: &[&str], files: u32) -> Self {
        let mut shell = std::process::Command::new("sh");
        shell
            .arg("-c")
            .arg(format!("ulimit -n {files} && exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_sluice"));
        Self::run(shell, dir, args)
    }

    fn run(mut command: std::process::Command, dir: &std::path::Path, args: &[&str]) -> Self {
        use std::io::{BufRead, BufReader};
        let mut child = command
            .args(["serve", "--config"])
            .arg(dir)
            .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .args(args)
            .env("LOG_FORMAT", "text")
            .env("LOG_LEVEL", "info")
            .env("SHUTDOWN_DELAY", "0s")
            .env_remove("REDIS_URL")
            .env_remove("BACKEND_TYPE")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let mut lines = stderr.lines();
        for line in lines.by_ref() {
            let line = line.unwrap();
            let field = |name: &str| {
                let rest = line.split(name).nth(1)?;
                Some(rest.split_whitespace().next()?.to_owned())
            };
            if let (Some(grpc), Some(http)) = (field("grpc="), field("http=")) {
                // Keep draining the log so the process never blocks on a full pipe.
                std::thread::spawn(move || lines.for_each(drop));
                return Self { child, grpc, http };
            }
        }
        panic!("sluice serve exited before serving: {:?}", child.wait());
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let status = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for SluiceProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
