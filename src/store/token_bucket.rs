//! A token-bucket quota: `governor`'s GCRA on the tokio clock.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::{NotKeyed, StateStore};
use governor::{Quota, RateLimiter};
use tokio::time::Instant;

use crate::clock::TokioClock;

/// `governor`'s GCRA state (its theoretical arrival time, TAT), shared with the bucket that
/// owns the limiter so that a charge can be taken back (several buckets are then charged all
/// or nothing), and so that a latency guard can be kept: governor decides on a TAT `guard`
/// later than the one kept (the server's, for sends that arrive as they were sent), so every
/// admission leaves `guard` of the tolerance in hand; what it charges is added to the TAT
/// kept. Sends then keep the bucket's rate, with `guard` of margin for arrivals that come
/// closer together than they were sent. Every use is under the scope's lock.
#[derive(Debug, Clone, Default)]
struct SavedState {
    tat: Arc<AtomicU64>,
    /// The guard, in nanoseconds.
    guard: Arc<AtomicU64>,
    /// The clock reading of the check in progress, in nanoseconds.
    now: Arc<AtomicU64>,
}

/// The state of a bucket never charged.
const UNSET: u64 = u64::MAX;

impl SavedState {
    fn new(guard: Duration) -> Self {
        let state = Self {
            tat: Arc::new(AtomicU64::new(UNSET)),
            guard: Arc::default(),
            now: Arc::default(),
        };
        state.set_guard(guard);
        state
    }

    fn set_guard(&self, guard: Duration) {
        let nanos = u64::try_from(guard.as_nanos()).unwrap_or(u64::MAX);
        self.guard.store(nanos, Ordering::Relaxed);
    }

    fn get(&self) -> u64 {
        self.tat.load(Ordering::Relaxed)
    }

    fn set(&self, v: u64) {
        self.tat.store(v, Ordering::Relaxed);
    }
}

impl StateStore for SavedState {
    type Key = NotKeyed;

    fn measure_and_replace<T, F, E>(&self, _key: &NotKeyed, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        let guard = self.guard.load(Ordering::Relaxed);
        let now = self.now.load(Ordering::Relaxed);
        let kept = Some(self.get()).filter(|&v| v != UNSET);
        // A bucket never charged has no history on the server either: no guard needed.
        let shown = kept.map(|tat| tat.saturating_add(guard));
        let (result, new) = f(shown.map(Nanos::from))?;
        let new = u64::from(new);
        // The TAT kept is the server's: the charge governor made (its new TAT past the one it
        // was shown, or past now), added to the kept TAT (or now).
        let kept = match (kept, shown) {
            (Some(tat), Some(shown)) => tat.max(now) + new.saturating_sub(shown.max(now)),
            _ => new,
        };
        self.set(kept);
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
    /// A full bucket, keeping `guard` of its tolerance in hand (see [`SavedState`]).
    pub(crate) fn new(quota: Quota, guard: Duration) -> Self {
        let clock = TokioClock::new();
        let state = SavedState::new(guard);
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

    /// Takes a new latency guard.
    pub(crate) fn set_guard(&mut self, guard: Duration) {
        self.state.set_guard(guard);
    }

    /// An empty bucket: its first cell comes one replenish interval from now.
    pub(crate) fn new_empty(quota: Quota, guard: Duration) -> Self {
        let mut bucket = Self::new(quota, guard);
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

    /// Cells taken now: what the bucket lacks of its burst (0 for a full bucket).
    pub(crate) fn used(&self) -> u32 {
        let tat = self.state.get();
        if tat == UNSET {
            return 0;
        }
        let ahead = tat.saturating_sub(u64::from(self.clock.now()));
        let interval = u64::try_from(self.quota.replenish_interval().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        let burst = self.quota.burst_size().get();
        u32::try_from(ahead.div_ceil(interval)).map_or(burst, |cells| cells.min(burst))
    }

    /// Takes `cost` cells if they are there now (`Ok`), else says when they will be (`Err`).
    /// `cost` must be at most the quota's burst size.
    pub(crate) fn try_take(&mut self, cost: NonZeroU32, now: Instant) -> Result<(), Instant> {
        let before = (self.state.get(), self.last_take);
        self.state
            .now
            .store(self.clock.now().into(), Ordering::Relaxed);
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

    /// Takes up to `cells` more cells at `now`, as many as the bucket holds (never past
    /// empty, its latency guard kept in hand); returns the cells taken. A bucket is never
    /// given cells back: it keeps no record of when they were taken.
    pub(crate) fn take_up_to(&mut self, cells: u32, now: Instant) -> u32 {
        // The most that fits, found by halving: a refused check charges nothing.
        let (mut taken, mut want) = (0u32, cells.min(self.quota.burst_size().get()));
        while let Some(n) = NonZeroU32::new(want) {
            if self.try_take(n, now).is_ok() {
                taken += want;
                want = want.min(cells - taken);
            } else {
                want /= 2;
            }
        }
        taken
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
        let mut bucket = TokenBucket::new(quota, Duration::ZERO);
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
    async fn used_counts_the_cells_missing_and_refills_with_time() {
        let quota = Quota::per_minute(NonZeroU32::new(10).unwrap());
        let guard = Duration::from_secs(6);
        let mut bucket = TokenBucket::new(quota, guard);
        assert_eq!(bucket.used(), 0);
        assert_eq!(
            bucket.try_take(NonZeroU32::new(8).unwrap(), Instant::now()),
            Ok(())
        );
        // The guard is held back from admissions, not counted as used.
        assert_eq!(bucket.used(), 8);
        // One cell every 6 s: 12 s give two back; a part of a cell is still used.
        tokio::time::advance(Duration::from_secs(12)).await;
        assert_eq!(bucket.used(), 6);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(bucket.used(), 6);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(bucket.used(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn cost_takes_several_cells() {
        let quota = Quota::per_second(NonZeroU32::new(10).unwrap());
        let mut bucket = TokenBucket::new(quota, Duration::ZERO);
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
        let mut bucket = TokenBucket::new_empty(quota, Duration::ZERO);
        let t = bucket.now();
        assert_eq!(
            bucket.try_take(one(), Instant::now()),
            Err(t + Duration::from_millis(250))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn take_up_to_stops_at_empty() {
        // 10 per second, burst 10.
        let quota = Quota::per_second(NonZeroU32::new(10).unwrap());
        let mut bucket = TokenBucket::new(quota, Duration::ZERO);
        let now = Instant::now();
        assert_eq!(bucket.take_up_to(3, now), 3);
        assert_eq!(bucket.take_up_to(100, now), 7);
        assert_eq!(bucket.take_up_to(1, now), 0);
        let t = bucket.now();
        assert_eq!(
            bucket.try_take(one(), now),
            Err(t + Duration::from_millis(100))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_guard_keeps_a_margin_of_the_burst_and_the_rate() {
        // 10 per second (a cell every 100 ms), burst 10, a guard of one interval.
        let quota = Quota::per_second(NonZeroU32::new(10).unwrap());
        let mut bucket = TokenBucket::new(quota, Duration::from_millis(100));
        let t0 = Instant::now();
        for _ in 0..9 {
            assert_eq!(bucket.try_take(one(), t0), Ok(()));
        }
        // The tenth cell stays in hand: 100 ms of margin.
        assert_eq!(
            bucket.try_take(one(), t0),
            Err(t0 + Duration::from_millis(100))
        );
        // Then one every 100 ms: the rate is kept.
        for k in 1..=5u64 {
            tokio::time::advance(Duration::from_millis(100)).await;
            let now = Instant::now();
            assert_eq!(bucket.try_take(one(), now), Ok(()), "at {k}00 ms");
            assert!(bucket.try_take(one(), now).is_err(), "only one at {k}00 ms");
        }
        // After a long idle time the bucket is full again, less the margin.
        tokio::time::advance(Duration::from_secs(10)).await;
        let now = Instant::now();
        let admitted = (0..20)
            .take_while(|_| bucket.try_take(one(), now).is_ok())
            .count();
        assert_eq!(admitted, 9);
    }
}
