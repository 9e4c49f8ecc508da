//! Usage budgets (`overdraft: true`) over gRPC, on the memory store and on Redis (with the
//! over-limit cache on, which must never swallow a budget's charge): every charge counts,
//! also one that crosses the budget or belongs to a refused request; checks are refused while
//! the budget is spent; refunds give back what was charged; plain rules still charge nothing
//! when refused.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

use crate::common::redis::RedisServer;
use crate::common::{TestServer, config_dir, metric};
use sluice::settings::{Backend, Settings};
use sluice::store::redis::{RedisKind, RedisOptions};

const CONFIG: &str = "
domain: ai
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 100, overdraft: true}
  - key: route
    rate_limit: {unit: minute, requests_per_unit: 2}
";

/// A server on the memory store, or on `redis` with the over-limit cache.
async fn server(redis: Option<&RedisServer>) -> TestServer {
    let mut settings = Settings::for_tests(config_dir("usage-budgets", &[("ai.yaml", CONFIG)]));
    if let Some(redis) = redis {
        settings.backend = Backend::Redis;
        settings.redis = Some(RedisOptions::new(redis.url(), RedisKind::Single));
        settings.local_cache_keys = 1000;
    }
    TestServer::start_with(settings).await
}

async fn a_charge_that_crosses_the_budget_counts(server: &TestServer) {
    let ai = server.domain("ai");
    let first = ai.charges(&[("tenant=a", 80)]).await;
    assert_eq!((first.code(), first.remaining()), (Code::Ok, vec![20]));
    // The report that crosses the budget: refused, and counted in full.
    let crossing = ai.charges(&[("tenant=a", 50)]).await;
    assert_eq!(
        (crossing.code(), crossing.remaining()),
        (Code::OverLimit, vec![0])
    );
    let check = ai.charges(&[("tenant=a", 0)]).await;
    assert_eq!(check.code(), Code::OverLimit, "130 of 100 used");
    // A second report while spent counts too: 140 used.
    assert!(ai.charges(&[("tenant=a", 10)]).await.is_over_limit());
    // Giving back 45 leaves 95 of 100: exactly what was charged, less the refund.
    let refund = ai.charges(&[("tenant=a", -45)]).await;
    assert_eq!((refund.code(), refund.remaining()), (Code::Ok, vec![5]));
    let check = ai.charges(&[("tenant=a", 0)]).await;
    assert_eq!((check.code(), check.remaining()), (Code::Ok, vec![5]));
    // Another tenant has its own budget.
    assert_eq!(ai.charges(&[("tenant=b", 0)]).await.remaining(), vec![100]);
    // The rule's series: 140 units charged (80 + 50 + 10), 40 of them past the limit
    // (30 of the crossing report, all 10 of the next); checks and refunds are no charges.
    let page = crate::common::reference::metrics(server).await;
    let series = |name: &str| {
        let labels = r#"{domain="ai",key1="tenant",key2="",rule="ai.tenant"}"#;
        metric::<u64>(&page, &format!("{name}{labels}")).unwrap_or_else(|| panic!("{name}: {page}"))
    };
    assert_eq!(series("sluice_budget_units_total"), 140);
    assert_eq!(series("sluice_budget_overdraft_units_total"), 40);
    assert!(
        !page.contains(r#"sluice_budget_units_total{domain="ai",key1="route""#),
        "a plain rule has no budget series"
    );
}

async fn a_budget_charge_counts_when_another_descriptor_refuses_the_request(server: &TestServer) {
    let ai = server.domain("ai");
    for expected in [Code::Ok, Code::Ok, Code::OverLimit] {
        let answer = ai.charges(&[("route=chat", 1), ("tenant=c", 10)]).await;
        assert_eq!(answer.code(), expected);
    }
    // The refused request's usage counted on the budget...
    assert_eq!(ai.charges(&[("tenant=c", 0)]).await.remaining(), vec![70]);
    // ...while the plain rule charged nothing for it: 2 of 2, a check still passes.
    let route = ai.charges(&[("route=chat", 0)]).await;
    assert_eq!((route.code(), route.remaining()), (Code::Ok, vec![0]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_a_charge_that_crosses_the_budget_counts() {
    a_charge_that_crosses_the_budget_counts(&server(None).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_charge_that_crosses_the_budget_counts() {
    let redis = RedisServer::start();
    a_charge_that_crosses_the_budget_counts(&server(Some(&redis)).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_a_budget_charge_counts_when_another_descriptor_refuses_the_request() {
    a_budget_charge_counts_when_another_descriptor_refuses_the_request(&server(None).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_budget_charge_counts_when_another_descriptor_refuses_the_request() {
    let redis = RedisServer::start();
    let server = server(Some(&redis)).await;
    a_budget_charge_counts_when_another_descriptor_refuses_the_request(&server).await;
}

/// Under `CONSISTENCY=leased` a budget stays exact: an instance that has been charging it
/// holds no block to admit from once another instance's report has spent it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_consistency_leased_a_budget_stays_exact_across_instances() {
    let redis = RedisServer::start();
    let leased = || {
        let mut settings =
            Settings::for_tests(config_dir("usage-budgets-leased", &[("ai.yaml", CONFIG)]));
        settings.backend = Backend::Redis;
        settings.redis = Some(RedisOptions::new(redis.url(), RedisKind::Single));
        settings.limiter.consistency = sluice::store::Consistency::Leased;
        settings
    };
    let (a, b) = (
        TestServer::start_with(leased()).await,
        TestServer::start_with(leased()).await,
    );
    let (a, b) = (a.domain("ai"), b.domain("ai"));
    // A busy key on B: leased, it would now hold a block of the budget.
    for _ in 0..40 {
        assert!(b.charges(&[("tenant=d", 1)]).await.is_ok());
    }
    // A's report spends the budget (40 + 70 = 110 of 100)...
    assert!(a.charges(&[("tenant=d", 70)]).await.is_over_limit());
    // ...and B refuses at once: nothing was admitted from a block.
    assert!(b.charges(&[("tenant=d", 0)]).await.is_over_limit());
    assert!(b.charges(&[("tenant=d", 1)]).await.is_over_limit());
    // Every unit was counted in Redis: 111 used, so a refund of 20 leaves 91 and 9 to spare.
    assert_eq!(a.charges(&[("tenant=d", -20)]).await.remaining(), vec![9]);
}
