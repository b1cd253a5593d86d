//! The one time source: `tokio::time`, so that tests with paused time drive every wait.
//!
//! [`TokioClock`] adapts it for `governor`, whose own waiting uses a timer that paused
//! tokio time does not move. [`FAR_FUTURE`] and [`instant_after`] are the one rule for times
//! too far away to matter.

use std::time::Duration;

use governor::clock::{Clock, Reference};
use governor::nanos::Nanos;
use tokio::time::Instant;

/// The farthest any instant the crate computes lies from now: 100 years (of 365 days).
/// A longer duration (up to `Duration::MAX`) means "never" just as well, and adding it to an
/// instant could overflow.
pub(crate) const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// The instant `d` after `now`, at most [`FAR_FUTURE`] after it (so it never overflows).
pub(crate) fn instant_after(now: Instant, d: Duration) -> Instant {
    now + d.min(FAR_FUTURE)
}

/// A `governor` clock that reads [`tokio::time::Instant`], as nanoseconds since its creation.
///
/// Clones share one origin, so their readings compare.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokioClock {
    origin: Instant,
}

impl TokioClock {
    /// A clock whose zero is now.
    pub(crate) fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }

    /// The tokio instant a reading of this clock stands for.
    pub(crate) fn instant_of(&self, reading: Nanos) -> Instant {
        self.origin + reading.into()
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    type Instant = Nanos;

    fn now(&self) -> Nanos {
        Instant::now().saturating_duration_since(self.origin).into()
    }
}

// Nanos already implements `Reference`; this asserts it so a governor upgrade that drops it
// fails here rather than deep in the quota code.
const _: fn() = || {
    fn is_reference<T: Reference>() {}
    is_reference::<Nanos>();
};

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn follows_paused_tokio_time() {
        let clock = TokioClock::new();
        let t0 = clock.now();
        tokio::time::advance(Duration::from_millis(1500)).await;
        let t1 = clock.now();
        assert_eq!(
            Duration::from(t1.duration_since(t0)),
            Duration::from_millis(1500)
        );
        assert_eq!(
            clock.instant_of(t1),
            clock.origin + Duration::from_millis(1500)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn instant_after_saturates_at_far_future() {
        let now = Instant::now();
        let s = Duration::from_secs(1);
        assert_eq!(instant_after(now, s), now + s);
        assert_eq!(instant_after(now, FAR_FUTURE), now + FAR_FUTURE);
        assert_eq!(instant_after(now, FAR_FUTURE + s), now + FAR_FUTURE);
        assert_eq!(instant_after(now, Duration::MAX), now + FAR_FUTURE);
    }
}
