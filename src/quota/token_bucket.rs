//! A token-bucket quota: `governor`'s GCRA on the tokio clock.

use std::num::NonZeroU32;

#[cfg(test)]
use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use tokio::time::Instant;

use crate::clock::TokioClock;

type Gcra = RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<Nanos>>;

/// `governor`'s GCRA: cells replenish at the quota's rate, up to its burst size.
///
/// Note that a bucket with burst B and rate N per window W admits up to B + N − 1 requests in
/// the first window of length W (the full burst, then the refill). Use a sliding window where
/// the server counts "N in any window W".
#[derive(Debug)]
pub(crate) struct TokenBucket {
    gcra: Gcra,
    clock: TokioClock,
    burst: NonZeroU32,
}

impl TokenBucket {
    pub(crate) fn new(quota: Quota) -> Self {
        let clock = TokioClock::new();
        Self {
            gcra: RateLimiter::direct_with_clock(quota, clock),
            clock,
            burst: quota.burst_size(),
        }
    }

    /// The most units one request may take.
    pub(crate) fn capacity(&self) -> u32 {
        self.burst.get()
    }

    /// Takes `cost` cells if they are there now (`Ok`), else says when they will be (`Err`).
    /// `cost` must be between 1 and [`capacity`](Self::capacity).
    pub(crate) fn try_take(&self, cost: NonZeroU32) -> Result<(), Instant> {
        match self.gcra.check_n(cost) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(not_until)) => Err(self.clock.instant_of(not_until.earliest_possible())),
            // Excluded by the capacity check made before admission; waiting would not help.
            Err(_) => Err(Instant::now() + std::time::Duration::from_secs(u32::MAX as u64)),
        }
    }

    #[cfg(test)]
    fn now(&self) -> Instant {
        self.clock.instant_of(self.clock.now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn one() -> NonZeroU32 {
        NonZeroU32::new(1).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn burst_then_refill_at_the_rate() {
        let quota = Quota::per_second(NonZeroU32::new(2).unwrap());
        let bucket = TokenBucket::new(quota);
        assert_eq!(bucket.capacity(), 2);
        assert_eq!(bucket.try_take(one()), Ok(()));
        assert_eq!(bucket.try_take(one()), Ok(()));
        let t = bucket.now();
        assert_eq!(bucket.try_take(one()), Err(t + Duration::from_millis(500)));
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(bucket.try_take(one()), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn cost_takes_several_cells() {
        let quota = Quota::per_second(NonZeroU32::new(10).unwrap());
        let bucket = TokenBucket::new(quota);
        assert_eq!(bucket.try_take(NonZeroU32::new(10).unwrap()), Ok(()));
        let t = bucket.now();
        assert_eq!(
            bucket.try_take(NonZeroU32::new(5).unwrap()),
            Err(t + Duration::from_millis(500))
        );
    }
}
