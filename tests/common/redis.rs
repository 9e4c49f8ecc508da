//! Real `redis-server` processes for tests, on free ports: a single node, or a three-master
//! Cluster made with `redis-cli --cluster create`. `scripts/test` installs redis-server.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One redis-server, killed on drop.
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a server without persistence and waits until it answers PING.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a replica of `master` and waits until its replication link is up.
    pub fn replica_of(master: &RedisServer) -> Self {
        let port = master.port.to_string();
        let replica = Self::start_with(&["--replicaof", "127.0.0.1", &port]);
        wait_for(
            || {
                command(replica.port, &["INFO", "replication"])
                    .is_ok_and(|r| r.contains("master_link_status:up"))
            },
            "replica to sync with its master",
        );
        replica
    }

    /// Starts a server with extra `redis-server` arguments (config directives).
    pub fn start_with(extra: &[&str]) -> Self {
        let dir = super::temp_dir("redis");
        let mut server = Self {
            child: None,
            port: free_port(),
            dir,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("redis-server not found: run ./scripts/test, which installs it");
        self.child = Some(child);
        wait_for(
            || {
                command(self.port, &["PING"])
                    .is_ok_and(|r| r == "+PONG" || r.starts_with("-NOAUTH"))
            },
            "redis PING",
        );
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("CONT");
    }

    /// Kills the server; its data is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Sends one command and returns the raw first reply line(s).
    pub fn command(&self, args: &[&str]) -> String {
        command(self.port, args).unwrap()
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().unwrap().id().to_string();
        assert!(
            Command::new("kill")
                .args([&format!("-{signal}"), &pid])
                .status()
                .unwrap()
                .success()
        );
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if self.child.is_some() {
            // A paused process ignores SIGKILL's cleanup until continued; kill works anyway.
            self.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A three-master Redis Cluster without replicas.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli not found: run ./scripts/test, which installs redis-server");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        for node in &nodes {
            wait_for(
                || {
                    command(node.port, &["CLUSTER", "INFO"])
                        .is_ok_and(|r| r.contains("cluster_state:ok"))
                },
                "cluster_state:ok",
            );
        }
        Self { nodes }
    }

    /// The seed list for `--redis-url`.
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(RedisServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }
}

pub fn wait_for(mut ready: impl FnMut() -> bool, what: &str) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if ready() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("timed out waiting for {what}");
}

/// Sends a command in RESP and reads what arrives within a short time.
fn command(port: u16, args: &[&str]) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_millis(500)))?;
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request += &format!("${}\r\n{arg}\r\n", arg.len());
    }
    stream.write_all(request.as_bytes())?;
    let mut buf = vec![0u8; 64 * 1024];
    let n = stream.read(&mut buf)?;
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    Ok(text.trim_end().to_owned())
}

/// A Sentinel watching `master` (a quorum of one), killed on drop.
pub struct RedisSentinel {
    server: RedisServer,
}

impl RedisSentinel {
    pub fn start(master: &RedisServer, name: &str) -> Self {
        let dir = super::temp_dir("sentinel");
        let port = free_port();
        let config = dir.join("sentinel.conf");
        std::fs::write(
            &config,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor {name} 127.0.0.1 {} 1\nsentinel down-after-milliseconds {name} 1000\n",
                dir.display(),
                master.port
            ),
        )
        .unwrap();
        let child = Command::new("redis-server")
            .arg(&config)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("redis-server not found: run ./scripts/test, which installs it");
        let server = RedisServer {
            child: Some(child),
            port,
            dir,
            extra: Vec::new(),
        };
        wait_for(
            || {
                command(port, &["SENTINEL", "get-master-addr-by-name", name])
                    .is_ok_and(|r| r.contains(&master.port.to_string()))
            },
            "sentinel to know the master",
        );
        Self { server }
    }

    /// Sends one command to the Sentinel.
    pub fn command(&self, args: &[&str]) -> String {
        self.server.command(args)
    }

    /// `host:port` of the Sentinel.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.server.port)
    }
}

/// `calls=` of one command in `INFO commandstats` (0 when never called).
pub fn command_calls(server: &RedisServer, name: &str) -> u64 {
    let stats = server.command(&["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|line| line.strip_prefix(&format!("cmdstat_{name}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}
