//! [`Backend`]: the stores a [`Throttle`](crate::Throttle) runs on, one enum so that the
//! throttle stays one type whichever it is (a `match` per call, no boxing).

use std::time::Duration;

use tokio::time::Instant;

use super::{
    Admission, LeaseId, Limits, MemoryScope, MemoryStore, QuotaUsage, ScopeId, Settlement, Store,
    StoreError,
};

/// The store of a throttle, for
/// [`ThrottleBuilder::store`](crate::ThrottleBuilder::store): [`MemoryStore`] (the
/// default: one process) or, with the feature `redis`,
/// [`RedisStore`](super::RedisStore) (a fleet shares one quota).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Backend {
    /// Each process counts alone.
    Memory(MemoryStore),
    /// Every process on the same Redis and namespace counts together.
    #[cfg(feature = "redis")]
    Redis(super::RedisStore),
}

impl Default for Backend {
    fn default() -> Self {
        Backend::Memory(MemoryStore)
    }
}

impl From<MemoryStore> for Backend {
    fn from(store: MemoryStore) -> Self {
        Backend::Memory(store)
    }
}

#[cfg(feature = "redis")]
impl From<super::RedisStore> for Backend {
    fn from(store: super::RedisStore) -> Self {
        Backend::Redis(store)
    }
}

/// A scope's handle in a [`Backend`].
#[derive(Debug)]
#[non_exhaustive]
pub enum BackendScope {
    /// In a [`MemoryStore`].
    Memory(MemoryScope),
    /// In a [`RedisStore`](super::RedisStore).
    #[cfg(feature = "redis")]
    Redis(super::RedisScope),
}

/// `$body` with `$s` the store and `$sc` the scope of the same kind.
macro_rules! each {
    ($self:ident, $scope:ident, |$s:ident, $sc:ident| $body:expr) => {
        match ($self, $scope) {
            (Backend::Memory($s), BackendScope::Memory($sc)) => $body,
            #[cfg(feature = "redis")]
            (Backend::Redis($s), BackendScope::Redis($sc)) => $body,
            #[cfg(feature = "redis")]
            _ => unreachable!("a scope is used only with the store that opened it"),
        }
    };
}

impl Backend {
    /// Calls to a shared store that failed or timed out so far (0 for memory).
    pub(crate) fn errors(&self) -> u64 {
        match self {
            Backend::Memory(_) => 0,
            #[cfg(feature = "redis")]
            Backend::Redis(s) => s.errors(),
        }
    }
}

impl Store for Backend {
    type Scope = BackendScope;

    fn open(&self, id: ScopeId, limits: &Limits) -> BackendScope {
        match self {
            Backend::Memory(s) => BackendScope::Memory(s.open(id, limits)),
            #[cfg(feature = "redis")]
            Backend::Redis(s) => BackendScope::Redis(s.open(id, limits)),
        }
    }

    async fn admit(&self, scope: &BackendScope, cost: u32) -> Result<Admission, StoreError> {
        each!(self, scope, |s, sc| s.admit(sc, cost).await)
    }

    fn release(&self, scope: &BackendScope, lease: LeaseId) {
        each!(self, scope, |s, sc| s.release(sc, lease))
    }

    async fn close_cooldown(&self, scope: &BackendScope, wait: Duration) -> Result<(), StoreError> {
        each!(self, scope, |s, sc| s.close_cooldown(sc, wait).await)
    }

    async fn set_limits(&self, scope: &BackendScope, limits: &Limits) -> Result<(), StoreError> {
        each!(self, scope, |s, sc| s.set_limits(sc, limits).await)
    }

    async fn set_limits_counting(
        &self,
        scope: &BackendScope,
        limits: &Limits,
        sent: &[Instant],
    ) -> Result<(), StoreError> {
        each!(self, scope, |s, sc| s
            .set_limits_counting(sc, limits, sent)
            .await)
    }

    async fn settle(
        &self,
        scope: &BackendScope,
        lease: LeaseId,
        settlement: Settlement,
    ) -> Result<(), StoreError> {
        each!(self, scope, |s, sc| s.settle(sc, lease, settlement).await)
    }

    fn is_idle(&self, scope: &BackendScope) -> bool {
        each!(self, scope, |s, sc| s.is_idle(sc))
    }

    fn usage(&self, scope: &BackendScope) -> Option<QuotaUsage> {
        each!(self, scope, |s, sc| s.usage(sc))
    }

    fn in_flight_poll(&self) -> Option<Duration> {
        match self {
            Backend::Memory(s) => s.in_flight_poll(),
            #[cfg(feature = "redis")]
            Backend::Redis(s) => s.in_flight_poll(),
        }
    }

    async fn released_elsewhere(&self, scope: &BackendScope) {
        match (self, scope) {
            #[cfg(feature = "redis")]
            (Backend::Redis(s), BackendScope::Redis(sc)) => s.released_elsewhere(sc).await,
            _ => std::future::pending().await,
        }
    }

    fn scope_hash_key(&self) -> Option<[u64; 2]> {
        match self {
            Backend::Memory(s) => s.scope_hash_key(),
            #[cfg(feature = "redis")]
            Backend::Redis(s) => s.scope_hash_key(),
        }
    }
}
