//! The turns of `GRPC_MAX_IN_FLIGHT` under hostile connections: a stream holds none until
//! its message is in, one connection's streams are capped well below them, its messages
//! have a deadline, and when every turn is taken it shows in a metric and in readiness.
//! Timeouts on the test side only detect failures.

use std::time::Duration;

use crate::common::{SluiceProcess, TestServer, config_dir, http_get, metric};
use sluice::settings::{Backend, Settings};
use sluice::store::redis::{RedisKind, RedisOptions};
use sluice::store::resilient::ResilienceOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CONFIG: &str =
    "domain: c\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";

/// Far longer than anything here takes when it works.
const PATIENCE: Duration = Duration::from_secs(10);

/// An HTTP/2 frame.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A HEADERS block (HPACK, no Huffman, nothing indexed) opening a `ShouldRateLimit` call.
fn should_rate_limit_headers() -> Vec<u8> {
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http (static table)
    let literal = |block: &mut Vec<u8>, name: &[u8], value: &[u8]| {
        block.push(0x00);
        block.push(name.len() as u8);
        block.extend_from_slice(name);
        block.push(value.len() as u8);
        block.extend_from_slice(value);
    };
    literal(
        &mut block,
        b":path",
        b"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    );
    literal(&mut block, b":authority", b"sluice");
    literal(&mut block, b"content-type", b"application/grpc");
    literal(&mut block, b"te", b"trailers");
    block
}

/// A connection that opens `streams` calls, sending their headers and never a message.
async fn headers_only(addr: &str, streams: u32) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    bytes.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    let headers = should_rate_limit_headers();
    for i in 0..streams {
        const END_HEADERS: u8 = 0x4;
        bytes.extend(frame(0x1, END_HEADERS, 2 * i + 1, &headers));
    }
    stream.write_all(&bytes).await.unwrap();
    stream
}

/// The SETTINGS_MAX_CONCURRENT_STREAMS the server announces on a new connection.
async fn announced_max_streams(addr: &str) -> Option<u32> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    bytes.extend(frame(0x4, 0, 0, &[]));
    stream.write_all(&bytes).await.unwrap();
    let mut head = [0u8; 9];
    tokio::time::timeout(PATIENCE, stream.read_exact(&mut head))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(head[3], 0x4, "the server's first frame is SETTINGS");
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).await.unwrap();
    payload.chunks(6).find_map(|s| {
        (u16::from_be_bytes([s[0], s[1]]) == 0x3)
            .then(|| u32::from_be_bytes([s[2], s[3], s[4], s[5]]))
    })
}

/// Whether the server's `bytes` hold a HEADERS frame ending stream 1.
fn ends_stream_one(mut bytes: &[u8]) -> bool {
    while bytes.len() >= 9 {
        let len = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
        let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff;
        const END_STREAM: u8 = 0x1;
        if bytes[3] == 0x1 && bytes[4] & END_STREAM != 0 && stream == 1 {
            return true;
        }
        bytes = &bytes[(9 + len).min(bytes.len())..];
    }
    false
}

/// One `ShouldRateLimit` over a new connection: answered, and how long it took.
async fn fresh_client_answers(grpc: &str) -> Duration {
    let started = std::time::Instant::now();
    let client = crate::common::DomainClient::connect(grpc, "c");
    let answer = tokio::time::timeout(PATIENCE, client.hit("k=fresh"))
        .await
        .expect("a fresh client was not answered");
    assert!(answer.is_ok());
    started.elapsed()
}

/// The probe: one connection opened 1,100 streams with headers only and held all 1,024
/// turns, so every other client waited for as long as it stayed open. Here with a message
/// deadline that outlasts the test, so only turns taken after the message can let a fresh
/// client through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_holding_streams_without_messages_delays_no_other_client() {
    let dir = config_dir("turns-headers-only", &[("c.yaml", CONFIG)]);
    let process = SluiceProcess::spawn(&dir, &["--grpc-handshake-timeout", "120s"]);
    assert_eq!(
        announced_max_streams(&process.grpc).await,
        Some(128),
        "one connection's streams are capped well below GRPC_MAX_IN_FLIGHT"
    );
    let _attack = headers_only(&process.grpc, 1_100).await;
    let _second = headers_only(&process.grpc, 1_100).await;
    for _ in 0..3 {
        fresh_client_answers(&process.grpc).await;
    }
    let page = http_get(process.http.parse().unwrap(), "/metrics")
        .await
        .unwrap()
        .1;
    assert_eq!(metric::<i64>(&page, "sluice_grpc_in_flight"), Some(0));
    assert_eq!(
        metric::<i64>(&page, "sluice_grpc_in_flight_waits_total"),
        Some(0)
    );
}

/// A unary call whose message does not arrive whole by the deadline (the gRPC handshake
/// timeout) ends with DEADLINE_EXCEEDED, and its stream is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_never_arrives_ends_at_its_deadline() {
    let dir = config_dir("turns-deadline", &[("c.yaml", CONFIG)]);
    let process = SluiceProcess::spawn(&dir, &["--grpc-handshake-timeout", "500ms"]);
    let mut attack = headers_only(&process.grpc, 1).await;
    // The call's end: a HEADERS frame on stream 1 with END_STREAM (a trailers-only answer).
    let mut seen = Vec::new();
    let ended = tokio::time::timeout(PATIENCE, async {
        let mut buf = [0u8; 4096];
        loop {
            let n = attack.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed without ending the call");
            seen.extend_from_slice(&buf[..n]);
            if ends_stream_one(&seen) {
                return;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the call was not ended: {seen:?}");
    fresh_client_answers(&process.grpc).await;
}

/// Test settings over [`CONFIG`] (a directory named after `name`), counting on `redis`.
fn on_redis(name: &str, redis: &crate::common::redis::RedisServer) -> Settings {
    let mut settings = Settings::for_tests(config_dir(name, &[("c.yaml", CONFIG)]));
    settings.backend = Backend::Redis;
    settings.redis = Some(RedisOptions::new(redis.url(), RedisKind::Single));
    settings
}

/// Every turn taken with requests waiting: counted, and after a few seconds readiness (not
/// liveness) fails, until the requests are through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saturation_shows_in_a_metric_and_in_readiness() {
    let redis = crate::common::redis::RedisServer::start();
    let mut settings = on_redis("turns-busy", &redis);
    settings.resilience = ResilienceOptions {
        deadline: Duration::from_secs(2),
        breaker_failures: 100,
        ..ResilienceOptions::default()
    };
    settings.grpc_max_in_flight = 1;
    let server = TestServer::start_with(settings).await;
    redis.pause();
    // Five requests, each holding the one turn for the 2 s deadline of the paused Redis.
    let mut asking = Vec::new();
    for i in 0..5 {
        let c = server.domain("c");
        asking.push(tokio::spawn(async move { c.hit(&format!("k=w{i}")).await }));
    }
    crate::common::eventually_within(Duration::from_secs(15), "readiness says busy", || async {
        let (code, body) = http_get(server.http_addr, "/ready").await.unwrap();
        code == 503 && body.contains("GRPC_MAX_IN_FLIGHT")
    })
    .await;
    assert_eq!(
        http_get(server.http_addr, "/healthcheck").await.unwrap(),
        (200, "OK".into()),
        "liveness stays"
    );
    let page = http_get(server.http_addr, "/metrics").await.unwrap().1;
    assert!(metric::<i64>(&page, "sluice_grpc_in_flight_waits_total").unwrap() >= 4);
    assert_eq!(metric::<i64>(&page, "sluice_grpc_in_flight_limit"), Some(1));
    redis.resume();
    for a in asking {
        assert!(a.await.unwrap().is_ok());
    }
    crate::common::eventually("readiness recovers", || async {
        http_get(server.http_addr, "/ready").await.unwrap().0 == 200
    })
    .await;
}

/// Turns go fairly by connection: one connection with twenty requests waiting behind four
/// turns (each held for the deadline of a paused Redis) does not keep a fresh connection's
/// request waiting behind all of them: it is served with the next turn given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_connection_is_served_before_a_greedy_ones_queue() {
    let redis = crate::common::redis::RedisServer::start();
    let mut settings = on_redis("turns-fair", &redis);
    let deadline = Duration::from_millis(500);
    settings.resilience = ResilienceOptions {
        deadline,
        breaker_failures: 1_000,
        ..ResilienceOptions::default()
    };
    settings.grpc_max_in_flight = 4;
    let server = TestServer::start_with(settings).await;
    redis.pause();
    let addr = server.grpc_addr.to_string();
    let greedy = crate::common::DomainClient::connect(&addr, "c");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut asking = Vec::new();
    for i in 0..24 {
        let (greedy, done) = (greedy.clone(), done.clone());
        asking.push(tokio::spawn(async move {
            greedy.hit(&format!("k=g{i}")).await;
            done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }));
    }
    // The greedy connection holds the four turns and twenty wait: the metric says so.
    crate::common::eventually("the greedy requests wait", || async {
        let page = http_get(server.http_addr, "/metrics").await.unwrap().1;
        metric::<i64>(&page, "sluice_grpc_in_flight_waits_total").unwrap_or(0) >= 20
    })
    .await;
    let fresh = crate::common::DomainClient::connect(&addr, "c");
    fresh.hit("k=fresh").await;
    let before = done.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        before <= 8,
        "the fresh request waited behind {before} of the greedy connection's 24"
    );
    redis.resume();
    for a in asking {
        a.await.unwrap();
    }
}
