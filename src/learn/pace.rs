//! A pace from a server's own figures: the requests it says remain, spread over the time to
//! its reset.
//!
//! Sending all that remains at once and then waiting for the reset runs into the reset's
//! resolution and into requests still in flight; sending them one interval apart reaches the
//! reset with the window used and nothing refused. The server's figures win over the local
//! count when they say less is left: the requests in flight are taken from the remaining
//! (the server may not have counted them yet).
//!
//! A pace only applies when little is left: while the remaining (less the requests in flight)
//! is more than one in-flight round (the scope's in-flight cap), the next round of sends
//! cannot use it up and the scope goes at its own pace; the last round is spread.
//!
//! Pure: numbers in, a pace out; no clock, no I/O.

use std::time::{Duration, SystemTime};

use super::rate::Bucket;
use super::reset;

/// Steps of the pace's rate per doubling: a rate is rounded down to `2^(k / STEPS)`, so a
/// pace that moves a little between answers keeps its bucket (a changed bucket starts empty).
const STEPS: f64 = 8.0;

/// The pace that spreads `remaining` requests (as an answer read at wall-clock `now`
/// reported them) over `reset_after`, with `in_flight` other requests of the scope not yet
/// answered and at most `cap` in flight at once (`None`: no cap).
///
/// The interval is the time to the reset over the remaining less the requests in flight,
/// plus one (the next send after those may go at the reset): `A` left gives `A + 1`
/// intervals, `0` left one interval of the whole time to the reset. The rate is rounded
/// down to one of 8 steps per doubling; the burst is 1.
///
/// `None` (no pace) when plenty is left (more than `cap` after the requests in flight; with
/// no cap, anything), when the reset is now or past, or when it falls on a whole second
/// ([`reset::earliest`]: rounded up by the server, up to 1 s late). Such a reset is too
/// coarse to spread sends by: measured against a moving window that reports the oldest
/// request's exit in whole seconds, spreading took 1.40 × the minimum (133 × 429) where the
/// pause on `remaining: 0` alone takes 1.18 ×.
pub(crate) fn spread(
    remaining: u64,
    reset_after: Duration,
    now: SystemTime,
    in_flight: usize,
    cap: Option<usize>,
) -> Option<Bucket> {
    if reset_after.is_zero() || reset::earliest(reset_after, now) != reset_after {
        return None;
    }
    let left = remaining.saturating_sub(in_flight as u64);
    let round = cap.map_or(0, |c| c as u64);
    if left > round {
        return None;
    }
    let rate = (left + 1) as f64 / reset_after.as_secs_f64();
    let rate = (rate.log2() * STEPS).floor() / STEPS;
    Some(Bucket {
        rate: rate.exp2(),
        burst: 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A wall-clock `now` a quarter second past a whole second, so that a reset of
    /// `n * 1000 + 750` ms is a whole-second one and any other is not.
    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_250)
    }

    fn interval(b: Bucket) -> Duration {
        Duration::from_secs_f64(1.0 / b.rate)
    }

    #[test]
    fn spreads_what_is_left_after_the_in_flight_over_the_reset() {
        // 9 left, 2 in flight, cap 10: 7 left, 8 intervals over 4001 ms, about 500 ms,
        // rounded down to a step of 2^(1/8) (the interval never shorter than the spread).
        let pace = spread(9, 4001 * MS, now(), 2, Some(10)).unwrap();
        assert_eq!(pace.burst, 1);
        let i = interval(pace);
        assert!(i >= 500 * MS && i < 546 * MS, "{i:?}");
    }

    #[test]
    fn nothing_left_waits_the_whole_time_to_the_reset() {
        let pace = spread(3, 2001 * MS, now(), 5, Some(10)).unwrap();
        let i = interval(pace);
        assert!(i >= 2001 * MS && i < 2183 * MS, "{i:?}");
    }

    #[test]
    fn plenty_left_sets_no_pace() {
        // 21 left after 10 in flight, cap 20: more than a round of sends.
        assert_eq!(spread(40, 6001 * MS, now(), 10, Some(20)), None);
        assert_eq!(spread(31, 6001 * MS, now(), 10, Some(20)), None);
        // The last round is spread.
        assert!(spread(30, 6001 * MS, now(), 10, Some(20)).is_some());
        // No cap: only "nothing left" paces.
        assert_eq!(spread(1, 6001 * MS, now(), 0, None), None);
        assert!(spread(1, 6001 * MS, now(), 1, None).is_some());
    }

    #[test]
    fn a_reset_now_or_on_a_whole_second_sets_no_pace() {
        assert_eq!(spread(0, Duration::ZERO, now(), 0, Some(4)), None);
        // On a whole second: too coarse to spread by.
        assert_eq!(spread(0, 750 * MS, now(), 0, Some(4)), None);
        assert_eq!(spread(0, 1750 * MS, now(), 0, Some(4)), None);
        // A millisecond off the second: spread.
        let i = interval(spread(0, 1751 * MS, now(), 0, Some(4)).unwrap());
        assert!(i >= 1751 * MS && i < 1910 * MS, "{i:?}");
    }

    #[test]
    fn nearby_figures_give_the_same_pace() {
        let a = spread(5, 3000 * MS + MS, now(), 0, Some(20)).unwrap();
        let b = spread(5, 3000 * MS + 3 * MS, now(), 0, Some(20)).unwrap();
        assert_eq!(a, b);
    }
}
