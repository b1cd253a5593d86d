//! The observation of what a scope learns: its circuit opening and closing, and its learned
//! limits changing (events, and the gauges of the `metrics` feature).

use std::time::Duration;

use tokio::time::Instant;

use super::{Event, ScopeObserver, ScopeShared};
use crate::clock::instant_after;
use crate::learn::{CircuitChange, InForce};
use crate::sync::lock;

/// A circuit not closed, as this process opened it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
// Without the `metrics` feature only `since` is read (no gauge to move at `until`).
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(super) struct Opened {
    /// The first opening (a failed probe opens it again, keeping this).
    since: Instant,
    /// When the probe may go: the circuit is half-open from then.
    until: Instant,
    /// Whether the gauge shows it half-open (set at `until`).
    half_open: bool,
}

/// The circuit-state gauge's value of a scope: 0 closed, 1 half-open, 2 open.
#[cfg(feature = "metrics")]
pub(super) fn level(circuit: Option<Opened>) -> usize {
    match circuit {
        None => 0,
        Some(o) if o.half_open => 1,
        Some(_) => 2,
    }
}

impl ScopeShared {
    /// Puts the circuit in `to`, moving the scope's circuit-state gauge along.
    fn set_circuit(&self, circuit: &mut Option<Opened>, to: Option<Opened>) {
        #[cfg(feature = "metrics")]
        self.metrics.circuit(level(*circuit), level(to));
        *circuit = to;
    }

    /// The open time ending at `until` ended: the circuit is half-open, unless it closed or
    /// opened again meanwhile.
    #[cfg(feature = "metrics")]
    fn half_open(&self, until: Instant) {
        let mut circuit = lock(&self.circuit);
        if let Some(o) = circuit.filter(|o| o.until == until && !o.half_open) {
            let to = Some(Opened {
                half_open: true,
                ..o
            });
            self.set_circuit(&mut circuit, to);
        }
    }

    /// Moves the learned-limit gauges from the values last recorded to `now`.
    #[cfg(feature = "metrics")]
    pub(super) fn learned_gauges(&self, now: InForce) {
        let mut last = lock(&self.learned);
        self.metrics.learned(*last, now);
        *last = now;
    }
}

impl ScopeObserver {
    /// The scope's circuit changed (`None`: it did not). Sends
    /// [`Event::CircuitOpened`] or [`Event::CircuitClosed`].
    pub(crate) fn circuit(&self, change: Option<CircuitChange>) {
        match change {
            Some(CircuitChange::Opened { retry_in }) => self.circuit_opened(retry_in),
            Some(CircuitChange::Closed) => self.circuit_closed(),
            None => {}
        }
    }

    fn circuit_opened(&self, retry_in: Duration) {
        let now = Instant::now();
        let until = instant_after(now, retry_in);
        {
            let mut circuit = lock(&self.0.circuit);
            let since = circuit.map_or(now, |o| o.since);
            let to = Some(Opened {
                since,
                until,
                half_open: false,
            });
            self.0.set_circuit(&mut circuit, to);
        }
        if self.0.watched() {
            self.0.send(Event::CircuitOpened {
                scope: self.0.scope.clone(),
                retry_in,
            });
        }
        #[cfg(feature = "metrics")]
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let shared = self.0.clone();
            runtime.spawn(async move {
                tokio::time::sleep_until(until).await;
                shared.half_open(until);
            });
        }
    }

    fn circuit_closed(&self) {
        let since = {
            let mut circuit = lock(&self.0.circuit);
            let since = circuit.map(|o| o.since);
            self.0.set_circuit(&mut circuit, None);
            since
        };
        if self.0.watched() {
            let open_for = since.map_or(Duration::ZERO, |s| s.elapsed());
            self.0.send(Event::CircuitClosed {
                scope: self.0.scope.clone(),
                open_for,
            });
        }
    }

    /// The scope's learned limits changed to `now`. Sends [`Event::LimitsLearned`].
    pub(crate) fn limits_learned(&self, now: InForce) {
        #[cfg(feature = "metrics")]
        self.0.learned_gauges(now);
        if self.0.watched() {
            self.0.send(Event::LimitsLearned {
                scope: self.0.scope.clone(),
                rate: now.rate,
                burst: now.burst,
                max_in_flight: now.max_in_flight,
            });
        }
    }

    /// The scope opened with learned limits `now` (a warm start's, or the configured
    /// in-flight cap): the gauges start there; no event.
    pub(crate) fn limits_at_start(&self, now: InForce) {
        #[cfg(feature = "metrics")]
        self.0.learned_gauges(now);
        #[cfg(not(feature = "metrics"))]
        let _ = now;
    }
}
