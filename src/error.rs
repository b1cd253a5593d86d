//! Errors: [`BuildError`] from the builder, [`ThrottleError`] for requests the throttle refuses.

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
    /// The request's deadline came before it could be sent or answered; when a response had
    /// arrived and only a retry wait would pass the deadline, that response is returned
    /// instead, with [`StopReason::Deadline`](crate::policy::StopReason::Deadline).
    #[error("deadline passed after {attempts} attempts and {waited:?} waiting in the throttle")]
    DeadlineExceeded {
        /// Attempts sent before the deadline passed (the one cut off included).
        attempts: u32,
        /// Time spent waiting in the throttle (cooldown, permit, quotas, retry waits).
        waited: Duration,
    },
    /// The rate-limit store could not answer, so the request was not sent.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}
