//! The state a server counts, per scope, behind one trait: [`Store`].
//!
//! A store keeps, for each scope, what decides whether a request may go now: the shared
//! cooldown, the leases of requests in flight, and the quotas (sliding windows and token
//! buckets). The engine keeps everything else locally: the waiter queue, its order and its
//! wake-ups. [`MemoryStore`] is the default; a store shared by several processes implements
//! the same trait.
//!
//! Answers are durations ("not before 250 ms from now"), never local instants, so that a store
//! with a clock of its own (a database server's) fits.

mod any;
mod memory;
mod quotas;
#[cfg(feature = "redis")]
mod redis;
mod sliding_window;
mod token_bucket;

use std::future::Future;
use std::num::NonZeroU32;
use std::time::Duration;

use tokio::time::Instant;

pub use any::{Backend, BackendScope};
pub use memory::{MemoryScope, MemoryStore};
#[cfg(feature = "redis")]
pub use redis::{OnUnavailable, RedisScope, RedisStore, RedisStoreBuilder};

/// The most token buckets one scope may have.
pub(crate) use quotas::MAX_TOKEN_BUCKETS;

/// A scope's identity: a 128-bit keyed hash of what the scope is keyed on (an authority, a
/// header value, a key a user function returned). The key itself never reaches a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScopeId(u128);

impl ScopeId {
    /// A scope id from its 128 bits.
    pub const fn from_u128(bits: u128) -> Self {
        ScopeId(bits)
    }

    /// The id's 128 bits.
    pub const fn as_u128(self) -> u128 {
        self.0
    }
}

/// One sliding-window quota: at most `limit` units in any window of length `window`; a send
/// stays counted for `window + guard` (the guard absorbs network latency).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WindowQuota {
    /// Units (see [`unit`](Self::unit)) admitted per window.
    pub limit: NonZeroU32,
    /// The window's length.
    pub window: Duration,
    /// Extra time a send stays counted past its window.
    pub guard: Duration,
    /// What one admission of cost `c` takes from this window. Default [`Unit::Cost`].
    pub unit: Unit,
}

impl WindowQuota {
    /// At most `limit` units in any `window`, each send counted for `window + guard`; a
    /// request takes its cost ([`Unit::Cost`]).
    pub const fn new(limit: NonZeroU32, window: Duration, guard: Duration) -> Self {
        Self {
            limit,
            window,
            guard,
            unit: Unit::Cost,
        }
    }

    /// This window, counting in `unit`.
    pub const fn with_unit(mut self, unit: Unit) -> Self {
        self.unit = unit;
        self
    }
}

/// What a sliding window counts. Token buckets always count [`Unit::Cost`].
///
/// An API that limits both requests and tokens per minute is paced by two windows over one
/// request's [`Cost`](crate::Cost) (its estimated tokens): one in [`Unit::Requests`], one in
/// [`Unit::Tokens`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Unit {
    /// A request takes its cost. The default.
    #[default]
    Cost,
    /// A request takes 1, whatever its cost (a request of cost 0 takes nothing). A cost never
    /// exceeds such a window: it is left out of [`Limits::smallest_quota`].
    Requests,
    /// A request takes its cost, read as tokens: like [`Unit::Cost`], and also lowered to an
    /// answer's report of tokens remaining ([`Settlement::tokens_remaining`]).
    Tokens,
}

impl Unit {
    /// What an admission of `cost` takes from a window counting in this unit.
    pub const fn charge(self, cost: u32) -> u32 {
        match self {
            Unit::Requests if cost > 0 => 1,
            Unit::Requests => 0,
            Unit::Cost | Unit::Tokens => cost,
        }
    }

    /// Whether a window in this unit counts the cost (and is settled).
    pub const fn counts_cost(self) -> bool {
        !matches!(self, Unit::Requests)
    }
}

/// What an answer says of an admitted request's true cost, given to [`Store::settle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Settlement {
    /// The request's true cost (e.g. the tokens the answer reports used), in units: each
    /// window that counts the cost ([`Unit::Cost`], [`Unit::Tokens`]) is charged the
    /// difference from the estimate (refunded when it is smaller), at the place of the
    /// original send; a token bucket is only charged more. `None`: the estimate stands.
    pub actual: Option<u32>,
    /// Tokens the server says remain (e.g. `x-ratelimit-remaining-tokens`): each
    /// [`Unit::Tokens`] window whose own remainder (limit − units counted) is larger is
    /// charged the difference. The server is the judge.
    pub tokens_remaining: Option<u64>,
}

impl Settlement {
    /// The request's true cost was `actual` units.
    pub const fn actual(actual: u32) -> Self {
        Self {
            actual: Some(actual),
            tokens_remaining: None,
        }
    }

    /// The server reports `remaining` tokens left.
    pub const fn tokens_remaining(remaining: u64) -> Self {
        Self {
            actual: None,
            tokens_remaining: Some(remaining),
        }
    }
}

/// One quota, named by its settings: what a
/// [`ThrottleError::CostExceedsQuota`](crate::ThrottleError::CostExceedsQuota) says a cost
/// exceeded. Its `Display` reads "sliding window of 120 per 60s" or "token bucket of burst
/// 10, one cell per 6s".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QuotaName {
    /// A sliding window ([`WindowQuota`]): at most `limit` units in any `window`.
    SlidingWindow {
        /// Units admitted per window.
        limit: u32,
        /// The window's length.
        window: Duration,
    },
    /// A token bucket (`governor`'s [`Quota`](governor::Quota)): up to `burst` units at once,
    /// one more every `replenish`.
    TokenBucket {
        /// The burst size: the most units the bucket holds.
        burst: u32,
        /// The time one unit takes to replenish.
        replenish: Duration,
    },
}

impl QuotaName {
    /// The most units the quota can ever admit at once: a sliding window's limit, a token
    /// bucket's burst.
    pub const fn capacity(&self) -> u32 {
        match *self {
            QuotaName::SlidingWindow { limit, .. } => limit,
            QuotaName::TokenBucket { burst, .. } => burst,
        }
    }
}

impl std::fmt::Display for QuotaName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QuotaName::SlidingWindow { limit, window } => {
                write!(f, "sliding window of {limit} per {window:?}")
            }
            QuotaName::TokenBucket { burst, replenish } => {
                write!(
                    f,
                    "token bucket of burst {burst}, one cell per {replenish:?}"
                )
            }
        }
    }
}

/// How much of one quota is taken now, from [`Store::usage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct QuotaUsage {
    /// The quota.
    pub quota: QuotaName,
    /// Units counted now: a sliding window's units still in the window, a token bucket's
    /// cells missing from its burst. At most the quota's
    /// [`capacity`](QuotaName::capacity) (a window whose limit was lowered may count more).
    pub used: u32,
}

impl QuotaUsage {
    /// `used` of `quota`'s capacity.
    pub const fn new(quota: QuotaName, used: u32) -> Self {
        Self { quota, used }
    }
}

/// The limits of one scope: what the configuration says, or (later) what was learned.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Limits {
    /// Requests in flight at once; `None`: no cap.
    pub max_in_flight: Option<usize>,
    /// Sliding-window quotas; every one must admit a request.
    pub windows: Vec<WindowQuota>,
    /// Token-bucket quotas (`governor`'s GCRA); every one must admit a request.
    pub buckets: Vec<governor::Quota>,
    /// The latency guard of the token buckets: each keeps this much of its tolerance (burst)
    /// in hand, so that sends paced exactly but arriving up to this much closer together
    /// still fit the server's bucket. Zero: none.
    pub bucket_guard: Duration,
}

impl Limits {
    /// No limit at all.
    pub fn new() -> Self {
        Self::default()
    }

    /// These limits with an in-flight cap of `n` requests (`None`: no cap).
    pub fn with_max_in_flight(mut self, n: Option<usize>) -> Self {
        self.max_in_flight = n;
        self
    }

    /// These limits with one more sliding window.
    pub fn with_window(mut self, window: WindowQuota) -> Self {
        self.windows.push(window);
        self
    }

    /// These limits with a latency guard of `guard` for their token buckets.
    pub fn with_bucket_guard(mut self, guard: Duration) -> Self {
        self.bucket_guard = guard;
        self
    }

    /// These limits with one more token bucket.
    pub fn with_bucket(mut self, quota: governor::Quota) -> Self {
        self.buckets.push(quota);
        self
    }

    /// The largest cost every quota can ever admit (in units), or `None` with no quota: the
    /// capacity of the [`smallest_quota`](Self::smallest_quota).
    pub fn capacity(&self) -> Option<u32> {
        self.smallest_quota().as_ref().map(QuotaName::capacity)
    }

    /// The quota with the smallest capacity (the first sliding window, then the first token
    /// bucket, among equals), or `None` with no quota: the one a cost too large exceeds.
    pub fn smallest_quota(&self) -> Option<QuotaName> {
        let w = self.windows.iter().filter(|w| w.unit.counts_cost());
        let w = w.map(|w| QuotaName::SlidingWindow {
            limit: w.limit.get(),
            window: w.window,
        });
        let b = self.buckets.iter().map(|q| QuotaName::TokenBucket {
            burst: q.burst_size().get(),
            replenish: q.replenish_interval(),
        });
        w.chain(b).min_by_key(QuotaName::capacity)
    }
}

/// A lease on an in-flight slot, named so that exactly that lease is released.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseId(pub u64);

/// A store's answer to one admission attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Admission {
    /// Admitted: the quotas are charged and the lease is held until released.
    Admitted(LeaseId),
    /// Not now: the scope's cooldown is closed for this long more; nothing was charged. It
    /// holds every request of the scope, whatever its cost.
    CoolingDown(Duration),
    /// Not now: a quota is full; nothing was charged. Worth trying again after this long. A
    /// request of cost 0 is never answered this.
    NotBefore(Duration),
    /// Every in-flight slot is leased; nothing was charged. Worth trying again when a lease is
    /// released.
    InFlightFull,
    /// The cost is larger than a quota can ever admit (its limit or burst, in units): waiting
    /// would never help.
    CostTooLarge {
        /// The most the smallest quota can admit at once, in units.
        capacity: u32,
        /// That quota ([`Limits::smallest_quota`]).
        quota: QuotaName,
    },
}

/// A store could not answer (a shared store's server unreachable, say).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rate-limit store unavailable: {message}")]
pub struct StoreError {
    message: String,
}

impl StoreError {
    /// An error with this description.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

/// The state a server counts, per scope: the cooldown, in-flight leases and quotas, checked
/// and charged all or nothing.
///
/// Implementations answer at once (no waiting inside: the engine waits), use their own clock,
/// and answer in durations. Every future must be cancel safe: dropped before it completes, it
/// has charged and leased nothing, or the store takes back what it took (a lease's expiry).
/// The in-memory store's futures are ready at once.
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// The store's handle on one scope, kept by the engine while the scope lives.
    type Scope: Send + Sync + std::fmt::Debug + 'static;

    /// Opens the state of scope `id` with `limits`.
    fn open(&self, id: ScopeId, limits: &Limits) -> Self::Scope;

    /// One admission attempt for a request of `cost` units, all or nothing: the cooldown is
    /// open, an in-flight slot is free (then leased), and every quota admits `cost` (then
    /// charged); otherwise nothing changes.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot answer.
    fn admit(
        &self,
        scope: &Self::Scope,
        cost: u32,
    ) -> impl Future<Output = Result<Admission, StoreError>> + Send;

    /// Releases `lease` (called once per admitted lease, from a destructor: must not block).
    fn release(&self, scope: &Self::Scope, lease: LeaseId);

    /// Closes the scope's cooldown for `wait` from now; a cooldown already closed for longer
    /// stays as it is.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot answer.
    fn close_cooldown(
        &self,
        scope: &Self::Scope,
        wait: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Replaces the scope's limits. Leases already held stay held (a smaller in-flight cap
    /// admits nothing until enough are released); sends already counted stay counted.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot answer.
    fn set_limits(
        &self,
        scope: &Self::Scope,
        limits: &Limits,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Replaces the scope's limits as [`set_limits`](Self::set_limits) does, and counts the
    /// requests sent at `sent` (instants, oldest first, one request each) in the sliding
    /// windows `limits` adds to the scope's (by position, past the windows it has; windows
    /// counting [`Unit::Tokens`] excepted), as far as they still fall in them. A window learned
    /// mid-run so starts with the sends already made rather than empty (which would admit a
    /// whole window's worth at once).
    ///
    /// The default ignores `sent`: added windows start empty.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot answer.
    fn set_limits_counting(
        &self,
        scope: &Self::Scope,
        limits: &Limits,
        sent: &[Instant],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = sent;
        self.set_limits(scope, limits)
    }

    /// Settles the charge made when `lease` was admitted, with what its answer says
    /// ([`Settlement`]). May come after the lease is released (a body read to its end). A
    /// charge settled with an `actual` cost is settled for good: settling it again changes
    /// nothing. A charge whose send has left every window, that the store no longer knows, or
    /// of an admission that charged no quota (cost 0) changes nothing either; for those
    /// `tokens_remaining` is still applied, at the present time rather than at the send's place.
    ///
    /// Rules (the conformance suite checks them):
    /// - a window is charged or refunded at the place of the original send, so the difference
    ///   leaves the window when that send does;
    /// - a refund is never larger than the charge (the estimate), nor than what the window
    ///   still counts of it;
    /// - an extra charge never takes a window past its limit (it is cut to the room left);
    /// - a token bucket is only charged more, never refunded (it keeps no record of when
    ///   cells were taken), and never past empty.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot answer.
    fn settle(
        &self,
        scope: &Self::Scope,
        lease: LeaseId,
        settlement: Settlement,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Whether the scope's state is what a fresh scope's would be (no lease held, cooldown open,
    /// every quota empty), so that forgetting it changes nothing.
    fn is_idle(&self, scope: &Self::Scope) -> bool;

    /// The scope's quota with the highest share of its capacity taken now, or `None` with no
    /// quota. Asked after an admission, for the capacity warnings, only while someone
    /// receives the throttle's events: it must answer at once (no I/O). The default answers
    /// `None` (a store that cannot tell without a round trip): only the in-flight cap is then
    /// warned about.
    fn usage(&self, scope: &Self::Scope) -> Option<QuotaUsage> {
        let _ = scope;
        None
    }

    /// How often a waiter for an in-flight slot should try again when no release is seen
    /// locally (leases held by other processes); `None` when every release is seen locally.
    fn in_flight_poll(&self) -> Option<Duration> {
        None
    }

    /// Completes when a lease of `scope` may have been released by another process, so that
    /// a waiter for an in-flight slot tries again at once (releases in this process wake it
    /// anyway). The default never completes: every release is seen locally.
    ///
    /// # Cancel safety
    /// Dropping the future loses nothing: the waiter makes a new one before it waits again.
    fn released_elsewhere(&self, scope: &Self::Scope) -> impl Future<Output = ()> + Send {
        let _ = scope;
        std::future::pending()
    }

    /// The key of the 128-bit SipHash that turns a scope's key into its [`ScopeId`], when
    /// every process using this store must name a scope alike (a shared store); `None`
    /// (the default): a fresh random key per throttle, so ids say nothing across processes.
    fn scope_hash_key(&self) -> Option<[u64; 2]> {
        None
    }
}
