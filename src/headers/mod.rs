//! Rate-limit hints read from a response: headers in, plain values out.
//!
//! This module knows nothing of tokio or reqwest: it takes an [`http::HeaderMap`]
//! (and, for error answers, a short body) and a wall-clock `now`, and returns
//! [`Hints`]. Malformed input gives "no hint" (`None`), never a panic and never
//! a zero wait that the server did not ask for.
//!
//! # Header families
//!
//! Each family has one fixed format; a value in any other format is "no hint".
//! Header names are case-insensitive, as in HTTP.
//!
//! | family | header | format | example |
//! | --- | --- | --- | --- |
//! | HTTP (RFC 9110 §10.2.3) | `Retry-After` | delay-seconds, or HTTP-date (IMF-fixdate, RFC 850, asctime); a decimal fraction is accepted | `12`, `1.5`, `Tue, 14 Nov 2023 22:13:50 GMT` |
//! | OpenAI | `retry-after-ms` | decimal milliseconds | `250`, `12.5` |
//! | LLM gateway | `rate_limit_type` | a limit name (see below) | `parallel_requests` |
//! | LLM gateway | `reset_at` | RFC 3339, or a numeric reset (see below) | `2023-11-14T22:14:20Z`, `1700000060`, `1700000060000`, `60` |
//! | OpenAI | `x-ratelimit-limit-{requests,tokens}` | count | `60` |
//! | OpenAI | `x-ratelimit-remaining-{requests,tokens}` | count | `59` |
//! | OpenAI | `x-ratelimit-reset-{requests,tokens}` | Go duration, or a bare number read as a numeric reset (see below) | `1s`, `6m0s`, `20ms`, `500µs`, `17` |
//! | Anthropic | `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-limit` | count | `50` |
//! | Anthropic | `anthropic-ratelimit-{...}-remaining` | count | `45` |
//! | Anthropic | `anthropic-ratelimit-{...}-reset` | RFC 3339 | `2023-11-14T22:14:00Z` |
//! | GitHub | `x-ratelimit-{limit,remaining,used}` | count | `5000` |
//! | GitHub | `x-ratelimit-reset` | a numeric reset (see below) | `1700000600`, `1700000600000`, `600` |
//! | IETF draft-11 | `RateLimit-Policy` | structured-field list: name with `q`, `w`, optional `qu` | `"default";q=100;w=60` |
//! | IETF draft-11 | `RateLimit` | structured-field list: name with `r`, `t` | `"default";r=50;t=30` |
//!
//! A *count* is `1*DIGIT` (no sign, no fraction); counts beyond `u64::MAX`
//! saturate there. `rate_limit_type` spellings are listed in the gateway section
//! below.
//!
//! # Rules that apply to every family
//!
//! * **Bytes.** A value must be visible ASCII plus SP/HTAB (Go durations may also
//!   use `µ`, so they accept any valid UTF-8). Other bytes give `None`.
//!   Surrounding SP/HTAB is ignored.
//! * **Repeated lines.** A single-valued header sent on several lines is used only
//!   if all lines agree; conflicting lines give `None`. The two IETF list headers
//!   instead join all their lines with `", "` (RFC 9110 §5.3).
//! * **Delays** are relative to `now`, never negative and saturate at
//!   [`MAX_HINT_DELAY`]; nothing overflows. A `Retry-After` date in the past gives
//!   zero; resets follow the stricter rules below.
//!
//! # Reset times
//!
//! * **Numeric resets** (GitHub `x-ratelimit-reset`, a numeric `reset_at`, a bare
//!   number in OpenAI `x-ratelimit-reset-*`) are read by size, one rule for all:
//!   a value `>=` [`EPOCH_MILLIS_THRESHOLD`] (10^12) is Unix epoch milliseconds, a value
//!   `>=` [`EPOCH_SECONDS_THRESHOLD`] (10^9) is Unix epoch seconds, anything smaller is
//!   seconds from now. A decimal fraction is accepted.
//! * **Implausible resets are no hint** (`None`): an absolute reset (epoch number,
//!   RFC 3339) not after now, or a numeric reset further ahead than [`MAX_RESET_AHEAD`]
//!   (366 days). So a stale or misread time never beats `Retry-After` and never
//!   closes a cooldown. An RFC 3339 reset names its time without doubt: a far one
//!   saturates at [`MAX_HINT_DELAY`] (a throttle returns it as too long a wait).
//! * **Clock skew.** When the answer's `Date` header (RFC 9110 §6.6.1) differs from
//!   `now` by more than [`MAX_UNNOTICED_SKEW`] (2 s; it has 1 s resolution), every
//!   absolute time of that answer (epoch resets, RFC 3339 resets, `Retry-After`
//!   HTTP-dates) is measured from the `Date` value instead of from `now`, i.e. corrected
//!   by the skew. Relative values (delay-seconds, Go durations, IETF `t`) are not.
//!   A `Date` alone is no hint; a malformed or repeated conflicting one is ignored.
//! * **Rounding.** Fractional seconds in `Retry-After` and fractional milliseconds
//!   in `retry-after-ms` are rounded UP to the next whole millisecond; Go durations
//!   and epoch fractions are rounded UP to the next nanosecond. A hint never asks
//!   for less than the server said.
//! * **Nonsense remainders.** An allowance whose `remaining` exceeds its `limit`
//!   gets `remaining = None`; the limit and reset are kept.
//! * **Partial families.** An allowance is reported if at least one of its fields
//!   parsed; the fields that did not parse are `None`.
//!
//! # Precedence
//!
//! * [`Hints::retry_after`]: `retry-after-ms` when valid, else `Retry-After`.
//! * [`Hints::requests`]: the first family present, in this fixed order:
//!   Anthropic, OpenAI, IETF, GitHub. Families are never mixed field by field.
//! * [`Hints::tokens`]: Anthropic `tokens`, else the tighter of Anthropic
//!   `input-tokens` / `output-tokens` (the one with the smaller `remaining`; a known
//!   `remaining` beats an unknown one; on a tie, input), else OpenAI `tokens`.
//!
//! # The gateway's `rate_limit_type`
//!
//! Matched ASCII case-insensitively, with `-` and spaces read as `_`:
//!
//! | spellings | kind |
//! | --- | --- |
//! | `parallel_requests`, `parallel`, `concurrent`, `concurrency`, `concurrent_requests`, `max_concurrent_requests` | [`LimitKind::Concurrency`] |
//! | `requests_per_minute`, `requests_per_second`, `requests_per_hour`, `requests_per_day`, `requests`, `rpm`, `rps`, `rpd` | [`LimitKind::Requests`] |
//! | `tokens_per_minute`, `tokens_per_day`, `tokens`, `tpm`, `tpd`, `input_tokens`, `output_tokens`, `input_tokens_per_minute`, `output_tokens_per_minute` | [`LimitKind::Tokens`] |
//! | anything else (non-empty) | [`LimitKind::Other`] |
//!
//! # Error bodies
//!
//! [`parse_error_body`] reads problem details (RFC 9457) and OpenAI style error
//! objects into an [`ErrorBody`]; [`ErrorBody::codes`] lists the machine codes to
//! match on (`insufficient_quota`, `entitlement-required`, `run_already_started`, ...).

use std::time::{Duration, SystemTime};

use http::HeaderMap;

mod anthropic;
mod clock;
mod duration;
mod field;
mod gateway;
mod github;
mod ietf;
mod number;
mod openai;
mod problem;
mod retry_after;

#[cfg(test)]
mod proptests;

pub use clock::{
    EPOCH_MILLIS_THRESHOLD, EPOCH_SECONDS_THRESHOLD, MAX_RESET_AHEAD, MAX_UNNOTICED_SKEW,
};
pub use problem::{parse_error_body, ErrorBody, MAX_ERROR_BODY};

/// The longest delay any hint may carry: 366 days. Larger values saturate here.
pub const MAX_HINT_DELAY: Duration = Duration::from_secs(366 * 24 * 60 * 60);

/// What a response said about the client's rate limits.
///
/// Every field is optional: a server sends some of them or none.
/// All delays are relative to the `now` given to [`parse`], never negative,
/// and at most [`MAX_HINT_DELAY`]. See the [module docs](self) for formats and
/// precedence.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Hints {
    /// How long the server asked the client to wait before sending again:
    /// `retry-after-ms` (milliseconds) when present and valid, else `Retry-After`
    /// (RFC 9110 §10.2.3: delay-seconds or an HTTP-date).
    pub retry_after: Option<Duration>,
    /// Which limit the server says was exceeded (the gateway's `rate_limit_type` header).
    pub limit_kind: Option<LimitKind>,
    /// Time until the exceeded limit resets (the gateway's `reset_at` header).
    pub reset_after: Option<Duration>,
    /// The request-count allowance the server reported, if any
    /// (Anthropic, else OpenAI, else IETF `RateLimit`, else GitHub).
    pub requests: Option<Allowance>,
    /// The token allowance the server reported, if any (Anthropic `tokens`, else the
    /// tighter of Anthropic input/output tokens, else OpenAI `tokens`).
    pub tokens: Option<Allowance>,
    /// The input-token allowance (`anthropic-ratelimit-input-tokens-*`), if any.
    pub input_tokens: Option<Allowance>,
    /// The output-token allowance (`anthropic-ratelimit-output-tokens-*`), if any.
    pub output_tokens: Option<Allowance>,
    /// The server's own word on a retry (`x-should-retry: true|false`, as LLM APIs send to
    /// their SDKs): `Some(false)` makes the answer final; `Some(true)` vouches that sending
    /// the request again is safe.
    pub should_retry: Option<bool>,
}

impl Hints {
    /// Every allowance the answer reported: requests, tokens, input tokens, output tokens.
    pub fn allowances(&self) -> impl Iterator<Item = Allowance> {
        [
            self.requests,
            self.tokens,
            self.input_tokens,
            self.output_tokens,
        ]
        .into_iter()
        .flatten()
    }
}

/// One allowance reported by a server: a limit, what remains of it, and when it resets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Allowance {
    /// The limit for the current window, in requests or tokens.
    pub limit: Option<u64>,
    /// How much of the limit is left in the current window, in requests or tokens.
    /// Never greater than `limit` when both are known (a larger value is dropped).
    pub remaining: Option<u64>,
    /// Time until the window resets, relative to `now`, at most [`MAX_HINT_DELAY`].
    pub reset_after: Option<Duration>,
}

impl Allowance {
    /// An allowance from its parts, as given (no checks are applied).
    pub const fn new(
        limit: Option<u64>,
        remaining: Option<u64>,
        reset_after: Option<Duration>,
    ) -> Self {
        Allowance {
            limit,
            remaining,
            reset_after,
        }
    }
}

/// Builds an allowance from parsed fields: `None` when nothing parsed; a
/// `remaining` above `limit` is dropped; the reset is capped at [`MAX_HINT_DELAY`].
fn allowance(
    limit: Option<u64>,
    remaining: Option<u64>,
    reset_after: Option<Duration>,
) -> Option<Allowance> {
    if limit.is_none() && remaining.is_none() && reset_after.is_none() {
        return None;
    }
    let remaining = match (limit, remaining) {
        (Some(limit), Some(remaining)) if remaining > limit => None,
        _ => remaining,
    };
    Some(Allowance::new(
        limit,
        remaining,
        reset_after.map(|d| d.min(MAX_HINT_DELAY)),
    ))
}

/// The kind of limit a `rate_limit_type` header names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LimitKind {
    /// A cap on requests in flight at once (`parallel_requests`, `concurrent`, ...).
    /// It clears when one of the caller's requests finishes, usually well before `Retry-After`.
    Concurrency,
    /// A cap on requests per time window (`requests_per_minute`, `rpm`, ...): it clears at the reset.
    Requests,
    /// A cap on tokens per time window (`tokens_per_minute`, `tpm`, ...): it clears at the reset.
    Tokens,
    /// A value this crate does not recognise.
    Other,
}

impl LimitKind {
    /// Whether this limit clears at a window reset (rather than when a request finishes).
    pub fn is_window(self) -> bool {
        matches!(self, LimitKind::Requests | LimitKind::Tokens)
    }
}

/// Reads every hint this crate understands from `headers`, with `now` as the wall-clock time
/// against which HTTP-dates and absolute reset times are turned into delays.
///
/// Never panics; see the [module docs](self) for each family's format and for precedence.
pub fn parse(headers: &HeaderMap, now: SystemTime) -> Hints {
    // Most responses carry no hint: one pass over the names spares ~30 lookups.
    if !headers.keys().any(|name| may_be_hint(name.as_str())) {
        return Hints::default();
    }
    let clock = clock::Clock::new(headers, now);
    let anthropic = anthropic::read(headers, &clock);
    Hints {
        retry_after: retry_after::read(headers, &clock),
        limit_kind: gateway::limit_kind(headers),
        reset_after: gateway::reset_after(headers, &clock),
        requests: anthropic
            .requests
            .or_else(|| openai::requests(headers, &clock))
            .or_else(|| ietf::requests(headers))
            .or_else(|| github::requests(headers, &clock)),
        tokens: anthropic.tokens.or_else(|| openai::tokens(headers, &clock)),
        input_tokens: anthropic.input_tokens,
        output_tokens: anthropic.output_tokens,
        should_retry: should_retry(headers),
    }
}

/// `x-should-retry`: `true` or `false`, ASCII case-insensitive; anything else is no hint.
fn should_retry(headers: &HeaderMap) -> Option<bool> {
    let value = field::single(headers, "x-should-retry")?;
    if value.eq_ignore_ascii_case("true") {
        Some(true)
    } else if value.eq_ignore_ascii_case("false") {
        Some(false)
    } else {
        None
    }
}

/// Whether a (lowercase) header name belongs to a family this module reads.
fn may_be_hint(name: &str) -> bool {
    const PREFIXES: [&str; 7] = [
        "retry-after",
        "x-should-retry",
        "x-ratelimit-",
        "anthropic-ratelimit-",
        "ratelimit",
        "rate_limit_type",
        "reset_at",
    ];
    PREFIXES.iter().any(|p| name.starts_with(p))
}

#[cfg(test)]
mod should_retry_tests {
    use super::test_support::{map, now};
    use super::*;

    #[test]
    fn x_should_retry_is_read_as_a_boolean() {
        let read = |v: &str| parse(&map(&[("x-should-retry", v)]), now()).should_retry;
        assert_eq!(read("true"), Some(true));
        assert_eq!(read(" FALSE "), Some(false));
        assert_eq!(read("yes"), None);
        assert_eq!(read(""), None);
        let twice = map(&[("x-should-retry", "true"), ("x-should-retry", "false")]);
        assert_eq!(parse(&twice, now()).should_retry, None, "conflicting lines");
        assert_eq!(parse(&HeaderMap::new(), now()).should_retry, None);
    }
}

#[cfg(test)]
mod test_support {
    use std::time::{Duration, SystemTime};

    use http::{HeaderMap, HeaderName, HeaderValue};

    /// The fixed `now` of every test: 2023-11-14T22:13:20Z (a Tuesday).
    pub(crate) fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
    }

    /// `(name, raw value)` header lines, as the test tables write them.
    pub(crate) type Pairs<'a> = &'a [(&'a str, &'a [u8])];

    /// A header map from `(name, raw value)` pairs, in order (repeats append).
    pub(crate) fn map<V: AsRef<[u8]>>(pairs: &[(&str, V)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            let name = HeaderName::from_bytes(name.as_bytes()).expect("test header name");
            let value = HeaderValue::from_bytes(value.as_ref()).expect("test header value");
            headers.append(name, value);
        }
        headers
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{map, now, Pairs};
    use super::*;

    fn a(limit: u64, remaining: u64) -> Option<Allowance> {
        Some(Allowance::new(Some(limit), Some(remaining), None))
    }

    const ANTHROPIC: Pairs = &[
        ("anthropic-ratelimit-requests-limit", b"1"),
        ("anthropic-ratelimit-requests-remaining", b"1"),
    ];
    const OPENAI: Pairs = &[
        ("x-ratelimit-limit-requests", b"2"),
        ("x-ratelimit-remaining-requests", b"2"),
    ];
    const IETF: Pairs = &[
        ("ratelimit-policy", b"\"p\";q=3;w=60"),
        ("ratelimit", b"\"p\";r=3"),
    ];
    const GITHUB: Pairs = &[("x-ratelimit-limit", b"4"), ("x-ratelimit-remaining", b"4")];

    #[test]
    fn requests_precedence() {
        let cases: &[(&[Pairs], Option<Allowance>)] = &[
            (&[GITHUB, IETF, OPENAI, ANTHROPIC], a(1, 1)),
            (&[GITHUB, IETF, OPENAI], a(2, 2)),
            (&[GITHUB, IETF], a(3, 3)),
            (&[GITHUB], a(4, 4)),
            (&[], None),
        ];
        for (families, want) in cases {
            let pairs: Vec<(&str, &[u8])> = families.concat();
            assert_eq!(parse(&map(&pairs), now()).requests, *want, "{pairs:?}");
        }
    }

    #[test]
    fn tokens_precedence() {
        let cases: &[(Pairs, Option<Allowance>)] = &[
            (
                &[
                    ("x-ratelimit-limit-tokens", b"10"),
                    ("x-ratelimit-remaining-tokens", b"10"),
                    ("anthropic-ratelimit-output-tokens-limit", b"20"),
                    ("anthropic-ratelimit-output-tokens-remaining", b"20"),
                ],
                a(20, 20),
            ),
            (
                &[
                    ("x-ratelimit-limit-tokens", b"10"),
                    ("x-ratelimit-remaining-tokens", b"10"),
                ],
                a(10, 10),
            ),
            (&[("x-ratelimit-limit-requests", b"10")], None),
        ];
        for (pairs, want) in cases {
            assert_eq!(parse(&map(pairs), now()).tokens, *want, "{pairs:?}");
        }
    }

    #[test]
    fn gateway_429() {
        let h = map::<&[u8]>(&[
            ("retry-after", b"60"),
            ("rate_limit_type", b"parallel_requests"),
            ("reset_at", b"2023-11-14T22:13:45Z"),
        ]);
        let got = parse(&h, now());
        assert_eq!(got.retry_after, Some(Duration::from_secs(60)));
        assert_eq!(got.limit_kind, Some(LimitKind::Concurrency));
        assert_eq!(got.reset_after, Some(Duration::from_secs(25)));
        assert_eq!(got.limit_kind.map(LimitKind::is_window), Some(false));
        assert_eq!(parse(&HeaderMap::new(), now()), Hints::default());
    }

    #[test]
    fn allowance_rules() {
        assert_eq!(allowance(None, None, None), None);
        assert_eq!(
            allowance(Some(5), Some(6), None),
            Some(Allowance::new(Some(5), None, None))
        );
        assert_eq!(
            allowance(None, Some(6), None),
            Some(Allowance::new(None, Some(6), None))
        );
        assert_eq!(
            allowance(None, None, Some(Duration::MAX)),
            Some(Allowance::new(None, None, Some(MAX_HINT_DELAY)))
        );
    }

    /// A window `429` whose `reset_at` is 3 s past by the client's clock: the stale time is
    /// no hint, so `Retry-After` decides.
    #[test]
    fn stale_reset_at_leaves_retry_after() {
        let h = map(&[
            ("retry-after", "2"),
            ("rate_limit_type", "requests_per_minute"),
            ("reset_at", "2023-11-14T22:13:17Z"),
        ]);
        let got = parse(&h, now());
        assert_eq!(got.reset_after, None);
        assert_eq!(got.retry_after, Some(Duration::from_secs(2)));
        // The same reset_at from a server whose clock is 5 s behind: 2 s ahead for it.
        let mut skewed = h.clone();
        skewed.insert(
            http::header::DATE,
            http::HeaderValue::from_static("Tue, 14 Nov 2023 22:13:15 GMT"),
        );
        assert_eq!(
            parse(&skewed, now()).reset_after,
            Some(Duration::from_secs(2))
        );
    }

    /// A `Date` header alone is no hint.
    #[test]
    fn date_alone_is_no_hint() {
        let h = map(&[("date", "Tue, 14 Nov 2023 23:13:20 GMT")]);
        assert_eq!(parse(&h, now()), Hints::default());
    }
}
