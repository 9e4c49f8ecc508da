// Why one long file: one attack per test against one server setup; the bounds they check are
// listed together in docs/operations/limits.md.
//! Requests an attacker (or a broken client) sends: too wide, undecodable, oversized, empty
//! keys, absurd hits. Each gets a precise client-fault status or a correct answer, costs
//! bounded work, and harms no other request — on the memory store and on a real Redis.

use std::time::Duration;

use crate::common::redis::RedisServer;
use crate::common::{
    TestServer, config_dir, descriptor, http_get, metric, request, should_rate_limit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use prost::Message;
use sluice::settings::{Backend, Settings};
use sluice::store::redis::{RedisKind, RedisOptions};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

const CONFIG: &str = r#"
domain: hostile
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: jobs
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: concurrency}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: token_bucket}
"#;

async fn memory_server() -> TestServer {
    TestServer::start(&[("hostile.yaml", CONFIG)]).await
}

async fn redis_server(redis: &RedisServer) -> TestServer {
    let mut settings = Settings::for_tests(config_dir("hostile", &[("hostile.yaml", CONFIG)]));
    settings.backend = Backend::Redis;
    settings.redis = Some(RedisOptions {
        connections: 1,
        ..RedisOptions::new(redis.url(), RedisKind::Single)
    });
    settings.resilience.deadline = Duration::from_secs(2);
    TestServer::start_with(settings).await
}

fn wide(descriptors: usize, entries: usize) -> RateLimitRequest {
    let entries: Vec<(String, String)> = (0..entries)
        .map(|i| (format!("k{i}"), format!("v{i}")))
        .collect();
    let entries: Vec<(&str, &str)> = entries
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    request(
        "hostile",
        (0..descriptors).map(|_| descriptor(&entries)).collect(),
    )
}

fn with_hits(
    mut d: envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor,
    hits: u64,
    negative: bool,
) -> envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor {
    d.hits_addend = Some(UInt64Value { value: hits });
    d.is_negative_hits = negative;
    d
}

async fn error_of(server: &TestServer, request: RateLimitRequest) -> tonic::Status {
    let mut client = server.client().await;
    client
        .should_rate_limit(request)
        .await
        .expect_err("the request must be refused")
}

#[tokio::test]
async fn requests_wider_than_the_bounds_are_invalid_and_the_bounds_themselves_pass() {
    let server = memory_server().await;
    let mut client = server.client().await;
    // At the bounds (64 descriptors of 16 entries): answered.
    let ok = should_rate_limit(&mut client, wide(64, 16)).await;
    assert_eq!(ok.statuses.len(), 64);

    let status = error_of(&server, wide(65, 1)).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status
            .message()
            .contains("65 descriptors, more than the 64 allowed"),
        "{}",
        status.message()
    );
    let status = error_of(&server, wide(1, 17)).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status
            .message()
            .contains("17 entries, more than the 16 allowed"),
        "{}",
        status.message()
    );
    // 100,000 descriptors (3.6 MB) cost one linear pass, not a stall.
    let status = error_of(&server, wide(100_000, 1)).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let (code, _) = http_get(server.http_addr, "/healthcheck").await.unwrap();
    assert_eq!(code, 200);
}

#[tokio::test]
async fn an_empty_entry_key_is_invalid() {
    let server = memory_server().await;
    let status = error_of(
        &server,
        request("hostile", vec![descriptor(&[("user", "a"), ("", "x")])]),
    )
    .await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status
            .message()
            .contains("descriptor 0 entry 1 has an empty key"),
        "{}",
        status.message()
    );
}

/// Sends raw bytes as the request message, to reach the transport's decoder.
#[derive(Clone, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = RateLimitResponse;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }
    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        use bytes_put::PutSlice;
        buf.put_all(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = RateLimitResponse;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        buf: &mut DecodeBuf<'_>,
    ) -> Result<Option<RateLimitResponse>, tonic::Status> {
        RateLimitResponse::decode(buf)
            .map(Some)
            .map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

mod bytes_put {
    /// `BufMut::put_slice` without naming the bytes crate.
    pub trait PutSlice {
        fn put_all(&mut self, bytes: &[u8]);
    }
    impl<T: prost::bytes::BufMut> PutSlice for T {
        fn put_all(&mut self, bytes: &[u8]) {
            self.put_slice(bytes);
        }
    }
}

async fn send_raw(server: &TestServer, body: Vec<u8>) -> Result<RateLimitResponse, tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel).max_encoding_message_size(usize::MAX);
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    );
    grpc.unary(tonic::Request::new(body), path, RawCodec)
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn undecodable_and_oversized_messages_are_client_faults_and_counted_as_such() {
    let server = memory_server().await;
    // Field 1 (domain), length 2, bytes that are not UTF-8.
    let status = send_raw(&server, vec![0x0a, 0x02, 0xff, 0xfe])
        .await
        .expect_err("invalid UTF-8 must be refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    // Not protobuf at all: a truncated length-delimited field.
    let status = send_raw(&server, vec![0x0a, 0x7f, 0x01])
        .await
        .expect_err("garbage must be refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    // Over the 4 MiB message limit.
    let big = wide(1, 1);
    let mut body = big.encode_to_vec();
    let padding = RateLimitRequest {
        domain: "x".repeat(5 << 20),
        ..Default::default()
    };
    body.extend(padding.encode_to_vec());
    let status = send_raw(&server, body)
        .await
        .expect_err("an oversized message must be refused");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");

    // A valid request on the same server is still answered.
    let ok = send_raw(
        &server,
        request("hostile", vec![descriptor(&[("user", "a")])]).encode_to_vec(),
    )
    .await
    .unwrap();
    assert_eq!(ok.overall_code, Code::Ok as i32);
    let (_, page) = http_get(server.http_addr, "/metrics").await.unwrap();
    assert_eq!(
        metric::<u64>(&page, r#"sluice_errors_total{type="invalid_request"}"#),
        Some(2),
        "{page}"
    );
    assert_eq!(
        metric::<u64>(&page, r#"sluice_errors_total{type="request_too_large"}"#),
        Some(1)
    );
    assert_eq!(
        metric::<u64>(&page, r#"sluice_errors_total{type="internal"}"#),
        None
    );
}

/// Absurd hits on every algorithm: refused or charged as if they were the capacity plus one,
/// and the counter stays usable afterwards.
async fn huge_hits_change_nothing_beyond_the_limit(server: &TestServer) {
    let hostile = server.domain("hostile");
    let huge = i64::MAX as u64;
    // One descriptor with more hits than the request's u32 `hits_addend` can carry.
    let absurd = async |spec: &str, hits: u64, negative: bool| {
        let mut request = hostile.request(spec);
        request.descriptors[0] = with_hits(request.descriptors[0].clone(), hits, negative);
        crate::common::Decision(hostile.send(request).await.unwrap())
    };
    for key in ["user", "bucket"] {
        let spec = format!("{key}=h");
        assert!(absurd(&spec, huge, false).await.is_over_limit(), "{key}");
        // Nothing was charged: the whole budget is still there.
        assert!(hostile.hit(&spec).await.is_ok(), "{key}");
        // A refund of 2^64 - 1 empties the counter and no more.
        assert!(absurd(&spec, u64::MAX, true).await.is_ok(), "{key}");
        let r = hostile.hit(&spec).await;
        assert!(r.is_ok());
        assert_eq!(r.remaining(), [if key == "user" { 9 } else { 4 }], "{key}");
    }
    // Concurrency counts refused acquisitions (their releases will come): 2^63 counts as 6.
    assert!(absurd("jobs=j", huge, false).await.is_over_limit());
    assert!(
        hostile.hit("jobs=j").await.is_over_limit(),
        "6 of 5 are in flight"
    );
    // Its release brings the count back to 1 (the acquisition above), not below zero.
    absurd("jobs=j", huge, true).await;
    let r = hostile.hit("jobs=j").await;
    assert!(r.is_ok());
    assert_eq!(r.remaining(), [3], "1 + 1 of 5 in flight");
}

#[tokio::test]
async fn huge_hits_are_clamped_on_the_memory_store() {
    let server = memory_server().await;
    huge_hits_change_nothing_beyond_the_limit(&server).await;
}

#[tokio::test]
async fn huge_hits_are_clamped_on_redis_and_poison_no_key() {
    let redis = RedisServer::start();
    let server = redis_server(&redis).await;
    huge_hits_change_nothing_beyond_the_limit(&server).await;
    // The acquisitions of 2^63 were counted as the capacity plus one, and released as much:
    // two are in flight, stored as a plain small count.
    let stored = redis.command(&["GET", "hostile|jobs=j|60s:cc"]);
    assert!(stored.ends_with("\n2"), "{stored:?}");
    let client = server.client().await;
    // Requests sharing script calls with poisoned ones are answered normally.
    let mut tasks = Vec::new();
    for i in 0..200 {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            let d = if i % 2 == 0 {
                with_hits(descriptor(&[("jobs", "poison")]), i64::MAX as u64, false)
            } else {
                descriptor(&[("user", &format!("innocent{i}"))])
            };
            client
                .should_rate_limit(request("hostile", vec![d]))
                .await
                .map(|r| (i, r.into_inner()))
        }));
    }
    for task in tasks {
        let (i, r) = task.await.unwrap().expect("no request fails");
        let expected = if i % 2 == 0 {
            Code::OverLimit
        } else {
            Code::Ok
        };
        assert_eq!(r.overall_code, expected as i32, "request {i}");
    }
    // A key written by hand with a negative count (what 2^63 used to leave) reads as no
    // state, not as infinite room.
    redis.command(&["SET", "hostile|jobs=hand|60s:cc", "-9223372036854775808"]);
    for expected in [
        Code::Ok,
        Code::Ok,
        Code::Ok,
        Code::Ok,
        Code::Ok,
        Code::OverLimit,
    ] {
        assert_eq!(
            server.domain("hostile").hit("jobs=hand").await.code(),
            expected
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_flood_fills_the_store_visibly_and_real_limits_hold() {
    let mut settings = Settings::for_tests(config_dir("flood", &[("hostile.yaml", CONFIG)]));
    settings.memory.max_keys = 1_000;
    let server = TestServer::start_with(settings).await;
    let hostile = server.domain("hostile");
    let mut admitted = [0u32; 5];
    for round in 0..15 {
        for (u, count) in admitted.iter_mut().enumerate() {
            *count += u32::from(hostile.hit(&format!("user=real{u}")).await.is_ok());
        }
        // 400 one-hit keys per round from 4 concurrent clients (a header the attacker varies).
        let mut flood = Vec::new();
        for t in 0..4 {
            let hostile = hostile.clone();
            flood.push(tokio::spawn(async move {
                for i in 0..100 {
                    hostile.hit(&format!("user=flood-{round}-{t}-{i}")).await;
                }
            }));
        }
        for f in flood {
            f.await.unwrap();
        }
    }
    assert_eq!(admitted, [10; 5], "every real user stopped at 10 an hour");
    let (code, body) = http_get(server.http_addr, "/ready").await.unwrap();
    assert_eq!(code, 200, "a full store still serves");
    assert!(body.contains("store full"), "{body}");
    let (_, page) = http_get(server.http_addr, "/metrics").await.unwrap();
    assert_eq!(metric::<u64>(&page, "sluice_memory_store_full"), Some(1));
    assert!(metric::<u64>(&page, "sluice_memory_store_evicted_keys") > Some(4_000));
    let bytes = metric::<u64>(&page, "sluice_memory_store_bytes").unwrap();
    assert!(
        bytes <= sluice::store::memory::MAX_BYTES_PER_COUNTER * 1_000 + 64 * 1024,
        "{bytes}"
    );
}

/// 64 descriptors on one counter: each sees the ones before it (found by key, not by a
/// scan), the request is refused as a whole and charges nothing.
async fn a_request_at_the_bound_on_one_counter_is_decided_whole(server: &TestServer) {
    let hostile = server.domain("hostile");
    let same = vec!["user=same"; 64].join(" | ");
    let r = hostile.hit(&same).await;
    assert!(r.is_over_limit());
    let ok = r.codes().iter().filter(|&&c| c == Code::Ok).count();
    assert_eq!(ok, 10, "the first 10 fit the limit of 10");
    assert_eq!(
        hostile.hit("user=same").await.remaining(),
        [9],
        "the refused request charged nothing"
    );
}

#[tokio::test]
async fn a_request_at_the_bound_on_one_counter_is_decided_whole_in_memory() {
    a_request_at_the_bound_on_one_counter_is_decided_whole(&memory_server().await).await;
}

#[tokio::test]
async fn a_request_at_the_bound_on_one_counter_is_decided_whole_on_redis() {
    let redis = RedisServer::start();
    a_request_at_the_bound_on_one_counter_is_decided_whole(&redis_server(&redis).await).await;
}

/// A request whose header list is over the bound fails alone: its connection carries on (a
/// GOAWAY would make Envoy reconnect and fail every request in flight on it). Header lists up
/// to 64 KiB, more than Envoy sends (its `max_request_headers_kb` is 60 by default), pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_header_list_fails_its_request_not_its_connection() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let server = memory_server().await;
    let addr = server.grpc_addr;
    let connects = Arc::new(AtomicUsize::new(0));
    let counted = connects.clone();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            counted.fetch_add(1, Ordering::SeqCst);
            async move {
                let stream = tokio::net::TcpStream::connect(addr).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .unwrap();
    let mut client = RateLimitServiceClient::new(channel);
    let ask = |value: Option<String>| {
        let mut call = tonic::Request::new(request("hostile", vec![descriptor(&[("user", "u")])]));
        if let Some(value) = value {
            call.metadata_mut().insert("x-big", value.parse().unwrap());
        }
        call
    };
    assert!(client.should_rate_limit(ask(None)).await.is_ok());
    // 40 KiB of headers: over HTTP/2's usual 16 KiB, within the bound.
    let forty = "b".repeat(40 * 1024);
    assert!(client.should_rate_limit(ask(Some(forty))).await.is_ok());
    assert!(client.should_rate_limit(ask(None)).await.is_ok());
    assert_eq!(
        connects.load(Ordering::SeqCst),
        1,
        "one connection throughout"
    );
}
