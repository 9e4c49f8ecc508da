//! Real `sluice serve` processes for tests: the binary on ports the OS chooses, its log
//! captured, killed on drop; and a fleet of them driven with requests.

use std::collections::HashMap;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

use super::redis::RedisServer;
use super::temp_dir;

/// A `sluice serve` process on ports chosen by the OS; killed on drop.
pub struct SluiceProcess {
    pub child: std::process::Child,
    /// `127.0.0.1:PORT` of its gRPC listener.
    pub grpc: String,
    /// `127.0.0.1:PORT` of its admin HTTP listener.
    pub http: String,
    /// Its log up to the "serving" line.
    pub startup_log: Vec<String>,
    /// Its log after the "serving" line, as it comes.
    pub log: std::sync::Arc<parking_lot::Mutex<Vec<String>>>,
}

impl SluiceProcess {
    /// Runs `sluice serve --config DIR` with `args` (on a free gRPC port unless they name one),
    /// and waits for its "serving" log line
    /// (the readiness signal, which names the bound ports).
    pub fn spawn(dir: &std::path::Path, args: &[&str]) -> Self {
        Self::spawn_with_env(dir, args, &[])
    }

    /// [`SluiceProcess::spawn`] counting on `redis` (`--backend redis --redis-url URL`), then
    /// `args`.
    pub fn on_redis(dir: &std::path::Path, redis: &RedisServer, args: &[&str]) -> Self {
        let url = redis.url();
        let mut all = vec!["--backend", "redis", "--redis-url", &url];
        all.extend_from_slice(args);
        Self::spawn(dir, &all)
    }

    /// [`SluiceProcess::spawn`] with these environment variables set.
    pub fn spawn_with_env(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        let command = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"));
        Self::run(command, dir, args, env)
    }

    /// [`SluiceProcess::spawn_with_env`] under the reference's name: the binary through a link
    /// named `ratelimit`, as Envoy Gateway's Deployment starts `/bin/ratelimit`.
    pub fn spawn_as_reference(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        let bin = temp_dir("reference-name").join("ratelimit");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sluice"), &bin).unwrap();
        Self::run(std::process::Command::new(bin), dir, args, env)
    }

    /// [`SluiceProcess::spawn`] with at most `files` open file descriptors (`ulimit -n`).
    pub fn spawn_with_file_limit(dir: &std::path::Path, args: &[&str], files: u32) -> Self {
        let mut shell = std::process::Command::new("sh");
        shell
            .arg("-c")
            .arg(format!("ulimit -n {files} && exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_sluice"));
        Self::run(shell, dir, args, &[])
    }

    fn run(
        mut command: std::process::Command,
        dir: &std::path::Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        use std::io::{BufRead, BufReader};
        let mut child = command
            .args(["serve", "--config"])
            .arg(dir)
            .args(if args.contains(&"--grpc-addr") {
                &[][..]
            } else {
                &["--grpc-addr", "127.0.0.1:0"][..]
            })
            .args(["--http-addr", "127.0.0.1:0"])
            .args(args)
            .env("LOG_FORMAT", "text")
            .env("LOG_LEVEL", "info")
            .env("SHUTDOWN_DELAY", "0s")
            .env_remove("REDIS_URL")
            .env_remove("BACKEND_TYPE")
            .envs(env.iter().copied())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let mut lines = stderr.lines();
        let mut startup_log = Vec::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            startup_log.push(line.clone());
            let field = |name: &str| {
                let rest = line.split(name).nth(1)?;
                Some(rest.split_whitespace().next()?.to_owned())
            };
            if let (Some(grpc), Some(http)) = (field("grpc="), field("http=")) {
                // Keep draining the log so the process never blocks on a full pipe.
                let log = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
                let sink = log.clone();
                std::thread::spawn(move || {
                    for line in lines.map_while(Result::ok) {
                        sink.lock().push(line);
                    }
                });
                return Self {
                    child,
                    grpc,
                    http,
                    startup_log,
                    log,
                };
            }
        }
        panic!("sluice serve exited before serving: {:?}", child.wait());
    }

    /// Whether a line of its start-up log contains `text`.
    pub fn logged_at_startup(&self, text: &str) -> bool {
        self.startup_log.iter().any(|l| l.contains(text))
    }

    /// Asserts that its start-up log names no environment variable as set but not supported
    /// (every variable it was given is read).
    pub fn assert_no_unsupported_variable(&self) {
        assert!(
            !self.logged_at_startup("set but not supported"),
            "{:?}",
            self.startup_log
        );
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

/// A gRPC client connected to each of `instances`, in order.
pub async fn clients(instances: &[SluiceProcess]) -> Vec<RateLimitServiceClient<Channel>> {
    let mut clients = Vec::new();
    for instance in instances {
        clients.push(
            RateLimitServiceClient::connect(format!("http://{}", instance.grpc))
                .await
                .unwrap(),
        );
    }
    clients
}

/// `total` requests of `entries` in `domain`, round-robin over `instances`, `concurrency` at
/// a time ([`super::drive`] over one client per process): the count of each answer.
pub async fn drive_processes(
    instances: &[SluiceProcess],
    domain: &str,
    entries: &[(&str, &str)],
    total: usize,
    concurrency: usize,
) -> HashMap<String, usize> {
    let clients = clients(instances).await;
    super::drive(&clients, domain, entries, total, concurrency).await
}
