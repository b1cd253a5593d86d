//! Token budgets that settle: a request's `Cost` is an estimate; the answer's true figure
//! (settled by the caller through the response's `Charge`, or by a builder hook) and the
//! server's report of tokens remaining correct the token windows.

use std::time::Duration;

use reqwest_throttle::{Charge, Cost, Throttle};
use tokio::time::Instant;

mod common;
use common::{json, status, FakeServer};

const WINDOW: Duration = Duration::from_secs(10);

/// A throttle with a token window of `limit` per 10 s, no guard.
fn tokens(limit: u32) -> reqwest_throttle::ThrottleBuilder {
    Throttle::builder()
        .token_window(limit, WINDOW)
        .window_guard(Duration::ZERO)
}

async fn send(client: &reqwest_middleware::ClientWithMiddleware, cost: u32) -> reqwest::Response {
    client
        .post("http://api.test/v1/chat")
        .with_extension(Cost(cost))
        .send()
        .await
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_caller_settles_a_response_charge_and_the_window_is_refunded() {
    let server = FakeServer::ok();
    let throttle = tokens(100).build().unwrap();
    let client = server.client(&throttle);
    let t0 = Instant::now();
    let r = send(&client, 60).await;
    let charge = r.extensions().get::<Charge>().cloned().unwrap();
    assert_eq!(charge.estimate(), 60);
    drop(r);
    charge.settle(10).await.unwrap();
    // 10 used, 90 fit at once; without the refund they would wait for the window.
    send(&client, 90).await;
    // Settled once: settling again gives nothing more back.
    charge.settle(0).await.unwrap();
    send(&client, 1).await;
    assert_eq!(server.sent_at(t0), [Duration::ZERO, Duration::ZERO, WINDOW]);
}

#[tokio::test(start_paused = true)]
async fn without_settling_the_estimate_stands() {
    let server = FakeServer::ok();
    let throttle = tokens(100).build().unwrap();
    let client = server.client(&throttle);
    let t0 = Instant::now();
    send(&client, 60).await;
    send(&client, 90).await;
    assert_eq!(server.sent_at(t0), [Duration::ZERO, WINDOW]);
}

#[tokio::test(start_paused = true)]
async fn a_header_hook_settles_every_answer_before_it_is_returned() {
    let server = FakeServer::new(|_, _| json(200, &[("x-usage-tokens", "95")], "{}"));
    let throttle = tokens(100)
        .settle_from_headers(|h| h.get("x-usage-tokens")?.to_str().ok()?.parse().ok())
        .build()
        .unwrap();
    let client = server.client(&throttle);
    let t0 = Instant::now();
    send(&client, 10).await;
    // 95 counted, not 10: the next 10 wait for the first send to leave the window.
    send(&client, 10).await;
    assert_eq!(server.sent_at(t0), [Duration::ZERO, WINDOW]);
}

#[tokio::test(start_paused = true)]
async fn fewer_tokens_remaining_on_the_server_lower_the_local_count() {
    let server = FakeServer::new(|i, _| match i {
        0 => json(200, &[("x-ratelimit-remaining-tokens", "20")], "{}"),
        _ => status(200),
    });
    let throttle = tokens(100).build().unwrap();
    let client = server.client(&throttle);
    let t0 = Instant::now();
    send(&client, 10).await;
    // 90 left locally, 20 by the server: 20 go at once, 21 would not.
    send(&client, 20).await;
    send(&client, 1).await;
    assert_eq!(server.sent_at(t0), [Duration::ZERO, Duration::ZERO, WINDOW]);
}

#[tokio::test(start_paused = true)]
async fn more_tokens_remaining_on_the_server_change_nothing() {
    let server = FakeServer::new(|_, _| {
        json(
            200,
            &[("anthropic-ratelimit-tokens-remaining", "1000")],
            "{}",
        )
    });
    let throttle = tokens(100).build().unwrap();
    let client = server.client(&throttle);
    let t0 = Instant::now();
    send(&client, 60).await;
    send(&client, 41).await;
    assert_eq!(server.sent_at(t0), [Duration::ZERO, WINDOW]);
}

#[tokio::test(start_paused = true)]
async fn a_requests_window_counts_requests_while_the_token_window_counts_their_cost() {
    let server = FakeServer::ok();
    let throttle = tokens(1_000).requests_window(2, WINDOW).build().unwrap();
    let client = server.client(&throttle);
    let t0 = Instant::now();
    // Costs far above 2 pass the requests window: it counts 1 each.
    let r = send(&client, 400).await;
    r.extensions()
        .get::<Charge>()
        .unwrap()
        .settle(0)
        .await
        .unwrap();
    send(&client, 400).await;
    // Third request: the requests window is full (the settlement refunds tokens only).
    send(&client, 400).await;
    assert_eq!(server.sent_at(t0), [Duration::ZERO, Duration::ZERO, WINDOW]);
}

#[tokio::test(start_paused = true)]
async fn a_plain_sliding_window_is_not_lowered_by_a_token_report() {
    let server = FakeServer::new(|_, _| json(200, &[("x-ratelimit-remaining-tokens", "0")], "{}"));
    let throttle = Throttle::builder()
        .sliding_window(3, WINDOW)
        .window_guard(Duration::ZERO)
        .build()
        .unwrap();
    let client = server.client(&throttle);
    let t0 = Instant::now();
    for _ in 0..3 {
        send(&client, 1).await;
    }
    assert_eq!(server.sent_at(t0), [Duration::ZERO; 3]);
}

/// A hook reading `usage.total_tokens` from a JSON body.
fn usage(body: &[u8]) -> Option<u32> {
    let json: serde_json::Value = serde_json::from_slice(body).ok()?;
    u32::try_from(json["usage"]["total_tokens"].as_u64()?).ok()
}

const USAGE_10: &str = r#"{"id":"x","usage":{"total_tokens":10}}"#;

#[tokio::test(start_paused = true)]
async fn a_body_hook_settles_once_the_caller_has_read_the_whole_body_unchanged() {
    let server = FakeServer::new(|_, _| json(200, &[], USAGE_10));
    let throttle = tokens(100).settle_from_body(1024, usage).build().unwrap();
    let client = server.client(&throttle);
    let t0 = Instant::now();
    let r = send(&client, 60).await;
    assert_eq!(r.content_length(), Some(USAGE_10.len() as u64));
    // The caller reads the body, whole and once.
    assert_eq!(r.bytes().await.unwrap(), USAGE_10.as_bytes());
    // Settled at 10: 90 fit at once.
    send(&client, 90).await;
    send(&client, 1).await;
    assert_eq!(server.sent_at(t0), [Duration::ZERO, Duration::ZERO, WINDOW]);
}

#[tokio::test(start_paused = true)]
async fn a_body_dropped_unread_or_longer_than_the_bound_settles_nothing() {
    let server = FakeServer::new(|_, _| json(200, &[], USAGE_10));
    for max_bytes in [1024, 8] {
        let throttle = tokens(100)
            .settle_from_body(max_bytes, usage)
            .build()
            .unwrap();
        let client = server.client(&throttle);
        server.forget();
        let t0 = Instant::now();
        let r = send(&client, 60).await;
        if max_bytes == 8 {
            // Read whole, but past the bound: the hook is not called.
            assert_eq!(r.bytes().await.unwrap(), USAGE_10.as_bytes());
        } else {
            drop(r);
        }
        send(&client, 90).await;
        assert_eq!(server.sent_at(t0), [Duration::ZERO, WINDOW], "{max_bytes}");
    }
}
