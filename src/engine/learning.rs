//! The scope's side of learning: the circuit check before admission, the send log, and the
//! learned limits applied after an answer. The estimators themselves are in
//! [`learn`](crate::learn); what changed is told to the scope's observer (events, gauges).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Slot;
use crate::error::ThrottleError;
use crate::learn::breaker::Pass;
use crate::learn::{Answer, CircuitChange, CircuitState, LearnedLimits};
use crate::store::Store;
use crate::sync::lock;

/// The half-open circuit's one probe, held by the call that sends it. Dropped before its
/// answer was learned (the call cancelled, or refused locally), it hands the probe to the
/// next request.
#[derive(Debug)]
#[must_use = "dropping the probe hands it to the next request"]
pub(crate) struct Probe {
    release: Option<Arc<dyn AbandonProbe>>,
}

/// What a [`Probe`] needs of its slot, whatever the store.
trait AbandonProbe: Send + Sync + std::fmt::Debug {
    fn abandon(&self);
}

impl<S: Store> AbandonProbe for Slot<S> {
    fn abandon(&self) {
        lock(&self.learner).probe_abandoned();
    }
}

impl Probe {
    /// The answer was learned: the probe did its work.
    fn done(mut self) {
        self.release = None;
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        if let Some(slot) = self.release.take() {
            slot.abandon();
        }
    }
}

/// A send logged for learning, held by its call until its answer is learned.
#[derive(Debug)]
#[must_use = "dropping the send logs it as never answered"]
pub(crate) struct Sent<S: Store> {
    slot: Option<Arc<Slot<S>>>,
    /// Its number in the scope's send log.
    pub(crate) seq: u64,
}

impl<S: Store> Sent<S> {
    /// Its answer was learned.
    pub(crate) fn answered(mut self) {
        self.slot = None;
    }
}

impl<S: Store> Drop for Sent<S> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            lock(&slot.learner).abandoned(self.seq);
        }
    }
}

impl<S: Store> Slot<S> {
    /// Whether the circuit lets a request go now: `Ok(Some(probe))` when it goes as the
    /// half-open circuit's probe.
    ///
    /// # Errors
    /// [`ThrottleError::CircuitOpen`] while the circuit is open, or half-open with its probe
    /// under way.
    pub(crate) fn circuit_check(self: &Arc<Self>) -> Result<Option<Probe>, ThrottleError> {
        let checked = lock(&self.learner).check(Instant::now().into_std());
        match checked {
            Ok(Pass::Go) => Ok(None),
            Ok(Pass::Probe) => {
                let slot: Arc<dyn AbandonProbe> = self.clone();
                Ok(Some(Probe {
                    release: Some(slot),
                }))
            }
            Err(retry_in) => Err(ThrottleError::CircuitOpen {
                scope: self.label.to_string(),
                retry_in,
            }),
        }
    }

    /// Logs a send made now; its number goes into the [`Answer`] given to
    /// [`learn`](Self::learn). Dropped before [`Sent::answered`] (the call cancelled, or its
    /// deadline passed in flight), the send is logged as one that will never be answered.
    pub(crate) fn learn_sent(self: &Arc<Self>) -> Sent<S> {
        let seq = lock(&self.learner).sent(Instant::now().into_std());
        Sent {
            slot: Some(self.clone()),
            seq,
        }
    }

    /// Learns from one answer (`probe`: the call's probe, if this attempt was one; the
    /// scope's other requests in flight are filled in here) and applies what changed. Returns the longest the scope's cooldown should stay closed for it, when
    /// the learned model cuts a coarse `Retry-After`.
    pub(crate) async fn learn(&self, answer: Answer<'_>, probe: Option<Probe>) -> Option<Duration> {
        // The answering request still holds its in-flight slot.
        let in_flight = self.counters.in_flight.load(Ordering::Relaxed);
        let answer = Answer {
            probe: probe.is_some(),
            in_flight: in_flight.saturating_sub(1),
            ..answer
        };
        let learned = {
            let mut learner = lock(&self.learner);
            let learned = learner.answered(answer);
            // Told under the learner's lock: the observer sees the changes in their order.
            self.observe.circuit(learned.circuit);
            if let Some((_, in_force)) = learned.limits {
                self.observe.limits_learned(in_force);
            }
            learned
        };
        if let Some(p) = probe {
            p.done();
        }
        if let Some(CircuitChange::Opened { .. }) = learned.circuit {
            tracing::warn!(scope = %self.label, "circuit opened");
        }
        if let Some((limits, _)) = &learned.limits {
            tracing::debug!(scope = %self.label, ?limits, "learned limits");
            let sent: Vec<Instant> = learned.sent.iter().map(|&t| Instant::from_std(t)).collect();
            if let Err(e) = self.set_limits(limits, &sent).await {
                tracing::warn!(scope = %self.label, error = ?e, "learned limits not applied");
            }
        }
        learned.cooldown_cap
    }

    /// What the scope learned.
    pub(crate) fn learned(&self) -> LearnedLimits {
        lock(&self.learner).snapshot(&self.label)
    }

    /// The scope's circuit now.
    pub(crate) fn circuit(&self) -> CircuitState {
        lock(&self.learner).circuit(Instant::now().into_std())
    }
}
