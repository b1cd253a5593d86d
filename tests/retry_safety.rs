//! What may be resent, and how: idempotency keys, identical bytes, non-cloneable bodies.

mod common;

use std::time::Duration;

use common::{info, json, status, FakeServer};
use http::HeaderName;
use reqwest_throttle::policy::StopReason;
use reqwest_throttle::{Throttle, ThrottleError};

const URL: &str = "http://api.test/v1/agents/amy/runs";

fn keyed() -> Throttle {
    Throttle::builder()
        .jitter(false)
        .idempotency_key(HeaderName::from_static("idempotency-key"))
        .build()
        .unwrap()
}

fn unavailable_then_ok() -> FakeServer {
    FakeServer::new(|i, _| {
        if i < 2 {
            json(503, &[], "{}")
        } else {
            status(201)
        }
    })
}

#[tokio::test(start_paused = true)]
async fn a_keyed_post_is_resent_after_503_with_the_same_key_and_bytes() {
    let server = unavailable_then_ok();
    let r = server
        .client(&keyed())
        .post(URL)
        .header("content-type", "application/json")
        .body(r#"{"message":"hi"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(info(&r).attempts, 3);
    let seen = server.seen();
    let key = seen[0].headers["idempotency-key"]
        .to_str()
        .unwrap()
        .to_owned();
    let parsed = uuid::Uuid::parse_str(&key).expect("a UUID");
    assert_eq!(parsed.get_version_num(), 4);
    for s in &seen {
        assert_eq!(s.headers["idempotency-key"], key.as_str());
        assert_eq!(s.body.as_deref(), Some(&br#"{"message":"hi"}"#[..]));
        assert_eq!(
            s.headers, seen[0].headers,
            "identical headers on every attempt"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_key_given_by_the_caller_is_kept_and_a_blank_one_replaced() {
    for (given, kept) in [("order-1", true), ("   ", false)] {
        let server = unavailable_then_ok();
        server
            .client(&keyed())
            .post(URL)
            .header("idempotency-key", given)
            .body("{}")
            .send()
            .await
            .unwrap();
        let seen = server.seen();
        assert_eq!(seen.len(), 3);
        let sent = seen[0].headers["idempotency-key"].to_str().unwrap();
        assert_eq!(sent == given, kept, "{given:?} -> {sent:?}");
        assert!(!sent.trim().is_empty());
    }
}

#[tokio::test(start_paused = true)]
async fn without_a_key_a_post_is_not_resent_after_503() {
    let server = unavailable_then_ok();
    let throttle = Throttle::builder().build().unwrap();
    let r = server
        .client(&throttle)
        .post(URL)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(info(&r).stopped, Some(StopReason::NotSafeToResend));
    assert_eq!(server.seen().len(), 1);
    assert!(server.seen()[0].headers.get("idempotency-key").is_none());
}

#[tokio::test(start_paused = true)]
async fn a_get_is_resent_after_503_without_a_key() {
    let server = unavailable_then_ok();
    let throttle = Throttle::builder().jitter(false).build().unwrap();
    let r = server.client(&throttle).get(URL).send().await.unwrap();
    assert_eq!(r.status(), 201);
    let seen = server.seen();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[2].at - seen[0].at, Duration::from_secs(3));
}

mod deadlines {
    use super::*;
    use reqwest_throttle::{Deadline, ThrottleError};
    use tokio::time::Instant;

    fn deadline_error(err: reqwest_middleware::Error) -> ThrottleError {
        let reqwest_middleware::Error::Middleware(inner) = err else {
            panic!("expected a middleware error, got {err:?}")
        };
        inner.downcast_ref::<ThrottleError>().cloned().unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_wait_past_the_deadline_returns_the_response_at_once() {
        let server = FakeServer::new(|_, _| json(429, &[("retry-after", "5")], "{}"));
        let throttle = Throttle::builder()
            .deadline(Duration::from_secs(3))
            .build()
            .unwrap();
        let t0 = Instant::now();
        let r = server.client(&throttle).get(URL).send().await.unwrap();
        assert_eq!(r.status(), 429);
        assert_eq!(info(&r).stopped, Some(StopReason::Deadline));
        assert_eq!(Instant::now(), t0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_already_received_is_returned_when_the_deadline_stops_its_retry() {
        // The retry wait (1 s) fits in the deadline, but the window is then full until 10 s.
        let server = FakeServer::new(|_, _| json(429, &[("retry-after", "1")], "{}"));
        let throttle = Throttle::builder()
            .sliding_window(2, Duration::from_secs(10))
            .window_guard(Duration::ZERO)
            .deadline(Duration::from_secs(5))
            .jitter(false)
            .build()
            .unwrap();
        let r = server.client(&throttle).get(URL).send().await.unwrap();
        assert_eq!(r.status(), 429);
        let i = info(&r);
        assert_eq!((i.attempts, i.stopped), (2, Some(StopReason::Deadline)));
        assert_eq!(server.seen().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_already_passed_sends_nothing() {
        let server = FakeServer::ok();
        let throttle = Throttle::builder()
            .sliding_window(5, Duration::from_secs(1))
            .build()
            .unwrap();
        let err = server
            .client(&throttle)
            .get(URL)
            .with_extension(Deadline(Instant::now()))
            .send()
            .await
            .unwrap_err();
        assert_eq!(
            deadline_error(err),
            ThrottleError::DeadlineExceeded {
                attempts: 0,
                waited: Duration::ZERO,
                would_wait: None,
                last_error: None,
            }
        );
        assert_eq!(server.seen().len(), 0);
        assert_eq!(throttle.stats().sent, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn durations_too_large_for_the_clock_do_not_panic() {
        let server = FakeServer::ok();
        let throttle = Throttle::builder()
            .deadline(Duration::MAX)
            .sliding_window(1, Duration::MAX)
            .window_guard(Duration::MAX)
            .backoff(Duration::from_secs(1), Duration::MAX)
            .build()
            .unwrap();
        let c = server.client(&throttle);
        let r = c
            .get(URL)
            .with_extension(Deadline::after(Duration::MAX))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        // The window is now full for 100 years: an hour's deadline refuses at once.
        let err = c
            .get(URL)
            .with_extension(Deadline::after(Duration::from_secs(3600)))
            .send()
            .await
            .unwrap_err();
        assert!(matches!(
            deadline_error(err),
            ThrottleError::DeadlineExceeded { attempts: 0, .. }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_quota_that_opens_after_the_deadline_fails_at_once() {
        let server = FakeServer::ok();
        let throttle = Throttle::builder()
            .sliding_window(1, Duration::from_secs(10))
            .build()
            .unwrap();
        let c = server.client(&throttle);
        c.get(URL).send().await.unwrap();
        let t0 = Instant::now();
        let err = c
            .get(URL)
            .with_extension(Deadline::after(Duration::from_secs(2)))
            .send()
            .await
            .unwrap_err();
        assert_eq!(
            deadline_error(err),
            ThrottleError::DeadlineExceeded {
                attempts: 0,
                waited: Duration::ZERO,
                // The window opens 10.1 s after the first send: after the deadline.
                would_wait: Some(Duration::from_millis(10_100)),
                last_error: None,
            }
        );
        assert_eq!(Instant::now(), t0);
        assert_eq!(server.seen().len(), 1);
        // Nothing was charged: the next request waits only for the first send to leave.
        let r = c.get(URL).send().await.unwrap();
        assert_eq!(info(&r).waited, Duration::from_millis(10_100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_answer_is_cut_off_at_the_deadline() {
        let server = FakeServer::ok().with_delay(Duration::from_secs(30));
        let throttle = Throttle::builder().max_in_flight(1).build().unwrap();
        let t0 = Instant::now();
        let err = server
            .client(&throttle)
            .get(URL)
            .with_extension(Deadline::after(Duration::from_secs(4)))
            .send()
            .await
            .unwrap_err();
        assert_eq!(
            deadline_error(err),
            ThrottleError::DeadlineExceeded {
                attempts: 1,
                waited: Duration::ZERO,
                would_wait: None,
                last_error: None,
            }
        );
        assert_eq!(Instant::now() - t0, Duration::from_secs(4));
        assert_eq!(throttle.stats().available_permits, Some(1));
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_for_a_permit_ends_at_the_deadline() {
        // A body not yet read holds the permit (an empty one would release it at once).
        let server = FakeServer::new(|_, _| json(200, &[], "{}"));
        let throttle = Throttle::builder().max_in_flight(1).build().unwrap();
        let c = server.client(&throttle);
        let held = c.get(URL).send().await.unwrap();
        let err = c
            .get(URL)
            .with_extension(Deadline::after(Duration::from_secs(1)))
            .send()
            .await
            .unwrap_err();
        assert_eq!(
            deadline_error(err),
            ThrottleError::DeadlineExceeded {
                attempts: 0,
                waited: Duration::from_secs(1),
                would_wait: None,
                last_error: None,
            }
        );
        assert_eq!(throttle.stats().queued, 0);
        drop(held);
        assert_eq!(throttle.stats().available_permits, Some(1));
    }
}

mod budget {
    use super::*;
    use reqwest_throttle::policy::RetryBudget;

    #[tokio::test(start_paused = true)]
    async fn a_spent_budget_stops_retries_and_says_so() {
        let server = FakeServer::new(|_, _| json(503, &[], "{}"));
        // 15 failures in a row: the circuit breaker would open after 5.
        let throttle = Throttle::builder()
            .circuit_breaker(None)
            .max_retries(1)
            .jitter(false)
            .retry_budget(Some(RetryBudget {
                ratio: 0.5,
                min_per_second: 0,
                window: Duration::from_secs(10),
            }))
            .build()
            .unwrap();
        let c = server.client(&throttle);
        let mut stopped = Vec::new();
        for _ in 0..10 {
            let r = c.get(URL).send().await.unwrap();
            stopped.push(info(&r).stopped);
        }
        let stats = throttle.stats();
        // Requests 1..10 deposit 0.5 each; a retry needs a whole one in hand.
        assert_eq!(stats.retries, 5);
        assert_eq!(stats.budget_exhausted, 5);
        let spent = stopped
            .iter()
            .filter(|s| **s == Some(StopReason::RetryBudgetExhausted))
            .count();
        assert_eq!(spent, 5);
        assert_eq!(server.seen().len(), 15);
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_do_not_draw_on_the_budget() {
        let server = FakeServer::new(|i, _| {
            if i % 2 == 0 {
                json(429, &[("retry-after", "1")], "{}")
            } else {
                status(200)
            }
        });
        let throttle = Throttle::builder()
            .jitter(false)
            .retry_budget(Some(RetryBudget {
                ratio: 0.0,
                min_per_second: 0,
                window: Duration::from_secs(10),
            }))
            .build()
            .unwrap();
        let c = server.client(&throttle);
        for _ in 0..5 {
            let r = c.get(URL).send().await.unwrap();
            assert_eq!((r.status().as_u16(), info(&r).attempts), (200, 2));
        }
        assert_eq!(throttle.stats().budget_exhausted, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_budget_only_max_retries_bounds() {
        let server = FakeServer::new(|_, _| json(503, &[], "{}"));
        let throttle = Throttle::builder()
            .circuit_breaker(None)
            .max_retries(1)
            .jitter(false)
            .retry_budget(None)
            .build()
            .unwrap();
        let c = server.client(&throttle);
        for _ in 0..10 {
            c.get(URL).send().await.unwrap();
        }
        assert_eq!(throttle.stats().retries, 10);
        assert_eq!(throttle.stats().budget_exhausted, 0);
    }
}

mod transport {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_refused_connection_is_retried_for_get_only() {
        // Nothing listens on a port just freed.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}/x");
        let throttle = Throttle::builder()
            .max_retries(2)
            .jitter(false)
            .build()
            .unwrap();
        let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
            .with(throttle.clone())
            .build();
        // After retries: the throttle's error, which asks the last failure.
        let err = client.get(&url).send().await.unwrap_err();
        assert!(!err.is_connect());
        let throttle_err = ThrottleError::of(&err).expect("a ThrottleError after retries");
        assert!(throttle_err.is_connect(), "{throttle_err}");
        assert_eq!(throttle.stats().sent, 3);
        assert!(
            client
                .post(&url)
                .body("x")
                .send()
                .await
                .unwrap_err()
                .is_connect(),
            "a single attempt returns reqwest's error as it is"
        );
        assert_eq!(throttle.stats().sent, 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_permanent_error_is_not_retried() {
        let throttle = Throttle::builder().max_retries(3).build().unwrap();
        let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
            .with(throttle.clone())
            .build();
        // No TLS backend is compiled into this crate's tests, and ftp is no HTTP scheme.
        for url in ["https://127.0.0.1:9/x", "ftp://127.0.0.1/x"] {
            let before = throttle.stats().sent;
            client.get(url).send().await.unwrap_err();
            assert_eq!(throttle.stats().sent - before, 1, "{url}");
        }
    }
}
