//! The simulated gateway over real loopback HTTP, on a paused tokio clock.

use std::time::{Duration, SystemTime};

use reqwest::{Client, Response, StatusCode};
use reqwest_throttle::testing::{Gateway, GatewayConfig, GatewayStats};

/// A client that neither uses a proxy nor keeps idle connections, so every request opens
/// a fresh loopback connection and no pooled connection outlives a clock jump.
fn client() -> Client {
    Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client builds")
}

async fn send(client: &Client, url: String, user: Option<&str>) -> Response {
    let mut request = client.post(url).body("{}");
    if let Some(user) = user {
        request = request.header("authorization", user);
    }
    request.send().await.expect("gateway answers")
}

async fn chat(client: &Client, gw: &Gateway, user: Option<&str>) -> Response {
    send(client, format!("{}/v1/chat", gw.url()), user).await
}

/// The three rate-limit headers of a 429, parsed.
#[derive(Debug)]
struct Refusal {
    retry_after: u64,
    limit_type: String,
    reset_at: jiff::Timestamp,
    error_type: String,
}

async fn refusal(response: Response) -> Refusal {
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .unwrap_or_else(|| panic!("429 without {name}"))
            .to_str()
            .expect("ASCII header")
            .to_owned()
    };
    let retry_after = header("retry-after");
    assert!(
        !retry_after.is_empty() && retry_after.bytes().all(|b| b.is_ascii_digit()),
        "retry-after {retry_after:?} is not whole seconds"
    );
    let limit_type = header("rate_limit_type");
    let reset_at: jiff::Timestamp = header("reset_at").parse().expect("reset_at is RFC 3339");
    assert_eq!(
        reset_at.subsec_nanosecond() % 1_000_000,
        0,
        "reset_at has whole milliseconds"
    );
    assert!(header("reset_at").ends_with('Z'), "reset_at is UTC");
    let body: serde_json::Value =
        serde_json::from_slice(&response.bytes().await.expect("429 body")).expect("JSON body");
    Refusal {
        retry_after: retry_after.parse().expect("digits"),
        limit_type,
        reset_at,
        error_type: body["error"]["type"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    }
}

/// Seconds from the wall clock now until `at`.
fn wall_seconds_until(at: jiff::Timestamp) -> i64 {
    let now = jiff::Timestamp::try_from(SystemTime::now()).expect("wall clock");
    at.as_second() - now.as_second()
}

/// Waits (on the tokio clock) until `done` holds, checking every millisecond.
async fn wait_for(mut done: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("condition not reached");
}

#[tokio::test(start_paused = true)]
async fn window_limit_refuses_with_headers_and_clears_after_the_window() {
    let gw = Gateway::start(
        GatewayConfig::default()
            .with_requests_per_window(3)
            .with_window(Duration::from_secs(60))
            .with_service_time(Duration::ZERO),
    )
    .unwrap();
    let client = client();
    let start = tokio::time::Instant::now();
    // Arrivals at 0 s, 10 s, 10 s.
    assert_eq!(chat(&client, &gw, Some("Bearer a")).await.status(), 200);
    tokio::time::sleep(Duration::from_secs(10)).await;
    for _ in 0..2 {
        assert_eq!(chat(&client, &gw, Some("Bearer a")).await.status(), 200);
    }
    let r = refusal(chat(&client, &gw, Some("Bearer a")).await).await;
    assert_eq!(r.retry_after, 60);
    assert_eq!(r.limit_type, "requests_per_minute");
    assert_eq!(r.error_type, "rate_limit_error");
    // The limit clears when the arrival at 0 s leaves the window: 50 s from now.
    let until = wall_seconds_until(r.reset_at);
    assert!((49..=51).contains(&until), "reset_at {until} s away");

    let expected = GatewayStats {
        requests: 4,
        admitted: 3,
        responses_429: 1,
        refused_window: 1,
        peak_parallel: 1,
        peak_parallel_attempted: 1,
        max_in_window: 3,
        ..GatewayStats::default()
    };
    assert_eq!(gw.stats(), expected);

    // At 60 s one request fits again; the next waits for the arrivals at 10 s.
    tokio::time::sleep_until(start + Duration::from_secs(60)).await;
    assert_eq!(chat(&client, &gw, Some("Bearer a")).await.status(), 200);
    let r = refusal(chat(&client, &gw, Some("Bearer a")).await).await;
    assert_eq!(r.limit_type, "requests_per_minute");
    let until = wall_seconds_until(r.reset_at);
    assert!((9..=11).contains(&until), "reset_at {until} s away");
    assert_eq!(gw.stats().admitted, 4);
    assert_eq!(gw.stats().refused_window, 2);
    assert_eq!(gw.stats().max_in_window, 3);
}

#[tokio::test(start_paused = true)]
async fn users_are_keyed_by_authorization_and_anonymous_is_one_user() {
    let gw = Gateway::start(GatewayConfig::default().with_requests_per_window(1)).unwrap();
    let client = client();
    assert_eq!(chat(&client, &gw, None).await.status(), 200);
    assert_eq!(chat(&client, &gw, None).await.status(), 429);
    assert_eq!(chat(&client, &gw, Some("Bearer a")).await.status(), 200);
    assert_eq!(chat(&client, &gw, Some("Bearer b")).await.status(), 200);
    assert_eq!(chat(&client, &gw, Some("Bearer a")).await.status(), 429);
    assert_eq!(gw.stats().admitted, 3);
    assert_eq!(gw.stats().refused_window, 2);
}

#[tokio::test(start_paused = true)]
async fn parallel_limit_refuses_while_requests_are_in_progress() {
    let gw = Gateway::start(
        GatewayConfig::default()
            .with_max_parallel(2)
            .with_service_time(Duration::from_secs(10)),
    )
    .unwrap();
    let client = client();
    let url = format!("{}/v1/chat", gw.url());
    let in_flight: Vec<_> = (0..2)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move { send(&client, url, Some("Bearer a")).await.status() })
        })
        .collect();
    wait_for(|| gw.stats().admitted == 2).await;

    let r = refusal(chat(&client, &gw, Some("Bearer a")).await).await;
    assert_eq!(r.limit_type, "parallel_requests");
    assert_eq!(r.retry_after, 60);
    assert_eq!(r.error_type, "rate_limit_error");
    let until = wall_seconds_until(r.reset_at);
    assert!((59..=61).contains(&until), "reset_at {until} s away");
    // Another user has its own slots.
    let other = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { send(&client, url, Some("Bearer b")).await.status() }
    });

    for task in in_flight {
        assert_eq!(task.await.unwrap(), 200);
    }
    assert_eq!(other.await.unwrap(), 200);
    // Both slots were given back before the answers arrived.
    assert_eq!(chat(&client, &gw, Some("Bearer a")).await.status(), 200);

    let s = gw.stats();
    assert_eq!(s.requests, 5);
    assert_eq!(s.admitted, 4);
    assert_eq!(s.refused_parallel, 1);
    assert_eq!(s.refused_window, 0);
    assert_eq!(s.responses_429, 1);
    assert_eq!(s.peak_parallel, 2);
    assert_eq!(s.peak_parallel_attempted, 3);
    // Per user: "Bearer a" had 3 admitted in the window, "Bearer b" 1.
    assert_eq!(s.max_in_window, 3);
}

#[tokio::test(start_paused = true)]
async fn chat_slot_is_free_once_the_answer_is_read() {
    let gw = Gateway::start(GatewayConfig::default().with_max_parallel(1)).unwrap();
    let client = client();
    for _ in 0..30 {
        let response = chat(&client, &gw, Some("Bearer a")).await;
        assert_eq!(response.status(), 200);
        let body: serde_json::Value =
            serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        assert_eq!(body["choices"][0]["message"]["content"], "ok");
    }
    assert_eq!(gw.stats().admitted, 30);
    assert_eq!(gw.stats().refused_parallel, 0);
    assert_eq!(gw.stats().peak_parallel, 1);
}

#[tokio::test(start_paused = true)]
async fn stream_holds_its_slot_until_the_last_chunk() {
    let chunks = 50;
    let gw = Gateway::start(
        GatewayConfig::default()
            .with_max_parallel(1)
            .with_stream_chunks(chunks)
            .with_stream_chunk_interval(Duration::from_secs(1)),
    )
    .unwrap();
    let client = client();
    let mut stream = client
        .get(format!("{}/v1/stream", gw.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    assert_eq!(stream.headers()["content-type"], "text/event-stream");
    let mut body = stream
        .chunk()
        .await
        .unwrap()
        .expect("a first chunk")
        .to_vec();

    // The stream is still being read: its slot is taken.
    let r = refusal(chat(&client, &gw, None).await).await;
    assert_eq!(r.limit_type, "parallel_requests");
    let r = refusal(send(&client, format!("{}/v1/stream", gw.url()), None).await).await;
    assert_eq!(r.limit_type, "parallel_requests");

    while let Some(chunk) = stream.chunk().await.unwrap() {
        body.extend_from_slice(&chunk);
    }
    let text = String::from_utf8(body).unwrap();
    let events: Vec<&str> = text.split_terminator("\n\n").collect();
    assert_eq!(events.len(), chunks as usize);
    assert_eq!(events[0], r#"data: {"index":1,"of":50,"done":false}"#);
    assert_eq!(events[49], r#"data: {"index":50,"of":50,"done":true}"#);

    // Read to the end: the slot is free.
    assert_eq!(chat(&client, &gw, None).await.status(), 200);
    let s = gw.stats();
    assert_eq!(s.admitted, 2);
    assert_eq!(s.refused_parallel, 2);
    assert_eq!(s.peak_parallel, 1);
    assert_eq!(s.peak_parallel_attempted, 2);
}

#[tokio::test(start_paused = true)]
async fn dropped_stream_gives_its_slot_back() {
    let gw = Gateway::start(
        GatewayConfig::default()
            .with_max_parallel(1)
            .with_stream_chunks(1000)
            .with_stream_chunk_interval(Duration::from_secs(1)),
    )
    .unwrap();
    let client = client();
    let mut stream = client
        .get(format!("{}/v1/stream", gw.url()))
        .send()
        .await
        .unwrap();
    assert!(stream.chunk().await.unwrap().is_some());
    assert_eq!(chat(&client, &gw, None).await.status(), 429);
    drop(stream);
    // The server notices the closed connection when writing the next chunks.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(chat(&client, &gw, None).await.status(), 200);
    assert_eq!(gw.stats().admitted, 2);
    assert_eq!(gw.stats().refused_parallel, 1);
}

#[tokio::test(start_paused = true)]
async fn stats_endpoint_equals_stats() {
    let gw = Gateway::start(
        GatewayConfig::default()
            .with_requests_per_window(2)
            .with_max_parallel(5),
    )
    .unwrap();
    let client = client();
    for user in ["Bearer a", "Bearer a", "Bearer a", "Bearer b"] {
        let _ = chat(&client, &gw, Some(user)).await;
    }
    let response = client
        .get(format!("{}/stats", gw.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let served: GatewayStats = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    let expected = GatewayStats {
        requests: 4,
        admitted: 3,
        responses_429: 1,
        refused_parallel: 0,
        refused_window: 1,
        peak_parallel: 1,
        peak_parallel_attempted: 1,
        max_in_window: 2,
        refused_tokens: 0,
        tokens_used: 0,
        max_tokens_in_window: 0,
    };
    assert_eq!(served, expected);
    assert_eq!(gw.stats(), served);

    gw.reset_stats();
    assert_eq!(gw.stats(), GatewayStats::default());
    // The window log survives the reset.
    assert_eq!(chat(&client, &gw, Some("Bearer a")).await.status(), 429);
    assert_eq!(gw.stats().refused_window, 1);
}

#[tokio::test(start_paused = true)]
async fn scaled_seed_limits_allow_120_per_6_seconds() {
    let config = GatewayConfig::seed_limits_scaled(10.0).with_service_time(Duration::ZERO);
    let gw = Gateway::start(config).unwrap();
    assert_eq!(gw.config().window, Duration::from_secs(6));
    let client = client();
    for _ in 0..120 {
        assert_eq!(chat(&client, &gw, None).await.status(), 200);
    }
    let r = refusal(chat(&client, &gw, None).await).await;
    assert_eq!(r.retry_after, 6);
    assert_eq!(r.limit_type, "requests_per_minute");
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(chat(&client, &gw, None).await.status(), 200);
    assert_eq!(gw.stats().max_in_window, 120);
    assert_eq!(gw.stats().admitted, 121);
}

#[tokio::test(start_paused = true)]
async fn shutdown_and_drop_stop_the_server() {
    let client = client();
    let gw = Gateway::start(GatewayConfig::default()).unwrap();
    let url = format!("{}/v1/chat", gw.url());
    assert_eq!(gw.url(), format!("http://127.0.0.1:{}", gw.addr().port()));
    assert!(format!("{gw:?}").contains("Gateway"));
    assert_eq!(send(&client, url.clone(), None).await.status(), 200);
    gw.shutdown().await.unwrap();
    let err = client.get(&url).send().await.unwrap_err();
    assert!(err.is_connect(), "{err}");

    let gw = Gateway::start(GatewayConfig::default()).unwrap();
    let url = format!("{}/v1/chat", gw.url());
    assert_eq!(send(&client, url.clone(), None).await.status(), 200);
    drop(gw);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let err = client.get(&url).send().await.unwrap_err();
    assert!(err.is_connect(), "{err}");
}

/// Real time on a multi-threaded runtime: only invariants are checked, never durations.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_burst_keeps_the_parallel_cap() {
    let gw = Gateway::start(
        GatewayConfig::default()
            .with_max_parallel(5)
            .with_service_time(Duration::from_millis(20)),
    )
    .unwrap();
    let client = client();
    let url = format!("{}/v1/chat", gw.url());
    let tasks: Vec<_> = (0..40)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move { send(&client, url, Some("Bearer a")).await.status() })
        })
        .collect();
    let mut ok = 0u64;
    let mut refused = 0u64;
    for task in tasks {
        match task.await.unwrap() {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    let s = gw.stats();
    assert_eq!(s.requests, 40);
    assert_eq!(s.admitted, ok);
    assert_eq!(s.responses_429, refused);
    assert_eq!(s.refused_parallel, refused);
    assert_eq!(s.refused_window, 0);
    assert!(s.peak_parallel >= 1 && s.peak_parallel <= 5, "{s:?}");
    assert_eq!(s.max_in_window, u32::try_from(ok).unwrap());
    gw.shutdown().await.unwrap();
}
