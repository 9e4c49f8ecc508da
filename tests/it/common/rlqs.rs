//! Envoy 1.40 with the `rate_limit_quota` filter in front of a direct response, asking Sluice
//! over RLQS; and the tests' own RLQS client for what Envoy never sends.

use std::collections::HashMap;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::sync::mpsc;
use tonic::Streaming;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;

use super::SluiceProcess;
use super::envoy::{self, Envoy};
use super::redis::RedisServer;

/// Sluice's rules for the RLQS tests' buckets `{name: <x>}` of domain `rq`: 10 a second each
/// (a token bucket of 10, refilled by 10 a second).
pub const RULES: &str = "
domain: rq
descriptors:
  - key: name
    rate_limit: {unit: second, requests_per_unit: 10}
";

/// Two `sluice serve` replicas on `redis` over a config directory (`name`) holding `rules`.
pub fn two_replicas(name: &str, rules: &str, redis: &RedisServer) -> [SluiceProcess; 2] {
    let dir = super::config_dir(name, &[("rq.yaml", rules)]);
    [0, 1].map(|_| SluiceProcess::on_redis(&dir, redis, &[]))
}

/// The loopback address `127.0.0.<last>`: a client address of its own.
pub fn local(last: u8) -> std::net::IpAddr {
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, last))
}

/// An Envoy whose front listener's requests are put in the bucket `{name: <x-bucket>}` of
/// domain `rq` (a request without `x-bucket` is allowed and not reported), answered 200 by a
/// direct response or 429 with `x-rlqs: denied`. `no_assignment` is the filter's
/// `no_assignment_behavior` strategy (e.g. `{blanket_rule: ALLOW_ALL}`).
pub async fn envoy(sluice: u16, no_assignment: &str) -> (Envoy, u16) {
    let free = super::redis::free_port;
    let (front, admin, upstream) = (free(), free(), free());
    let filter = envoy::fill(
        envoy::RLQS_FILTER,
        &[
            ("DOMAIN", "rq"),
            ("REPORTING_INTERVAL", "1s"),
            ("NO_ASSIGNMENT", no_assignment),
        ],
    );
    let bootstrap = envoy::bootstrap([admin, front, upstream, sluice], &filter, "");
    (Envoy::start(&bootstrap, admin).await, front)
}

/// A request in bucket `bucket`: its status.
pub async fn call(front: u16, bucket: &str) -> u16 {
    envoy::get(front, "/", &[("x-bucket", bucket)]).await.0
}

/// An HTTP/1.1 client on one kept-alive connection (Envoy closes a `Connection: close`
/// exchange only after its delayed-close timeout, a second): many requests a second.
pub struct KeepAlive {
    stream: tokio::io::BufReader<tokio::net::TcpStream>,
}

impl KeepAlive {
    /// A connection to Envoy's `front` listener.
    pub async fn connect(front: u16) -> Self {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", front))
            .await
            .unwrap();
        Self {
            stream: tokio::io::BufReader::new(stream),
        }
    }

    /// A request in bucket `bucket`: its status.
    pub async fn call(&mut self, bucket: &str) -> u16 {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
        let request = format!("GET / HTTP/1.1\r\nHost: test\r\nx-bucket: {bucket}\r\n\r\n");
        self.stream
            .get_mut()
            .write_all(request.as_bytes())
            .await
            .unwrap();
        let mut status = 0;
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            self.stream.read_line(&mut line).await.unwrap();
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some(rest) = line.strip_prefix("HTTP/1.1 ") {
                status = rest[..3].parse().unwrap();
            } else if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        self.stream.read_exact(&mut body).await.unwrap();
        status
    }
}

/// The tests' own RLQS stream: reports go out on `send`, answers come in on `answers`.
pub struct Stream {
    send: mpsc::Sender<RateLimitQuotaUsageReports>,
    /// What Sluice answers.
    pub answers: Streaming<RateLimitQuotaResponse>,
}

impl Stream {
    /// Opens a stream to Sluice at `addr`.
    pub async fn open(addr: std::net::SocketAddr) -> Result<Self, tonic::Status> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        Self::over(channel).await
    }

    /// Opens a stream to Sluice at `addr` from the local address `from` (a loopback address
    /// of its own: Sluice tells Envoys apart by their address).
    pub async fn open_from(
        addr: std::net::SocketAddr,
        from: std::net::IpAddr,
    ) -> Result<Self, tonic::Status> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .local_address(Some(from))
            .connect()
            .await
            .unwrap();
        Self::over(channel).await
    }

    /// Opens a stream over `channel` (e.g. one over TLS).
    pub async fn over(channel: tonic::transport::Channel) -> Result<Self, tonic::Status> {
        Self::over_with(channel, &[]).await
    }

    /// Opens a stream over `channel` with these metadata (e.g. a `traceparent`).
    pub async fn over_with(
        channel: tonic::transport::Channel,
        metadata: &[(&'static str, String)],
    ) -> Result<Self, tonic::Status> {
        let mut client =
            RateLimitQuotaServiceClient::new(channel).max_decoding_message_size(64 * 1024 * 1024);
        let (send, receive) = mpsc::channel(16);
        let mut request = tonic::Request::new(ReceiverStream::new(receive));
        for (key, value) in metadata {
            request.metadata_mut().insert(*key, value.parse().unwrap());
        }
        let answers = client.stream_rate_limit_quotas(request).await?.into_inner();
        Ok(Self { send, answers })
    }

    /// Sends one report of `usages` in `domain`.
    pub async fn report(&self, domain: &str, usages: Vec<BucketQuotaUsage>) {
        self.send
            .send(RateLimitQuotaUsageReports {
                domain: domain.into(),
                bucket_quota_usages: usages,
            })
            .await
            .unwrap();
    }

    /// The next answer, within 10 s.
    pub async fn next(&mut self) -> RateLimitQuotaResponse {
        tokio::time::timeout(std::time::Duration::from_secs(10), self.answers.message())
            .await
            .expect("an answer within 10 s")
            .expect("the stream is healthy")
            .expect("the stream is open")
    }
}

/// A usage of the bucket with these pairs.
pub fn usage(pairs: &[(&str, &str)], allowed: u64, denied: u64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(bucket(pairs)),
        time_elapsed: None,
        num_requests_allowed: allowed,
        num_requests_denied: denied,
    }
}

/// A bucket id of these pairs.
pub fn bucket(pairs: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<HashMap<_, _>>(),
    }
}
