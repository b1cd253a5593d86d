//! IETF `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11).
//!
//! Both are Structured Field lists (see [`super::sfv`]); every line of a field is
//! joined with `", "` first. A policy item is a name (string, or token as older
//! drafts sent) with `q` (quota), optional `qu` (quota unit) and `w` (window
//! seconds). A `RateLimit` item names its policy and carries `r` (remaining quota)
//! and `t` (seconds until the quota resets).
//!
//! Mapping to a request [`Allowance`]:
//!
//! * Only request quotas count: a policy whose `qu` is present and is not
//!   `"request"` (e.g. `"content-bytes"`, `"concurrency"`) is skipped, and so is a
//!   `RateLimit` item naming such a policy.
//! * Of the `RateLimit` items with a valid `r` (a non-negative integer), the most
//!   restrictive wins: smallest `r`, and on a tie the longest `t`. The allowance is
//!   `remaining = r`, `reset_after = t` seconds, `limit = q` of the policy of the
//!   same name (if there is one).
//! * With no usable `RateLimit` item, the policy with the smallest `q` gives
//!   `limit` alone.
//! * A field that does not parse as a list is treated as absent.

use std::cmp::Reverse;
use std::time::Duration;

use http::HeaderMap;

use super::sfv::{self, Bare, Member};
use super::{allowance, field, Allowance};

fn non_negative(member: &Member, key: &str) -> Option<u64> {
    match member.param(key)? {
        Bare::Integer(n) => u64::try_from(*n).ok(),
        _ => None,
    }
}

fn counts_requests(policy: &Member) -> bool {
    match policy.param("qu") {
        None => true,
        Some(Bare::String(unit) | Bare::Token(unit)) => unit == "request" || unit == "requests",
        Some(_) => false,
    }
}

fn list(headers: &HeaderMap, name: &str) -> Vec<Member> {
    field::joined(headers, name)
        .and_then(|v| sfv::parse_list(&v))
        .unwrap_or_default()
}

/// The request allowance from `RateLimit-Policy` and `RateLimit`.
pub(super) fn requests(headers: &HeaderMap) -> Option<Allowance> {
    let policies = list(headers, "ratelimit-policy");
    let current = list(headers, "ratelimit");
    let policy =
        |name: Option<&str>| name.and_then(|name| policies.iter().find(|p| p.name() == Some(name)));
    let best = current
        .iter()
        .filter(|item| policy(item.name()).is_none_or(counts_requests))
        .filter_map(|item| {
            let r = non_negative(item, "r")?;
            Some((r, non_negative(item, "t"), item))
        })
        .min_by_key(|(r, t, _)| (*r, Reverse(*t)));
    if let Some((r, t, item)) = best {
        let limit = policy(item.name()).and_then(|p| non_negative(p, "q"));
        let reset = t.map(|t| Duration::from_secs(t).min(super::MAX_HINT_DELAY));
        return allowance(limit, Some(r), reset);
    }
    let limit = policies
        .iter()
        .filter(|p| counts_requests(p))
        .filter_map(|p| non_negative(p, "q"))
        .min();
    allowance(limit, None, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::test_support::{map, Pairs};
    use crate::headers::MAX_HINT_DELAY;

    fn a(limit: Option<u64>, remaining: Option<u64>, reset_s: Option<u64>) -> Option<Allowance> {
        Some(Allowance::new(
            limit,
            remaining,
            reset_s.map(Duration::from_secs),
        ))
    }

    #[test]
    fn ietf_family() {
        const P: &str = "ratelimit-policy";
        const R: &str = "ratelimit";
        let cases: &[(Pairs, Option<Allowance>)] = &[
            (
                &[
                    (P, b"\"default\";q=100;w=60"),
                    (R, b"\"default\";r=50;t=30"),
                ],
                a(Some(100), Some(50), Some(30)),
            ),
            (
                &[(R, b"\"default\";r=50;t=30")],
                a(None, Some(50), Some(30)),
            ),
            (&[(P, b"\"default\";q=100;w=60")], a(Some(100), None, None)),
            // several policies: the smallest r, with its t and its q
            (
                &[
                    (P, b"\"burst\";q=10;w=1, \"day\";q=1000;w=86400"),
                    (R, b"\"burst\";r=9;t=1, \"day\";r=3;t=4000"),
                ],
                a(Some(1000), Some(3), Some(4000)),
            ),
            // split over several lines
            (
                &[
                    (P, b"\"burst\";q=10;w=1"),
                    (P, b"\"day\";q=1000;w=86400"),
                    (R, b"\"burst\";r=2;t=1"),
                    (R, b"\"day\";r=700;t=4000"),
                ],
                a(Some(10), Some(2), Some(1)),
            ),
            // tie on r: the longer t
            (
                &[(R, b"\"a\";r=0;t=5, \"b\";r=0;t=50")],
                a(None, Some(0), Some(50)),
            ),
            // policies without RateLimit: the smallest q
            (
                &[(P, b"\"a\";q=500;w=60, \"b\";q=20;w=1")],
                a(Some(20), None, None),
            ),
            // non-request quota units are skipped
            (
                &[
                    (
                        P,
                        b"\"bytes\";q=1000;qu=\"content-bytes\", \"req\";q=100;qu=\"request\"",
                    ),
                    (R, b"\"bytes\";r=1;t=9, \"req\";r=60;t=10"),
                ],
                a(Some(100), Some(60), Some(10)),
            ),
            // older drafts used tokens for names
            (
                &[(P, b"default;q=100;w=60"), (R, b"default;r=5;t=6")],
                a(Some(100), Some(5), Some(6)),
            ),
            // r greater than q: remaining dropped
            (
                &[(P, b"\"d\";q=10"), (R, b"\"d\";r=11;t=3")],
                a(Some(10), None, Some(3)),
            ),
            // huge t saturates
            (
                &[(R, b"\"d\";r=1;t=999999999999999")],
                a(None, Some(1), Some(MAX_HINT_DELAY.as_secs())),
            ),
            // malformed
            (&[(R, b"\"d\";r=-1;t=3")], None),
            (&[(R, b"\"d\";r=1.5;t=3")], None),
            (&[(R, b"\"d\";r=\"5\"")], None),
            (&[(R, b"\"d\";r=5;t=-3")], a(None, Some(5), None)),
            (&[(R, b"\"d\";r=5,")], None),
            (&[(R, b"\"d\"; r=5")], a(None, Some(5), None)),
            (
                &[(P, b"\"d\";q=100"), (R, b"\"d\";r=5 junk")],
                a(Some(100), None, None),
            ),
            (&[(R, b"\"d\xe9\";r=5")], None),
            (&[(R, b"limit=100, remaining=5")], None),
            (&[], None),
        ];
        for (pairs, want) in cases {
            assert_eq!(requests(&map(pairs)), *want, "{pairs:?}");
        }
    }
}
