//! The `metrics` feature: handles on the metrics of one scope (or of every unnamed scope
//! together), registered once with the recorder installed then, so that recording is an
//! atomic add.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{describe_counter, describe_gauge, describe_histogram, Counter, Gauge, Histogram};
use metrics::{Label, Unit};

use crate::learn::InForce;
use crate::policy::StopReason;
use crate::sync::lock;

/// Calls entering the throttle.
pub(crate) const REQUESTS: &str = "reqwest_throttle_requests_total";
/// Attempts sent, retries included.
pub(crate) const ATTEMPTS: &str = "reqwest_throttle_attempts_total";
/// Answers by status class.
pub(crate) const ANSWERS: &str = "reqwest_throttle_answers_total";
/// Answers with status 429.
pub(crate) const RESPONSES_429: &str = "reqwest_throttle_responses_429_total";
/// Retries sent.
pub(crate) const RETRIES: &str = "reqwest_throttle_retries_total";
/// Calls that ended without the answer being accepted, by reason.
pub(crate) const STOPS: &str = "reqwest_throttle_stops_total";
/// Requests in flight.
pub(crate) const IN_FLIGHT: &str = "reqwest_throttle_in_flight";
/// Callers waiting for admission.
pub(crate) const QUEUED: &str = "reqwest_throttle_queued";
/// Scopes whose cooldown is closed.
pub(crate) const COOLDOWN_CLOSED: &str = "reqwest_throttle_cooldown_closed";
/// The learned pace, in requests per second.
pub(crate) const LEARNED_RATE: &str = "reqwest_throttle_learned_rate";
/// The in-flight cap in force (learned, at most the configured one).
pub(crate) const LEARNED_MAX_IN_FLIGHT: &str = "reqwest_throttle_learned_max_in_flight";
/// The circuit's state: 0 closed, 1 half-open, 2 open.
pub(crate) const CIRCUIT_STATE: &str = "reqwest_throttle_circuit_state";
/// Time from asking for admission to being admitted, per attempt.
pub(crate) const QUEUE_SECONDS: &str = "reqwest_throttle_queue_seconds";
/// Time from sending an attempt to its answer, per attempt.
pub(crate) const ANSWER_SECONDS: &str = "reqwest_throttle_answer_seconds";

/// The label naming a scope.
const SCOPE: &str = "scope";

/// The `class` label values of [`ANSWERS`], by index: 1xx to 5xx, then transport errors.
const CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "error"];

/// The `reason` label values of [`STOPS`], in the order of [`reason_index`].
const REASONS: [&str; 10] = [
    "retries_exhausted",
    "not_safe_to_resend",
    "body_not_cloneable",
    "retry_disabled",
    "deadline",
    "retry_budget_exhausted",
    "server_said_no_retry",
    "ran_before_redirect",
    "wait_too_long",
    "final",
];

fn reason_index(reason: &StopReason) -> usize {
    match reason {
        StopReason::RetriesExhausted => 0,
        StopReason::NotSafeToResend => 1,
        StopReason::BodyNotCloneable => 2,
        StopReason::RetryDisabled => 3,
        StopReason::Deadline => 4,
        StopReason::RetryBudgetExhausted => 5,
        StopReason::ServerSaidNoRetry => 6,
        StopReason::RanBeforeRedirect => 7,
        StopReason::WaitTooLong { .. } => 8,
        StopReason::Final { .. } => 9,
    }
}

/// Describes every metric (unit and help text) to the recorder installed now.
pub(crate) fn describe() {
    describe_counter!(REQUESTS, Unit::Count, "Calls entering the throttle.");
    describe_counter!(ATTEMPTS, Unit::Count, "Attempts sent, retries included.");
    describe_counter!(
        ANSWERS,
        Unit::Count,
        "Answers by status class (label class)."
    );
    describe_counter!(RESPONSES_429, Unit::Count, "Answers with status 429.");
    describe_counter!(RETRIES, Unit::Count, "Retries sent.");
    describe_counter!(
        STOPS,
        Unit::Count,
        "Calls that ended without their answer being accepted, by reason (label reason)."
    );
    describe_gauge!(IN_FLIGHT, Unit::Count, "Requests in flight.");
    describe_gauge!(QUEUED, Unit::Count, "Callers waiting for admission.");
    describe_gauge!(
        COOLDOWN_CLOSED,
        Unit::Count,
        "Scopes whose shared cooldown is closed."
    );
    describe_gauge!(
        LEARNED_RATE,
        Unit::CountPerSecond,
        "Learned pace in requests per second (0: none learned)."
    );
    describe_gauge!(
        LEARNED_MAX_IN_FLIGHT,
        Unit::Count,
        "In-flight cap in force, learned or as configured (0: no cap)."
    );
    describe_gauge!(
        CIRCUIT_STATE,
        "Circuit breaker state: 0 closed, 1 half-open, 2 open (unnamed scopes: the worst)."
    );
    describe_histogram!(
        QUEUE_SECONDS,
        Unit::Seconds,
        "Time from asking for admission to being admitted, per attempt."
    );
    describe_histogram!(
        ANSWER_SECONDS,
        Unit::Seconds,
        "Time from sending an attempt to its answer (or transport error)."
    );
}

/// The metric handles of one named scope, or of every unnamed scope together.
#[derive(Debug)]
pub(crate) struct ScopeMetrics {
    requests: Counter,
    attempts: Counter,
    answers: [Counter; CLASSES.len()],
    responses_429: Counter,
    retries: Counter,
    stops: [Counter; REASONS.len()],
    pub(crate) in_flight: Gauge,
    pub(crate) queued: Gauge,
    pub(crate) cooldown_closed: Gauge,
    learned_rate: Gauge,
    learned_max_in_flight: Gauge,
    circuit_state: Gauge,
    /// The scopes of this series whose circuit is half-open, and open.
    circuits: Mutex<[u64; 2]>,
    queue_seconds: Histogram,
    answer_seconds: Histogram,
}

impl ScopeMetrics {
    /// The handles labelled `scope=name`, or without a label for `None`.
    pub(crate) fn new(name: Option<&Arc<str>>) -> Self {
        let labels: Vec<Label> = name
            .map(|n| Label::new(SCOPE, Arc::clone(n)))
            .into_iter()
            .collect();
        let with = |key: &'static str, value: &'static str| {
            let mut all = labels.clone();
            all.push(Label::new(key, value));
            all
        };
        Self {
            requests: metrics::counter!(REQUESTS, labels.iter()),
            attempts: metrics::counter!(ATTEMPTS, labels.iter()),
            answers: CLASSES.map(|class| metrics::counter!(ANSWERS, with("class", class))),
            responses_429: metrics::counter!(RESPONSES_429, labels.iter()),
            retries: metrics::counter!(RETRIES, labels.iter()),
            stops: REASONS.map(|reason| metrics::counter!(STOPS, with("reason", reason))),
            in_flight: metrics::gauge!(IN_FLIGHT, labels.iter()),
            queued: metrics::gauge!(QUEUED, labels.iter()),
            cooldown_closed: metrics::gauge!(COOLDOWN_CLOSED, labels.iter()),
            learned_rate: metrics::gauge!(LEARNED_RATE, labels.iter()),
            learned_max_in_flight: metrics::gauge!(LEARNED_MAX_IN_FLIGHT, labels.iter()),
            circuit_state: metrics::gauge!(CIRCUIT_STATE, labels.iter()),
            circuits: Mutex::default(),
            queue_seconds: metrics::histogram!(QUEUE_SECONDS, labels.iter()),
            answer_seconds: metrics::histogram!(ANSWER_SECONDS, labels.iter()),
        }
    }

    pub(crate) fn request(&self) {
        self.requests.increment(1);
    }

    pub(crate) fn attempt(&self, retry: bool, queued: Duration) {
        self.attempts.increment(1);
        if retry {
            self.retries.increment(1);
        }
        self.queue_seconds.record(queued.as_secs_f64());
    }

    /// An answer with `status` (`None`: a transport error) after `took`.
    pub(crate) fn answered(&self, status: Option<u16>, took: Duration) {
        let class = status.map_or(CLASSES.len() - 1, |s| usize::from(s / 100).clamp(1, 5) - 1);
        self.answers[class].increment(1);
        if status == Some(429) {
            self.responses_429.increment(1);
        }
        self.answer_seconds.record(took.as_secs_f64());
    }

    pub(crate) fn stopped(&self, reason: &StopReason) {
        self.stops[reason_index(reason)].increment(1);
    }

    /// A scope's learned limits went from `from` to `to`: the gauges, which sum the scopes of
    /// this series, move by the difference (no rate or no cap counts 0).
    pub(crate) fn learned(&self, from: InForce, to: InForce) {
        let rate = |l: InForce| l.rate.unwrap_or(0.0);
        let cap = |l: InForce| l.max_in_flight.map_or(0.0, |c| c as f64);
        if rate(to) != rate(from) {
            self.learned_rate.increment(rate(to) - rate(from));
        }
        if cap(to) != cap(from) {
            self.learned_max_in_flight.increment(cap(to) - cap(from));
        }
    }

    /// A scope's circuit went from level `from` to `to` (0 closed, 1 half-open, 2 open): the
    /// gauge shows the worst level of the series' scopes.
    pub(crate) fn circuit(&self, from: usize, to: usize) {
        let worst = |n: &[u64; 2]| n.iter().rposition(|&k| k > 0).map_or(0, |i| i + 1);
        let mut scopes = lock(&self.circuits);
        let before = worst(&scopes);
        if let Some(n) = from.checked_sub(1).and_then(|i| scopes.get_mut(i)) {
            *n = n.saturating_sub(1);
        }
        if let Some(n) = to.checked_sub(1).and_then(|i| scopes.get_mut(i)) {
            *n += 1;
        }
        let after = worst(&scopes);
        if after != before {
            self.circuit_state.increment(after as f64 - before as f64);
        }
    }
}
