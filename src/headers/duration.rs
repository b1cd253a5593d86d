//! Go duration strings, as OpenAI sends in `x-ratelimit-reset-*` (e.g. `6m0s`).
//!
//! The grammar follows Go's `time.ParseDuration`: one or more `number unit` pairs,
//! where a number is decimal (`1`, `1.5`, `.5` or `5.`) and a unit is one of
//! `ns`, `us`, `µs` (U+00B5), `μs` (U+03BC), `ms`, `s`, `m`, `h`. A leading `+` is
//! allowed, as in Go. Departures from Go, all documented in the module table:
//!
//! * a bare number with no unit (`20`, `1.5`) is seconds, not an error;
//! * a negative duration (`-1s`) means "unknown" and gives `None`;
//! * no overflow error: large values saturate at [`MAX_HINT_DELAY`](super::MAX_HINT_DELAY),
//!   and fractions finer than a nanosecond round UP to the next nanosecond.

use std::time::Duration;

use super::number;

fn unit(name: &str) -> Option<u128> {
    Some(match name {
        "ns" => number::NANOS,
        "us" | "\u{b5}s" | "\u{3bc}s" => number::MICROS,
        "ms" => number::MILLIS,
        "s" => number::SECONDS,
        "m" => number::MINUTES,
        "h" => number::HOURS,
        _ => return None,
    })
}

/// Parses a Go duration string (see the module docs). `None` if malformed or negative.
pub(super) fn parse(value: &str) -> Option<Duration> {
    if let Some((int, frac)) = number::decimal(value) {
        return Some(number::delay(
            number::nanos(int, frac, number::SECONDS),
            number::NANOS,
        ));
    }
    let mut rest = value.strip_prefix('+').unwrap_or(value);
    if rest.is_empty() {
        return None;
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (int, after) = rest.split_at(int_len);
        let (frac, after) = match after.strip_prefix('.') {
            Some(after) => {
                let len = after
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(after.len());
                after.split_at(len)
            }
            None => ("", after),
        };
        if int.is_empty() && frac.is_empty() {
            return None;
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (name, after) = after.split_at(unit_len);
        total = total.saturating_add(number::nanos(int, frac, unit(name)?));
        rest = after;
    }
    Some(number::delay(total, number::NANOS))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::MAX_HINT_DELAY;

    fn ms(v: u64) -> Option<Duration> {
        Some(Duration::from_millis(v))
    }

    #[test]
    fn go_durations() {
        let cases = [
            ("1s", ms(1_000)),
            ("6m0s", ms(360_000)),
            ("20ms", ms(20)),
            ("1h2m3.5s", ms(3_723_500)),
            ("500us", Some(Duration::from_micros(500))),
            ("500µs", Some(Duration::from_micros(500))),
            ("500μs", Some(Duration::from_micros(500))),
            ("750ns", Some(Duration::from_nanos(750))),
            ("0s", ms(0)),
            ("0", ms(0)),
            ("+2s", ms(2_000)),
            (".5s", ms(500)),
            ("5.s", ms(5_000)),
            ("1.5m", ms(90_000)),
            ("0.1ns", Some(Duration::from_nanos(1))),
            ("2m1s500ms", ms(121_500)),
            // bare numbers are seconds
            ("20", ms(20_000)),
            ("1.25", ms(1_250)),
            // saturation
            ("9999999h", Some(MAX_HINT_DELAY)),
            ("99999999999999999999999s", Some(MAX_HINT_DELAY)),
            (
                "9999999999999999999h9999999999999999999h",
                Some(MAX_HINT_DELAY),
            ),
            // negative means unknown
            ("-1s", None),
            ("-0", None),
            // malformed
            ("", None),
            ("+", None),
            ("s", None),
            (".s", None),
            ("1", ms(1_000)),
            ("1x", None),
            ("1d", None),
            ("1S", None),
            ("1 s", None),
            ("1s ", None),
            ("1s2", None),
            ("1.2.3s", None),
            ("1e3s", None),
            ("ms", None),
            ("1µ", None),
            ("--1s", None),
            ("+-1s", None),
        ];
        for (input, want) in cases {
            assert_eq!(parse(input), want, "{input:?}");
        }
    }
}
