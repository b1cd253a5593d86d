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

use super::limits::{Allowances, Decision, LimitType, Limits, UserKey};
use super::{GatewayConfig, GatewayStats, HeaderStyle};

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
    /// The request's ticket in the token window, and the tokens it asked for.
    ticket: u64,
    requested: u32,
}

impl Slot {
    /// Counts the tokens the answer reports used (the request's spend in the token window
    /// becomes that) and returns them.
    fn settle(&self) -> u32 {
        let used = self.shared.config.usage_of(self.requested);
        let now = Instant::now();
        self.shared
            .limits()
            .settle(&self.user, self.ticket, used, now);
        used
    }
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

/// The user of a request: its `Authorization` header.
fn user_of(headers: &HeaderMap) -> UserKey {
    headers
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes().to_vec())
}

/// The tokens a request asks for: the [`TOKEN_COST_HEADER`](super::TOKEN_COST_HEADER) header
/// (a count), else the JSON body's `max_tokens`, else 0.
pub(crate) fn requested_tokens(headers: &HeaderMap, body: &[u8]) -> u32 {
    let from_header = headers
        .get(super::TOKEN_COST_HEADER)
        .and_then(|v| v.to_str().ok()?.trim().parse().ok());
    from_header
        .or_else(|| {
            let json: serde_json::Value = serde_json::from_slice(body).ok()?;
            u32::try_from(json.get("max_tokens")?.as_u64()?).ok()
        })
        .unwrap_or(0)
}

/// Counts the request and either takes a slot for it or says why it is refused.
fn admit(shared: &Arc<Shared>, headers: &HeaderMap, body: &[u8]) -> Result<Slot, Refusal> {
    let user = user_of(headers);
    let requested = requested_tokens(headers, body);
    let now = Instant::now();
    let (decision, ticket) = shared.limits().admit_tokens(&user, requested, now);
    match decision {
        Decision::Admitted => Ok(Slot {
            shared: Arc::clone(shared),
            user,
            held: true,
            ticket,
            requested,
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
        LimitType::Tokens => format!(
            "Too many tokens: at most {} per {:?} window per user.",
            config.tokens_per_window.unwrap_or(0),
            config.window
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

/// Adds the configured rate-limit headers for `user`'s windows to `response`.
fn with_rate_limit_headers(shared: &Shared, user: &UserKey, mut response: Response) -> Response {
    let Some(style) = shared.config.rate_limit_headers else {
        return response;
    };
    let headers = response.headers_mut();
    if style == HeaderStyle::EpochReset {
        let now = Instant::now();
        let (remaining, reset) = shared.limits().window_left(user, now);
        let at = SystemTime::now() + reset.saturating_duration_since(now);
        let since = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let reset_epoch_s = since.as_secs() + u64::from(since.subsec_nanos() > 0);
        headers.insert(
            "x-ratelimit-limit",
            HeaderValue::from(shared.config.requests_per_window),
        );
        headers.insert("x-ratelimit-remaining", HeaderValue::from(remaining));
        headers.insert("x-ratelimit-reset", HeaderValue::from(reset_epoch_s));
        return response;
    }
    let allowances = shared.limits().allowances(user, Instant::now());
    for (name, value) in rate_limit_headers(style, &allowances, SystemTime::now()) {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
    response
}

/// The headers of `style` for `allowances`, as (name, value) pairs.
pub(crate) fn rate_limit_headers(
    style: HeaderStyle,
    allowances: &Allowances,
    now: SystemTime,
) -> Vec<(&'static str, String)> {
    let (limit, remaining, reset) = allowances.requests;
    let requests = (u64::from(limit), u64::from(remaining), reset);
    let tokens = allowances
        .tokens
        .map(|(limit, remaining, reset)| (u64::from(limit), remaining, reset));
    let mut out = Vec::new();
    match style {
        HeaderStyle::Anthropic => {
            let names = [
                (
                    "anthropic-ratelimit-requests-limit",
                    "anthropic-ratelimit-requests-remaining",
                    "anthropic-ratelimit-requests-reset",
                ),
                (
                    "anthropic-ratelimit-tokens-limit",
                    "anthropic-ratelimit-tokens-remaining",
                    "anthropic-ratelimit-tokens-reset",
                ),
            ];
            for (names, values) in names.iter().zip([Some(requests), tokens]) {
                let Some((limit, remaining, reset)) = values else {
                    continue;
                };
                out.push((names.0, limit.to_string()));
                out.push((names.1, remaining.to_string()));
                out.push((names.2, reset_at(now, reset)));
            }
        }
        // Sent by `with_rate_limit_headers` itself: its reset is not the window's.
        HeaderStyle::EpochReset => {}
        HeaderStyle::OpenAi => {
            let names = [
                (
                    "x-ratelimit-limit-requests",
                    "x-ratelimit-remaining-requests",
                    "x-ratelimit-reset-requests",
                ),
                (
                    "x-ratelimit-limit-tokens",
                    "x-ratelimit-remaining-tokens",
                    "x-ratelimit-reset-tokens",
                ),
            ];
            for (names, values) in names.iter().zip([Some(requests), tokens]) {
                let Some((limit, remaining, reset)) = values else {
                    continue;
                };
                out.push((names.0, limit.to_string()));
                out.push((names.1, remaining.to_string()));
                out.push((names.2, go_duration(reset)));
            }
        }
    }
    out
}

/// `d` as a Go duration, rounded up to the millisecond: `0s`, `20ms`, `1.5s`, `6m0s`.
pub(crate) fn go_duration(d: Duration) -> String {
    let millis = d.as_nanos().div_ceil(1_000_000);
    match millis {
        0 => "0s".to_owned(),
        1..=999 => format!("{millis}ms"),
        1_000..=59_999 => {
            let secs = format!("{}.{:03}", millis / 1000, millis % 1000);
            format!("{}s", secs.trim_end_matches('0').trim_end_matches('.'))
        }
        _ => {
            let (mins, rest) = (millis / 60_000, millis % 60_000);
            let secs = format!("{}.{:03}", rest / 1000, rest % 1000);
            format!(
                "{mins}m{}s",
                secs.trim_end_matches('0').trim_end_matches('.')
            )
        }
    }
}

/// `/v1/chat`: waits `service_time`, gives back the slot, then answers with the tokens used.
async fn chat(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let user = user_of(&headers);
    let mut slot = match admit(&shared, &headers, &body) {
        Ok(slot) => slot,
        Err(refusal) => {
            let response = too_many_requests(&shared.config, refusal);
            return with_rate_limit_headers(&shared, &user, response);
        }
    };
    tokio::time::sleep(shared.config.service_time).await;
    let used = slot.settle();
    // Released before the answer exists, so a client that has read the answer can rely
    // on the slot being free.
    slot.release();
    let body = serde_json::json!({
        "object": "chat.completion",
        "choices": [{ "index": 0, "message": { "role": "assistant", "content": "ok" } }],
        "usage": { "prompt_tokens": 0, "completion_tokens": used, "total_tokens": used },
    });
    with_rate_limit_headers(&shared, &user, json_response(StatusCode::OK, &body))
}

/// `/v1/stream`: answers at once with a body of `stream_chunks` events, one every
/// `stream_chunk_interval`; the slot is held until the last event is produced. Its tokens
/// are counted as used when the answer starts.
async fn stream(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let user = user_of(&headers);
    let mut slot = match admit(&shared, &headers, &body) {
        Ok(slot) => slot,
        Err(refusal) => {
            let response = too_many_requests(&shared.config, refusal);
            return with_rate_limit_headers(&shared, &user, response);
        }
    };
    slot.settle();
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
    with_rate_limit_headers(&shared, &user, response)
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
        let slot = admit(&shared, &HeaderMap::new(), b"").expect("first request is admitted");
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
        let _slot = admit(&shared, &HeaderMap::new(), b"").expect("first request is admitted");
        let refusal = admit(&shared, &HeaderMap::new(), b"")
            .err()
            .expect("refused");
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
    fn requested_tokens_come_from_the_header_else_max_tokens() {
        let mut h = HeaderMap::new();
        assert_eq!(requested_tokens(&h, br#"{"max_tokens": 512}"#), 512);
        assert_eq!(requested_tokens(&h, b"{}"), 0);
        assert_eq!(requested_tokens(&h, b"not json"), 0);
        assert_eq!(requested_tokens(&h, br#"{"max_tokens": -1}"#), 0);
        h.insert("x-token-cost", HeaderValue::from_static("900"));
        assert_eq!(requested_tokens(&h, br#"{"max_tokens": 512}"#), 900);
        h.insert("x-token-cost", HeaderValue::from_static("lots"));
        assert_eq!(requested_tokens(&h, br#"{"max_tokens": 512}"#), 512);
    }

    #[test]
    fn go_durations_round_up_to_the_millisecond() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_micros(1), "1ms"),
            (Duration::from_millis(20), "20ms"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_secs(6), "6s"),
            (Duration::from_millis(59_999), "59.999s"),
            (Duration::from_secs(360), "6m0s"),
            (Duration::from_millis(61_250), "1m1.25s"),
        ];
        for (d, want) in cases {
            assert_eq!(go_duration(d), want, "{d:?}");
        }
    }

    #[test]
    fn rate_limit_headers_parse_back_into_hints() {
        let allowances = Allowances {
            requests: (120, 7, Duration::from_secs(6)),
            tokens: Some((10_000, 2_500, Duration::from_millis(1_500))),
        };
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        for style in [HeaderStyle::Anthropic, HeaderStyle::OpenAi] {
            let mut map = http::HeaderMap::new();
            for (name, value) in rate_limit_headers(style, &allowances, now) {
                map.insert(name, value.parse().unwrap());
            }
            let hints = crate::headers::parse(&map, now);
            let tokens = hints.tokens.expect("a token allowance");
            let requests = hints.requests.expect("a request allowance");
            assert_eq!(
                (tokens.limit, tokens.remaining, tokens.reset_after),
                (
                    Some(10_000),
                    Some(2_500),
                    Some(Duration::from_millis(1_500))
                ),
                "{style:?}"
            );
            assert_eq!(
                (requests.limit, requests.remaining, requests.reset_after),
                (Some(120), Some(7), Some(Duration::from_secs(6))),
                "{style:?}"
            );
        }
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
