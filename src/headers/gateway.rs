//! The LLM gateway's 429 headers: `rate_limit_type` and `reset_at`.
//!
//! `rate_limit_type` names the limit that was exceeded. It is matched ASCII
//! case-insensitively after turning `-` and spaces into `_`, against these lists:
//!
//! | spelling | kind |
//! | --- | --- |
//! | `parallel_requests`, `parallel`, `concurrent`, `concurrency`, `concurrent_requests`, `max_concurrent_requests` | [`LimitKind::Concurrency`] |
//! | `requests_per_minute`, `requests_per_second`, `requests_per_hour`, `requests_per_day`, `requests`, `rpm`, `rps`, `rpd` | [`LimitKind::Requests`] |
//! | `tokens_per_minute`, `tokens_per_day`, `tokens`, `tpm`, `tpd`, `input_tokens`, `output_tokens`, `input_tokens_per_minute`, `output_tokens_per_minute` | [`LimitKind::Tokens`] |
//! | any other non-empty visible-ASCII value | [`LimitKind::Other`] |
//!
//! An empty value gives `None`.
//!
//! `reset_at` is an absolute time: RFC 3339 (`2025-01-20T10:30:00Z`), or a decimal
//! Unix epoch number. Epoch numbers below [`EPOCH_MILLIS_THRESHOLD`] are seconds,
//! larger ones milliseconds (see the constant for why the two cannot be confused).

use std::time::{Duration, SystemTime};

use http::HeaderMap;

use super::{clock, field, number, LimitKind};

/// Epoch numbers at or above this (10^11) in `reset_at` are milliseconds, below it seconds.
///
/// 10^11 seconds is the year 5138, far past any reset; 10^11 milliseconds is
/// 1973-03-03, far before any reset. So any plausible reset time is read correctly
/// whichever unit the server picked.
pub const EPOCH_MILLIS_THRESHOLD: u64 = 100_000_000_000;

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
    Some(match name.as_str() {
        "parallel_requests"
        | "parallel"
        | "concurrent"
        | "concurrency"
        | "concurrent_requests"
        | "max_concurrent_requests" => LimitKind::Concurrency,
        "requests_per_minute"
        | "requests_per_second"
        | "requests_per_hour"
        | "requests_per_day"
        | "requests"
        | "rpm"
        | "rps"
        | "rpd" => LimitKind::Requests,
        "tokens_per_minute"
        | "tokens_per_day"
        | "tokens"
        | "tpm"
        | "tpd"
        | "input_tokens"
        | "output_tokens"
        | "input_tokens_per_minute"
        | "output_tokens_per_minute" => LimitKind::Tokens,
        _ => LimitKind::Other,
    })
}

/// Time until `reset_at`, relative to `now`.
pub(super) fn reset_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    field::single(headers, "reset_at").and_then(|v| reset_at(v, now))
}

fn reset_at(value: &str, now: SystemTime) -> Option<Duration> {
    match number::decimal(value) {
        Some((int, frac)) => {
            let unit = if number::count(int)? < EPOCH_MILLIS_THRESHOLD {
                number::SECONDS
            } else {
                number::MILLIS
            };
            let since_epoch = number::duration(number::nanos(int, frac, unit));
            Some(clock::until_epoch(now, since_epoch))
        }
        None => clock::until_rfc3339(now, value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::test_support::{map, now};
    use crate::headers::MAX_HINT_DELAY;

    #[test]
    fn limit_kinds() {
        use LimitKind::*;
        let cases: &[(&[u8], Option<LimitKind>)] = &[
            (b"parallel_requests", Some(Concurrency)),
            (b"PARALLEL", Some(Concurrency)),
            (b"concurrent", Some(Concurrency)),
            (b"Concurrency", Some(Concurrency)),
            (b"concurrent-requests", Some(Concurrency)),
            (b"requests_per_minute", Some(Requests)),
            (b" rpm ", Some(Requests)),
            (b"RPS", Some(Requests)),
            (b"requests", Some(Requests)),
            (b"requests_per_second", Some(Requests)),
            (b"requests_per_day", Some(Requests)),
            (b"tokens_per_minute", Some(Tokens)),
            (b"tpm", Some(Tokens)),
            (b"tokens", Some(Tokens)),
            (b"input_tokens", Some(Tokens)),
            (b"Output-Tokens", Some(Tokens)),
            (b"budget", Some(Other)),
            (b"requests per fortnight", Some(Other)),
            (b"parallel_requests_x", Some(Other)),
            (b"", None),
            (b"  ", None),
            (b"tok\xe9ns", None),
        ];
        for (value, want) in cases {
            let h = map(&[("rate_limit_type", value)]);
            assert_eq!(
                limit_kind(&h),
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
            (b"2023-11-14T22:00:00Z", s(0)),
            (b"1700000060", s(60)),
            (b"1700000060.25", Some(Duration::from_millis(60_250))),
            (b"1700000060000", s(60)),
            (b"1700000000500", Some(Duration::from_millis(500))),
            (b"1600000000", s(0)),
            (b"99999999999", Some(MAX_HINT_DELAY)),
            (b"100000000000", s(0)),
            (b"99999999999999999999999999", Some(MAX_HINT_DELAY)),
            (b"0", s(0)),
            (b"-1700000060", None),
            (b"1.7e9", None),
            (b"tomorrow", None),
            (b"2023-11-14 22:14:20", None),
            (b"", None),
        ];
        for (value, want) in cases {
            let h = map(&[("reset_at", value)]);
            assert_eq!(
                reset_after(&h, now()),
                *want,
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
    }
}
