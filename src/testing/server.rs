//! The HTTP side of the gateway: axum routes over the accounting in [`super::limits`].

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{ready, Context, Poll};
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http_body::Frame;
use tokio::time::{Instant, Sleep};

use super::limits::{Decision, LimitType, Limits, UserKey};
use super::{GatewayConfig, GatewayStats};

/// State shared by the routes and the [`Gateway`](super::Gateway) handle.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: GatewayConfig,
    limits: Mutex<Limits>,
}

impl Shared {
    pub(crate) fn new(config: GatewayConfig) -> Self {
        let limits = Mutex::new(Limits::new(&config));
        Shared { config, limits }
    }

    /// Locks the accounting. The guard must never be held across an `.await`.
    fn limits(&self) -> MutexGuard<'_, Limits> {
        self.limits.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn stats(&self) -> GatewayStats {
        self.limits().stats()
    }

    pub(crate) fn reset_stats(&self) {
        self.limits().reset_stats();
    }
}

/// The routes of the gateway.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/chat", get(chat).post(chat))
        .route("/v1/stream", get(stream).post(stream))
        .route("/stats", get(stats))
        .with_state(shared)
}

/// A parallel slot held by an admitted request; given back by [`Slot::release`] or on drop
/// (a handler cancelled, a streamed body dropped when the client goes away).
struct Slot {
    shared: Arc<Shared>,
    user: UserKey,
    held: bool,
}

impl Slot {
    fn release(&mut self) {
        if std::mem::take(&mut self.held) {
            self.shared.limits().release(&self.user);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.release();
    }
}

/// Why a request was refused: the limit, and the time until it clears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Refusal {
    limit: LimitType,
    reset_in: Duration,
}

/// The `X-RateLimit-*` headers of an answer, when the gateway reports them: the window
/// left after this request, its reset in whole epoch seconds rounded up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WindowLeft {
    limit: u32,
    remaining: u32,
    reset_epoch_s: u64,
}

impl WindowLeft {
    fn insert(self, headers: &mut HeaderMap) {
        headers.insert("x-ratelimit-limit", HeaderValue::from(self.limit));
        headers.insert("x-ratelimit-remaining", HeaderValue::from(self.remaining));
        headers.insert("x-ratelimit-reset", HeaderValue::from(self.reset_epoch_s));
    }
}

/// Counts the request and either takes a slot for it or says why it is refused, with the
/// window left when the gateway reports it. The request body is not read: hyper discards it.
fn admit(shared: &Arc<Shared>, headers: &HeaderMap) -> (Result<Slot, Refusal>, Option<WindowLeft>) {
    let user: UserKey = headers
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes().to_vec());
    let now = Instant::now();
    let (decision, left) = {
        let mut limits = shared.limits();
        let decision = limits.admit(&user, now);
        (decision, limits.window_left(&user, now))
    };
    let left = shared.config.ratelimit_headers.then(|| {
        let (remaining, reset) = left;
        let at = SystemTime::now() + reset.saturating_duration_since(now);
        let since = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        WindowLeft {
            limit: shared.config.requests_per_window,
            remaining,
            reset_epoch_s: since.as_secs() + u64::from(since.subsec_nanos() > 0),
        }
    });
    (admit_decision(shared, user, decision), left)
}

fn admit_decision(
    shared: &Arc<Shared>,
    user: UserKey,
    decision: Decision,
) -> Result<Slot, Refusal> {
    let now = Instant::now();
    match decision {
        Decision::Admitted => Ok(Slot {
            shared: Arc::clone(shared),
            user,
            held: true,
        }),
        Decision::Refused { limit, reset } => Err(Refusal {
            limit,
            reset_in: reset.saturating_duration_since(now),
        }),
    }
}

/// The 429 answer for a refusal.
fn too_many_requests(config: &GatewayConfig, refusal: Refusal) -> Response {
    let Refusal { limit, reset_in } = refusal;
    let message = match limit {
        LimitType::Parallel => format!(
            "Too many parallel requests: at most {} in progress per user.",
            config.max_parallel
        ),
        LimitType::Window => format!(
            "Too many requests: at most {} per {:?} window per user.",
            config.requests_per_window, config.window
        ),
    };
    let body = serde_json::json!({
        "error": { "type": "rate_limit_error", "message": message }
    });
    let mut response = json_response(StatusCode::TOO_MANY_REQUESTS, &body);
    let headers = response.headers_mut();
    headers.insert(
        header::RETRY_AFTER,
        HeaderValue::from(config.retry_after_secs()),
    );
    headers.insert(
        "rate_limit_type",
        HeaderValue::from_static(limit.header_value()),
    );
    if let Ok(v) = HeaderValue::from_str(&reset_at(SystemTime::now(), reset_in)) {
        headers.insert("reset_at", v);
    }
    response
}

/// `now + reset_in` as RFC 3339 UTC to the millisecond, rounded up so that waiting until
/// the stated time is never too early.
pub(crate) fn reset_at(now: SystemTime, reset_in: Duration) -> String {
    let at = now.checked_add(reset_in).unwrap_or(now);
    let Ok(ts) = jiff::Timestamp::try_from(at) else {
        return jiff::Timestamp::MAX.to_string();
    };
    let millis = ts.as_millisecond() + i64::from(ts.subsec_nanosecond() % 1_000_000 > 0);
    jiff::Timestamp::from_millisecond(millis)
        .unwrap_or(jiff::Timestamp::MAX)
        .to_string()
}

fn json_response<T: serde::Serialize>(status: StatusCode, value: &T) -> Response {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// `/v1/chat`: waits `service_time`, gives back the slot, then answers.
async fn chat(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let (admitted, left) = admit(&shared, &headers);
    let mut slot = match admitted {
        Ok(slot) => slot,
        Err(refusal) => return with_left(too_many_requests(&shared.config, refusal), left),
    };
    tokio::time::sleep(shared.config.service_time).await;
    // Released before the answer exists, so a client that has read the answer can rely
    // on the slot being free.
    slot.release();
    let body = serde_json::json!({
        "object": "chat.completion",
        "choices": [{ "index": 0, "message": { "role": "assistant", "content": "ok" } }],
    });
    with_left(json_response(StatusCode::OK, &body), left)
}

fn with_left(mut response: Response, left: Option<WindowLeft>) -> Response {
    if let Some(left) = left {
        left.insert(response.headers_mut());
    }
    response
}

/// `/v1/stream`: answers at once with a body of `stream_chunks` events, one every
/// `stream_chunk_interval`; the slot is held until the last event is produced.
async fn stream(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let (admitted, left) = admit(&shared, &headers);
    let mut slot = match admitted {
        Ok(slot) => slot,
        Err(refusal) => return with_left(too_many_requests(&shared.config, refusal), left),
    };
    let total = shared.config.stream_chunks;
    let interval = shared.config.stream_chunk_interval;
    if total == 0 {
        slot.release();
    }
    let mut response = Response::new(Body::new(ChunkBody::new(slot, total, interval)));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    with_left(response, left)
}

/// A streamed answer: `total` server-sent events, each after a pause of `interval`.
struct ChunkBody {
    slot: Slot,
    sent: u32,
    total: u32,
    interval: Duration,
    sleep: Pin<Box<Sleep>>,
}

impl ChunkBody {
    fn new(slot: Slot, total: u32, interval: Duration) -> Self {
        ChunkBody {
            slot,
            sent: 0,
            total,
            interval,
            sleep: Box::pin(tokio::time::sleep(interval)),
        }
    }
}

impl http_body::Body for ChunkBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if this.sent >= this.total {
            this.slot.release();
            return Poll::Ready(None);
        }
        ready!(this.sleep.as_mut().poll(cx));
        this.sent += 1;
        let last = this.sent == this.total;
        if last {
            // Given back while producing the final event, before it is handed to hyper.
            this.slot.release();
        } else {
            let next = Instant::now() + this.interval;
            this.sleep.as_mut().reset(next);
        }
        let event = format!(
            "data: {{\"index\":{},\"of\":{},\"done\":{}}}\n\n",
            this.sent, this.total, last
        );
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(event)))))
    }

    fn is_end_stream(&self) -> bool {
        self.sent >= self.total
    }
}

/// `/stats`: the counters as JSON.
async fn stats(State(shared): State<Arc<Shared>>) -> Response {
    json_response(StatusCode::OK, &shared.stats())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;

    /// Admits one anonymous request and wraps its slot in a stream body.
    fn admitted_stream(total: u32) -> (Arc<Shared>, ChunkBody) {
        let shared = Arc::new(Shared::new(GatewayConfig::default().with_max_parallel(1)));
        let slot = admit(&shared, &HeaderMap::new())
            .0
            .expect("first request is admitted");
        let body = ChunkBody::new(slot, total, Duration::from_secs(1));
        (shared, body)
    }

    fn in_progress(shared: &Shared) -> u32 {
        shared.limits().in_progress(&None)
    }

    async fn next_frame(body: &mut ChunkBody) -> Option<Bytes> {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await?;
        Some(
            frame
                .expect("infallible")
                .into_data()
                .expect("a data frame"),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn stream_body_gives_the_slot_back_with_its_last_chunk() {
        let (shared, mut body) = admitted_stream(3);
        let start = Instant::now();
        for i in 1..=3u64 {
            assert_eq!(in_progress(&shared), 1, "before chunk {i}");
            let chunk = next_frame(&mut body).await.expect("a chunk");
            assert_eq!(Instant::now() - start, Duration::from_secs(i));
            let expected = format!("data: {{\"index\":{i},\"of\":3,\"done\":{}}}\n\n", i == 3);
            assert_eq!(chunk, expected.as_bytes());
        }
        // The final chunk is out and the slot is free, though the body still exists.
        assert_eq!(in_progress(&shared), 0);
        assert!(body.is_end_stream());
        assert_eq!(next_frame(&mut body).await, None);
        drop(body);
        assert_eq!(in_progress(&shared), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn dropped_stream_body_gives_the_slot_back() {
        let (shared, mut body) = admitted_stream(3);
        assert!(next_frame(&mut body).await.is_some());
        assert_eq!(in_progress(&shared), 1);
        drop(body);
        assert_eq!(in_progress(&shared), 0);
        assert_eq!(shared.stats().peak_parallel, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn refusal_has_the_three_headers_and_a_json_body() {
        let shared = Arc::new(Shared::new(GatewayConfig::default().with_max_parallel(1)));
        let _slot = admit(&shared, &HeaderMap::new())
            .0
            .expect("first request is admitted");
        let refusal = admit(&shared, &HeaderMap::new()).0.err().expect("refused");
        assert_eq!(refusal.limit, LimitType::Parallel);
        assert_eq!(refusal.reset_in, Duration::from_secs(60));
        let response = too_many_requests(&shared.config, refusal);
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        let h = response.headers();
        assert_eq!(h["retry-after"], "60");
        assert_eq!(h["rate_limit_type"], "parallel_requests");
        let reset: jiff::Timestamp = h["reset_at"].to_str().unwrap().parse().unwrap();
        assert_eq!(reset.subsec_nanosecond() % 1_000_000, 0);
        assert_eq!(h["content-type"], "application/json");
    }

    #[test]
    fn reset_at_rounds_up_to_whole_milliseconds() {
        let base = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(reset_at(base, Duration::ZERO), "2023-11-14T22:13:20Z");
        assert_eq!(
            reset_at(base, Duration::from_micros(1)),
            "2023-11-14T22:13:20.001Z"
        );
        assert_eq!(
            reset_at(base + Duration::from_millis(999), Duration::from_secs(59)),
            "2023-11-14T22:14:19.999Z"
        );
        assert_eq!(
            reset_at(base, Duration::from_secs(60)),
            "2023-11-14T22:14:20Z"
        );
    }
}
