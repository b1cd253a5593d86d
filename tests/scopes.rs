//! Scopes end to end, with paused time: each scope has its own quotas, cap and cooldown, a
//! refusal from one never slows another, header values never show, and idle scopes go.

use std::time::Duration;

use http::HeaderName;
use reqwest_throttle::{Priority, Scope, Throttle};
use tokio::time::Instant;

mod common;
use common::{info, json, status, windowed, FakeServer};

const S: Duration = Duration::from_secs(1);

/// The labels of the live scopes, sorted.
fn labels(throttle: &Throttle) -> Vec<String> {
    let mut labels: Vec<_> = throttle
        .scope_stats()
        .into_iter()
        .map(|s| s.label)
        .collect();
    labels.sort();
    labels
}

/// `429` with a window-type limit and `Retry-After: 30` for host `a.test`, `200` otherwise.
fn a_refuses() -> FakeServer {
    FakeServer::new(|_, req| match req.url().host_str() {
        Some("a.test") => json(
            429,
            &[
                ("retry-after", "30"),
                ("rate_limit_type", "requests_per_minute"),
            ],
            "{}",
        ),
        _ => status(200),
    })
}

#[tokio::test(start_paused = true)]
async fn a_refusal_from_one_host_does_not_slow_another() {
    let server = a_refuses();
    let throttle = Throttle::builder().max_retries(0).build().unwrap();
    let c = server.client(&throttle);
    let t0 = Instant::now();
    let refused = c.get("http://a.test/v1").send().await.unwrap();
    assert_eq!(refused.status(), 429);
    // Host B is answered at once, though A's cooldown runs for 30 s.
    let r = c.get("http://b.test/files/1").send().await.unwrap();
    assert_eq!(
        (r.status().as_u16(), info(&r).waited),
        (200, Duration::ZERO)
    );
    // Host A's next request waits for the cooldown.
    let again = c.get("http://a.test/v1").send().await.unwrap();
    assert_eq!(info(&again).waited, 30 * S);
    let at = server.sent_at(t0);
    assert_eq!(at, [Duration::ZERO, Duration::ZERO, 30 * S]);
}

#[tokio::test(start_paused = true)]
async fn a_global_scope_shares_the_cooldown() {
    let server = a_refuses();
    let throttle = Throttle::builder()
        .scope(Scope::global())
        .max_retries(0)
        .build()
        .unwrap();
    let c = server.client(&throttle);
    c.get("http://a.test/v1").send().await.unwrap();
    let r = c.get("http://b.test/").send().await.unwrap();
    assert_eq!(info(&r).waited, 30 * S);
}

#[tokio::test(start_paused = true)]
async fn each_scope_has_its_own_quota() {
    let server = FakeServer::ok();
    let throttle = windowed(2, 10 * S).build().unwrap();
    let c = server.client(&throttle);
    let t0 = Instant::now();
    for host in ["a.test", "b.test", "a.test", "b.test", "a.test", "b.test"] {
        c.get(format!("http://{host}/")).send().await.unwrap();
    }
    let at = server.sent_at(t0);
    let z = Duration::ZERO;
    assert_eq!(at, [z, z, z, z, 10 * S, 10 * S]);
}

#[tokio::test(start_paused = true)]
async fn scopes_per_api_key_never_keep_the_key() {
    let server = FakeServer::new(|_, req| {
        let key = req.headers().get("authorization").unwrap();
        if key == "Bearer key-one-secret" {
            json(
                429,
                &[("retry-after", "30"), ("rate_limit_type", "rpm")],
                "{}",
            )
        } else {
            status(200)
        }
    });
    let throttle = Throttle::builder()
        .scope(Scope::per_header(HeaderName::from_static("authorization")))
        .max_in_flight(1)
        .max_retries(0)
        .build()
        .unwrap();
    let c = server.client(&throttle);
    let send = |key: &'static str| {
        c.get("http://api.test/v1")
            .header("authorization", key)
            .send()
    };
    assert_eq!(send("Bearer key-one-secret").await.unwrap().status(), 429);
    // Another key, same host: its own scope, answered at once.
    let r = send("Bearer key-two-secret").await.unwrap();
    assert_eq!(info(&r).waited, Duration::ZERO);
    // Key one waits for its own cooldown.
    let r1 = send("Bearer key-one-secret").await.unwrap();
    assert_eq!((r1.status().as_u16(), info(&r1).waited), (429, 30 * S));
    // Unread, the refusal's small body holds key one's only in-flight slot.
    let one_busy = throttle
        .scope_stats()
        .iter()
        .filter(|s| s.in_flight == 1)
        .count();
    assert_eq!(one_busy, 1);
    drop((r, r1));
    let stats = throttle.scope_stats();
    assert_eq!(stats.len(), 2);
    for s in &stats {
        assert!(s.label.starts_with("authorization=#"), "{}", s.label);
        assert!(!s.label.contains("secret"), "{}", s.label);
        assert_eq!((s.in_flight, s.available_permits), (0, Some(1)));
    }
    assert_eq!(stats.iter().map(|s| s.sent).sum::<u64>(), 3);
    let debug = format!("{throttle:?} {stats:?}");
    assert!(!debug.contains("secret"), "{debug}");
}

#[tokio::test(start_paused = true)]
async fn idle_scopes_are_forgotten_after_their_ttl() {
    let server = FakeServer::ok();
    let throttle = Throttle::builder()
        .sliding_window(5, 10 * S)
        .scope_idle_ttl(60 * S)
        .build()
        .unwrap();
    let c = server.client(&throttle);
    for host in ["a.test", "b.test", "c.test"] {
        c.get(format!("http://{host}/")).send().await.unwrap();
    }
    assert_eq!(throttle.stats().scopes, 3);
    tokio::time::advance(30 * S).await;
    c.get("http://a.test/").send().await.unwrap();
    assert_eq!(throttle.stats().scopes, 3, "not yet idle for the TTL");
    tokio::time::advance(61 * S).await;
    c.get("http://d.test/").send().await.unwrap();
    // b and c were idle for 91 s; a for 61 s; d is new.
    assert_eq!(labels(&throttle), ["http://d.test:80"]);
}

#[tokio::test(start_paused = true)]
async fn a_scope_with_sends_in_its_window_is_not_forgotten() {
    let server = FakeServer::ok();
    let throttle = windowed(1, 600 * S).scope_idle_ttl(60 * S).build().unwrap();
    let c = server.client(&throttle);
    let t0 = Instant::now();
    c.get("http://a.test/").send().await.unwrap();
    tokio::time::advance(120 * S).await;
    c.get("http://b.test/").send().await.unwrap();
    assert_eq!(
        throttle.stats().scopes,
        2,
        "a's window still counts its send"
    );
    // Had a been forgotten, this would go at once, over the server's limit.
    c.get("http://a.test/").send().await.unwrap();
    let last = server.seen().last().unwrap().at;
    assert_eq!(last - t0, 600 * S);
}

#[tokio::test(start_paused = true)]
async fn at_the_cap_busy_scopes_share_the_overflow_scope() {
    let server = FakeServer::ok();
    let throttle = windowed(1, 60 * S).max_scopes(2).build().unwrap();
    let c = server.client(&throttle);
    let t0 = Instant::now();
    for host in ["a.test", "b.test", "c.test", "d.test"] {
        c.get(format!("http://{host}/")).send().await.unwrap();
    }
    // a and b have their own scopes; c and d share the overflow scope and its window.
    assert_eq!(throttle.stats().scopes, 2);
    let at = server.sent_at(t0);
    let z = Duration::ZERO;
    assert_eq!(at, [z, z, z, 60 * S]);
    assert_eq!(
        labels(&throttle),
        ["(overflow)", "http://a.test:80", "http://b.test:80"]
    );
}

#[tokio::test(start_paused = true)]
async fn at_the_cap_idle_scopes_make_room() {
    let server = FakeServer::ok();
    let throttle = Throttle::builder().max_scopes(2).build().unwrap();
    let c = server.client(&throttle);
    for host in ["a.test", "b.test", "c.test", "d.test"] {
        c.get(format!("http://{host}/")).send().await.unwrap();
    }
    assert_eq!(labels(&throttle), ["http://c.test:80", "http://d.test:80"]);
}

#[tokio::test(start_paused = true)]
async fn acquire_for_shares_the_scope_of_a_request() {
    let server = FakeServer::new(|_, _| json(200, &[], "{\"unread\": true}"));
    let throttle = Throttle::builder().max_in_flight(1).build().unwrap();
    let c = server.client(&throttle);
    // Unread, the answer holds a.test's only slot.
    let held = c.get("http://a.test/v1").send().await.unwrap();
    let to_a = reqwest::Request::new(http::Method::GET, "http://a.test/batch".parse().unwrap());
    let to_b = reqwest::Request::new(http::Method::GET, "http://b.test/".parse().unwrap());
    // Another scope, and the unkeyed scope of `acquire`, are free.
    drop(
        throttle
            .acquire_for(&to_b, 1, Priority::Normal)
            .await
            .unwrap(),
    );
    drop(throttle.acquire(1).await.unwrap());
    let waiting = tokio::spawn({
        let throttle = throttle.clone();
        async move {
            throttle
                .acquire_for(&to_a, 1, Priority::Normal)
                .await
                .map(drop)
        }
    });
    tokio::time::sleep(10 * S).await;
    assert!(!waiting.is_finished(), "a.test's slot is held");
    drop(held);
    waiting.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn idle_scopes_are_gone_from_the_stats_without_new_traffic() {
    let server = FakeServer::ok();
    let throttle = Throttle::builder().scope_idle_ttl(60 * S).build().unwrap();
    let c = server.client(&throttle);
    for host in ["a.test", "b.test"] {
        c.get(format!("http://{host}/")).send().await.unwrap();
    }
    assert_eq!(labels(&throttle), ["http://a.test:80", "http://b.test:80"]);
    tokio::time::advance(91 * S).await;
    assert_eq!(labels(&throttle), Vec::<String>::new());
    assert_eq!(throttle.stats().scopes, 0);
}
