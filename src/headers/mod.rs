//! Rate-limit hints read from a response: headers in, plain values out.
//!
//! This module knows nothing of tokio or reqwest: it takes an [`http::HeaderMap`]
//! (and, for error answers, a short body) and a wall-clock `now`, and returns
//! [`Hints`]. Malformed input gives "no hint" (`None`), never a panic and never
//! a zero wait that the server did not ask for.

use std::time::{Duration, SystemTime};

use http::HeaderMap;

/// The longest delay any hint may carry: 366 days. Larger values saturate here.
pub const MAX_HINT_DELAY: Duration = Duration::from_secs(366 * 24 * 60 * 60);

/// What a response said about the client's rate limits.
///
/// Every field is optional: a server sends some of them or none.
/// All delays are relative to the `now` given to [`parse`], never negative,
/// and at most [`MAX_HINT_DELAY`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Hints {
    /// How long the server asked the client to wait before sending again:
    /// `retry-after-ms` (milliseconds) when present and valid, else `Retry-After`
    /// (RFC 9110 §10.2.3: delay-seconds or an HTTP-date).
    pub retry_after: Option<Duration>,
    /// Which limit the server says was exceeded (the gateway's `rate_limit_type` header).
    pub limit_kind: Option<LimitKind>,
    /// Time until the exceeded limit resets (the gateway's `reset_at` header).
    pub reset_after: Option<Duration>,
    /// The request-count allowance the server reported, if any.
    pub requests: Option<Allowance>,
    /// The token allowance the server reported, if any.
    pub tokens: Option<Allowance>,
}

/// One allowance reported by a server: a limit, what remains of it, and when it resets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Allowance {
    /// The limit for the current window, in requests or tokens.
    pub limit: Option<u64>,
    /// How much of the limit is left in the current window.
    pub remaining: Option<u64>,
    /// Time until the window resets, relative to `now`.
    pub reset_after: Option<Duration>,
}

/// The kind of limit a `rate_limit_type` header names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LimitKind {
    /// A cap on requests in flight at once (`parallel_requests`, `concurrent`, ...).
    /// It clears when one of the caller's requests finishes, usually well before `Retry-After`.
    Concurrency,
    /// A cap on requests per time window (`requests_per_minute`, `rpm`, ...): it clears at the reset.
    Requests,
    /// A cap on tokens per time window (`tokens_per_minute`, `tpm`, ...): it clears at the reset.
    Tokens,
    /// A value this crate does not recognise.
    Other,
}

impl LimitKind {
    /// Whether this limit clears at a window reset (rather than when a request finishes).
    pub fn is_window(self) -> bool {
        matches!(self, LimitKind::Requests | LimitKind::Tokens)
    }
}

/// Reads every hint this crate understands from `headers`, with `now` as the wall-clock time
/// against which HTTP-dates and absolute reset times are turned into delays.
pub fn parse(headers: &HeaderMap, now: SystemTime) -> Hints {
    Hints {
        retry_after: retry_after(headers, now),
        limit_kind: header_str(headers, "rate_limit_type").map(limit_kind),
        reset_after: header_str(headers, "reset_at").and_then(|v| reset_at(v, now)),
        requests: None,
        tokens: None,
    }
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name)?.to_str().ok().map(str::trim)
}

fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let v = header_str(headers, "retry-after")?;
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        let secs = v.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(secs).min(MAX_HINT_DELAY));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(
        at.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(MAX_HINT_DELAY),
    )
}

fn limit_kind(v: &str) -> LimitKind {
    let v = v.to_ascii_lowercase();
    if v.contains("parallel") || v.contains("concurren") {
        LimitKind::Concurrency
    } else if v.contains("token") || v == "tpm" {
        LimitKind::Tokens
    } else if v.contains("request") || v == "rpm" {
        LimitKind::Requests
    } else {
        LimitKind::Other
    }
}

fn reset_at(v: &str, now: SystemTime) -> Option<Duration> {
    let ts: jiff::Timestamp = v.parse().ok()?;
    let at = SystemTime::try_from(ts).ok()?;
    Some(
        at.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(MAX_HINT_DELAY),
    )
}
