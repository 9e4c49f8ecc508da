//! Envoy 1.40's own `enable_retry_after_header` beside Sluice's Retry-After: behind a real
//! Envoy, every OVER_LIMIT answer carries exactly one `retry-after`, whichever writes it, with
//! the value Sluice computes (the time until the window lets the request through).

use crate::common::envoy::{self, Bootstrap};
use crate::common::{TestServer, config_dir};
use sluice::settings::Settings;

const CONFIG: &str = "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";

/// The `retry-after` headers of a refused request, with Envoy's own header on or off and
/// Sluice's on or off.
async fn retry_afters(envoy_writes: bool, sluice_writes: bool) -> (u16, Vec<String>) {
    let mut settings =
        Settings::for_tests(config_dir("envoy-retry-after", &[("edge.yaml", CONFIG)]));
    settings.response.retry_after = sluice_writes;
    let sluice = TestServer::start_with(settings).await;
    let mut bootstrap = Bootstrap::new(sluice.grpc_addr.port());
    if envoy_writes {
        bootstrap = bootstrap.filter("              enable_retry_after_header: true");
    }
    let (_envoy, front) = bootstrap.start().await;
    let key = format!("k-{envoy_writes}-{sluice_writes}");
    assert_eq!(envoy::get(front, "/", &[("x-api-key", &key)]).await.0, 200);
    let (status, head, _) = envoy::get(front, "/", &[("x-api-key", &key)]).await;
    let values = head
        .lines()
        .filter_map(|l| l.strip_prefix("retry-after: "))
        .map(|v| v.trim().to_owned())
        .collect();
    (status, values)
}

/// Seconds until the hour's end, as Sluice computes a fixed window's wait.
fn to_hour_end() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    3600 - now % 3600
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_carries_one_retry_after_with_sluices_value() {
    for (envoy_writes, sluice_writes) in [(false, true), (true, false), (true, true)] {
        let (status, values) = retry_afters(envoy_writes, sluice_writes).await;
        assert_eq!(status, 429);
        assert_eq!(
            values.len(),
            1,
            "envoy {envoy_writes}, sluice {sluice_writes}: {values:?}"
        );
        let seconds: u64 = values[0].parse().unwrap();
        assert!(
            seconds.abs_diff(to_hour_end()) <= 2,
            "envoy {envoy_writes}, sluice {sluice_writes}: {seconds} s, {} s to the hour's end",
            to_hour_end()
        );
    }
}
