//! One live scope: its store state, its waiter queue, its counters, and admission into it.

use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{sleep_until, Instant};

use super::queue::{Blocked, Cause, Place, WaitQueue};
use super::Refused;
use crate::charge::{Charge, Settle};
use crate::error::ThrottleError;
use crate::extensions::{Priority, Waits};
use crate::observe::{Observer, ScopeObserver};
use crate::store::{Admission, LeaseId, Limits, ScopeId, Settlement, Store, StoreError};
use crate::sync::lock;

/// Counters of one scope, or of the whole throttle.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) in_flight: AtomicUsize,
    pub(crate) queued: AtomicUsize,
    pub(crate) sent: AtomicU64,
    pub(crate) responses_429: AtomicU64,
    pub(crate) retries: AtomicU64,
    pub(crate) budget_exhausted: AtomicU64,
}

/// Adds 1 to (or takes 1 from) a counter of the scope and the same counter of the throttle.
macro_rules! count {
    ($slot:expr, $field:ident, $op:ident) => {{
        $slot.counters.$field.$op(1, Ordering::Relaxed);
        $slot.total.$field.$op(1, Ordering::Relaxed);
    }};
}
pub(crate) use count;

/// One live scope.
#[derive(Debug)]
pub(crate) struct Slot<S: Store> {
    pub(crate) label: Arc<str>,
    pub(crate) observe: ScopeObserver,
    state: S::Scope,
    store: Arc<S>,
    queue: Mutex<WaitQueue>,
    pub(crate) counters: Counters,
    pub(crate) total: Arc<Counters>,
    /// The in-flight cap now (`usize::MAX`: none), for the stats.
    max_in_flight: AtomicUsize,
    /// The largest cost every quota can admit now (`u32::MAX`: no quota), checked before a
    /// caller queues: a cost above it fails at once.
    capacity: AtomicU32,
    /// Nanoseconds from `origin` to the last lookup, for idle eviction.
    last_used: AtomicU64,
    origin: Instant,
    /// What the scope learned from its answers, and its circuit breaker.
    pub(crate) learner: Mutex<crate::learn::ScopeLearner>,
}

/// What a new slot is made of.
#[derive(Debug)]
pub(crate) struct SlotConfig<S> {
    pub(crate) store: Arc<S>,
    pub(crate) limits: Limits,
    pub(crate) aging: Duration,
    pub(crate) total: Arc<Counters>,
    pub(crate) origin: Instant,
    pub(crate) learn: Arc<crate::learn::LearnConfig>,
    pub(crate) observer: Arc<Observer>,
    /// The names the user gave scopes, by id.
    pub(crate) names: HashMap<ScopeId, Arc<str>>,
}

impl<S: Store> SlotConfig<S> {
    pub(crate) fn open(&self, id: ScopeId, label: String) -> Slot<S> {
        // A warm start's limits apply from the first request.
        let learner = self.learn.scope(&label, &self.limits);
        let limits = learner.limits();
        let in_force = learner.in_force();
        let label: Arc<str> = label.into();
        let name = self.names.get(&id).cloned();
        let slot = Slot {
            observe: self.observer.scope(label.clone(), name),
            label,
            state: self.store.open(id, &limits),
            store: self.store.clone(),
            queue: Mutex::new(WaitQueue::new(self.aging)),
            counters: Counters::default(),
            total: self.total.clone(),
            max_in_flight: AtomicUsize::new(limits.max_in_flight.unwrap_or(usize::MAX)),
            capacity: AtomicU32::new(limits.capacity().unwrap_or(u32::MAX)),
            last_used: AtomicU64::new(0),
            origin: self.origin,
            learner: Mutex::new(learner),
        };
        slot.observe.limits_at_start(in_force);
        slot.touch(Instant::now());
        slot
    }
}

/// Releases a lease: what a [`Lease`] needs of its slot, whatever the store.
trait Release: Settle + std::fmt::Debug {
    fn release(&self, lease: LeaseId);

    /// Whether the scope caps requests in flight, so that the lease must last until the
    /// response body ends.
    fn has_cap(&self) -> bool;
}

/// A request's lease on an in-flight slot of its scope. Dropping it releases the slot and
/// wakes the scope's next waiter.
#[derive(Debug)]
#[must_use = "dropping the lease ends the request's time in flight at once"]
pub(crate) struct Lease {
    slot: Arc<dyn Release>,
    id: LeaseId,
    cost: u32,
}

impl Lease {
    /// The charge this lease's admission made, to settle later (it outlives the lease).
    pub(crate) fn charge(&self) -> Charge {
        let scope: Arc<dyn Settle> = self.slot.clone();
        Charge::new(scope, self.id, self.cost)
    }

    /// Whether this lease must ride on the response body until it ends: only when its scope
    /// caps requests in flight (nothing else waits for the body's end).
    pub(crate) fn rides_on_body(&self) -> bool {
        self.slot.has_cap()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.slot.release(self.id);
    }
}

impl<S: Store> Settle for Slot<S> {
    fn settle(
        &self,
        lease: LeaseId,
        settlement: Settlement,
    ) -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + '_>> {
        Box::pin(self.store.settle(&self.state, lease, settlement))
    }
}

impl<S: Store> Release for Slot<S> {
    fn release(&self, lease: LeaseId) {
        self.store.release(&self.state, lease);
        count!(self, in_flight, fetch_sub);
        self.observe.released(self.in_flight(), self.cap());
        lock(&self.queue).wake_head(Instant::now());
    }

    fn has_cap(&self) -> bool {
        self.max_in_flight.load(Ordering::Relaxed) != usize::MAX
    }
}

/// A waiter's place in the queue while it exists.
struct Ticket<'a, S: Store> {
    slot: &'a Slot<S>,
    place: Place,
}

impl<'a, S: Store> Ticket<'a, S> {
    fn new(slot: &'a Slot<S>, priority: Priority, cost: u32) -> Self {
        let place = lock(&slot.queue).push(priority, cost, Instant::now());
        count!(slot, queued, fetch_add);
        slot.observe.queued(true);
        Self { slot, place }
    }

    /// Until this waiter is the head of the queue.
    async fn head(&self) {
        poll_fn(|cx| lock(&self.slot.queue).poll_head(self.place, Instant::now(), cx)).await
    }

    /// Until this waiter is told that something changed.
    async fn woken(&self) {
        poll_fn(|cx| lock(&self.slot.queue).poll_woken(self.place, cx)).await
    }
}

impl<S: Store> Drop for Ticket<'_, S> {
    fn drop(&mut self) {
        lock(&self.slot.queue).remove(self.place, Instant::now());
        count!(self.slot, queued, fetch_sub);
        self.slot.observe.queued(false);
    }
}

impl<S: Store> Slot<S> {
    /// Marks the scope used at `now`.
    pub(crate) fn touch(&self, now: Instant) {
        let nanos = now.saturating_duration_since(self.origin).as_nanos();
        self.last_used
            .store(u64::try_from(nanos).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// When the scope was last used.
    pub(crate) fn last_used(&self) -> Instant {
        self.origin + Duration::from_nanos(self.last_used.load(Ordering::Relaxed))
    }

    /// Whether forgetting the scope changes nothing: no waiter, and the store's state is a
    /// fresh one's (callers also check that nobody else holds the slot).
    pub(crate) fn is_idle(&self) -> bool {
        lock(&self.queue).is_empty() && self.store.is_idle(&self.state)
    }

    /// In-flight slots free now, or `None` with no cap.
    pub(crate) fn available_permits(&self) -> Option<usize> {
        let cap = self.cap();
        (cap != usize::MAX).then(|| cap.saturating_sub(self.in_flight()))
    }

    /// The in-flight cap now (`usize::MAX`: none).
    fn cap(&self) -> usize {
        self.max_in_flight.load(Ordering::Relaxed)
    }

    /// Requests of the scope in flight now.
    fn in_flight(&self) -> usize {
        self.counters.in_flight.load(Ordering::Relaxed)
    }

    /// Closes the scope's cooldown for `wait` from now. A store that cannot be reached leaves
    /// it open (the server's own refusals still pace the scope).
    pub(crate) async fn close_cooldown(&self, wait: Duration) {
        match self.store.close_cooldown(&self.state, wait).await {
            Ok(()) => self.observe.cooldown_closed(wait),
            Err(e) => tracing::warn!(scope = %self.label, error = %e, "cooldown not shared"),
        }
    }

    /// Takes new limits; sliding windows they add count the sends made at `sent` (see
    /// [`Store::set_limits_counting`]). Leases held stay held; waiters try again at once.
    /// (Driven by the learned limits.)
    pub(crate) async fn set_limits(
        &self,
        limits: &Limits,
        sent: &[Instant],
    ) -> Result<(), Refused> {
        self.store
            .set_limits_counting(&self.state, limits, sent)
            .await
            .map_err(Refused::Store)?;
        let cap = limits.max_in_flight.unwrap_or(usize::MAX);
        self.max_in_flight.store(cap, Ordering::Relaxed);
        let capacity = limits.capacity().unwrap_or(u32::MAX);
        self.capacity.store(capacity, Ordering::Relaxed);
        lock(&self.queue).limits_changed(Instant::now());
        Ok(())
    }

    /// Waits until a request of `cost` units and `priority` may be sent in this scope: the
    /// cooldown is open, an in-flight slot is leased, and every quota has admitted it. The time
    /// waited is added to `waits`, by cause.
    ///
    /// A request of cost 0 that arrives while the head of the queue waits on a quota goes at
    /// once (the quota does not concern it). A request whose deadline comes before the
    /// cooldown or quota the head waits on opens is refused at once.
    ///
    /// # Errors
    /// [`Refused::Cost`] when `cost` is more than a quota can ever admit;
    /// [`Refused::Deadline`] as soon as admission is known to come after `deadline`, or at
    /// `deadline`; [`Refused::Store`] when the store cannot answer.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call leaves the queue at once and has charged nothing.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        cost: u32,
        priority: Priority,
        deadline: Option<Instant>,
        waits: &mut Waits,
    ) -> Result<Lease, Refused> {
        // A cost no quota can ever admit fails before queueing: the store refuses it and names
        // the quota (or admits it, if the limits grew meanwhile).
        if cost > self.capacity.load(Ordering::Relaxed) {
            if let Ok(lease) = self.try_once(cost, deadline).await? {
                return Ok(lease);
            }
        }
        let mut clock = WaitClock::new(waits);
        let admission = self.admit_inner(cost, priority, deadline, &mut clock);
        let admitted = match deadline {
            Some(d) => tokio::time::timeout_at(d, admission)
                .await
                .unwrap_or(Err(Refused::Deadline { would_wait: None })),
            None => admission.await,
        };
        clock.stop();
        admitted
    }

    async fn admit_inner(
        self: &Arc<Self>,
        cost: u32,
        priority: Priority,
        deadline: Option<Instant>,
        clock: &mut WaitClock<'_>,
    ) -> Result<Lease, Refused> {
        let (ahead, past_the_head) = {
            let queue = lock(&self.queue);
            // Read the clock only when someone waits: not on the hot path.
            let ahead = (!queue.is_empty())
                .then(|| queue.blocked(cost, Instant::now()))
                .flatten();
            // A quota does not concern a request of cost 0: it may go past a head that waits
            // on one.
            (ahead, cost == 0 && queue.head_waits_on_quota())
        };
        if ahead.is_none() || past_the_head {
            // Nobody waiting (or only a head whose quota does not concern cost 0): try at
            // once, without a place in the queue.
            if let Ok(lease) = self.try_once(cost, deadline).await? {
                return Ok(lease);
            }
        } else if let Some(Blocked::Cooldown(d) | Blocked::Quota(d)) = ahead {
            // Nothing of this cost goes before the head's cooldown or quota opens: a deadline
            // before that is told at once.
            ready_by(Instant::now(), d, deadline)?;
        }
        // Queued, then tried again as the head: a slot released between the try above and
        // the queueing woke nobody, and must not be missed.
        clock.start();
        let ticket = Ticket::new(self, priority, cost);
        loop {
            clock.now_waiting(Cause::Queue);
            ticket.head().await;
            let blocked = match self.try_once(cost, deadline).await? {
                Ok(lease) => return Ok(lease),
                Err(blocked) => blocked,
            };
            let now = Instant::now();
            let next_aging = {
                let mut queue = lock(&self.queue);
                queue.set_blocked(ticket.place, blocked, cost, now);
                queue.next_aging(ticket.place, now)
            };
            clock.now_waiting(blocked.cause());
            match blocked {
                Blocked::Cooldown(d) | Blocked::Quota(d) => {
                    let ready = ready_by(now, d, deadline)?;
                    // Woken too when another waiter reaches the aging bound: it may be the
                    // head then, and goes if its cost fits sooner.
                    let until = next_aging.map_or(ready, |aged| aged.min(ready));
                    tokio::select! {
                        () = sleep_until(until) => {}
                        () = ticket.woken() => {}
                    }
                }
                Blocked::InFlight | Blocked::Queue => match self.store.in_flight_poll() {
                    Some(poll) => {
                        tokio::select! {
                            () = tokio::time::sleep(poll) => {}
                            () = ticket.woken() => {}
                            () = self.store.released_elsewhere(&self.state) => {}
                        }
                    }
                    None => ticket.woken().await,
                },
            }
        }
    }

    /// One try at the store: the lease, or what holds it back. A caller whose deadline has
    /// come is refused first: admitted at its deadline it could not be sent by it, and the
    /// quotas would be charged for nothing.
    async fn try_once(
        self: &Arc<Self>,
        cost: u32,
        deadline: Option<Instant>,
    ) -> Result<Result<Lease, Blocked>, Refused> {
        if deadline.is_some_and(|d| d <= Instant::now()) {
            return Err(Refused::Deadline { would_wait: None });
        }
        let admission = self
            .store
            .admit(&self.state, cost)
            .await
            .map_err(Refused::Store)?;
        Ok(match admission {
            Admission::Admitted(id) => {
                count!(self, in_flight, fetch_add);
                count!(self, sent, fetch_add);
                let usage = || self.store.usage(&self.state);
                self.observe.admitted(self.in_flight(), self.cap(), usage);
                let slot: Arc<dyn Release> = self.clone();
                Ok(Lease { slot, id, cost })
            }
            Admission::CoolingDown(d) => Err(Blocked::Cooldown(d)),
            Admission::NotBefore(d) => Err(Blocked::Quota(d)),
            Admission::InFlightFull => Err(Blocked::InFlight),
            Admission::CostTooLarge { capacity, quota } => {
                return Err(Refused::Cost(ThrottleError::CostExceedsQuota {
                    cost,
                    capacity,
                    quota,
                }))
            }
        })
    }
}

/// The instant `d` after `now`, or [`Refused::Deadline`] if it is not before `deadline`: a
/// request admitted at its deadline could not be sent by it.
fn ready_by(now: Instant, d: Duration, deadline: Option<Instant>) -> Result<Instant, Refused> {
    let ready = crate::clock::instant_after(now, d);
    if deadline.is_some_and(|dl| ready >= dl) {
        return Err(Refused::Deadline {
            would_wait: Some(d),
        });
    }
    Ok(ready)
}

/// Adds the time between its marks to a [`Waits`], to the cause in force. Reads the clock
/// only once started: a caller admitted at once never does.
struct WaitClock<'a> {
    waits: &'a mut Waits,
    /// When the open span began, once the caller has started to wait.
    since: Option<Instant>,
    cause: Cause,
}

impl<'a> WaitClock<'a> {
    fn new(waits: &'a mut Waits) -> Self {
        Self {
            waits,
            since: None,
            cause: Cause::Queue,
        }
    }

    /// The caller starts to wait now.
    fn start(&mut self) {
        self.since = Some(Instant::now());
    }

    /// Closes the span so far under the cause in force, and opens one under `cause`.
    fn now_waiting(&mut self, cause: Cause) {
        let Some(since) = self.since else {
            return;
        };
        let now = Instant::now();
        let span = now.saturating_duration_since(since);
        let total = match self.cause {
            Cause::Queue => &mut self.waits.queue,
            Cause::Cooldown => &mut self.waits.cooldown,
            Cause::Quota => &mut self.waits.quota,
            Cause::InFlight => &mut self.waits.in_flight,
        };
        *total += span;
        self.since = Some(now);
        self.cause = cause;
    }

    fn stop(mut self) {
        self.now_waiting(Cause::Queue);
    }
}
