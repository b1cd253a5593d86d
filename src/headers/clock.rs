//! Turning absolute times (epoch numbers, RFC 3339 stamps) into delays from `now`.
//!
//! A time in the past gives [`Duration::ZERO`] (the window already reset); a time
//! further away than [`MAX_HINT_DELAY`] gives [`MAX_HINT_DELAY`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::MAX_HINT_DELAY;

/// Time from `now` until `at`: zero if `at` is not after `now`, capped at [`MAX_HINT_DELAY`].
pub(super) fn until(now: SystemTime, at: SystemTime) -> Duration {
    at.duration_since(now)
        .unwrap_or(Duration::ZERO)
        .min(MAX_HINT_DELAY)
}

/// Time from `now` until the instant `since_epoch` after 1970-01-01T00:00:00Z.
/// An instant the platform clock cannot represent is far in the future: it saturates.
pub(super) fn until_epoch(now: SystemTime, since_epoch: Duration) -> Duration {
    match UNIX_EPOCH.checked_add(since_epoch) {
        Some(at) => until(now, at),
        None => MAX_HINT_DELAY,
    }
}

/// Time from `now` until an RFC 3339 timestamp such as `2025-01-20T10:30:00Z`
/// (parsed by [`jiff::Timestamp`], so an offset is required). `None` if it does not
/// parse, including times outside jiff's range (years -9999 to 9999).
pub(super) fn until_rfc3339(now: SystemTime, value: &str) -> Option<Duration> {
    let stamp: jiff::Timestamp = value.parse().ok()?;
    let at = SystemTime::try_from(stamp).ok()?;
    Some(until(now, at))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::test_support::now;

    #[test]
    fn rfc3339() {
        let cases = [
            ("2023-11-14T22:13:20Z", Some(Duration::ZERO)),
            ("2023-11-14T22:13:30Z", Some(Duration::from_secs(10))),
            ("2023-11-14T22:13:20.25Z", Some(Duration::from_millis(250))),
            ("2023-11-14T23:13:30+01:00", Some(Duration::from_secs(10))),
            ("2020-01-01T00:00:00Z", Some(Duration::ZERO)),
            ("9000-01-01T00:00:00Z", Some(MAX_HINT_DELAY)),
            // outside jiff's range (it ends late on 9999-12-30 UTC): not a time
            ("9999-12-31T23:59:59Z", None),
            ("2023-11-14T22:13:30", None),
            ("2023-11-14", None),
            ("1700000010", None),
            ("", None),
            ("soon", None),
        ];
        for (input, want) in cases {
            assert_eq!(until_rfc3339(now(), input), want, "{input:?}");
        }
    }

    #[test]
    fn epochs() {
        assert_eq!(
            until_epoch(now(), Duration::from_secs(1_700_000_030)),
            Duration::from_secs(30)
        );
        assert_eq!(until_epoch(now(), Duration::from_secs(1)), Duration::ZERO);
        assert_eq!(until_epoch(now(), Duration::MAX), MAX_HINT_DELAY);
    }
}
