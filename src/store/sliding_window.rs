//! An exact sliding-window quota: at most `limit` units in any window of length `window`.

use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::time::Duration;

use tokio::time::Instant;

use super::{QuotaName, Unit, WindowQuota};

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
    unit: Unit,
}

impl SlidingWindow {
    /// `window + guard` is the time a send stays counted, at most [`FAR_FUTURE`](crate::clock::FAR_FUTURE) (100 years:
    /// a longer window, such as `Duration::MAX`, means "ever" just as well).
    pub(crate) fn new(quota: &WindowQuota) -> Self {
        Self {
            limit: quota.limit,
            window: quota.window,
            span: Self::span_of(quota),
            log: VecDeque::new(),
            used: 0,
            unit: quota.unit,
        }
    }

    /// A window that counts the requests sent at `sent` (oldest first, one each) that are
    /// still in it at `now`; a window of [`Unit::Tokens`] counts none (a request's tokens are
    /// not known).
    pub(crate) fn counting(quota: &WindowQuota, sent: &[Instant], now: Instant) -> Self {
        let mut window = Self::new(quota);
        if window.unit == Unit::Tokens {
            return window;
        }
        let mut sent: Vec<Instant> = sent
            .iter()
            .copied()
            .filter(|&at| window.counts(at, now) && at <= now)
            .collect();
        sent.sort_unstable();
        for at in sent {
            window.used = window.used.saturating_add(1);
            match window.log.back_mut() {
                Some((last, units)) if *last == at => *units += 1,
                _ => window.log.push_back((at, 1)),
            }
        }
        window
    }

    /// What the window counts.
    pub(crate) fn unit(&self) -> Unit {
        self.unit
    }

    /// What an admission of `cost` takes from this window.
    pub(crate) fn charge(&self, cost: u32) -> u32 {
        self.unit.charge(cost)
    }

    /// How long a send stays counted: `window + guard`.
    pub(crate) fn span(&self) -> Duration {
        self.span
    }

    fn span_of(quota: &WindowQuota) -> Duration {
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
        self.span = Self::span_of(quota);
        self.unit = quota.unit;
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

    /// Units that may still be sent at `now`: the limit less what is counted (0 when a shrunk
    /// limit is below it).
    pub(crate) fn remaining(&mut self, now: Instant) -> u32 {
        self.limit.get().saturating_sub(self.used(now))
    }

    /// Whether a send made at `at` is still counted at `now`.
    pub(crate) fn counts(&self, at: Instant, now: Instant) -> bool {
        at + self.span > now
    }

    /// The index of the log entry made at `at`, or where it would go.
    fn place(&self, at: Instant) -> Result<usize, usize> {
        self.log.binary_search_by(|&(t, _)| t.cmp(&at))
    }

    /// Takes back up to `units` from the send made at `at` (never more than its entry still
    /// counts: a send that has left the window gives nothing back); returns the units taken
    /// back.
    pub(crate) fn refund(&mut self, at: Instant, units: u32, now: Instant) -> u32 {
        self.expire(now);
        let Ok(i) = self.place(at) else {
            return 0;
        };
        let entry = &mut self.log[i].1;
        let back = units.min(*entry);
        *entry -= back;
        self.used -= back;
        if *entry == 0 {
            self.log.remove(i);
        }
        back
    }

    /// Adds up to `units` at the place of a send made at `at`, cut to the room left under the
    /// limit at `now` (so the window never counts more than its limit); nothing when that
    /// send has left the window. Returns the units added.
    pub(crate) fn charge_at(&mut self, at: Instant, units: u32, now: Instant) -> u32 {
        let room = self.remaining(now);
        let units = units.min(room);
        if units == 0 || !self.counts(at, now) || at > now {
            return 0;
        }
        match self.place(at) {
            Ok(i) => self.log[i].1 += units,
            Err(i) => self.log.insert(i, (at, units)),
        }
        self.used += units;
        units
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
    fn refunds_come_from_the_send_and_never_exceed_it() {
        let t0 = Instant::now();
        let mut w = window(10, 60);
        w.record(4, t0);
        let t1 = t0 + Duration::from_secs(1);
        w.record(3, t1);
        assert_eq!(w.refund(t0, 2, t1), 2);
        assert_eq!(w.used(t1), 5);
        // Only 2 of the first send are left to give back.
        assert_eq!(w.refund(t0, 9, t1), 2);
        assert_eq!(w.used(t1), 3);
        // The refunded units left with their send: the send at 1 s now holds the window.
        assert_eq!(w.ready_at(10, t1), t1 + Duration::from_secs(60));
        // A send that has left the window gives nothing back.
        let late = t1 + Duration::from_secs(60);
        assert_eq!(w.refund(t1, 1, late), 0);
        assert_eq!(w.used(late), 0);
    }

    #[test]
    fn charges_at_a_place_are_cut_to_the_limit_and_leave_with_the_send() {
        let t0 = Instant::now();
        let mut w = window(10, 60);
        w.record(2, t0);
        let t1 = t0 + Duration::from_secs(30);
        w.record(2, t1);
        assert_eq!(w.charge_at(t0, 50, t1), 6);
        assert_eq!(w.used(t1), 10);
        assert_eq!(w.charge_at(t1, 1, t1), 0);
        // The 8 units at 0 s leave at 60 s.
        assert_eq!(w.ready_at(8, t1), t0 + Duration::from_secs(60));
        let t2 = t0 + Duration::from_secs(60);
        assert_eq!(w.used(t2), 2);
        // A send that has left the window takes nothing more.
        assert_eq!(w.charge_at(t0, 3, t2), 0);
        // A place with no entry (its send merged away or refunded) gets one, in order.
        let t3 = t0 + Duration::from_secs(45);
        assert_eq!(w.charge_at(t3, 3, t2), 3);
        assert_eq!(w.ready_at(8, t2), t3 + Duration::from_secs(60));
    }

    #[test]
    fn a_window_added_mid_run_counts_the_sends_still_in_it() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let now = t0 + s(15);
        // Out of order, two at one instant, one already out of a 10 s window, one not yet made.
        let sent = [t0 + s(8), t0 + s(2), t0 + s(8), t0 + s(6), t0 + s(20)];
        let q = quota(4, s(10), Duration::ZERO);
        let mut w = SlidingWindow::counting(&q, &sent, now);
        assert_eq!(w.used(now), 3);
        // One more fits; the next when the send at 6 s leaves, the next two when those at 8 s do.
        assert_eq!(w.ready_at(1, now), now);
        assert_eq!(w.ready_at(2, now), t0 + s(16));
        assert_eq!(w.ready_at(3, now), t0 + s(18));
        // A token window cannot count requests as tokens: it starts empty.
        let tokens = SlidingWindow::counting(&q.with_unit(Unit::Tokens), &sent, now);
        assert_eq!(tokens.used, 0);
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
