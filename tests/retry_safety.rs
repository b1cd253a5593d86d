//! What may be resent, and how: idempotency keys, identical bytes, non-cloneable bodies.

mod common;

use std::time::Duration;

use common::{info, json, status, FakeServer};
use http::HeaderName;
use reqwest_throttle::policy::StopReason;
use reqwest_throttle::Throttle;

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
