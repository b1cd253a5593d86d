//! Async admission: the shared cooldown, the in-flight permit, then the quotas.
//!
//! This is the only place (with the retry sleep in the middleware) that waits. Each step is
//! FIFO: tokio's semaphore and mutex queue their waiters in order.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{sleep_until, Instant};

use crate::error::ThrottleError;
use crate::quota::{Progress, Quotas};

/// Counters shared by every clone of a throttle and by the permits in response bodies.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) in_flight: AtomicUsize,
    pub(crate) queued: AtomicUsize,
    pub(crate) sent: AtomicU64,
    pub(crate) responses_429: AtomicU64,
    pub(crate) retries: AtomicU64,
    pub(crate) budget_exhausted: AtomicU64,
}

/// Why admission failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The request can never be admitted.
    Cost(ThrottleError),
    /// Admission would come after the deadline.
    Deadline,
}

impl Refused {
    /// The error a caller gets, after `attempts` attempts and `waited` in the throttle.
    pub(crate) fn into_error(self, attempts: u32, waited: Duration) -> ThrottleError {
        match self {
            Refused::Cost(e) => e,
            Refused::Deadline => ThrottleError::DeadlineExceeded { attempts, waited },
        }
    }
}

/// Locks `m`, going on with the data of a holder that panicked (the data stays consistent:
/// every critical section in this crate is a single update).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Admission state of one throttle.
#[derive(Debug)]
pub(crate) struct Limiter {
    /// Closed until this instant for every caller (the shared cooldown).
    cooldown_until: Mutex<Option<Instant>>,
    /// The in-flight cap and its semaphore.
    in_flight: Option<(usize, Arc<Semaphore>)>,
    /// `None` when no quota is configured, so that path takes no lock.
    quotas: Option<tokio::sync::Mutex<Quotas>>,
    capacity: Option<u32>,
    counters: Arc<Counters>,
}

/// A request's right to be in flight. Dropping it releases the permit and the in-flight count.
#[derive(Debug)]
#[must_use = "dropping the admission releases the in-flight permit"]
pub(crate) struct InFlight {
    _permit: Option<OwnedSemaphorePermit>,
    counters: Arc<Counters>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One caller's turn at the quotas (the lock held, FIFO). If the caller gives up before it is
/// admitted, the token-bucket cells it took are left to the next caller instead of being lost.
struct QuotaStep<'a> {
    quotas: tokio::sync::MutexGuard<'a, Quotas>,
    cost: u32,
    progress: Progress,
}

impl<'a> QuotaStep<'a> {
    fn start(mut quotas: tokio::sync::MutexGuard<'a, Quotas>, cost: u32) -> Self {
        let progress = quotas.resume(cost);
        Self {
            quotas,
            cost,
            progress,
        }
    }

    fn try_admit(&mut self, now: Instant) -> Result<(), Instant> {
        let admitted = self.quotas.try_admit(self.cost, now, &mut self.progress);
        if admitted.is_ok() {
            self.progress = Progress::default();
        }
        admitted
    }
}

impl Drop for QuotaStep<'_> {
    fn drop(&mut self) {
        let progress = std::mem::take(&mut self.progress);
        self.quotas.leave(self.cost, progress);
    }
}

/// Counts a caller as queued while it exists.
struct Queued<'a>(&'a Counters);

impl<'a> Queued<'a> {
    fn new(counters: &'a Counters) -> Self {
        counters.queued.fetch_add(1, Ordering::Relaxed);
        Self(counters)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Limiter {
    pub(crate) fn new(max_in_flight: Option<usize>, quotas: Quotas) -> Self {
        let capacity = quotas.capacity();
        Self {
            cooldown_until: Mutex::new(None),
            in_flight: max_in_flight.map(|n| (n, Arc::new(Semaphore::new(n)))),
            quotas: (!quotas.is_empty()).then(|| tokio::sync::Mutex::new(quotas)),
            capacity,
            counters: Arc::new(Counters::default()),
        }
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Permits free now, or `None` with no in-flight cap.
    pub(crate) fn available_permits(&self) -> Option<usize> {
        self.in_flight.as_ref().map(|(_, s)| s.available_permits())
    }

    /// The in-flight cap, or `None` without one.
    pub(crate) fn max_in_flight(&self) -> Option<usize> {
        self.in_flight.as_ref().map(|&(n, _)| n)
    }

    /// Closes the shared cooldown until `until` (never shortens one already closed longer).
    pub(crate) fn close_until(&self, until: Instant) {
        let mut gate = lock(&self.cooldown_until);
        if gate.is_none_or(|g| g < until) {
            *gate = Some(until);
        }
    }

    /// The instant the cooldown opens, if it is closed at `now`.
    fn closed_until(&self, now: Instant) -> Option<Instant> {
        let gate = lock(&self.cooldown_until);
        gate.filter(|&g| g > now)
    }

    /// Sleeps until `ready`, or fails at once if `ready` is not before `deadline` (a request
    /// admitted at its deadline could not be sent by it).
    async fn wait_until(ready: Instant, deadline: Option<Instant>) -> Result<(), Refused> {
        if deadline.is_some_and(|d| ready >= d) {
            return Err(Refused::Deadline);
        }
        sleep_until(ready).await;
        Ok(())
    }

    async fn pass_cooldown(&self, deadline: Option<Instant>) -> Result<(), Refused> {
        while let Some(until) = self.closed_until(Instant::now()) {
            Self::wait_until(until, deadline).await?;
        }
        Ok(())
    }

    /// Waits until a request of `cost` units may be sent: the cooldown is open, an in-flight
    /// permit is held, and every quota admits it (and has recorded it).
    ///
    /// # Errors
    /// [`Refused::Cost`] at once when `cost` exceeds a quota's capacity; [`Refused::Deadline`]
    /// as soon as it is known that admission would come after `deadline` (a cooldown or quota
    /// that opens later), or at `deadline` while waiting for a permit.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future releases whatever it holds, and quotas are recorded
    /// only in the last step, with no wait after it.
    pub(crate) async fn admit(
        &self,
        cost: u32,
        deadline: Option<Instant>,
    ) -> Result<InFlight, Refused> {
        if let Some(capacity) = self.capacity.filter(|&c| cost > c) {
            return Err(Refused::Cost(ThrottleError::CostExceedsQuota {
                cost,
                capacity,
            }));
        }
        // A deadline already passed admits nothing (the timeout below would poll once first).
        if deadline.is_some_and(|d| d <= Instant::now()) {
            return Err(Refused::Deadline);
        }
        let admission = self.admit_inner(cost, deadline);
        match deadline {
            Some(d) => tokio::time::timeout_at(d, admission)
                .await
                .unwrap_or(Err(Refused::Deadline)),
            None => admission.await,
        }
    }

    async fn admit_inner(&self, cost: u32, deadline: Option<Instant>) -> Result<InFlight, Refused> {
        let queued = Queued::new(&self.counters);
        self.pass_cooldown(deadline).await?;
        let permit = match &self.in_flight {
            // The semaphore is never closed.
            Some((_, s)) => s.clone().acquire_owned().await.ok(),
            None => None,
        };
        match &self.quotas {
            Some(quotas) => {
                let mut step = QuotaStep::start(quotas.lock().await, cost);
                loop {
                    let now = Instant::now();
                    let ready = match self.closed_until(now) {
                        Some(until) => until,
                        None => match step.try_admit(now) {
                            Ok(()) => break,
                            Err(ready) => ready,
                        },
                    };
                    Self::wait_until(ready, deadline).await?;
                }
            }
            // The cooldown may have closed while this caller waited for its permit.
            None => self.pass_cooldown(deadline).await?,
        }
        drop(queued);
        self.counters.in_flight.fetch_add(1, Ordering::Relaxed);
        self.counters.sent.fetch_add(1, Ordering::Relaxed);
        Ok(InFlight {
            _permit: permit,
            counters: self.counters.clone(),
        })
    }
}
