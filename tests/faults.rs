//! The throttle against a misbehaving server: a real HTTP/1.1 peer on loopback that writes raw
//! bytes (cut bodies, resets, malformed rate-limit headers, 429s forever, slow chunks), on the
//! test's runtime with paused time (one test, on real time, counts the requests a server sees
//! in progress), plus cancellation at every wait and 10 000 callers on one
//! semaphore. Every test ends by checking that no in-flight permit leaked.

#[path = "faults/server.rs"]
mod server;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_throttle::headers::MAX_HINT_DELAY;
use reqwest_throttle::policy::StopReason;
use reqwest_throttle::{Scope, Throttle, ThrottleError, ThrottleInfo};
use server::{answer, chunk, head, RawServer, Step, LAST_CHUNK};
use tokio::time::Instant;

const S: Duration = Duration::from_secs(1);

/// A throttle with an in-flight cap of `n` and no jitter, so waits are exact.
fn capped(n: usize) -> Throttle {
    Throttle::builder()
        .max_in_flight(n)
        .jitter(false)
        .build()
        .unwrap()
}

fn client(throttle: &Throttle) -> ClientWithMiddleware {
    let plain = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    ClientBuilder::new(plain).with(throttle.clone()).build()
}

fn info(r: &reqwest::Response) -> ThrottleInfo {
    r.extensions()
        .get::<ThrottleInfo>()
        .cloned()
        .expect("every response carries ThrottleInfo")
}

/// Nothing in flight, nobody queued, every permit back.
#[track_caller]
fn assert_idle(throttle: &Throttle, cap: usize) {
    let s = throttle.stats();
    assert_eq!(
        (s.in_flight, s.queued, s.available_permits),
        (0, 0, Some(cap)),
        "{s:?}"
    );
}

/// Nothing in flight, `queued` callers waiting, every permit back.
#[track_caller]
fn assert_idle_but_queued(throttle: &Throttle, queued: usize, cap: usize) {
    let s = throttle.stats();
    assert_eq!(
        (s.in_flight, s.queued, s.available_permits),
        (0, queued, Some(cap)),
        "{s:?}"
    );
}

/// Lets other tasks run (and loopback I/O progress, but not time) until `cond` holds.
async fn until(mut cond: impl FnMut() -> bool) {
    for _ in 0..100_000 {
        if cond() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("condition not reached");
}

/// Raw header lines: `(name, value bytes)`.
type Lines = &'static [(&'static str, &'static [u8])];

/// A 429 with these header lines and an empty body.
fn too_many(headers: &[(&str, &[u8])]) -> Vec<Step> {
    answer("429 Too Many Requests", headers, b"")
}

fn ok(body: &str) -> Vec<Step> {
    answer("200 OK", &[], body.as_bytes())
}

/// A transport error from reqwest (not a middleware error).
#[track_caller]
fn transport(err: reqwest_middleware::Error) -> reqwest::Error {
    match err {
        reqwest_middleware::Error::Reqwest(e) => e,
        other => panic!("expected a transport error, got {other:?}"),
    }
}

// 1. Broken connections.

#[tokio::test(start_paused = true)]
async fn a_body_cut_mid_way_fails_the_read_and_keeps_the_permit_until_dropped() {
    let server = RawServer::start(|_, _| {
        vec![
            Step::Write(head("200 OK", &[], &[("content-length", b"100")])),
            Step::Write(vec![b'x'; 10]),
            Step::Close,
        ]
    })
    .await;
    let throttle = Throttle::builder().max_in_flight(2).build().unwrap();
    let mut r = client(&throttle)
        .get(server.url("/cut"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.content_length(), Some(100));
    assert_eq!(info(&r).attempts, 1);
    let s = throttle.stats();
    assert_eq!((s.in_flight, s.available_permits), (1, Some(1)));

    let mut got = Vec::new();
    let err = loop {
        match r.chunk().await {
            Ok(Some(bytes)) => got.extend_from_slice(&bytes),
            Ok(None) => panic!("a body cut at 10 of 100 bytes ended cleanly"),
            Err(e) => break e,
        }
    };
    assert_eq!(got, vec![b'x'; 10]);
    assert!(err.is_body() || err.is_decode(), "{err:?}");
    // Not released by the failure: the response is still alive, and a failed body may still
    // hold its connection open (see `a_timed_out_body_keeps_its_slot_while_its_connection_is_open`).
    let s = throttle.stats();
    assert_eq!((s.in_flight, s.available_permits), (1, Some(1)));
    drop(r);
    assert_idle(&throttle, 2);
    assert_eq!((server.requests(), throttle.stats().sent), (1, 1));
}

/// A server that drops the connection (`Close` or `Reset`) for the first `broken` requests
/// after reading them, and answers `200 ok` afterwards.
async fn broken_then_ok(broken: usize, how: Step) -> RawServer {
    RawServer::start(move |i, _| {
        if i < broken {
            vec![how.clone()]
        } else {
            ok("ok")
        }
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn a_get_whose_connection_breaks_before_the_answer_is_resent() {
    for how in [Step::Close, Step::Reset] {
        let server = broken_then_ok(1, how.clone()).await;
        let throttle = Throttle::builder()
            .max_in_flight(1)
            .max_retries(3)
            .jitter(false)
            .build()
            .unwrap();
        let r = client(&throttle)
            .get(server.url("/x"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{how:?}");
        let i = info(&r);
        assert_eq!((i.attempts, i.waited, i.stopped), (2, S, None), "{how:?}");
        assert_eq!(r.text().await.unwrap(), "ok");
        let s = throttle.stats();
        assert_eq!((s.sent, s.retries, s.responses_429), (2, 1, 0), "{how:?}");
        assert_eq!((server.accepts(), server.requests()), (2, 2), "{how:?}");
        assert_idle(&throttle, 1);
    }
}

#[tokio::test(start_paused = true)]
async fn a_get_whose_connection_always_breaks_stops_after_max_retries() {
    let server = broken_then_ok(usize::MAX, Step::Reset).await;
    let throttle = Throttle::builder()
        .max_in_flight(1)
        .max_retries(3)
        .jitter(false)
        .build()
        .unwrap();
    let err = client(&throttle)
        .get(server.url("/x"))
        .send()
        .await
        .unwrap_err();
    // After retries the error says how many, and what the last attempt's failure was.
    let reqwest_middleware::Error::Middleware(err) = err else {
        panic!("expected the throttle's error, got {err:?}");
    };
    let err = err
        .downcast_ref::<ThrottleError>()
        .expect("a ThrottleError");
    let ThrottleError::AttemptsFailed {
        attempts,
        waited,
        stopped,
        last_error,
    } = err
    else {
        panic!("expected AttemptsFailed, got {err:?}");
    };
    assert_eq!((*attempts, *waited), (4, 7 * S), "1 + 2 + 4 s of backoff");
    assert_eq!(*stopped, StopReason::RetriesExhausted);
    let last = last_error.get();
    assert!(last.is_request() || last.is_connect(), "{last:?}");
    assert_eq!(err.is_connect(), last.is_connect());
    assert!(!err.is_timeout());
    let s = throttle.stats();
    assert_eq!((s.sent, s.retries), (4, 3));
    assert_eq!((server.accepts(), server.requests()), (4, 4));
    assert_idle(&throttle, 1);
}

#[tokio::test(start_paused = true)]
async fn a_post_whose_connection_breaks_is_not_resent() {
    for how in [Step::Close, Step::Reset] {
        let server = broken_then_ok(1, how.clone()).await;
        let throttle = Throttle::builder()
            .max_in_flight(1)
            .max_retries(3)
            .jitter(false)
            .build()
            .unwrap();
        let err = client(&throttle)
            .post(server.url("/x"))
            .body("{}")
            .send()
            .await
            .unwrap_err();
        let err = transport(err);
        assert!(err.is_request(), "{how:?}: {err:?}");
        let s = throttle.stats();
        assert_eq!((s.sent, s.retries), (1, 0), "{how:?}");
        assert_eq!((server.accepts(), server.requests()), (1, 1), "{how:?}");
        assert_eq!(server.seen()[0].method, "POST");
        assert_idle(&throttle, 1);
    }
}

#[tokio::test(start_paused = true)]
async fn a_keyed_post_whose_connection_breaks_is_resent_with_the_same_key() {
    let server = broken_then_ok(2, Step::Reset).await;
    let throttle = Throttle::builder()
        .max_in_flight(1)
        .max_retries(3)
        .jitter(false)
        .idempotency_key(http::HeaderName::from_static("idempotency-key"))
        .build()
        .unwrap();
    let r = client(&throttle)
        .post(server.url("/x"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(info(&r).attempts, 3);
    let keys: Vec<String> = server
        .seen()
        .iter()
        .map(|s| s.header("idempotency-key").unwrap().to_owned())
        .collect();
    assert_eq!(keys.len(), 3);
    assert!(server.seen().iter().all(|s| s.method == "POST"));
    assert!(keys.iter().all(|k| *k == keys[0]), "{keys:?}");
    assert_eq!(throttle.stats().sent, 3);
    drop(r);
    assert_idle(&throttle, 1);
}

#[tokio::test(start_paused = true)]
async fn garbage_instead_of_http_is_resent_only_when_safe() {
    // `/once` answers garbage the first time only, `/always` every time.
    let server = RawServer::start(|i, seen| {
        if seen.path == "/always" || i == 0 {
            vec![
                Step::Write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n".to_vec()),
                Step::Close,
            ]
        } else {
            ok("ok")
        }
    })
    .await;
    let throttle = capped(1);
    let c = client(&throttle);
    let r = c.get(server.url("/once")).send().await.unwrap();
    assert_eq!((r.status().as_u16(), info(&r).attempts), (200, 2));
    assert_eq!(r.text().await.unwrap(), "ok");
    let err = transport(
        c.post(server.url("/always"))
            .body("{}")
            .send()
            .await
            .unwrap_err(),
    );
    assert!(!err.is_status(), "{err:?}");
    assert_eq!((server.requests(), throttle.stats().sent), (3, 3));
    assert_idle(&throttle, 1);
}

#[tokio::test(start_paused = true)]
async fn a_429_whose_large_body_is_cut_is_retried_on_its_headers() {
    // Too large for the throttle to read its error codes, so only the caller would see the cut.
    let length = (reqwest_throttle::headers::MAX_ERROR_BODY + 1).to_string();
    let server = RawServer::start(move |i, _| {
        if i == 0 {
            vec![
                Step::Write(head(
                    "429 Too Many Requests",
                    &[("retry-after", b"30"), ("rate_limit_type", b"rpm")],
                    &[("content-length", length.as_bytes())],
                )),
                Step::Write(b"{\"error\":".to_vec()),
                Step::Close,
            ]
        } else {
            ok("ok")
        }
    })
    .await;
    let throttle = capped(1);
    let r = client(&throttle)
        .post(server.url("/x"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let i = info(&r);
    assert_eq!((i.attempts, i.waited), (2, 30 * S));
    let s = throttle.stats();
    assert_eq!((s.sent, s.responses_429, s.retries), (2, 1, 1));
    assert_eq!(server.requests(), 2);
    drop(r);
    assert_idle(&throttle, 1);
}

#[tokio::test(start_paused = true)]
async fn an_answer_with_no_body_releases_the_permit_without_being_read() {
    let server = RawServer::start(|_, seen| match seen.path.as_str() {
        "/204" => vec![Step::Write(head("204 No Content", &[], &[])), Step::Close],
        // A HEAD answer announces a length but has no body.
        "/head" => vec![
            Step::Write(head("200 OK", &[], &[("content-length", b"100")])),
            Step::Close,
        ],
        _ => ok(""),
    })
    .await;
    let throttle = Throttle::builder().max_in_flight(3).build().unwrap();
    let c = client(&throttle);
    let held = [
        c.get(server.url("/204")).send().await.unwrap(),
        c.head(server.url("/head")).send().await.unwrap(),
        c.get(server.url("/empty")).send().await.unwrap(),
    ];
    let statuses: Vec<u16> = held.iter().map(|r| r.status().as_u16()).collect();
    assert_eq!(statuses, [204, 200, 200]);
    // All three responses are alive and unread, yet none holds a permit.
    assert_idle(&throttle, 3);
    assert_eq!((server.requests(), throttle.stats().sent), (3, 3));
}

// 2. Malformed rate-limit headers on a 429.

/// A GET against a server that answers 429 with `headers` forever; returns the last response's
/// status, its `ThrottleInfo` and how many requests the server read.
async fn always_429(headers: Lines) -> (u16, ThrottleInfo, usize) {
    let server = RawServer::start(move |_, _| too_many(headers)).await;
    // Not learned: a parallel-limit refusal would lower the in-flight cap checked below.
    let throttle = Throttle::builder()
        .learn_limits(false)
        .max_in_flight(3)
        .max_retries(2)
        .jitter(false)
        .build()
        .unwrap();
    let r = client(&throttle)
        .get(server.url("/limited"))
        .send()
        .await
        .unwrap();
    let (status, i) = (r.status().as_u16(), info(&r));
    assert_eq!(throttle.stats().sent as usize, server.requests());
    drop(r);
    assert_idle(&throttle, 3);
    (status, i, server.requests())
}

#[tokio::test(start_paused = true)]
async fn malformed_wait_hints_are_ignored_and_backoff_applies() {
    let cases: &[Lines] = &[
        &[("retry-after", b"-5")],
        &[("retry-after", b"1e3")],
        &[("retry-after", b"soon")],
        &[("retry-after", b"")],
        &[("retry-after", b"5\xff")],
        &[("retry-after", b"\xc3\x28")],
        &[("retry-after", b"3"), ("retry-after", b"7")],
        &[("retry-after-ms", b"NaN")],
        &[
            ("rate_limit_type", b"requests_per_minute"),
            ("reset_at", b"yesterday"),
        ],
        &[
            ("rate_limit_type", b"tokens_per_minute"),
            ("reset_at", b"\x80\x81"),
        ],
        &[("rate_limit_type", b"\xfe\xff"), ("reset_at", b"-1")],
        &[
            ("rate_limit_type", b"parallel_requests"),
            ("retry-after", b"later"),
        ],
    ];
    for &headers in cases {
        let (status, i, requests) = always_429(headers).await;
        // Three attempts, backoff 1 s then 2 s: the hint was not used.
        assert_eq!(status, 429, "{headers:?}");
        assert_eq!(i.attempts, 3, "{headers:?}");
        assert_eq!(requests, 3, "{headers:?}");
        assert_eq!(i.stopped, Some(StopReason::RetriesExhausted), "{headers:?}");
        assert_eq!(i.waited, 3 * S, "{headers:?}");
        assert_eq!(i.hints.retry_after, None, "{headers:?}");
        assert_eq!(i.hints.reset_after, None, "{headers:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn repeated_identical_retry_after_lines_are_honoured() {
    let (status, i, requests) = always_429(&[("retry-after", b"2"), ("Retry-After", b" 2 ")]).await;
    assert_eq!((status, i.attempts, requests), (429, 3, 3));
    assert_eq!(i.hints.retry_after, Some(2 * S));
    assert_eq!(i.waited, 4 * S);
}

#[tokio::test(start_paused = true)]
async fn an_absurd_wait_is_returned_at_once_not_slept() {
    let cases: &[(Lines, Duration)] = &[
        (&[("retry-after", b"99999999999999999999")], MAX_HINT_DELAY),
        (&[("retry-after", b"18446744073709551616")], MAX_HINT_DELAY),
        (
            &[("retry-after", b"Fri, 31 Dec 9999 23:59:59 GMT")],
            MAX_HINT_DELAY,
        ),
        (
            &[("retry-after-ms", b"1e999"), ("retry-after", b"121")],
            121 * S,
        ),
        (
            &[("retry-after", b"120.001")],
            120 * S + Duration::from_millis(1),
        ),
        (
            &[("retry-after-ms", b"99999999999999999999999999999999999")],
            MAX_HINT_DELAY,
        ),
    ];
    for &(headers, asked) in cases {
        // A virtual-time bound: the attempt must not sleep at all.
        let (status, i, requests) = tokio::time::timeout(S, always_429(headers))
            .await
            .unwrap_or_else(|_| panic!("{headers:?}: the throttle slept on an absurd wait"));
        assert_eq!((status, i.attempts, requests), (429, 1, 1), "{headers:?}");
        assert_eq!(
            i.stopped,
            Some(StopReason::WaitTooLong { asked }),
            "{headers:?}"
        );
        assert_eq!(i.waited, Duration::ZERO, "{headers:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_absurd_window_reset_returns_at_once_and_holds_nobody() {
    let server = RawServer::start(|_, seen| {
        if seen.path == "/limited" {
            too_many(&[
                ("rate_limit_type", b"requests_per_minute"),
                ("reset_at", b"9000-01-01T00:00:00Z"),
            ])
        } else {
            ok("ok")
        }
    })
    .await;
    let throttle = Throttle::builder()
        .max_in_flight(2)
        .max_server_wait(30 * S)
        .jitter(false)
        .build()
        .unwrap();
    let c = client(&throttle);
    let r = tokio::time::timeout(S, c.get(server.url("/limited")).send())
        .await
        .expect("an absurd reset is not slept")
        .unwrap();
    let i = info(&r);
    assert_eq!((r.status().as_u16(), i.attempts), (429, 1));
    assert_eq!(
        i.stopped,
        Some(StopReason::WaitTooLong {
            asked: MAX_HINT_DELAY
        })
    );
    assert_eq!(i.cooldown, None);
    drop(r);
    // A wait longer than max_server_wait closes no cooldown: the next request goes at once
    // and receives the server's own answer.
    let r = c.get(server.url("/other")).send().await.unwrap();
    assert_eq!(
        (r.status().as_u16(), info(&r).waited),
        (200, Duration::ZERO)
    );
    drop(r);
    assert_eq!((server.requests(), throttle.stats().sent), (2, 2));
    assert_idle(&throttle, 2);
}

// 3. 429 with Retry-After: 0, forever.

#[tokio::test(start_paused = true)]
async fn retry_after_zero_forever_is_bounded_by_max_retries() {
    // A window or untyped 429 refused again waits at least the previous backoff step
    // (0, then 1 s, 2 s, 4 s); a parallel-limit 429 backs off from 1 s (1, 2, 4, 8 s), its
    // zero Retry-After capping nothing.
    let cases: &[(Lines, Duration)] = &[
        (&[("retry-after", b"0")], 7 * S),
        (&[("retry-after", b"0"), ("rate_limit_type", b"rpm")], 7 * S),
        (
            &[("retry-after-ms", b"0"), ("rate_limit_type", b"concurrent")],
            15 * S,
        ),
    ];
    for &(headers, waited) in cases {
        let server =
            RawServer::start(move |_, _| answer("429 Too Many Requests", headers, b"slow down"))
                .await;
        let throttle = Throttle::builder()
            .max_in_flight(1)
            .max_retries(4)
            .jitter(false)
            .build()
            .unwrap();
        let r = client(&throttle)
            .post(server.url("/x"))
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 429, "{headers:?}");
        let i = info(&r);
        assert_eq!(i.attempts, 5, "{headers:?}");
        assert_eq!(i.stopped, Some(StopReason::RetriesExhausted), "{headers:?}");
        assert_eq!(i.waited, waited, "{headers:?}");
        assert_eq!(r.text().await.unwrap(), "slow down", "{headers:?}");
        let s = throttle.stats();
        assert_eq!(
            (s.sent, s.retries, s.responses_429),
            (5, 4, 5),
            "{headers:?}"
        );
        assert_eq!(server.requests(), 5, "{headers:?}");
        assert_idle(&throttle, 1);
    }
}

// 4. A slow streaming body.

/// `/slow` streams `one`, `two`, `three` one second apart then ends; anything else is `fast`.
async fn slow_stream_server() -> RawServer {
    RawServer::start(|_, seen| {
        if seen.path == "/slow" {
            vec![
                Step::Write(head("200 OK", &[], &[("transfer-encoding", b"chunked")])),
                Step::Write(chunk(b"one")),
                Step::Sleep(S),
                Step::Write(chunk(b"two")),
                Step::Sleep(S),
                Step::Write(chunk(b"three")),
                Step::Sleep(S),
                Step::Write(LAST_CHUNK.to_vec()),
                Step::Close,
            ]
        } else {
            ok("fast")
        }
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn a_slow_stream_holds_the_permit_until_it_ends() {
    let server = slow_stream_server().await;
    let throttle = Throttle::builder().max_in_flight(1).build().unwrap();
    let c = client(&throttle);
    let mut slow = c.get(server.url("/slow")).send().await.unwrap();
    assert_eq!(throttle.stats().available_permits, Some(0));
    let second = tokio::spawn({
        let (c, url) = (c.clone(), server.url("/fast"));
        async move {
            let r = c.get(url).send().await.unwrap();
            let waited = info(&r).waited;
            (r.text().await.unwrap(), waited)
        }
    });
    until(|| throttle.stats().queued == 1).await;

    let mut chunks = Vec::new();
    while let Some(bytes) = slow.chunk().await.unwrap() {
        chunks.push(String::from_utf8(bytes.to_vec()).unwrap());
        let s = throttle.stats();
        assert_eq!(
            (s.in_flight, s.queued, s.sent, s.available_permits),
            (1, 1, 1, Some(0)),
            "after {chunks:?}"
        );
    }
    assert_eq!(chunks, ["one", "two", "three"]);
    let (text, waited) = second.await.unwrap();
    assert_eq!(text, "fast");
    // Queued from the first byte of the stream to its end: three server seconds.
    assert_eq!(waited, 3 * S);
    assert_eq!(throttle.stats().sent, 2);
    assert_eq!(server.requests(), 2);
    drop(slow);
    assert_idle(&throttle, 1);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_slow_stream_mid_way_releases_the_permit() {
    let server = slow_stream_server().await;
    let throttle = Throttle::builder().max_in_flight(1).build().unwrap();
    let c = client(&throttle);
    let mut slow = c.get(server.url("/slow")).send().await.unwrap();
    let second = tokio::spawn({
        let (c, url) = (c.clone(), server.url("/fast"));
        async move {
            let r = c.get(url).send().await.unwrap();
            let waited = info(&r).waited;
            (r.text().await.unwrap(), waited)
        }
    });
    until(|| throttle.stats().queued == 1).await;
    assert_eq!(slow.chunk().await.unwrap().as_deref(), Some(&b"one"[..]));
    assert_eq!(throttle.stats().sent, 1);
    drop(slow);
    // Released at once, not at the stream's end 3 s on; the queued caller is woken to take it.
    let s = throttle.stats();
    assert_eq!((s.in_flight, s.available_permits), (0, Some(1)));
    let (text, waited) = tokio::time::timeout(S, second)
        .await
        .expect("the dropped stream's permit went to the waiter")
        .unwrap();
    assert_eq!((text.as_str(), waited), ("fast", Duration::ZERO));
    assert_eq!(throttle.stats().sent, 2);
    assert_idle(&throttle, 1);
}

/// A server on loopback that counts requests in progress the way a server's own limit does
/// (nginx's `limit_conn`): from the request head until the client closes the connection. Each
/// answer is a chunked `200` that sends a chunk every 100 ms and never ends. Runs on real time:
/// the client's timeout must not fire while the sockets are idle.
#[derive(Clone, Default)]
struct InProgressServer {
    requests: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

impl InProgressServer {
    async fn start() -> (InProgressServer, String) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/stream", listener.local_addr().unwrap());
        let server = InProgressServer::default();
        let counts = server.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(counts.clone().serve(stream));
            }
        });
        (server, url)
    }

    async fn serve(self, mut stream: tokio::net::TcpStream) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        self.requests.fetch_add(1, Ordering::SeqCst);
        self.open.fetch_add(1, Ordering::SeqCst);
        // A connection the client has just closed may not have been seen closed yet: give
        // the others up to 200 ms to go before counting this one against them.
        for _ in 0..20 {
            if self.open.load(Ordering::SeqCst) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.peak
            .fetch_max(self.open.load(Ordering::SeqCst), Ordering::SeqCst);
        let response = head_bytes();
        if stream.write_all(&response).await.is_ok() {
            // In progress until the client closes (read 0) or the connection breaks.
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tokio::select! {
                    read = stream.read(&mut buf) => {
                        if matches!(read, Ok(0) | Err(_)) {
                            break;
                        }
                    }
                    _ = tick.tick() => {
                        if stream.write_all(&chunk(b".")).await.is_err() {
                            break;
                        }
                    }
                }
            }
        }
        self.open.fetch_sub(1, Ordering::SeqCst);
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// The most requests the server saw in progress at once.
    fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }
}

/// A chunked `200` head and its first chunk.
fn head_bytes() -> Vec<u8> {
    let mut out = head("200 OK", &[], &[("transfer-encoding", b"chunked")]);
    out.extend_from_slice(&chunk(b"first"));
    out
}

/// A body whose read fails (here the client's timeout) still holds its connection, which the
/// server counts until the response is dropped: the slot is held as long, so that the server
/// never sees more than `max_in_flight` requests in progress.
#[tokio::test]
async fn a_timed_out_body_keeps_its_slot_while_its_connection_is_open() {
    let (server, url) = InProgressServer::start().await;
    let throttle = capped(1);
    let plain = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let c = ClientBuilder::new(plain).with(throttle.clone()).build();

    let mut first = c.get(&url).send().await.unwrap();
    assert_eq!(first.chunk().await.unwrap().as_deref(), Some(&b"first"[..]));
    let err = loop {
        match first.chunk().await {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the stream never ends"),
            Err(e) => break e,
        }
    };
    assert!(err.is_timeout(), "{err:?}");
    // The read failed but `first` is alive, and so is its connection.
    assert_eq!(throttle.stats().in_flight, 1);

    let second = tokio::spawn({
        let (c, url) = (c.clone(), url.clone());
        async move { c.get(url).send().await.map(|r| r.status()) }
    });
    // Time for the second to be sent and counted, were its slot free (none of this is
    // asserted): longer than the server's 200 ms of grace.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let s = throttle.stats();
    assert_eq!((s.in_flight, s.queued), (1, 1), "{s:?}");
    assert_eq!(
        server.requests(),
        1,
        "the second went while the first was held"
    );
    assert!(!second.is_finished());

    drop(first);
    let status = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the dropped response's slot went to the waiter")
        .unwrap()
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(server.requests(), 2);
    assert_eq!(
        server.peak(),
        1,
        "the server saw more than max_in_flight in progress"
    );
    assert_idle(&throttle, 1);
}

// 5. Cancellation at every wait.

#[tokio::test(start_paused = true)]
async fn a_caller_dropped_while_waiting_for_the_permit_leaks_nothing() {
    let server = RawServer::start(|_, _| ok("ok")).await;
    // One scope, so that `acquire` and the requests wait in the same queue.
    let throttle = Throttle::builder()
        .scope(Scope::global())
        .max_in_flight(1)
        .build()
        .unwrap();
    let c = client(&throttle);
    let first = c.get(server.url("/a")).send().await.unwrap(); // unread: holds the permit
    let waiting = tokio::spawn({
        let (c, url) = (c.clone(), server.url("/b"));
        async move { c.get(url).send().await }
    });
    let acquiring = tokio::spawn({
        let throttle = throttle.clone();
        async move { throttle.acquire(1).await.map(drop) }
    });
    until(|| throttle.stats().queued == 2).await;
    waiting.abort();
    acquiring.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    assert!(acquiring.await.unwrap_err().is_cancelled());
    let s = throttle.stats();
    assert_eq!((s.queued, s.in_flight, s.sent), (0, 1, 1));
    drop(first);
    assert_idle(&throttle, 1);
    // The permit is free for the next caller at once.
    let r = c.get(server.url("/c")).send().await.unwrap();
    assert_eq!(info(&r).waited, Duration::ZERO);
    drop(r);
    assert_eq!((server.requests(), throttle.stats().sent), (2, 2));
    assert_idle(&throttle, 1);
}

#[tokio::test(start_paused = true)]
async fn a_caller_dropped_while_waiting_on_the_window_is_not_charged() {
    let server = RawServer::start(|_, _| ok("ok")).await;
    let throttle = Throttle::builder()
        .max_in_flight(2)
        .sliding_window(1, 10 * S)
        .window_guard(Duration::ZERO)
        .build()
        .unwrap();
    let c = client(&throttle);
    let t0 = Instant::now();
    drop(c.get(server.url("/a")).send().await.unwrap());
    let waiting = tokio::spawn({
        let (c, url) = (c.clone(), server.url("/b"));
        async move { c.get(url).send().await }
    });
    until(|| throttle.stats().queued == 1).await;
    // It holds no in-flight slot while it waits on the quota: admission is all or nothing.
    assert_eq!(throttle.stats().available_permits, Some(2));
    tokio::time::sleep(5 * S).await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    assert_idle(&throttle, 2);
    assert_eq!(throttle.stats().sent, 1);
    // The next caller gets the slot the first send frees at t0 + 10 s, not one after it.
    let r = c.get(server.url("/c")).send().await.unwrap();
    assert_eq!(Instant::now() - t0, 10 * S);
    assert_eq!(info(&r).waited, 5 * S);
    drop(r);
    assert_eq!((server.requests(), throttle.stats().sent), (2, 2));
    assert_idle(&throttle, 2);
}

#[tokio::test(start_paused = true)]
async fn a_caller_dropped_while_waiting_on_the_cooldown_leaks_nothing() {
    let server = RawServer::start(|i, seen| {
        if seen.path == "/limited" && i == 0 {
            too_many(&[("rate_limit_type", b"rpm"), ("retry-after", b"30")])
        } else {
            ok("ok")
        }
    })
    .await;
    let throttle = capped(2);
    let c = client(&throttle);
    let limited = tokio::spawn({
        let (c, url) = (c.clone(), server.url("/limited"));
        async move { c.get(url).send().await }
    });
    until(|| throttle.stats().responses_429 == 1).await;
    let other = tokio::spawn({
        let (c, url) = (c.clone(), server.url("/other"));
        async move { c.get(url).send().await }
    });
    until(|| throttle.stats().queued == 1).await;
    // Waiting on the cooldown holds no permit; neither does the retry's sleep.
    assert_idle_but_queued(&throttle, 1, 2);
    other.abort();
    limited.abort();
    assert!(other.await.unwrap_err().is_cancelled());
    assert!(limited.await.unwrap_err().is_cancelled());
    assert_idle(&throttle, 2);
    let s = throttle.stats();
    assert_eq!((s.sent, s.retries), (1, 0));
    assert_eq!(server.requests(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_caller_dropped_during_the_retry_sleep_sends_nothing_more() {
    let server = RawServer::start(|i, _| {
        if i == 0 {
            too_many(&[("retry-after", b"30")])
        } else {
            ok("ok")
        }
    })
    .await;
    let throttle = Throttle::builder()
        .max_in_flight(1)
        .sliding_window(2, 60 * S)
        .window_guard(Duration::ZERO)
        .jitter(false)
        .build()
        .unwrap();
    let c = client(&throttle);
    let t0 = Instant::now();
    let retrying = tokio::spawn({
        let (c, url) = (c.clone(), server.url("/x"));
        async move { c.get(url).send().await }
    });
    until(|| throttle.stats().responses_429 == 1).await;
    // Sleeping before its retry: no permit held, nothing queued.
    until(|| throttle.stats().in_flight == 0).await;
    assert_idle(&throttle, 1);
    tokio::time::sleep(10 * S).await;
    retrying.abort();
    assert!(retrying.await.unwrap_err().is_cancelled());
    tokio::time::sleep(30 * S).await; // past the retry it would have made
    let s = throttle.stats();
    assert_eq!((s.sent, s.retries, server.requests()), (1, 0, 1));
    // The window holds the 429's attempt only: one send now, the next at t0 + 60 s.
    let r = c.get(server.url("/y")).send().await.unwrap();
    assert_eq!(info(&r).waited, Duration::ZERO);
    drop(r);
    let r = c.get(server.url("/z")).send().await.unwrap();
    assert_eq!(Instant::now() - t0, 60 * S);
    drop(r);
    assert_eq!((server.requests(), throttle.stats().sent), (3, 3));
    assert_idle(&throttle, 1);
}

#[tokio::test(start_paused = true)]
async fn a_caller_dropped_while_awaiting_the_answer_is_charged_and_leaks_nothing() {
    let server = RawServer::start(|i, _| if i == 0 { vec![Step::Hang] } else { ok("ok") }).await;
    let throttle = Throttle::builder()
        .max_in_flight(1)
        .sliding_window(1, 10 * S)
        .window_guard(Duration::ZERO)
        .build()
        .unwrap();
    let c = client(&throttle);
    let t0 = Instant::now();
    let hanging = tokio::spawn({
        let (c, url) = (c.clone(), server.url("/hang"));
        async move { c.get(url).send().await }
    });
    until(|| server.requests() == 1).await;
    assert_eq!(throttle.stats().in_flight, 1);
    hanging.abort();
    assert!(hanging.await.unwrap_err().is_cancelled());
    assert_idle(&throttle, 1);
    // The attempt reached the server, so it counts in the window.
    let r = c.get(server.url("/next")).send().await.unwrap();
    assert_eq!(Instant::now() - t0, 10 * S);
    drop(r);
    assert_eq!((server.requests(), throttle.stats().sent), (2, 2));
    assert_idle(&throttle, 1);
}

#[tokio::test(start_paused = true)]
async fn a_reader_dropped_mid_body_releases_the_permit() {
    let server = slow_stream_server().await;
    let throttle = Throttle::builder().max_in_flight(1).build().unwrap();
    let c = client(&throttle);
    let (first_chunk, got_first) = tokio::sync::oneshot::channel();
    let reader = tokio::spawn({
        let (c, url) = (c.clone(), server.url("/slow"));
        async move {
            let mut r = c.get(url).send().await.unwrap();
            let one = r.chunk().await.unwrap().unwrap();
            first_chunk.send(one).unwrap();
            // Now waits a second for "two" with the body half read.
            r.chunk().await.unwrap()
        }
    });
    assert_eq!(&got_first.await.unwrap()[..], b"one");
    assert_eq!(throttle.stats().in_flight, 1);
    reader.abort();
    assert!(reader.await.unwrap_err().is_cancelled());
    assert_idle(&throttle, 1);
    let r = c.get(server.url("/fast")).send().await.unwrap();
    assert_eq!(info(&r).waited, Duration::ZERO);
    assert_eq!(r.text().await.unwrap(), "fast");
    assert_eq!((server.requests(), throttle.stats().sent), (2, 2));
    assert_idle(&throttle, 1);
}

// 6. Ten thousand callers on one semaphore.

/// `n` callers arrive one by one at `throttle.acquire(1)`; returns the arrival numbers in the
/// order the callers were admitted.
async fn admission_order(throttle: &Throttle, n: usize) -> Vec<usize> {
    let arrived = Arc::new(AtomicUsize::new(0));
    let admitted = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let (throttle, arrived, admitted) = (throttle.clone(), arrived.clone(), admitted.clone());
        tasks.push(tokio::spawn(async move {
            let me = arrived.fetch_add(1, Ordering::SeqCst);
            let permit = throttle.acquire(1).await.unwrap();
            admitted.lock().unwrap().push(me);
            tokio::task::yield_now().await;
            drop(permit);
        }));
        // Let it reach the semaphore before the next one starts.
        tokio::task::yield_now().await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    let order = admitted.lock().unwrap().clone();
    order
}

fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[tokio::test(start_paused = true)]
async fn ten_thousand_callers_are_admitted_first_in_first_out() {
    const N: usize = 10_000;
    let throttle = Throttle::builder().max_in_flight(10).build().unwrap();
    let order = admission_order(&throttle, N).await;
    assert_eq!(order.len(), N);
    let late: Vec<_> = order
        .iter()
        .enumerate()
        .filter(|(i, &a)| *i != a)
        .take(5)
        .collect();
    assert!(late.is_empty(), "admitted out of arrival order: {late:?}");
    assert_eq!(throttle.stats().sent, N as u64);
    assert_idle(&throttle, 10);

    // The same through a sliding window (10 000 at 1 000 per second: 9 s of virtual time).
    let throttle = Throttle::builder()
        .max_in_flight(10)
        .sliding_window(1000, S)
        .window_guard(Duration::ZERO)
        .build()
        .unwrap();
    let t0 = Instant::now();
    let order = admission_order(&throttle, N).await;
    assert_eq!(order, (0..N).collect::<Vec<_>>());
    assert_eq!(Instant::now() - t0, 9 * S);
    assert_eq!(throttle.stats().sent, N as u64);
    assert_idle(&throttle, 10);
    if let Some(kib) = peak_rss_kib() {
        eprintln!("peak RSS after 2 x {N} callers: {kib} KiB");
    }
}

#[tokio::test(start_paused = true)]
async fn many_requests_through_a_small_cap_all_complete() {
    const N: usize = 300;
    let server = RawServer::start(|i, _| ok(&i.to_string())).await;
    let throttle = Throttle::builder().max_in_flight(10).build().unwrap();
    let c = client(&throttle);
    let peak = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..N)
        .map(|_| {
            let (c, url, throttle, peak) =
                (c.clone(), server.url("/x"), throttle.clone(), peak.clone());
            tokio::spawn(async move {
                let r = c.get(url).send().await.unwrap();
                peak.fetch_max(throttle.stats().in_flight, Ordering::SeqCst);
                r.text().await.unwrap()
            })
        })
        .collect();
    let mut bodies = Vec::new();
    for t in tasks {
        bodies.push(t.await.unwrap().parse::<usize>().unwrap());
    }
    bodies.sort_unstable();
    assert_eq!(bodies, (0..N).collect::<Vec<_>>());
    assert!(peak.load(Ordering::SeqCst) <= 10);
    assert_eq!((server.requests(), throttle.stats().sent), (N, N as u64));
    assert_idle(&throttle, 10);
}

// Error bodies that break off or stall, and cancellation between two token buckets.

/// A server whose first answer is a window 429 (`Retry-After: 30`) announcing a 100-byte JSON
/// error body and closing after 9 bytes of it; then `200 ok`.
async fn cut_429_then_ok() -> RawServer {
    RawServer::start(|i, _| {
        if i == 0 {
            vec![
                Step::Write(head(
                    "429 Too Many Requests",
                    &[
                        ("retry-after", b"30"),
                        ("rate_limit_type", b"requests_per_minute"),
                    ],
                    &[
                        ("content-type", b"application/json"),
                        ("content-length", b"100"),
                    ],
                )),
                Step::Write(b"{\"error\":".to_vec()),
                Step::Close,
            ]
        } else {
            ok("ok")
        }
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn a_429_whose_error_body_is_cut_is_still_a_429() {
    for method in [http::Method::GET, http::Method::POST] {
        let server = cut_429_then_ok().await;
        let throttle = capped(1);
        let r = client(&throttle)
            .request(method.clone(), server.url("/x"))
            .body("{}")
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method}: a 429 with a cut body became {e:?}"));
        assert_eq!(r.status(), 200, "{method}");
        let i = info(&r);
        // The 429's Retry-After is honoured, like any 429's.
        assert_eq!((i.attempts, i.waited), (2, 30 * S), "{method}");
        let s = throttle.stats();
        assert_eq!((s.sent, s.responses_429, s.retries), (2, 1, 1), "{method}");
        assert_eq!(server.requests(), 2, "{method}");
        drop(r);
        assert_idle(&throttle, 1);
    }
}

#[tokio::test(start_paused = true)]
async fn a_cut_error_body_that_is_returned_keeps_its_bytes_then_its_error() {
    let server = cut_429_then_ok().await;
    let throttle = Throttle::builder().max_in_flight(1).build().unwrap();
    let mut r = client(&throttle)
        .get(server.url("/x"))
        .with_extension(reqwest_throttle::NoRetry)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(info(&r).stopped, Some(StopReason::RetryDisabled));
    assert_eq!(
        r.chunk().await.unwrap().as_deref(),
        Some(&b"{\"error\":"[..])
    );
    assert!(
        r.chunk().await.is_err(),
        "the cut is reported, as without the throttle"
    );
    drop(r);
    assert_idle(&throttle, 1);
}

#[tokio::test(start_paused = true)]
async fn a_429_whose_error_body_stalls_does_not_hang_the_caller() {
    let server = RawServer::start(|_, _| {
        vec![
            Step::Write(head(
                "429 Too Many Requests",
                &[("retry-after", b"1")],
                &[("content-length", b"100")],
            )),
            Step::Write(b"{\"error\":".to_vec()),
            Step::Hang,
        ]
    })
    .await;
    // A plain client gets the 429 at once.
    let plain = reqwest::Client::builder().no_proxy().build().unwrap();
    let r = tokio::time::timeout(S, plain.get(server.url("/x")).send()).await;
    assert_eq!(r.unwrap().unwrap().status(), 429);
    let throttle = Throttle::builder().max_in_flight(1).build().unwrap();
    let r = tokio::time::timeout(
        600 * S,
        client(&throttle)
            .get(server.url("/x"))
            .with_extension(reqwest_throttle::NoRetry)
            .send(),
    )
    .await
    .expect("the throttle waits forever for a 429's error body, holding its permit")
    .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(info(&r).stopped, Some(StopReason::RetryDisabled));
    drop(r);
    assert_idle(&throttle, 1);
}

#[tokio::test(start_paused = true)]
async fn a_caller_dropped_between_two_token_buckets_charges_neither() {
    use std::num::NonZeroU32;
    let n = |x| NonZeroU32::new(x).unwrap();
    // A: 2 a minute, burst 2. B: 1 a second, burst 1.
    let throttle = Throttle::builder()
        .token_bucket(governor::Quota::per_minute(n(2)))
        .token_bucket(governor::Quota::per_second(n(1)))
        .window_guard(Duration::ZERO)
        .build()
        .unwrap();
    let t0 = Instant::now();
    drop(throttle.acquire(1).await.unwrap()); // A: 1 cell left; B: empty until t0 + 1 s
    let waiting = tokio::spawn({
        let throttle = throttle.clone();
        async move { throttle.acquire(1).await.map(drop) }
    });
    tokio::time::sleep(S / 2).await;
    assert_eq!(throttle.stats().queued, 1);
    // `acquire`: "a dropped call holds nothing and has charged no quota".
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    // A still has its second cell, so the next caller waits only for B, until t0 + 1 s.
    drop(throttle.acquire(1).await.unwrap());
    assert_eq!(Instant::now() - t0, S);
    assert_eq!(throttle.stats().sent, 2);
}

// Error bodies without a length (chunked).

/// `429 insufficient_quota` with a chunked JSON body split in `parts`.
fn chunked_429(parts: &[&[u8]], end: Step) -> Vec<Step> {
    let mut steps = vec![Step::Write(head(
        "429 Too Many Requests",
        &[("content-type", b"application/json"), ("retry-after", b"1")],
        &[("transfer-encoding", b"chunked")],
    ))];
    for part in parts {
        steps.push(Step::Write(chunk(part)));
    }
    steps.push(end);
    steps
}

#[tokio::test(start_paused = true)]
async fn a_decisive_chunked_error_body_is_read_and_kept() {
    let body: &[u8] = br#"{"error": {"code": "insufficient_quota", "message": "used up"}}"#;
    let (a, b) = body.split_at(20);
    let server =
        RawServer::start(move |_, _| chunked_429(&[a, b], Step::Write(LAST_CHUNK.to_vec()))).await;
    let throttle = Throttle::builder().max_in_flight(1).build().unwrap();
    let r = client(&throttle)
        .get(server.url("/x"))
        .send()
        .await
        .unwrap();
    let i = info(&r);
    // One attempt, returned as final, not resent six times.
    assert_eq!((r.status().as_u16(), i.attempts), (429, 1));
    assert_eq!(
        i.stopped,
        Some(StopReason::Final {
            status: 429,
            code: "insufficient_quota".into()
        })
    );
    assert_eq!(r.bytes().await.unwrap(), body);
    assert_eq!(server.requests(), 1);
    assert_idle(&throttle, 1);
}

#[tokio::test(start_paused = true)]
async fn a_long_chunked_error_body_is_not_read_past_the_bound_and_is_kept_whole() {
    let filler = vec![b'x'; reqwest_throttle::headers::MAX_ERROR_BODY];
    let parts: Vec<Vec<u8>> = vec![b"{\"pad\": \"".to_vec(), filler.clone(), b"\"}".to_vec()];
    let whole: Vec<u8> = parts.concat();
    let server = RawServer::start(move |_, _| {
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        chunked_429(&refs, Step::Write(LAST_CHUNK.to_vec()))
    })
    .await;
    let throttle = Throttle::builder().max_retries(0).build().unwrap();
    let r = client(&throttle)
        .get(server.url("/x"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(info(&r).stopped, Some(StopReason::RetriesExhausted));
    assert_eq!(r.bytes().await.unwrap(), whole);
}

#[tokio::test(start_paused = true)]
async fn a_cut_chunked_error_body_is_handed_back_as_it_came() {
    let server = RawServer::start(|_, _| chunked_429(&[b"{\"error\": {\"co"], Step::Close)).await;
    let throttle = Throttle::builder().max_retries(0).build().unwrap();
    let r = client(&throttle)
        .get(server.url("/x"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    // Not parsed; the caller reads what came, then the error that cut it.
    let mut r = r;
    assert_eq!(
        r.chunk().await.unwrap().as_deref(),
        Some(&b"{\"error\": {\"co"[..])
    );
    assert!(r.chunk().await.is_err());
}
