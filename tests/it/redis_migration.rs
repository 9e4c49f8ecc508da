//! A rolling migration from envoyproxy/ratelimit: with `REDIS_KEY_FORMAT=reference`, Sluice
//! counts fixed windows under the reference's Redis keys and plain integers, so reference
//! instances and Sluice instances sharing one Redis admit the limit together, and Sluice
//! carries on the counters the reference left. The reference is played here by its own
//! commands for each request (`INCRBY key hits` then `EXPIRE key unit+jitter`, one pipeline,
//! admitted when the count after the increment is within the limit), against real Redis.

use std::time::Duration;

use crate::common::redis::{RedisCluster, RedisServer};
use crate::common::{TestServer, config_dir};
use sluice::clock::{Clock, SystemClock};
use sluice::settings::{Backend, Settings};
use sluice::store::redis::{RedisKind, RedisOptions};

const CONFIG: &str = "
domain: mig
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: path
    rate_limits:
      - {unit: minute, requests_per_unit: 5}
      - {unit: hour, requests_per_unit: 50}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: token_bucket}
";

const PREFIX: &str = "ratelimit_";
const JITTER: u64 = 30;

fn settings(url: String, kind: RedisKind) -> Settings {
    let mut settings = Settings::for_tests(config_dir("migration", &[("mig.yaml", CONFIG)]));
    settings.backend = Backend::Redis;
    settings.redis = Some(RedisOptions {
        key_prefix: PREFIX.into(),
        expiration_jitter: Duration::from_secs(JITTER),
        call_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        ..RedisOptions::new(url, kind)
    });
    settings.resilience.deadline = Duration::from_secs(5);
    settings.limiter.reference_keys = true;
    settings
}

/// A reference instance: its key for `user=<value>` at `now` (s), and its request.
struct Reference {
    conn: redis::aio::MultiplexedConnection,
}

impl Reference {
    async fn connect(url: &str) -> Self {
        let client = redis::Client::open(url).unwrap();
        Self {
            conn: client.get_multiplexed_async_connection().await.unwrap(),
        }
    }

    fn key(user: &str, now_seconds: u64) -> String {
        format!("{PREFIX}mig_user_{user}_{}", now_seconds - now_seconds % 60)
    }

    /// One request of one hit, as `fixed_cache_impl.go` sends it: admitted when the count
    /// after the increment is within the limit of 10.
    async fn hit(&mut self, user: &str, now_seconds: u64) -> bool {
        let key = Self::key(user, now_seconds);
        let (after,): (u64,) = redis::pipe()
            .cmd("INCRBY")
            .arg(&key)
            .arg(1)
            .cmd("EXPIRE")
            .arg(&key)
            .arg(60 + 7)
            .ignore()
            .query_async(&mut self.conn)
            .await
            .unwrap();
        after <= 10
    }
}

/// A pinned time 20 s into a minute: nothing here crosses a window by chance.
fn pin(clock: &sluice::clock::ManualClock) -> u64 {
    let now = clock.now() / 1_000_000;
    let start = now - now % 60 + 60 + 20;
    clock.set(start * 1_000_000);
    start
}

/// One Redis, shared by a reference instance and a Sluice server (adjusted by `adjust`) whose
/// clock is pinned at `now` (s).
struct Rollout {
    redis: RedisServer,
    server: TestServer,
    clock: std::sync::Arc<sluice::clock::ManualClock>,
    now: u64,
    reference: Reference,
}

async fn rollout(adjust: impl FnOnce(&mut Settings)) -> Rollout {
    let redis = RedisServer::start();
    let mut settings = settings(redis.url(), RedisKind::Single);
    adjust(&mut settings);
    let (server, clock) = TestServer::start_with_clock(settings).await;
    let now = pin(&clock);
    let reference = Reference::connect(&redis.url()).await;
    Rollout {
        redis,
        server,
        clock,
        now,
        reference,
    }
}

#[tokio::test]
async fn reference_and_sluice_instances_on_one_redis_admit_exactly_the_limit_together() {
    let Rollout {
        redis,
        server,
        now,
        mut reference,
        ..
    } = rollout(|_| {}).await;
    let sluice = server.domain("mig");

    // Interleaved, 15 requests each: 10 pass in all, whoever asks.
    let mut admitted = 0;
    for _ in 0..15 {
        admitted += u32::from(reference.hit("alice", now).await);
        admitted += u32::from(sluice.hit("user=alice").await.is_ok());
    }
    assert_eq!(admitted, 10);

    // One key, the reference's, holding a plain integer: the reference counted its refusals
    // (it always charges), Sluice charged only what it admitted.
    let key = Reference::key("alice", now);
    let count: u64 = redis
        .command(&["GET", &key])
        .lines()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!((10..=25).contains(&count), "{key} holds {count}");
    let keys = redis.command(&["KEYS", "*"]);
    let (_, rlconfig) = crate::common::http_get(server.http_addr, "/rlconfig")
        .await
        .unwrap();
    assert!(rlconfig.contains("key format: reference"), "{rlconfig}");
    assert!(
        !keys.contains('|'),
        "no Sluice-layout key was written: {keys}"
    );
}

#[tokio::test]
async fn sluice_carries_on_the_reference_counters_with_the_reference_expiry() {
    let Rollout {
        redis,
        server,
        clock,
        now,
        mut reference,
    } = rollout(|_| {}).await;
    let sluice = server.domain("mig");

    // The reference served 7 of bob's requests, then the last reference pod went.
    for _ in 0..7 {
        assert!(reference.hit("bob", now).await);
    }
    let first = sluice.hit("user=bob").await;
    assert!(first.is_ok());
    assert_eq!(first.remaining(), [2]);
    assert!(sluice.hit("user=bob").await.is_ok());
    assert!(sluice.hit("user=bob").await.is_ok());
    assert!(sluice.hit("user=bob").await.is_over_limit());
    let key = Reference::key("bob", now);
    let count = redis.command(&["GET", &key]);
    assert!(
        count.ends_with("\r\n10") || count.contains("\n10"),
        "{count}"
    );
    // The reference's expiry: the unit plus up to EXPIRATION_JITTER_MAX_SECONDS, from the
    // script's time (the pinned clock here, ahead of Redis's own by `ahead`).
    let ttl: u64 = redis
        .command(&["TTL", &key])
        .trim_start_matches(':')
        .trim()
        .parse()
        .unwrap();
    let ahead = now - SystemClock.now() / 1_000_000;
    assert!(
        (ahead + 58..=ahead + 60 + JITTER).contains(&ttl),
        "TTL {ttl}, {ahead} s ahead"
    );

    // A new window is a new key, as the reference counts it.
    clock.set((now + 60) * 1_000_000);
    let next = sluice.hit("user=bob").await;
    assert_eq!(next.remaining(), [9]);
    assert!(
        redis
            .command(&["EXISTS", &Reference::key("bob", now + 60)])
            .contains('1')
    );
}

#[tokio::test]
async fn counters_without_a_reference_counterpart_keep_sluice_keys() {
    let Rollout { redis, server, .. } = rollout(|_| {}).await;
    let sluice = server.domain("mig");
    assert!(sluice.hit("path=/a").await.is_ok());
    assert!(sluice.hit("bucket=b").await.is_ok());
    let keys = redis.command(&["KEYS", "*"]);
    assert!(keys.contains("ratelimit_mig|path=/a|60s:fw"), "{keys}");
    assert!(keys.contains("ratelimit_mig|path=/a|3600s:fw"), "{keys}");
    assert!(keys.contains("ratelimit_mig|bucket=b|60s:tb"), "{keys}");
    assert!(!keys.contains("mig_path"), "{keys}");
}

#[tokio::test]
async fn on_a_cluster_each_reference_key_goes_to_its_own_slot() {
    let cluster = RedisCluster::start();
    let (server, clock) =
        TestServer::start_with_clock(settings(cluster.url(), RedisKind::Cluster)).await;
    let now = pin(&clock);
    let sluice = server.domain("mig");
    // Two descriptors whose keys hash to different slots: one request, all-or-nothing.
    let both = sluice.hit("user=carol | user=dave").await;
    assert!(both.is_ok());
    assert_eq!(both.remaining(), [9, 9]);
    let client = redis::cluster::ClusterClient::new(vec![cluster.nodes[0].url()]).unwrap();
    let mut conn = client.get_async_connection().await.unwrap();
    for user in ["carol", "dave"] {
        let count: u64 = redis::cmd("GET")
            .arg(Reference::key(user, now))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(count, 1, "{user}");
    }
}

#[tokio::test]
async fn the_admin_api_names_and_resets_the_reference_key() {
    use sluice::admin::api::proto::{self, admin_client::AdminClient};
    let token = crate::common::temp_dir("migration-token").join("token");
    std::fs::write(&token, "tok").unwrap();
    let Rollout {
        redis,
        server,
        now,
        mut reference,
        ..
    } = rollout(|settings| settings.admin_reset.token_file = Some(token)).await;
    for _ in 0..4 {
        reference.hit("erin", now).await;
    }
    let mut admin = AdminClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let descriptor = proto::RateLimitDescriptor {
        entries: vec![proto::rate_limit_descriptor::Entry {
            key: "user".into(),
            value: "erin".into(),
        }],
        limit: None,
    };
    let request = proto::CountersRequest {
        domain: "mig".into(),
        descriptor: Some(descriptor),
    };
    let got = admin
        .get_counters(request.clone())
        .await
        .unwrap()
        .into_inner();
    let limit = got.counters[0].limit.clone().unwrap();
    assert_eq!(limit.store_key, Reference::key("erin", now));
    assert_eq!(limit.counter, "mig_user_erin_");
    assert_eq!((got.counters[0].used, got.counters[0].remaining), (4, 6));
    let mut reset = tonic::Request::new(request);
    reset
        .metadata_mut()
        .insert("authorization", "Bearer tok".parse().unwrap());
    assert_eq!(
        admin
            .reset_counters(reset)
            .await
            .unwrap()
            .into_inner()
            .deleted,
        1
    );
    assert!(
        redis
            .command(&["EXISTS", &Reference::key("erin", now)])
            .contains('0')
    );
}
