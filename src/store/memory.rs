//! [`MemoryStore`]: the default store, the state of one process.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::quotas::Quotas;
use super::{
    Admission, LeaseId, Limits, QuotaName, QuotaUsage, ScopeId, Settlement, Store, StoreError,
};
use crate::sync::lock;

/// The default [`Store`]: each scope's state in this process's memory, on the tokio clock.
///
/// Every call answers at once (its future is ready when first polled), takes one
/// uncontended mutex, and allocates nothing. A lease released twice frees two slots: the
/// engine releases each lease exactly once. Each
/// [`open`](Store::open) makes a fresh state: the engine opens one per scope and shares it
/// among every caller of that scope.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryStore;

/// One scope's state in a [`MemoryStore`].
#[derive(Debug)]
pub struct MemoryScope {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Closed until this instant (the shared cooldown).
    cooldown_until: Option<Instant>,
    in_flight: usize,
    max_in_flight: Option<usize>,
    /// The quota with the smallest capacity, which a cost above it exceeds.
    smallest: Option<QuotaName>,
    quotas: Quotas,
    next_lease: u64,
    /// The charges of recent admissions, by lease, oldest first, for [`Store::settle`]: kept
    /// while a quota may still count them ([`Quotas::memory`]), so at most one per unit a
    /// quota holds.
    charges: VecDeque<Charge>,
}

/// One admission's charge, until it is settled or leaves every quota.
#[derive(Debug, Clone, Copy)]
struct Charge {
    lease: u64,
    at: Instant,
    /// The estimate charged; `None` once settled with an actual cost (settled for good).
    cost: Option<u32>,
}

impl State {
    fn admit(&mut self, cost: u32, now: Instant) -> Admission {
        if let Some(quota) = self.smallest.filter(|q| cost > q.capacity()) {
            let capacity = quota.capacity();
            return Admission::CostTooLarge { capacity, quota };
        }
        if let Some(until) = self.cooldown_until.filter(|&u| u > now) {
            return Admission::CoolingDown(until - now);
        }
        if self.max_in_flight.is_some_and(|cap| self.in_flight >= cap) {
            return Admission::InFlightFull;
        }
        match self.quotas.try_admit(cost, now) {
            Ok(()) => {
                self.in_flight += 1;
                self.next_lease = self.next_lease.wrapping_add(1);
                self.forget_charges(now);
                if self.quotas.counts_cost(cost) {
                    let (lease, cost) = (self.next_lease, Some(cost));
                    self.charges.push_back(Charge {
                        lease,
                        at: now,
                        cost,
                    });
                }
                Admission::Admitted(LeaseId(self.next_lease))
            }
            Err(ready) => Admission::NotBefore(ready.saturating_duration_since(now)),
        }
    }
}

impl State {
    /// Drops the charges no quota counts any more.
    fn forget_charges(&mut self, now: Instant) {
        let memory = self.quotas.memory();
        while self.charges.front().is_some_and(|c| c.at + memory <= now) {
            self.charges.pop_front();
        }
    }

    fn settle(&mut self, lease: LeaseId, settlement: Settlement, now: Instant) {
        self.forget_charges(now);
        let found = self.charges.binary_search_by_key(&lease.0, |c| c.lease);
        let charge = found.ok().map(|i| &mut self.charges[i]);
        let (at, estimate) = match charge {
            Some(c) if settlement.actual.is_some() => (Some(c.at), c.cost.take()),
            Some(c) => (Some(c.at), c.cost),
            None => (None, None),
        };
        self.quotas.settle(at, estimate, settlement, now);
    }
}

impl Store for MemoryStore {
    type Scope = MemoryScope;

    fn open(&self, _id: ScopeId, limits: &Limits) -> MemoryScope {
        MemoryScope {
            state: Mutex::new(State {
                cooldown_until: None,
                in_flight: 0,
                max_in_flight: limits.max_in_flight,
                smallest: limits.smallest_quota(),
                quotas: Quotas::new(limits),
                next_lease: 0,
                charges: VecDeque::new(),
            }),
        }
    }

    // An `async fn`: it acts when polled, not when called, so a future dropped unpolled has
    // done nothing.
    async fn admit(&self, scope: &MemoryScope, cost: u32) -> Result<Admission, StoreError> {
        Ok(lock(&scope.state).admit(cost, Instant::now()))
    }

    fn release(&self, scope: &MemoryScope, _lease: LeaseId) {
        let mut state = lock(&scope.state);
        state.in_flight = state.in_flight.saturating_sub(1);
    }

    async fn close_cooldown(&self, scope: &MemoryScope, wait: Duration) -> Result<(), StoreError> {
        let until = crate::clock::instant_after(Instant::now(), wait);
        let mut state = lock(&scope.state);
        if state.cooldown_until.is_none_or(|u| u < until) {
            state.cooldown_until = Some(until);
        }
        Ok(())
    }

    async fn set_limits(&self, scope: &MemoryScope, limits: &Limits) -> Result<(), StoreError> {
        self.set_limits_counting(scope, limits, &[]).await
    }

    async fn set_limits_counting(
        &self,
        scope: &MemoryScope,
        limits: &Limits,
        sent: &[Instant],
    ) -> Result<(), StoreError> {
        let mut state = lock(&scope.state);
        state.max_in_flight = limits.max_in_flight;
        state.smallest = limits.smallest_quota();
        state.quotas.resize(limits, sent, Instant::now());
        Ok(())
    }

    async fn settle(
        &self,
        scope: &MemoryScope,
        lease: LeaseId,
        settlement: Settlement,
    ) -> Result<(), StoreError> {
        lock(&scope.state).settle(lease, settlement, Instant::now());
        Ok(())
    }

    fn usage(&self, scope: &MemoryScope) -> Option<QuotaUsage> {
        lock(&scope.state).quotas.most_used(Instant::now())
    }

    fn is_idle(&self, scope: &MemoryScope) -> bool {
        let now = Instant::now();
        let mut state = lock(&scope.state);
        state.in_flight == 0
            && state.cooldown_until.is_none_or(|u| u <= now)
            && state.quotas.is_fresh(now)
    }
}
