//! The Redis store on a Redis Cluster of three primaries started by the test
//! (tests/common/redis.rs): scripts run on the primary of each scope's hash slot (no
//! CROSSSLOT error), and two stores (two processes' worth) share one quota.

#![cfg(feature = "redis-cluster")]

mod common;

use std::time::Duration;

use reqwest_throttle::store::{Admission, Limits, OnUnavailable, RedisStore, ScopeId, Store};
use reqwest_throttle::{Deadline, Scope, Throttle, ThrottleError};

fn store(urls: &[String]) -> RedisStore {
    RedisStore::cluster_builder(urls.to_vec())
        .timeout(Some(Duration::from_secs(2)))
        .on_unavailable(OnUnavailable::FailClosed)
        .build()
        .expect("valid URLs")
}

#[tokio::test]
async fn scopes_spread_over_the_cluster_and_two_stores_share_one_quota() {
    let Some(cluster) = common::redis::RedisCluster::start() else {
        return;
    };
    let urls = cluster.urls();
    // Many scopes: their keys hash to slots on every primary; each admission is one script.
    let s = store(&urls);
    let limits = Limits::new().with_max_in_flight(Some(1)).with_window(
        reqwest_throttle::store::WindowQuota::new(
            std::num::NonZeroU32::new(1).unwrap(),
            Duration::from_secs(60),
            Duration::ZERO,
        ),
    );
    for i in 0..30u128 {
        let scope = s.open(ScopeId::from_u128(i << 100 | i), &limits);
        let answer = s.admit(&scope, 1).await.expect("the cluster answers");
        assert!(
            matches!(answer, Admission::Admitted(_)),
            "scope {i}: {answer:?}"
        );
        assert_eq!(
            s.admit(&scope, 1).await.unwrap(),
            Admission::InFlightFull,
            "scope {i}"
        );
    }
    let keys: usize = cluster
        .nodes
        .iter()
        .map(|n| n.cli(&["DBSIZE"]).parse::<usize>().unwrap())
        .filter(|&k| k > 0)
        .count();
    assert_eq!(keys, 3, "every primary holds some scopes");

    // Two throttles on two stores: one quota of 3 per minute between them.
    let throttle = |store| {
        Throttle::builder()
            .sliding_window(3, Duration::from_secs(60))
            .scope(Scope::global())
            .store(store)
            .build()
            .unwrap()
    };
    let (a, b) = (throttle(store(&urls)), throttle(store(&urls)));
    let held = (
        a.acquire(1).await.unwrap(),
        a.acquire(1).await.unwrap(),
        b.acquire(1).await.unwrap(),
    );
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(b.clone())
        .build();
    let refused = client
        .get("http://127.0.0.1:9/")
        .with_extension(Deadline::after(Duration::from_millis(300)))
        .send()
        .await;
    let err = refused.expect_err("the shared window is full");
    assert!(
        matches!(
            ThrottleError::of(&err),
            Some(ThrottleError::DeadlineExceeded { .. })
        ),
        "{err}"
    );
    drop(held);
}
