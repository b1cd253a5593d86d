//! Test support: an in-process fake server as the last middleware, so tests with paused tokio
//! time see every send at its exact virtual instant (no socket, no thread, no wall clock).

#![allow(dead_code)]

pub mod redis;

use std::sync::{Arc, Mutex};

use http::Extensions;
use reqwest::{Request, Response};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use reqwest_throttle::Throttle;
use tokio::time::Instant;

/// One request as the fake server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub at: Instant,
    pub method: http::Method,
    pub path: String,
    pub headers: http::HeaderMap,
    pub body: Option<Vec<u8>>,
}

type Answer = dyn Fn(usize, &Request) -> http::Response<reqwest::Body> + Send + Sync;

/// Answers each request with `answer(index, request)` and records it.
#[derive(Clone)]
pub struct FakeServer {
    seen: Arc<Mutex<Vec<Seen>>>,
    answer: Arc<Answer>,
    delay: std::time::Duration,
}

impl FakeServer {
    pub fn new(
        answer: impl Fn(usize, &Request) -> http::Response<reqwest::Body> + Send + Sync + 'static,
    ) -> Self {
        Self {
            seen: Arc::default(),
            answer: Arc::new(answer),
            delay: std::time::Duration::ZERO,
        }
    }

    /// Takes `delay` (tokio time) to answer each request.
    pub fn with_delay(mut self, delay: std::time::Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Always `200 OK` with an empty body.
    pub fn ok() -> Self {
        Self::new(|_, _| status(200))
    }

    /// Forgets the requests seen so far.
    pub fn forget(&self) {
        self.seen.lock().unwrap().clear();
    }

    /// When each request was seen, from `t0`.
    pub fn sent_at(&self, t0: Instant) -> Vec<std::time::Duration> {
        self.seen().iter().map(|s| s.at - t0).collect()
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn client(&self, throttle: &Throttle) -> ClientWithMiddleware {
        ClientBuilder::new(reqwest::Client::new())
            .with(throttle.clone())
            .with(self.clone())
            .build()
    }
}

/// A response with `status` and an empty body.
pub fn status(code: u16) -> http::Response<reqwest::Body> {
    http::Response::builder()
        .status(code)
        .body(reqwest::Body::from(""))
        .unwrap()
}

#[async_trait::async_trait]
impl Middleware for FakeServer {
    async fn handle(
        &self,
        req: Request,
        _extensions: &mut Extensions,
        _next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let index = {
            let mut seen = self.seen.lock().unwrap();
            seen.push(Seen {
                at: Instant::now(),
                method: req.method().clone(),
                path: req.url().path().to_owned(),
                headers: req.headers().clone(),
                body: req.body().and_then(|b| b.as_bytes()).map(<[u8]>::to_vec),
            });
            seen.len() - 1
        };
        let response = (self.answer)(index, &req);
        tokio::time::sleep(self.delay).await;
        Ok(Response::from(response))
    }
}

/// A response with `status`, `headers` and a JSON `body`.
pub fn json(code: u16, headers: &[(&str, &str)], body: &str) -> http::Response<reqwest::Body> {
    let mut b = http::Response::builder()
        .status(code)
        .header("content-type", "application/json");
    for (name, value) in headers {
        b = b.header(*name, *value);
    }
    b.body(reqwest::Body::from(body.to_owned())).unwrap()
}

/// The `ThrottleInfo` every returned response carries.
pub fn info(r: &reqwest::Response) -> reqwest_throttle::ThrottleInfo {
    r.extensions()
        .get::<reqwest_throttle::ThrottleInfo>()
        .cloned()
        .expect("every response carries ThrottleInfo")
}

/// A current-thread runtime with paused time, for property tests (one per case).
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

/// Lets every runnable task run (time does not move).
pub async fn settle() {
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
}

/// A builder with one sliding window of `limit` per `window` and no guard.
pub fn windowed(limit: u32, window: std::time::Duration) -> reqwest_throttle::ThrottleBuilder {
    Throttle::builder()
        .sliding_window(limit, window)
        .window_guard(std::time::Duration::ZERO)
}

/// The most units sent in any window of length `window` (sends sorted by time), with the
/// start of that window: the check that a sliding window held.
pub fn busiest_window(
    sends: &[(Instant, u32)],
    window: std::time::Duration,
) -> Option<(u32, Instant)> {
    (0..sends.len())
        .map(|i| {
            let start = sends[i].0;
            let used = sends[i..]
                .iter()
                .take_while(|(t, _)| *t < start + window)
                .map(|(_, units)| units)
                .sum();
            (used, start)
        })
        .max_by_key(|&(used, _)| used)
}

/// `429` with a requests-per-minute limit and `Retry-After: secs` for the first request, `200`
/// after.
pub fn refuses_once(secs: &'static str) -> FakeServer {
    FakeServer::new(move |i, _| match i {
        0 => json(
            429,
            &[("retry-after", secs), ("rate_limit_type", "rpm")],
            "{}",
        ),
        _ => status(200),
    })
}

/// `429` for a parallel-requests limit (`Retry-After: 1`) for the first request, `200` after:
/// a learning throttle halves its in-flight cap once, then raises it by one per 10 successes.
pub fn refuses_parallel_once() -> FakeServer {
    FakeServer::new(|i, _| match i {
        0 => json(
            429,
            &[
                ("retry-after", "1"),
                ("rate_limit_type", "parallel_requests"),
            ],
            "{}",
        ),
        _ => status(200),
    })
}

/// A server that answers `503` until `healthy` is set, then `200`.
pub fn fails_until(healthy: std::sync::Arc<std::sync::atomic::AtomicBool>) -> FakeServer {
    FakeServer::new(move |_, _| {
        if healthy.load(std::sync::atomic::Ordering::Relaxed) {
            status(200)
        } else {
            status(503)
        }
    })
}
