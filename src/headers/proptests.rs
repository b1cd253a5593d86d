//! Property tests: `parse` and `parse_error_body` never panic, and every delay
//! they produce is within bounds.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use proptest::prelude::*;

use super::test_support::now;
use super::{parse, parse_error_body, Allowance, Hints, MAX_HINT_DELAY};

/// Every header name `parse` reads.
const KNOWN: &[&str] = &[
    "retry-after",
    "retry-after-ms",
    "rate_limit_type",
    "reset_at",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-requests-limit",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-limit",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-input-tokens-limit",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-input-tokens-reset",
    "anthropic-ratelimit-output-tokens-limit",
    "anthropic-ratelimit-output-tokens-remaining",
    "anthropic-ratelimit-output-tokens-reset",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-used",
    "x-ratelimit-reset",
    "ratelimit-policy",
    "ratelimit",
];

/// Any byte string `HeaderValue::from_bytes` accepts (HTAB, SP..~, and obs-text).
fn any_value() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(prop_oneof![Just(b'\t'), 0x20u8..0x7f, 0x80u8..=0xff], 0..48)
}

/// Values built from the characters the parsers care about, to get past the first
/// character more often than random bytes do.
fn near_value() -> impl Strategy<Value = Vec<u8>> {
    "[0-9 .:;=,\"\\-+eETZsmhnuµ()*?@%/_a-z]{0,40}".prop_map(String::into_bytes)
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![any_value(), near_value()]
}

fn headers_from(entries: &[(usize, Vec<u8>)]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (index, bytes) in entries {
        let name = HeaderName::from_static(KNOWN[index % KNOWN.len()]);
        let value = HeaderValue::from_bytes(bytes).expect("strategy yields valid header bytes");
        headers.append(name, value);
    }
    headers
}

fn delays(hints: &Hints) -> Vec<Duration> {
    let allowances: [Option<Allowance>; 4] = [
        hints.requests,
        hints.tokens,
        hints.input_tokens,
        hints.output_tokens,
    ];
    [hints.retry_after, hints.reset_after]
        .into_iter()
        .chain(allowances.iter().flatten().map(|a| a.reset_after))
        .flatten()
        .collect()
}

fn check(hints: &Hints) -> Result<(), TestCaseError> {
    for delay in delays(hints) {
        prop_assert!(delay <= MAX_HINT_DELAY, "delay {delay:?} above the cap");
    }
    for a in hints.allowances() {
        if let (Some(limit), Some(remaining)) = (a.limit, a.remaining) {
            prop_assert!(remaining <= limit, "{a:?}");
        }
        prop_assert!(a != Allowance::default(), "empty allowance reported");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Each known header alone, with one or two arbitrary lines.
    #[test]
    fn parse_never_panics_per_header(
        index in 0..KNOWN.len(),
        lines in prop::collection::vec(value(), 1..3),
    ) {
        let entries: Vec<_> = lines.into_iter().map(|v| (index, v)).collect();
        check(&parse(&headers_from(&entries), now()))?;
    }

    /// Arbitrary mixtures of known headers.
    #[test]
    fn parse_never_panics_mixed(
        entries in prop::collection::vec((0..KNOWN.len(), value()), 0..12),
    ) {
        check(&parse(&headers_from(&entries), now()))?;
    }

    /// Whole seconds in `Retry-After` come back exactly, capped at the maximum.
    #[test]
    fn retry_after_seconds_round_trip(secs in any::<u64>()) {
        let headers = headers_from(&[(0, secs.to_string().into_bytes())]);
        prop_assert_eq!(
            parse(&headers, now()).retry_after,
            Some(Duration::from_secs(secs).min(MAX_HINT_DELAY))
        );
    }

    /// An HTTP-date `secs` seconds after `now` comes back as `secs` seconds.
    #[test]
    fn retry_after_date_round_trip(secs in 0u64..=MAX_HINT_DELAY.as_secs()) {
        let date = httpdate::fmt_http_date(now() + Duration::from_secs(secs));
        let headers = headers_from(&[(0, date.into_bytes())]);
        prop_assert_eq!(parse(&headers, now()).retry_after, Some(Duration::from_secs(secs)));
    }

    /// Go durations written as `XhYmZ.MMMs` come back exactly.
    #[test]
    fn go_duration_round_trip(h in 0u64..1000, m in 0u64..60, s in 0u64..60, ms in 0u64..1000) {
        let text = format!("{h}h{m}m{s}.{ms:03}s");
        let headers = headers_from(&[(6, text.into_bytes())]);
        let want = Duration::from_secs(h * 3600 + m * 60 + s) + Duration::from_millis(ms);
        prop_assert_eq!(
            parse(&headers, now()).requests.and_then(|a| a.reset_after),
            Some(want.min(MAX_HINT_DELAY))
        );
    }

    /// Arbitrary bytes as an error body.
    #[test]
    fn error_body_never_panics(body in prop::collection::vec(any::<u8>(), 0..256)) {
        if let Some(parsed) = parse_error_body(&body) {
            prop_assert!(parsed.codes().all(|c| !c.is_empty()));
        }
    }

    /// JSON-looking text as an error body.
    #[test]
    fn error_body_json_like_never_panics(
        body in "[{}\\[\\]\":,0-9a-z_/ .-]{0,80}",
    ) {
        if let Some(parsed) = parse_error_body(body.as_bytes()) {
            prop_assert!(parsed.codes().all(|c| !c.is_empty()));
        }
    }

    /// Well-formed objects with arbitrary string members round-trip `code`.
    #[test]
    fn error_body_code_round_trip(code in "[a-z_-]{1,30}", status in 100u16..600) {
        let body = serde_json::json!({ "code": code, "status": status }).to_string();
        let parsed = parse_error_body(body.as_bytes()).unwrap_or_default();
        prop_assert_eq!(parsed.code.as_deref(), Some(code.as_str()));
        prop_assert_eq!(parsed.status, Some(status));
    }
}
