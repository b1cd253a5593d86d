//! Quotas: what may be sent when. They answer "ready now" or "ready at T" and never sleep.
//!
//! Two kinds, named after what the server counts:
//! - [`SlidingWindow`]: at most N in any window of length W, exact;
//! - [`TokenBucket`]: `governor`'s GCRA with a rate and a burst.

use std::num::NonZeroU32;

use tokio::time::Instant;

use super::sliding_window::SlidingWindow;
use super::token_bucket::TokenBucket;
use super::{Limits, QuotaName, QuotaUsage, Settlement, Unit};

/// The most token buckets one scope may have.
pub(crate) const MAX_TOKEN_BUCKETS: usize = 64;

/// Every quota of one scope; a request must be admitted by all of them, all or nothing:
/// sliding windows are checked before anything is charged, and token buckets charged one by
/// one are taken back when a later one refuses.
#[derive(Debug, Default)]
pub(crate) struct Quotas {
    windows: Vec<SlidingWindow>,
    buckets: Vec<TokenBucket>,
}

impl Quotas {
    /// The quotas `limits` describe, all empty.
    pub(crate) fn new(limits: &Limits) -> Self {
        debug_assert!(limits.buckets.len() <= MAX_TOKEN_BUCKETS);
        Self {
            windows: limits.windows.iter().map(SlidingWindow::new).collect(),
            buckets: limits
                .buckets
                .iter()
                .map(|&q| TokenBucket::new(q, limits.bucket_guard))
                .collect(),
        }
    }

    /// Takes `limits` and keeps what was counted: a window keeps its log under its new limit
    /// and length; a bucket whose quota changed starts empty (governor's state cannot be
    /// carried over; empty errs slow, never over). Added buckets start full; added windows
    /// count the requests sent at `sent` (oldest first) that are still in them at `now`.
    pub(crate) fn resize(&mut self, limits: &Limits, sent: &[Instant], now: Instant) {
        self.windows.truncate(limits.windows.len());
        for (i, w) in limits.windows.iter().enumerate() {
            match self.windows.get_mut(i) {
                Some(window) => window.resize(w),
                None => self.windows.push(SlidingWindow::counting(w, sent, now)),
            }
        }
        self.buckets.truncate(limits.buckets.len());
        for (i, &q) in limits.buckets.iter().enumerate() {
            match self.buckets.get_mut(i) {
                Some(bucket) if bucket.quota() == q => bucket.set_guard(limits.bucket_guard),
                Some(bucket) => *bucket = TokenBucket::new_empty(q, limits.bucket_guard),
                None => self.buckets.push(TokenBucket::new(q, limits.bucket_guard)),
            }
        }
    }

    /// Whether nothing is counted: every window empty, every bucket full.
    pub(crate) fn is_fresh(&mut self, now: Instant) -> bool {
        self.windows.iter_mut().all(|w| w.used(now) == 0)
            && self.buckets.iter().all(|b| b.is_full(now))
    }

    /// The quota with the highest share of its capacity taken at `now` (the first among
    /// equals, sliding windows before token buckets), or `None` with no quota.
    pub(crate) fn most_used(&mut self, now: Instant) -> Option<QuotaUsage> {
        let windows = self.windows.iter_mut().map(|w| QuotaUsage {
            used: w.used(now),
            quota: w.name(),
        });
        let buckets = self.buckets.iter().map(|b| {
            let quota = b.quota();
            QuotaUsage {
                used: b.used(),
                quota: QuotaName::TokenBucket {
                    burst: quota.burst_size().get(),
                    replenish: quota.replenish_interval(),
                },
            }
        });
        windows.chain(buckets).reduce(|best, next| {
            // next.used / next capacity > best.used / best capacity, in integers.
            let next_share = u64::from(next.used) * u64::from(best.quota.capacity());
            let best_share = u64::from(best.used) * u64::from(next.quota.capacity());
            if next_share > best_share {
                next
            } else {
                best
            }
        })
    }

    /// Admits `cost` units at `now` if every quota has room (`Ok`, charged), else returns the
    /// earliest instant worth trying again. `cost` must be at most the smallest quota's
    /// capacity.
    pub(crate) fn try_admit(&mut self, cost: u32, now: Instant) -> Result<(), Instant> {
        let Some(cells) = NonZeroU32::new(cost) else {
            return Ok(());
        };
        let ready = self
            .windows
            .iter_mut()
            .map(|w| w.ready_at(w.charge(cost), now))
            .max()
            .unwrap_or(now);
        if ready > now {
            return Err(ready);
        }
        for i in 0..self.buckets.len() {
            if let Err(ready) = self.buckets[i].try_take(cells, now) {
                // All or nothing: the buckets charged before this one are taken back.
                for bucket in &mut self.buckets[..i] {
                    bucket.undo_last();
                }
                return Err(ready);
            }
        }
        for w in &mut self.windows {
            w.record(w.charge(cost), now);
        }
        Ok(())
    }

    /// Whether an admission of `cost` is worth remembering for a later settlement: some
    /// quota counts the cost.
    pub(crate) fn counts_cost(&self, cost: u32) -> bool {
        cost > 0
            && (!self.buckets.is_empty() || self.windows.iter().any(|w| w.unit().counts_cost()))
    }

    /// How long a send is worth remembering for a settlement: the longest window (guard
    /// included) or bucket refill time.
    pub(crate) fn memory(&self) -> std::time::Duration {
        let windows = self.windows.iter().map(SlidingWindow::span);
        let buckets = self
            .buckets
            .iter()
            .map(|b| b.quota().burst_size_replenished_in());
        windows.chain(buckets).max().unwrap_or_default()
    }

    /// Settles a send made at `sent` (`None`: not known) of `estimate` units (`None`: already
    /// settled, or not known) with `settlement`, at `now`; see
    /// [`Store::settle`](super::Store::settle) for the rules.
    pub(crate) fn settle(
        &mut self,
        sent: Option<Instant>,
        estimate: Option<u32>,
        settlement: Settlement,
        now: Instant,
    ) {
        if let (Some(at), Some(estimate), Some(actual)) = (sent, estimate, settlement.actual) {
            for w in self.windows.iter_mut().filter(|w| w.unit().counts_cost()) {
                if actual < estimate {
                    w.refund(at, estimate - actual, now);
                } else {
                    w.charge_at(at, actual - estimate, now);
                }
            }
            for b in &mut self.buckets {
                b.take_up_to(actual.saturating_sub(estimate), now);
            }
        }
        let Some(server) = settlement.tokens_remaining else {
            return;
        };
        for w in self.windows.iter_mut().filter(|w| w.unit() == Unit::Tokens) {
            let local = w.remaining(now);
            let over = u64::from(local).saturating_sub(server);
            // At the send's place while it is counted, else now.
            let at = sent.filter(|&at| w.counts(at, now));
            // `over <= local`, a u32.
            w.charge_at(at.unwrap_or(now), over as u32, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{QuotaName, QuotaUsage, WindowQuota};
    use std::time::Duration;

    fn nz(n: u32) -> NonZeroU32 {
        NonZeroU32::new(n).unwrap()
    }

    fn window(limit: u32, secs: u64) -> WindowQuota {
        WindowQuota::new(nz(limit), Duration::from_secs(secs), Duration::ZERO)
    }

    #[tokio::test(start_paused = true)]
    async fn every_quota_must_admit() {
        let limits = Limits::new()
            .with_window(window(2, 10))
            .with_bucket(governor::Quota::per_second(nz(1)));
        let mut quotas = Quotas::new(&limits);
        assert_eq!(limits.capacity(), Some(1));
        let t0 = Instant::now();
        assert_eq!(quotas.try_admit(1, t0), Ok(()));
        // The bucket is empty for 1 s although the window has room.
        assert_eq!(quotas.try_admit(1, t0), Err(t0 + Duration::from_secs(1)));
        tokio::time::advance(Duration::from_secs(1)).await;
        let t1 = Instant::now();
        assert_eq!(quotas.try_admit(1, t1), Ok(()));
        // The window is now full until the first send leaves it, whatever the bucket says.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            quotas.try_admit(1, Instant::now()),
            Err(t0 + Duration::from_secs(10))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_window_charges_no_bucket() {
        let limits = Limits::new()
            .with_window(window(1, 10))
            .with_bucket(governor::Quota::per_second(nz(5)));
        let mut quotas = Quotas::new(&limits);
        let t0 = Instant::now();
        assert_eq!(quotas.try_admit(1, t0), Ok(()));
        for _ in 0..10 {
            assert_eq!(quotas.try_admit(1, t0), Err(t0 + Duration::from_secs(10)));
        }
        tokio::time::advance(Duration::from_secs(10)).await;
        // Had the refused attempts taken cells, the bucket (burst 5) would be empty now.
        let mut quotas_bucket_only = quotas;
        quotas_bucket_only.windows.clear();
        for _ in 0..5 {
            assert_eq!(quotas_bucket_only.try_admit(1, Instant::now()), Ok(()));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_by_a_later_bucket_takes_back_the_earlier_ones() {
        let limits = Limits::new()
            .with_bucket(governor::Quota::per_minute(nz(4)))
            .with_bucket(governor::Quota::per_minute(nz(2)));
        let mut quotas = Quotas::new(&limits);
        let now = Instant::now();
        assert_eq!(quotas.try_admit(2, now), Ok(()));
        // The second bucket is empty: the first is charged, then given back, every time.
        for _ in 0..5 {
            assert_eq!(quotas.try_admit(1, now), Err(now + Duration::from_secs(30)));
        }
        // So the first still holds its 2 cells.
        quotas.buckets.truncate(1);
        assert_eq!(quotas.try_admit(2, now), Ok(()));
        assert_eq!(quotas.try_admit(1, now), Err(now + Duration::from_secs(15)));
    }

    #[tokio::test(start_paused = true)]
    async fn resize_keeps_the_window_log_and_empties_a_changed_bucket() {
        let limits = Limits::new()
            .with_window(window(3, 10))
            .with_bucket(governor::Quota::per_second(nz(10)));
        let mut quotas = Quotas::new(&limits);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(quotas.try_admit(1, t0), Ok(()));
        }
        // Shrunk to 2: the 3 sends already counted keep it full until they leave.
        let smaller = Limits::new()
            .with_window(window(2, 10))
            .with_bucket(governor::Quota::per_second(nz(10)));
        quotas.resize(&smaller, &[], t0);
        assert_eq!(quotas.try_admit(1, t0), Err(t0 + Duration::from_secs(10)));
        // Grown to 5: two more fit at once.
        let larger = Limits::new()
            .with_window(window(5, 10))
            .with_bucket(governor::Quota::per_second(nz(20)));
        quotas.resize(&larger, &[], t0);
        tokio::time::advance(Duration::from_millis(50)).await;
        let t1 = Instant::now();
        // The changed bucket starts empty: one cell every 50 ms at 20 per second.
        assert_eq!(quotas.try_admit(1, t1), Ok(()));
        assert_eq!(quotas.try_admit(1, t1), Err(t1 + Duration::from_millis(50)));
        assert!(!quotas.is_fresh(t1));
    }

    #[tokio::test(start_paused = true)]
    async fn most_used_is_the_highest_share_of_a_capacity() {
        assert_eq!(Quotas::new(&Limits::new()).most_used(Instant::now()), None);
        let limits = Limits::new()
            .with_window(window(100, 60))
            .with_window(window(10, 1))
            .with_bucket(governor::Quota::per_minute(nz(4)));
        let mut quotas = Quotas::new(&limits);
        let now = Instant::now();
        let name = |i: usize| -> QuotaName {
            let w = &limits.windows[i];
            QuotaName::SlidingWindow {
                limit: w.limit.get(),
                window: w.window,
            }
        };
        // Nothing used: the first among equals.
        assert_eq!(quotas.most_used(now), Some(QuotaUsage::new(name(0), 0)));
        // 2 units: 2 % of the first window, 20 % of the second, 50 % of the bucket.
        assert_eq!(quotas.try_admit(2, now), Ok(()));
        let bucket = QuotaName::TokenBucket {
            burst: 4,
            replenish: Duration::from_secs(15),
        };
        assert_eq!(quotas.most_used(now), Some(QuotaUsage::new(bucket, 2)));
        // 30 s later the bucket has both cells back; the 1 s window is empty; the minute
        // window still counts 2.
        tokio::time::advance(Duration::from_secs(30)).await;
        let later = Instant::now();
        assert_eq!(quotas.most_used(later), Some(QuotaUsage::new(name(0), 2)));
    }

    #[tokio::test(start_paused = true)]
    async fn fresh_again_once_every_quota_has_refilled() {
        let limits = Limits::new()
            .with_window(window(2, 10))
            .with_bucket(governor::Quota::per_second(nz(2)));
        let mut quotas = Quotas::new(&limits);
        assert!(quotas.is_fresh(Instant::now()));
        assert_eq!(quotas.try_admit(1, Instant::now()), Ok(()));
        assert!(!quotas.is_fresh(Instant::now()));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(
            !quotas.is_fresh(Instant::now()),
            "the window still counts the send"
        );
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(quotas.is_fresh(Instant::now()));
    }
}
