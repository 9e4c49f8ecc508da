//! Real `redis-server` processes for tests, on free ports: a single node, or a three-master
//! Cluster made with `redis-cli --cluster create`. `scripts/test` installs redis-server.

use super::eventually_blocking;
use sluice::store::redis::{RedisKind, RedisOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `N` distinct free ports: each held until all are chosen (ports chosen one at a time may
/// repeat: the system may hand out a port just released).
pub fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: [TcpListener; N] =
        std::array::from_fn(|_| TcpListener::bind("127.0.0.1:0").unwrap());
    listeners.map(|l| l.local_addr().unwrap().port())
}

/// A free port whose Cluster bus port (port + 10000) is free too.
pub fn free_cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port <= 55535 && TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return port;
        }
    }
}

/// One redis-server, killed on drop.
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    /// `redis-server`, or `valkey-server` (which takes the same arguments).
    program: &'static str,
}

impl RedisServer {
    /// Starts a server without persistence and waits until it answers PING.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a replica of `master` (the same program) and waits until its replication link
    /// is up.
    pub fn replica_of(master: &RedisServer) -> Self {
        let port = master.port.to_string();
        let replica = Self::start_program(master.program, &["--replicaof", "127.0.0.1", &port]);
        eventually_blocking("replica to sync with its master", || {
            command(replica.port, &["INFO", "replication"])
                .is_ok_and(|r| r.contains("master_link_status:up"))
        });
        replica
    }

    /// Starts a server with extra `redis-server` arguments (config directives).
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_program("redis-server", extra)
    }

    /// Starts `program` (`redis-server` or `valkey-server`) with extra arguments.
    pub fn start_program(program: &'static str, extra: &[&str]) -> Self {
        let dir = super::temp_dir("redis");
        let cluster = extra.contains(&"--cluster-enabled");
        let mut server = Self {
            child: None,
            port: if cluster {
                free_cluster_port()
            } else {
                free_port()
            },
            dir,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            program,
        };
        server.spawn(true);
        server
    }

    /// Starts redis-server on `self.port` and waits for PING. A port that was free when chosen
    /// can be taken before redis binds it (by another test's server, or a Cluster bus at
    /// port + 10000): a server that exits at once is started again, on a new port unless
    /// `may_move` is false (a restart keeps its port), and one
    /// that never answers fails with its log.
    fn spawn(&mut self, may_move: bool) {
        let cluster = self.extra.iter().any(|a| a == "--cluster-enabled");
        for _ in 0..5 {
            let log = self.dir.join("redis.log");
            let child = Command::new(self.program)
                .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&self.dir)
                .arg("--logfile")
                .arg(&log)
                .args(&self.extra)
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!(
                        "{} not found ({e}): run ./scripts/test, which installs it",
                        self.program
                    )
                });
            self.child = Some(child);
            let started = std::time::Instant::now();
            loop {
                if command(self.port, &["PING"])
                    .is_ok_and(|r| r == "+PONG" || r.starts_with("-NOAUTH"))
                {
                    return;
                }
                let exited = self.child.as_mut().unwrap().try_wait().unwrap().is_some();
                if exited {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "never: redis PING on port {}; its log:\n{}",
                    self.port,
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            self.child = None;
            if !may_move {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            self.port = if cluster {
                free_cluster_port()
            } else {
                free_port()
            };
        }
        panic!(
            "redis-server exited at once five times; see its log in {}",
            self.dir.display()
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
        self.spawn(false);
    }

    /// Sends one command and returns the raw first reply line(s).
    pub fn command(&self, args: &[&str]) -> String {
        command(self.port, args).unwrap()
    }

    /// [`RedisServer::command`], or the error (a reply slower than the read timeout on a
    /// loaded machine), for conditions polled until they hold.
    pub fn try_command(&self, args: &[&str]) -> std::io::Result<String> {
        command(self.port, args)
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
        Self::start_program("redis-server")
    }

    /// A three-master Cluster of `program` (`redis-server` or `valkey-server`), created with
    /// redis-cli (the Cluster protocol is the same).
    pub fn start_program(program: &'static str) -> Self {
        Self::start_replicated(program, 0)
    }

    /// Three masters with `replicas` replicas each (`nodes[0..3]` are the masters).
    pub fn start_replicated(program: &'static str, replicas: usize) -> Self {
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|_| {
                RedisServer::start_program(
                    program,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "2000",
                    ],
                )
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli not found: run ./scripts/test, which installs redis-server");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        for node in &nodes {
            eventually_blocking("cluster_state:ok", || {
                command(node.port, &["CLUSTER", "INFO"])
                    .is_ok_and(|r| r.contains("cluster_state:ok"))
            });
        }
        // redis-cli makes the first three nodes the masters; replicas sync before use.
        for node in &nodes[3..] {
            eventually_blocking("a cluster replica to sync", || {
                command(node.port, &["INFO", "replication"])
                    .is_ok_and(|r| r.contains("master_link_status:up"))
            });
        }
        Self { nodes }
    }

    /// Moves hash slot `slot` from node `from` to node `to` as `redis-cli --cluster reshard`
    /// does (IMPORTING and MIGRATING, then the keys with MIGRATE, then the new owner told to
    /// every master), calling `between()` after the first half of its keys has moved: while
    /// it runs, clients get ASK for the moved keys; afterwards, MOVED.
    pub fn migrate_slot(&self, from: usize, to: usize, slot: u16, between: impl FnOnce()) {
        let (source, target) = (&self.nodes[from], &self.nodes[to]);
        let id = |n: &RedisServer| bulk_lines(&n.command(&["CLUSTER", "MYID"]))[0].clone();
        let (source_id, target_id) = (id(source), id(target));
        let slot = slot.to_string();
        let ok = |reply: String| assert!(reply.starts_with("+OK"), "{reply}");
        ok(target.command(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source_id]));
        ok(source.command(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target_id]));
        let keys = bulk_lines(&source.command(&["CLUSTER", "GETKEYSINSLOT", &slot, "1000"]));
        let port = target.port.to_string();
        let (first, rest) = keys.split_at(keys.len() / 2);
        let migrate = |batch: &[String]| {
            for key in batch {
                let reply = source.command(&["MIGRATE", "127.0.0.1", &port, key, "0", "5000"]);
                assert!(
                    reply.starts_with("+OK") || reply.starts_with("+NOKEY"),
                    "{reply}"
                );
            }
        };
        migrate(first);
        between();
        migrate(rest);
        for node in self.nodes.iter().take(3) {
            ok(node.command(&["CLUSTER", "SETSLOT", &slot, "NODE", &target_id]));
        }
    }

    /// The hash slots of the keys node `node` holds.
    pub fn slots_with_keys(&self, node: usize) -> Vec<u16> {
        let node = &self.nodes[node];
        let mut slots: Vec<u16> = bulk_lines(&node.command(&["KEYS", "*"]))
            .iter()
            .map(|key| {
                let reply = node.command(&["CLUSTER", "KEYSLOT", key]);
                reply.trim_start_matches(':').parse().unwrap()
            })
            .collect();
        slots.sort_unstable();
        slots.dedup();
        slots
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

/// The `sluice serve` arguments that count on the Redis Cluster whose seed list is `url`.
pub fn cluster_args(url: &str) -> [&str; 6] {
    [
        "--backend",
        "redis",
        "--redis-type",
        "cluster",
        "--redis-url",
        url,
    ]
}

/// The strings of a RESP array of bulk strings (or a single bulk string) as `command`
/// returns it.
fn bulk_lines(reply: &str) -> Vec<String> {
    reply
        .split("\r\n")
        .filter(|l| !l.is_empty() && !l.starts_with('*') && !l.starts_with('$'))
        .map(str::to_owned)
        .collect()
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
        Self::start_quorum(master, name, 1)
    }

    /// `count` Sentinels watching `master` with a majority quorum, once each knows the others
    /// (a failover needs them to agree).
    pub fn group(master: &RedisServer, name: &str, count: usize) -> Vec<Self> {
        let sentinels: Vec<Self> = (0..count)
            .map(|_| Self::start_quorum(master, name, count / 2 + 1))
            .collect();
        let usable = format!("OK {count} usable Sentinels");
        for sentinel in &sentinels {
            eventually_blocking("sentinels to know each other", || {
                sentinel
                    .try_command(&["SENTINEL", "CKQUORUM", name])
                    .is_ok_and(|r| r.contains(&usable))
            });
        }
        sentinels
    }

    fn start_quorum(master: &RedisServer, name: &str, quorum: usize) -> Self {
        let program = master.program;
        let dir = super::temp_dir("sentinel");
        let port = free_port();
        let config = dir.join("sentinel.conf");
        std::fs::write(
            &config,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor {name} 127.0.0.1 {} {quorum}\nsentinel down-after-milliseconds {name} 1000\n",
                dir.display(),
                master.port
            ),
        )
        .unwrap();
        let child = Command::new(program)
            .arg(&config)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the server binary not found: run ./scripts/test, which installs it");
        let server = RedisServer {
            child: Some(child),
            port,
            dir,
            extra: Vec::new(),
            program,
        };
        eventually_blocking("sentinel to know the master", || {
            command(port, &["SENTINEL", "get-master-addr-by-name", name])
                .is_ok_and(|r| r.contains(&master.port.to_string()))
        });
        Self { server }
    }

    /// Sends one command to the Sentinel.
    pub fn command(&self, args: &[&str]) -> String {
        self.server.command(args)
    }

    /// [`RedisSentinel::command`], or the error.
    pub fn try_command(&self, args: &[&str]) -> std::io::Result<String> {
        self.server.try_command(args)
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

/// A redis-server that speaks only TLS (its plain port closed) and requires a client
/// certificate from a private CA ([`super::certs::make`]), and a password if given; killed on
/// drop.
pub struct TlsRedisServer {
    child: Child,
    pub port: u16,
    /// Holds `ca.crt`, `server.{crt,key}` and `client.{crt,key}`.
    pub certs: PathBuf,
    password: Option<String>,
    /// Whether the certificates are this server's own (removed on drop).
    own_certs: bool,
}

impl TlsRedisServer {
    /// Makes certificates for it, starts it and waits until it answers PING over TLS.
    pub fn start() -> Self {
        let certs = super::certs::fresh("tls-redis");
        let mut server = Self::start_in(&certs, None);
        server.own_certs = true;
        server
    }

    /// Starts one with the certificates in `certs`, requiring `password` if given.
    pub fn start_in(certs: &std::path::Path, password: Option<&str>) -> Self {
        let port = free_port();
        let mut command = Command::new("redis-server");
        command
            .current_dir(certs)
            .args(["--port", "0", "--tls-port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args([
                "--tls-cert-file",
                "server.crt",
                "--tls-key-file",
                "server.key",
            ])
            .args(["--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "yes"]);
        if let Some(password) = password {
            command.args(["--requirepass", password]);
        }
        let child = command
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server not found: run ./scripts/test, which installs it");
        let server = Self {
            child,
            port,
            certs: certs.to_owned(),
            password: password.map(str::to_owned),
            own_certs: false,
        };
        eventually_blocking("TLS redis PING", || server.cli(&["PING"]) == "PONG");
        server
    }

    /// `redis-cli` over TLS with the client certificate (and password): its trimmed output.
    pub fn cli(&self, args: &[&str]) -> String {
        let mut command = Command::new("redis-cli");
        command
            .current_dir(&self.certs)
            .args(["--tls", "--cacert", "ca.crt", "--cert", "client.crt"])
            .args(["--key", "client.key", "-p", &self.port.to_string()]);
        if let Some(password) = &self.password {
            command.args(["-a", password, "--no-auth-warning"]);
        }
        let out = command.args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Client options that trust the CA and present the client certificate (and password).
    pub fn options(&self) -> RedisOptions {
        RedisOptions {
            tls: true,
            tls_ca: Some(self.certs.join("ca.crt")),
            tls_cert: Some(self.certs.join("client.crt")),
            tls_key: Some(self.certs.join("client.key")),
            auth: self.password.clone(),
            connections: 1,
            connect_timeout: Duration::from_secs(5),
            ..RedisOptions::new(format!("127.0.0.1:{}", self.port), RedisKind::Single)
        }
    }
}

impl Drop for TlsRedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if self.own_certs {
            let _ = std::fs::remove_dir_all(&self.certs);
        }
    }
}
