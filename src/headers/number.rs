//! Plain numbers in field values: counts, and decimal amounts of time.
//!
//! Nothing here can overflow: counts saturate at `u64::MAX`, amounts of time are
//! computed in `u128` nanoseconds from at most 19 significant integer digits and
//! then saturate at [`MAX_HINT_DELAY`].

use std::time::Duration;

use super::MAX_HINT_DELAY;

/// Nanoseconds in one nanosecond.
pub(super) const NANOS: u128 = 1;
/// Nanoseconds in one microsecond.
pub(super) const MICROS: u128 = 1_000;
/// Nanoseconds in one millisecond.
pub(super) const MILLIS: u128 = 1_000_000;
/// Nanoseconds in one second.
pub(super) const SECONDS: u128 = 1_000_000_000;
/// Nanoseconds in one minute.
pub(super) const MINUTES: u128 = 60 * SECONDS;
/// Nanoseconds in one hour.
pub(super) const HOURS: u128 = 60 * MINUTES;

fn digits(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_digit())
}

/// Value of a run of ASCII digits (checked by the caller), saturating at `u64::MAX`.
fn saturating(s: &str) -> u64 {
    s.bytes().fold(0u64, |acc, b| {
        acc.saturating_mul(10).saturating_add(u64::from(b - b'0'))
    })
}

/// A count: `1*DIGIT`, no sign, no fraction. Values past `u64::MAX` saturate there.
pub(super) fn count(s: &str) -> Option<u64> {
    (!s.is_empty() && digits(s)).then(|| saturating(s))
}

/// Splits a strict decimal `1*DIGIT [ "." 1*DIGIT ]` into its integer and fraction digits.
/// Signs, exponents, a bare `.5` or `5.` and anything else give `None`.
pub(super) fn decimal(s: &str) -> Option<(&str, &str)> {
    let (int, frac) = match s.split_once('.') {
        Some((int, frac)) if !frac.is_empty() => (int, frac),
        Some(_) => return None,
        None => (s, ""),
    };
    (!int.is_empty() && digits(int) && digits(frac)).then_some((int, frac))
}

/// `int.frac` units of `unit` nanoseconds, in nanoseconds, rounded UP to the next
/// nanosecond. Both parts must be ASCII digits (either may be empty).
pub(super) fn nanos(int: &str, frac: &str, unit: u128) -> u128 {
    let whole = u128::from(saturating(int)).saturating_mul(unit);
    // At most 19 fraction digits fit in a u64; later digits only matter for rounding.
    let (head, tail) = frac.split_at(frac.len().min(19));
    let mut part = 0;
    if !head.is_empty() {
        let scale = 10u128.pow(head.len() as u32);
        let num = u128::from(saturating(head)) * unit;
        part = num / scale;
        if num % scale != 0 || tail.bytes().any(|b| b != b'0') {
            part += 1;
        }
    }
    whole.saturating_add(part)
}

/// Turns nanoseconds into a delay: rounded UP to a multiple of `granularity`
/// nanoseconds, then capped at [`MAX_HINT_DELAY`].
pub(super) fn delay(nanos: u128, granularity: u128) -> Duration {
    let max = MAX_HINT_DELAY.as_nanos();
    let rounded = nanos.div_ceil(granularity).saturating_mul(granularity);
    duration(rounded.min(max))
}

/// Nanoseconds as a [`Duration`], saturating at `u64::MAX` seconds.
pub(super) fn duration(nanos: u128) -> Duration {
    let secs = u64::try_from(nanos / SECONDS).unwrap_or(u64::MAX);
    // The remainder is below 10^9, so it fits in u32.
    let sub = (nanos % SECONDS) as u32;
    Duration::new(secs, sub)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts() {
        let cases = [
            ("0", Some(0)),
            ("120", Some(120)),
            ("007", Some(7)),
            ("18446744073709551615", Some(u64::MAX)),
            ("99999999999999999999999", Some(u64::MAX)),
            ("", None),
            ("-1", None),
            ("+1", None),
            ("1.0", None),
            ("1e3", None),
            ("12 ", None),
            ("abc", None),
        ];
        for (input, want) in cases {
            assert_eq!(count(input), want, "{input:?}");
        }
    }

    #[test]
    fn decimals() {
        let cases = [
            ("12", Some(("12", ""))),
            ("1.5", Some(("1", "5"))),
            ("0.001", Some(("0", "001"))),
            (".5", None),
            ("5.", None),
            ("1.2.3", None),
            ("-1", None),
            ("1e3", None),
            ("", None),
            ("١", None),
        ];
        for (input, want) in cases {
            assert_eq!(decimal(input), want, "{input:?}");
        }
    }

    #[test]
    fn nanos_round_up() {
        let cases = [
            ("1", "", SECONDS, SECONDS),
            ("1", "5", SECONDS, 1_500_000_000),
            ("0", "0000000001", SECONDS, 1),
            ("0", "00000000001", SECONDS, 1),
            ("0", "1", NANOS, 1),
            ("0", "000000000000000000000001", SECONDS, 1),
            ("0", "5", MILLIS, 500_000),
            ("2", "000", MINUTES, 120 * SECONDS),
        ];
        for (int, frac, unit, want) in cases {
            assert_eq!(nanos(int, frac, unit), want, "{int}.{frac}");
        }
    }

    #[test]
    fn delays_round_and_saturate() {
        assert_eq!(delay(1, MILLIS), Duration::from_millis(1));
        assert_eq!(delay(1_000_000, MILLIS), Duration::from_millis(1));
        assert_eq!(delay(1_000_001, MILLIS), Duration::from_millis(2));
        assert_eq!(delay(0, MILLIS), Duration::ZERO);
        assert_eq!(delay(u128::MAX, MILLIS), MAX_HINT_DELAY);
        assert_eq!(delay(u128::MAX, NANOS), MAX_HINT_DELAY);
        assert_eq!(duration(u128::MAX).as_secs(), u64::MAX);
    }
}
