//! The resolution of a reported reset time.
//!
//! Servers that report a reset as whole epoch seconds (`X-RateLimit-Reset: 1700000060`) or
//! as an RFC 3339 time to the second round it up: the true reset lies up to 1 s before the
//! stated one. A pause on `remaining: 0` that waits for the stated second waits up to 1 s
//! too long at every window. The earliest the reset can be is 1 s before; the scope's
//! quotas (configured or learned) and the server's own refusal cover the rest.

use std::time::{Duration, SystemTime};

/// The resolution assumed for a reset that falls on a whole second.
const COARSE: Duration = Duration::from_secs(1);

/// The earliest a reset reported as `reset_after` from `now` (the wall-clock time the hints
/// were read at) can be: 1 s earlier when it falls on a whole second (a reset rounded up to
/// its second), else as reported.
pub(crate) fn earliest(reset_after: Duration, now: SystemTime) -> Duration {
    let at = now.checked_add(reset_after);
    let whole = at
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .is_some_and(|d| d.subsec_nanos() == 0);
    if whole {
        reset_after.saturating_sub(COARSE)
    } else {
        reset_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_second_resets_may_be_a_second_early() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_250);
        // Reset at ...:01.000, stated in whole seconds.
        let whole = Duration::from_millis(750);
        assert_eq!(earliest(whole, now), Duration::ZERO);
        let whole = Duration::from_millis(1_750);
        assert_eq!(earliest(whole, now), Duration::from_millis(750));
        // A reset to the millisecond is taken as it is.
        let exact = Duration::from_millis(1_751);
        assert_eq!(earliest(exact, now), exact);
    }
}
