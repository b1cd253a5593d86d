//! [`ThrottleBuilder`]: settings, their defaults, and validation.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::Quota;
use http::HeaderName;

use crate::charge::{UsageFromBody, UsageFromHeaders};
use crate::clock::FAR_FUTURE;
use crate::engine::{Bounds, EngineConfig, Scope};
use crate::error::BuildError;
use crate::learn::{CircuitBreaker, LearnConfig, RetryAfterPolicy, DEFAULT_PROBE_AFTER};
use crate::observe::{ObserveConfig, DEFAULT_CAPACITY_WARNING, DEFAULT_EVENT_BUFFER};
use crate::policy::{Backoff, Jitter, RetryBudget, RetryPolicy};
use crate::store::{Backend, Limits, Unit, WindowQuota, MAX_TOKEN_BUCKETS};
use crate::throttle::{Settings, Throttle};

/// Default number of retries after the first attempt.
pub const DEFAULT_MAX_RETRIES: u32 = 6;
/// Default first backoff delay: 1 s.
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_secs(1);
/// Default largest backoff delay: 60 s.
pub const DEFAULT_BACKOFF_CAP: Duration = Duration::from_secs(60);
/// Default longest wait the throttle honours when a server asks for one: 120 s.
pub const DEFAULT_MAX_SERVER_WAIT: Duration = Duration::from_secs(120);
/// Default time a send stays counted past its sliding window: 100 ms.
pub const DEFAULT_WINDOW_GUARD: Duration = Duration::from_millis(100);
/// Default most scopes alive at once: 10,000.
pub const DEFAULT_MAX_SCOPES: usize = 10_000;
/// Default time an idle scope is kept after its last use: 10 minutes.
pub const DEFAULT_SCOPE_IDLE_TTL: Duration = Duration::from_secs(10 * 60);
/// Default aging bound: a request waiting this long goes before every later arrival: 30 s.
pub const DEFAULT_PRIORITY_AGING: Duration = Duration::from_secs(30);

/// Builds a [`Throttle`]. Setters never panic; [`build`](Self::build) checks everything.
///
/// # Defaults
/// | setting | default | unit |
/// |---|---|---|
/// | quotas ([`sliding_window`](Self::sliding_window), [`token_bucket`](Self::token_bucket)) | none | |
/// | [`max_in_flight`](Self::max_in_flight) | no cap | requests |
/// | [`max_retries`](Self::max_retries) | 6 | retries after the first attempt |
/// | [`backoff`](Self::backoff) | 1 s doubling to 60 s | seconds |
/// | [`jitter`](Self::jitter) | on | |
/// | [`jitter_seed`](Self::jitter_seed) | drawn from the thread RNG | |
/// | [`max_server_wait`](Self::max_server_wait) | 120 s | seconds |
/// | [`window_guard`](Self::window_guard) | 100 ms | milliseconds |
/// | [`idempotency_key`](Self::idempotency_key) | none (no key added) | |
/// | [`deadline`](Self::deadline) | none | seconds |
/// | [`retry_budget`](Self::retry_budget) | 20 % of requests + 10 per second, over 10 s | retries |
/// | [`scope`](Self::scope) | [`Scope::per_authority`] | |
/// | [`max_scopes`](Self::max_scopes) | 10,000 | scopes |
/// | [`scope_idle_ttl`](Self::scope_idle_ttl) | 10 min | seconds |
/// | [`priority_aging`](Self::priority_aging) | 30 s | seconds |
/// | [`settle_from_headers`](Self::settle_from_headers) | none | |
/// | [`settle_from_body`](Self::settle_from_body) | none | bytes |
/// | [`learn_limits`](Self::learn_limits) | on when no quota is configured | |
/// | [`circuit_breaker`](Self::circuit_breaker) | open after 5 failures, for 60 s | |
/// | [`retry_after_policy`](Self::retry_after_policy) | [`RetryAfterPolicy::Strict`] | |
/// | [`probe_after`](Self::probe_after) | 30 s | seconds |
/// | [`name_scope`](Self::name_scope) | no scope named | |
/// | [`capacity_warning`](Self::capacity_warning) | 80 | percent of a limit |
/// | [`event_buffer`](Self::event_buffer) | 256 | events |
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct ThrottleBuilder {
    windows: Vec<(u32, Duration)>,
    /// The unit of each window that does not count the cost, by index.
    units: Vec<(usize, Unit)>,
    buckets: Vec<Quota>,
    max_in_flight: Option<usize>,
    max_retries: u32,
    backoff: (Duration, Duration),
    jitter: bool,
    seed: Option<u64>,
    max_server_wait: Duration,
    window_guard: Duration,
    key_header: Option<HeaderName>,
    deadline: Option<Duration>,
    budget: Option<RetryBudget>,
    scope: Scope,
    store: Backend,
    max_scopes: usize,
    scope_idle_ttl: Duration,
    priority_aging: Duration,
    usage_from_headers: Option<UsageFromHeaders>,
    usage_from_body: Option<UsageFromBody>,
    learn: Option<bool>,
    breaker: Option<CircuitBreaker>,
    retry_after_policy: RetryAfterPolicy,
    probe_after: Duration,
    names: Vec<ScopeName>,
    capacity_warning: u8,
    event_buffer: usize,
}

/// A name for the scope of an example request. Its `Debug` shows the name only (the example
/// may carry a secret header).
struct ScopeName {
    name: Arc<str>,
    /// The example, without a body.
    example: reqwest::Request,
}

impl ScopeName {
    fn new(name: Arc<str>, example: &reqwest::Request) -> Self {
        let mut copy = reqwest::Request::new(example.method().clone(), example.url().clone());
        copy.headers_mut().clone_from(example.headers());
        Self {
            name,
            example: copy,
        }
    }
}

impl Clone for ScopeName {
    fn clone(&self) -> Self {
        Self::new(self.name.clone(), &self.example)
    }
}

impl std::fmt::Debug for ScopeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ScopeName").field(&self.name).finish()
    }
}

impl Default for ThrottleBuilder {
    fn default() -> Self {
        Self {
            windows: Vec::new(),
            units: Vec::new(),
            buckets: Vec::new(),
            max_in_flight: None,
            max_retries: DEFAULT_MAX_RETRIES,
            backoff: (DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP),
            jitter: true,
            seed: None,
            max_server_wait: DEFAULT_MAX_SERVER_WAIT,
            window_guard: DEFAULT_WINDOW_GUARD,
            key_header: None,
            deadline: None,
            budget: Some(RetryBudget::default()),
            scope: Scope::default(),
            store: Backend::default(),
            max_scopes: DEFAULT_MAX_SCOPES,
            scope_idle_ttl: DEFAULT_SCOPE_IDLE_TTL,
            priority_aging: DEFAULT_PRIORITY_AGING,
            usage_from_headers: None,
            usage_from_body: None,
            learn: None,
            breaker: Some(CircuitBreaker::default()),
            retry_after_policy: RetryAfterPolicy::Strict,
            probe_after: DEFAULT_PROBE_AFTER,
            names: Vec::new(),
            capacity_warning: DEFAULT_CAPACITY_WARNING,
            event_buffer: DEFAULT_EVENT_BUFFER,
        }
    }
}

impl ThrottleBuilder {
    /// A builder with the defaults above.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a sliding-window quota: at most `limit` requests (quota units, see
    /// [`Cost`](crate::Cost)) sent in any window of length `window`, counted exactly.
    /// The first `limit` may go at once. This is what a server that counts "N per minute" over
    /// a sliding window enforces. May be called several times; every quota must admit a request.
    ///
    /// `build` fails with [`BuildError::ZeroLimit`] for a zero `limit`,
    /// [`BuildError::ZeroWindow`] for a zero `window`, and [`BuildError::WindowGuardTooLong`]
    /// for a `window` shorter than the [`window_guard`](Self::window_guard) (100 ms by
    /// default); each names the window by its index, 0 for the first added.
    pub fn sliding_window(mut self, limit: u32, window: Duration) -> Self {
        self.windows.push((limit, window));
        self
    }

    /// Adds a token-bucket quota (`governor`'s GCRA): cells replenish at the quota's rate, up to
    /// its burst size.
    ///
    /// A bucket with burst B and rate N per window W admits up to B + N − 1 requests in the
    /// first window of length W (e.g. `Quota::per_minute(120)` lets 239 through a rolling
    /// minute): against a server that counts a sliding window, use
    /// [`sliding_window`](Self::sliding_window). At most 64 token buckets.
    ///
    /// [`Quota`] is re-exported as `reqwest_throttle::Quota`, so `governor` need not be a
    /// dependency of yours:
    /// ```
    /// use std::num::NonZeroU32;
    /// use reqwest_throttle::{Quota, Throttle};
    ///
    /// let per_second = NonZeroU32::new(50).unwrap();
    /// let burst = NonZeroU32::new(20).unwrap();
    /// let throttle = Throttle::builder()
    ///     .token_bucket(Quota::per_second(per_second).allow_burst(burst))
    ///     .build()?;
    /// # drop(throttle);
    /// # Ok::<(), reqwest_throttle::BuildError>(())
    /// ```
    ///
    /// `build` fails with [`BuildError::TooManyTokenBuckets`] past 64, and
    /// [`BuildError::TokenBucketTooSlow`] (naming the bucket by its index, 0 for the first
    /// added) for a bucket that takes over 100 years to refill its burst.
    pub fn token_bucket(mut self, quota: Quota) -> Self {
        self.buckets.push(quota);
        self
    }

    /// Caps requests in flight at `n`. A request is in flight from its send until its response
    /// body has been read to the end or dropped (so a streaming response counts until it
    /// finishes). A body whose read fails (a client timeout, a cut connection) stays in flight
    /// until the response is dropped: until then it holds its connection, which the server
    /// still counts. The cap applies to each [`scope`](Self::scope). Waiters are served
    /// highest [`Priority`](crate::Priority) first, first in first out within a priority.
    ///
    /// `build` fails with [`BuildError::ZeroInFlight`] for 0, and
    /// [`BuildError::InFlightTooLarge`] above tokio's semaphore limit.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = Some(n);
        self
    }

    /// Retries after the first attempt (so at most `n + 1` attempts). 0 turns retries off.
    pub fn max_retries(mut self, n: u32) -> Self {
        self.max_retries = n;
        self
    }

    /// Exponential backoff used when the server gives no usable hint (and for parallel-request
    /// 429s): `base`, doubling each retry, never above `cap` (applied after jitter).
    ///
    /// `build` fails with [`BuildError::ZeroBackoffBase`] or [`BuildError::BackoffBaseAboveCap`].
    pub fn backoff(mut self, base: Duration, cap: Duration) -> Self {
        self.backoff = (base, cap);
        self
    }

    /// Turns jitter on (default) or off. With jitter, backoff delays are drawn from
    /// `[d/2, d]` and waits the server asked for get up to 10 % (at most 1 s) added, never
    /// subtracted, so that callers refused together do not return together.
    pub fn jitter(mut self, on: bool) -> Self {
        self.jitter = on;
        self
    }

    /// Seeds the jitter's random number generator, so that waits repeat exactly (for tests).
    pub fn jitter_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The longest wait a server may ask for (`Retry-After`, a reset time) that the throttle
    /// sleeps; a longer one returns the response at once, its
    /// [`ThrottleInfo::stopped`](crate::ThrottleInfo::stopped) saying so, and closes no shared
    /// cooldown: no caller is held that long in silence; each later caller goes and receives
    /// the server's own answer.
    ///
    /// `build` fails with [`BuildError::ZeroMaxServerWait`] for zero, which would honour no
    /// wait at all (to return every "later" answer at once, use
    /// [`max_retries(0)`](Self::max_retries) or the [`NoRetry`](crate::NoRetry) extension).
    pub fn max_server_wait(mut self, d: Duration) -> Self {
        self.max_server_wait = d;
        self
    }

    /// The latency guard (default 100 ms): the difference this client allows between when it
    /// sends and when the server counts (latency varies, and servers count on arrival). A
    /// sliding window keeps each send counted this much past its window; a token bucket keeps
    /// this much of its tolerance in hand (about `d × rate` cells of its burst, at least one),
    /// so sends paced exactly but arriving up to `d` closer together still fit the server's
    /// bucket; its rate is kept. Zero trusts the network to keep sends in order and equally
    /// delayed.
    ///
    /// `build` fails with [`BuildError::WindowGuardTooLong`] when `d` is longer than a sliding
    /// window's own length (a send would stay counted for more than twice its window).
    pub fn window_guard(mut self, d: Duration) -> Self {
        self.window_guard = d;
        self
    }

    /// Gives every request an idempotency key in the header `name` (e.g. `Idempotency-Key`):
    /// a request without one, or with a blank or all-space one, gets a fresh UUID v4, and every
    /// retry of it sends the same key. A request with a key may be resent after a 5xx or a
    /// broken connection even when its method is not idempotent (POST, PATCH).
    ///
    /// This makes such retries safe only where the server honours the key (it answers a
    /// repeat with the first outcome instead of running the request twice).
    pub fn idempotency_key(mut self, name: HeaderName) -> Self {
        self.key_header = Some(name);
        self
    }

    /// Bounds every call: the whole call, waits and request time included, ends within `d`
    /// of entering the throttle. A wait that would end later is not started: the last
    /// response is returned (with [`StopReason::Deadline`](crate::policy::StopReason::Deadline)),
    /// or, when none has arrived, the call fails with
    /// [`ThrottleError::DeadlineExceeded`](crate::ThrottleError::DeadlineExceeded).
    /// A [`Deadline`](crate::Deadline) extension overrides it per request.
    ///
    /// `build` fails with [`BuildError::ZeroDeadline`] for zero, which would fail every call.
    pub fn deadline(mut self, d: Duration) -> Self {
        self.deadline = Some(d);
        self
    }

    /// Sets the retry budget shared by every caller (see [`RetryBudget`]); when it is spent, a
    /// response that asked for a retry is returned with
    /// [`StopReason::RetryBudgetExhausted`](crate::policy::StopReason::RetryBudgetExhausted).
    /// `None` removes the budget: only `max_retries` bounds retries.
    ///
    /// `build` fails with [`BuildError::InvalidRetryBudget`] for a negative or non-finite
    /// ratio or a zero window.
    pub fn retry_budget(mut self, budget: Option<RetryBudget>) -> Self {
        self.budget = budget;
        self
    }

    /// Where each scope's state is counted: [`MemoryStore`](crate::store::MemoryStore) (this process alone) or, with the
    /// feature `redis`, a [`RedisStore`](crate::store::RedisStore) shared by every process
    /// of a fleet, so that together they keep one quota.
    ///
    /// # Default
    /// [`MemoryStore`](crate::store::MemoryStore).
    pub fn store(mut self, store: impl Into<Backend>) -> Self {
        self.store = store.into();
        self
    }

    /// What the limits apply to: each [`Scope`] (by default each authority: scheme, host and
    /// port) has its own quotas, in-flight cap, cooldown and hints, so a `429` from one API
    /// never slows requests to another. [`Scope::global`] applies them to everything.
    pub fn scope(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }

    /// The most keyed scopes alive at once (default 10,000), which bounds memory (a scope
    /// costs a few hundred bytes plus one entry per send still in a sliding window).
    ///
    /// When a new scope would pass the cap, every idle scope is forgotten first (one with
    /// nothing in flight or waiting, whose quotas are empty again: forgetting it changes no
    /// admission). If every scope is busy, the new key shares one overflow scope with every
    /// other key in that situation: their limits then apply to them together (slower, never
    /// faster); a warning is logged. Keys new to the map keep going to the overflow scope
    /// until it is idle again, so no key leaves it for an empty scope while its sends count. `build` fails with
    /// [`BuildError::ZeroMaxScopes`] for 0.
    pub fn max_scopes(mut self, n: usize) -> Self {
        self.max_scopes = n;
        self
    }

    /// How long an idle scope (nothing in flight or waiting, quotas empty again) is kept
    /// after its last use (default 10 minutes); it is forgotten between `ttl` and `1.5 × ttl`.
    pub fn scope_idle_ttl(mut self, ttl: Duration) -> Self {
        self.scope_idle_ttl = ttl;
        self
    }

    /// The aging bound of the priority lanes (default 30 s): a request that has waited this
    /// long in its scope's queue goes before every request that arrived after it, whatever
    /// their [`Priority`](crate::Priority), so no request starves.
    pub fn priority_aging(mut self, d: Duration) -> Self {
        self.priority_aging = d;
        self
    }

    /// Adds a sliding window that counts requests, whatever their [`Cost`](crate::Cost): at
    /// most `limit` requests in any `window` (a request of cost 0 is not counted). With
    /// [`token_window`](Self::token_window) it paces an API that limits both requests and
    /// tokens per minute, a request's cost being its estimated tokens. Checked by `build` as
    /// [`sliding_window`](Self::sliding_window) is (its index counts among theirs).
    pub fn requests_window(self, limit: u32, window: Duration) -> Self {
        self.window_in(Unit::Requests, limit, window)
    }

    /// Adds a sliding window of tokens: at most `limit` tokens in any `window`, a request
    /// taking its [`Cost`](crate::Cost) (its estimated tokens). The charge is settled with
    /// the true figure by [`Charge::settle`](crate::Charge::settle) or
    /// [`settle_from_headers`](Self::settle_from_headers), and an answer that reports fewer
    /// tokens remaining (`x-ratelimit-remaining-tokens`, `anthropic-ratelimit-tokens-remaining`:
    /// [`Hints::tokens`](crate::Hints::tokens)) than the window has left lowers what it has
    /// left to that: the server is the judge. Give one token window per scope for the
    /// allowance the server reports. Checked by `build` as
    /// [`sliding_window`](Self::sliding_window) is (its index counts among theirs).
    pub fn token_window(self, limit: u32, window: Duration) -> Self {
        self.window_in(Unit::Tokens, limit, window)
    }

    fn window_in(mut self, unit: Unit, limit: u32, window: Duration) -> Self {
        self.windows.push((limit, window));
        self.units.push((self.windows.len() - 1, unit));
        self
    }

    /// Reads a request's true cost from the headers of its answer (e.g. a gateway's
    /// `x-usage-total-tokens`) and settles its charge with it, before the response is
    /// returned, for every answer of every attempt (see [`Charge`](crate::Charge)). `f`
    /// returns `None` when the headers do not tell: the estimate stands. A figure in the body
    /// is settled by the caller with the response's [`Charge`](crate::Charge).
    ///
    /// # Default
    /// None: charges stand at their estimate unless the caller settles them.
    pub fn settle_from_headers(
        mut self,
        f: impl Fn(&http::HeaderMap) -> Option<u32> + Send + Sync + 'static,
    ) -> Self {
        self.usage_from_headers = Some(UsageFromHeaders::new(f));
        self
    }

    /// Reads a request's true cost from the whole body of its answer (e.g. the `usage` of an
    /// LLM API's JSON) and settles its charge with it (see [`Charge`](crate::Charge)), as the
    /// caller reads the body: the body passes through unchanged and is read once, by the
    /// caller; the throttle keeps a copy of up to `max_bytes` bytes of it and calls `f` on the
    /// copy when the body reaches its end. A longer body, one that fails or one dropped
    /// before its end settles nothing (the estimate stands); so does `f` returning `None`.
    /// Applies to the response returned (not to attempts that were retried). A charge settles
    /// once: with [`settle_from_headers`](Self::settle_from_headers) too, a figure the headers
    /// gave stands and the body's is ignored.
    ///
    /// ```
    /// use reqwest_throttle::Throttle;
    ///
    /// let throttle = Throttle::builder()
    ///     .token_window(40_000, std::time::Duration::from_secs(60))
    ///     .settle_from_body(64 * 1024, |body| {
    ///         let json: serde_json::Value = serde_json::from_slice(body).ok()?;
    ///         u32::try_from(json["usage"]["total_tokens"].as_u64()?).ok()
    ///     })
    ///     .build()?;
    /// # drop(throttle);
    /// # Ok::<(), reqwest_throttle::BuildError>(())
    /// ```
    ///
    /// # Default
    /// None: charges stand at their estimate unless the caller settles them.
    pub fn settle_from_body(
        mut self,
        max_bytes: usize,
        f: impl Fn(&[u8]) -> Option<u32> + Send + Sync + 'static,
    ) -> Self {
        self.usage_from_body = Some(UsageFromBody::new(max_bytes, f));
        self
    }

    /// Learns each scope's limits from the server's answers (see the README, "Learning the
    /// limits"): the rate and burst of a token bucket from which sends it refused, the
    /// in-flight cap from parallel-limit refusals (halved on one, one more every 10 successes,
    /// within 1 and [`max_in_flight`](Self::max_in_flight)), and a window server's limit for
    /// export. What is learned is added to the configured limits; see
    /// [`Throttle::learned`](crate::Throttle::learned).
    ///
    /// # Default
    /// On when no quota ([`sliding_window`](Self::sliding_window),
    /// [`token_bucket`](Self::token_bucket)) is configured, off otherwise: configured quotas
    /// are taken to be the server's, and a learned bucket could only slow them down.
    pub fn learn_limits(mut self, on: bool) -> Self {
        self.learn = Some(on);
        self
    }

    /// The per-scope circuit breaker (`None`: none): after
    /// [`failures`](CircuitBreaker::failures) consecutive failures (5xx answers and transport
    /// errors; 429s do not count, the cooldown handles them) requests of the scope fail at
    /// once with [`ThrottleError::CircuitOpen`](crate::ThrottleError::CircuitOpen) for
    /// [`open_for`](CircuitBreaker::open_for) (longer if the last failure's `Retry-After`
    /// asks); then exactly one probe request goes, and the circuit closes when it succeeds.
    ///
    /// # Default
    /// `Some(CircuitBreaker::default())`: 5 failures, 60 s. `build` fails with
    /// [`BuildError::ZeroBreakerFailures`] for 0 failures.
    pub fn circuit_breaker(mut self, breaker: Option<CircuitBreaker>) -> Self {
        self.breaker = breaker;
        self
    }

    /// What a rate-limit refusal's `Retry-After` does once the rate is learned.
    ///
    /// # Default
    /// [`RetryAfterPolicy::Strict`]: it closes the scope's cooldown for that long.
    pub fn retry_after_policy(mut self, policy: RetryAfterPolicy) -> Self {
        self.retry_after_policy = policy;
        self
    }

    /// How long a learned pace must be sent at without a refusal before it is raised by 10 %,
    /// to find out whether the server allows more: for a pace whose rate the refusals have
    /// pinned, or one loaded with [`Throttle::load_learned`](crate::Throttle::load_learned).
    /// A pace that is still a guess (one refusal from idle draws a line, not a point) is
    /// raised sooner: after the time its sends take to drain four of the largest bursts the
    /// refusals allow, which is enough to show the server's rate is at least 3/4 of it.
    ///
    /// # Default
    /// 30 s.
    pub fn probe_after(mut self, clean: Duration) -> Self {
        self.probe_after = clean;
        self
    }

    /// Names the scope that `example` is sent in (under the [`scope`](Self::scope) in force at
    /// `build`), for metrics and events: its metrics carry the label `scope="name"` and its
    /// [`Event`](crate::observe::Event)s the name. `example` is only read (its URL and
    /// headers, e.g. the API key of a [`Scope::per_header`] scope), never sent nor shown.
    ///
    /// Unnamed scopes share one series of each metric, without a `scope` label, so that the
    /// number of series stays bounded whatever the number of scopes. Two scopes given one
    /// name share its series. A later name for the same scope replaces an earlier one.
    ///
    /// ```
    /// use reqwest_throttle::Throttle;
    ///
    /// let api = reqwest::Request::new(
    ///     reqwest::Method::GET,
    ///     "https://api.example.com/".parse().unwrap(),
    /// );
    /// let throttle = Throttle::builder().name_scope("example_api", &api).build()?;
    /// # drop(throttle);
    /// # Ok::<(), reqwest_throttle::BuildError>(())
    /// ```
    pub fn name_scope(mut self, name: impl Into<Arc<str>>, example: &reqwest::Request) -> Self {
        self.names.push(ScopeName::new(name.into(), example));
        self
    }

    /// The capacity-warning threshold, in percent of a limit (default 80): when the requests
    /// in flight of a scope, or the units counted by one of its quotas, reach `percent` of
    /// the limit, an [`Event::CapacityWarning`](crate::observe::Event::CapacityWarning) is
    /// sent, once per crossing.
    ///
    /// `build` fails with [`BuildError::CapacityWarningOutOfRange`] for 0 or above 100.
    pub fn capacity_warning(mut self, percent: u8) -> Self {
        self.capacity_warning = percent;
        self
    }

    /// How many [events](crate::Throttle::events) are kept for a receiver that lags
    /// (default 256); past that it loses the oldest and is told how many it missed. The
    /// buffer is allocated when the throttle is built.
    ///
    /// `build` fails with [`BuildError::ZeroEventBuffer`] for 0.
    pub fn event_buffer(mut self, n: usize) -> Self {
        self.event_buffer = n;
        self
    }

    /// Every invalid setting, in the order documented on [`BuildError`].
    fn problems(&self) -> Vec<BuildError> {
        let mut problems = Vec::new();
        for (i, &(limit, length)) in self.windows.iter().enumerate() {
            if limit == 0 {
                problems.push(BuildError::ZeroLimit { window: i });
            }
            if length.is_zero() {
                problems.push(BuildError::ZeroWindow { window: i });
            } else if self.window_guard > length {
                problems.push(BuildError::WindowGuardTooLong {
                    window: i,
                    length,
                    guard: self.window_guard,
                });
            }
        }
        if self.buckets.len() > MAX_TOKEN_BUCKETS {
            problems.push(BuildError::TooManyTokenBuckets {
                count: self.buckets.len(),
            });
        }
        for (i, quota) in self.buckets.iter().enumerate() {
            let burst = quota.burst_size().get();
            let refill = quota.replenish_interval().saturating_mul(burst);
            if refill > FAR_FUTURE {
                problems.push(BuildError::TokenBucketTooSlow { bucket: i, refill });
            }
        }
        match self.max_in_flight {
            Some(0) => problems.push(BuildError::ZeroInFlight),
            Some(n) if n > tokio::sync::Semaphore::MAX_PERMITS => {
                problems.push(BuildError::InFlightTooLarge { max: n });
            }
            _ => {}
        }
        let (base, cap) = self.backoff;
        if base.is_zero() {
            problems.push(BuildError::ZeroBackoffBase);
        }
        if base > cap {
            problems.push(BuildError::BackoffBaseAboveCap { base, cap });
        }
        if self.max_server_wait.is_zero() {
            problems.push(BuildError::ZeroMaxServerWait);
        }
        if self.deadline.is_some_and(|d| d.is_zero()) {
            problems.push(BuildError::ZeroDeadline);
        }
        if let Some(b) = &self.budget {
            if !b.ratio.is_finite() || b.ratio < 0.0 || b.window.is_zero() {
                problems.push(BuildError::InvalidRetryBudget);
            }
        }
        if self.max_scopes == 0 {
            problems.push(BuildError::ZeroMaxScopes);
        }
        if self.breaker.is_some_and(|b| b.failures == 0) {
            problems.push(BuildError::ZeroBreakerFailures);
        }
        if !(1..=100).contains(&self.capacity_warning) {
            problems.push(BuildError::CapacityWarningOutOfRange {
                percent: self.capacity_warning,
            });
        }
        if self.event_buffer == 0 {
            problems.push(BuildError::ZeroEventBuffer);
        }
        problems
    }

    /// Checks the settings and builds the throttle.
    ///
    /// # Errors
    /// A [`BuildError`] naming every invalid setting: the problem itself when there is one,
    /// [`BuildError::Several`] when there are more (see [`BuildError::problems`]).
    pub fn build(self) -> Result<Throttle, BuildError> {
        if let Some(error) = BuildError::from_problems(self.problems()) {
            return Err(error);
        }
        let learn_on = self
            .learn
            .unwrap_or(self.windows.is_empty() && self.buckets.is_empty());
        let (base, cap) = self.backoff;
        let mut limits = Limits::new().with_max_in_flight(self.max_in_flight);
        // Zero limits were refused above.
        for (i, (limit, window)) in self.windows.iter().copied().enumerate() {
            let unit = self
                .units
                .iter()
                .find(|u| u.0 == i)
                .map_or(Unit::Cost, |u| u.1);
            if let Some(limit) = NonZeroU32::new(limit) {
                let quota = WindowQuota::new(limit, window, self.window_guard);
                limits = limits.with_window(quota.with_unit(unit));
            }
        }
        limits.buckets = self.buckets;
        limits.bucket_guard = self.window_guard;
        let policy = RetryPolicy {
            max_retries: self.max_retries,
            backoff: Backoff { base, cap },
            jitter: if self.jitter { Jitter::On } else { Jitter::Off },
            max_server_wait: self.max_server_wait,
        };
        let mut learn = LearnConfig::new(
            learn_on,
            self.breaker,
            self.retry_after_policy,
            self.probe_after,
        );
        learn.max_wait = self.max_server_wait;
        let engine = EngineConfig {
            store: self.store,
            learn: std::sync::Arc::new(learn),
            scope: self.scope,
            limits,
            aging: self.priority_aging,
            bounds: Bounds {
                max_scopes: self.max_scopes,
                idle_ttl: self.scope_idle_ttl,
            },
            observe: ObserveConfig {
                warn_percent: self.capacity_warning,
                buffer: self.event_buffer,
            },
            names: self
                .names
                .into_iter()
                .map(|n| (n.name, n.example))
                .collect(),
        };
        Ok(Throttle::new(
            engine,
            Settings {
                policy,
                seed: self.seed,
                key_header: self.key_header,
                deadline: self.deadline,
                budget: self.budget,
                usage_from_headers: self.usage_from_headers,
                usage_from_body: self.usage_from_body,
            },
        ))
    }
}
