//! A retry budget shared by every caller: retries of failures may add at most a set share of
//! load.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// How many retries of failures a throttle may make, relative to its requests (after
/// Finagle's `RetryBudget`): over the last `window`, retries may number at most
/// `ratio × requests + min_per_second × window (in seconds)`. The floor lets a quiet client
/// still retry; the ratio keeps a busy one from multiplying its load when the server fails.
///
/// Only retries of requests that may have run (5xx answers, broken connections) draw on it.
/// Retries of refusals (429, 409 `idempotency_in_progress`) do not: the request never ran, and
/// the server's own wait, the shared cooldown and `max_retries` bound them.
///
/// # Default
/// `ratio` 0.2 (20 % extra load), `min_per_second` 10, `window` 10 s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryBudget {
    /// Retries allowed per request sent, e.g. 0.2 for 20 %. Finite and at least 0.
    pub ratio: f64,
    /// Retries per second allowed whatever the request count.
    pub min_per_second: u32,
    /// The window over which requests and retries are counted. Not zero.
    pub window: Duration,
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self {
            ratio: 0.2,
            min_per_second: 10,
            window: Duration::from_secs(10),
        }
    }
}

/// Slices a budget window is counted in.
const SLICES: u32 = 10;

/// Requests and retries counted in one slice of the window.
#[derive(Debug, Clone, Copy)]
struct Slice {
    index: u64,
    requests: u64,
    retries: u64,
}

/// The running account of a [`RetryBudget`]: requests and retries in the last window, counted
/// in ten slices (so the window slides in steps of a tenth).
#[derive(Debug)]
pub(crate) struct BudgetLedger {
    budget: RetryBudget,
    origin: Instant,
    slice: Duration,
    slices: VecDeque<Slice>,
}

impl BudgetLedger {
    /// An empty account of `budget`, counting from `origin`.
    pub(crate) fn new(budget: RetryBudget, origin: Instant) -> Self {
        let slice = (budget.window / SLICES).max(Duration::from_millis(1));
        Self {
            budget,
            origin,
            slice,
            slices: VecDeque::with_capacity(SLICES as usize + 1),
        }
    }

    fn current(&mut self, now: Instant) -> &mut Slice {
        let index =
            (now.saturating_duration_since(self.origin).as_nanos() / self.slice.as_nanos()) as u64;
        // A caller that read the clock before another one locked the ledger counts in the
        // newest slice, so slices stay in order and leave the window in order.
        let index = index.max(self.slices.back().map_or(0, |s| s.index));
        while self
            .slices
            .front()
            .is_some_and(|s| s.index + u64::from(SLICES) <= index)
        {
            self.slices.pop_front();
        }
        if self.slices.back().is_none_or(|s| s.index != index) {
            self.slices.push_back(Slice {
                index,
                requests: 0,
                retries: 0,
            });
        }
        self.slices.back_mut().expect("a slice was just pushed")
    }

    /// Counts one request (a first attempt) at `now`.
    pub(crate) fn record_request(&mut self, now: Instant) {
        self.current(now).requests += 1;
    }

    /// Whether the budget has room for one more retry at `now`.
    pub(crate) fn has_room(&mut self, now: Instant) -> bool {
        self.current(now);
        let (requests, retries) = self
            .slices
            .iter()
            .fold((0, 0), |(q, r), s| (q + s.requests, r + s.retries));
        let floor = f64::from(self.budget.min_per_second) * self.budget.window.as_secs_f64();
        let allowed = (requests as f64 * self.budget.ratio + floor).floor();
        (retries as f64) < allowed
    }

    /// Counts one retry at `now` (call after [`has_room`](Self::has_room), under one lock).
    pub(crate) fn spend(&mut self, now: Instant) {
        self.current(now).retries += 1;
    }

    /// Takes one retry from the budget at `now` if it has room, and says whether it had.
    #[cfg(test)]
    pub(crate) fn try_retry(&mut self, now: Instant) -> bool {
        let room = self.has_room(now);
        if room {
            self.spend(now);
        }
        room
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(ratio: f64, min_per_second: u32) -> (BudgetLedger, Instant) {
        let t0 = Instant::now();
        let budget = RetryBudget {
            ratio,
            min_per_second,
            window: Duration::from_secs(10),
        };
        (BudgetLedger::new(budget, t0), t0)
    }

    fn retries_allowed(l: &mut BudgetLedger, now: Instant) -> usize {
        (0..10_000).take_while(|_| l.try_retry(now)).count()
    }

    #[test]
    fn ratio_of_requests_plus_floor() {
        let (mut l, t0) = ledger(0.2, 1);
        for _ in 0..100 {
            l.record_request(t0);
        }
        // 20 % of 100, plus 1 per second over 10 s.
        assert_eq!(retries_allowed(&mut l, t0), 30);
    }

    #[test]
    fn the_floor_alone_without_requests() {
        let (mut l, t0) = ledger(0.2, 0);
        assert_eq!(retries_allowed(&mut l, t0), 0);
        let (mut l, t0) = ledger(0.0, 3);
        assert_eq!(retries_allowed(&mut l, t0), 30);
    }

    #[test]
    fn old_requests_and_retries_leave_the_window() {
        let (mut l, t0) = ledger(1.0, 0);
        for _ in 0..5 {
            l.record_request(t0);
        }
        assert_eq!(retries_allowed(&mut l, t0 + Duration::from_secs(9)), 5);
        // At 10 s the requests of slice 0 are gone; the retries of slice 9 are still counted.
        let t10 = t0 + Duration::from_secs(10);
        l.record_request(t10);
        assert_eq!(retries_allowed(&mut l, t10), 0);
        // At 19 s the retries have left too.
        let t19 = t0 + Duration::from_secs(19);
        assert_eq!(retries_allowed(&mut l, t19), 1);
    }

    #[test]
    fn a_late_caller_with_an_earlier_reading_counts_in_the_newest_slice() {
        let (mut l, t0) = ledger(1.0, 0);
        l.record_request(t0 + Duration::from_millis(1000));
        l.record_request(t0 + Duration::from_millis(999));
        // One slice (index 1), so both requests leave the window together, in order.
        let indexes: Vec<_> = l.slices.iter().map(|s| (s.index, s.requests)).collect();
        assert_eq!(indexes, vec![(1, 2)]);
        assert_eq!(
            retries_allowed(&mut l, t0 + Duration::from_millis(10_500)),
            2
        );
        assert_eq!(
            retries_allowed(&mut l, t0 + Duration::from_millis(21_000)),
            0
        );
    }
}
