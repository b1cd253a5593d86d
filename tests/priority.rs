//! Priority lanes, with paused time: higher priority first, first in first out within a
//! priority, and the aging bound that keeps a low-priority request from starving.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest_throttle::{Priority, Scope, Throttle};
use tokio::time::Instant;

mod common;
use common::{info, settle, FakeServer};

const S: Duration = Duration::from_secs(1);

/// Queues `n` callers of `priority`, each recording `(tag, i)` when admitted and holding its
/// permit for `hold`.
fn queue(
    throttle: &Throttle,
    order: &Arc<Mutex<Vec<(&'static str, usize)>>>,
    tag: &'static str,
    priority: Priority,
    n: usize,
    hold: Duration,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|i| {
            let (throttle, order) = (throttle.clone(), order.clone());
            tokio::spawn(async move {
                let permit = throttle.acquire_with_priority(1, priority).await.unwrap();
                order.lock().unwrap().push((tag, i));
                tokio::time::sleep(hold).await;
                drop(permit);
            })
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn high_priority_goes_before_a_queued_batch() {
    let throttle = Throttle::builder().max_in_flight(1).build().unwrap();
    let order = Arc::default();
    let held = throttle.acquire(1).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..100 {
        tasks.extend(queue(&throttle, &order, "low", Priority::Low, 1, S));
        // Arrival order is the spawn order once each task has queued.
        settle().await;
        assert_eq!(throttle.stats().queued, i + 1);
    }
    for _ in 0..10 {
        tasks.extend(queue(&throttle, &order, "high", Priority::High, 1, S));
        settle().await;
    }
    drop(held);
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    let tags: Vec<_> = order.iter().map(|&(tag, _)| tag).collect();
    let expected: Vec<_> = ["high"; 10].into_iter().chain(["low"; 100]).collect();
    assert_eq!(tags, expected);
}

#[tokio::test(start_paused = true)]
async fn within_a_priority_first_in_first_out() {
    let throttle = Throttle::builder().max_in_flight(1).build().unwrap();
    let order: Arc<Mutex<Vec<(&str, usize)>>> = Arc::default();
    let held = throttle.acquire(1).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..20 {
        let (throttle, order) = (throttle.clone(), order.clone());
        let priority = if i % 2 == 0 {
            Priority::Normal
        } else {
            Priority::Critical
        };
        tasks.push(tokio::spawn(async move {
            let _permit = throttle.acquire_with_priority(1, priority).await.unwrap();
            order.lock().unwrap().push(("", i));
        }));
        settle().await;
    }
    drop(held);
    for t in tasks {
        t.await.unwrap();
    }
    let got: Vec<_> = order.lock().unwrap().iter().map(|&(_, i)| i).collect();
    let odd = (0..20).filter(|i| i % 2 == 1);
    let even = (0..20).filter(|i| i % 2 == 0);
    assert_eq!(got, odd.chain(even).collect::<Vec<_>>());
}

/// One slot; high-priority work arrives every 500 ms and holds the slot for 1 s, for two
/// minutes; one low-priority request arrives at 250 ms. Returns when it was admitted, if it
/// was within the two minutes.
async fn low_under_endless_high_load(aging: Duration) -> Option<Duration> {
    let throttle = Throttle::builder()
        .max_in_flight(1)
        .priority_aging(aging)
        .build()
        .unwrap();
    let t0 = Instant::now();
    let order = Arc::default();
    let load = tokio::spawn({
        let throttle = throttle.clone();
        async move {
            let mut tasks = Vec::new();
            for _ in 0..240 {
                tasks.extend(queue(&throttle, &order, "high", Priority::High, 1, S));
                tokio::time::sleep(S / 2).await;
            }
            tasks
        }
    });
    tokio::time::sleep(S / 4).await;
    let low = throttle.acquire_with_priority(1, Priority::Low);
    let admitted = tokio::time::timeout(120 * S, low).await.ok().map(|permit| {
        drop(permit.unwrap());
        Instant::now() - t0
    });
    for task in load.await.unwrap() {
        task.abort();
    }
    admitted
}

#[tokio::test(start_paused = true)]
async fn a_low_request_goes_by_the_aging_bound_under_endless_high_load() {
    // The queue of high requests grows (2 arrive per second, 1 is served), so without aging
    // the low request never goes.
    assert_eq!(low_under_endless_high_load(3600 * S).await, None);
    // With a 30 s bound it has aged at 30.25 s and goes at the next release, at 31 s; the high
    // request then at the front of its lane arrived at 15.5 s and has not aged.
    assert_eq!(low_under_endless_high_load(30 * S).await, Some(31 * S));
}

#[tokio::test(start_paused = true)]
async fn the_priority_extension_orders_requests_through_the_middleware() {
    let server = FakeServer::ok().with_delay(S);
    let throttle = Throttle::builder()
        .scope(Scope::global())
        .max_in_flight(1)
        .build()
        .unwrap();
    let c = server.client(&throttle);
    let first = tokio::spawn({
        let c = c.clone();
        async move { c.get("http://api.test/first").send().await.unwrap() }
    });
    settle().await;
    let mut tasks = Vec::new();
    for (path, priority) in [
        ("/batch1", Priority::Low),
        ("/batch2", Priority::Low),
        ("/user", Priority::High),
    ] {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let r = c
                .get(format!("http://api.test{path}"))
                .with_extension(priority)
                .send()
                .await
                .unwrap();
            info(&r).waited
        }));
        settle().await;
    }
    drop(first.await.unwrap());
    let waited: Vec<_> = futures::future::join_all(tasks)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let paths: Vec<_> = server.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(paths, ["/first", "/user", "/batch1", "/batch2"]);
    assert_eq!(waited, [2 * S, 3 * S, S]);
}
