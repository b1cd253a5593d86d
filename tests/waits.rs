//! Why a request waited, and head-of-line waits, with paused time: the time waited by cause,
//! a cost-0 request that a quota does not concern, and a deadline the queue ahead cannot meet.

use std::time::Duration;

use reqwest_throttle::{Cost, Deadline, Throttle, ThrottleError, Waits};
use tokio::time::Instant;

mod common;
use common::{info, refuses_once, status, windowed, FakeServer};

const S: Duration = Duration::from_secs(1);

fn waits(queue: Duration, cooldown: Duration, quota: Duration, in_flight: Duration) -> Waits {
    let mut w = Waits::default();
    w.queue = queue;
    w.cooldown = cooldown;
    w.quota = quota;
    w.in_flight = in_flight;
    w
}

#[tokio::test(start_paused = true)]
async fn the_time_waited_is_split_by_cause() {
    let z = Duration::ZERO;
    // A window of 1 per 3 s: the second request waits 3 s on the quota.
    let server = FakeServer::ok();
    let throttle = windowed(1, 3 * S).build().unwrap();
    let c = server.client(&throttle);
    c.get("http://a.test/").send().await.unwrap();
    let r = c.get("http://a.test/").send().await.unwrap();
    assert_eq!(info(&r).waits, waits(z, z, 3 * S, z));
    assert_eq!(info(&r).waited, 3 * S);

    // A cooldown of 30 s, then a retry after it.
    let server = refuses_once("30");
    let throttle = Throttle::builder().jitter(false).build().unwrap();
    let c = server.client(&throttle);
    let r = c.get("http://b.test/").send().await.unwrap();
    let i = info(&r);
    assert_eq!(
        (i.attempts, i.waits.retry, i.waits.cooldown),
        (2, 30 * S, z)
    );
    // The retry slept through the cooldown; a caller arriving during it waits on it.
    let server = refuses_once("30");
    let throttle = Throttle::builder().max_retries(0).build().unwrap();
    let c = server.client(&throttle);
    c.get("http://c.test/").send().await.unwrap();
    tokio::time::sleep(10 * S).await;
    let r = c.get("http://c.test/").send().await.unwrap();
    assert_eq!(info(&r).waits, waits(z, 20 * S, z, z));
}

#[tokio::test(start_paused = true)]
async fn waits_for_a_slot_and_behind_others_are_told_apart() {
    let z = Duration::ZERO;
    let server = FakeServer::new(|_, _| status(200)).with_delay(2 * S);
    let throttle = Throttle::builder().max_in_flight(1).build().unwrap();
    let c = server.client(&throttle);
    let first = tokio::spawn({
        let c = c.clone();
        async move { c.get("http://a.test/1").send().await.unwrap() }
    });
    tokio::task::yield_now().await;
    let second = tokio::spawn({
        let c = c.clone();
        async move { info(&c.get("http://a.test/2").send().await.unwrap()).waits }
    });
    tokio::task::yield_now().await;
    let third = tokio::spawn({
        let c = c.clone();
        async move { info(&c.get("http://a.test/3").send().await.unwrap()).waits }
    });
    drop(first.await.unwrap());
    // The second waited 2 s for the slot; the third 2 s behind the second, then 2 s for the
    // slot.
    assert_eq!(second.await.unwrap(), waits(z, z, z, 2 * S));
    assert_eq!(third.await.unwrap(), waits(2 * S, z, z, 2 * S));
}

#[tokio::test(start_paused = true)]
async fn a_cost_zero_request_is_not_held_behind_a_quota_wait() {
    let server = FakeServer::ok();
    let throttle = windowed(1, 3 * S).build().unwrap();
    let c = server.client(&throttle);
    let t0 = Instant::now();
    c.get("http://a.test/1").send().await.unwrap();
    let waiting = tokio::spawn({
        let c = c.clone();
        async move { c.get("http://a.test/2").send().await.unwrap() }
    });
    tokio::task::yield_now().await;
    assert_eq!(throttle.stats().queued, 1);
    let free = c
        .get("http://a.test/free")
        .with_extension(Cost(0))
        .send()
        .await
        .unwrap();
    assert_eq!(info(&free).waited, Duration::ZERO);
    waiting.await.unwrap();
    let paths: Vec<_> = server.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(paths, ["/1", "/free", "/2"]);
    assert_eq!(server.sent_at(t0), [Duration::ZERO, Duration::ZERO, 3 * S]);
}

#[tokio::test(start_paused = true)]
async fn a_deadline_the_queue_ahead_cannot_meet_is_told_at_once() {
    let server = FakeServer::ok();
    let throttle = windowed(1, 3 * S).build().unwrap();
    let c = server.client(&throttle);
    c.get("http://a.test/1").send().await.unwrap();
    let waiting = tokio::spawn({
        let c = c.clone();
        async move { c.get("http://a.test/2").send().await.unwrap() }
    });
    tokio::task::yield_now().await;
    let t = Instant::now();
    let err = c
        .get("http://a.test/3")
        .with_extension(Deadline::after(S))
        .send()
        .await
        .unwrap_err();
    assert_eq!(Instant::now(), t, "told at once, not at its deadline");
    assert_eq!(
        ThrottleError::of(&err).cloned(),
        Some(ThrottleError::DeadlineExceeded {
            attempts: 0,
            waited: Duration::ZERO,
            would_wait: Some(3 * S),
            last_error: None,
        })
    );
    waiting.await.unwrap();
    // A deadline the queue ahead can meet still waits.
    let r = c
        .get("http://a.test/4")
        .with_extension(Deadline::after(10 * S))
        .send()
        .await
        .unwrap();
    assert_eq!(info(&r).waits.quota, 3 * S);
}

#[tokio::test(start_paused = true)]
async fn a_smaller_cost_is_not_refused_for_the_wait_of_a_larger_head() {
    let server = FakeServer::ok();
    let throttle = windowed(10, 10 * S).build().unwrap();
    let c = server.client(&throttle);
    let t0 = Instant::now();
    c.get("http://a.test/")
        .with_extension(Cost(5))
        .send()
        .await
        .unwrap();
    tokio::time::sleep(5 * S).await;
    c.get("http://a.test/")
        .with_extension(Cost(5))
        .send()
        .await
        .unwrap();
    // The head needs all 10 units: both sends must leave, at t0 + 15 s.
    let head = tokio::spawn({
        let c = c.clone();
        async move {
            let r = c
                .get("http://a.test/big")
                .with_extension(Cost(10))
                .send()
                .await;
            r.unwrap()
        }
    });
    tokio::task::yield_now().await;
    // 5 units free at t0 + 10 s: a deadline at t0 + 12 s can be met, by a request that goes
    // first (a higher priority).
    let small = c
        .get("http://a.test/small")
        .with_extension(Cost(5))
        .with_extension(reqwest_throttle::Priority::High)
        .with_extension(Deadline(t0 + 12 * S))
        .send()
        .await
        .unwrap();
    assert_eq!(info(&small).waits.quota, 5 * S);
    head.await.unwrap();
    let paths: Vec<_> = server.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(paths, ["/", "/", "/small", "/big"]);
}
