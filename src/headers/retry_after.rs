//! `Retry-After` (RFC 9110 §10.2.3) and the `retry-after-ms` extension.
//!
//! * `Retry-After` is delay-seconds (`1*DIGIT`) or an HTTP-date in any of the three
//!   forms RFC 9110 §5.6.7 requires recipients to accept (IMF-fixdate, RFC 850,
//!   asctime; parsed by [`httpdate`]). A date not after `now` means zero; a date is
//!   read against the server's clock when `Date` shows a skew (see [`super::clock`]).
//!   As an extension, a decimal fraction such as `1.5` is accepted and rounded UP to
//!   the next whole millisecond, so a hint never asks for less than the server said.
//!   Signs, exponents, words and empty values are rejected; values beyond
//!   [`MAX_HINT_DELAY`](super::MAX_HINT_DELAY) saturate there.
//! * `retry-after-ms` carries (possibly fractional) milliseconds with the same
//!   decimal grammar, also rounded UP to a whole millisecond. When it is valid it
//!   wins over `Retry-After`, being the more precise of the two.

use std::time::Duration;

use http::HeaderMap;

use super::{clock::Clock, field, number};

/// The wait the server asked for, from `retry-after-ms` or else `Retry-After`.
pub(super) fn read(headers: &HeaderMap, clock: &Clock) -> Option<Duration> {
    field::single(headers, "retry-after-ms")
        .and_then(milliseconds)
        .or_else(|| field::single(headers, "retry-after").and_then(|v| retry_after(v, clock)))
}

/// One `retry-after-ms` value.
fn milliseconds(value: &str) -> Option<Duration> {
    let (int, frac) = number::decimal(value)?;
    Some(number::delay(
        number::nanos(int, frac, number::MILLIS),
        number::MILLIS,
    ))
}

/// One `Retry-After` value.
fn retry_after(value: &str, clock: &Clock) -> Option<Duration> {
    if let Some((int, frac)) = number::decimal(value) {
        return Some(number::delay(
            number::nanos(int, frac, number::SECONDS),
            number::MILLIS,
        ));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(clock.until(at))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::test_support::{map, now, Pairs};
    use crate::headers::MAX_HINT_DELAY;

    fn secs(s: u64) -> Option<Duration> {
        Some(Duration::from_secs(s))
    }

    #[test]
    fn retry_after_values() {
        let cases: &[(&[u8], Option<Duration>)] = &[
            // delay-seconds
            (b"12", secs(12)),
            (b"0", secs(0)),
            (b"  60\t", secs(60)),
            (b"0012", secs(12)),
            (b"1.5", Some(Duration::from_millis(1500))),
            (b"0.0001", Some(Duration::from_millis(1))),
            (b"2.0011", Some(Duration::from_millis(2002))),
            (b"31622400", Some(MAX_HINT_DELAY)),
            (b"31622401", Some(MAX_HINT_DELAY)),
            (b"99999999999999999999999", Some(MAX_HINT_DELAY)),
            // HTTP-dates: IMF-fixdate, RFC 850, asctime; now() is 2023-11-14T22:13:20Z
            (b"Tue, 14 Nov 2023 22:13:50 GMT", secs(30)),
            (b"Tuesday, 14-Nov-23 22:13:50 GMT", secs(30)),
            (b"Tue Nov 14 22:13:50 2023", secs(30)),
            (b"Tue, 14 Nov 2023 22:13:20 GMT", secs(0)),
            (b"Sun, 06 Nov 1994 08:49:37 GMT", secs(0)),
            (b"Fri, 31 Dec 9999 23:59:59 GMT", Some(MAX_HINT_DELAY)),
            // malformed
            (b"", None),
            (b"   ", None),
            (b"-1", None),
            (b"+5", None),
            (b"1e3", None),
            (b"5s", None),
            (b"five", None),
            (b".5", None),
            (b"5.", None),
            (b"1,2", None),
            (b"NaN", None),
            (b"inf", None),
            (b"Tue, 14 Nov 2023 22:13:50", None),
            (b"2023-11-14T22:13:50Z", None),
            (b"1\xc2\xb2", None),
        ];
        for (value, want) in cases {
            let h = map(&[("retry-after", value)]);
            assert_eq!(
                read(&h, &Clock::at(now())),
                *want,
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
    }

    #[test]
    fn retry_after_ms_values() {
        let cases: &[(Pairs, Option<Duration>)] = &[
            (
                &[("retry-after-ms", b"250")],
                Some(Duration::from_millis(250)),
            ),
            (&[("retry-after-ms", b"0")], Some(Duration::ZERO)),
            (
                &[("retry-after-ms", b"1.2")],
                Some(Duration::from_millis(2)),
            ),
            (
                &[("retry-after-ms", b"99999999999999999999999")],
                Some(MAX_HINT_DELAY),
            ),
            // takes precedence over Retry-After when valid
            (
                &[("retry-after-ms", b"250"), ("retry-after", b"10")],
                Some(Duration::from_millis(250)),
            ),
            // falls back to Retry-After when malformed
            (
                &[("retry-after-ms", b"-5"), ("retry-after", b"10")],
                secs(10),
            ),
            (&[("retry-after-ms", b""), ("retry-after", b"10")], secs(10)),
            (&[("retry-after-ms", b"1e3")], None),
            (&[("retry-after-ms", b"soon")], None),
            // conflicting duplicate lines are ambiguous, identical ones are fine
            (&[("retry-after", b"10"), ("retry-after", b"20")], None),
            (&[("retry-after", b"10"), ("retry-after", b"10")], secs(10)),
            (&[], None),
        ];
        for (pairs, want) in cases {
            assert_eq!(read(&map(pairs), &Clock::at(now())), *want, "{pairs:?}");
        }
    }

    /// An HTTP-date is read against the server's clock when `Date` shows a clear skew;
    /// delay-seconds are relative and never corrected.
    #[test]
    fn dates_under_clock_skew() {
        let cases = [
            (
                "Tue, 14 Nov 2023 23:13:20 GMT",
                "Tue, 14 Nov 2023 23:13:50 GMT",
                30,
            ),
            (
                "Tue, 14 Nov 2023 21:13:20 GMT",
                "Tue, 14 Nov 2023 21:13:50 GMT",
                30,
            ),
            (
                "Tue, 14 Nov 2023 22:13:21 GMT",
                "Tue, 14 Nov 2023 22:13:50 GMT",
                30,
            ),
            ("Tue, 14 Nov 2023 23:13:20 GMT", "30", 30),
        ];
        for (date, value, want) in cases {
            let h = map(&[("date", date), ("retry-after", value)]);
            let got = read(&h, &Clock::new(&h, now()));
            assert_eq!(got, secs(want), "{date} {value}");
        }
    }
}
