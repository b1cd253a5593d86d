//! [`Event`]: what a throttle tells its [`events`](crate::Throttle::events) receivers.

use std::sync::Arc;
use std::time::Duration;

use crate::store::QuotaName;

/// Something a throttle did or saw, from [`Throttle::events`](crate::Throttle::events).
///
/// Events are rare by design (a cooldown, a refusal, a warning once per crossing), never one
/// per request that goes well. New variants may be added: match with a `_` arm.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// The scope's shared cooldown closed: every caller of the scope waits `wait` from now
    /// (after a window-type 429, or an answer that says nothing remains until a reset).
    /// Sent when the cooldown goes from open to closed; a later answer that lengthens it
    /// while it is closed sends nothing (the [`CooldownReopened`](Self::CooldownReopened)
    /// that follows tells the whole time it stayed closed).
    #[non_exhaustive]
    CooldownClosed {
        /// The scope.
        scope: EventScope,
        /// How long it stays closed, from now.
        wait: Duration,
    },
    /// The scope's shared cooldown opened again, at the instant it was due to (callers of the
    /// scope may go again).
    #[non_exhaustive]
    CooldownReopened {
        /// The scope.
        scope: EventScope,
        /// How long it stayed closed.
        closed_for: Duration,
    },
    /// The server refused an attempt for its rate limit: a 429, or a 403 that carries
    /// rate-limit signals (`Retry-After`, or 0 remaining with a reset), which is waited out
    /// like a 429. One event per refused attempt.
    #[non_exhaustive]
    Refused {
        /// The scope.
        scope: EventScope,
        /// The answer's status code (429 or 403).
        status: u16,
        /// The attempt refused: 1 for a request's first.
        attempt: u32,
        /// The wait the server asked for (`Retry-After` or `retry-after-ms`), if any.
        retry_after: Option<Duration>,
    },
    /// A limit of the scope passed the capacity-warning threshold
    /// ([`capacity_warning`](crate::ThrottleBuilder::capacity_warning), 80 % by default):
    /// `used` of `capacity` is taken now. Sent once per crossing: not again until the usage
    /// has fallen 10 percentage points under the threshold (which re-arms it: under 70 % for
    /// the default 80 %) and passes it again. The
    /// in-flight count is checked at each admission and release, the quotas at each
    /// admission (a quota emptied by time re-arms at the next admission). The in-flight cap
    /// and the quotas (the most-used one named) are warned about separately; quotas only with
    /// a store that can tell their usage at once ([`Store::usage`](crate::store::Store::usage):
    /// the in-memory store can).
    #[non_exhaustive]
    CapacityWarning {
        /// The scope.
        scope: EventScope,
        /// The limit that passed the threshold.
        limit: WarnedLimit,
        /// What is taken now: requests in flight, or quota units counted.
        used: u64,
        /// The limit's capacity: the in-flight cap, a sliding window's limit, a token
        /// bucket's burst.
        capacity: u64,
    },
    /// The scope's circuit breaker
    /// ([`circuit_breaker`](crate::ThrottleBuilder::circuit_breaker)) opened: its requests
    /// fail at once with [`ThrottleError::CircuitOpen`](crate::ThrottleError::CircuitOpen)
    /// until one probe request may go, `retry_in` from now. Sent when consecutive failures
    /// open it, and again each time a failed probe opens it again.
    #[non_exhaustive]
    CircuitOpened {
        /// The scope.
        scope: EventScope,
        /// Time until the probe may go: the breaker's `open_for`, or the last failure's
        /// `Retry-After` if longer.
        retry_in: Duration,
    },
    /// The scope's circuit closed: requests go as usual again. Sent when an answer that is
    /// not a failure comes while it is open or half-open (the probe's, or one of a request
    /// sent before it opened).
    #[non_exhaustive]
    CircuitClosed {
        /// The scope.
        scope: EventScope,
        /// How long it was not closed: from the opening (the first, if a failed probe opened
        /// it again) to now.
        open_for: Duration,
    },
    /// What the scope learned of the server's limits changed
    /// ([`learn_limits`](crate::ThrottleBuilder::learn_limits)): its learned rate, burst or
    /// in-flight cap. Sent when an answer changes one of them, not per answer; the values
    /// are the ones in force from now on, as [`Throttle::learned`](crate::Throttle::learned)
    /// gives them.
    #[non_exhaustive]
    LimitsLearned {
        /// The scope.
        scope: EventScope,
        /// The learned pace, in requests per second (`None`: no rate learned).
        rate: Option<f64>,
        /// The burst of that pace: requests that may go at once after an idle time.
        burst: Option<u32>,
        /// The in-flight cap in force: learned from parallel-limit refusals, at most the
        /// configured [`max_in_flight`](crate::ThrottleBuilder::max_in_flight) (`None`: no
        /// cap).
        max_in_flight: Option<usize>,
    },
}

impl Event {
    /// The scope the event is about.
    pub fn scope(&self) -> &EventScope {
        match self {
            Event::CooldownClosed { scope, .. }
            | Event::CooldownReopened { scope, .. }
            | Event::Refused { scope, .. }
            | Event::CapacityWarning { scope, .. }
            | Event::CircuitOpened { scope, .. }
            | Event::CircuitClosed { scope, .. }
            | Event::LimitsLearned { scope, .. } => scope,
        }
    }
}

/// The scope an [`Event`] is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct EventScope {
    /// The scope's label, as in [`ScopeStats::label`](crate::ScopeStats::label) (never a
    /// header value).
    pub label: Arc<str>,
    /// The name given with [`name_scope`](crate::ThrottleBuilder::name_scope), if any.
    pub name: Option<Arc<str>>,
}

/// The limit a [`Event::CapacityWarning`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WarnedLimit {
    /// The scope's in-flight cap ([`max_in_flight`](crate::ThrottleBuilder::max_in_flight)).
    InFlight,
    /// A quota: the one of the scope's quotas most used now.
    Quota(QuotaName),
}
