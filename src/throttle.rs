//! [`Throttle`]: the shared handle, and its [`Stats`].

use std::fmt;
use std::time::Duration;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use tokio::time::Instant;

use http::HeaderName;
use rand::rngs::SmallRng;
use rand::SeedableRng;

use crate::builder::ThrottleBuilder;
use crate::error::ThrottleError;
use crate::limiter::{InFlight, Limiter, Refused};
use crate::policy::{BudgetLedger, RetryBudget, RetryPolicy};
use crate::quota::Quotas;

/// A rate limiter for one API (one quota holder), as `reqwest-middleware` middleware.
///
/// Cloning is cheap (an `Arc`): clones share every quota, permit, cooldown and counter, so one
/// `Throttle` cloned into many clients or tasks keeps all of them, together, inside the limits.
/// See the [crate docs](crate) for the path of a request.
#[derive(Clone)]
pub struct Throttle {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) limiter: Limiter,
    pub(crate) policy: RetryPolicy,
    pub(crate) rng: Mutex<SmallRng>,
    pub(crate) key_header: Option<HeaderName>,
    pub(crate) deadline: Option<Duration>,
    pub(crate) budget: Option<Mutex<BudgetLedger>>,
}

/// The right to have one unit of work in flight, from [`Throttle::acquire`]. Dropping it ends
/// the work: the in-flight permit goes back to the next waiter.
#[derive(Debug)]
#[must_use = "dropping the permit ends the work's time in flight at once"]
pub struct Permit {
    _in_flight: InFlight,
}

/// A snapshot of a throttle's counters, from [`Throttle::stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Stats {
    /// Requests sent and not yet finished (response body not yet read to the end or dropped).
    pub in_flight: usize,
    /// Callers waiting to be admitted (cooldown, permit or quota).
    pub queued: usize,
    /// Attempts sent, retries included.
    pub sent: u64,
    /// Responses with status 429 received.
    pub responses_429: u64,
    /// Retries made (attempts after a request's first).
    pub retries: u64,
    /// Retries not made because the retry budget was spent.
    pub budget_exhausted: u64,
    /// In-flight permits free now, or `None` with no in-flight cap.
    pub available_permits: Option<usize>,
}

impl Throttle {
    /// A builder with the documented defaults.
    pub fn builder() -> ThrottleBuilder {
        ThrottleBuilder::new()
    }

    pub(crate) fn new(
        quotas: Quotas,
        max_in_flight: Option<usize>,
        policy: RetryPolicy,
        seed: Option<u64>,
        key_header: Option<HeaderName>,
        deadline: Option<Duration>,
        budget: Option<RetryBudget>,
    ) -> Self {
        let rng = match seed {
            Some(seed) => SmallRng::seed_from_u64(seed),
            None => SmallRng::from_rng(&mut rand::rng()),
        };
        Self {
            inner: Arc::new(Inner {
                limiter: Limiter::new(max_in_flight, quotas),
                policy,
                rng: Mutex::new(rng),
                key_header,
                deadline,
                budget: budget.map(|b| Mutex::new(BudgetLedger::new(b, Instant::now()))),
            }),
        }
    }

    /// The counters now. Reading them takes no lock.
    pub fn stats(&self) -> Stats {
        let c = self.inner.limiter.counters();
        Stats {
            in_flight: c.in_flight.load(Ordering::Relaxed),
            queued: c.queued.load(Ordering::Relaxed),
            sent: c.sent.load(Ordering::Relaxed),
            responses_429: c.responses_429.load(Ordering::Relaxed),
            retries: c.retries.load(Ordering::Relaxed),
            budget_exhausted: c.budget_exhausted.load(Ordering::Relaxed),
            available_permits: self.inner.limiter.available_permits(),
        }
    }

    /// Waits until one unit of work of `cost` quota units may start, exactly as a request sent
    /// through the middleware would (cooldown, in-flight permit, quotas), and returns its
    /// [`Permit`]. Use it to pace work that is not a `reqwest` request; the work counts as in
    /// flight until the permit is dropped.
    ///
    /// # Errors
    /// [`ThrottleError::CostExceedsQuota`] at once when `cost` is more than a quota can admit.
    ///
    /// # Cancel safety
    /// A dropped call holds nothing and has charged no sliding window. With several token
    /// buckets, cells it already took go to the next caller of the same cost, or are lost
    /// (which only slows admission, never exceeds a quota).
    pub async fn acquire(&self, cost: u32) -> Result<Permit, ThrottleError> {
        let admitted = self.inner.limiter.admit(cost, None).await;
        let refused = |r: Refused| r.into_error(0, Duration::ZERO);
        admitted.map(|p| Permit { _in_flight: p }).map_err(refused)
    }

    /// The retry policy this throttle applies.
    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.inner.policy
    }
}

impl fmt::Debug for Throttle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Throttle")
            .field("max_in_flight", &self.inner.limiter.max_in_flight())
            .field("policy", &self.inner.policy)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

const _: fn() = || {
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<Throttle>();
};
