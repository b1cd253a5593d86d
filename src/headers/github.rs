//! GitHub style `x-ratelimit-{limit,remaining,used,reset}` (no suffix).
//!
//! `x-ratelimit-reset` is an absolute Unix time in whole seconds, never a delay.
//! When `remaining` is missing, it is derived as `limit - used` (if `used <= limit`).

use std::time::{Duration, SystemTime};

use http::HeaderMap;

use super::{allowance, clock, field, number, Allowance};

/// The request allowance from the unsuffixed `x-ratelimit-*` headers.
pub(super) fn requests(headers: &HeaderMap, now: SystemTime) -> Option<Allowance> {
    let count = |name| field::single(headers, name).and_then(number::count);
    let limit = count("x-ratelimit-limit");
    let used = count("x-ratelimit-used");
    let remaining = count("x-ratelimit-remaining")
        .or_else(|| limit.zip(used).and_then(|(l, u)| l.checked_sub(u)));
    let reset =
        count("x-ratelimit-reset").map(|epoch| clock::until_epoch(now, Duration::from_secs(epoch)));
    allowance(limit, remaining, reset)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::test_support::{map, now, Pairs};
    use crate::headers::MAX_HINT_DELAY;

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
            // reset is an epoch, never a delay: a small number is long past
            (&[("x-ratelimit-reset", b"60")], a(None, None, s(0))),
            (&[("x-ratelimit-reset", b"1699999999")], a(None, None, s(0))),
            (
                &[("x-ratelimit-reset", b"99999999999999999999")],
                a(None, None, Some(MAX_HINT_DELAY)),
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
            (&[("x-ratelimit-reset", b"1700000600.5")], None),
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
            assert_eq!(requests(&map(pairs), now()), *want, "{pairs:?}");
        }
    }
}
