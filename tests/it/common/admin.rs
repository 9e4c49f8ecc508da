//! The admin API's test vocabulary: its configs, settings, clients and descriptors.

use std::path::PathBuf;
use std::time::Duration;

use super::redis::RedisServer;
use super::{TestServer, config_dir, temp_dir};
use sluice::admin::ResetSettings;
use sluice::admin::api::proto::{
    RateLimitDescriptor, admin_client::AdminClient, rate_limit_descriptor::Entry,
};
use sluice::settings::{Backend, Settings};
use sluice::store::redis::{RedisKind, RedisOptions};
use tonic::transport::Channel;

/// A domain with the reference's matching cases: exact, wildcard and key-only children,
/// a whitelist, a rule deeper than one entry, an unlimited rule, and `replaces`.
pub const MATCHING: &str = "
domain: m
descriptors:
  - key: k
    value: exact
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: k
    value: ex*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: white
  - key: parent
    descriptors:
      - key: child
        rate_limit: {unit: hour, requests_per_unit: 4}
  - key: free
    rate_limit: {unlimited: true}
  - key: big
    rate_limit: {unit: minute, requests_per_unit: 100, name: big}
  - key: small
    rate_limit: {unit: minute, requests_per_unit: 10, name: small, replaces: [{name: big}]}
";

/// A domain with one rule per algorithm, and one with two limits.
pub const ALGORITHMS: &str = "
domain: a
descriptors:
  - key: fw
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: sw
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window}
  - key: tb
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: token_bucket}
  - key: cc
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: concurrency}
  - key: multi
    rate_limits:
      - {unit: minute, requests_per_unit: 5}
      - {unit: hour, requests_per_unit: 50}
";

pub fn settings(reset: ResetSettings) -> Settings {
    let mut settings = Settings::for_tests(config_dir(
        "admin-api",
        &[("m.yaml", MATCHING), ("a.yaml", ALGORITHMS)],
    ));
    settings.admin_reset = reset;
    settings
}

pub fn on_redis(mut settings: Settings, redis: &RedisServer) -> Settings {
    settings.backend = Backend::Redis;
    settings.redis = Some(RedisOptions {
        call_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        ..RedisOptions::new(redis.url(), RedisKind::Single)
    });
    settings.resilience.deadline = Duration::from_secs(5);
    settings
}

pub fn token_file(name: &str, token: &str) -> PathBuf {
    let path = temp_dir(name).join("token");
    std::fs::write(&path, format!("{token}\n")).unwrap();
    path
}

pub fn with_token(path: &std::path::Path) -> ResetSettings {
    ResetSettings {
        token_file: Some(path.to_owned()),
        client_san: None,
    }
}

pub async fn admin(server: &TestServer) -> AdminClient<Channel> {
    AdminClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap()
}

/// A descriptor of the admin API from `k=v` pairs.
pub fn descriptor(pairs: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: super::entries(pairs, |key, value| Entry { key, value }),
        limit: None,
    }
}
