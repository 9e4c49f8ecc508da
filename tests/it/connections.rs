//! Connection bounds under hostile clients: slow-loris connections to the admin port, gRPC
//! connections that never send their preface, more connections than the caps or the
//! process's file limit allow. Timeouts on the test side only detect failures: each
//! assertion is about what gets answered and what gets closed.

use std::time::Duration;

use crate::common::{SluiceProcess, TestServer, config_dir, descriptor, http_get, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::net::connection::ConnectionLimits;
use sluice::settings::Settings;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CONFIG: &str =
    "domain: c\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";

/// Far longer than anything here takes when it works.
const PATIENCE: Duration = Duration::from_secs(10);

fn settings(name: &str) -> Settings {
    Settings::for_tests(config_dir(name, &[("c.yaml", CONFIG)]))
}

fn limits(max_connections: usize, millis: u64) -> ConnectionLimits {
    ConnectionLimits {
        max_connections,
        handshake_timeout: Duration::from_millis(millis),
    }
}

/// Connections to `addr` that each send `first` and then nothing.
async fn stuck(
    addr: impl tokio::net::ToSocketAddrs + Copy,
    count: usize,
    first: &[u8],
) -> Vec<TcpStream> {
    let mut streams = Vec::with_capacity(count);
    for _ in 0..count {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(first).await.unwrap();
        streams.push(stream);
    }
    streams
}

/// Reads until the server closes `stream`; what it sent before.
async fn until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut sent = Vec::new();
    match tokio::time::timeout(PATIENCE, stream.read_to_end(&mut sent)).await {
        Ok(_) => sent, // end of stream, or a reset: closed either way
        Err(_) => panic!("the server kept the connection open"),
    }
}

/// A raw HTTP/2 connection to `addr` that has sent the client preface and an empty SETTINGS
/// frame.
async fn h2_connection(addr: std::net::SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    stream
}

/// One `ShouldRateLimit` over a new connection, which must be answered.
async fn grpc_answers(grpc: String) {
    let ask = async {
        let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
            .await
            .unwrap();
        client
            .should_rate_limit(request("c", vec![descriptor(&[("k", "v")])]))
            .await
            .unwrap()
            .into_inner()
    };
    let answer = tokio::time::timeout(PATIENCE, ask)
        .await
        .expect("gRPC did not answer");
    assert_eq!(answer.overall_code, Code::Ok as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_loris_clients_past_the_admin_cap_neither_stop_grpc_nor_keep_their_connections() {
    let mut settings = settings("slow-loris");
    settings.admin_connections = limits(8, 500);
    let server = TestServer::start_with(settings).await;
    // Three times the cap, each with one byte of a request line.
    let mut attack = stuck(server.http_addr, 24, b"G").await;
    grpc_answers(server.grpc_addr.to_string()).await;
    // Each is accepted in turn and closed once its header timeout passes.
    for stream in &mut attack {
        assert!(until_closed(stream).await.is_empty());
    }
    assert_eq!(
        http_get(server.http_addr, "/healthcheck").await.unwrap(),
        (200, "OK".into())
    );
}

/// Connections answering a request are never closed to make room: past the cap, a new
/// connection waits until one of them is through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_admin_cap_of_busy_connections_a_connection_waits_until_another_closes() {
    let mut settings = settings("admin-cap");
    settings.admin_connections = limits(4, 60_000);
    let server = TestServer::start_with(settings).await;
    // Each a request whose body never comes: busy until the body deadline. The server's
    // `100 Continue` says it is reading the body.
    let head =
        b"POST /json HTTP/1.1\r\nHost: s\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n";
    let mut attack = stuck(server.http_addr, 4, head).await;
    for stream in &mut attack {
        let mut answer = [0u8; 25];
        tokio::time::timeout(PATIENCE, stream.read_exact(&mut answer))
            .await
            .expect("no 100 Continue")
            .unwrap();
        assert!(answer.starts_with(b"HTTP/1.1 100 Continue"), "{answer:?}");
    }
    let health = tokio::spawn(http_get(server.http_addr, "/healthcheck"));
    // Not answered while the cap is reached. A slow machine could only make this pass
    // wrongly, never fail wrongly.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!health.is_finished(), "answered past the cap");
    drop(attack.pop());
    let answer = tokio::time::timeout(PATIENCE, health)
        .await
        .expect("still waiting after a connection closed");
    assert_eq!(answer.unwrap().unwrap(), (200, "OK".into()));
}

/// The probe: past the admin cap, silent connections were each held for the header timeout
/// while the rest queued, so a fresh `/healthcheck` waited 35-40 s. Silent, slow and idle
/// connections now make room for a new one; here with a header timeout that outlasts the
/// test, so only that can let the health check in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_slow_and_idle_admin_connections_past_the_cap_make_room_for_a_health_check() {
    let mut settings = settings("admin-make-room");
    settings.admin_connections = limits(8, 60_000);
    let server = TestServer::start_with(settings).await;
    let mut silent = stuck(server.http_addr, 12, b"").await;
    let _slow = stuck(
        server.http_addr,
        12,
        b"GET /healthcheck HTTP/1.1\r\nHost: slow\r\n",
    )
    .await;
    for _ in 0..3 {
        let health = tokio::time::timeout(PATIENCE, http_get(server.http_addr, "/healthcheck"))
            .await
            .expect("the health check was kept out");
        assert_eq!(health.unwrap(), (200, "OK".into()));
    }
    // The oldest were closed to make room.
    assert!(until_closed(&mut silent[0]).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_admin_keep_alive_connection_is_closed_after_the_header_timeout() {
    let mut settings = settings("admin-idle");
    settings.admin_connections = limits(8, 300);
    let server = TestServer::start_with(settings).await;
    let mut stream = TcpStream::connect(server.http_addr).await.unwrap();
    let head = "GET /healthcheck HTTP/1.1\r\nHost: sluice\r\n\r\n";
    stream.write_all(head.as_bytes()).await.unwrap();
    let answer = String::from_utf8(until_closed(&mut stream).await).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(answer.ends_with("OK"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_connection_that_sends_nothing_or_half_a_preface_is_closed() {
    let mut settings = settings("grpc-silent");
    settings.grpc_connections = limits(100, 300);
    let server = TestServer::start_with(settings).await;
    let mut silent = stuck(server.grpc_addr, 1, b"").await;
    let mut half = stuck(server.grpc_addr, 1, b"PRI * HTTP/2.0\r\n").await;
    until_closed(&mut silent[0]).await;
    until_closed(&mut half[0]).await;
    grpc_answers(server.grpc_addr.to_string()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_connection_past_its_preface_outlives_the_handshake_timeout() {
    let mut settings = settings("grpc-preface");
    settings.grpc_connections = limits(100, 300);
    let server = TestServer::start_with(settings).await;
    let mut stream = h2_connection(server.grpc_addr).await;
    // Nothing signals that a deadline has passed; wait for three of them.
    tokio::time::sleep(Duration::from_millis(900)).await;
    // A PING must still be answered on this connection.
    stream
        .write_all(b"\0\0\x08\x06\0\0\0\0\0sluice!!")
        .await
        .unwrap();
    let pong = async {
        loop {
            let mut header = [0u8; 9];
            stream.read_exact(&mut header).await.unwrap();
            let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
            let mut payload = vec![0; len];
            stream.read_exact(&mut payload).await.unwrap();
            // PING with the ACK flag.
            if header[3] == 6 && header[4] & 1 == 1 {
                return payload;
            }
        }
    };
    let payload = tokio::time::timeout(PATIENCE, pong)
        .await
        .expect("no PING answer");
    assert_eq!(payload, b"sluice!!");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_answers_while_admin_connections_exceed_the_file_limit() {
    // The report: 1,100 slow-loris connections to the admin port under a 1,024 file limit
    // stopped gRPC answers. Here: 150 under 128, with an admin cap of 64 and a header
    // timeout that outlasts the test. (Past the cap, connections wait in the listen
    // backlog, which the kernel may keep as short as 128: more would not connect.)
    let dir = config_dir("file-limit", &[("c.yaml", CONFIG)]);
    let args = [
        "--admin-max-connections",
        "64",
        "--admin-header-timeout",
        "60s",
    ];
    let process = SluiceProcess::spawn_with_file_limit(&dir, &args, 128);
    let _attack = stuck(process.http.as_str(), 150, b"G").await;
    grpc_answers(process.grpc.clone()).await;
}

/// The frame types of the HTTP/2 frames in `bytes` (a server's side of a connection).
fn frame_types(mut bytes: &[u8]) -> Vec<u8> {
    let mut types = Vec::new();
    while bytes.len() >= 9 {
        let len = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
        types.push(bytes[3]);
        bytes = &bytes[(9 + len).min(bytes.len())..];
    }
    types
}

/// `GRPC_MAX_CONNECTION_AGE`: a connection older than the age is sent GOAWAY (so that Envoy
/// opens its next one, possibly to a pod added since) and closed after the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_connection_past_its_age_is_sent_goaway_then_closed() {
    let mut settings = settings("grpc-age");
    settings.grpc_max_connection_age = (Duration::from_millis(300), Duration::from_millis(200));
    let server = TestServer::start_with(settings).await;
    let mut stream = h2_connection(server.grpc_addr).await;
    // The ACK of the server's SETTINGS, then nothing.
    stream.write_all(b"\0\0\0\x04\x01\0\0\0\0").await.unwrap();
    let sent = until_closed(&mut stream).await;
    const GOAWAY: u8 = 0x7;
    assert!(
        frame_types(&sent).contains(&GOAWAY),
        "frames sent: {:?}",
        frame_types(&sent)
    );
    // New connections are served as before.
    grpc_answers(server.grpc_addr.to_string()).await;
}

/// The report: 1,100 silent gRPC connections under a 1,024 file limit held descriptors for
/// 20 s and delayed a fresh request by 8 s. Here: 300 under 128, with a handshake timeout
/// that outlasts the test, so only closing silent connections to make room can let a fresh
/// client in: it is answered, and the silent ones are closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_grpc_connections_past_the_file_limit_make_room_for_a_fresh_client() {
    let dir = config_dir("grpc-silent-flood", &[("c.yaml", CONFIG)]);
    let args = ["--grpc-handshake-timeout", "120s"];
    let process = SluiceProcess::spawn_with_file_limit(&dir, &args, 128);
    let mut silent = stuck(process.grpc.as_str(), 300, b"").await;
    grpc_answers(process.grpc.clone()).await;
    // The oldest silent connections were closed to make room.
    until_closed(&mut silent[0]).await;
    grpc_answers(process.grpc.clone()).await;
}

/// The probe, scaled down: silent connections to the admin port past the process's file
/// limit, with a header timeout of 2 s: a fresh `/healthcheck` is answered while they
/// flood, and the descriptors they took are given back within a few timeouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_admin_connections_past_the_file_limit_keep_no_health_check_out() {
    let dir = config_dir("admin-silent-flood", &[("c.yaml", CONFIG)]);
    let args = ["--admin-header-timeout", "2s"];
    let process = SluiceProcess::spawn_with_file_limit(&dir, &args, 128);
    let silent = stuck(process.http.as_str(), 300, b"").await;
    let addr = process.http.parse().unwrap();
    let health = tokio::time::timeout(PATIENCE, http_get(addr, "/healthcheck"))
        .await
        .expect("the health check was kept out");
    assert_eq!(health.unwrap(), (200, "OK".into()));
    let fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", process.child.id()))
            .unwrap()
            .count()
    };
    crate::common::eventually_within(
        Duration::from_secs(20),
        "descriptors given back",
        || async { fds() < 40 },
    )
    .await;
    drop(silent);
}

/// A client that pipelines requests and never reads the answers holds its connection (and
/// the answers waiting in it) only until a write has waited the header timeout for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_client_that_never_reads_its_answers_is_closed_at_the_write_deadline() {
    let dir = config_dir("admin-unread", &[("c.yaml", CONFIG)]);
    let args = ["--admin-header-timeout", "1s"];
    let process = SluiceProcess::spawn(&dir, &args);
    let fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", process.child.id()))
            .unwrap()
            .count()
    };
    let quiet = fds();
    let mut stream = TcpStream::connect(process.http.as_str()).await.unwrap();
    // Far more answers than the socket buffers hold.
    let requests = "GET /metrics HTTP/1.1\r\nHost: s\r\n\r\n".repeat(4_000);
    stream.write_all(requests.as_bytes()).await.unwrap();
    let mut first = [0u8; 12];
    stream.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    assert!(fds() > quiet, "the connection is open");
    crate::common::eventually_within(Duration::from_secs(20), "the connection closed", || async {
        fds() <= quiet
    })
    .await;
    let addr = process.http.parse().unwrap();
    assert_eq!(
        http_get(addr, "/healthcheck").await.unwrap(),
        (200, "OK".into())
    );
    drop(stream);
}

/// On the admin port a declared body over the 2 MB bound is answered 413 at once, unread,
/// and a body that trickles is cut off at the header timeout with 408.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_bodies_over_the_bound_or_too_slow_are_answered_at_once_or_at_the_deadline() {
    let mut settings = settings("admin-bodies");
    settings.admin_connections = limits(8, 500);
    let server = TestServer::start_with(settings).await;
    let mut big = TcpStream::connect(server.http_addr).await.unwrap();
    let head = "POST /json HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: 10485760\r\n\r\n";
    big.write_all(head.as_bytes()).await.unwrap();
    let answer = String::from_utf8_lossy(&until_closed_or_answered(&mut big).await).into_owned();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let mut slow = TcpStream::connect(server.http_addr).await.unwrap();
    let head = "POST /json HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{";
    slow.write_all(head.as_bytes()).await.unwrap();
    let answer = String::from_utf8_lossy(&until_closed_or_answered(&mut slow).await).into_owned();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    // The port goes on answering.
    let (status, _) = http_get(server.http_addr, "/healthcheck").await.unwrap();
    assert_eq!(status, 200);
}

/// Reads until the server has answered a whole status line and headers, or closed.
async fn until_closed_or_answered(stream: &mut TcpStream) -> Vec<u8> {
    let mut sent = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            let n = stream.read(&mut buf).await.unwrap_or(0);
            sent.extend_from_slice(&buf[..n]);
            if n == 0 || sent.windows(4).any(|w| w == b"\r\n\r\n") {
                return;
            }
        }
    };
    tokio::time::timeout(PATIENCE, read)
        .await
        .expect("the server neither answered nor closed");
    sent
}
