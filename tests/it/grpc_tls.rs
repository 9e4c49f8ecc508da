//! gRPC over TLS and mutual TLS, with certificates rotated in place.

use std::path::Path;
use std::time::Duration;

use crate::common::certs::{server_tls, tls_endpoint};
use crate::common::{TestServer, config_dir, descriptor, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::settings::Settings;

const CONFIG: &str =
    "domain: t\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 9}\n";

fn tls_settings(certs: &Path, mutual: bool) -> Settings {
    let mut settings = Settings::for_tests(config_dir("tls", &[("t.yaml", CONFIG)]));
    settings.grpc_tls = Some(server_tls(certs, mutual));
    settings
}

async fn tls_server(certs: &Path, mutual: bool) -> TestServer {
    TestServer::start_with(tls_settings(certs, mutual)).await
}

/// One request over TLS trusting `ca` (if any) and presenting `identity` (if any).
async fn ask(
    server: &TestServer,
    ca: Option<&Path>,
    identity: Option<&Path>,
) -> Result<u32, String> {
    let channel = tls_endpoint(server.grpc_addr.port(), ca, identity)?
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let mut client = RateLimitServiceClient::new(channel);
    client
        .should_rate_limit(request("t", vec![descriptor(&[("k", "v")])]))
        .await
        .map(|r| r.into_inner().statuses[0].limit_remaining)
        .map_err(|e| format!("rpc: {e:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_admits_clients_that_trust_the_ca_only() {
    let certs = crate::common::certs::fresh("tls-certs");
    let server = tls_server(&certs, false).await;
    assert_eq!(ask(&server, Some(&certs), None).await, Ok(8));
    assert!(
        ask(&server, None, None).await.is_err(),
        "a client without the CA must not connect"
    );
    // Plain gRPC is refused too.
    let plain = RateLimitServiceClient::connect(format!("http://{}", server.grpc_addr)).await;
    if let Ok(mut client) = plain {
        assert!(
            client
                .should_rate_limit(request("t", vec![descriptor(&[("k", "v")])]))
                .await
                .is_err()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_requires_a_client_certificate() {
    let certs = crate::common::certs::fresh("mtls-certs");
    let server = tls_server(&certs, true).await;
    assert!(
        ask(&server, Some(&certs), None).await.is_err(),
        "no client certificate"
    );
    assert_eq!(ask(&server, Some(&certs), Some(&certs)).await, Ok(8));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_certificates_are_used_without_a_restart() {
    let certs = crate::common::certs::fresh("rotate-certs");
    let server = tls_server(&certs, false).await;
    assert_eq!(ask(&server, Some(&certs), None).await, Ok(8));
    // A new CA and server certificate replace the files in place.
    let next = crate::common::certs::fresh("rotate-next");
    for file in ["server.crt", "server.key"] {
        let temp = certs.join(format!(".{file}"));
        std::fs::copy(next.join(file), &temp).unwrap();
        std::fs::rename(temp, certs.join(file)).unwrap();
    }
    crate::common::eventually("the new certificate is served", || async {
        ask(&server, Some(&next), None).await.is_ok()
    })
    .await;
    assert!(
        ask(&server, Some(&certs), None).await.is_err(),
        "the old CA no longer fits"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_completes_the_tls_handshake_is_closed() {
    use tokio::io::AsyncReadExt as _;
    let certs = crate::common::certs::fresh("tls-silent-certs");
    let mut settings = tls_settings(&certs, false);
    settings.grpc_connections.handshake_timeout = Duration::from_millis(300);
    let server = TestServer::start_with(settings).await;
    let mut silent = tokio::net::TcpStream::connect(server.grpc_addr)
        .await
        .unwrap();
    let mut sent = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), silent.read_to_end(&mut sent))
        .await
        .expect("the server kept a connection without a handshake")
        .unwrap();
    assert!(sent.is_empty());
    assert_eq!(ask(&server, Some(&certs), None).await, Ok(8));
}

/// `GRPC_CLIENT_TLS_SAN`: a client certificate from the CA must also be valid for that name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_with_a_san_admits_only_certificates_for_that_name() {
    let certs = crate::common::certs::fresh("mtls-san-certs");
    let with_san = |san: &str| {
        let mut settings = tls_settings(&certs, true);
        settings.grpc_tls.as_mut().unwrap().client_san = Some(san.into());
        settings
    };
    let server = TestServer::start_with(with_san("client.sluice.test")).await;
    assert_eq!(ask(&server, Some(&certs), Some(&certs)).await, Ok(8));
    let server = TestServer::start_with(with_san("someone-else.test")).await;
    assert!(
        ask(&server, Some(&certs), Some(&certs)).await.is_err(),
        "a certificate for another name"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlqs_streams_take_the_same_mutual_tls() {
    let certs = crate::common::certs::fresh("rlqs-mtls-certs");
    let server = tls_server(&certs, true).await;
    let channel = |identity: bool| {
        let identity = identity.then_some(certs.as_path());
        tls_endpoint(server.grpc_addr.port(), Some(&certs), identity).unwrap()
    };
    // Without a client certificate: the handshake or the stream fails (under TLS 1.3 the
    // server's refusal arrives after the client's side of the handshake is done).
    let refused = match channel(false).connect().await {
        Err(_) => true,
        Ok(c) => crate::common::rlqs::Stream::over(c).await.is_err(),
    };
    assert!(refused, "no client certificate");
    let mut stream = crate::common::rlqs::Stream::over(channel(true).connect().await.unwrap())
        .await
        .unwrap();
    stream
        .report("t", vec![crate::common::rlqs::usage(&[("k", "v")], 1, 0)])
        .await;
    let answer = stream.next().await;
    assert_eq!(answer.bucket_action.len(), 1, "{answer:?}");
}
