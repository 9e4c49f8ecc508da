//! Claims on a shared RLQS budget in Redis and Redis Cluster: two instances never hold more
//! than the total between them, a claim lowered is free for the other, and a claim that is
//! not renewed ends with its TTL.

use std::time::Duration;

use crate::common::redis::{RedisCluster, RedisServer};
use sluice::store::redis::{RedisKind, RedisOptions};
use sluice::store::{ClaimAsk, RedisStore, Shared};

fn ask(instance: &str, want: u64, ttl_ms: u64) -> ClaimAsk {
    ClaimAsk {
        key: "rq\nbucket".into(),
        instance: instance.into(),
        total: 10,
        want,
        demand: 7.5,
        peers: 3,
        ttl: Duration::from_millis(ttl_ms),
    }
}

async fn claims_add_up(store: &RedisStore) {
    many_at_once(store).await;
    let one = store.claim(&[ask("one", 10, 60_000)]).await.unwrap()[0];
    assert_eq!((one.granted, one.others), (10, 0));
    let two = store.claim(&[ask("two", 5, 60_000)]).await.unwrap()[0];
    assert_eq!(
        (two.granted, two.others, two.others_hold),
        (0, 1, 10),
        "{two:?}"
    );
    assert_eq!(two.others_demand, 7.5);
    assert_eq!(two.others_peers, 3, "the peers behind the other claim");
    // One lowers its claim: the other may take what it left.
    let one = store.claim(&[ask("one", 5, 60_000)]).await.unwrap()[0];
    assert_eq!((one.granted, one.others_hold), (5, 0));
    let two = store.claim(&[ask("two", 8, 60_000)]).await.unwrap()[0];
    assert_eq!(two.granted, 5, "{two:?}");
    // A claim not renewed ends with its TTL.
    let three = store.claim(&[ask("three", 0, 200)]).await.unwrap()[0];
    assert_eq!(three.others_hold, 10);
    let short = store.claim(&[ask("one", 5, 200)]).await.unwrap()[0];
    assert_eq!(short.granted, 5);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let two = store.claim(&[ask("two", 10, 60_000)]).await.unwrap()[0];
    assert_eq!(
        (two.granted, two.others, two.others_peers),
        (10, 0, 0),
        "{two:?}"
    );
}

#[tokio::test]
async fn claims_in_redis_never_add_up_past_the_total() {
    let redis = RedisServer::start();
    let store = RedisStore::new(&RedisOptions::new(redis.url(), RedisKind::Single)).unwrap();
    claims_add_up(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_in_a_redis_cluster_never_add_up_past_the_total() {
    let cluster = RedisCluster::start();
    let store = RedisStore::new(&RedisOptions::new(cluster.url(), RedisKind::Cluster)).unwrap();
    claims_add_up(&store).await;
}

/// A thousand claims in one call (more than one script call's worth, over several slots in
/// a Cluster): each answered for its own budget.
async fn many_at_once(store: &RedisStore) {
    let asks: Vec<ClaimAsk> = (0..1000)
        .map(|i| ClaimAsk {
            key: format!("many\n{i}"),
            want: i % 7,
            ..ask("one", 0, 60_000)
        })
        .collect();
    let grants = store.claim(&asks).await.unwrap();
    assert_eq!(grants.len(), 1000);
    for (i, grant) in grants.iter().enumerate() {
        assert_eq!(grant.granted, (i % 7) as u64, "claim {i}");
    }
    let others: Vec<ClaimAsk> = asks
        .iter()
        .map(|a| ClaimAsk {
            instance: "two".into(),
            want: 10,
            ..a.clone()
        })
        .collect();
    let grants = store.claim(&others).await.unwrap();
    for (i, grant) in grants.iter().enumerate() {
        assert_eq!(
            (grant.granted, grant.others_hold),
            (10 - (i % 7) as u64, (i % 7) as u64),
            "claim {i}"
        );
    }
}
