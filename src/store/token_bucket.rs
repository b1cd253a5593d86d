//! A token-bucket quota: `governor`'s GCRA on the tokio clock.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[cfg(test)]
use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::{NotKeyed, StateStore};
use governor::{Quota, RateLimiter};
use tokio::time::Instant;

use crate::clock::TokioClock;

/// `governor`'s GCRA state (its theoretical arrival time), shared with the bucket that owns
/// the limiter so that a charge can be taken back: several buckets are then charged all or
/// nothing. Every use is under the scope's lock.
#[derive(Debug, Clone, Default)]
struct SavedState(Arc<AtomicU64>);

/// The state of a bucket never charged.
const UNSET: u64 = u64::MAX;

impl SavedState {
    fn new() -> Self {
        Self(Arc::new(AtomicU64::new(UNSET)))
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }
}

impl StateStore for SavedState {
    type Key = NotKeyed;

    fn measure_and_replace<T, F, E>(&self, _key: &NotKeyed, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        let old = Some(self.get()).filter(|&v| v != UNSET).map(Nanos::from);
        let (result, new) = f(old)?;
        self.set(new.into());
        Ok(result)
    }
}

type Gcra = RateLimiter<NotKeyed, SavedState, TokioClock, NoOpMiddleware<Nanos>>;

/// `governor`'s GCRA: cells replenish at the quota's rate, up to its burst size.
///
/// Note that a bucket with burst B and rate N per window W admits up to B + N − 1 requests in
/// the first window of length W (the full burst, then the refill). Use a sliding window where
/// the server counts "N in any window W".
#[derive(Debug)]
pub(crate) struct TokenBucket {
    gcra: Gcra,
    state: SavedState,
    clock: TokioClock,
    quota: Quota,
    /// When cells were last taken: the bucket is full again `burst / rate` later.
    last_take: Option<Instant>,
    /// The state before the last charge, to take it back.
    before: (u64, Option<Instant>),
}

impl TokenBucket {
    /// A full bucket.
    pub(crate) fn new(quota: Quota) -> Self {
        let clock = TokioClock::new();
        let state = SavedState::new();
        Self {
            gcra: RateLimiter::new(quota, state.clone(), clock),
            state,
            clock,
            quota,
            last_take: None,
            before: (UNSET, None),
        }
    }

    /// Takes back the last charge made by [`try_take`](Self::try_take) (once).
    pub(crate) fn undo_last(&mut self) {
        self.state.set(self.before.0);
        self.last_take = self.before.1;
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
        let before = (self.state.get(), self.last_take);
        match self.gcra.check_n(cost) {
            Ok(Ok(())) => {
                self.before = before;
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
