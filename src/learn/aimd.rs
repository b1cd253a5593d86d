//! The in-flight cap learned from parallel-limit refusals: additive increase, multiplicative
//! decrease (the multi-agent seed's rule: one more every 10 successes, halved on a refusal),
//! within 1 and the configured `max_in_flight`.

/// Successes that raise the cap by one (the seed's default).
pub(crate) const SUCCESSES_PER_STEP: u32 = 10;

/// An AIMD in-flight cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Aimd {
    cap: usize,
    max: usize,
    successes: u32,
}

impl Aimd {
    /// A cap that starts at, and never exceeds, `max` (at least 1).
    pub(crate) fn new(max: usize) -> Self {
        let max = max.max(1);
        Self {
            cap: max,
            max,
            successes: 0,
        }
    }

    /// A cap of at most `max` that starts at `cap` (a warm start), within 1 and `max`.
    pub(crate) fn warm(max: usize, cap: usize) -> Self {
        let mut a = Self::new(max);
        a.cap = cap.clamp(1, a.max);
        a
    }

    /// The largest cap.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// The cap now.
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// A parallel-limit refusal: the cap halves (never below 1). Returns the new cap if it
    /// changed.
    pub(crate) fn refused(&mut self) -> Option<usize> {
        self.successes = 0;
        let halved = (self.cap / 2).max(1);
        (halved != self.cap).then(|| {
            self.cap = halved;
            halved
        })
    }

    /// A success: every [`SUCCESSES_PER_STEP`]th raises the cap by one (never above the
    /// maximum). Returns the new cap if it changed.
    pub(crate) fn succeeded(&mut self) -> Option<usize> {
        if self.cap >= self.max {
            return None;
        }
        self.successes += 1;
        if self.successes < SUCCESSES_PER_STEP {
            return None;
        }
        self.successes = 0;
        self.cap += 1;
        Some(self.cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_on_refusal_and_grows_by_one_per_ten_successes() {
        let mut a = Aimd::new(10);
        assert_eq!(a.refused(), Some(5));
        assert_eq!(a.refused(), Some(2));
        assert_eq!(a.refused(), Some(1));
        assert_eq!(a.refused(), None, "never below 1");
        let grown: Vec<Option<usize>> = (0..10).map(|_| a.succeeded()).collect();
        assert_eq!(grown[..9], [None; 9]);
        assert_eq!(grown[9], Some(2));
        for _ in 0..1000 {
            a.succeeded();
        }
        assert_eq!(a.cap(), 10, "never above the maximum");
    }

    #[test]
    fn converges_below_a_server_cap_and_never_exceeds_the_maximum() {
        // A server that refuses whenever more than 6 are in flight; the client keeps its cap
        // full. The cap saws between 3 and 6 + 1 and never passes 10.
        let mut a = Aimd::new(10);
        let mut seen = Vec::new();
        for _ in 0..2000 {
            if a.cap() > 6 {
                a.refused();
            } else {
                a.succeeded();
            }
            assert!(a.cap() <= 10 && a.cap() >= 1);
            seen.push(a.cap());
        }
        let tail = &seen[1000..];
        assert_eq!(tail.iter().max(), Some(&7));
        assert_eq!(tail.iter().min(), Some(&3));
    }
}
