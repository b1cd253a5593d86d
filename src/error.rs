//! Errors: [`BuildError`] from the builder, [`ThrottleError`] for requests the throttle refuses.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// An invalid setting found by [`ThrottleBuilder::build`](crate::ThrottleBuilder::build).
///
/// Setters never panic; every check happens in `build`, which returns the first problem found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A sliding window was given a limit of zero requests.
    #[error("sliding window limit must be at least 1 request")]
    ZeroLimit,
    /// A sliding window was given a zero-length window.
    #[error("sliding window length must be greater than zero")]
    ZeroWindow,
    /// `max_in_flight(0)` would admit nothing.
    #[error("max_in_flight must be at least 1")]
    ZeroInFlight,
    /// `max_in_flight` is above what a tokio semaphore can hold.
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
    #[error("a token bucket refills its burst in {refill:?}; at most 100 years is supported")]
    TokenBucketTooSlow {
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
    /// wait forever.
    #[error("request cost {cost} exceeds the capacity {capacity} of a quota")]
    CostExceedsQuota {
        /// The cost the request asked for, in quota units.
        cost: u32,
        /// The most the quota can admit at once, in quota units.
        capacity: u32,
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
    /// The rate-limit store could not answer, so the request was not sent.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
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
             (after {attempts} attempts and {waited:?} waiting in the throttle)"
        ),
        None => format!(
            "deadline passed after {attempts} attempts and {waited:?} waiting in the throttle"
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
