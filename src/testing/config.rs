//! Settings of the simulated gateway.

use std::time::Duration;

/// Requests one user may send per window in the reference gateway.
const SEED_REQUESTS_PER_WINDOW: u32 = 120;
/// Length of the reference gateway's rate-limit window: one minute.
const SEED_WINDOW: Duration = Duration::from_secs(60);
/// Requests one user may have in progress at once in the reference gateway.
const SEED_MAX_PARALLEL: u32 = 20;

/// Limits and timings of a [`Gateway`](super::Gateway).
///
/// [`GatewayConfig::default()`] gives the reference gateway's per-user limits
/// (120 requests per 60 s window, 20 requests in progress at once) and short service
/// times so tests run quickly. Change fields directly or with the `with_*` methods:
///
/// ```
/// use std::time::Duration;
/// use reqwest_throttle::testing::GatewayConfig;
///
/// let config = GatewayConfig::default()
///     .with_requests_per_window(3)
///     .with_window(Duration::from_secs(10))
///     .with_max_parallel(1);
/// assert_eq!(config.requests_per_window, 3);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct GatewayConfig {
    /// Admitted requests one user may send within any span of [`window`](Self::window),
    /// in requests. Default: 120.
    pub requests_per_window: u32,
    /// Length of the sliding rate-limit window. Also the `retry-after` value of every
    /// 429 (in whole seconds, rounded up). Default: 60 s.
    pub window: Duration,
    /// Requests one user may have in progress at the same time, in requests. Default: 20.
    pub max_parallel: u32,
    /// How long `/v1/chat` takes to answer an admitted request. Default: 50 ms.
    pub service_time: Duration,
    /// Number of body chunks `/v1/stream` sends for an admitted request, in chunks.
    /// Default: 5.
    pub stream_chunks: u32,
    /// Pause before each chunk of a `/v1/stream` answer (the first one included).
    /// Default: 20 ms.
    pub stream_chunk_interval: Duration,
    /// Tokens one user may use within any span of [`window`](Self::window), in tokens;
    /// `None`: no token limit. Default: `None`. See the [module docs](super) for how a
    /// request's tokens are counted.
    pub tokens_per_window: Option<u32>,
    /// The share of a request's requested tokens its answer reports used (`usage`), rounded
    /// up: 1.0 uses them all. Values outside `0.0..=1.0` are clamped. Default: 1.0.
    pub usage_fraction: f64,
    /// Rate-limit headers sent on every answer (200 and 429), or `None`. Default: `None`.
    pub rate_limit_headers: Option<HeaderStyle>,
}

/// Which family of rate-limit headers the gateway sends on every answer; both report the
/// requests and the tokens of the user's sliding windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// `anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`, the reset in RFC 3339
    /// (when the window is whole again).
    Anthropic,
    /// `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, the reset as a Go duration
    /// (`1.5s`, `6m0s`: the time until the window is whole again).
    OpenAi,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` of the request
    /// window, as moving-window servers send them: the reset is when the oldest counted
    /// request leaves the window, in whole Unix epoch seconds rounded up (so up to 1 s late).
    /// No tokens.
    EpochReset,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            requests_per_window: SEED_REQUESTS_PER_WINDOW,
            window: SEED_WINDOW,
            max_parallel: SEED_MAX_PARALLEL,
            service_time: Duration::from_millis(50),
            stream_chunks: 5,
            stream_chunk_interval: Duration::from_millis(20),
            tokens_per_window: None,
            usage_fraction: 1.0,
            rate_limit_headers: None,
        }
    }
}

impl GatewayConfig {
    /// The reference gateway's limits: 120 requests per 60 s window and 20 requests in
    /// progress per user. Same as [`GatewayConfig::default()`].
    pub fn seed_limits() -> Self {
        Self::default()
    }

    /// The reference gateway's limits with time sped up by `factor`: the window is
    /// `60 s / factor` (so `retry-after` shrinks with it, in whole seconds rounded up),
    /// while the request count per window (120) and the parallel cap (20) stay the same.
    /// Service and stream timings keep their defaults.
    ///
    /// `seed_limits_scaled(10.0)` allows 120 requests per 6 s window.
    ///
    /// # Panics
    ///
    /// If `factor` is not a finite number greater than zero, or so small that the
    /// window would overflow a [`Duration`].
    pub fn seed_limits_scaled(factor: f64) -> Self {
        assert!(
            factor.is_finite() && factor > 0.0,
            "time scale factor must be finite and > 0, got {factor}"
        );
        Self::default().with_window(Duration::from_secs_f64(SEED_WINDOW.as_secs_f64() / factor))
    }

    /// Sets [`requests_per_window`](Self::requests_per_window), in requests.
    pub fn with_requests_per_window(mut self, requests: u32) -> Self {
        self.requests_per_window = requests;
        self
    }

    /// Sets [`window`](Self::window), the length of the sliding window.
    pub fn with_window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Sets [`max_parallel`](Self::max_parallel), in requests in progress at once.
    pub fn with_max_parallel(mut self, max_parallel: u32) -> Self {
        self.max_parallel = max_parallel;
        self
    }

    /// Sets [`service_time`](Self::service_time), the time `/v1/chat` takes to answer.
    pub fn with_service_time(mut self, service_time: Duration) -> Self {
        self.service_time = service_time;
        self
    }

    /// Sets [`stream_chunks`](Self::stream_chunks), in chunks per streamed answer.
    pub fn with_stream_chunks(mut self, chunks: u32) -> Self {
        self.stream_chunks = chunks;
        self
    }

    /// Sets [`stream_chunk_interval`](Self::stream_chunk_interval), the pause before
    /// each streamed chunk.
    pub fn with_stream_chunk_interval(mut self, interval: Duration) -> Self {
        self.stream_chunk_interval = interval;
        self
    }

    /// Sets [`tokens_per_window`](Self::tokens_per_window), in tokens per window.
    pub fn with_tokens_per_window(mut self, tokens: u32) -> Self {
        self.tokens_per_window = Some(tokens);
        self
    }

    /// Sets [`usage_fraction`](Self::usage_fraction).
    pub fn with_usage_fraction(mut self, fraction: f64) -> Self {
        self.usage_fraction = fraction;
        self
    }

    /// Sets [`rate_limit_headers`](Self::rate_limit_headers).
    pub fn with_rate_limit_headers(mut self, style: HeaderStyle) -> Self {
        self.rate_limit_headers = Some(style);
        self
    }

    /// The tokens an answer reports used for a request of `requested` tokens:
    /// `requested × usage_fraction`, rounded up.
    pub fn usage_of(&self, requested: u32) -> u32 {
        let fraction = if self.usage_fraction.is_nan() {
            1.0
        } else {
            self.usage_fraction.clamp(0.0, 1.0)
        };
        (f64::from(requested) * fraction).ceil() as u32
    }

    /// How long one streamed answer takes: `stream_chunks × stream_chunk_interval`.
    pub fn stream_time(&self) -> Duration {
        self.stream_chunk_interval
            .saturating_mul(self.stream_chunks)
    }

    /// The least time in which one user can have `chats` plain and `streams` streamed answers
    /// from this gateway, the last one streamed if `last_streamed`: the window limit (the first
    /// `requests_per_window` at once, then as many per window, plus the last answer) or the
    /// parallel cap over the total busy time, whichever is longer. The yardstick for a client's
    /// wall time.
    pub fn least_time(&self, chats: usize, streams: usize, last_streamed: bool) -> Duration {
        let requests = (chats + streams).max(1);
        let per_window = (self.requests_per_window.max(1)) as usize;
        let windows = ((requests - 1) / per_window) as u32;
        let last = if last_streamed {
            self.stream_time()
        } else {
            self.service_time
        };
        let by_window = self.window.saturating_mul(windows).saturating_add(last);
        let busy = self.service_time.as_secs_f64() * chats as f64
            + self.stream_time().as_secs_f64() * streams as f64;
        let by_parallel = Duration::from_secs_f64(busy / f64::from(self.max_parallel.max(1)));
        by_window.max(by_parallel)
    }

    /// The `retry-after` value of a 429: the window length in whole seconds, rounded up.
    pub(crate) fn retry_after_secs(&self) -> u64 {
        let w = self.window;
        w.as_secs() + u64::from(w.subsec_nanos() > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_seed_limits() {
        let c = GatewayConfig::default();
        assert_eq!(c.requests_per_window, 120);
        assert_eq!(c.window, Duration::from_secs(60));
        assert_eq!(c.max_parallel, 20);
        assert_eq!(c.service_time, Duration::from_millis(50));
        assert_eq!(c.stream_chunks, 5);
        assert_eq!(c.stream_chunk_interval, Duration::from_millis(20));
        assert_eq!(c.retry_after_secs(), 60);
        assert_eq!(GatewayConfig::seed_limits(), c);
    }

    #[test]
    fn scaled_limits_shrink_only_the_window() {
        let c = GatewayConfig::seed_limits_scaled(10.0);
        assert_eq!(c.window, Duration::from_secs(6));
        assert_eq!(c.retry_after_secs(), 6);
        assert_eq!(c.requests_per_window, 120);
        assert_eq!(c.max_parallel, 20);
    }

    #[test]
    fn retry_after_rounds_up() {
        let c = GatewayConfig::default().with_window(Duration::from_millis(1500));
        assert_eq!(c.retry_after_secs(), 2);
        let c = GatewayConfig::seed_limits_scaled(1000.0);
        assert_eq!(c.window, Duration::from_millis(60));
        assert_eq!(c.retry_after_secs(), 1);
        let c = GatewayConfig::default().with_window(Duration::ZERO);
        assert_eq!(c.retry_after_secs(), 0);
    }

    #[test]
    #[should_panic(expected = "time scale factor")]
    fn scaled_limits_reject_zero() {
        let _ = GatewayConfig::seed_limits_scaled(0.0);
    }

    #[test]
    fn least_time_is_the_window_or_the_parallel_bound() {
        let seed = GatewayConfig::seed_limits_scaled(10.0);
        assert_eq!(seed.stream_time(), Duration::from_millis(100));
        // 600 requests at 120 per 6 s: the last goes at 24 s, and it streams (100 ms).
        assert_eq!(
            seed.least_time(480, 120, true),
            Duration::from_millis(24_100)
        );
        assert_eq!(
            seed.least_time(480, 120, false),
            Duration::from_millis(24_050)
        );
        // A window that never binds: 40 answers of 50 ms, 20 at a time.
        let wide = seed.with_requests_per_window(1_000);
        assert_eq!(wide.least_time(40, 0, false), Duration::from_millis(100));
    }
}
