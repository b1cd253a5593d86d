//! [`Throttle`]: the shared handle, and its [`Stats`].

use std::fmt;
use std::time::Duration;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use tokio::time::Instant;

use http::HeaderName;
use rand::rngs::SmallRng;
use rand::SeedableRng;

use crate::builder::ThrottleBuilder;
use crate::charge::{UsageFromBody, UsageFromHeaders};
use crate::engine::{Counters, Engine, EngineConfig, Lease, Refused, Slot};
use crate::error::ThrottleError;
use crate::extensions::{Priority, Waits};
use crate::observe::Event;
use crate::policy::{BudgetLedger, RetryBudget, RetryPolicy};
use crate::store::Backend;

/// A rate limiter for one API client, as `reqwest-middleware` middleware.
///
/// Cloning is cheap (an `Arc`): clones share every scope, quota, permit, cooldown and
/// counter, so one `Throttle` cloned into many clients or tasks keeps all of them, together,
/// inside the limits. See the [crate docs](crate) for the path of a request.
#[derive(Clone)]
pub struct Throttle {
    pub(crate) inner: Arc<Inner>,
}

/// The store of every throttle: memory, or a shared store.
pub(crate) type DefaultStore = Backend;

pub(crate) struct Inner {
    pub(crate) engine: Engine<DefaultStore>,
    pub(crate) policy: RetryPolicy,
    pub(crate) rng: Mutex<SmallRng>,
    pub(crate) key_header: Option<HeaderName>,
    pub(crate) deadline: Option<Duration>,
    pub(crate) budget: Option<Mutex<BudgetLedger>>,
    pub(crate) usage_from_headers: Option<UsageFromHeaders>,
    pub(crate) usage_from_body: Option<UsageFromBody>,
}

/// The settings of a throttle beside its engine.
pub(crate) struct Settings {
    pub(crate) policy: RetryPolicy,
    pub(crate) seed: Option<u64>,
    pub(crate) key_header: Option<HeaderName>,
    pub(crate) deadline: Option<Duration>,
    pub(crate) budget: Option<RetryBudget>,
    pub(crate) usage_from_headers: Option<UsageFromHeaders>,
    pub(crate) usage_from_body: Option<UsageFromBody>,
}

/// The right to have one unit of work in flight, from [`Throttle::acquire`]. Dropping it ends
/// the work: the in-flight slot goes to the next waiter.
#[derive(Debug)]
#[must_use = "dropping the permit ends the work's time in flight at once"]
pub struct Permit {
    _lease: Lease,
}

/// A snapshot of a throttle's counters, from [`Throttle::stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Stats {
    /// Requests sent and not yet finished: until the response body has been read to the end or
    /// dropped (in a scope without an in-flight cap, until the response head arrives).
    pub in_flight: usize,
    /// Callers waiting to be admitted (cooldown, permit or quota).
    pub queued: usize,
    /// Attempts sent, retries included.
    pub sent: u64,
    /// Responses with status 429 received.
    pub responses_429: u64,
    /// Retries made (attempts after a request's first).
    pub retries: u64,
    /// Retries not made because the retry budget was spent.
    pub budget_exhausted: u64,
    /// In-flight slots free now in the live scopes, summed (before the first request, the cap
    /// a scope starts with), or `None` with no in-flight cap.
    pub available_permits: Option<usize>,
    /// Keyed scopes alive now (the unkeyed scope, used by [`Scope::global`](crate::Scope::global)
    /// and [`Throttle::acquire`], and the overflow scope not counted).
    pub scopes: usize,
    /// Calls to a shared store (Redis) that failed or timed out; 0 for the in-memory store.
    pub store_errors: u64,
    /// Live scopes whose circuit is not closed (open, or half-open).
    pub circuits_open: usize,
}

/// A snapshot of one scope's counters, from [`Throttle::scope_stats`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ScopeStats {
    /// The scope's label: `scheme://host:port` for an authority, `name=#` and 16 hex digits
    /// of the value's hash for a header (never the value), the key of a
    /// [`Scope::from_fn`](crate::Scope::from_fn) scope, `(unkeyed)` or `(overflow)`.
    pub label: String,
    /// Requests of this scope sent and not yet finished.
    pub in_flight: usize,
    /// Callers of this scope waiting to be admitted.
    pub queued: usize,
    /// Attempts sent in this scope, retries included.
    pub sent: u64,
    /// Responses with status 429 received in this scope.
    pub responses_429: u64,
    /// Retries made in this scope.
    pub retries: u64,
    /// In-flight slots free now, or `None` with no in-flight cap.
    pub available_permits: Option<usize>,
    /// The scope's circuit breaker.
    pub circuit: crate::learn::CircuitState,
}

fn read(c: &Counters) -> (usize, usize, u64, u64, u64, u64) {
    (
        c.in_flight.load(Ordering::Relaxed),
        c.queued.load(Ordering::Relaxed),
        c.sent.load(Ordering::Relaxed),
        c.responses_429.load(Ordering::Relaxed),
        c.retries.load(Ordering::Relaxed),
        c.budget_exhausted.load(Ordering::Relaxed),
    )
}

impl Throttle {
    /// A builder with the documented defaults.
    pub fn builder() -> ThrottleBuilder {
        ThrottleBuilder::new()
    }

    pub(crate) fn new(engine: EngineConfig<DefaultStore>, settings: Settings) -> Self {
        let rng = match settings.seed {
            Some(seed) => SmallRng::seed_from_u64(seed),
            None => SmallRng::from_rng(&mut rand::rng()),
        };
        let budget = settings.budget;
        Self {
            inner: Arc::new(Inner {
                engine: Engine::new(engine),
                policy: settings.policy,
                rng: Mutex::new(rng),
                key_header: settings.key_header,
                deadline: settings.deadline,
                budget: budget.map(|b| Mutex::new(BudgetLedger::new(b, Instant::now()))),
                usage_from_headers: settings.usage_from_headers,
                usage_from_body: settings.usage_from_body,
            }),
        }
    }

    /// The counters now, summed over every scope. Takes the scope map's lock once, to sum the
    /// free in-flight slots.
    pub fn stats(&self) -> Stats {
        let engine = &self.inner.engine;
        let (in_flight, queued, sent, responses_429, retries, budget_exhausted) =
            read(engine.total());
        let mut available_permits = None;
        let mut live = 0;
        let mut circuits_open = 0;
        engine.each_scope(|slot| {
            live += 1;
            circuits_open += usize::from(slot.circuit() != crate::learn::CircuitState::Closed);
            if let Some(free) = slot.available_permits() {
                *available_permits.get_or_insert(0) += free;
            }
        });
        if live == 0 {
            // No scope yet: what the first one will have.
            available_permits = engine.max_in_flight();
        }
        Stats {
            in_flight,
            queued,
            sent,
            responses_429,
            retries,
            budget_exhausted,
            available_permits,
            scopes: engine.keyed_scopes(),
            store_errors: engine.store().errors(),
            circuits_open,
        }
    }

    /// The counters of every live scope, in no particular order.
    pub fn scope_stats(&self) -> Vec<ScopeStats> {
        let mut all = Vec::new();
        self.inner.engine.each_scope(|slot| {
            let (in_flight, queued, sent, responses_429, retries, _) = read(&slot.counters);
            all.push(ScopeStats {
                label: slot.label.to_string(),
                in_flight,
                queued,
                sent,
                responses_429,
                retries,
                available_permits: slot.available_permits(),
                circuit: slot.circuit(),
            });
        });
        all
    }

    /// Waits until one unit of work of `cost` quota units may start, exactly as a request sent
    /// through the middleware would (cooldown, in-flight slot, quotas), and returns its
    /// [`Permit`]. Use it to pace work that is not a `reqwest` request; the work counts as in
    /// flight until the permit is dropped. The work is admitted in the unkeyed scope (the only
    /// scope of [`Scope::global`](crate::Scope::global)), at [`Priority::Normal`]: under a keyed
    /// scope (the default is per authority) it does not share the limits of requests; use
    /// [`acquire_for`](Self::acquire_for) for that.
    ///
    /// # Errors
    /// [`ThrottleError::CostExceedsQuota`] at once when `cost` is more than a quota can admit.
    ///
    /// # Cancel safety
    /// A dropped call holds nothing and has charged nothing: quotas are charged all or
    /// nothing, at the moment of admission.
    pub async fn acquire(&self, cost: u32) -> Result<Permit, ThrottleError> {
        self.acquire_with_priority(cost, Priority::Normal).await
    }

    /// [`acquire`](Self::acquire) in the scope `request` would be sent in, at `priority`: for
    /// work that must share the limits of requests to an API under a keyed
    /// [`Scope`](crate::Scope) (per authority, per header), which [`acquire`](Self::acquire)
    /// does not. `request` is only read (its URL and headers), never sent.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_for(
        &self,
        request: &reqwest::Request,
        cost: u32,
        priority: Priority,
    ) -> Result<Permit, ThrottleError> {
        permit_in(&self.inner.engine.scope_of(request), cost, priority).await
    }

    /// [`acquire`](Self::acquire) at `priority`.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_with_priority(
        &self,
        cost: u32,
        priority: Priority,
    ) -> Result<Permit, ThrottleError> {
        permit_in(self.inner.engine.unkeyed(), cost, priority).await
    }

    /// What the throttle has learned of the limits of scope `label` (as in
    /// [`ScopeStats::label`]: `http://127.0.0.1:8080` for an authority), or `None` when no
    /// live scope has that label. See [`ThrottleBuilder::learn_limits`](crate::ThrottleBuilder::learn_limits).
    pub fn learned(&self, label: &str) -> Option<crate::learn::LearnedLimits> {
        let mut found = None;
        self.inner.engine.each_scope(|slot| {
            if found.is_none() && &*slot.label == label {
                found = Some(slot.learned());
            }
        });
        found
    }

    /// What the throttle has learned of every live scope, in no particular order: to save
    /// (with the `serde` feature) and [`load`](Self::load_learned) into the next run's throttle.
    pub fn learned_all(&self) -> Vec<crate::learn::LearnedLimits> {
        let mut all = Vec::new();
        self.inner
            .engine
            .each_scope(|slot| all.push(slot.learned()));
        all
    }

    /// Starts scopes warm: a scope opened from now on whose label matches one of `limits` starts
    /// with its rate, burst, window and in-flight cap (the cap never above the configured
    /// `max_in_flight`) instead of learning them from refusals. Scopes already alive keep what
    /// they have. Labels are stable across runs for [`Scope::per_authority`](crate::Scope::per_authority)
    /// and [`Scope::from_fn`](crate::Scope::from_fn) scopes; a [`Scope::per_header`](crate::Scope::per_header)
    /// label hashes with a key drawn per throttle, so it does not match in another run.
    /// Nothing is applied when learning is off.
    pub fn load_learned(&self, limits: impl IntoIterator<Item = crate::learn::LearnedLimits>) {
        self.inner.engine.learn_config().load(limits);
    }

    /// A receiver of the throttle's [`Event`]s from now on: cooldowns closed and reopened,
    /// attempts refused by the server, capacity warnings, circuits opened and closed, learned
    /// limits changed (see [`observe`](crate::observe)).
    ///
    /// Sending never waits for a receiver: one that falls more than
    /// [`event_buffer`](crate::ThrottleBuilder::event_buffer) events behind loses the oldest,
    /// and its next `recv` returns `Err(RecvError::Lagged(n))` with `n` the number missed.
    /// Drop the receiver when done; each receiver gets every event. No event is built before
    /// the first call.
    pub fn events(&self) -> tokio::sync::broadcast::Receiver<Event> {
        self.inner.engine.observer().subscribe()
    }

    /// The retry policy this throttle applies.
    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.inner.policy
    }
}

/// Admission in `slot` for work that is not a request.
async fn permit_in(
    slot: &Arc<Slot<DefaultStore>>,
    cost: u32,
    priority: Priority,
) -> Result<Permit, ThrottleError> {
    let admitted = slot
        .admit(cost, priority, None, &mut Waits::default())
        .await;
    let refused = |r: Refused| r.into_error(0, Duration::ZERO);
    admitted.map(|l| Permit { _lease: l }).map_err(refused)
}

impl fmt::Debug for Throttle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Throttle")
            .field("policy", &self.inner.policy)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

const _: fn() = || {
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<Throttle>();
};
