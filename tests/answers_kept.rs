//! Regression tests from an adversarial pass over deadlines, the retry budget, the shared
//! cooldown and the error-body read: an answer in hand is never lost, counters match what
//! the server saw, and a rebuilt response looks as it would without the throttle.

mod common;
#[path = "faults/server.rs"]
mod server;

use std::time::Duration;

use common::{info, json, status, FakeServer};
use reqwest_middleware::ClientBuilder;
use reqwest_throttle::policy::{RetryBudget, StopReason};
use reqwest_throttle::{Deadline, Throttle, ThrottleError};
use server::{head, RawServer, Step};
use tokio::time::Instant;

const S: Duration = Duration::from_secs(1);
const URL: &str = "http://api.test/x";

fn plain() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

fn raw_client(t: &Throttle) -> reqwest_middleware::ClientWithMiddleware {
    ClientBuilder::new(plain()).with(t.clone()).build()
}

fn idle(t: &Throttle) -> (usize, usize, Option<usize>) {
    let s = t.stats();
    (s.in_flight, s.queued, s.available_permits)
}

fn throttle_err(err: &reqwest_middleware::Error) -> Option<ThrottleError> {
    match err {
        reqwest_middleware::Error::Middleware(e) => e.downcast_ref::<ThrottleError>().cloned(),
        _ => None,
    }
}

/// A 403 whose head arrives at once and whose small body (20 bytes) stalls 5 s.
async fn slow_body_403() -> RawServer {
    RawServer::start(|_, _| {
        vec![
            Step::Write(head("403 Forbidden", &[], &[("content-length", b"20")])),
            Step::Write(b"{\"error\":".to_vec()),
            Step::Sleep(5 * S),
            Step::Write(b"\"nope\"}    ".to_vec()),
            Step::Close,
        ]
    })
    .await
}

// a server answer (headers already in) lost as Err when the deadline passes during the
// error-body read.
#[tokio::test(start_paused = true)]
async fn a_deadline_during_the_error_body_read_keeps_the_answer() {
    let server = slow_body_403().await;
    // A plain client gets the 403 at once.
    let t0 = Instant::now();
    let r = plain().get(server.url("/a")).send().await.unwrap();
    assert_eq!(
        (r.status().as_u16(), Instant::now() - t0),
        (403, Duration::ZERO)
    );
    drop(r);

    let throttle = Throttle::builder()
        .max_in_flight(1)
        .jitter(false)
        .deadline(S)
        .build()
        .unwrap();
    let got = raw_client(&throttle).get(server.url("/b")).send().await;
    let status = got
        .as_ref()
        .map(|r| r.status().as_u16())
        .map_err(throttle_err);
    assert_eq!(server.requests(), 2);
    assert_eq!(status, Ok(403));
    drop(got);
    assert_eq!(idle(&throttle), (0, 0, Some(1)));
}

// a stalled small error body: content length differs from a plain client.
#[tokio::test(start_paused = true)]
async fn a_stalled_error_body_keeps_its_content_length() {
    let server = slow_body_403().await;
    let r = plain().get(server.url("/a")).send().await.unwrap();
    let plain_len = r.content_length();
    let plain_body = r.text().await.unwrap();

    let throttle = Throttle::builder().max_in_flight(1).build().unwrap();
    let r = raw_client(&throttle)
        .get(server.url("/b"))
        .send()
        .await
        .unwrap();
    let len = r.content_length();
    let body = r.text().await.unwrap();
    assert_eq!(body, plain_body);
    assert_eq!(idle(&throttle), (0, 0, Some(1)));
    assert_eq!((len, plain_len), (Some(20), Some(20)));
}

// a small error body cut off: content length and error kind.
#[tokio::test(start_paused = true)]
async fn a_cut_error_body_keeps_its_content_length() {
    let server = RawServer::start(|_, _| {
        vec![
            Step::Write(head("403 Forbidden", &[], &[("content-length", b"20")])),
            Step::Write(b"{\"error\":".to_vec()),
            Step::Close,
        ]
    })
    .await;
    let mut r = plain().get(server.url("/a")).send().await.unwrap();
    let plain_len = r.content_length();
    let mut plain_got = Vec::new();
    let plain_err = loop {
        match r.chunk().await {
            Ok(Some(b)) => plain_got.extend_from_slice(&b),
            Ok(None) => panic!("clean end"),
            Err(e) => break e,
        }
    };

    let throttle = Throttle::builder().max_in_flight(1).build().unwrap();
    let mut r = raw_client(&throttle)
        .get(server.url("/b"))
        .send()
        .await
        .unwrap();
    let len = r.content_length();
    let mut got = Vec::new();
    let err = loop {
        match r.chunk().await {
            Ok(Some(b)) => got.extend_from_slice(&b),
            Ok(None) => panic!("clean end"),
            Err(e) => break e,
        }
    };
    assert_eq!(got, plain_got);
    assert_eq!(
        (err.is_body(), err.is_decode()),
        (plain_err.is_body(), plain_err.is_decode()),
        "{err:?} vs {plain_err:?}"
    );
    // The failed body keeps its slot until the response is dropped.
    assert_eq!(idle(&throttle), (1, 0, Some(0)));
    drop(r);
    assert_eq!(idle(&throttle), (0, 0, Some(1)));
    assert_eq!((len, plain_len), (Some(20), Some(20)));
}

// admission that completes exactly at the deadline charges the quota and counts `sent`
// for an attempt that is never sent.
#[tokio::test(start_paused = true)]
async fn admission_at_the_deadline_is_refused_and_charges_nothing() {
    let server = FakeServer::ok();
    let throttle = Throttle::builder()
        .sliding_window(1, S)
        .window_guard(Duration::ZERO)
        .max_in_flight(1)
        .build()
        .unwrap();
    let c = server.client(&throttle);
    let t0 = Instant::now();
    c.get(URL).send().await.unwrap();
    let err = c
        .get(URL)
        .with_extension(Deadline::after(S))
        .send()
        .await
        .unwrap_err();
    let e = throttle_err(&err);
    // The window opens exactly at the deadline: too late to send by it, so refused at once.
    assert_eq!(Instant::now() - t0, Duration::ZERO);
    assert_eq!(idle(&throttle), (0, 0, Some(1)));
    // Nothing was charged: at t0 + 1 s the next request goes without a wait.
    tokio::time::sleep(S).await;
    let r = c.get(URL).send().await.unwrap();
    let waited = info(&r).waited;
    assert_eq!(
        (server.seen().len() as u64, throttle.stats().sent, e, waited),
        (
            2,
            2,
            Some(ThrottleError::DeadlineExceeded {
                attempts: 0,
                waited: Duration::ZERO,
                would_wait: Some(S),
                last_error: None,
            }),
            Duration::ZERO
        )
    );
}

// `retries` counts a retry that was never sent (refused at admission by the deadline).
#[tokio::test(start_paused = true)]
async fn a_retry_refused_by_the_deadline_is_not_counted() {
    let server = FakeServer::new(|_, _| json(503, &[("retry-after", "1")], "{}"));
    let throttle = Throttle::builder()
        .sliding_window(1, 10 * S)
        .window_guard(Duration::ZERO)
        .deadline(5 * S)
        .jitter(false)
        .build()
        .unwrap();
    let r = server.client(&throttle).get(URL).send().await.unwrap();
    assert_eq!(r.status(), 503);
    let i = info(&r);
    let s = throttle.stats();
    assert_eq!(server.seen().len(), 1);
    assert_eq!(
        (i.attempts, s.sent, s.retries, i.stopped),
        (1, 1, 0, Some(StopReason::Deadline))
    );
}

// an answer received is lost when a later attempt fails in transport and the deadline then
// stops the next.
#[tokio::test(start_paused = true)]
async fn an_answer_is_kept_when_a_later_attempt_breaks() {
    let server = RawServer::start(|i, _| {
        if i == 0 {
            server::answer("503 Service Unavailable", &[("retry-after", b"1")], b"{}")
        } else {
            vec![Step::Reset]
        }
    })
    .await;
    let throttle = Throttle::builder()
        .max_in_flight(1)
        .jitter(false)
        .deadline(Duration::from_millis(2500))
        .build()
        .unwrap();
    let got = raw_client(&throttle).get(server.url("/x")).send().await;
    let status = got
        .as_ref()
        .map(|r| r.status().as_u16())
        .map_err(|e| e.to_string());
    assert_eq!(server.requests(), 2);
    assert_eq!(idle(&throttle), (0, 0, Some(1)));
    assert_eq!(status, Ok(503));
}

// Budget: retries of refusals don't draw, failures do.
#[tokio::test(start_paused = true)]
async fn budget_zero_blocks_failure_retries_only() {
    let server = FakeServer::new(|i, _| match i {
        0 => json(429, &[("retry-after", "1")], "{}"),
        1 => json(503, &[], "{}"),
        _ => status(200),
    });
    let throttle = Throttle::builder()
        .jitter(false)
        .retry_budget(Some(RetryBudget {
            ratio: 0.0,
            min_per_second: 0,
            window: 10 * S,
        }))
        .build()
        .unwrap();
    let r = server.client(&throttle).get(URL).send().await.unwrap();
    let s = throttle.stats();
    assert_eq!(r.status(), 503);
    assert_eq!(info(&r).stopped, Some(StopReason::RetryBudgetExhausted));
    assert_eq!(
        (s.sent, s.retries, s.budget_exhausted, s.responses_429),
        (2, 1, 1, 1)
    );
}

// Cooldown: a 200 with 0 remaining closes the gate for others; the wait is exactly the reset.
#[tokio::test(start_paused = true)]
async fn no_requests_remaining_holds_the_next_caller_for_exactly_the_reset() {
    let server = FakeServer::new(|i, _| {
        if i == 0 {
            json(
                200,
                &[
                    ("x-ratelimit-limit-requests", "10"),
                    ("x-ratelimit-remaining-requests", "0"),
                    ("x-ratelimit-reset-requests", "3s"),
                ],
                "{}",
            )
        } else {
            status(200)
        }
    });
    let throttle = Throttle::builder().max_in_flight(2).build().unwrap();
    let c = server.client(&throttle);
    let t0 = Instant::now();
    let r = c.get(URL).send().await.unwrap();
    drop(r);
    let r = c
        .get(URL)
        .with_extension(Deadline::after(4 * S))
        .send()
        .await
        .unwrap();
    assert_eq!(Instant::now() - t0, 3 * S);
    assert_eq!(info(&r).waited, 3 * S);
    drop(r);
    assert_eq!(idle(&throttle), (0, 0, Some(2)));
}

// Deadline overrun: retry sleep plus error body read.
#[tokio::test(start_paused = true)]
async fn deadline_never_overrun_with_slow_bodies() {
    for dl in [1u64, 1500, 2000, 2500, 3999, 4000, 7000] {
        let server = RawServer::start(|_, _| {
            vec![
                Step::Write(head(
                    "429 Too Many Requests",
                    &[("retry-after", b"1")],
                    &[("content-length", b"2")],
                )),
                Step::Sleep(3 * S),
                Step::Write(b"{}".to_vec()),
                Step::Close,
            ]
        })
        .await;
        let throttle = Throttle::builder()
            .max_in_flight(1)
            .jitter(false)
            .build()
            .unwrap();
        let t0 = Instant::now();
        let dl = Duration::from_millis(dl);
        let got = raw_client(&throttle)
            .get(server.url("/x"))
            .with_extension(Deadline::after(dl))
            .send()
            .await;
        assert!(
            Instant::now() - t0 <= dl,
            "{dl:?}: {:?}",
            Instant::now() - t0
        );
        let _ = got.map(drop);
        assert_eq!(idle(&throttle), (0, 0, Some(1)), "{dl:?}");
    }
}

// Odd headers on a 429 + cooldown do not panic, stats stay clean.
#[tokio::test(start_paused = true)]
async fn odd_hints_do_not_panic() {
    let headers: &[&[(&str, &str)]] = &[
        &[("retry-after", "99999999999999999999999")],
        &[("retry-after", "-1")],
        &[("retry-after-ms", "1e400")],
        &[
            ("rate_limit_type", "rpm"),
            ("reset_at", "99999999999999999999"),
        ],
        &[("rate_limit_type", "rpm"), ("retry-after", "0")],
        &[
            ("x-ratelimit-reset-requests", "9999999999h"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-limit-requests", "1"),
        ],
        &[
            ("ratelimit", "\"d\";r=0;t=18446744073709551615"),
            ("ratelimit-policy", "\"d\";q=1;w=1"),
        ],
    ];
    for h in headers {
        let server = FakeServer::new(move |_, _| json(429, h, "{}"));
        let throttle = Throttle::builder()
            .max_in_flight(1)
            .max_server_wait(Duration::MAX)
            .max_retries(1)
            .deadline(10 * S)
            .build()
            .unwrap();
        let t0 = Instant::now();
        let _ = server.client(&throttle).get(URL).send().await;
        assert!(Instant::now() - t0 <= 10 * S);
        assert_eq!(idle(&throttle), (0, 0, Some(1)), "{h:?}");
    }
}

// HEAD answered 429 with a small Content-Length: same content length as a plain client.
#[tokio::test(start_paused = true)]
async fn head_429_content_length() {
    let server = RawServer::start(|_, _| {
        vec![
            Step::Write(head(
                "429 Too Many Requests",
                &[],
                &[("content-length", b"20")],
            )),
            Step::Close,
        ]
    })
    .await;
    let r = plain().head(server.url("/a")).send().await.unwrap();
    let plain_len = r.content_length();
    let throttle = Throttle::builder()
        .max_in_flight(1)
        .max_retries(0)
        .build()
        .unwrap();
    let r = raw_client(&throttle)
        .head(server.url("/b"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.content_length(), plain_len);
    drop(r);
    assert_eq!(idle(&throttle), (0, 0, Some(1)));
}

// The deadline cuts the body read of a newer answer: that newer answer, not the older one, is returned.
#[tokio::test(start_paused = true)]
async fn the_newest_answer_is_returned_at_the_deadline() {
    let server = RawServer::start(|i, _| {
        if i == 0 {
            server::answer("429 Too Many Requests", &[("retry-after", b"1")], b"{}")
        } else {
            vec![
                Step::Write(head("403 Forbidden", &[], &[("content-length", b"20")])),
                Step::Sleep(5 * S),
                Step::Write(vec![b' '; 20]),
                Step::Close,
            ]
        }
    })
    .await;
    let throttle = Throttle::builder()
        .max_in_flight(1)
        .jitter(false)
        .deadline(2 * S)
        .build()
        .unwrap();
    let r = raw_client(&throttle)
        .get(server.url("/x"))
        .send()
        .await
        .unwrap();
    assert_eq!(server.requests(), 2);
    assert_eq!(throttle.stats().responses_429, 1);
    assert_eq!(r.status().as_u16(), 403);
}
