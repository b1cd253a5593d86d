//! The throttle with another retry layer, in the order the README recommends: the retry layer
//! outside (added before the throttle), so that every attempt it makes is admitted by the
//! throttle, and the throttle's own retries off, so that attempts do not multiply.

use std::time::Duration;

use reqwest_middleware::ClientBuilder;
use reqwest_retry::policies::ExponentialBackoff;
use reqwest_retry::RetryTransientMiddleware;
use reqwest_throttle::Throttle;
use tokio::time::Instant;

mod common;
use common::{busiest_window, status, FakeServer};

const WINDOW: Duration = Duration::from_secs(5);

#[tokio::test(start_paused = true)]
async fn a_retry_layer_outside_the_throttle_keeps_every_attempt_inside_the_quota() {
    let server = FakeServer::new(|_, _| status(503));
    // 8 failures in a row: the circuit breaker would open after 5.
    let throttle = Throttle::builder()
        .circuit_breaker(None)
        .sliding_window(3, WINDOW)
        .window_guard(Duration::ZERO)
        .max_retries(0)
        .build()
        .unwrap();
    let retry = ExponentialBackoff::builder().build_with_max_retries(3);
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetryTransientMiddleware::new_with_policy(retry))
        .with(throttle.clone())
        .with(server.clone())
        .build();
    let t0 = Instant::now();
    for _ in 0..2 {
        let r = client.get("http://api.test/x").send().await.unwrap();
        assert_eq!(r.status(), 503);
    }
    let sent = server.sent_at(t0);
    // 2 calls × (1 + 3 retries), not multiplied by the throttle's own retries.
    assert_eq!(sent.len(), 8);
    // Every attempt passed the throttle: counted, and never more than 3 in any 5 s.
    assert_eq!(throttle.stats().sent, 8);
    let sends: Vec<_> = sent.iter().map(|&d| (t0 + d, 1)).collect();
    let (busiest, start) = busiest_window(&sends, WINDOW).unwrap();
    assert!(
        busiest <= 3,
        "{busiest} sends in the window from {start:?}: {sent:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_retry_layer_inside_the_throttle_bypasses_it() {
    // The order the README warns against, shown so the warning stays true.
    let server = FakeServer::new(|_, _| status(503));
    let throttle = Throttle::builder()
        .sliding_window(3, WINDOW)
        .max_retries(0)
        .build()
        .unwrap();
    let retry = ExponentialBackoff::builder().build_with_max_retries(3);
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(throttle.clone())
        .with(RetryTransientMiddleware::new_with_policy(retry))
        .with(server.clone())
        .build();
    client.get("http://api.test/x").send().await.unwrap();
    assert_eq!(server.seen().len(), 4);
    assert_eq!(
        throttle.stats().sent,
        1,
        "the inner retries were neither paced nor counted"
    );
}
