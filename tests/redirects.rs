//! Answers that come after a redirect (followed by reqwest, below the throttle): the first hop
//! ran, so only a request that is safe to send again is resent. A real server (wiremock) on
//! loopback, paused time.

use std::time::Duration;

use reqwest_throttle::{StopReason, Throttle};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

mod common;
use common::info;

fn client(throttle: &Throttle) -> reqwest_middleware::ClientWithMiddleware {
    reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(throttle.clone())
        .build()
}

/// `from` answers `303 See Other` to `/jobs/7`, which answers `429` with `Retry-After: 1`.
async fn redirect_to_a_refusal(from: &str, verb: &str) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method(verb))
        .and(path(from))
        .respond_with(ResponseTemplate::new(303).insert_header("location", "/jobs/7"))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/jobs/7"))
        .respond_with(ResponseTemplate::new(429).insert_header("retry-after", "1"))
        .mount(&server)
        .await;
    server
}

/// The requests the server saw, as `METHOD /path`.
async fn seen(server: &MockServer) -> Vec<String> {
    let requests = server.received_requests().await.unwrap_or_default();
    requests
        .iter()
        .map(|r| format!("{} {}", r.method, r.url.path()))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_post_answered_after_a_redirect_is_not_resent() {
    let server = redirect_to_a_refusal("/jobs", "POST").await;
    let throttle = Throttle::builder().jitter(false).build().unwrap();
    let r = client(&throttle)
        .post(format!("{}/jobs", server.uri()))
        .body("{}")
        .send()
        .await
        .unwrap();
    let i = info(&r);
    assert_eq!((r.status().as_u16(), i.attempts), (429, 1));
    assert_eq!(i.stopped, Some(StopReason::RanBeforeRedirect));
    assert_eq!(seen(&server).await, ["POST /jobs", "GET /jobs/7"]);
    // The redirect hops are one admission: the throttle counts the request once.
    assert_eq!(throttle.stats().sent, 1);
}

#[tokio::test(start_paused = true)]
async fn a_get_answered_after_a_redirect_may_be_resent() {
    let server = redirect_to_a_refusal("/report", "GET").await;
    let throttle = Throttle::builder()
        .max_retries(1)
        .jitter(false)
        .build()
        .unwrap();
    let r = client(&throttle)
        .get(format!("{}/report", server.uri()))
        .send()
        .await
        .unwrap();
    let i = info(&r);
    assert_eq!((r.status().as_u16(), i.attempts), (429, 2));
    assert_eq!(i.waits.retry, Duration::from_secs(1));
    assert_eq!(
        seen(&server).await,
        ["GET /report", "GET /jobs/7", "GET /report", "GET /jobs/7"]
    );
}
