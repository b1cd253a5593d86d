//! A window server's limit, learned from its first refusal from idle: the requests sent before
//! the refused one and admitted are its limit, and the time from the first of them to the
//! reset it reported (from the refused send) is its window (a sliding window's oldest send
//! leaves it then).
//!
//! Learned for export and warm starts; during a run the refusal's reset closes the scope's
//! cooldown exactly, which a local window started empty mid-run could not improve on.

use std::time::{Duration, Instant};

use super::LearnedWindow;

/// The window model of one scope.
#[derive(Debug, Default, Clone)]
pub(crate) struct WindowModel {
    /// The first send of the scope (from idle).
    first: Option<Instant>,
    pub(crate) learned: Option<LearnedWindow>,
}

impl WindowModel {
    /// A send at `at` (only the first is kept).
    pub(crate) fn sent(&mut self, at: Instant) {
        self.first.get_or_insert(at);
    }

    /// A window refusal of a send made at `sent` after `admitted` admitted sends (or sends
    /// not answered yet), whose limit resets `reset` after it. Returns the window when this
    /// refusal taught it (the first one).
    pub(crate) fn refused(
        &mut self,
        reset: Duration,
        sent: Instant,
        admitted: u32,
    ) -> Option<LearnedWindow> {
        if self.learned.is_some() || admitted == 0 {
            return None;
        }
        let first = self.first?;
        let window = (sent + reset).saturating_duration_since(first);
        if window.is_zero() {
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
        w.sent(t0);
        let sent = t0 + Duration::from_millis(300);
        let learned = w.refused(Duration::from_millis(5_700), sent, 120).unwrap();
        assert_eq!(learned.limit, 120);
        assert_eq!(learned.window, Duration::from_secs(6));
        // Later refusals teach nothing more.
        assert_eq!(w.refused(Duration::from_secs(1), sent, 130), None);
    }

    #[test]
    fn nothing_without_an_admitted_send() {
        let t0 = Instant::now();
        let mut w = WindowModel::default();
        w.sent(t0);
        assert_eq!(w.refused(Duration::from_secs(6), t0, 0), None);
    }
}
