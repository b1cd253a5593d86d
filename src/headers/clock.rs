//! Turning reset times into delays from `now`: one rule for every family.
//!
//! * **Numeric resets** ([`Clock::numeric_reset`]) are read by plausibility, whatever
//!   the header: a value at or above [`EPOCH_MILLIS_THRESHOLD`] (10^12) is Unix epoch
//!   milliseconds, one at or above [`EPOCH_SECONDS_THRESHOLD`] (10^9) is Unix epoch
//!   seconds, anything smaller is seconds from now.
//! * **Absolute resets** (epoch numbers, RFC 3339 stamps) that are not after `now` are
//!   zero (the limit has reset: the answer spent that long in flight) when they are at most
//!   [`MAX_UNNOTICED_SKEW`] past, and no hint (`None`) when older: a stale time must not
//!   beat a relative `Retry-After`, and a reset just past must not let a `Retry-After` of a
//!   whole window (the gateway's) stand in for it.
//! * **Numeric resets** further ahead than [`MAX_RESET_AHEAD`] are no hint either: their
//!   unit is inferred, so such a value is a misreading, and it must never close a
//!   cooldown. An RFC 3339 stamp names its time unambiguously: a far one saturates at
//!   [`MAX_HINT_DELAY`] (and a throttle returns such an answer as too long a wait).
//! * **Clock skew.** When the answer's `Date` header (RFC 9110 §6.6.1) differs from
//!   `now` by more than [`MAX_UNNOTICED_SKEW`] (2 s; the header has 1 s resolution),
//!   absolute times are read against the server's clock: the delay is measured from the
//!   `Date` value rather than from `now`.
//! * `Retry-After` HTTP-dates ([`Clock::until`]) get the same skew correction but keep
//!   their own rule: a date in the past means zero, a far one saturates at
//!   [`MAX_HINT_DELAY`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderMap;

use super::{field, number, MAX_HINT_DELAY};

/// Numeric resets at or above this (10^12) are Unix epoch milliseconds
/// (10^12 ms is 2001-09-09; as seconds it would be the year 33658).
pub const EPOCH_MILLIS_THRESHOLD: u64 = 1_000_000_000_000;

/// Numeric resets at or above this (10^9) and below [`EPOCH_MILLIS_THRESHOLD`] are Unix epoch
/// seconds (10^9 s is 2001-09-09; as a delay it would be 31 years); smaller ones are seconds
/// from now.
pub const EPOCH_SECONDS_THRESHOLD: u64 = 1_000_000_000;

/// The furthest ahead a numeric reset may lie (366 days, as [`MAX_HINT_DELAY`]): one further
/// away is no hint, not a saturated one.
pub const MAX_RESET_AHEAD: Duration = MAX_HINT_DELAY;

/// The largest difference between the `Date` header and `now` taken as noise (2 s: the
/// header has 1 s resolution); a larger one is clock skew, and absolute times are read
/// against the server's clock.
pub const MAX_UNNOTICED_SKEW: Duration = Duration::from_secs(2);

/// The time against which absolute times of one answer are turned into delays: the
/// server's `Date` when it shows a clear skew from `now`, else `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Clock {
    /// "Now" on the server's clock (or the client's, if no clear skew was seen).
    now: SystemTime,
}

impl Clock {
    /// The clock for an answer received at `now` with `headers`.
    pub(super) fn new(headers: &HeaderMap, now: SystemTime) -> Self {
        let server = field::single(headers, "date")
            .and_then(|v| httpdate::parse_http_date(v).ok())
            .filter(|&date| {
                let skew = date
                    .duration_since(now)
                    .or_else(|_| now.duration_since(date))
                    .unwrap_or(Duration::ZERO);
                skew > MAX_UNNOTICED_SKEW
            });
        Clock {
            now: server.unwrap_or(now),
        }
    }

    /// A clock with no skew correction.
    #[cfg(test)]
    pub(super) fn at(now: SystemTime) -> Self {
        Clock { now }
    }

    /// Time until `at` (a `Retry-After` date): zero if not after now, capped at
    /// [`MAX_HINT_DELAY`].
    pub(super) fn until(&self, at: SystemTime) -> Duration {
        at.duration_since(self.now)
            .unwrap_or(Duration::ZERO)
            .min(MAX_HINT_DELAY)
    }

    /// Time until the absolute reset `at`: zero if it is at most [`MAX_UNNOTICED_SKEW`] past,
    /// `None` if older, else capped at [`MAX_HINT_DELAY`].
    fn reset_at(&self, at: SystemTime) -> Option<Duration> {
        self.ahead(at).map(|d| d.min(MAX_HINT_DELAY))
    }

    /// Time until the reset `since_epoch` after 1970-01-01T00:00:00Z: zero if it is at most
    /// [`MAX_UNNOTICED_SKEW`] past, `None` if older or further ahead than
    /// [`MAX_RESET_AHEAD`].
    fn reset_at_epoch(&self, since_epoch: Duration) -> Option<Duration> {
        let at = UNIX_EPOCH.checked_add(since_epoch)?;
        self.ahead(at).filter(|&d| d <= MAX_RESET_AHEAD)
    }

    /// Time from now until `at`: zero for a time at most [`MAX_UNNOTICED_SKEW`] past (just
    /// reset), `None` for an older one (stale).
    fn ahead(&self, at: SystemTime) -> Option<Duration> {
        match at.duration_since(self.now) {
            Ok(d) => Some(d),
            Err(past) => (past.duration() <= MAX_UNNOTICED_SKEW).then_some(Duration::ZERO),
        }
    }

    /// A reset given as an RFC 3339 timestamp such as `2025-01-20T10:30:00Z` (parsed by
    /// [`jiff::Timestamp`], so an offset is required): `None` if it does not parse or is
    /// not after now; a far one saturates at [`MAX_HINT_DELAY`].
    pub(super) fn rfc3339_reset(&self, value: &str) -> Option<Duration> {
        let stamp: jiff::Timestamp = value.parse().ok()?;
        self.reset_at(SystemTime::try_from(stamp).ok()?)
    }

    /// A numeric reset, `1*DIGIT [ "." 1*DIGIT ]`, read by plausibility (see the module
    /// docs): epoch milliseconds, epoch seconds or seconds from now. Fractions round UP to
    /// the next nanosecond.
    pub(super) fn numeric_reset(&self, value: &str) -> Option<Duration> {
        let (int, frac) = number::decimal(value)?;
        let whole = number::count(int)?;
        if whole >= EPOCH_SECONDS_THRESHOLD {
            let unit = if whole >= EPOCH_MILLIS_THRESHOLD {
                number::MILLIS
            } else {
                number::SECONDS
            };
            return self.reset_at_epoch(number::duration(number::nanos(int, frac, unit)));
        }
        let d = number::duration(number::nanos(int, frac, number::SECONDS));
        (d <= MAX_RESET_AHEAD).then_some(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::test_support::{map, now};

    fn s(n: u64) -> Option<Duration> {
        Some(Duration::from_secs(n))
    }

    #[test]
    fn rfc3339_resets() {
        let clock = Clock::at(now());
        let cases = [
            ("2023-11-14T22:13:30Z", s(10)),
            ("2023-11-14T22:13:20.25Z", Some(Duration::from_millis(250))),
            ("2023-11-14T23:13:30+01:00", s(10)),
            ("2024-11-14T22:13:20Z", s(366 * 86_400)),
            // an explicit far time saturates
            ("2024-11-14T22:13:21Z", Some(MAX_HINT_DELAY)),
            ("9000-01-01T00:00:00Z", Some(MAX_HINT_DELAY)),
            // just reset (at most 2 s past): zero; older: no hint
            ("2023-11-14T22:13:20Z", Some(Duration::ZERO)),
            ("2023-11-14T22:13:18Z", Some(Duration::ZERO)),
            ("2023-11-14T22:13:17Z", None),
            ("2020-01-01T00:00:00Z", None),
            // outside jiff's range (it ends late on 9999-12-30 UTC): not a time
            ("9999-12-31T23:59:59Z", None),
            ("2023-11-14T22:13:30", None),
            ("2023-11-14", None),
            ("1700000010", None),
            ("", None),
            ("soon", None),
        ];
        for (input, want) in cases {
            assert_eq!(clock.rfc3339_reset(input), want, "{input:?}");
        }
    }

    /// Epoch seconds, epoch milliseconds and seconds from now, each read by its size.
    #[test]
    fn numeric_resets_by_plausibility() {
        let clock = Clock::at(now());
        let ms = |n| Some(Duration::from_millis(n));
        let cases = [
            // epoch milliseconds (>= 10^12)
            ("1700000002000", s(2)),
            ("1700000000500", ms(500)),
            ("1700000002000.5", Some(Duration::new(2, 500_000))),
            ("1000000000000", None),
            ("1699999997000", None),
            ("1700000000000", s(0)),
            ("1699999998000", s(0)),
            ("1731622400000", s(366 * 86_400)),
            ("1731622400001", None),
            ("99999999999999999999999999", None),
            // epoch seconds (>= 10^9)
            ("1700000002", s(2)),
            ("1700000060.25", ms(60_250)),
            ("1000000000", None),
            ("1699999997", None),
            ("1700000000", s(0)),
            ("1699999998", s(0)),
            ("1731622400", s(366 * 86_400)),
            ("1731622401", None),
            ("999999999999", None),
            // seconds from now (< 10^9)
            ("2", s(2)),
            ("0", s(0)),
            ("1.5", ms(1_500)),
            ("0.0000000001", Some(Duration::from_nanos(1))),
            ("31622400", s(366 * 86_400)),
            ("31622401", None),
            ("999999999", None),
            // not numbers
            ("-2", None),
            ("1.7e9", None),
            ("2s", None),
            ("", None),
        ];
        for (input, want) in cases {
            assert_eq!(clock.numeric_reset(input), want, "{input:?}");
        }
    }

    #[test]
    fn thresholds_are_ordered() {
        const { assert!(EPOCH_SECONDS_THRESHOLD < EPOCH_MILLIS_THRESHOLD) };
        // A relative value just below the epoch threshold is already past the bound.
        assert!(Duration::from_secs(EPOCH_SECONDS_THRESHOLD) > MAX_RESET_AHEAD);
    }

    #[test]
    fn retry_after_dates() {
        let clock = Clock::at(now());
        let at = |secs| UNIX_EPOCH + Duration::from_secs(secs);
        assert_eq!(clock.until(at(1_700_000_030)), Duration::from_secs(30));
        assert_eq!(clock.until(at(1)), Duration::ZERO);
        assert_eq!(clock.until(at(u64::from(u32::MAX) * 8)), MAX_HINT_DELAY);
    }

    /// `Date` moves "now" to the server's clock only past [`MAX_UNNOTICED_SKEW`].
    #[test]
    fn date_skew() {
        let clock = |date: &str| Clock::new(&map(&[("date", date)]), now());
        let server = |secs| Clock::at(UNIX_EPOCH + Duration::from_secs(secs));
        // now() is Tue, 14 Nov 2023 22:13:20 GMT
        let cases = [
            ("Tue, 14 Nov 2023 22:13:20 GMT", Clock::at(now())),
            ("Tue, 14 Nov 2023 22:13:22 GMT", Clock::at(now())),
            ("Tue, 14 Nov 2023 22:13:18 GMT", Clock::at(now())),
            ("Tue, 14 Nov 2023 22:13:23 GMT", server(1_700_000_003)),
            ("Tue, 14 Nov 2023 22:13:17 GMT", server(1_699_999_997)),
            ("Tue, 14 Nov 2023 23:13:20 GMT", server(1_700_003_600)),
            ("Tue, 14 Nov 2023 21:13:20 GMT", server(1_699_996_400)),
            ("Tuesday, 14-Nov-23 23:13:20 GMT", server(1_700_003_600)),
            ("yesterday", Clock::at(now())),
            ("", Clock::at(now())),
        ];
        for (date, want) in cases {
            assert_eq!(clock(date), want, "{date:?}");
        }
        let two = map(&[
            ("date", "Tue, 14 Nov 2023 23:13:20 GMT"),
            ("date", "Tue, 14 Nov 2023 21:13:20 GMT"),
        ]);
        assert_eq!(
            Clock::new(&two, now()),
            Clock::at(now()),
            "conflicting lines"
        );
    }
}
