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
    quota: Quota,
    /// When cells were last taken: the bucket is full again `burst / rate` later.
    last_take: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket.
    pub(crate) fn new(quota: Quota) -> Self {
        let clock = TokioClock::new();
        Self {
            gcra: RateLimiter::direct_with_clock(quota, clock),
            clock,
            quota,
            last_take: None,
        }
    }

    /// An empty bucket: its first cell comes one replenish interval from now.
    pub(crate) fn new_empty(quota: Quota) -> Self {
        let mut bucket = Self::new(quota);
        let burst = quota.burst_size();
        // A fresh bucket holds exactly its burst.
        let _ = bucket.try_take(burst, Instant::now());
        bucket
    }

    /// The quota this bucket enforces.
    pub(crate) fn quota(&self) -> Quota {
        self.quota
    }

    /// Whether the bucket holds its whole burst again at `now`.
    pub(crate) fn is_full(&self, now: Instant) -> bool {
        let refill = self.quota.burst_size_replenished_in();
        self.last_take
            .is_none_or(|t| now.saturating_duration_since(t) >= refill)
    }

    /// Takes `cost` cells if they are there now (`Ok`), else says when they will be (`Err`).
    /// `cost` must be at most the quota's burst size.
    pub(crate) fn try_take(&mut self, cost: NonZeroU32, now: Instant) -> Result<(), Instant> {
        match self.gcra.check_n(cost) {
            Ok(Ok(())) => {
                self.last_take = Some(now);
                Ok(())
            }
            Ok(Err(not_until)) => Err(self.clock.instant_of(not_until.earliest_possible())),
            // Excluded by the capacity check made before admission; waiting would not help.
            Err(_) => Err(now + std::time::Duration::from_secs(u32::MAX as u64)),
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
        let mut bucket = TokenBucket::new(quota);
        assert!(bucket.is_full(Instant::now()));
        assert_eq!(bucket.try_take(one(), Instant::now()), Ok(()));
        assert_eq!(bucket.try_take(one(), Instant::now()), Ok(()));
        let t = bucket.now();
        assert_eq!(
            bucket.try_take(one(), Instant::now()),
            Err(t + Duration::from_millis(500))
        );
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(bucket.try_take(one(), Instant::now()), Ok(()));
        assert!(!bucket.is_full(Instant::now()));
        tokio::time::advance(Duration::from_millis(1000)).await;
        assert!(bucket.is_full(Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn cost_takes_several_cells() {
        let quota = Quota::per_second(NonZeroU32::new(10).unwrap());
        let mut bucket = TokenBucket::new(quota);
        let now = Instant::now();
        assert_eq!(bucket.try_take(NonZeroU32::new(10).unwrap(), now), Ok(()));
        let t = bucket.now();
        assert_eq!(
            bucket.try_take(NonZeroU32::new(5).unwrap(), now),
            Err(t + Duration::from_millis(500))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_empty_bucket_waits_one_interval() {
        let quota = Quota::per_second(NonZeroU32::new(4).unwrap());
        let mut bucket = TokenBucket::new_empty(quota);
        let t = bucket.now();
        assert_eq!(
            bucket.try_take(one(), Instant::now()),
            Err(t + Duration::from_millis(250))
        );
    }
}
