//! Limits learned from the server's answers, and a circuit breaker, per scope.
//!
//! Fed by the middleware after it has read an answer's hints (one [`Answer`] per attempt);
//! what it learns is applied through the scope's resizable limits. Every estimator here is
//! pure: instants and durations in, decisions out, no clock read and no I/O.
//!
//! - [`rate`]: the rate and burst of a server's token bucket, from which sends it refused;
//! - [`aimd`]: the in-flight cap, from parallel-limit refusals;
//! - [`pace`]: a pace from the server's remaining and reset;
//! - [`window`]: a window server's limit and window length, from a refusal's reset time;
//! - [`breaker`]: the circuit breaker;
//! - [`reset`]: the resolution of reported reset times.

pub(crate) mod aimd;
pub(crate) mod breaker;
pub(crate) mod pace;
pub(crate) mod rate;
pub(crate) mod reset;
mod scope;
pub(crate) mod window;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

pub(crate) use breaker::Change as CircuitChange;
pub use breaker::{
    CircuitBreaker, CircuitState, DEFAULT_BREAKER_FAILURES, DEFAULT_BREAKER_OPEN_FOR,
};
pub(crate) use scope::{Answer, InForce, ScopeLearner};

use crate::store::Limits;
use crate::sync::lock;

/// Default clean time after which a learned pace is raised by 10 % to probe for more: 30 s.
pub const DEFAULT_PROBE_AFTER: Duration = Duration::from_secs(30);

/// What a throttle has learned of one scope's limits, from
/// [`Throttle::learned`](crate::Throttle::learned); loaded back with
/// [`Throttle::load_learned`](crate::Throttle::load_learned) for a warm start. With the
/// `serde` feature it serializes (durations as serde writes them: seconds and nanoseconds).
#[derive(Debug, Clone, PartialEq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct LearnedLimits {
    /// The scope's label (as in [`ScopeStats::label`](crate::ScopeStats::label)): what a
    /// warm start matches scopes by.
    pub scope: String,
    /// The pace, in requests per second: just under the server's learned rate once the
    /// estimate is pinned (the pace in force may be probing above it), else the pace in force
    /// (a guess). `None`: no rate learned.
    pub rate: Option<f64>,
    /// The burst of that pace: requests that may go at once after an idle time.
    pub burst: Option<u32>,
    /// A window server's learned limit, if it is one.
    pub window: Option<LearnedWindow>,
    /// The in-flight cap in force (learned from parallel-limit refusals; at most the
    /// configured `max_in_flight`). `None`: no cap.
    pub max_in_flight: Option<usize>,
    /// How sure the rate is, from 0 (a guess) to 1 (pinned exactly): the ratio of the lowest
    /// to the highest rate that explains the sends seen equally well.
    pub confidence: f64,
    /// Refusal episodes seen (refusals of sends made together count once).
    pub episodes: u32,
}

/// A window server's limit, as learned: at most `limit` requests in any `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct LearnedWindow {
    /// Requests admitted per window.
    pub limit: u32,
    /// The window's length.
    pub window: Duration,
}

impl LearnedWindow {
    /// At most `limit` requests in any `window` (for a warm start written by hand; a limit of
    /// 0 or a zero window is ignored when loaded).
    pub const fn new(limit: u32, window: Duration) -> Self {
        Self { limit, window }
    }
}

/// What to do with a rate-limit refusal's `Retry-After` when the rate has been learned; for
/// [`ThrottleBuilder::retry_after_policy`](crate::ThrottleBuilder::retry_after_policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RetryAfterPolicy {
    /// The refusal's `Retry-After` closes the scope's cooldown for that long (the default).
    #[default]
    Strict,
    /// When the learned rate is pinned and the `Retry-After` is coarse (at least 1 s, and
    /// over 10 times the learned interval between sends), the scope reopens when the model
    /// says the server has room again (one interval); the refused request itself still waits
    /// its `Retry-After`.
    Learned,
}

/// The learning settings of one throttle, shared by its scopes.
#[derive(Debug)]
pub(crate) struct LearnConfig {
    /// Whether rates, windows and in-flight caps are learned.
    pub(crate) learn: bool,
    pub(crate) breaker: Option<CircuitBreaker>,
    pub(crate) retry_after: RetryAfterPolicy,
    pub(crate) probe_after: Duration,
    /// The longest server wait the throttle honours (`max_server_wait`): a window refusal
    /// whose reset is further ahead teaches no window (a window the throttle would not wait
    /// for, from a reset that is most likely a lie or a misreading).
    pub(crate) max_wait: Duration,
    /// Limits loaded for a warm start, by scope label.
    warm: Mutex<HashMap<String, LearnedLimits>>,
}

impl LearnConfig {
    pub(crate) fn new(
        learn: bool,
        breaker: Option<CircuitBreaker>,
        retry_after: RetryAfterPolicy,
        probe_after: Duration,
    ) -> Self {
        Self {
            learn,
            breaker,
            retry_after,
            probe_after,
            max_wait: crate::DEFAULT_MAX_SERVER_WAIT,
            warm: Mutex::default(),
        }
    }

    /// Nothing learned, no circuit breaker.
    #[cfg(test)]
    pub(crate) fn off() -> Self {
        Self::new(false, None, RetryAfterPolicy::Strict, DEFAULT_PROBE_AFTER)
    }

    /// The learner of a new scope `label` whose configured limits are `base`.
    pub(crate) fn scope(&self, label: &str, base: &Limits) -> ScopeLearner {
        let warm = lock(&self.warm).get(label).cloned();
        ScopeLearner::new(self, base.clone(), warm.as_ref())
    }

    /// Keeps `limits` for the scopes opened from now on.
    pub(crate) fn load(&self, limits: impl IntoIterator<Item = LearnedLimits>) {
        let mut warm = lock(&self.warm);
        for l in limits {
            warm.insert(l.scope.clone(), l);
        }
    }
}
