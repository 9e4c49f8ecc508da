//! Redis over TLS with a private CA and a client certificate (mutual TLS), against a real
//! redis-server with its plain port closed. Certificates are made with the openssl CLI.

use std::time::Duration;

use crate::common::TestServer;
use crate::common::redis::TlsRedisServer;
use sluice::settings::{Backend, Settings};
use sluice::store::resilient::ResilienceOptions;

#[tokio::test]
async fn redis_over_mutual_tls_with_a_private_ca() {
    let redis = TlsRedisServer::start();
    let yaml = "domain: tls\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 2}\n";
    let mut settings = Settings::for_tests(crate::common::config_dir("tls", &[("tls.yaml", yaml)]));
    settings.backend = Backend::Redis;
    settings.redis = Some(redis.options());
    // Fail closed, so that a TLS failure shows as OVER_LIMIT instead of passing silently.
    settings.limiter.failure_mode = sluice::store::FailureMode::Deny;
    settings.resilience = ResilienceOptions {
        deadline: Duration::from_secs(5),
        ..ResilienceOptions::default()
    };
    let server = TestServer::start_with(settings).await;
    let tls = server.domain("tls");
    let mut seen = Vec::new();
    for _ in 0..3 {
        let decision = tls.hit("k=v").await;
        seen.push((decision.overall_code, decision.remaining()[0]));
    }
    assert_eq!(seen, [(1, 1), (1, 0), (2, 0)]);
    // The counter is in the TLS Redis.
    assert!(
        redis.cli(&["DBSIZE"]).ends_with('1'),
        "{}",
        redis.cli(&["DBSIZE"])
    );
}
