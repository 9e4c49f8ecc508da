//! Prometheus metrics, scraped as Prometheus does, after real traffic.

use crate::common::redis::free_port;
use crate::common::{
    SluiceProcess, TestServer, config_dir, descriptor, http_get, request, should_rate_limit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

const CONFIG: &str = r#"
domain: shop
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: remote_address
    descriptors:
      - key: path
        value: /login
        rate_limit: {unit: hour, requests_per_unit: 2}
"#;

fn value(page: &str, series: &str) -> Option<u64> {
    crate::common::metric(page, series)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_exactly_the_hits_sent_per_rule() {
    let server = TestServer::with_config(CONFIG).await;
    let shop = server.domain("shop");
    for i in 0..8 {
        shop.hit("api_key=secret-key-1").await;
        if i < 3 {
            shop.hit("remote_address=203.0.113.9,path=/login").await;
        }
    }
    server.domain("nowhere").hit("a=b").await;
    let (status, page) = http_get(server.http_addr, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    let api = r#"{domain="shop",key1="api_key",key2="",rule="shop.api_key"}"#;
    let login = r#"{domain="shop",key1="remote_address",key2="path_/login",rule="shop.remote_address.path_/login"}"#;
    for (name, api_hits, login_hits) in [
        ("total_hits", 8, 3),
        ("within_limit", 5, 2),
        ("over_limit", 3, 1),
        ("near_limit", 1, 1),
    ] {
        let metric = format!("ratelimit_service_rate_limit_{name}");
        assert_eq!(
            value(&page, &format!("{metric}{api}")),
            Some(api_hits),
            "{metric} api_key\n{page}"
        );
        assert_eq!(
            value(&page, &format!("{metric}{login}")),
            Some(login_hits),
            "{metric} login"
        );
    }
    assert_eq!(
        value(
            &page,
            r#"ratelimit_service_domain_not_found{domain="nowhere"}"#
        ),
        Some(1)
    );
    assert_eq!(
        value(
            &page,
            r#"sluice_grpc_requests_total{code="OVER_LIMIT",method="ShouldRateLimit"}"#
        ),
        Some(4)
    );
    assert!(
        page.contains("sluice_grpc_request_duration_seconds_bucket"),
        "{page}"
    );
    // The reference's response time, for its dashboards: every ShouldRateLimit counted.
    assert_eq!(
        value(
            &page,
            r#"ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"}"#
        ),
        Some(12)
    );
    assert_eq!(
        value(&page, "ratelimit_service_config_load_success"),
        Some(1)
    );
    assert_eq!(value(&page, "sluice_store_healthy"), Some(1));
    // No series is labelled by a request value.
    assert!(
        !page.contains("secret-key-1") && !page.contains("203.0.113.9"),
        "{page}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_requests_count_as_service_errors_as_in_the_reference() {
    let server = TestServer::with_config(CONFIG).await;
    let shop = server.domain("shop");
    let error = |page: &str, kind: &str| {
        value(
            page,
            &format!("ratelimit_service_should_rate_limit_error{{err_type=\"{kind}\"}}"),
        )
    };
    let (_, page) = http_get(server.http_addr, "/metrics").await.unwrap();
    assert_eq!(error(&page, "service_error"), Some(0), "{page}");
    for bad in [server.domain("").request("a=b"), shop.request("")] {
        let status = shop.send(bad).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
    }
    let (_, page) = http_get(server.http_addr, "/metrics").await.unwrap();
    assert_eq!(error(&page, "service_error"), Some(2), "{page}");
    assert_eq!(error(&page, "redis_error"), Some(0), "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_with_several_limits_counts_each_hit_once() {
    let config = "domain: multi\ndescriptors:\n  - key: tenant\n    rate_limits:\n      - {unit: hour, requests_per_unit: 4}\n      - {unit: day, requests_per_unit: 100}\n";
    let server = TestServer::with_config(config).await;
    let multi = server.domain("multi");
    for _ in 0..6 {
        multi.hit("tenant=t").await;
    }
    let (_, page) = http_get(server.http_addr, "/metrics").await.unwrap();
    let labels = r#"{domain="multi",key1="tenant",key2="",rule="multi.tenant"}"#;
    for (name, hits) in [("total_hits", 6), ("within_limit", 4), ("over_limit", 2)] {
        let series = format!("ratelimit_service_rate_limit_{name}{labels}");
        assert_eq!(value(&page, &series), Some(hits), "{series}\n{page}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn use_prometheus_serves_metrics_on_their_own_listener() {
    let dir = config_dir("prometheus", &[("shop.yaml", CONFIG)]);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let process = SluiceProcess::spawn(
        &dir,
        &[
            "--use-prometheus",
            "--prometheus-addr",
            &addr,
            "--prometheus-path",
            "/stats",
        ],
    );
    let mut client = RateLimitServiceClient::connect(format!("http://{}", process.grpc))
        .await
        .unwrap();
    should_rate_limit(
        &mut client,
        request("shop", vec![descriptor(&[("api_key", "k")])]),
    )
    .await;
    let (status, page) = http_get(addr.parse().unwrap(), "/stats").await.unwrap();
    assert_eq!(status, 200);
    assert!(page.contains(r#"ratelimit_service_rate_limit_total_hits{domain="shop",key1="api_key",key2="",rule="shop.api_key"} 1"#), "{page}");
}

/// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`: the same histogram, in milliseconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_response_time_can_be_in_milliseconds() {
    let mut settings =
        sluice::settings::Settings::for_tests(config_dir("ms", &[("s.yaml", CONFIG)]));
    settings.response_time_in_milliseconds = true;
    let server = TestServer::start_with(settings).await;
    server.domain("shop").hit("api_key=k").await;
    let (_, page) = http_get(server.http_addr, "/metrics").await.unwrap();
    let bucket = |le: &str| {
        let series = format!(
            r#"ratelimit_service_response_time_seconds_bucket{{grpc_method="ShouldRateLimit",le="{le}"}}"#
        );
        value(&page, &series).unwrap_or_else(|| panic!("no {series} in {page}"))
    };
    // Any request takes more than 5 µs: counted in milliseconds, it is above the lowest
    // bucket (0.005); counted in seconds, it would be in it unless it took over 5 ms.
    assert_eq!(bucket("0.005"), 0);
    assert_eq!(bucket("+Inf"), 1);
}
