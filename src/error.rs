//! Errors: [`BuildError`] from the builder, [`ThrottleError`] for requests the throttle refuses.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The invalid settings found by [`ThrottleBuilder::build`](crate::ThrottleBuilder::build).
///
/// Setters never panic; `build` checks every setting and reports every problem it finds, each
/// naming its setting (a sliding window or token bucket by its index: 0 for the first one
/// added, in the order added). One problem is returned as its own variant, so that
/// `assert_eq!(err, BuildError::ZeroInFlight)` or a `match` works as usual; two or more come
/// together as [`BuildError::Several`], in the order the checks run (sliding windows, token
/// buckets, in-flight cap, backoff, server wait, deadline, retry budget, scopes, capacity
/// warning, event buffer).
/// [`problems`](Self::problems) lists them in either case.
///
/// ```
/// use std::time::Duration;
/// use reqwest_throttle::{BuildError, Throttle};
///
/// let err = Throttle::builder()
///     .sliding_window(0, Duration::from_secs(60))
///     .max_in_flight(0)
///     .build()
///     .unwrap_err();
/// assert_eq!(
///     err.problems(),
///     [BuildError::ZeroLimit { window: 0 }, BuildError::ZeroInFlight]
/// );
/// assert_eq!(
///     err.to_string(),
///     "2 invalid settings: sliding window 0: the limit must be at least 1 request; \
///      max_in_flight must be at least 1"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A sliding window was given a limit of zero requests.
    #[error("sliding window {window}: the limit must be at least 1 request")]
    ZeroLimit {
        /// The window's index, 0 for the first added.
        window: usize,
    },
    /// A sliding window was given a zero-length window.
    #[error("sliding window {window}: the window length must be greater than zero")]
    ZeroWindow {
        /// The window's index, 0 for the first added.
        window: usize,
    },
    /// The [`window_guard`](crate::ThrottleBuilder::window_guard) is longer than a sliding
    /// window: every send would stay counted for more than twice the window, which halves the
    /// window's rate or worse.
    #[error(
        "window_guard {guard:?} is longer than sliding window {window} ({length:?}); \
         lower the guard or lengthen the window"
    )]
    WindowGuardTooLong {
        /// The window's index, 0 for the first added.
        window: usize,
        /// The window's length.
        length: Duration,
        /// The guard given.
        guard: Duration,
    },
    /// `max_in_flight(0)` would admit nothing.
    #[error("max_in_flight must be at least 1")]
    ZeroInFlight,
    /// `max_in_flight` is above the largest supported, `usize::MAX >> 3` (tokio's
    /// `Semaphore::MAX_PERMITS`, kept as the bound: a cap that large means "no cap").
    #[error(
        "max_in_flight {max} is above the largest supported ({})",
        tokio::sync::Semaphore::MAX_PERMITS
    )]
    InFlightTooLarge {
        /// The cap given.
        max: usize,
    },
    /// More token buckets than the throttle supports (64).
    #[error("{count} token buckets given; at most 64 are supported")]
    TooManyTokenBuckets {
        /// The number given.
        count: usize,
    },
    /// A token bucket takes longer than 100 years to refill its burst (its replenish interval
    /// times its burst size): a quota that means "this many, ever" is a sliding window with a
    /// long window instead.
    #[error(
        "token bucket {bucket} refills its burst in {refill:?}; at most 100 years is supported"
    )]
    TokenBucketTooSlow {
        /// The bucket's index, 0 for the first added.
        bucket: usize,
        /// The bucket's time to refill its whole burst, saturated at `Duration::MAX`.
        refill: Duration,
    },
    /// A retry budget with a negative or non-finite ratio, or a zero window.
    #[error("retry budget needs a finite ratio >= 0 and a window > 0")]
    InvalidRetryBudget,
    /// `max_scopes(0)` would leave room for no scope.
    #[error("max_scopes must be at least 1")]
    ZeroMaxScopes,
    /// The backoff base is zero.
    #[error("backoff base must be greater than zero")]
    ZeroBackoffBase,
    /// The backoff base is larger than its cap.
    #[error("backoff base ({base:?}) is larger than its cap ({cap:?})")]
    BackoffBaseAboveCap {
        /// The first backoff delay given.
        base: Duration,
        /// The largest backoff delay given.
        cap: Duration,
    },
    /// `max_server_wait(Duration::ZERO)` would honour no wait a server asks for, not even a
    /// `Retry-After: 1`: every such answer would be returned at once.
    #[error("max_server_wait must be greater than zero")]
    ZeroMaxServerWait,
    /// `deadline(Duration::ZERO)` would fail every call before it is sent.
    #[error("deadline must be greater than zero")]
    ZeroDeadline,
    /// A circuit breaker that opens after 0 failures would never close.
    #[error("the circuit breaker needs at least 1 failure to open")]
    ZeroBreakerFailures,
    /// A [`capacity_warning`](crate::ThrottleBuilder::capacity_warning) threshold of 0 (a
    /// warning with nothing used) or above 100 percent (never reached).
    #[error("capacity_warning must be 1 to 100 percent, not {percent}")]
    CapacityWarningOutOfRange {
        /// The threshold given, in percent.
        percent: u8,
    },
    /// `event_buffer(0)` would keep no event for any receiver.
    #[error("event_buffer must be at least 1")]
    ZeroEventBuffer,
    /// Two or more of the problems above, in the order found (never nested, never fewer than
    /// two).
    #[error("{} invalid settings: {}", .0.len(), join(.0))]
    Several(Vec<BuildError>),
}

impl BuildError {
    /// Every problem found: this error itself, or the list a [`BuildError::Several`] holds.
    pub fn problems(&self) -> &[BuildError] {
        match self {
            BuildError::Several(all) => all,
            one => std::slice::from_ref(one),
        }
    }

    /// One error for `problems`: `None` when empty, the problem itself when alone,
    /// [`BuildError::Several`] otherwise.
    pub(crate) fn from_problems(mut problems: Vec<BuildError>) -> Option<BuildError> {
        match problems.len() {
            0 => None,
            1 => problems.pop(),
            _ => Some(BuildError::Several(problems)),
        }
    }
}

/// The problems' messages, separated by "; ".
fn join(problems: &[BuildError]) -> String {
    let messages: Vec<String> = problems.iter().map(ToString::to_string).collect();
    messages.join("; ")
}

/// Why the throttle refused to send (or resend) a request itself.
///
/// Returned as [`reqwest_middleware::Error::Middleware`]; recover it with
/// `err.downcast_ref::<ThrottleError>()` on the inner `anyhow::Error`.
/// A server's own refusal is never turned into this error: the response is returned as it came.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ThrottleError {
    /// The request's [`Cost`](crate::Cost) is larger than a quota can ever admit, so it would
    /// wait forever. Displayed as, e.g., "request cost 500 exceeds the capacity 120 of the
    /// sliding window of 120 per 60s".
    #[error("request cost {cost} exceeds the capacity {capacity} of the {quota}")]
    CostExceedsQuota {
        /// The cost the request asked for, in quota units.
        cost: u32,
        /// The most the quota can admit at once, in quota units.
        capacity: u32,
        /// The quota: the one with the smallest capacity in the request's scope.
        quota: crate::store::QuotaName,
    },
    /// The request's deadline came, or was known to come, before it could be sent or
    /// answered. When a response had arrived and only a retry wait would pass the deadline,
    /// that response is returned instead, with
    /// [`StopReason::Deadline`](crate::policy::StopReason::Deadline).
    #[error("{}", deadline_message(*attempts, *waited, *would_wait, last_error.as_ref()))]
    DeadlineExceeded {
        /// Attempts sent before the deadline (one cut off by it included).
        attempts: u32,
        /// Time spent waiting in the throttle (cooldown, in-flight slot, quotas, retry waits).
        waited: Duration,
        /// When the deadline had not passed yet but a known wait would pass it (a cooldown or
        /// a quota that opens later, a retry wait): that wait. `None` when the deadline passed.
        would_wait: Option<Duration>,
        /// The last attempt's transport error, when it failed and the deadline stopped its
        /// retry.
        #[source]
        last_error: Option<TransportError>,
    },
    /// Every attempt failed in transport (a timeout, a refused or broken connection) and the
    /// retries stopped: `max_retries` reached, the retry budget spent, or the request not safe
    /// to send again. Returned only when at least one retry was made; a single failed attempt
    /// returns reqwest's error as it is. The last error is the [`source`](std::error::Error::source);
    /// [`is_timeout`](Self::is_timeout) and [`is_connect`](Self::is_connect) ask it.
    #[error("{attempts} attempts failed ({waited:?} waiting in the throttle): {last_error}")]
    AttemptsFailed {
        /// Attempts sent, the failed last one included.
        attempts: u32,
        /// Time spent waiting in the throttle (cooldown, in-flight slot, quotas, retry waits).
        waited: Duration,
        /// Why no further attempt was made.
        stopped: crate::policy::StopReason,
        /// The last attempt's error.
        #[source]
        last_error: TransportError,
    },
    /// The scope's circuit breaker is open (after consecutive failures: 5xx answers or
    /// transport errors), so the request was not sent. See
    /// [`ThrottleBuilder::circuit_breaker`](crate::ThrottleBuilder::circuit_breaker).
    #[error("circuit open for {scope}: {}", circuit_message(*retry_in))]
    CircuitOpen {
        /// The scope's label.
        scope: String,
        /// Time until the circuit lets a probe request through; `None` while the probe is
        /// under way (try again once it has its answer).
        retry_in: Option<Duration>,
    },
    /// The rate-limit store could not answer, so the request was not sent: a shared store
    /// unreachable under [`OnUnavailable::FailClosed`](crate::store::OnUnavailable), say.
    #[error(transparent)]
    StoreUnavailable(#[from] crate::store::StoreError),
}

fn circuit_message(retry_in: Option<Duration>) -> String {
    match retry_in {
        Some(d) => format!("a probe may go in {d:?}"),
        None => "its probe request is under way".to_owned(),
    }
}

/// "1 attempt", "2 attempts".
fn attempts_text(n: u32) -> String {
    if n == 1 {
        "1 attempt".to_owned()
    } else {
        format!("{n} attempts")
    }
}

fn deadline_message(
    attempts: u32,
    waited: Duration,
    would_wait: Option<Duration>,
    last_error: Option<&TransportError>,
) -> String {
    let mut message = match would_wait {
        Some(wait) => format!(
            "the deadline comes before the request could go: it would wait {wait:?} more \
             (after {} and {waited:?} waiting in the throttle)",
            attempts_text(attempts)
        ),
        None => format!(
            "deadline passed after {} and {waited:?} waiting in the throttle",
            attempts_text(attempts)
        ),
    };
    if let Some(e) = last_error {
        message.push_str(&format!("; the last attempt failed: {e}"));
    }
    message
}

impl ThrottleError {
    /// The throttle's error inside `err`, if it is one (`reqwest_middleware::Error::Middleware`
    /// wrapping a `ThrottleError`).
    ///
    /// ```
    /// use reqwest_throttle::ThrottleError;
    ///
    /// // A connect failure, after retries or not.
    /// let connect_failed = |err: &reqwest_middleware::Error| {
    ///     err.is_connect() || ThrottleError::of(err).is_some_and(ThrottleError::is_connect)
    /// };
    /// # let _ = connect_failed;
    /// ```
    pub fn of(err: &reqwest_middleware::Error) -> Option<&ThrottleError> {
        match err {
            reqwest_middleware::Error::Middleware(e) => e.downcast_ref(),
            reqwest_middleware::Error::Reqwest(_) => None,
        }
    }

    /// Whether the last attempt timed out (reqwest's [`is_timeout`](reqwest::Error::is_timeout)
    /// on the transport error this error carries, if any).
    pub fn is_timeout(&self) -> bool {
        self.transport_error().is_some_and(|e| e.get().is_timeout())
    }

    /// Whether the last attempt failed to connect (reqwest's
    /// [`is_connect`](reqwest::Error::is_connect) on the transport error this error carries,
    /// if any).
    pub fn is_connect(&self) -> bool {
        self.transport_error().is_some_and(|e| e.get().is_connect())
    }

    /// The last attempt's transport error, if this error carries one.
    pub fn transport_error(&self) -> Option<&TransportError> {
        match self {
            ThrottleError::DeadlineExceeded { last_error, .. } => last_error.as_ref(),
            ThrottleError::AttemptsFailed { last_error, .. } => Some(last_error),
            _ => None,
        }
    }
}

/// A transport error of one attempt (reqwest's), shared so that [`ThrottleError`] stays
/// `Clone`. Two compare equal when they are the same error or read the same.
#[derive(Debug, Clone)]
pub struct TransportError(Arc<reqwest::Error>);

impl TransportError {
    pub(crate) fn new(error: reqwest::Error) -> Self {
        Self(Arc::new(error))
    }

    /// reqwest's error.
    pub fn get(&self) -> &reqwest::Error {
        &self.0
    }
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Transparent: its source is reqwest's error's source.
impl std::error::Error for TransportError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for TransportError {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl Eq for TransportError {}
