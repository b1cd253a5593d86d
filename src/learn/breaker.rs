//! A circuit breaker per scope: open after N consecutive failures (5xx answers and transport
//! errors; a 429 is the cooldown's business and counts neither way), fail fast while open,
//! then let exactly one probe through (half-open) and close when it succeeds.
//!
//! Pure: instants in, decisions out.

use std::time::{Duration, Instant};

/// Default consecutive failures that open the circuit: 5 (the multi-agent seed's).
pub const DEFAULT_BREAKER_FAILURES: u32 = 5;
/// Default time the circuit stays open before its probe: 60 s (the multi-agent seed's).
pub const DEFAULT_BREAKER_OPEN_FOR: Duration = Duration::from_secs(60);

/// Settings of the per-scope circuit breaker, for
/// [`ThrottleBuilder::circuit_breaker`](crate::ThrottleBuilder::circuit_breaker).
///
/// # Default
/// Opens after 5 consecutive failures, stays open 60 s (or as long as the last failure's
/// `Retry-After` asks, if longer), then lets one probe request through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CircuitBreaker {
    /// Consecutive failures (5xx answers, transport errors) that open the circuit.
    pub failures: u32,
    /// How long the circuit stays open before the probe.
    pub open_for: Duration,
}

impl CircuitBreaker {
    /// Opens after `failures` consecutive failures, for `open_for`. `build` fails with
    /// [`BuildError::ZeroBreakerFailures`](crate::BuildError::ZeroBreakerFailures) for 0.
    pub const fn new(failures: u32, open_for: Duration) -> Self {
        Self { failures, open_for }
    }
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        Self::new(DEFAULT_BREAKER_FAILURES, DEFAULT_BREAKER_OPEN_FOR)
    }
}

/// A scope's circuit, as [`ScopeStats::circuit`](crate::ScopeStats::circuit) shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum CircuitState {
    /// Requests go as usual.
    #[default]
    Closed,
    /// Requests fail at once with
    /// [`ThrottleError::CircuitOpen`](crate::ThrottleError::CircuitOpen) until the probe,
    /// `retry_in` from now.
    Open {
        /// Time until the probe may go.
        retry_in: Duration,
    },
    /// One probe request may go (or is under way); the others fail at once.
    HalfOpen {
        /// Whether the probe is under way.
        probing: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { probing: bool },
}

/// Whether a request may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    /// As usual.
    Go,
    /// As the half-open circuit's one probe: its outcome closes or reopens the circuit.
    Probe,
}

/// What an answer was to the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Result {
    /// A 5xx answer or a transport error; the server's `Retry-After`, if any.
    Failure { asked: Option<Duration> },
    /// Any other answer but a 429.
    Success,
    /// A 429 (or 403 rate limit): the server is up and refused; the cooldown handles it.
    Refused,
}

/// A change of the circuit an answer made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// It opened (or opened again, its probe failed): the probe may go `retry_in` from now.
    Opened { retry_in: Duration },
    /// It closed: requests go as usual again.
    Closed,
}

/// One scope's breaker.
#[derive(Debug, Clone)]
pub(crate) struct Breaker {
    settings: CircuitBreaker,
    state: State,
}

impl Breaker {
    pub(crate) fn new(settings: CircuitBreaker) -> Self {
        Self {
            settings,
            state: State::Closed { failures: 0 },
        }
    }

    /// Whether a request may go at `now`; `Err` holds the time until it may (`None`: a probe
    /// is under way).
    pub(crate) fn check(&mut self, now: Instant) -> std::result::Result<Pass, Option<Duration>> {
        match self.state {
            State::Closed { .. } => Ok(Pass::Go),
            State::Open { until } if until > now => Err(Some(until - now)),
            State::Open { .. } | State::HalfOpen { probing: false } => {
                self.state = State::HalfOpen { probing: true };
                Ok(Pass::Probe)
            }
            State::HalfOpen { probing: true } => Err(None),
        }
    }

    /// The probe ended without an answer (cancelled, or refused locally): the next request
    /// is the probe.
    pub(crate) fn probe_abandoned(&mut self) {
        if self.state == (State::HalfOpen { probing: true }) {
            self.state = State::HalfOpen { probing: false };
        }
    }

    /// Records an answer at `now`. Returns the change it made to the circuit, if any.
    pub(crate) fn record(&mut self, result: Result, probe: bool, now: Instant) -> Option<Change> {
        let was_closed = matches!(self.state, State::Closed { .. });
        match (result, self.state) {
            (Result::Success, _) => return self.close(was_closed),
            (Result::Refused, _) if probe => return self.close(was_closed),
            (Result::Refused, _) => {}
            (Result::Failure { asked }, State::Closed { failures }) => {
                let failures = failures + 1;
                if failures < self.settings.failures {
                    self.state = State::Closed { failures };
                } else {
                    return self.open(asked, now);
                }
            }
            (Result::Failure { asked }, State::HalfOpen { .. }) if probe => {
                return self.open(asked, now)
            }
            // A failure of a request sent before the circuit opened: it stays as it is.
            (Result::Failure { .. }, _) => {}
        }
        None
    }

    fn open(&mut self, asked: Option<Duration>, now: Instant) -> Option<Change> {
        let wait = asked.map_or(self.settings.open_for, |a| a.max(self.settings.open_for));
        let until = now
            .checked_add(wait)
            .unwrap_or(now + crate::clock::FAR_FUTURE);
        self.state = State::Open { until };
        Some(Change::Opened {
            retry_in: until - now,
        })
    }

    fn close(&mut self, was_closed: bool) -> Option<Change> {
        self.state = State::Closed { failures: 0 };
        (!was_closed).then_some(Change::Closed)
    }

    /// The state at `now`, for the stats.
    pub(crate) fn state(&self, now: Instant) -> CircuitState {
        match self.state {
            State::Closed { .. } => CircuitState::Closed,
            State::Open { until } if until > now => CircuitState::Open {
                retry_in: until - now,
            },
            State::Open { .. } => CircuitState::HalfOpen { probing: false },
            State::HalfOpen { probing } => CircuitState::HalfOpen { probing },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    const FAIL: Result = Result::Failure { asked: None };

    fn breaker() -> Breaker {
        Breaker::new(CircuitBreaker::new(3, 60 * S))
    }

    #[test]
    fn opens_after_n_consecutive_failures_only() {
        let t = Instant::now();
        let mut b = breaker();
        assert_eq!(None, b.record(FAIL, false, t));
        assert_eq!(None, b.record(FAIL, false, t));
        // A success starts the count again; a 429 neither counts nor resets.
        assert_eq!(None, b.record(Result::Success, false, t));
        assert_eq!(None, b.record(FAIL, false, t));
        assert_eq!(None, b.record(Result::Refused, false, t));
        assert_eq!(None, b.record(FAIL, false, t));
        assert_eq!(b.state(t), CircuitState::Closed);
        assert_eq!(b.check(t), Ok(Pass::Go));
        let opened = Change::Opened { retry_in: 60 * S };
        assert_eq!(b.record(FAIL, false, t), Some(opened));
        assert_eq!(b.state(t), CircuitState::Open { retry_in: 60 * S });
        assert_eq!(b.check(t + 10 * S), Err(Some(50 * S)));
    }

    #[test]
    fn stays_open_longer_when_the_server_asks() {
        let t = Instant::now();
        let mut b = Breaker::new(CircuitBreaker::new(1, 60 * S));
        let asked = Some(90 * S);
        let opened = b.record(Result::Failure { asked }, false, t);
        assert_eq!(opened, Some(Change::Opened { retry_in: 90 * S }));
        assert_eq!(b.state(t), CircuitState::Open { retry_in: 90 * S });
        let mut b = Breaker::new(CircuitBreaker::new(1, 60 * S));
        b.record(Result::Failure { asked: Some(5 * S) }, false, t);
        assert_eq!(b.state(t), CircuitState::Open { retry_in: 60 * S });
    }

    #[test]
    fn half_open_lets_one_probe_through_and_closes_on_its_success() {
        let t = Instant::now();
        let mut b = Breaker::new(CircuitBreaker::new(1, 60 * S));
        b.record(FAIL, false, t);
        let later = t + 60 * S;
        assert_eq!(b.state(later), CircuitState::HalfOpen { probing: false });
        assert_eq!(b.check(later), Ok(Pass::Probe));
        assert_eq!(b.check(later), Err(None), "only one probe");
        assert_eq!(b.state(later), CircuitState::HalfOpen { probing: true });
        assert_eq!(b.record(Result::Success, true, later), Some(Change::Closed));
        assert_eq!(b.state(later), CircuitState::Closed);
        assert_eq!(b.check(later), Ok(Pass::Go));
        // A success of a request sent before the circuit opened closes it too.
        b.record(FAIL, false, later);
        assert_eq!(
            b.record(Result::Success, false, later),
            Some(Change::Closed)
        );
        assert_eq!(
            b.record(Result::Success, false, later),
            None,
            "closed already"
        );
    }

    #[test]
    fn a_failed_probe_reopens_and_an_abandoned_one_is_given_to_the_next_request() {
        let t = Instant::now();
        let mut b = Breaker::new(CircuitBreaker::new(1, 60 * S));
        b.record(FAIL, false, t);
        let t1 = t + 60 * S;
        assert_eq!(b.check(t1), Ok(Pass::Probe));
        b.probe_abandoned();
        assert_eq!(b.check(t1), Ok(Pass::Probe));
        let reopened = Change::Opened { retry_in: 60 * S };
        assert_eq!(b.record(FAIL, true, t1), Some(reopened));
        assert_eq!(b.state(t1), CircuitState::Open { retry_in: 60 * S });
        // A late failure of a request sent before does not extend it.
        assert_eq!(None, b.record(FAIL, false, t1 + S));
        assert_eq!(b.state(t1 + S), CircuitState::Open { retry_in: 59 * S });
    }
}
