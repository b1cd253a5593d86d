//! A window server's limit, learned from its first refusal from idle.
//!
//! A sliding-window server refuses once the window holds its limit, and reports when its
//! oldest send leaves (the reset). From idle the oldest is the scope's first send, so:
//! - the window's length is the time from the first send to the reset, as read when the
//!   refusal came (the server's window plus one round trip: the margin the local window needs
//!   between when this client sends and when the server counts);
//! - its limit is the number of sends admitted among those made before the refusal came, once
//!   every one of them is answered (a send still unanswered may yet be refused).
//!
//! The learned window paces the scope from then on, counting the sends already made (see
//! [`ScopeLearner`](super::ScopeLearner)), and is exported for warm starts.
//!
//! "From idle" is from the latest send that came after an idle time at least as long as the
//! window it would start (see [`RateModel::window_from`](super::rate::RateModel::window_from)):
//! a scope idle for a minute before a run learns the run's window, not one from its first
//! send a minute before. A scope that ran under the limit for longer than a window before its
//! first refusal (no such idle time) learns a longer window and a larger limit (its own average
//! rate, a larger burst); the server's refusals and resets still pace it.

use std::time::{Duration, Instant};

use super::LearnedWindow;

/// A refusal waiting for the sends made before it to be answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Candidate {
    /// Sends numbered below this were made before the refusal came.
    before: u64,
    /// When the server said its oldest send leaves.
    reset_at: Instant,
}

/// The window model of one scope.
#[derive(Debug, Default, Clone)]
pub(crate) struct WindowModel {
    candidate: Option<Candidate>,
    pub(crate) learned: Option<LearnedWindow>,
}

impl WindowModel {
    /// A window refusal answered at `now`, saying the limit resets `reset` later; `before`:
    /// the number the next send will have. Only the first refusal is kept.
    pub(crate) fn refused(&mut self, now: Instant, reset: Duration, before: u64) {
        if self.learned.is_some() || self.candidate.is_some() {
            return;
        }
        self.candidate = Some(Candidate {
            before,
            reset_at: now + reset,
        });
    }

    /// The sends numbered below the candidate's `before`, and when it said its oldest send
    /// leaves, when it waits for them.
    pub(crate) fn waiting_for(&self) -> Option<(u64, Instant)> {
        self.candidate.map(|c| (c.before, c.reset_at))
    }

    /// Learns the window from the candidate refusal, given `from`: the first send of the
    /// server's window and how many sends from it were admitted, every one of them answered
    /// (`None`: they are no longer known, and the candidate is dropped). Returns the window
    /// when it was learned now.
    pub(crate) fn settle(&mut self, from: Option<(Instant, u32)>) -> Option<LearnedWindow> {
        let candidate = self.candidate.take()?;
        let (first, admitted) = from?;
        let window = candidate.reset_at.saturating_duration_since(first);
        if admitted == 0 || window.is_zero() {
            return None;
        }
        let learned = LearnedWindow {
            limit: admitted,
            window,
        };
        self.learned = Some(learned);
        Some(learned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_and_window_from_the_first_refusal() {
        let t0 = Instant::now();
        let mut w = WindowModel::default();
        let answered = t0 + Duration::from_millis(300);
        w.refused(answered, Duration::from_millis(5_700), 125);
        let reset_at = t0 + Duration::from_secs(6);
        assert_eq!(w.waiting_for(), Some((125, reset_at)));
        // Later refusals teach nothing more.
        w.refused(answered, Duration::from_secs(1), 130);
        assert_eq!(w.waiting_for(), Some((125, reset_at)));
        let learned = w.settle(Some((t0, 120))).unwrap();
        assert_eq!(learned.limit, 120);
        assert_eq!(learned.window, Duration::from_secs(6));
        assert_eq!(w.learned, Some(learned));
        w.refused(answered, Duration::from_secs(1), 200);
        assert_eq!(w.waiting_for(), None);
    }

    #[test]
    fn nothing_without_an_admitted_send_or_a_known_log() {
        let t0 = Instant::now();
        let mut w = WindowModel::default();
        w.refused(t0, Duration::from_secs(6), 1);
        assert_eq!(w.settle(Some((t0, 0))), None);
        // The next refusal may teach.
        w.refused(t0, Duration::from_secs(6), 3);
        assert_eq!(w.settle(None), None);
        assert_eq!(w.learned, None);
    }
}
