//! The middleware end to end against a mock server, with paused tokio time.

use std::time::Duration;

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_throttle::policy::StopReason;
use reqwest_throttle::store::QuotaName;
use reqwest_throttle::{Cost, NoRetry, Quota, Throttle, ThrottleError, ThrottleInfo};
use tokio::time::Instant;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

mod common;
use common::FakeServer;

const S: Duration = Duration::from_secs(1);

fn client(throttle: &Throttle) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::new())
        .with(throttle.clone())
        .build()
}

fn info(r: &reqwest::Response) -> ThrottleInfo {
    r.extensions()
        .get::<ThrottleInfo>()
        .cloned()
        .expect("every response carries ThrottleInfo")
}

fn too_many(retry_after: &str) -> ResponseTemplate {
    ResponseTemplate::new(429).insert_header("retry-after", retry_after)
}

#[tokio::test(start_paused = true)]
async fn a_429_is_retried_after_retry_after_and_succeeds() {
    let server = MockServer::start().await;
    Mock::given(path("/x"))
        .respond_with(too_many("3"))
        .up_to_n_times(2)
        .mount(&server)
        .await;
    Mock::given(path("/x"))
        .respond_with(ResponseTemplate::new(200).set_body_string("done"))
        .mount(&server)
        .await;
    let throttle = Throttle::builder().jitter(false).build().unwrap();
    let r = client(&throttle)
        .get(format!("{}/x", server.uri()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let i = info(&r);
    assert_eq!(i.attempts, 3);
    assert_eq!(i.waited, 6 * S);
    assert_eq!(i.stopped, None);
    assert_eq!(r.text().await.unwrap(), "done");
    let stats = throttle.stats();
    assert_eq!((stats.sent, stats.responses_429, stats.retries), (3, 2, 2));
}

#[tokio::test(start_paused = true)]
async fn when_retries_run_out_the_last_response_is_returned() {
    let server = MockServer::start().await;
    Mock::given(path("/x"))
        .respond_with(too_many("1").set_body_string("slow down"))
        .expect(3)
        .mount(&server)
        .await;
    let throttle = Throttle::builder()
        .max_retries(2)
        .jitter(false)
        .build()
        .unwrap();
    let r = client(&throttle)
        .post(format!("{}/x", server.uri()))
        .body("payload")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let i = info(&r);
    assert_eq!(i.attempts, 3);
    assert_eq!(i.stopped, Some(StopReason::RetriesExhausted));
    assert_eq!(i.hints.retry_after, Some(S));
    assert_eq!(r.text().await.unwrap(), "slow down");
}

#[tokio::test(start_paused = true)]
async fn server_errors_are_resent_only_when_idempotent() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(503))
        .expect(3)
        .mount(&server)
        .await;
    let throttle = Throttle::builder()
        .max_retries(2)
        .jitter(false)
        .build()
        .unwrap();
    let c = client(&throttle);
    let r = c.post(server.uri()).body("x").send().await.unwrap();
    assert_eq!(info(&r).stopped, Some(StopReason::NotSafeToResend));
    let r = c.get(server.uri()).send().await.unwrap();
    let i = info(&r);
    assert_eq!(i.stopped, Some(StopReason::RetriesExhausted));
    // No hint: backoff 1 s then 2 s.
    assert_eq!(i.waited, 3 * S);
}

#[tokio::test(start_paused = true)]
async fn a_streaming_body_is_sent_once() {
    let server = MockServer::start().await;
    Mock::given(path("/x"))
        .respond_with(too_many("1"))
        .expect(1)
        .mount(&server)
        .await;
    let throttle = Throttle::builder().build().unwrap();
    let r = client(&throttle)
        .post(format!("{}/x", server.uri()))
        .body(reqwest::Body::wrap(String::from("chunk")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(info(&r).stopped, Some(StopReason::BodyNotCloneable));
}

#[tokio::test(start_paused = true)]
async fn no_retry_extension_sends_once() {
    let server = MockServer::start().await;
    Mock::given(path("/x"))
        .respond_with(too_many("1"))
        .expect(1)
        .mount(&server)
        .await;
    let throttle = Throttle::builder().build().unwrap();
    let r = client(&throttle)
        .get(format!("{}/x", server.uri()))
        .with_extension(NoRetry)
        .send()
        .await
        .unwrap();
    assert_eq!(info(&r).stopped, Some(StopReason::RetryDisabled));
}

#[tokio::test(start_paused = true)]
async fn the_permit_is_held_until_the_body_is_done() {
    let server = MockServer::start().await;
    Mock::given(path("/x"))
        .respond_with(ResponseTemplate::new(200).set_body_string("hello"))
        .mount(&server)
        .await;
    let throttle = Throttle::builder().max_in_flight(1).build().unwrap();
    let c = client(&throttle);
    let url = format!("{}/x", server.uri());
    let first = c.get(&url).send().await.unwrap();
    assert_eq!(throttle.stats().in_flight, 1);
    assert_eq!(throttle.stats().available_permits, Some(0));

    let second = tokio::spawn({
        let (c, url) = (c.clone(), url.clone());
        async move { c.get(&url).send().await.unwrap().text().await.unwrap() }
    });
    while throttle.stats().queued == 0 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        throttle.stats().sent,
        1,
        "the second request waits for the permit"
    );

    assert_eq!(first.text().await.unwrap(), "hello");
    assert_eq!(second.await.unwrap(), "hello");
    let stats = throttle.stats();
    assert_eq!((stats.in_flight, stats.queued, stats.sent), (0, 0, 2));
    assert_eq!(stats.available_permits, Some(1));
}

#[tokio::test(start_paused = true)]
async fn dropping_an_unread_response_releases_the_permit() {
    let server = MockServer::start().await;
    Mock::given(path("/x"))
        .respond_with(ResponseTemplate::new(200).set_body_string("hello"))
        .mount(&server)
        .await;
    let throttle = Throttle::builder().max_in_flight(2).build().unwrap();
    let r = client(&throttle)
        .get(format!("{}/x", server.uri()))
        .send()
        .await
        .unwrap();
    assert_eq!(throttle.stats().available_permits, Some(1));
    drop(r);
    assert_eq!(throttle.stats().available_permits, Some(2));
    assert_eq!(throttle.stats().in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn the_response_keeps_its_status_headers_url_and_length() {
    let server = MockServer::start().await;
    Mock::given(path("/x"))
        .respond_with(
            ResponseTemplate::new(201)
                .insert_header("x-custom", "yes")
                .set_body_string("twelve bytes"),
        )
        .mount(&server)
        .await;
    let throttle = Throttle::builder().max_in_flight(4).build().unwrap();
    let url = format!("{}/x?q=1", server.uri());
    let r = client(&throttle).get(&url).send().await.unwrap();
    let plain = reqwest::Client::new().get(&url).send().await.unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(r.url().as_str(), url);
    assert_eq!(r.version(), plain.version());
    assert_eq!(r.content_length(), Some(12));
    assert_eq!(r.remote_addr(), plain.remote_addr());
    assert_eq!(r.headers()["x-custom"], "yes");
    assert_eq!(r.bytes().await.unwrap(), "twelve bytes");
}

#[tokio::test(start_paused = true)]
async fn a_sliding_window_paces_sends() {
    let server = FakeServer::ok();
    let throttle = Throttle::builder()
        .sliding_window(3, 10 * S)
        .window_guard(Duration::ZERO)
        .build()
        .unwrap();
    let c = server.client(&throttle);
    let t0 = Instant::now();
    for _ in 0..7 {
        c.get("http://api.test/x").send().await.unwrap();
    }
    let offsets: Vec<_> = server
        .seen()
        .iter()
        .map(|s| (s.at - t0).as_secs())
        .collect();
    assert_eq!(offsets, vec![0, 0, 0, 10, 10, 10, 20]);
}

#[tokio::test(start_paused = true)]
async fn concurrent_callers_never_exceed_the_window_and_finish_at_the_minimum() {
    let server = FakeServer::ok();
    let throttle = Throttle::builder()
        .sliding_window(10, S)
        .max_in_flight(4)
        .window_guard(Duration::ZERO)
        .build()
        .unwrap();
    let c = server.client(&throttle);
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move { c.get("http://api.test/x").send().await.unwrap().status() })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    let at: Vec<_> = server.seen().iter().map(|s| s.at).collect();
    assert_eq!(at.len(), 50);
    for (i, &start) in at.iter().enumerate() {
        let in_window = at[i..].iter().filter(|&&t| t < start + S).count();
        assert!(
            in_window <= 10,
            "{in_window} sends in the window from send {i}"
        );
    }
    // 50 sends at 10 per second, the first 10 at once: the last goes at 4 s.
    assert_eq!(*at.last().unwrap() - t0, 4 * S);
}

#[tokio::test(start_paused = true)]
async fn a_cost_above_every_quota_fails_at_once() {
    let throttle = Throttle::builder()
        .sliding_window(100, 60 * S)
        .build()
        .unwrap();
    let err = client(&throttle)
        .get("http://127.0.0.1:9/never-sent")
        .with_extension(Cost(101))
        .send()
        .await
        .unwrap_err();
    let reqwest_middleware::Error::Middleware(inner) = err else {
        panic!("expected a middleware error, got {err:?}")
    };
    let quota = QuotaName::SlidingWindow {
        limit: 100,
        window: 60 * S,
    };
    assert_eq!(
        inner.downcast_ref::<ThrottleError>(),
        Some(&ThrottleError::CostExceedsQuota {
            cost: 101,
            capacity: 100,
            quota,
        })
    );
    assert_eq!(
        inner.to_string(),
        "request cost 101 exceeds the capacity 100 of the sliding window of 100 per 60s"
    );
    assert_eq!(throttle.stats().sent, 0);
}

/// The error names the quota a cost can never fit: the one with the smallest capacity,
/// a sliding window or a token bucket.
#[tokio::test(start_paused = true)]
async fn a_cost_too_large_names_the_smallest_quota() {
    let burst = |n| std::num::NonZeroU32::new(n).unwrap();
    let bucket = Quota::with_period(6 * S).unwrap().allow_burst(burst(10));
    let throttle = Throttle::builder()
        .sliding_window(120, 60 * S)
        .token_bucket(bucket)
        .build()
        .unwrap();
    let err = throttle.acquire(11).await.unwrap_err();
    let quota = QuotaName::TokenBucket {
        burst: 10,
        replenish: 6 * S,
    };
    assert_eq!(
        err,
        ThrottleError::CostExceedsQuota {
            cost: 11,
            capacity: 10,
            quota,
        }
    );
    assert_eq!(
        err.to_string(),
        "request cost 11 exceeds the capacity 10 of the token bucket of burst 10, one cell per 6s"
    );

    let throttle = Throttle::builder()
        .token_bucket(Quota::with_period(S).unwrap().allow_burst(burst(500)))
        .sliding_window(120, 60 * S)
        .sliding_window(1000, 3600 * S)
        .build()
        .unwrap();
    assert_eq!(
        throttle.acquire(500).await.unwrap_err().to_string(),
        "request cost 500 exceeds the capacity 120 of the sliding window of 120 per 60s"
    );
    assert_eq!(throttle.stats().sent, 0);
}

#[tokio::test(start_paused = true)]
async fn a_reset_in_the_past_means_retry_now_and_leaves_no_cooldown() {
    let server = MockServer::start().await;
    Mock::given(path("/limited"))
        .respond_with(
            too_many("60")
                .insert_header("rate_limit_type", "requests_per_minute")
                .insert_header("reset_at", "2000-01-01T00:00:00Z"),
        )
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(path("/limited"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    Mock::given(path("/other"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    // A window type whose reset is already past: the reset, not the 60 s Retry-After, counts.
    let throttle = Throttle::builder().jitter(false).build().unwrap();
    let c = client(&throttle);
    let r = c
        .get(format!("{}/limited", server.uri()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(info(&r).attempts, 2);
    // A past reset is zero wait: no cooldown is left for the next caller.
    let r = c
        .get(format!("{}/other", server.uri()))
        .send()
        .await
        .unwrap();
    assert_eq!(info(&r).waited, Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_window_429_closes_the_cooldown_for_other_callers() {
    let server = MockServer::start().await;
    Mock::given(path("/limited"))
        .respond_with(too_many("5").insert_header("rate_limit_type", "requests_per_minute"))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(path("/limited"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    Mock::given(path("/other"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    let throttle = Throttle::builder().jitter(false).build().unwrap();
    let c = client(&throttle);
    let first = tokio::spawn({
        let (c, url) = (c.clone(), format!("{}/limited", server.uri()));
        async move { c.get(url).send().await.unwrap() }
    });
    while throttle.stats().responses_429 == 0 {
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let r = c
        .get(format!("{}/other", server.uri()))
        .send()
        .await
        .unwrap();
    let waited = info(&r).waited;
    assert!(waited > 4 * S && waited <= 5 * S, "{waited:?}");
    assert_eq!(info(&first.await.unwrap()).attempts, 2);
}

#[tokio::test(start_paused = true)]
async fn only_a_capped_scope_counts_an_unread_body_in_flight() {
    let server = FakeServer::new(|_, _| common::json(200, &[], "{\"unread\": true}"));
    for (cap, in_flight) in [(None, 0), (Some(4), 1)] {
        let mut builder = Throttle::builder();
        if let Some(cap) = cap {
            builder = builder.max_in_flight(cap);
        }
        let throttle = builder.build().unwrap();
        let r = server
            .client(&throttle)
            .get("http://a.test/")
            .send()
            .await
            .unwrap();
        assert_eq!(throttle.stats().in_flight, in_flight, "cap {cap:?}");
        assert_eq!(info(&r).attempts, 1);
        assert_eq!(r.text().await.unwrap(), "{\"unread\": true}");
        assert_eq!(throttle.stats().in_flight, 0);
    }
}
