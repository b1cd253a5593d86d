//! The one time source: `tokio::time`, so that tests with paused time drive every wait.
//!
//! [`TokioClock`] adapts it for `governor`, whose own waiting uses a timer that paused
//! tokio time does not move.

use governor::clock::{Clock, Reference};
use governor::nanos::Nanos;
use tokio::time::Instant;

/// The farthest any wait or deadline reaches: 100 years. A longer duration (such as
/// `Duration::MAX`) means "never" just as well, and adding it to a clock reading could
/// overflow.
pub(crate) const FAR_FUTURE: std::time::Duration =
    std::time::Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// `now + d`, saturating at `now +` [`FAR_FUTURE`]: the one overflow rule for waits and
/// deadlines.
pub(crate) fn instant_after(now: Instant, d: std::time::Duration) -> Instant {
    now + d.min(FAR_FUTURE)
}

/// A `governor` clock that reads [`tokio::time::Instant`], as nanoseconds since its creation.
///
/// Clones share one origin, so their readings compare.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: Instant,
}

impl TokioClock {
    /// A clock whose zero is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }

    /// The tokio instant a reading of this clock stands for.
    pub fn instant_of(&self, reading: Nanos) -> Instant {
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
    use std::time::Duration;

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
}
