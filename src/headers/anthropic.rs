//! Anthropic style `anthropic-ratelimit-{family}-{limit,remaining,reset}`, where the
//! family is `requests`, `tokens`, `input-tokens` or `output-tokens`.
//!
//! Limits and remainders are counts; resets are RFC 3339 times (a time not after now is
//! no hint, see [`super::clock`]). The combined `tokens` family is the token allowance when present;
//! otherwise the input or output family with the smaller `remaining` stands in for
//! it (a known `remaining` beats an unknown one; on a tie, input wins).

use http::HeaderMap;

use super::{allowance, clock::Clock, field, number, Allowance};

/// The allowances found in the `anthropic-ratelimit-*` headers.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Anthropic {
    pub(super) requests: Option<Allowance>,
    pub(super) tokens: Option<Allowance>,
    pub(super) input_tokens: Option<Allowance>,
    pub(super) output_tokens: Option<Allowance>,
}

/// Reads every `anthropic-ratelimit-*` family.
pub(super) fn read(headers: &HeaderMap, clock: &Clock) -> Anthropic {
    let family = |name: &str| {
        let value =
            |part: &str| field::single(headers, &format!("anthropic-ratelimit-{name}-{part}"));
        allowance(
            value("limit").and_then(number::count),
            value("remaining").and_then(number::count),
            value("reset").and_then(|v| clock.rfc3339_reset(v)),
        )
    };
    let input_tokens = family("input-tokens");
    let output_tokens = family("output-tokens");
    Anthropic {
        requests: family("requests"),
        tokens: family("tokens").or_else(|| tighter(input_tokens, output_tokens)),
        input_tokens,
        output_tokens,
    }
}

/// The allowance with less left: known `remaining` before unknown, `first` on a tie.
fn tighter(first: Option<Allowance>, second: Option<Allowance>) -> Option<Allowance> {
    match (first, second) {
        (Some(a), Some(b)) => {
            // Unknown sorts after every known value.
            let key = |x: &Allowance| (x.remaining.is_none(), x.remaining);
            Some(if key(&b) < key(&a) { b } else { a })
        }
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::headers::test_support::{map, now, Pairs};

    fn a(limit: Option<u64>, remaining: Option<u64>, reset_s: Option<u64>) -> Option<Allowance> {
        Some(Allowance::new(
            limit,
            remaining,
            reset_s.map(Duration::from_secs),
        ))
    }

    #[test]
    fn requests_family() {
        let cases: &[(Pairs, Option<Allowance>)] = &[
            (
                &[
                    ("anthropic-ratelimit-requests-limit", b"50"),
                    ("anthropic-ratelimit-requests-remaining", b"45"),
                    (
                        "anthropic-ratelimit-requests-reset",
                        b"2023-11-14T22:14:00Z",
                    ),
                ],
                a(Some(50), Some(45), Some(40)),
            ),
            // a reset not after now, or implausibly far, is no hint
            (
                &[(
                    "anthropic-ratelimit-requests-reset",
                    b"2023-11-14T22:00:00Z",
                )],
                None,
            ),
            (
                &[
                    ("anthropic-ratelimit-requests-limit", b"50"),
                    (
                        "anthropic-ratelimit-requests-reset",
                        b"2023-11-14T22:13:17Z",
                    ),
                ],
                a(Some(50), None, None),
            ),
            (
                &[(
                    "anthropic-ratelimit-requests-reset",
                    b"2030-01-01T00:00:00Z",
                )],
                Some(Allowance::new(
                    None,
                    None,
                    Some(crate::headers::MAX_HINT_DELAY),
                )),
            ),
            (
                &[(
                    "anthropic-ratelimit-requests-reset",
                    b"2023-11-14T23:14:00+01:00",
                )],
                a(None, None, Some(40)),
            ),
            // remaining above limit is dropped
            (
                &[
                    ("anthropic-ratelimit-requests-limit", b"50"),
                    ("anthropic-ratelimit-requests-remaining", b"51"),
                ],
                a(Some(50), None, None),
            ),
            // malformed
            (&[("anthropic-ratelimit-requests-reset", b"40s")], None),
            (
                &[("anthropic-ratelimit-requests-reset", b"1700000040")],
                None,
            ),
            (&[("anthropic-ratelimit-requests-limit", b"5O")], None),
            (&[("anthropic-ratelimit-requests-limit", b"")], None),
            (&[], None),
        ];
        for (pairs, want) in cases {
            assert_eq!(
                read(&map(pairs), &Clock::at(now())).requests,
                *want,
                "{pairs:?}"
            );
        }
    }

    #[test]
    fn token_families() {
        let full = |fam: &str, remaining: &'static [u8]| {
            [
                (format!("anthropic-ratelimit-{fam}-limit"), &b"1000"[..]),
                (format!("anthropic-ratelimit-{fam}-remaining"), remaining),
            ]
        };
        type Case = (Vec<(String, &'static [u8])>, Option<Allowance>);
        let cases: Vec<Case> = vec![
            // the combined family wins
            (
                [full("tokens", b"900"), full("input-tokens", b"10")].concat(),
                a(Some(1000), Some(900), None),
            ),
            // otherwise the smaller remaining of input and output
            (
                [full("input-tokens", b"300"), full("output-tokens", b"200")].concat(),
                a(Some(1000), Some(200), None),
            ),
            (
                [full("input-tokens", b"100"), full("output-tokens", b"200")].concat(),
                a(Some(1000), Some(100), None),
            ),
            // known remaining beats unknown
            (
                [full("input-tokens", b"x"), full("output-tokens", b"999")].concat(),
                a(Some(1000), Some(999), None),
            ),
            (
                full("output-tokens", b"5").to_vec(),
                a(Some(1000), Some(5), None),
            ),
            (vec![], None),
        ];
        for (pairs, want) in cases {
            let borrowed: Vec<(&str, &[u8])> =
                pairs.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            let got = read(&map(&borrowed), &Clock::at(now()));
            assert_eq!(got.tokens, want, "{pairs:?}");
        }
        let h = map(&[
            ("anthropic-ratelimit-input-tokens-remaining", b"7"),
            ("anthropic-ratelimit-output-tokens-remaining", b"8"),
        ]);
        let got = read(&h, &Clock::at(now()));
        assert_eq!(got.input_tokens, a(None, Some(7), None));
        assert_eq!(got.output_tokens, a(None, Some(8), None));
        assert_eq!(got.tokens, a(None, Some(7), None));
    }

    /// RFC 3339 resets are read against the server's clock when `Date` shows a clear skew.
    #[test]
    fn resets_under_clock_skew() {
        // (Date, reset on the server's clock 2 s after its Date, wanted seconds)
        let cases = [
            (
                "Tue, 14 Nov 2023 22:13:23 GMT",
                "2023-11-14T22:13:25Z",
                Some(2),
            ), // 3 s ahead
            (
                "Tue, 14 Nov 2023 23:13:20 GMT",
                "2023-11-14T23:13:22Z",
                Some(2),
            ), // 1 h ahead
            (
                "Tue, 14 Nov 2023 22:13:17 GMT",
                "2023-11-14T22:13:19Z",
                Some(2),
            ), // 3 s behind
            (
                "Tue, 14 Nov 2023 21:13:20 GMT",
                "2023-11-14T21:13:22Z",
                Some(2),
            ), // 1 h behind
            (
                "Tue, 14 Nov 2023 22:13:18 GMT",
                "2023-11-14T22:13:20Z",
                Some(0),
            ), // 2 s: noise; reset now
            (
                "Tue, 14 Nov 2023 23:13:20 GMT",
                "2023-11-14T22:14:00Z",
                None,
            ), // past for it
        ];
        for (date, reset, want) in cases {
            let h = map(&[
                ("date", date),
                ("anthropic-ratelimit-tokens-limit", "1000"),
                ("anthropic-ratelimit-tokens-reset", reset),
            ]);
            let got = crate::headers::parse(&h, now()).tokens;
            assert_eq!(got, a(Some(1000), None, want), "{date} {reset}");
        }
    }
}
