//! Admission: scopes, the local waiter queue of each (priority lanes, first in first out,
//! aging), wake-ups, and resizable limits; the state a server counts is asked of the
//! [`Store`](crate::store::Store).
//!
//! This is the only place (with the retry sleep in the middleware) that waits.

mod learning;
mod queue;
mod registry;
mod scope;
mod slot;

use std::sync::Arc;
use std::time::Duration;

pub use scope::Scope;

pub(crate) use learning::{Probe, Sent};
pub(crate) use registry::Bounds;
pub(crate) use slot::{count, Counters, Lease, Slot};

use registry::Registry;
use slot::SlotConfig;

use crate::error::ThrottleError;
use crate::observe::{ObserveConfig, Observer};
use crate::store::{Limits, Store, StoreError};

/// Why admission failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The request can never be admitted.
    Cost(ThrottleError),
    /// Admission would come after the deadline: `would_wait` is the known wait that passes
    /// it, `None` when the deadline passed while waiting.
    Deadline { would_wait: Option<Duration> },
    /// The store could not answer.
    Store(StoreError),
}

impl Refused {
    /// The error a caller gets, after `attempts` attempts and `waited` in the throttle.
    pub(crate) fn into_error(self, attempts: u32, waited: Duration) -> ThrottleError {
        match self {
            Refused::Cost(e) => e,
            Refused::Deadline { would_wait } => ThrottleError::DeadlineExceeded {
                attempts,
                waited,
                would_wait,
                last_error: None,
            },
            Refused::Store(e) => ThrottleError::StoreUnavailable(e),
        }
    }
}

/// What the engine is built from.
#[derive(Debug)]
pub(crate) struct EngineConfig<S> {
    pub(crate) store: S,
    pub(crate) scope: Scope,
    pub(crate) limits: Limits,
    pub(crate) aging: Duration,
    pub(crate) bounds: Bounds,
    pub(crate) learn: Arc<crate::learn::LearnConfig>,
    pub(crate) observe: ObserveConfig,
    /// Names for scopes: each the scope of its example request.
    pub(crate) names: Vec<(Arc<str>, reqwest::Request)>,
}

/// Admission for one throttle: its scopes and their counters.
#[derive(Debug)]
pub(crate) struct Engine<S: Store> {
    registry: Registry<S>,
    total: Arc<Counters>,
    observer: Arc<Observer>,
}

impl<S: Store> Engine<S> {
    pub(crate) fn new(config: EngineConfig<S>) -> Self {
        let total = Arc::new(Counters::default());
        let observer = Arc::new(Observer::new(config.observe));
        let slots = SlotConfig {
            store: Arc::new(config.store),
            limits: config.limits,
            aging: config.aging,
            total: total.clone(),
            origin: tokio::time::Instant::now(),
            learn: config.learn.clone(),
            observer: observer.clone(),
            names: Default::default(),
        };
        let mut registry = Registry::new(config.scope, slots, config.bounds);
        registry.name_scopes(config.names);
        Self {
            registry,
            total,
            observer,
        }
    }

    /// The throttle's observation (events, metrics).
    pub(crate) fn observer(&self) -> &Observer {
        &self.observer
    }

    /// Counters summed over every scope.
    pub(crate) fn total(&self) -> &Counters {
        &self.total
    }

    /// The scope of `req`.
    pub(crate) fn scope_of(&self, req: &reqwest::Request) -> Arc<Slot<S>> {
        self.registry.scope_of(req)
    }

    /// The unkeyed scope (of [`Throttle::acquire`](crate::Throttle::acquire)).
    pub(crate) fn unkeyed(&self) -> &Arc<Slot<S>> {
        self.registry.unkeyed()
    }

    /// Calls `f` on every live scope.
    pub(crate) fn each_scope(&self, f: impl FnMut(&Slot<S>)) {
        self.registry.each(f);
    }

    /// The in-flight cap a new scope starts with, or `None` without one.
    pub(crate) fn max_in_flight(&self) -> Option<usize> {
        self.registry.limits().max_in_flight
    }

    /// The store.
    pub(crate) fn store(&self) -> &S {
        self.registry.store()
    }

    /// The learning settings.
    pub(crate) fn learn_config(&self) -> &crate::learn::LearnConfig {
        self.registry.learn_config()
    }

    /// The number of live keyed scopes.
    pub(crate) fn keyed_scopes(&self) -> usize {
        self.registry.len()
    }
}

#[cfg(test)]
mod tests;
