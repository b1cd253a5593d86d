//! GitHub style `x-ratelimit-{limit,remaining,used,reset}` (no suffix).
//!
//! `x-ratelimit-reset` is read by the numeric-reset rule of [`super::clock`]: GitHub
//! sends epoch seconds, other APIs epoch milliseconds or seconds from now under the
//! same name, told apart by size.
//! When `remaining` is missing, it is derived as `limit - used` (if `used <= limit`).

use http::HeaderMap;

use super::{allowance, clock::Clock, field, number, Allowance};

/// The request allowance from the unsuffixed `x-ratelimit-*` headers.
pub(super) fn requests(headers: &HeaderMap, clock: &Clock) -> Option<Allowance> {
    let count = |name| field::single(headers, name).and_then(number::count);
    let limit = count("x-ratelimit-limit");
    let used = count("x-ratelimit-used");
    let remaining = count("x-ratelimit-remaining")
        .or_else(|| limit.zip(used).and_then(|(l, u)| l.checked_sub(u)));
    let reset = field::single(headers, "x-ratelimit-reset").and_then(|v| clock.numeric_reset(v));
    allowance(limit, remaining, reset)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::headers::test_support::{map, now, Pairs};

    fn a(limit: Option<u64>, remaining: Option<u64>, reset: Option<Duration>) -> Option<Allowance> {
        Some(Allowance::new(limit, remaining, reset))
    }

    #[test]
    fn github_family() {
        let s = |n| Some(Duration::from_secs(n));
        let cases: &[(Pairs, Option<Allowance>)] = &[
            (
                &[
                    ("x-ratelimit-limit", b"5000"),
                    ("x-ratelimit-remaining", b"4999"),
                    ("x-ratelimit-used", b"1"),
                    ("x-ratelimit-reset", b"1700000600"),
                ],
                a(Some(5000), Some(4999), s(600)),
            ),
            // the same header in each unit: epoch s, epoch ms, seconds from now
            (&[("x-ratelimit-reset", b"1700000002")], a(None, None, s(2))),
            (
                &[("x-ratelimit-reset", b"1700000002000")],
                a(None, None, s(2)),
            ),
            (&[("x-ratelimit-reset", b"2")], a(None, None, s(2))),
            (
                &[("x-ratelimit-reset", b"1700000000250")],
                a(None, None, Some(Duration::from_millis(250))),
            ),
            (&[("x-ratelimit-reset", b"60")], a(None, None, s(60))),
            // just past (at most 2 s): reset now
            (&[("x-ratelimit-reset", b"1699999999")], a(None, None, s(0))),
            (
                &[("x-ratelimit-reset", b"1699999999000")],
                a(None, None, s(0)),
            ),
            // implausible resets are no hint: stale, or beyond MAX_RESET_AHEAD
            (&[("x-ratelimit-reset", b"1699999997")], None),
            (&[("x-ratelimit-reset", b"1699999997000")], None),
            (&[("x-ratelimit-reset", b"1800000000")], None),
            (&[("x-ratelimit-reset", b"1800000000000")], None),
            (&[("x-ratelimit-reset", b"99999999")], None),
            (&[("x-ratelimit-reset", b"99999999999999999999")], None),
            (
                &[
                    ("x-ratelimit-limit", b"10"),
                    ("x-ratelimit-remaining", b"0"),
                    ("x-ratelimit-reset", b"1699999997"),
                ],
                a(Some(10), Some(0), None),
            ),
            // remaining derived from used
            (
                &[("x-ratelimit-limit", b"60"), ("x-ratelimit-used", b"45")],
                a(Some(60), Some(15), None),
            ),
            (
                &[("x-ratelimit-limit", b"60"), ("x-ratelimit-used", b"61")],
                a(Some(60), None, None),
            ),
            (
                &[
                    ("x-ratelimit-limit", b"60"),
                    ("x-ratelimit-remaining", b"70"),
                ],
                a(Some(60), None, None),
            ),
            // malformed
            (&[("x-ratelimit-reset", b"2023-11-14T22:23:20Z")], None),
            (&[("x-ratelimit-reset", b"-1700000600")], None),
            (
                &[
                    ("x-ratelimit-limit", b"-1"),
                    ("x-ratelimit-remaining", b"x"),
                ],
                None,
            ),
            (&[("x-ratelimit-used", b"5")], None),
            (&[("x-ratelimit-limit-requests", b"5")], None),
            (&[], None),
        ];
        for (pairs, want) in cases {
            assert_eq!(requests(&map(pairs), &Clock::at(now())), *want, "{pairs:?}");
        }
    }

    /// The `200` of the report: limit 10, none left, a reset in epoch milliseconds 2 s ahead.
    #[test]
    fn epoch_milliseconds_reset_is_two_seconds_away() {
        let h = map(&[
            ("x-ratelimit-limit", "10"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "1700000002000"),
        ]);
        let got = crate::headers::parse(&h, now()).requests;
        assert_eq!(got, a(Some(10), Some(0), Some(Duration::from_secs(2))));
    }

    /// Epoch resets are read against the server's clock when `Date` shows a skew.
    #[test]
    fn epoch_resets_under_clock_skew() {
        // (Date, reset on the server's clock 2 s after its Date)
        let cases = [
            ("Tue, 14 Nov 2023 22:13:23 GMT", "1700000005"), // server 3 s ahead
            ("Tue, 14 Nov 2023 23:13:20 GMT", "1700003602"), // server 1 h ahead
            ("Tue, 14 Nov 2023 22:13:17 GMT", "1699999999"), // server 3 s behind
            ("Tue, 14 Nov 2023 21:13:20 GMT", "1699996402"), // server 1 h behind
            ("Tue, 14 Nov 2023 21:13:20 GMT", "1699996402000"),
            ("Tue, 14 Nov 2023 22:13:21 GMT", "1700000003"), // 1 s: noise, no correction
        ];
        for (date, reset) in cases {
            let h = map(&[("date", date), ("x-ratelimit-reset", reset)]);
            let got = crate::headers::parse(&h, now()).requests;
            let want = if reset == "1700000003" { 3 } else { 2 };
            assert_eq!(
                got,
                a(None, None, Some(Duration::from_secs(want))),
                "{date} {reset}"
            );
        }
        // past on the server's clock: no hint, whatever the client's clock says
        let h = map(&[
            ("date", "Tue, 14 Nov 2023 23:13:20 GMT"),
            ("x-ratelimit-limit", "10"),
            ("x-ratelimit-reset", "1700000060"),
        ]);
        let got = crate::headers::parse(&h, now()).requests;
        assert_eq!(got, a(Some(10), None, None));
    }
}
