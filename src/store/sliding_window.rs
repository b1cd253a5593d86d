//! An exact sliding-window quota: at most `limit` units in any window of length `window`.

use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::time::Duration;

use tokio::time::Instant;

use super::{QuotaName, WindowQuota};

/// At most `limit` units sent in any window of length `window`, counted exactly.
///
/// Keeps a log of recent sends (instant and units). A send of `cost` units is admitted now if the
/// units still in the window plus `cost` fit in `limit`; otherwise it is ready when enough of the
/// oldest sends have left the window. A send leaves the window `window + guard` after it was
/// made: the guard absorbs the difference between when the client sends and when the server
/// counts (network latency varies), so the server never sees `limit + 1` in its own window.
///
/// Memory: one entry per admitted send still in the window (at most `limit` entries).
#[derive(Debug)]
pub(crate) struct SlidingWindow {
    limit: NonZeroU32,
    /// The window's length as configured (the guard not included), to name the quota.
    window: Duration,
    span: Duration,
    log: VecDeque<(Instant, u32)>,
    used: u32,
}

impl SlidingWindow {
    /// `window + guard` is the time a send stays counted, at most [`FAR_FUTURE`](crate::clock::FAR_FUTURE) (100 years:
    /// a longer window, such as `Duration::MAX`, means "ever" just as well).
    pub(crate) fn new(quota: &WindowQuota) -> Self {
        Self {
            limit: quota.limit,
            window: quota.window,
            span: Self::span(quota),
            log: VecDeque::new(),
            used: 0,
        }
    }

    fn span(quota: &WindowQuota) -> Duration {
        quota
            .window
            .saturating_add(quota.guard)
            .min(crate::clock::FAR_FUTURE)
    }

    /// Takes a new limit and length, keeping every send counted: a smaller limit admits
    /// nothing until enough sends have left the window.
    pub(crate) fn resize(&mut self, quota: &WindowQuota) {
        self.limit = quota.limit;
        self.window = quota.window;
        self.span = Self::span(quota);
    }

    fn expire(&mut self, now: Instant) {
        while let Some(&(at, units)) = self.log.front() {
            if at + self.span > now {
                break;
            }
            self.used -= units;
            self.log.pop_front();
        }
    }

    /// When `cost` units could be sent: `now` if they fit, else the instant enough old sends
    /// leave the window. `cost` must be at most [`capacity`](Self::capacity).
    pub(crate) fn ready_at(&mut self, cost: u32, now: Instant) -> Instant {
        self.expire(now);
        let over = (u64::from(self.used) + u64::from(cost)).saturating_sub(self.limit.get().into());
        if over == 0 {
            return now;
        }
        let mut freed = 0;
        for &(at, units) in &self.log {
            freed += u64::from(units);
            if freed >= over {
                return at + self.span;
            }
        }
        // Unreachable while cost <= limit: the whole log frees `used` >= `over` units.
        now + self.span
    }

    /// Records a send of `cost` units at `now`. Call only when [`ready_at`](Self::ready_at)
    /// returned `now`.
    pub(crate) fn record(&mut self, cost: u32, now: Instant) {
        if cost == 0 {
            return;
        }
        // `used + cost <= limit` here: `ready_at` admitted it.
        self.used = self.used.saturating_add(cost);
        match self.log.back_mut() {
            Some((at, units)) if *at == now => *units += cost,
            _ => self.log.push_back((now, cost)),
        }
    }

    /// Units counted in the window ending at `now`.
    pub(crate) fn used(&mut self, now: Instant) -> u32 {
        self.expire(now);
        self.used
    }

    /// The quota this window enforces, by name.
    pub(crate) fn name(&self) -> QuotaName {
        QuotaName::SlidingWindow {
            limit: self.limit.get(),
            window: self.window,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(limit: u32, window: Duration, guard: Duration) -> WindowQuota {
        WindowQuota::new(NonZeroU32::new(limit).unwrap(), window, guard)
    }

    fn window(limit: u32, secs: u64) -> SlidingWindow {
        SlidingWindow::new(&quota(limit, Duration::from_secs(secs), Duration::ZERO))
    }

    #[test]
    fn admits_limit_at_once_then_waits_for_the_oldest() {
        let t0 = Instant::now();
        let mut w = window(3, 10);
        for i in 0..3 {
            let now = t0 + Duration::from_secs(i);
            assert_eq!(w.ready_at(1, now), now);
            w.record(1, now);
        }
        let now = t0 + Duration::from_secs(3);
        assert_eq!(w.ready_at(1, now), t0 + Duration::from_secs(10));
        assert_eq!(w.ready_at(2, now), t0 + Duration::from_secs(11));
        let later = t0 + Duration::from_secs(10);
        assert_eq!(w.ready_at(1, later), later);
        assert_eq!(w.used(later), 2);
    }

    #[test]
    fn guard_extends_the_window() {
        let t0 = Instant::now();
        let mut w = SlidingWindow::new(&quota(
            1,
            Duration::from_secs(6),
            Duration::from_millis(100),
        ));
        w.record(1, t0);
        assert_eq!(w.ready_at(1, t0), t0 + Duration::from_millis(6100));
    }

    #[test]
    fn costs_are_counted_in_units() {
        let t0 = Instant::now();
        let mut w = window(10, 60);
        w.record(4, t0);
        w.record(4, t0 + Duration::from_secs(1));
        let now = t0 + Duration::from_secs(2);
        assert_eq!(w.ready_at(2, now), now);
        // 3 units need 1 freed: the first send (4 units) must leave.
        assert_eq!(w.ready_at(3, now), t0 + Duration::from_secs(60));
        // 7 units need 6 freed: both sends must leave.
        assert_eq!(w.ready_at(7, now), t0 + Duration::from_secs(61));
    }

    #[test]
    fn sends_at_one_instant_share_an_entry() {
        let t0 = Instant::now();
        let mut w = window(5, 1);
        w.record(1, t0);
        w.record(1, t0);
        assert_eq!(w.log.len(), 1);
        assert_eq!(w.used(t0), 2);
    }

    #[test]
    fn a_limit_near_u32_max_does_not_overflow() {
        let t0 = Instant::now();
        let mut w = window(u32::MAX, 60);
        assert_eq!(w.ready_at(u32::MAX - 1, t0), t0);
        w.record(u32::MAX - 1, t0);
        assert_eq!(w.ready_at(1, t0), t0);
        assert_eq!(w.ready_at(u32::MAX, t0), t0 + Duration::from_secs(60));
        assert_eq!(w.used(t0), u32::MAX - 1);
    }

    #[test]
    fn resize_keeps_the_log() {
        let t0 = Instant::now();
        let mut w = window(4, 10);
        w.record(3, t0);
        w.resize(&quota(2, Duration::from_secs(20), Duration::ZERO));
        // 3 units counted, limit 2: nothing fits until they leave, 20 s after they were sent.
        assert_eq!(w.ready_at(1, t0), t0 + Duration::from_secs(20));
        w.resize(&quota(5, Duration::from_secs(20), Duration::ZERO));
        assert_eq!(w.ready_at(2, t0), t0);
        assert_eq!(w.ready_at(3, t0), t0 + Duration::from_secs(20));
    }
}
