//! Redis over TLS with a private CA and a client certificate (mutual TLS), against a real
//! redis-server with its plain port closed. Certificates are made with the openssl CLI.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::redis::free_port;
use common::{TestServer, config_dir, descriptor, request, should_rate_limit, temp_dir};
use sluice::settings::{Backend, Settings};
use sluice::store::redis::{RedisKind, RedisOptions};
use sluice::store::resilient::ResilienceOptions;

struct TlsRedis {
    child: std::process::Child,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn redis_over_mutual_tls_with_a_private_ca() {
    let dir = temp_dir("tls");
    common::certs::make(&dir);
    let port = free_port();
    let child = Command::new("redis-server")
        .current_dir(&dir)
        .args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args([
            "--tls-cert-file",
            "server.crt",
            "--tls-key-file",
            "server.key",
            "--tls-ca-cert-file",
            "ca.crt",
            "--tls-auth-clients",
            "yes",
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let _redis = TlsRedis { child };
    let started = Instant::now();
    loop {
        let ping = Command::new("redis-cli")
            .current_dir(&dir)
            .args([
                "--tls",
                "--cacert",
                "ca.crt",
                "--cert",
                "client.crt",
                "--key",
                "client.key",
                "-p",
                &port.to_string(),
                "PING",
            ])
            .output()
            .unwrap();
        if String::from_utf8_lossy(&ping.stdout).trim() == "PONG" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "TLS redis never answered"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let yaml = "domain: tls\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 2}\n";
    let mut settings = Settings::for_tests(config_dir("tls", &[("tls.yaml", yaml)]));
    settings.backend = Backend::Redis;
    settings.redis = Some(RedisOptions {
        tls: true,
        tls_ca: Some(dir.join("ca.crt")),
        tls_cert: Some(dir.join("client.crt")),
        tls_key: Some(dir.join("client.key")),
        connections: 1,
        connect_timeout: Duration::from_secs(5),
        ..RedisOptions::new(format!("127.0.0.1:{port}"), RedisKind::Single)
    });
    // Fail closed, so that a TLS failure shows as OVER_LIMIT instead of passing silently.
    settings.limiter.failure_mode = sluice::store::FailureMode::Deny;
    settings.resilience = ResilienceOptions {
        deadline: Duration::from_secs(5),
        ..ResilienceOptions::default()
    };
    let server = TestServer::start_with(settings).await;
    let mut client = server.client().await;
    let mut seen = Vec::new();
    for _ in 0..3 {
        let r =
            should_rate_limit(&mut client, request("tls", vec![descriptor(&[("k", "v")])])).await;
        seen.push((r.overall_code, r.statuses[0].limit_remaining));
    }
    assert_eq!(seen, [(1, 1), (1, 0), (2, 0)]);
}
