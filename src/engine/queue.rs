//! The waiter queue of one scope: priority lanes, first in first out within a lane, and aging.
//!
//! Only the head of the queue tries the store; the others sleep until they become the head.
//! The head is the front of the highest non-empty lane, unless a waiter at the front of some
//! lane has waited at least the aging bound: then the longest-waiting of those goes first, so a
//! low-priority request is never starved.

use std::collections::BTreeMap;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Instant;

use crate::extensions::Priority;

/// One waiter's place: its lane and its arrival number (global to the queue, so that arrival
/// order compares across lanes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Place {
    lane: usize,
    seq: u64,
}

#[derive(Debug)]
struct Waiter {
    since: Instant,
    /// The cost it asks for: a waiter of cost 0 may try past a head that waits on a quota.
    cost: u32,
    waker: Option<Waker>,
    /// Set when the waiter is told something changed (it became the head, a lease was
    /// released, a limit changed); cleared when it looks.
    woken: bool,
}

/// What holds a caller back, as the store answered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Blocked {
    /// Waiting behind other callers.
    Queue,
    /// The scope's cooldown, for this long more.
    Cooldown(Duration),
    /// A quota, for this long more.
    Quota(Duration),
    /// Every in-flight slot is taken.
    InFlight,
}

impl Blocked {
    pub(crate) fn cause(self) -> Cause {
        match self {
            Blocked::Queue => Cause::Queue,
            Blocked::Cooldown(_) => Cause::Cooldown,
            Blocked::Quota(_) => Cause::Quota,
            Blocked::InFlight => Cause::InFlight,
        }
    }
}

/// Why a caller waits, for the time it waited ([`Waits`](crate::Waits)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    Queue,
    Cooldown,
    Quota,
    InFlight,
}

/// What the head was last told holds it back, until when (for a cooldown or quota), and the
/// cost it asked for.
#[derive(Debug, Clone, Copy)]
struct HeadBlock {
    cause: Cause,
    until: Option<Instant>,
    cost: u32,
}

/// The waiters of one scope.
#[derive(Debug)]
pub(crate) struct WaitQueue {
    lanes: [BTreeMap<u64, Waiter>; Priority::LANES],
    next_seq: u64,
    aging: Duration,
    len: usize,
    head_block: Option<HeadBlock>,
    /// Waiters of cost 0 queued.
    free_of_quota: usize,
    /// The waiter that last found itself the head (it knows, and waits on the store).
    known_head: Option<Place>,
}

impl WaitQueue {
    pub(crate) fn new(aging: Duration) -> Self {
        Self {
            lanes: Default::default(),
            next_seq: 0,
            aging,
            len: 0,
            head_block: None,
            free_of_quota: 0,
            known_head: None,
        }
    }

    /// What holds a new arrival of `cost` back at `now`: `None` with nobody waiting; else
    /// what the head was last told when it holds the arrival too (a cooldown, or a quota when
    /// `cost` is at least the head's: a quota never fits more units sooner), with the time
    /// left; else [`Blocked::Queue`].
    pub(crate) fn blocked(&self, cost: u32, now: Instant) -> Option<Blocked> {
        if self.is_empty() {
            return None;
        }
        let left = |until: Option<Instant>| {
            until
                .filter(|&u| u > now)
                .map(|u| u.saturating_duration_since(now))
        };
        Some(match self.head_block {
            Some(HeadBlock {
                cause: Cause::Cooldown,
                until,
                ..
            }) => left(until).map_or(Blocked::Queue, Blocked::Cooldown),
            Some(HeadBlock {
                cause: Cause::Quota,
                until,
                cost: head_cost,
            }) if cost >= head_cost => left(until).map_or(Blocked::Queue, Blocked::Quota),
            Some(HeadBlock {
                cause: Cause::InFlight,
                ..
            }) => Blocked::InFlight,
            Some(_) | None => Blocked::Queue,
        })
    }

    /// Whether the head waits on a quota (which a request of cost 0 does not: it may go past).
    pub(crate) fn head_waits_on_quota(&self) -> bool {
        self.head_block.is_some_and(|b| b.cause == Cause::Quota)
    }

    /// Records what the waiter at `place`, asking for `cost`, was told holds it back, at
    /// `now`, if it is the head. When the head waits on a quota, the waiters of cost 0 (whom
    /// no quota concerns) are woken to try past it.
    pub(crate) fn set_blocked(&mut self, place: Place, blocked: Blocked, cost: u32, now: Instant) {
        if self.head(now) != Some(place) {
            return;
        }
        if matches!(blocked, Blocked::Quota(_)) && self.free_of_quota > 0 {
            let free: Vec<Place> = self
                .places()
                .filter(|&(p, w)| w.cost == 0 && p != place)
                .map(|(p, _)| p)
                .collect();
            for p in free {
                self.wake(p);
            }
        }
        let until = match blocked {
            Blocked::Cooldown(d) | Blocked::Quota(d) => Some(crate::clock::instant_after(now, d)),
            Blocked::Queue | Blocked::InFlight => None,
        };
        self.head_block = Some(HeadBlock {
            cause: blocked.cause(),
            until,
            cost,
        });
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Queues a waiter of `priority` arriving at `now`.
    pub(crate) fn push(&mut self, priority: Priority, cost: u32, now: Instant) -> Place {
        let place = Place {
            lane: priority.lane(),
            seq: self.next_seq,
        };
        self.next_seq += 1;
        self.len += 1;
        let waiter = Waiter {
            since: now,
            cost,
            waker: None,
            woken: false,
        };
        self.free_of_quota += usize::from(cost == 0);
        self.lanes[place.lane].insert(place.seq, waiter);
        place
    }

    /// Removes a waiter (admitted, or gone) and wakes whoever is the head now, which has yet
    /// to learn what holds it back.
    pub(crate) fn remove(&mut self, place: Place, now: Instant) {
        if let Some(waiter) = self.lanes[place.lane].remove(&place.seq) {
            self.len -= 1;
            self.free_of_quota -= usize::from(waiter.cost == 0);
        }
        self.head_block = None;
        self.wake_head(now);
    }

    /// Forgets what held the head back (limits changed) and wakes it.
    pub(crate) fn limits_changed(&mut self, now: Instant) {
        self.head_block = None;
        self.wake_head(now);
    }

    /// The waiter that goes next at `now`.
    pub(crate) fn head(&self, now: Instant) -> Option<Place> {
        let fronts = self.lanes.iter().enumerate().filter_map(|(lane, waiters)| {
            let (&seq, waiter) = waiters.first_key_value()?;
            Some((Place { lane, seq }, waiter.since))
        });
        let mut best: Option<Place> = None;
        let mut aged: Option<Place> = None;
        for (place, since) in fronts {
            if now.saturating_duration_since(since) >= self.aging
                && aged.is_none_or(|a| place.seq < a.seq)
            {
                aged = Some(place);
            }
            // Lanes are in ascending priority: the last non-empty one is the highest.
            best = Some(place);
        }
        aged.or(best)
    }

    /// Every waiter, with its place.
    fn places(&self) -> impl Iterator<Item = (Place, &Waiter)> {
        self.lanes.iter().enumerate().flat_map(|(lane, waiters)| {
            waiters
                .iter()
                .map(move |(&seq, w)| (Place { lane, seq }, w))
        })
    }

    /// The next instant, after `now`, at which a waiter other than `place` at the front of its
    /// lane reaches the aging bound (and may become the head).
    pub(crate) fn next_aging(&self, place: Place, now: Instant) -> Option<Instant> {
        self.lanes
            .iter()
            .enumerate()
            .filter_map(|(lane, waiters)| {
                let (&seq, w) = waiters.first_key_value()?;
                let aged = w.since.checked_add(self.aging)?;
                (Place { lane, seq } != place && aged > now).then_some(aged)
            })
            .min()
    }

    /// Tells the head that something changed, so that it tries again.
    pub(crate) fn wake_head(&mut self, now: Instant) {
        if let Some(head) = self.head(now) {
            self.wake(head);
        }
    }

    fn wake(&mut self, place: Place) {
        if let Some(waiter) = self.lanes[place.lane].get_mut(&place.seq) {
            waiter.woken = true;
            if let Some(waker) = waiter.waker.take() {
                waker.wake();
            }
        }
    }

    /// Ready when `place` is the head. Otherwise registers to be woken, and wakes the head
    /// unless it is the waiter that last found itself the head: another may be asleep without
    /// knowing it is the head now (it became so by aging or by arrival order changing under
    /// it). A head that knows waits on the store and is not woken: waiters polled in one task
    /// would wake each other without end.
    pub(crate) fn poll_head(
        &mut self,
        place: Place,
        now: Instant,
        cx: &mut Context<'_>,
    ) -> Poll<()> {
        let head = self.head(now);
        let Some(waiter) = self.lanes[place.lane].get_mut(&place.seq) else {
            // Not queued (cannot happen while its ticket lives): let it try.
            return Poll::Ready(());
        };
        waiter.woken = false;
        let past_the_head =
            waiter.cost == 0 && self.head_block.is_some_and(|b| b.cause == Cause::Quota);
        if head == Some(place) {
            self.known_head = Some(place);
            return Poll::Ready(());
        }
        if past_the_head {
            return Poll::Ready(());
        }
        register(waiter, cx);
        if let Some(head) = head.filter(|&h| self.known_head != Some(h)) {
            self.wake(head);
        }
        Poll::Pending
    }

    /// Ready once `place` has been woken since it last looked.
    pub(crate) fn poll_woken(&mut self, place: Place, cx: &mut Context<'_>) -> Poll<()> {
        let Some(waiter) = self.lanes[place.lane].get_mut(&place.seq) else {
            return Poll::Ready(());
        };
        if std::mem::take(&mut waiter.woken) {
            return Poll::Ready(());
        }
        register(waiter, cx);
        Poll::Pending
    }
}

fn register(waiter: &mut Waiter, cx: &mut Context<'_>) {
    match &mut waiter.waker {
        Some(w) if w.will_wake(cx.waker()) => {}
        slot => *slot = Some(cx.waker().clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGING: Duration = Duration::from_secs(30);

    #[test]
    fn higher_priority_first_then_arrival_order() {
        let t0 = Instant::now();
        let mut q = WaitQueue::new(AGING);
        let low = q.push(Priority::Low, 1, t0);
        let normal1 = q.push(Priority::Normal, 1, t0);
        let high = q.push(Priority::High, 1, t0);
        let normal2 = q.push(Priority::Normal, 1, t0);
        assert_eq!(q.len(), 4);
        let mut order = Vec::new();
        while let Some(head) = q.head(t0) {
            order.push(head);
            q.remove(head, t0);
        }
        assert_eq!(order, vec![high, normal1, normal2, low]);
        assert!(q.is_empty());
    }

    #[test]
    fn a_waiter_past_the_aging_bound_goes_first() {
        let t0 = Instant::now();
        let mut q = WaitQueue::new(AGING);
        let low = q.push(Priority::Low, 1, t0);
        let high = q.push(Priority::Critical, 1, t0 + Duration::from_secs(10));
        assert_eq!(q.head(t0 + Duration::from_secs(29)), Some(high));
        assert_eq!(q.head(t0 + AGING), Some(low));
        // Of several aged waiters, the one that arrived first.
        let normal = q.push(Priority::Normal, 1, t0 + Duration::from_secs(1));
        let at = t0 + Duration::from_secs(45);
        assert_eq!(q.head(at), Some(low));
        q.remove(low, at);
        assert_eq!(q.head(at), Some(high), "high arrived before normal");
        q.remove(high, at);
        assert_eq!(q.head(at), Some(normal));
    }

    #[test]
    fn removing_a_waiter_wakes_the_new_head() {
        let t0 = Instant::now();
        let mut q = WaitQueue::new(AGING);
        let first = q.push(Priority::Normal, 1, t0);
        let second = q.push(Priority::Normal, 1, t0);
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert_eq!(q.poll_head(second, t0, &mut cx), Poll::Pending);
        assert_eq!(q.poll_woken(second, &mut cx), Poll::Pending);
        q.remove(first, t0);
        assert_eq!(q.poll_woken(second, &mut cx), Poll::Ready(()));
        assert_eq!(q.poll_head(second, t0, &mut cx), Poll::Ready(()));
    }

    #[test]
    fn a_head_that_knows_is_not_woken_by_the_waiters_behind_it() {
        let t0 = Instant::now();
        let mut q = WaitQueue::new(AGING);
        let head = q.push(Priority::Normal, 1, t0);
        let behind = q.push(Priority::Normal, 1, t0);
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert_eq!(q.poll_head(head, t0, &mut cx), Poll::Ready(()));
        assert_eq!(q.poll_woken(head, &mut cx), Poll::Pending);
        // Polled in the same task as the head, the waiter behind must not wake it: each wake
        // would poll the waiter again.
        for _ in 0..3 {
            assert_eq!(q.poll_head(behind, t0, &mut cx), Poll::Pending);
            assert_eq!(q.poll_woken(head, &mut cx), Poll::Pending);
        }
    }

    #[test]
    fn a_waiter_that_is_not_the_head_wakes_the_head() {
        let t0 = Instant::now();
        let mut q = WaitQueue::new(AGING);
        let low = q.push(Priority::Low, 1, t0);
        let high = q.push(Priority::High, 1, t0);
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        // `high` sleeps as head; by aging `low` becomes the head while it sleeps.
        assert_eq!(q.poll_head(high, t0, &mut cx), Poll::Ready(()));
        assert_eq!(q.poll_woken(low, &mut cx), Poll::Pending);
        assert_eq!(q.poll_head(high, t0 + AGING, &mut cx), Poll::Pending);
        assert_eq!(q.poll_woken(low, &mut cx), Poll::Ready(()));
        assert_eq!(q.poll_head(low, t0 + AGING, &mut cx), Poll::Ready(()));
    }
}
