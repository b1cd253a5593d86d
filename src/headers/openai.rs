//! OpenAI style `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`.
//!
//! Limits and remainders are counts (`1*DIGIT`); resets are Go duration strings
//! relative to the response (`6m0s`, `20ms`), read by [`super::duration`]. A bare
//! number (no unit) is read by the numeric-reset rule of [`super::clock`]: epoch
//! milliseconds, epoch seconds or seconds from now, by its size. A negative reset is
//! unknown.

use http::HeaderMap;

use super::{allowance, clock::Clock, duration, field, number, Allowance};

/// The request allowance (`x-ratelimit-*-requests`).
pub(super) fn requests(headers: &HeaderMap, clock: &Clock) -> Option<Allowance> {
    family(
        headers,
        clock,
        [
            "x-ratelimit-limit-requests",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
        ],
    )
}

/// The token allowance (`x-ratelimit-*-tokens`).
pub(super) fn tokens(headers: &HeaderMap, clock: &Clock) -> Option<Allowance> {
    family(
        headers,
        clock,
        [
            "x-ratelimit-limit-tokens",
            "x-ratelimit-remaining-tokens",
            "x-ratelimit-reset-tokens",
        ],
    )
}

fn family(
    headers: &HeaderMap,
    clock: &Clock,
    [limit, remaining, reset]: [&str; 3],
) -> Option<Allowance> {
    let reset = field::single_utf8(headers, reset).and_then(|v| {
        if number::decimal(v).is_some() {
            clock.numeric_reset(v)
        } else {
            duration::parse(v)
        }
    });
    allowance(
        field::single(headers, limit).and_then(number::count),
        field::single(headers, remaining).and_then(number::count),
        reset,
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::headers::test_support::{map, now, Pairs};

    fn a(limit: Option<u64>, remaining: Option<u64>, reset_ms: Option<u64>) -> Option<Allowance> {
        Some(Allowance::new(
            limit,
            remaining,
            reset_ms.map(Duration::from_millis),
        ))
    }

    #[test]
    fn requests_family() {
        let cases: &[(Pairs, Option<Allowance>)] = &[
            (
                &[
                    ("x-ratelimit-limit-requests", b"60"),
                    ("x-ratelimit-remaining-requests", b"59"),
                    ("x-ratelimit-reset-requests", b"1s"),
                ],
                a(Some(60), Some(59), Some(1_000)),
            ),
            (
                &[("x-ratelimit-reset-requests", b"6m0s")],
                a(None, None, Some(360_000)),
            ),
            (
                &[("x-ratelimit-reset-requests", b"500\xc2\xb5s")],
                Some(Allowance::new(None, None, Some(Duration::from_micros(500)))),
            ),
            // a bare number: seconds from now, epoch seconds or epoch milliseconds
            (
                &[("x-ratelimit-reset-requests", b"17")],
                a(None, None, Some(17_000)),
            ),
            (
                &[("x-ratelimit-reset-requests", b"1.5")],
                a(None, None, Some(1_500)),
            ),
            (
                &[("x-ratelimit-reset-requests", b"1700000002")],
                a(None, None, Some(2_000)),
            ),
            (
                &[("x-ratelimit-reset-requests", b"1700000002000")],
                a(None, None, Some(2_000)),
            ),
            // implausible bare numbers are no hint: in the past, or too far ahead
            (&[("x-ratelimit-reset-requests", b"1699999997")], None),
            (&[("x-ratelimit-reset-requests", b"1699999997000")], None),
            (&[("x-ratelimit-reset-requests", b"1800000000")], None),
            (&[("x-ratelimit-reset-requests", b"99999999")], None),
            // negative reset is unknown; the other fields still count
            (
                &[
                    ("x-ratelimit-limit-requests", b"60"),
                    ("x-ratelimit-reset-requests", b"-1s"),
                ],
                a(Some(60), None, None),
            ),
            // remaining above limit is nonsense: dropped
            (
                &[
                    ("x-ratelimit-limit-requests", b"60"),
                    ("x-ratelimit-remaining-requests", b"61"),
                ],
                a(Some(60), None, None),
            ),
            (
                &[
                    ("x-ratelimit-limit-requests", b"60"),
                    ("x-ratelimit-remaining-requests", b"60"),
                ],
                a(Some(60), Some(60), None),
            ),
            // malformed values are "no hint" for that field
            (
                &[
                    ("x-ratelimit-limit-requests", b"sixty"),
                    ("x-ratelimit-remaining-requests", b"-3"),
                    ("x-ratelimit-reset-requests", b"soon"),
                ],
                None,
            ),
            (&[("x-ratelimit-limit-requests", b"1.5")], None),
            (&[("x-ratelimit-reset-requests", b"")], None),
            (&[("x-ratelimit-limit-tokens", b"100")], None),
            (&[], None),
        ];
        for (pairs, want) in cases {
            assert_eq!(requests(&map(pairs), &Clock::at(now())), *want, "{pairs:?}");
        }
    }

    #[test]
    fn tokens_family() {
        let cases: &[(Pairs, Option<Allowance>)] = &[
            (
                &[
                    ("x-ratelimit-limit-tokens", b"150000"),
                    ("x-ratelimit-remaining-tokens", b"149984"),
                    ("x-ratelimit-reset-tokens", b"6ms"),
                ],
                a(Some(150_000), Some(149_984), Some(6)),
            ),
            (
                &[("x-ratelimit-reset-tokens", b"1h2m3.5s")],
                a(None, None, Some(3_723_500)),
            ),
            (&[("x-ratelimit-reset-tokens", b"1d")], None),
            (&[("x-ratelimit-limit-requests", b"100")], None),
        ];
        for (pairs, want) in cases {
            assert_eq!(tokens(&map(pairs), &Clock::at(now())), *want, "{pairs:?}");
        }
    }
}
