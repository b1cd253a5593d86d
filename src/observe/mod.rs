//! Seeing what a throttle does: metrics, tracing, and typed events.
//!
//! # Metrics (feature `metrics`)
//! Recorded through the [`metrics`](https://docs.rs/metrics) facade, to whichever exporter
//! (Prometheus, OpenTelemetry, ...) the application installs. Install the recorder before
//! building the throttle: a throttle registers its metrics once, with the recorder installed
//! when it is built (a named scope, when it is first used). Without the feature nothing is
//! recorded and nothing is paid: no code of it is on the request path.
//!
//! | name | kind | unit | labels | what |
//! |---|---|---|---|---|
//! | `reqwest_throttle_requests_total` | counter | requests | | calls entering the throttle |
//! | `reqwest_throttle_attempts_total` | counter | attempts | | attempts sent, retries included |
//! | `reqwest_throttle_answers_total` | counter | answers | `class`: `1xx` … `5xx`, `error` (transport error) | answers per attempt |
//! | `reqwest_throttle_responses_429_total` | counter | answers | | answers with status 429 |
//! | `reqwest_throttle_retries_total` | counter | attempts | | retries sent (attempts after a request's first) |
//! | `reqwest_throttle_stops_total` | counter | requests | `reason`: see below | calls whose last answer was kept rather than retried, or that the deadline ended, by [`StopReason`](crate::policy::StopReason) |
//! | `reqwest_throttle_in_flight` | gauge | requests | | requests sent and not finished (body read or dropped), and [`Permit`](crate::Permit)s held |
//! | `reqwest_throttle_queued` | gauge | callers | | callers waiting for admission ([`acquire`](crate::Throttle::acquire) included) |
//! | `reqwest_throttle_cooldown_closed` | gauge | scopes | | scopes whose shared cooldown is closed (0 or 1 for a named scope) |
//! | `reqwest_throttle_learned_rate` | gauge | requests per second | | the learned pace in force, as [`LearnedLimits::rate`](crate::LearnedLimits::rate) (0: none learned) |
//! | `reqwest_throttle_learned_max_in_flight` | gauge | requests | | the in-flight cap in force, as [`LearnedLimits::max_in_flight`](crate::LearnedLimits::max_in_flight): learned from parallel-limit refusals, at most the configured one (0: no cap) |
//! | `reqwest_throttle_circuit_state` | gauge | state | | the circuit breaker: 0 closed, 1 half-open (from the end of its open time until the probe's answer), 2 open |
//! | `reqwest_throttle_queue_seconds` | histogram | seconds | | per attempt, from asking for admission to being admitted (0 when at once) |
//! | `reqwest_throttle_answer_seconds` | histogram | seconds | | per attempt, from sending to the answer's head (an error body the throttle reads included) or the transport error |
//!
//! `reason` is one of `retries_exhausted`, `not_safe_to_resend`, `body_not_cloneable`,
//! `retry_disabled`, `deadline`, `retry_budget_exhausted`, `server_said_no_retry`,
//! `ran_before_redirect`, `wait_too_long`, `final`.
//!
//! The learned gauges of the series without a `scope` label sum the unnamed scopes; its
//! circuit state is the worst of theirs (2 if any is open). A scope dropped (evicted when
//! idle, or with its throttle) leaves the sums.
//!
//! **Labels are bounded.** A scope gets a `scope` label only when it is named with
//! [`ThrottleBuilder::name_scope`](crate::ThrottleBuilder::name_scope); every unnamed scope
//! (an authority, a hashed API key, ...) is recorded in the one series without a `scope`
//! label. No label ever holds a URL, a header value or any other value from a request.
//!
//! # Tracing
//! One span per call, `throttle_request` at `DEBUG` (made only when a subscriber may want
//! `DEBUG`), with fields `scope` (the scope's label,
//! never a header value), `name` (the scope's name, if named), `priority` and `cost`. Inside
//! it:
//!
//! | event | level | fields |
//! |---|---|---|
//! | `admitted` | `TRACE`, `DEBUG` when it waited | `attempt`, `waited` (this attempt's wait for admission) |
//! | `answer` | `DEBUG` | `attempt`, `status` or `error` |
//! | `shared cooldown closed` | `DEBUG` | `status`, `cooldown` |
//! | `retrying` | `DEBUG` | `attempt` (the one about to be made), `wait` |
//! | `not retried` | `DEBUG` | `attempts`, `reason` |
//! | `cooldown not shared` | `WARN` | `error` (the store could not be reached) |
//! | `every scope is busy` | `WARN` | `max_scopes` (new keys share the overflow scope; logged as the scope is looked up, before the call's span) |
//!
//! # Events
//! [`Throttle::events`](crate::Throttle::events) gives a receiver of [`Event`]s: a cooldown
//! closed or reopened, an attempt refused by the server, a limit past the capacity-warning
//! threshold, a circuit opened or closed, a scope's learned limits changed. See [`Event`] for
//! when each is sent.
//!
//! Events go through a `tokio` broadcast channel with a bounded buffer
//! ([`event_buffer`](crate::ThrottleBuilder::event_buffer), 256 by default): sending never
//! waits, so a slow or absent receiver never slows a request. A receiver that falls more than
//! the buffer behind loses the oldest events: its next `recv` returns
//! `Err(RecvError::Lagged(n))`, `n` the number it missed, and then goes on with the oldest
//! event kept. No event is built before the first call to `events()`.

mod events;
mod learning;
#[cfg(feature = "metrics")]
mod metrics;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::time::Instant;

pub use events::{Event, EventScope, WarnedLimit};

use crate::clock::instant_after;
use crate::store::QuotaUsage;
use crate::sync::lock;

/// How far (in percentage points) usage must fall under the capacity-warning threshold
/// before the warning re-arms, so that a count going back and forth across the threshold
/// (say 7 and 8 of 10 in flight) warns once, not at every step.
const REARM_MARGIN: u128 = 10;

/// Default capacity-warning threshold: 80 % of a limit.
pub const DEFAULT_CAPACITY_WARNING: u8 = 80;
/// Default number of events kept for a receiver that lags: 256.
pub const DEFAULT_EVENT_BUFFER: usize = 256;

/// What a throttle's observation is built from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ObserveConfig {
    /// The capacity-warning threshold, in percent (1 to 100).
    pub(crate) warn_percent: u8,
    /// Events kept for a lagging receiver (at least 1).
    pub(crate) buffer: usize,
}

impl Default for ObserveConfig {
    fn default() -> Self {
        Self {
            warn_percent: DEFAULT_CAPACITY_WARNING,
            buffer: DEFAULT_EVENT_BUFFER,
        }
    }
}

/// A throttle's observation: its event channel and the metrics of its unnamed scopes.
#[derive(Debug)]
pub(crate) struct Observer {
    events: broadcast::Sender<Event>,
    /// Whether [`subscribe`](Self::subscribe) was ever called: until then no event is built.
    watched: AtomicBool,
    warn_percent: u8,
    #[cfg(feature = "metrics")]
    unnamed: Arc<metrics::ScopeMetrics>,
}

impl Observer {
    pub(crate) fn new(config: ObserveConfig) -> Self {
        #[cfg(feature = "metrics")]
        metrics::describe();
        Self {
            events: broadcast::channel(config.buffer.max(1)).0,
            watched: AtomicBool::new(false),
            warn_percent: config.warn_percent,
            #[cfg(feature = "metrics")]
            unnamed: Arc::new(metrics::ScopeMetrics::new(None)),
        }
    }

    /// A new receiver of every event sent from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.watched.store(true, Ordering::Relaxed);
        self.events.subscribe()
    }

    /// The observation of a new scope labelled `label`, named `name` by the user.
    pub(crate) fn scope(
        self: &Arc<Self>,
        label: Arc<str>,
        name: Option<Arc<str>>,
    ) -> ScopeObserver {
        #[cfg(feature = "metrics")]
        let metrics = match &name {
            Some(n) => Arc::new(metrics::ScopeMetrics::new(Some(n))),
            None => self.unnamed.clone(),
        };
        ScopeObserver(Arc::new(ScopeShared {
            throttle: self.clone(),
            scope: EventScope { label, name },
            in_flight_armed: AtomicBool::new(true),
            quota_armed: AtomicBool::new(true),
            cooldown: Mutex::new(None),
            circuit: Mutex::new(None),
            #[cfg(feature = "metrics")]
            learned: Mutex::default(),
            #[cfg(feature = "metrics")]
            metrics,
        }))
    }
}

/// The observation of one scope: the hooks the engine and the middleware call.
#[derive(Debug)]
pub(crate) struct ScopeObserver(Arc<ScopeShared>);

#[derive(Debug)]
struct ScopeShared {
    throttle: Arc<Observer>,
    scope: EventScope,
    /// Whether the next crossing of the threshold by the in-flight count sends a warning.
    in_flight_armed: AtomicBool,
    /// The same for the scope's most-used quota.
    quota_armed: AtomicBool,
    /// The cooldown as this process closed it: since when, until when.
    cooldown: Mutex<Option<(Instant, Instant)>>,
    /// The circuit as this scope's answers changed it (`None`: closed).
    circuit: Mutex<Option<learning::Opened>>,
    /// The learned limits the gauges hold for this scope.
    #[cfg(feature = "metrics")]
    learned: Mutex<crate::learn::InForce>,
    #[cfg(feature = "metrics")]
    metrics: Arc<metrics::ScopeMetrics>,
}

/// A scope dropped (evicted, or its throttle dropped) leaves the sums of the learned-limit
/// and circuit-state gauges.
#[cfg(feature = "metrics")]
impl Drop for ScopeShared {
    fn drop(&mut self) {
        self.learned_gauges(crate::learn::InForce::default());
        let circuit = lock(&self.circuit).take();
        self.metrics.circuit(learning::level(circuit), 0);
    }
}

impl ScopeShared {
    fn watched(&self) -> bool {
        self.throttle.watched.load(Ordering::Relaxed)
    }

    fn send(&self, event: Event) {
        // No receiver now is not an error: events are for whoever listens.
        let _ = self.throttle.events.send(event);
    }

    /// Sends a warning if `used` of `capacity` crosses the threshold with `armed` set;
    /// re-arms it once usage is [`REARM_MARGIN`] points under the threshold.
    fn check(&self, armed: &AtomicBool, used: u64, capacity: u64, limit: WarnedLimit) {
        let percent = u128::from(self.throttle.warn_percent);
        let share = u128::from(used) * 100;
        let above = share >= u128::from(capacity) * percent;
        let rearm = share < u128::from(capacity) * percent.saturating_sub(REARM_MARGIN);
        if rearm || (percent <= REARM_MARGIN && used == 0) {
            if !armed.load(Ordering::Relaxed) {
                armed.store(true, Ordering::Relaxed);
            }
        } else if above && armed.swap(false, Ordering::Relaxed) {
            self.send(Event::CapacityWarning {
                scope: self.scope.clone(),
                limit,
                used,
                capacity,
            });
        }
    }

    /// The cooldown closed until `until` reopens, if no later close lengthened it.
    fn reopen(&self, until: Instant) {
        let mut cooldown = lock(&self.cooldown);
        let Some((since, due)) = *cooldown else {
            return;
        };
        if due != until {
            return;
        }
        *cooldown = None;
        drop(cooldown);
        #[cfg(feature = "metrics")]
        self.metrics.cooldown_closed.decrement(1.0);
        if self.watched() {
            self.send(Event::CooldownReopened {
                scope: self.scope.clone(),
                closed_for: until.saturating_duration_since(since),
            });
        }
    }
}

impl ScopeObserver {
    /// A request was admitted: `in_flight` of `cap` are in flight now (`usize::MAX`: no
    /// cap); `usage` tells the most-used quota.
    #[inline]
    pub(crate) fn admitted(
        &self,
        in_flight: usize,
        cap: usize,
        usage: impl FnOnce() -> Option<QuotaUsage>,
    ) {
        #[cfg(feature = "metrics")]
        self.0.metrics.in_flight.increment(1.0);
        if !self.0.watched() {
            return;
        }
        self.in_flight_now(in_flight, cap);
        if let Some(u) = usage() {
            let capacity = u64::from(u.quota.capacity());
            let limit = WarnedLimit::Quota(u.quota);
            self.0
                .check(&self.0.quota_armed, u64::from(u.used), capacity, limit);
        }
    }

    /// A request finished: `in_flight` of `cap` are in flight now.
    #[inline]
    pub(crate) fn released(&self, in_flight: usize, cap: usize) {
        #[cfg(feature = "metrics")]
        self.0.metrics.in_flight.decrement(1.0);
        if self.0.watched() {
            self.in_flight_now(in_flight, cap);
        }
    }

    fn in_flight_now(&self, in_flight: usize, cap: usize) {
        if cap != usize::MAX {
            let (used, cap) = (in_flight as u64, cap as u64);
            self.0
                .check(&self.0.in_flight_armed, used, cap, WarnedLimit::InFlight);
        }
    }

    /// A caller joined (`true`) or left (`false`) the scope's queue.
    #[inline]
    pub(crate) fn queued(&self, joined: bool) {
        #[cfg(feature = "metrics")]
        if joined {
            self.0.metrics.queued.increment(1.0);
        } else {
            self.0.metrics.queued.decrement(1.0);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = joined;
    }

    /// The scope's cooldown was closed for `wait` from now. Sends
    /// [`Event::CooldownClosed`] if it was open, and arranges for
    /// [`Event::CooldownReopened`] when it opens again.
    pub(crate) fn cooldown_closed(&self, wait: Duration) {
        if !(cfg!(feature = "metrics") || self.0.watched()) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let now = Instant::now();
        let until = instant_after(now, wait);
        let due = *lock(&self.0.cooldown);
        if let Some((_, due)) = due.filter(|&(_, due)| due <= now) {
            // Due to reopen now, and its task not run yet: it reopens first.
            self.0.reopen(due);
        }
        {
            let mut cooldown = lock(&self.0.cooldown);
            match &mut *cooldown {
                Some((_, due)) if *due >= until => return,
                Some((_, due)) => *due = until,
                None => {
                    *cooldown = Some((now, until));
                    #[cfg(feature = "metrics")]
                    self.0.metrics.cooldown_closed.increment(1.0);
                    if self.0.watched() {
                        self.0.send(Event::CooldownClosed {
                            scope: self.0.scope.clone(),
                            wait,
                        });
                    }
                }
            }
        }
        let shared = self.0.clone();
        runtime.spawn(async move {
            tokio::time::sleep_until(until).await;
            shared.reopen(until);
        });
    }

    /// The server refused attempt `attempt` with `status` (429, or a 403 that carries
    /// rate-limit signals), asking for `retry_after`.
    pub(crate) fn refused(&self, status: u16, attempt: u32, retry_after: Option<Duration>) {
        if self.0.watched() {
            self.0.send(Event::Refused {
                scope: self.0.scope.clone(),
                status,
                attempt,
                retry_after,
            });
        }
    }

    /// A call entered the throttle.
    #[inline]
    pub(crate) fn request(&self) {
        #[cfg(feature = "metrics")]
        self.0.metrics.request();
    }

    /// An attempt was admitted after waiting `queued` (`retry`: not the request's first).
    #[inline]
    pub(crate) fn attempt(&self, retry: bool, queued: Duration) {
        #[cfg(feature = "metrics")]
        self.0.metrics.attempt(retry, queued);
        #[cfg(not(feature = "metrics"))]
        let _ = (retry, queued);
    }

    /// An attempt sent when `sent` started was answered with `status` (`None`: a transport
    /// error).
    #[inline]
    pub(crate) fn answered(&self, status: Option<u16>, sent: Stopwatch) {
        #[cfg(feature = "metrics")]
        self.0.metrics.answered(status, sent.elapsed());
        #[cfg(not(feature = "metrics"))]
        let _ = (status, sent);
    }

    /// A call ended for `reason` without its answer being accepted.
    #[inline]
    pub(crate) fn stopped(&self, reason: &crate::policy::StopReason) {
        #[cfg(feature = "metrics")]
        self.0.metrics.stopped(reason);
        #[cfg(not(feature = "metrics"))]
        let _ = reason;
    }

    /// The scope's name, if the user gave one.
    pub(crate) fn name(&self) -> Option<&str> {
        self.0.scope.name.as_deref()
    }
}

/// The time an attempt takes, read only with the `metrics` feature (without it, a unit that
/// reads no clock).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stopwatch(#[cfg(feature = "metrics")] Instant);

impl Stopwatch {
    #[inline]
    pub(crate) fn start() -> Self {
        Self(
            #[cfg(feature = "metrics")]
            Instant::now(),
        )
    }

    #[cfg(feature = "metrics")]
    fn elapsed(self) -> Duration {
        self.0.elapsed()
    }
}
