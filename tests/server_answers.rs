//! What the throttle does with each kind of server answer, on paused time with an in-process
//! fake server: what is retried, how long it waits, and what is final.

mod common;

use std::time::Duration;

use common::{info, json, status, FakeServer};
use reqwest_throttle::policy::StopReason;
use reqwest_throttle::Throttle;
use tokio::time::Instant;

const S: Duration = Duration::from_secs(1);
const URL: &str = "http://api.test/v1/runs";

fn throttle() -> Throttle {
    Throttle::builder().jitter(false).build().unwrap()
}

/// Sends one POST through a fresh throttle to a server answering `first` once, then 200.
async fn post_once_then_ok(
    first: impl Fn() -> http::Response<reqwest::Body> + Send + Sync + 'static,
) -> (reqwest::Response, FakeServer) {
    let server = FakeServer::new(move |i, _| if i == 0 { first() } else { status(200) });
    let r = server
        .client(&throttle())
        .post(URL)
        .body("{}")
        .send()
        .await
        .unwrap();
    (r, server)
}

fn final_reason(status: u16, code: &str) -> Option<StopReason> {
    Some(StopReason::Final {
        status,
        code: code.to_owned(),
    })
}

#[tokio::test(start_paused = true)]
async fn unauthorized_is_final() {
    let (r, server) = post_once_then_ok(|| json(401, &[("retry-after", "1")], "{}")).await;
    assert_eq!(r.status(), 401);
    assert_eq!(info(&r).stopped, final_reason(401, ""));
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn entitlement_required_is_final_and_its_body_is_kept() {
    let body = r#"{"type":"/errors/entitlement-required","title":"Plan entitlement required.","status":403,"detail":"amy.tokens.month","reason":"limit_reached","limit":100000,"remaining":0}"#;
    let (r, server) = post_once_then_ok(move || json(403, &[], body)).await;
    assert_eq!(r.status(), 403);
    assert_eq!(info(&r).stopped, final_reason(403, "entitlement-required"));
    assert_eq!(r.content_length(), Some(body.len() as u64));
    assert_eq!(r.text().await.unwrap(), body);
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_used_up_quota_is_final() {
    let body = r#"{"error":{"type":"insufficient_quota","code":"insufficient_quota","message":"You exceeded your current quota"}}"#;
    let (r, server) = post_once_then_ok(move || json(429, &[("retry-after", "20")], body)).await;
    assert_eq!(r.status(), 429);
    assert_eq!(info(&r).stopped, final_reason(429, "insufficient_quota"));
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_final_429_does_not_hold_back_other_callers() {
    let body = r#"{"error":{"type":"insufficient_quota","code":"insufficient_quota"}}"#;
    let server = FakeServer::new(move |i, _| {
        if i == 0 {
            json(
                429,
                &[
                    ("rate_limit_type", "tokens_per_minute"),
                    ("retry-after", "60"),
                ],
                body,
            )
        } else {
            status(200)
        }
    });
    let c = server.client(&throttle());
    let r = c.post(URL).body("{}").send().await.unwrap();
    assert_eq!(info(&r).stopped, final_reason(429, "insufficient_quota"));
    let other = c.get(URL).send().await.unwrap();
    assert_eq!(info(&other).waited, Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn idempotency_conflicts_are_final() {
    for code in ["idempotency_key_reused", "run_already_started"] {
        let body = format!(r#"{{"type":"/errors/{code}","status":409}}"#);
        let (r, server) = post_once_then_ok(move || json(409, &[], &body)).await;
        assert_eq!(info(&r).stopped, final_reason(409, code));
        assert_eq!(server.seen().len(), 1, "{code}");
    }
}

#[tokio::test(start_paused = true)]
async fn idempotency_in_progress_is_retried_after_one_second() {
    let body = r#"{"type":"/errors/idempotency_in_progress","status":409}"#;
    let (r, server) = post_once_then_ok(move || json(409, &[("retry-after", "1")], body)).await;
    assert_eq!(r.status(), 200);
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].at - seen[0].at, S);
}

#[tokio::test(start_paused = true)]
async fn overloaded_and_unavailable_are_retried_for_idempotent_requests() {
    for code in [503u16, 529] {
        let server = FakeServer::new(move |i, _| match i {
            0 => json(code, &[("retry-after", "2")], "{}"),
            1 => json(code, &[], "{}"),
            _ => status(200),
        });
        let r = server.client(&throttle()).get(URL).send().await.unwrap();
        assert_eq!(r.status(), 200, "{code}");
        let at: Vec<_> = server.seen().iter().map(|s| s.at).collect();
        // Retry-After 2 s, then no hint: the second backoff step, 2 s.
        assert_eq!((at[1] - at[0], at[2] - at[1]), (2 * S, 2 * S), "{code}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_wait_longer_than_max_server_wait_returns_at_once() {
    let server = FakeServer::new(|_, _| {
        json(
            429,
            &[
                ("retry-after", "3600"),
                ("rate_limit_type", "requests_per_day"),
            ],
            "{}",
        )
    });
    let t0 = Instant::now();
    let r = server.client(&throttle()).get(URL).send().await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(
        info(&r).stopped,
        Some(StopReason::WaitTooLong { asked: 3600 * S })
    );
    assert_eq!(Instant::now(), t0);
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn retry_after_on_a_success_does_not_slow_later_requests() {
    let server = FakeServer::new(|_, _| json(200, &[("retry-after", "30")], "{}"));
    let c = server.client(&throttle());
    for _ in 0..3 {
        c.get(URL).send().await.unwrap();
    }
    let seen = server.seen();
    assert_eq!(seen[2].at, seen[0].at);
}

/// A `200` with `remaining: 0` and a reset `reset` ahead, then answers with room.
fn none_remaining_for(reset: &'static str) -> FakeServer {
    FakeServer::new(move |i, _| {
        let remaining = if i == 0 { "0" } else { "5" };
        json(
            200,
            &[
                ("x-ratelimit-limit-requests", "10"),
                ("x-ratelimit-remaining-requests", remaining),
                ("x-ratelimit-reset-requests", reset),
            ],
            "{}",
        )
    })
}

#[tokio::test(start_paused = true)]
async fn no_requests_remaining_pauses_every_caller_until_the_reset() {
    let server = none_remaining_for("1m30s");
    let c = server.client(&throttle());
    let first = c.get(URL).send().await.unwrap();
    assert_eq!(info(&first).cooldown, Some(Duration::from_secs(90)));
    let later = c.get(URL).send().await.unwrap();
    let seen = server.seen();
    assert_eq!(seen[1].at - seen[0].at, Duration::from_secs(90));
    assert_eq!(info(&later).waited, Duration::from_secs(90));
    assert_eq!(info(&later).cooldown, None);
}

#[tokio::test(start_paused = true)]
async fn a_reset_beyond_max_server_wait_holds_nobody() {
    // 6 minutes, past the default max_server_wait of 120 s: no caller is held in silence;
    // the next goes at once and receives the server's own answer.
    let server = none_remaining_for("6m0s");
    let c = server.client(&throttle());
    let first = c.get(URL).send().await.unwrap();
    assert_eq!(info(&first).cooldown, None);
    let later = c.get(URL).send().await.unwrap();
    let seen = server.seen();
    assert_eq!(seen[1].at - seen[0].at, Duration::ZERO);
    assert_eq!(info(&later).waited, Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_parallel_limit_429_backs_off_without_pausing_others() {
    let server = FakeServer::new(|i, req| {
        if i == 0 && req.url().path() == "/busy" {
            json(
                429,
                &[
                    ("retry-after", "60"),
                    ("rate_limit_type", "parallel_requests"),
                ],
                "{}",
            )
        } else {
            status(200)
        }
    });
    let t = throttle();
    let c = server.client(&t);
    let r = c.get("http://api.test/busy").send().await.unwrap();
    assert_eq!(info(&r).attempts, 2);
    // Backoff from 1 s (not the 60 s upper bound), and no shared cooldown left behind.
    assert_eq!(info(&r).waited, S);
    let other = c.get(URL).send().await.unwrap();
    assert_eq!(info(&other).waited, Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn no_tokens_remaining_pauses_every_caller_until_the_tokens_reset() {
    let server = FakeServer::new(|i, _| {
        let remaining = if i == 0 { "0" } else { "5000" };
        json(
            200,
            &[
                ("x-ratelimit-limit-tokens", "10000"),
                ("x-ratelimit-remaining-tokens", remaining),
                ("x-ratelimit-reset-tokens", "20s"),
            ],
            "{}",
        )
    });
    let c = server.client(&throttle());
    let first = c.get(URL).send().await.unwrap();
    assert_eq!(info(&first).cooldown, Some(Duration::from_secs(20)));
    let later = c.get(URL).send().await.unwrap();
    assert_eq!(info(&later).waits.cooldown, Duration::from_secs(20));
}

#[tokio::test(start_paused = true)]
async fn x_should_retry_false_makes_an_answer_final() {
    let server = FakeServer::new(|_, _| json(503, &[("x-should-retry", "false")], "{}"));
    let r = server.client(&throttle()).get(URL).send().await.unwrap();
    let i = info(&r);
    assert_eq!((r.status().as_u16(), i.attempts), (503, 1));
    assert_eq!(i.stopped, Some(StopReason::ServerSaidNoRetry));
}

#[tokio::test(start_paused = true)]
async fn x_should_retry_true_lets_a_post_be_sent_again() {
    let (r, _) = post_once_then_ok(|| json(503, &[("x-should-retry", "true")], "{}")).await;
    assert_eq!((r.status().as_u16(), info(&r).attempts), (200, 2));
}

#[tokio::test(start_paused = true)]
async fn a_403_rate_limit_is_waited_out_and_pauses_the_scope() {
    // GitHub-style primary limit: 403 with 0 remaining and a reset in epoch seconds.
    let server = FakeServer::new(|i, _| match i {
        0 => json(
            403,
            &[
                ("x-ratelimit-limit", "5000"),
                ("x-ratelimit-remaining", "0"),
                ("retry-after", "30"),
            ],
            "{}",
        ),
        _ => status(200),
    });
    let c = server.client(&throttle());
    let t0 = Instant::now();
    let r = c.get(URL).send().await.unwrap();
    assert_eq!((r.status().as_u16(), info(&r).attempts), (200, 2));
    assert_eq!(
        server.sent_at(t0),
        [Duration::ZERO, Duration::from_secs(30)]
    );
    // A 403 without such a signal is a refusal of access: returned at once.
    let server = FakeServer::new(|_, _| json(403, &[], "{}"));
    let r = server.client(&throttle()).get(URL).send().await.unwrap();
    assert_eq!((r.status().as_u16(), info(&r).attempts), (403, 1));
}
