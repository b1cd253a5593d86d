//! [`ScopeLearner`]: what one scope learns from its answers, and its circuit breaker.

use std::num::NonZeroU32;
use std::time::{Duration, Instant, SystemTime};

use http::StatusCode;

use super::aimd::Aimd;
use super::breaker::{self, Breaker, Change, CircuitState, Pass};
use super::rate::{Bucket, RateModel, Seen};
use super::window::WindowModel;
use super::{LearnConfig, LearnedLimits, RetryAfterPolicy};
use crate::headers::{Hints, LimitKind};
use crate::store::{Limits, Unit, WindowQuota};

/// One attempt's answer, as the learner sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Answer<'a> {
    /// The send's number, from [`ScopeLearner::sent`].
    pub(crate) seq: u64,
    /// When the answer came.
    pub(crate) now: Instant,
    /// The wall-clock time its hints were read at (what their delays are relative to).
    pub(crate) read_at: SystemTime,
    /// The scope's other requests in flight when it came.
    pub(crate) in_flight: usize,
    /// The status, or `None` for a transport error.
    pub(crate) status: Option<StatusCode>,
    /// The answer's hints.
    pub(crate) hints: Option<&'a Hints>,
    /// Whether this attempt was the half-open circuit's probe.
    pub(crate) probe: bool,
}

/// What an answer changed.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Learned {
    /// The scope's new limits and the learned values in them, when a learned value changed.
    pub(crate) limits: Option<(Limits, InForce)>,
    /// The longest the scope's cooldown should stay closed for this answer, when the
    /// [`RetryAfterPolicy::Learned`] policy cuts a coarse `Retry-After`.
    pub(crate) cooldown_cap: Option<Duration>,
    /// The change this answer made to the circuit, if any.
    pub(crate) circuit: Option<Change>,
    /// When [`limits`](Self::limits) adds a learned window: the sends already made that it
    /// counts (oldest first), so that it does not start empty mid-run.
    pub(crate) sent: Vec<Instant>,
}

/// The learned values a scope's limits hold now, as in [`LearnedLimits`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct InForce {
    /// The learned pace, in requests per second.
    pub(crate) rate: Option<f64>,
    /// The burst of that pace.
    pub(crate) burst: Option<u32>,
    /// The in-flight cap in force (learned, at most the configured one).
    pub(crate) max_in_flight: Option<usize>,
}

/// What [`ScopeLearner::limits`] is made of: the rate model's pace, the pace from headers,
/// the in-flight cap and the learned window.
type Paces = (
    Option<Bucket>,
    Option<Bucket>,
    Option<usize>,
    Option<super::LearnedWindow>,
);

/// One scope's estimators and breaker.
#[derive(Debug)]
pub(crate) struct ScopeLearner {
    learn: bool,
    policy: RetryAfterPolicy,
    probe_after: Duration,
    /// See [`LearnConfig::max_wait`].
    max_wait: Duration,
    /// The configured limits, to which the learned ones are added.
    base: Limits,
    rate: RateModel,
    window: WindowModel,
    /// A window loaded for a warm start (applied as a sliding window).
    warm_window: Option<super::LearnedWindow>,
    /// The confidence loaded with a warm start's rate.
    warm_confidence: f64,
    aimd: Option<Aimd>,
    /// The pace from the server's latest remaining and reset (see [`pace`](super::pace)).
    header_pace: Option<Bucket>,
    /// The server has reported a reset (a window server): its refusals say nothing of a
    /// token bucket, even one whose reset came too late to be read (already past).
    resets: bool,
    /// Parallel-limit refusals of sends numbered below this were sent before the cap was last
    /// lowered: the same episode, not lowered again.
    aimd_episode_end: u64,
    breaker: Option<Breaker>,
}

impl ScopeLearner {
    pub(crate) fn new(config: &LearnConfig, base: Limits, warm: Option<&LearnedLimits>) -> Self {
        let learn = config.learn;
        let prior = warm
            .filter(|_| learn)
            .and_then(|w| Some((w.rate?, w.burst?)))
            .filter(|(rate, _)| rate.is_finite() && *rate > 0.0)
            .map(|(rate, burst)| Bucket {
                rate,
                burst: burst.max(1),
            });
        let max = base.max_in_flight;
        let mut aimd = learn.then_some(max).flatten().map(Aimd::new);
        if let (Some(a), Some(cap)) = (&mut aimd, warm.and_then(|w| w.max_in_flight)) {
            *a = Aimd::warm(a.max(), cap);
        }
        let warm_window = warm
            .filter(|_| learn)
            .and_then(|w| w.window)
            .filter(|w| w.limit > 0 && !w.window.is_zero());
        Self {
            learn,
            policy: config.retry_after,
            probe_after: config.probe_after,
            max_wait: config.max_wait,
            base,
            rate: prior.map_or_else(RateModel::default, RateModel::warm),
            window: WindowModel::default(),
            warm_window,
            // A confidence that is not a number is no confidence.
            warm_confidence: warm
                .map(|w| w.confidence)
                .filter(|c| !c.is_nan())
                .map_or(0.0, |c| c.clamp(0.0, 1.0)),
            aimd,
            header_pace: None,
            // A window loaded for a warm start is a window server's.
            resets: warm_window.is_some(),
            aimd_episode_end: 0,
            breaker: config.breaker.map(Breaker::new),
        }
    }

    /// The scope's limits now: the configured ones, with what was learned.
    pub(crate) fn limits(&self) -> Limits {
        let mut limits = self.base.clone();
        if !self.learn {
            return limits;
        }
        if let Some(a) = &self.aimd {
            limits.max_in_flight = Some(a.cap());
        }
        if let Some(w) = self.window.learned.or(self.warm_window) {
            if let Some(limit) = NonZeroU32::new(w.limit) {
                // The learned length already holds a round trip of margin (see `window`): half
                // the configured guard covers the rest of the spread in one-way latency.
                let guard = limits.bucket_guard / 2;
                let quota = WindowQuota::new(limit, w.window, guard);
                limits = limits.with_window(quota.with_unit(Unit::Requests));
            }
        }
        if let Some(pace) = slower(self.rate.pace, self.header_pace) {
            if let Some(quota) = quota_of(pace) {
                // The latency guard keeps part of a bucket's burst in hand; a learned burst
                // keeps at least one cell usable (a pace of burst 1 keeps none in hand).
                // (Saturating: a slow pace of a large burst, loaded for a warm start, keeps
                // its cells for longer than a `Duration` holds.)
                let usable = Duration::try_from_secs_f64(f64::from(pace.burst - 1) / pace.rate)
                    .unwrap_or(Duration::MAX);
                if self.base.buckets.is_empty() {
                    limits.bucket_guard = limits.bucket_guard.min(usable);
                }
                limits = limits.with_bucket(quota);
            }
        }
        limits
    }

    /// Logs a send made at `now`; its number goes into its [`Answer`].
    pub(crate) fn sent(&mut self, now: Instant) -> u64 {
        self.rate.sent(now)
    }

    /// Send `seq` will never be answered (see [`RateModel::abandoned`]).
    pub(crate) fn abandoned(&mut self, seq: u64) {
        self.rate.abandoned(seq);
    }

    /// Whether a request may go now (the circuit breaker); `Err` holds the time until it may
    /// (`None`: the half-open probe is under way).
    pub(crate) fn check(&mut self, now: Instant) -> Result<Pass, Option<Duration>> {
        match &mut self.breaker {
            Some(b) => b.check(now),
            None => Ok(Pass::Go),
        }
    }

    /// The probe ended without an answer.
    pub(crate) fn probe_abandoned(&mut self) {
        if let Some(b) = &mut self.breaker {
            b.probe_abandoned();
        }
    }

    /// The circuit's state at `now`.
    pub(crate) fn circuit(&self, now: Instant) -> CircuitState {
        self.breaker
            .as_ref()
            .map_or(CircuitState::Closed, |b| b.state(now))
    }

    /// Learns from one answer.
    pub(crate) fn answered(&mut self, a: Answer<'_>) -> Learned {
        let none = Hints::default();
        let hints = a.hints.unwrap_or(&none);
        let mut out = Learned::default();
        let before = self.paces();
        self.resets |=
            hints.reset_after.is_some() || hints.allowances().any(|a| a.reset_after.is_some());
        let (seen, result) = match a.status {
            None => (Seen::Unknown, breaker::Result::Failure { asked: None }),
            Some(s) if s.is_server_error() => (
                Seen::Unknown,
                breaker::Result::Failure {
                    asked: hints.retry_after,
                },
            ),
            Some(StatusCode::TOO_MANY_REQUESTS) => {
                (self.refusal(hints, &a), breaker::Result::Refused)
            }
            Some(_) => (Seen::Admitted, breaker::Result::Success),
        };
        if let Some(b) = &mut self.breaker {
            out.circuit = b.record(result, a.probe, a.now);
        }
        if !self.learn {
            return out;
        }
        let seen = match seen {
            Seen::Pending => Seen::Unknown,
            s => s,
        };
        self.rate.answered(a.seq, seen, a.now);
        match seen {
            Seen::Admitted => {
                if let Some(aimd) = &mut self.aimd {
                    aimd.succeeded();
                }
                self.rate.probe_up(a.now, self.probe_after);
            }
            Seen::Refused => out.cooldown_cap = self.cooldown_cap(hints),
            Seen::Pending | Seen::Unknown => {}
        }
        if a.hints.is_some() {
            // An answer without a request allowance lifts the pace; a transport error keeps it.
            self.header_pace = self.pace_from(hints, &a);
        }
        if self.settle_window() && self.warm_window.is_none() {
            out.sent = self.rate.counted_sends().collect();
        }
        if self.paces() != before {
            out.limits = Some((self.limits(), self.in_force()));
        }
        out
    }

    /// Learns the window of a window refusal once the sends made before it are answered;
    /// whether it was learned now.
    fn settle_window(&mut self) -> bool {
        let Some((before, reset_at)) = self.window.waiting_for() else {
            return false;
        };
        match self.rate.window_from(before, reset_at) {
            Some(from) => self.window.settle(from).is_some(),
            None => false,
        }
    }

    /// What [`limits`](Self::limits) is made of, to tell whether an answer changed it.
    fn paces(&self) -> Paces {
        (
            self.rate.pace,
            self.header_pace,
            self.aimd.as_ref().map(Aimd::cap),
            self.window.learned,
        )
    }

    /// The pace the server's request allowance asks for (none without one: with no
    /// remaining and reset reported, nothing is paced from headers).
    fn pace_from(&self, hints: &Hints, a: &Answer<'_>) -> Option<Bucket> {
        let requests = hints.requests?;
        let cap = self.limits_cap();
        // A reset further ahead than the throttle waits on the server's word sets no pace
        // either (a pace of one request a year is such a wait).
        let reset = requests.reset_after.filter(|&d| d <= self.max_wait)?;
        super::pace::spread(requests.remaining?, reset, a.read_at, a.in_flight, cap)
    }

    /// The in-flight cap in force: learned, else configured.
    fn limits_cap(&self) -> Option<usize> {
        self.aimd
            .as_ref()
            .map(Aimd::cap)
            .or(self.base.max_in_flight)
    }

    /// Feeds a 429 to the model it concerns; what the rate model should log.
    fn refusal(&mut self, hints: &Hints, a: &Answer<'_>) -> Seen {
        if !self.learn {
            return Seen::Unknown;
        }
        if hints.limit_kind == Some(LimitKind::Concurrency) {
            // Once per episode: the sends refused together were made at the old cap.
            if let Some(aimd) = self
                .aimd
                .as_mut()
                .filter(|_| a.seq >= self.aimd_episode_end)
            {
                aimd.refused();
                self.aimd_episode_end = self.rate.next_seq();
            }
            return Seen::Unknown;
        }
        // A refusal with a reset time: a window server, whose reset closes the cooldown.
        let reset = hints.reset_after.or_else(|| {
            hints
                .allowances()
                .filter(|a| a.remaining == Some(0))
                .find_map(|a| a.reset_after)
        });
        if let Some(reset) = reset.filter(|&r| r <= self.max_wait) {
            self.window.refused(a.now, reset, self.rate.next_seq());
        }
        if self.resets {
            return Seen::Unknown;
        }
        Seen::Refused
    }

    /// Under [`RetryAfterPolicy::Learned`], the cooldown a coarse `Retry-After` is cut to:
    /// one learned interval between sends.
    fn cooldown_cap(&self, hints: &Hints) -> Option<Duration> {
        if self.policy != RetryAfterPolicy::Learned {
            return None;
        }
        let fit = self.rate.fit.filter(|f| f.pinned())?;
        let interval = Duration::from_secs_f64(1.0 / fit.lo);
        let asked = hints.retry_after?;
        let coarse = asked >= Duration::from_secs(1) && asked > interval * 10;
        coarse.then_some(interval)
    }

    /// How sure the learned rate is, from 0 to 1.
    fn confidence(&self) -> f64 {
        match (self.rate.fit, self.rate.prior) {
            (Some(f), _) => f.confidence(),
            (None, Some(_)) => self.warm_confidence,
            (None, None) => 0.0,
        }
    }

    /// The learned values in force now.
    pub(crate) fn in_force(&self) -> InForce {
        let pace = self.rate.pace.filter(|_| self.learn);
        InForce {
            rate: pace.map(|p| p.rate),
            burst: pace.map(|p| p.burst),
            // As in `limits`: the learned cap when one is learned, else the configured one.
            max_in_flight: self
                .aimd
                .as_ref()
                .map_or(self.base.max_in_flight, |a| Some(a.cap())),
        }
    }

    /// What was learned, for scope `label`.
    pub(crate) fn snapshot(&self, label: &str) -> LearnedLimits {
        let in_force = self.in_force();
        // A pinned estimate rather than a pace probing above it.
        let pace = match self.rate.estimate().filter(|_| self.learn) {
            Some(estimate) => Some(estimate),
            None => self.rate.pace.filter(|_| self.learn),
        };
        LearnedLimits {
            scope: label.to_owned(),
            rate: pace.map(|p| p.rate),
            burst: pace.map(|p| p.burst),
            window: self.window.learned.or(self.warm_window),
            max_in_flight: in_force.max_in_flight,
            confidence: self.confidence(),
            episodes: self.rate.episodes,
        }
    }
}

/// The slower of two paces (the one of lower rate), or the one there is.
fn slower(a: Option<Bucket>, b: Option<Bucket>) -> Option<Bucket> {
    match (a, b) {
        (Some(a), Some(b)) if b.rate < a.rate => Some(b),
        (Some(a), _) => Some(a),
        (None, b) => b,
    }
}

/// The token-bucket quota of a pace: one cell every `1 / rate`, `burst` at once.
fn quota_of(pace: Bucket) -> Option<governor::Quota> {
    if !(pace.rate.is_finite() && pace.rate > 0.0) {
        return None;
    }
    let burst = NonZeroU32::new(pace.burst.max(1))?;
    // A whole burst refills in at most 100 years (governor multiplies the period by the
    // burst in nanoseconds: no overflow); at least one cell per nanosecond.
    let longest = crate::clock::FAR_FUTURE / burst.get();
    let period = Duration::try_from_secs_f64(1.0 / pace.rate).ok()?.clamp(
        Duration::from_nanos(1),
        longest.max(Duration::from_nanos(1)),
    );
    Some(governor::Quota::with_period(period)?.allow_burst(burst))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::Allowance;
    use crate::learn::DEFAULT_PROBE_AFTER;

    fn learner(learn: bool) -> ScopeLearner {
        let config = LearnConfig::new(learn, None, RetryAfterPolicy::Strict, DEFAULT_PROBE_AFTER);
        ScopeLearner::new(&config, Limits::new().with_max_in_flight(Some(10)), None)
    }

    /// A 200 reporting `remaining` requests left for `reset_ms`, with `in_flight` others out.
    fn answer(l: &mut ScopeLearner, hints: Option<&Hints>, in_flight: usize) -> Learned {
        let now = Instant::now();
        let seq = l.sent(now);
        l.answered(Answer {
            seq,
            now,
            // A quarter second past a whole second: the resets below are not whole seconds.
            read_at: SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_250),
            in_flight,
            status: Some(StatusCode::OK),
            hints,
            probe: false,
        })
    }

    /// A 429 for send `seq` with `hints`, answered at `now`.
    fn refusal(l: &mut ScopeLearner, seq: u64, now: Instant, hints: &Hints) -> Learned {
        l.answered(Answer {
            seq,
            now,
            read_at: SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_250),
            in_flight: 0,
            status: Some(StatusCode::TOO_MANY_REQUESTS),
            hints: Some(hints),
            probe: false,
        })
    }

    #[test]
    fn a_window_server_refusal_without_a_reset_teaches_no_token_bucket() {
        let mut l = learner(true);
        let t0 = Instant::now();
        let window = Hints {
            reset_after: Some(Duration::from_secs(3)),
            ..Hints::default()
        };
        // A reset already past when read is no hint: only the Retry-After is left.
        let late = Hints {
            retry_after: Some(Duration::from_secs(3)),
            ..Hints::default()
        };
        let seqs: Vec<u64> = (0..6)
            .map(|i| l.sent(t0 + Duration::from_millis(i)))
            .collect();
        for &q in &seqs[..4] {
            answer_sent(&mut l, q, t0);
        }
        refusal(&mut l, seqs[4], t0 + Duration::from_millis(10), &window);
        let after = refusal(&mut l, seqs[5], t0 + Duration::from_millis(20), &late);
        assert_eq!(l.rate.episodes, 0);
        assert_eq!(l.rate.pace, None);
        // The window was learned (4 admitted), and added to the limits with its sends.
        let learned = l.window.learned.unwrap();
        assert_eq!(learned.limit, 4);
        let (limits, _) = after.limits.unwrap();
        assert_eq!(limits.windows.len(), 1);
        assert_eq!(
            after.sent.len(),
            4,
            "the admitted sends, to count in the window"
        );
        // Without a reset seen first, the same refusal is a token bucket's.
        let mut fresh = learner(true);
        let seqs: Vec<u64> = (0..3).map(|_| fresh.sent(t0)).collect();
        answer_sent(&mut fresh, seqs[0], t0);
        answer_sent(&mut fresh, seqs[1], t0);
        refusal(&mut fresh, seqs[2], t0, &late);
        assert_eq!(fresh.rate.episodes, 1);
        // A warm start that loaded a window knows its server from the first answer.
        let config = LearnConfig::new(true, None, RetryAfterPolicy::Strict, DEFAULT_PROBE_AFTER);
        let warm = LearnedLimits {
            window: Some(super::super::LearnedWindow {
                limit: 4,
                window: Duration::from_secs(3),
            }),
            ..LearnedLimits::default()
        };
        let base = Limits::new().with_max_in_flight(Some(10));
        let mut w = ScopeLearner::new(&config, base, Some(&warm));
        let seqs: Vec<u64> = (0..3).map(|_| w.sent(t0)).collect();
        answer_sent(&mut w, seqs[0], t0);
        answer_sent(&mut w, seqs[1], t0);
        refusal(&mut w, seqs[2], t0, &late);
        assert_eq!(w.rate.episodes, 0);
    }

    /// A 200 without hints for send `seq`.
    fn answer_sent(l: &mut ScopeLearner, seq: u64, now: Instant) -> Learned {
        l.answered(Answer {
            seq,
            now,
            read_at: SystemTime::UNIX_EPOCH,
            in_flight: 0,
            status: Some(StatusCode::OK),
            hints: None,
            probe: false,
        })
    }

    fn requests(remaining: u64, reset_ms: u64) -> Hints {
        Hints {
            requests: Some(Allowance::new(
                Some(100),
                Some(remaining),
                Some(Duration::from_millis(reset_ms)),
            )),
            ..Hints::default()
        }
    }

    #[test]
    fn little_left_paces_the_scope_and_plenty_left_lifts_the_pace() {
        let mut l = learner(true);
        // 12 left, 5 in flight: 7, under the cap of 10: 8 intervals over 4 s, 500 ms.
        let (limits, _) = answer(&mut l, Some(&requests(12, 4001)), 5).limits.unwrap();
        assert_eq!(limits.buckets.len(), 1);
        let q = limits.buckets[0];
        assert_eq!(q.burst_size().get(), 1);
        let period = q.replenish_interval();
        assert!(period >= Duration::from_millis(500), "{period:?}");
        assert!(period < Duration::from_millis(546), "{period:?}");
        // Plenty left after the reset: the pace is lifted.
        let (limits, _) = answer(&mut l, Some(&requests(90, 4001)), 5).limits.unwrap();
        assert_eq!(limits.buckets.len(), 0);
    }

    #[test]
    fn a_reset_further_ahead_than_the_longest_server_wait_sets_no_pace() {
        let mut l = learner(true);
        // 0 left for a year: more than max_server_wait (120 s by default).
        let year = 365 * 86_400 * 1000 + 1;
        assert_eq!(answer(&mut l, Some(&requests(0, year)), 0).limits, None);
        // 0 left for 100 s: paced.
        assert!(answer(&mut l, Some(&requests(0, 100_001)), 0)
            .limits
            .is_some());
    }

    #[test]
    fn no_pace_without_a_reported_allowance_or_with_configured_quotas() {
        let mut l = learner(true);
        assert_eq!(answer(&mut l, None, 9).limits, None);
        assert_eq!(answer(&mut l, Some(&Hints::default()), 9).limits, None);
        let mut configured = learner(false);
        assert_eq!(
            answer(&mut configured, Some(&requests(0, 4001)), 9).limits,
            None
        );
    }
}
