//! What the Redis store does while Redis does not answer: the failure policy, a backoff
//! before Redis is asked again, the error count, and a warning at a bounded rate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::sync::lock;

/// What admission does while Redis is unreachable (an error, or no answer within the
/// store's timeout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnUnavailable {
    /// Each process admits by its own limits (the same quotas, cap and cooldown, counted
    /// locally) until Redis answers again. Nothing is lost: a fleet of N processes may then
    /// send up to N × the limits, and the `429` handling absorbs the excess.
    #[default]
    LocalLimits,
    /// Admit every request at once, counting nothing (the server's `429`s then pace).
    FailOpen,
    /// Refuse: the call fails with
    /// [`ThrottleError::StoreUnavailable`](crate::ThrottleError::StoreUnavailable).
    FailClosed,
}

/// The first pause before Redis is asked again after a failure; it doubles per failure in a
/// row, up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause before Redis is asked again.
const MAX_PAUSE: Duration = Duration::from_secs(5);
/// At most one warning per this long; the others are counted into the next.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Failures of one store, shared by its scopes.
#[derive(Debug, Default)]
pub(super) struct Health {
    errors: AtomicU64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Redis is not asked before this instant.
    down_until: Option<Instant>,
    /// Failures in a row.
    streak: u32,
    last_log: Option<Instant>,
    unlogged: u64,
    /// What the last failure said.
    last_error: String,
}

impl Health {
    /// Whether Redis may be asked now (not within the pause after a failure).
    pub(super) fn may_ask(&self, now: Instant) -> bool {
        lock(&self.state).down_until.is_none_or(|u| u <= now)
    }

    /// Redis answered.
    pub(super) fn succeeded(&self) {
        let mut s = lock(&self.state);
        if s.streak > 0 {
            tracing::info!(
                failures = s.streak,
                "reqwest-throttle: Redis answers again; shared limits resume"
            );
        }
        s.streak = 0;
        s.down_until = None;
    }

    /// Redis failed (`what` says how): counted, Redis left alone for a pause that doubles
    /// per failure in a row, and a warning logged at most once per [`LOG_EVERY`].
    pub(super) fn failed(&self, what: &dyn std::fmt::Display, now: Instant) {
        let mut s = lock(&self.state);
        s.streak = s.streak.saturating_add(1);
        let pause = FIRST_PAUSE
            .saturating_mul(1 << s.streak.saturating_sub(1).min(16))
            .min(MAX_PAUSE);
        s.down_until = Some(now + pause);
        self.note(&mut s, what, now, Some(pause));
    }

    /// Redis answered with an error of one scope's script (a key holding something
    /// unexpected): counted and logged as [`failed`](Self::failed), but Redis is not left
    /// alone: the other scopes' admissions go on.
    pub(super) fn script_failed(&self, what: &dyn std::fmt::Display, now: Instant) {
        let mut s = lock(&self.state);
        self.note(&mut s, what, now, None);
    }

    /// Counts a failure and logs it, at most once per [`LOG_EVERY`].
    fn note(
        &self,
        s: &mut State,
        what: &dyn std::fmt::Display,
        now: Instant,
        pause: Option<Duration>,
    ) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        s.last_error = what.to_string();
        if s.last_log
            .is_some_and(|t| now.saturating_duration_since(t) < LOG_EVERY)
        {
            s.unlogged += 1;
            return;
        }
        tracing::warn!(
            error = %what,
            failures_in_a_row = s.streak,
            not_logged_since_last = s.unlogged,
            retry_in_ms = pause.map_or(0, |p| p.as_millis() as u64),
            "reqwest-throttle: Redis store unavailable"
        );
        s.last_log = Some(now);
        s.unlogged = 0;
    }

    /// The error a refused caller gets (under [`OnUnavailable::FailClosed`]): what the last
    /// failure said.
    pub(super) fn error(&self) -> crate::store::StoreError {
        let s = lock(&self.state);
        crate::store::StoreError::new(format!("Redis unavailable: {}", s.last_error))
    }

    /// Failures so far.
    pub(super) fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_failure_pauses_asking_and_the_pause_doubles_up_to_the_cap() {
        let h = Health::default();
        let t0 = Instant::now();
        assert!(h.may_ask(t0));
        h.failed(&"refused", t0);
        assert!(!h.may_ask(t0 + Duration::from_millis(99)));
        assert!(h.may_ask(t0 + Duration::from_millis(100)));
        h.failed(&"refused", t0);
        assert!(!h.may_ask(t0 + Duration::from_millis(199)));
        assert!(h.may_ask(t0 + Duration::from_millis(200)));
        for _ in 0..40 {
            h.failed(&"refused", t0);
        }
        assert!(!h.may_ask(t0 + MAX_PAUSE - Duration::from_millis(1)));
        assert!(h.may_ask(t0 + MAX_PAUSE));
        assert_eq!(h.errors(), 42);
        h.succeeded();
        assert!(h.may_ask(t0));
    }
}
