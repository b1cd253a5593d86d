//! Per-request settings (request extensions) and the per-response report.

use std::time::Duration;

use crate::clock::instant_after;
use crate::headers::Hints;
use crate::policy::StopReason;

/// How many quota units a request takes from every quota (default 1), set with
/// `RequestBuilder::with_extension(Cost(n))`.
///
/// For a quota that counts tokens, give the request's expected tokens. `Cost(0)` passes the
/// quotas without taking anything (it still takes an in-flight permit). A cost larger than a
/// quota can ever admit fails at once with
/// [`ThrottleError::CostExceedsQuota`](crate::ThrottleError::CostExceedsQuota) instead of
/// waiting forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cost(pub u32);

impl Default for Cost {
    fn default() -> Self {
        Cost(1)
    }
}

/// How urgent a request is, set with `RequestBuilder::with_extension(Priority::High)`
/// (default [`Priority::Normal`]).
///
/// Waiters of one scope are admitted highest priority first, first in first out within a
/// priority, at the in-flight cap and at the quotas alike. No request starves: one that has
/// waited longer than the aging bound
/// ([`priority_aging`](crate::ThrottleBuilder::priority_aging), 30 s by default) goes before
/// every request that arrived after it, whatever their priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[non_exhaustive]
pub enum Priority {
    /// Background work: goes when nothing more urgent waits.
    Low,
    /// The default.
    #[default]
    Normal,
    /// Ahead of normal work (e.g. a user waiting).
    High,
    /// Ahead of everything else.
    Critical,
}

impl Priority {
    /// The number of priority levels.
    pub(crate) const LANES: usize = 4;

    /// The lane of this priority: 0 for the lowest.
    pub(crate) fn lane(self) -> usize {
        self as usize
    }
}

/// Send this request once: no retry, whatever the answer. Set with
/// `RequestBuilder::with_extension(NoRetry)`. The request is still paced and counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NoRetry;

/// The instant by which this request must be done, set with
/// `RequestBuilder::with_extension(Deadline::after(d))`; overrides the builder's
/// [`deadline`](crate::ThrottleBuilder::deadline). The whole call, waits and request time
/// included, ends by then: a wait that would end later is not started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Deadline(pub tokio::time::Instant);

impl Deadline {
    /// A deadline `d` from now (by the tokio clock). A `d` longer than 100 years (e.g.
    /// `Duration::MAX`) gives a deadline 100 years away.
    pub fn after(d: Duration) -> Self {
        Deadline(instant_after(tokio::time::Instant::now(), d))
    }
}

/// The time a request waited in the throttle, by cause: what held it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Waits {
    /// Behind other callers of its scope (higher priority, or earlier).
    pub queue: Duration,
    /// For the scope's shared cooldown (after a window-type 429, or 0 requests remaining).
    pub cooldown: Duration,
    /// For a quota (a sliding window or token bucket) to have room.
    pub quota: Duration,
    /// For an in-flight slot.
    pub in_flight: Duration,
    /// Between attempts, before a retry.
    pub retry: Duration,
}

impl Waits {
    /// The whole time waited.
    pub fn total(&self) -> Duration {
        self.queue + self.cooldown + self.quota + self.in_flight + self.retry
    }
}

/// What the throttle did for a request, in the extensions of every response it returns
/// (`response.extensions().get::<ThrottleInfo>()`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ThrottleInfo {
    /// Attempts made, the returned one included (1 when no retry was needed).
    pub attempts: u32,
    /// Time spent waiting in the throttle: for the cooldown, an in-flight slot, the quotas,
    /// other callers, and between attempts (`waits.total()`). Request time is not included.
    pub waited: Duration,
    /// The same time by cause.
    pub waits: Waits,
    /// The rate-limit hints of the returned response.
    pub hints: Hints,
    /// Why the response was returned although it asked for a retry or was a recognised final
    /// refusal; `None` when it was an ordinary answer.
    pub stopped: Option<StopReason>,
    /// The shared cooldown this response closed for its scope: every caller of the scope
    /// waits this long (from when the response arrived) before its next send. `None` when it
    /// closed none, which includes a wait longer than
    /// [`max_server_wait`](crate::ThrottleBuilder::max_server_wait): no caller is held that
    /// long; each goes and receives the server's own answer.
    pub cooldown: Option<Duration>,
}
