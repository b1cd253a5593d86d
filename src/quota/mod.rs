//! Quotas: what may be sent when. They answer "ready now" or "ready at T" and never sleep.
//!
//! Two kinds, named after what the server counts:
//! - [`SlidingWindow`]: at most N in any window of length W, exact;
//! - [`TokenBucket`]: `governor`'s GCRA with a rate and a burst.

mod sliding_window;
mod token_bucket;

use std::num::NonZeroU32;

use tokio::time::Instant;

pub(crate) use sliding_window::SlidingWindow;
pub(crate) use token_bucket::TokenBucket;

/// The most token buckets one throttle may have (a bit each in [`Progress`]).
pub(crate) const MAX_TOKEN_BUCKETS: usize = 64;

/// Every quota of one throttle; a request must be admitted by all of them.
#[derive(Debug, Default)]
pub(crate) struct Quotas {
    windows: Vec<SlidingWindow>,
    buckets: Vec<TokenBucket>,
    /// Cells taken by a caller that gave up before it was admitted (cancelled, or past its
    /// deadline), with their cost: the next caller of that cost is admitted with them, so
    /// giving up wastes no quota.
    carried: Option<(u32, Progress)>,
}

/// Which token buckets one request has already taken its cells from, so that a request that
/// waits on a later bucket does not take from an earlier one twice.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Progress(u64);

impl Quotas {
    pub(crate) fn new(windows: Vec<SlidingWindow>, buckets: Vec<TokenBucket>) -> Self {
        debug_assert!(buckets.len() <= MAX_TOKEN_BUCKETS);
        Self {
            windows,
            buckets,
            carried: None,
        }
    }

    /// The progress a caller of `cost` starts from: cells a caller of the same cost took and
    /// left behind, if any. Cells left by a caller of another cost are not reused (governor
    /// cannot give them back): they are lost, which only ever slows admission.
    pub(crate) fn resume(&mut self, cost: u32) -> Progress {
        match self.carried.take() {
            Some((c, progress)) if c == cost => progress,
            _ => Progress::default(),
        }
    }

    /// Leaves the cells a caller of `cost` has taken to the next caller of that cost.
    pub(crate) fn leave(&mut self, cost: u32, progress: Progress) {
        if progress.0 != 0 {
            self.carried = Some((cost, progress));
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.windows.is_empty() && self.buckets.is_empty()
    }

    /// The largest cost every quota can admit, or `None` with no quotas.
    pub(crate) fn capacity(&self) -> Option<u32> {
        let w = self.windows.iter().map(SlidingWindow::capacity);
        let b = self.buckets.iter().map(TokenBucket::capacity);
        w.chain(b).min()
    }

    /// Admits `cost` units at `now` if every quota has room (`Ok`, recorded), else returns the
    /// earliest instant worth trying again. Token buckets are taken one by one, and `progress`
    /// remembers which were taken; sliding windows are recorded only when all admit.
    /// `cost` must be at most [`capacity`](Self::capacity).
    pub(crate) fn try_admit(
        &mut self,
        cost: u32,
        now: Instant,
        progress: &mut Progress,
    ) -> Result<(), Instant> {
        if cost == 0 {
            return Ok(());
        }
        let ready = self
            .windows
            .iter_mut()
            .map(|w| w.ready_at(cost, now))
            .max()
            .unwrap_or(now);
        if ready > now {
            return Err(ready);
        }
        let cells = NonZeroU32::new(cost).expect("cost is not zero");
        for (i, bucket) in self.buckets.iter().enumerate() {
            let bit = 1u64 << i;
            if progress.0 & bit == 0 {
                bucket.try_take(cells)?;
                progress.0 |= bit;
            }
        }
        for w in &mut self.windows {
            w.record(cost, now);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn every_quota_must_admit() {
        let window = SlidingWindow::new(
            NonZeroU32::new(2).unwrap(),
            Duration::from_secs(10),
            Duration::ZERO,
        );
        let bucket = TokenBucket::new(governor::Quota::per_second(NonZeroU32::new(1).unwrap()));
        let mut quotas = Quotas::new(vec![window], vec![bucket]);
        assert_eq!(quotas.capacity(), Some(1));
        let t0 = Instant::now();
        let mut p = Progress::default();
        assert_eq!(quotas.try_admit(1, t0, &mut p), Ok(()));
        // The bucket is empty for 1 s although the window has room.
        let mut p = Progress::default();
        assert_eq!(
            quotas.try_admit(1, t0, &mut p),
            Err(t0 + Duration::from_secs(1))
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        let t1 = Instant::now();
        assert_eq!(quotas.try_admit(1, t1, &mut p), Ok(()));
        // The window is now full until the first send leaves it, whatever the bucket says.
        tokio::time::advance(Duration::from_secs(1)).await;
        let mut p = Progress::default();
        assert_eq!(
            quotas.try_admit(1, Instant::now(), &mut p),
            Err(t0 + Duration::from_secs(10))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_bucket_already_taken_is_not_taken_again() {
        let fast = TokenBucket::new(governor::Quota::per_second(NonZeroU32::new(1).unwrap()));
        let slow = TokenBucket::new(governor::Quota::per_minute(NonZeroU32::new(1).unwrap()));
        let mut quotas = Quotas::new(vec![], vec![fast, slow]);
        let mut p = Progress::default();
        assert_eq!(quotas.try_admit(1, Instant::now(), &mut p), Ok(()));
        let mut p = Progress::default();
        // `fast` is empty: nothing taken.
        assert!(quotas.try_admit(1, Instant::now(), &mut p).is_err());
        tokio::time::advance(Duration::from_secs(1)).await;
        // `fast` taken now, `slow` still empty.
        assert!(quotas.try_admit(1, Instant::now(), &mut p).is_err());
        tokio::time::advance(Duration::from_secs(59)).await;
        // `slow` refilled; `fast` is not taken a second time, so this succeeds though `fast`
        // would also have refilled; the next request then finds `fast` with its cell.
        assert_eq!(quotas.try_admit(1, Instant::now(), &mut p), Ok(()));
        let mut p2 = Progress::default();
        let err = quotas.try_admit(1, Instant::now(), &mut p2).unwrap_err();
        assert_eq!(err, Instant::now() + Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn cells_left_behind_go_to_the_next_caller_of_the_same_cost() {
        let fast = TokenBucket::new(governor::Quota::per_minute(NonZeroU32::new(4).unwrap()));
        let slow = TokenBucket::new(governor::Quota::per_minute(NonZeroU32::new(1).unwrap()));
        let mut quotas = Quotas::new(vec![], vec![fast, slow]);
        let now = Instant::now();
        let mut p = quotas.resume(1);
        assert_eq!(quotas.try_admit(1, now, &mut p), Ok(()));
        // The next caller takes a `fast` cell, then waits on `slow` and gives up.
        let mut p = quotas.resume(1);
        assert!(quotas.try_admit(1, now, &mut p).is_err());
        quotas.leave(1, p);
        // A caller of another cost cannot use them: they are dropped.
        assert_eq!(quotas.resume(2).0, 0);
        quotas.leave(1, Progress(1));
        // A caller of the same cost resumes with the `fast` cell already taken.
        assert_eq!(quotas.resume(1).0, 1);
        assert_eq!(quotas.resume(1).0, 0, "taken once");
    }
}
