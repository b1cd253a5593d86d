//! The LLM gateway's 429 headers: `rate_limit_type` and `reset_at`.
//!
//! `rate_limit_type` names the limit that was exceeded. It is matched ASCII
//! case-insensitively after turning `-` and spaces into `_`, against [`SPELLINGS`];
//! any other non-empty visible-ASCII value is [`LimitKind::Other`], an empty value gives
//! `None`. The module docs of [`headers`](super) show the same table, checked against
//! [`SPELLINGS`] by a test.
//!
//! `reset_at` is RFC 3339 (`2025-01-20T10:30:00Z`), or a decimal number read by the
//! numeric-reset rule of [`super::clock`]: epoch milliseconds, epoch seconds or seconds
//! from now, by its size. A time not after now, or a number implausibly far ahead, is
//! no hint; a far RFC 3339 time saturates.

use std::time::Duration;

use http::HeaderMap;

use super::{clock::Clock, field, number, LimitKind};

/// Every `rate_limit_type` spelling recognised, in the normalized form matched (lowercase,
/// `_` for `-` and spaces), with the kind it names; in the order of the module docs' table.
const SPELLINGS: &[(&str, LimitKind)] = &[
    ("parallel_requests", LimitKind::Concurrency),
    ("parallel", LimitKind::Concurrency),
    ("concurrent", LimitKind::Concurrency),
    ("concurrency", LimitKind::Concurrency),
    ("concurrent_requests", LimitKind::Concurrency),
    ("max_concurrent_requests", LimitKind::Concurrency),
    ("requests_per_minute", LimitKind::Requests),
    ("requests_per_second", LimitKind::Requests),
    ("requests_per_hour", LimitKind::Requests),
    ("requests_per_day", LimitKind::Requests),
    ("requests", LimitKind::Requests),
    ("rpm", LimitKind::Requests),
    ("rps", LimitKind::Requests),
    ("rpd", LimitKind::Requests),
    ("tokens_per_minute", LimitKind::Tokens),
    ("tokens_per_day", LimitKind::Tokens),
    ("tokens", LimitKind::Tokens),
    ("tpm", LimitKind::Tokens),
    ("tpd", LimitKind::Tokens),
    ("input_tokens", LimitKind::Tokens),
    ("output_tokens", LimitKind::Tokens),
    ("input_tokens_per_minute", LimitKind::Tokens),
    ("output_tokens_per_minute", LimitKind::Tokens),
];

/// The kind of limit named by `rate_limit_type`.
pub(super) fn limit_kind(headers: &HeaderMap) -> Option<LimitKind> {
    field::single(headers, "rate_limit_type").and_then(kind)
}

fn kind(value: &str) -> Option<LimitKind> {
    if value.is_empty() {
        return None;
    }
    let name: String = value
        .chars()
        .map(|c| match c {
            '-' | ' ' | '\t' => '_',
            c => c.to_ascii_lowercase(),
        })
        .collect();
    let known = SPELLINGS.iter().find(|(spelling, _)| *spelling == name);
    Some(known.map_or(LimitKind::Other, |&(_, kind)| kind))
}

/// Time until `reset_at`, relative to `now`.
pub(super) fn reset_after(headers: &HeaderMap, clock: &Clock) -> Option<Duration> {
    field::single(headers, "reset_at").and_then(|v| {
        if number::decimal(v).is_some() {
            clock.numeric_reset(v)
        } else {
            clock.rfc3339_reset(v)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::test_support::{map, now};

    fn kind_of(value: &[u8]) -> Option<LimitKind> {
        limit_kind(&map(&[("rate_limit_type", value)]))
    }

    #[test]
    fn every_spelling_is_recognised_in_any_case_with_dashes_or_spaces() {
        for (i, &(spelling, want)) in SPELLINGS.iter().enumerate() {
            assert!(
                SPELLINGS[..i].iter().all(|(s, _)| *s != spelling),
                "{spelling} is listed twice"
            );
            let dashed = spelling.to_ascii_uppercase().replace('_', "-");
            let spaced = format!(" {} ", spelling.replace('_', " "));
            for value in [spelling, &dashed, &spaced] {
                assert_eq!(kind_of(value.as_bytes()), Some(want), "{value:?}");
            }
        }
    }

    /// The spellings table in the `headers` module docs lists exactly [`SPELLINGS`], in order.
    #[test]
    fn the_module_docs_list_the_spellings() {
        let mut documented = Vec::new();
        for row in include_str!("mod.rs")
            .lines()
            .filter_map(|line| line.strip_prefix("//! | `"))
        {
            let (spellings, kind) = row
                .split_once(" | [`LimitKind::")
                .unwrap_or_else(|| panic!("a spellings row without a kind: {row}"));
            let kind = match kind.split('`').next() {
                Some("Concurrency") => LimitKind::Concurrency,
                Some("Requests") => LimitKind::Requests,
                Some("Tokens") => LimitKind::Tokens,
                other => panic!("unknown kind {other:?} in {row}"),
            };
            for spelling in format!("`{spellings}").split(", ") {
                documented.push((spelling.trim_matches('`').to_owned(), kind));
            }
        }
        let table: Vec<_> = SPELLINGS.iter().map(|&(s, k)| (s.to_owned(), k)).collect();
        assert_eq!(documented, table);
    }

    #[test]
    fn limit_kinds_outside_the_table() {
        use LimitKind::*;
        let cases: &[(&[u8], Option<LimitKind>)] = &[
            (b"budget", Some(Other)),
            (b"requests per fortnight", Some(Other)),
            (b"parallel_requests_x", Some(Other)),
            (b"", None),
            (b"  ", None),
            (b"tok\xe9ns", None),
        ];
        for (value, want) in cases {
            assert_eq!(
                kind_of(value),
                *want,
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
        assert_eq!(limit_kind(&map::<&[u8]>(&[])), None);
    }

    #[test]
    fn reset_at_values() {
        let s = |n: u64| Some(Duration::from_secs(n));
        let cases: &[(&[u8], Option<Duration>)] = &[
            (b"2023-11-14T22:14:20Z", s(60)),
            (
                b"2023-11-14T22:14:20.5+00:00",
                Some(Duration::from_millis(60_500)),
            ),
            // epoch seconds, epoch milliseconds, seconds from now
            (b"1700000060", s(60)),
            (b"1700000060.25", Some(Duration::from_millis(60_250))),
            (b"1700000060000", s(60)),
            (b"1700000000500", Some(Duration::from_millis(500))),
            (b"60", s(60)),
            (b"0.5", Some(Duration::from_millis(500))),
            (b"0", s(0)),
            // in the past, or implausibly far: no hint
            (b"2023-11-14T22:00:00Z", None),
            (b"2023-11-14T22:13:17Z", None),
            (b"1699999997", None),
            (b"1699999997000", None),
            (b"1600000000", None),
            (b"99999999999", None),
            (b"100000000000", None),
            (b"99999999999999999999999999", None),
            (
                b"2099-01-01T00:00:00Z",
                Some(crate::headers::MAX_HINT_DELAY),
            ),
            (b"99999999", None),
            // malformed
            (b"-1700000060", None),
            (b"1.7e9", None),
            (b"tomorrow", None),
            (b"2023-11-14 22:14:20", None),
            (b"", None),
        ];
        for (value, want) in cases {
            let h = map(&[("reset_at", value)]);
            assert_eq!(
                reset_after(&h, &Clock::at(now())),
                *want,
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
    }

    /// `reset_at` is read against the server's clock when `Date` shows a clear skew.
    #[test]
    fn reset_at_under_clock_skew() {
        // (Date, reset_at on the server's clock 2 s after its Date)
        let cases = [
            ("Tue, 14 Nov 2023 22:13:23 GMT", "2023-11-14T22:13:25Z"), // server 3 s ahead
            ("Tue, 14 Nov 2023 23:13:20 GMT", "2023-11-14T23:13:22Z"), // server 1 h ahead
            ("Tue, 14 Nov 2023 22:13:17 GMT", "2023-11-14T22:13:19Z"), // server 3 s behind
            ("Tue, 14 Nov 2023 21:13:20 GMT", "2023-11-14T21:13:22Z"), // server 1 h behind
            ("Tue, 14 Nov 2023 23:13:20 GMT", "1700003602"),
            ("Tue, 14 Nov 2023 21:13:20 GMT", "1699996402000"),
        ];
        for (date, reset) in cases {
            let h = map(&[("date", date), ("reset_at", reset)]);
            let clock = Clock::new(&h, now());
            assert_eq!(
                reset_after(&h, &clock),
                Some(Duration::from_secs(2)),
                "{date} {reset}"
            );
        }
    }
}
