//! Capped exponential backoff and jitter.

use std::time::Duration;

use rand::Rng;

/// Capped exponential backoff: `base`, `2 × base`, `4 × base`, … never above `cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Backoff {
    /// The first delay (before retry 0).
    pub base: Duration,
    /// The largest delay, applied after jitter.
    pub cap: Duration,
}

impl Backoff {
    /// A backoff whose first delay is `base`, doubling each retry, never above `cap`.
    ///
    /// Taken as given, without checks ([`ThrottleBuilder::build`](crate::ThrottleBuilder::build)
    /// refuses a zero `base` or a `base` above `cap`): here a zero `base` gives zero delays,
    /// and a `base` above `cap` gives `cap` every time.
    pub const fn new(base: Duration, cap: Duration) -> Self {
        Backoff { base, cap }
    }

    /// The delay before retry number `retry` (0 for the first retry): `base × 2^retry`,
    /// saturating, at most `cap`. No jitter.
    pub fn delay(&self, retry: u32) -> Duration {
        let factor = 1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }
}

/// How waits are spread so that callers refused together do not come back together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Jitter {
    /// Waits are exactly as computed.
    Off,
    /// Backoff delays are drawn from `[d/2, d]` ("equal jitter"); waits the server asked for
    /// get up to 10 % added (at most 1 s), never subtracted.
    On,
}

/// The most jitter added on top of a wait the server asked for.
pub const MAX_ADDED_JITTER: Duration = Duration::from_secs(1);

impl Jitter {
    /// A backoff delay `d` with jitter: uniform in `[d/2, d]`, so it never exceeds `d` (and so
    /// never exceeds the cap `d` was already limited to).
    pub fn spread(self, d: Duration, rng: &mut impl Rng) -> Duration {
        match self {
            Jitter::Off => d,
            Jitter::On => {
                let half = d / 2;
                half + mul_fraction(d - half, rng.random::<f64>())
            }
        }
    }

    /// A wait `d` the server asked for, with jitter added on top: uniform in
    /// `[d, d + min(d/10, 1 s)]`. Never shorter than `d`.
    pub fn add(self, d: Duration, rng: &mut impl Rng) -> Duration {
        match self {
            Jitter::Off => d,
            Jitter::On => {
                let room = (d / 10).min(MAX_ADDED_JITTER);
                d.saturating_add(mul_fraction(room, rng.random::<f64>()))
            }
        }
    }
}

/// `d × f` for `f` in `[0, 1)`, in whole nanoseconds, never above `d`.
fn mul_fraction(d: Duration, f: f64) -> Duration {
    let nanos = (d.as_nanos() as f64 * f.clamp(0.0, 1.0)) as u128;
    Duration::from_nanos(nanos.min(d.as_nanos()).try_into().unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn doubles_from_base_up_to_cap() {
        let b = Backoff::new(S, 60 * S);
        let delays: Vec<_> = (0..8).map(|r| b.delay(r)).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60].map(|s| s * S).to_vec());
        assert_eq!(b.delay(u32::MAX), 60 * S);
    }

    #[test]
    fn jitter_off_is_exact() {
        let mut rng = SmallRng::seed_from_u64(1);
        assert_eq!(Jitter::Off.spread(10 * S, &mut rng), 10 * S);
        assert_eq!(Jitter::Off.add(10 * S, &mut rng), 10 * S);
    }

    #[test]
    fn seeded_jitter_is_repeatable() {
        let a = Jitter::On.spread(8 * S, &mut SmallRng::seed_from_u64(7));
        let b = Jitter::On.spread(8 * S, &mut SmallRng::seed_from_u64(7));
        assert_eq!(a, b);
        assert!(a >= 4 * S && a <= 8 * S, "{a:?}");
    }

    proptest! {
        #[test]
        fn spread_stays_within_half_and_whole(ms in 0u64..10_000_000, seed: u64, retry in 0u32..40) {
            let b = Backoff::new(Duration::from_millis(ms.max(1)), Duration::from_millis(ms.max(1) * 3));
            let d = b.delay(retry);
            let j = Jitter::On.spread(d, &mut SmallRng::seed_from_u64(seed));
            prop_assert!(j <= b.cap);
            prop_assert!(j <= d && j >= d / 2);
        }

        #[test]
        fn added_jitter_never_shortens_and_is_bounded(ms in 0u64..u64::MAX / 2_000_000, seed: u64) {
            let d = Duration::from_millis(ms);
            let j = Jitter::On.add(d, &mut SmallRng::seed_from_u64(seed));
            prop_assert!(j >= d);
            prop_assert!(j - d <= MAX_ADDED_JITTER.min(d / 10));
        }
    }
}
