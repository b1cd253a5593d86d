//! The retry decision: a pure function of the answer, the request and the policy.

use std::time::{Duration, SystemTime};

use http::StatusCode;
use rand::Rng;

use super::backoff::{Backoff, Jitter};
use crate::headers::{Hints, LimitKind};

/// Error codes in a 429 body that mean a quota is used up, not that the caller is too fast:
/// waiting does not help.
const QUOTA_EXHAUSTED: &[&str] = &["insufficient_quota", "quota_exceeded"];
/// Error codes that are final answers whatever the status says.
const FINAL_CODES: &[&str] = &[
    "entitlement-required",
    "idempotency_key_reused",
    "run_already_started",
];
/// 409 code that means "the first request with this key is still starting: ask again soon".
const IN_PROGRESS: &str = "idempotency_in_progress";
/// Wait for [`IN_PROGRESS`] when the server gives no `Retry-After`.
const IN_PROGRESS_WAIT: Duration = Duration::from_secs(1);
/// Anthropic's "overloaded" status.
const OVERLOADED: u16 = 529;

/// How retries are decided: attempts, backoff, jitter, and the longest server wait honoured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Retries after the first attempt (so `max_retries + 1` attempts at most).
    pub max_retries: u32,
    /// Delays when the server gives no usable hint.
    pub backoff: Backoff,
    /// Whether and how waits are spread.
    pub jitter: Jitter,
    /// A wait the server asks for that is longer than this is not slept: the answer is returned.
    pub max_server_wait: Duration,
}

impl RetryPolicy {
    /// A policy allowing `max_retries` retries after the first attempt, with `backoff` when the
    /// server gives no usable hint, `jitter` on every wait, and `max_server_wait` as the
    /// longest wait a server may ask for that is slept.
    ///
    /// Taken as given, without checks (a [`Throttle`](crate::Throttle) gets one checked by
    /// [`ThrottleBuilder::build`](crate::ThrottleBuilder::build)).
    pub const fn new(
        max_retries: u32,
        backoff: Backoff,
        jitter: Jitter,
        max_server_wait: Duration,
    ) -> Self {
        RetryPolicy {
            max_retries,
            backoff,
            jitter,
            max_server_wait,
        }
    }
}

/// What one attempt produced.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Outcome<'a> {
    /// The server answered.
    Response {
        /// The status code.
        status: StatusCode,
        /// Hints read from the headers.
        hints: &'a Hints,
        /// Error codes read from the body (problem+json `type`/`code`/`reason`, or the
        /// OpenAI-style `error.code`/`error.type`), if the body was read.
        codes: &'a [&'a str],
    },
    /// The request failed in transport.
    Transport {
        /// `true` for failures that may clear (connect, timeout, reset, cut-off body);
        /// `false` for ones that cannot (a bad URL, a TLS backend not compiled in).
        transient: bool,
    },
}

/// What is known of the request being decided on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestFacts {
    /// Retries already made for this request (0 after the first attempt).
    pub retries: u32,
    /// Whether it may be sent again after it may have run: an idempotent method or an
    /// idempotency key (see [`may_resend_after_failure`](super::may_resend_after_failure)).
    pub resend_safe: bool,
    /// Whether a copy of it could be kept for a retry (a streaming body cannot).
    pub cloneable: bool,
    /// `false` when the caller opted out of retries for this request.
    pub retry_allowed: bool,
    /// Time left before the request's deadline, or `None` without one: a wait that would
    /// end later is not started.
    pub time_left: Option<Duration>,
    /// Whether the shared retry budget has room for a retry of a failure (an attempt that
    /// may have run); refusals never draw on it.
    pub budget_has_room: bool,
    /// Whether the answer came from another URL than the one the request was sent to: the
    /// HTTP client followed a redirect (below this layer), so the first hop ran, and even a
    /// refusal of a later hop does not make the request safe to send again.
    pub redirected: bool,
}

impl RequestFacts {
    /// The facts of a request after `retries` retries (0 after its first attempt): whether it
    /// is `resend_safe` after it may have run, whether its body is `cloneable` so a copy can
    /// be kept for a retry, and whether `retry_allowed` (`false` when the caller opted out).
    /// No deadline, and room in the retry budget.
    pub const fn new(
        retries: u32,
        resend_safe: bool,
        cloneable: bool,
        retry_allowed: bool,
    ) -> Self {
        RequestFacts {
            retries,
            resend_safe,
            cloneable,
            retry_allowed,
            time_left: None,
            budget_has_room: true,
            redirected: false,
        }
    }

    /// These facts for an answer that came after a redirect (`true`) or not.
    pub const fn with_redirected(mut self, redirected: bool) -> Self {
        self.redirected = redirected;
        self
    }

    /// These facts with `time_left` before the deadline (`None`: no deadline).
    pub const fn with_time_left(mut self, time_left: Option<Duration>) -> Self {
        self.time_left = time_left;
        self
    }

    /// These facts with the retry budget's room: `false` when it is spent.
    pub const fn with_budget_room(mut self, has_room: bool) -> Self {
        self.budget_has_room = has_room;
        self
    }
}

/// The decision for one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// Return the answer: it is not one that asks for a retry.
    Accept,
    /// Send again after waiting `after`.
    Retry {
        /// The wait before the next attempt, jitter included.
        after: Duration,
        /// Whether the attempt may have run on the server (a 5xx, a broken connection): a
        /// failure, whose retry draws on the retry budget. `false` for a refusal (429, 409 in
        /// progress), which never ran.
        may_have_run: bool,
    },
    /// The answer asked for a retry, or was a recognised final refusal, and it is returned:
    /// the reason says why it was not retried.
    Stop(StopReason),
}

/// Why an answer that a retry might have changed was returned as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopReason {
    /// `max_retries` retries were made.
    RetriesExhausted,
    /// The request may have run on the server, and it is neither idempotent nor keyed.
    NotSafeToResend,
    /// The request's body is a stream that cannot be sent twice.
    BodyNotCloneable,
    /// The caller asked for no retries ([`NoRetry`](crate::NoRetry)).
    RetryDisabled,
    /// The wait before the next attempt would end after the request's deadline.
    Deadline,
    /// The shared retry budget is spent: retries already add their full share of load.
    RetryBudgetExhausted,
    /// The server said not to retry (`x-should-retry: false`).
    ServerSaidNoRetry,
    /// The answer came after a redirect (the HTTP client followed it), so the first hop ran;
    /// the request is neither idempotent nor keyed, so it is not sent again.
    RanBeforeRedirect,
    /// The server asked for a wait longer than `max_server_wait`.
    WaitTooLong {
        /// The wait the server asked for.
        asked: Duration,
    },
    /// The server's answer is final: waiting does not change it (401, a used-up quota, a
    /// refused entitlement, a conflicting idempotency key). Holds the status and the code.
    Final {
        /// The status code of the answer.
        status: u16,
        /// The error code that made it final, or empty for a plain 401.
        code: String,
    },
}

/// The wait an answer asks for, before bounds are applied.
struct Wait {
    /// The wait, jitter included.
    after: Duration,
    /// The part of it the server asked for, if any (bounded by `max_server_wait`).
    asked: Option<Duration>,
    /// Whether the request may have run, so that resending needs [`RequestFacts::resend_safe`].
    may_have_run: bool,
}

impl RetryPolicy {
    /// Decides what to do with `outcome`. `rng` draws the jitter.
    ///
    /// The one owner of the retry decision: a retry is made only if the answer asks for one,
    /// the server does not say otherwise (`x-should-retry: false`), the request may be resent
    /// ([`RequestFacts`]; or the server vouches for it with `x-should-retry: true`), retries remain, the wait is at most
    /// `max_server_wait` and ends before the deadline, and, for an attempt that may have run,
    /// the retry budget has room. The first rule broken is the [`StopReason`].
    ///
    /// # Example
    /// ```
    /// use std::time::Duration;
    /// use rand::{rngs::SmallRng, SeedableRng};
    /// use reqwest_throttle::policy::{Backoff, Decision, Jitter, Outcome, RequestFacts, RetryPolicy};
    /// use reqwest_throttle::Hints;
    ///
    /// let s = Duration::from_secs(1);
    /// let policy = RetryPolicy::new(6, Backoff::new(s, 60 * s), Jitter::Off, 120 * s);
    /// // A POST after its first attempt, with a body that can be sent again.
    /// let facts = RequestFacts::new(0, false, true, true);
    /// let mut hints = Hints::default();
    /// hints.retry_after = Some(2 * s);
    /// let outcome = Outcome::Response {
    ///     status: http::StatusCode::TOO_MANY_REQUESTS,
    ///     hints: &hints,
    ///     codes: &[],
    /// };
    /// let decision = policy.decide(&facts, outcome, &mut SmallRng::seed_from_u64(1));
    /// // A 429 never ran, so even a POST is sent again, after the server's wait.
    /// assert_eq!(decision, Decision::Retry { after: 2 * s, may_have_run: false });
    /// ```
    pub fn decide(
        &self,
        facts: &RequestFacts,
        outcome: Outcome<'_>,
        rng: &mut impl Rng,
    ) -> Decision {
        let wait = match self.wait_for(facts, outcome, rng) {
            Ok(Some(wait)) => wait,
            Ok(None) => return Decision::Accept,
            Err(reason) => return Decision::Stop(reason),
        };
        let server_says = match outcome {
            Outcome::Response { hints, .. } => hints.should_retry,
            Outcome::Transport { .. } => None,
        };
        let stop = if !facts.retry_allowed {
            Some(StopReason::RetryDisabled)
        } else if server_says == Some(false) {
            Some(StopReason::ServerSaidNoRetry)
        } else if wait.may_have_run && !facts.resend_safe && server_says != Some(true) {
            Some(StopReason::NotSafeToResend)
        } else if facts.redirected && !facts.resend_safe && server_says != Some(true) {
            Some(StopReason::RanBeforeRedirect)
        } else if facts.retries >= self.max_retries {
            Some(StopReason::RetriesExhausted)
        } else if !facts.cloneable {
            Some(StopReason::BodyNotCloneable)
        } else if let Some(asked) = wait.asked.filter(|&a| a > self.max_server_wait) {
            Some(StopReason::WaitTooLong { asked })
        } else if facts.time_left.is_some_and(|left| wait.after >= left) {
            // A retry at the deadline itself could not be sent by it.
            Some(StopReason::Deadline)
        } else if wait.may_have_run && !facts.budget_has_room {
            Some(StopReason::RetryBudgetExhausted)
        } else {
            None
        };
        match stop {
            Some(reason) => Decision::Stop(reason),
            None => Decision::Retry {
                after: wait.after,
                may_have_run: wait.may_have_run,
            },
        }
    }

    fn wait_for(
        &self,
        facts: &RequestFacts,
        outcome: Outcome<'_>,
        rng: &mut impl Rng,
    ) -> Result<Option<Wait>, StopReason> {
        let backoff = |rng: &mut _| self.jitter.spread(self.backoff.delay(facts.retries), rng);
        let (status, hints, codes) = match outcome {
            Outcome::Transport { transient: false } => return Ok(None),
            Outcome::Transport { transient: true } => {
                return Ok(Some(Wait {
                    after: backoff(rng),
                    asked: None,
                    may_have_run: true,
                }))
            }
            Outcome::Response {
                status,
                hints,
                codes,
            } => (status, hints, codes),
        };
        let final_code = |list: &[&str]| {
            codes
                .iter()
                .find(|c| list.contains(c))
                .map(|c| StopReason::Final {
                    status: status.as_u16(),
                    code: (*c).to_owned(),
                })
        };
        let asked = |d: Duration, may_have_run: bool, rng: &mut _| Wait {
            after: self.jitter.add(d, rng),
            asked: Some(d),
            may_have_run,
        };
        match status.as_u16() {
            401 => Err(StopReason::Final {
                status: 401,
                code: String::new(),
            }),
            429 => {
                if let Some(reason) = final_code(QUOTA_EXHAUSTED) {
                    return Err(reason);
                }
                Ok(Some(self.rate_limited(facts, hints, rng)))
            }
            409 if codes.contains(&IN_PROGRESS) => {
                let d = hints.retry_after.unwrap_or(IN_PROGRESS_WAIT);
                Ok(Some(asked(d, false, rng)))
            }
            403 if final_code(FINAL_CODES).is_none() && is_rate_limit_403(hints) => {
                Ok(Some(self.rate_limited(facts, hints, rng)))
            }
            403 | 409 => final_code(FINAL_CODES).map_or(Ok(None), Err),
            408 | 500 | 502 | 503 | 504 | OVERLOADED => Ok(Some(match hints.retry_after {
                Some(d) => asked(d, true, rng),
                None => Wait {
                    after: backoff(rng),
                    asked: None,
                    may_have_run: true,
                },
            })),
            _ => Ok(None),
        }
    }

    /// The wait after a 429, which the server sends before doing anything, so it is always safe
    /// to resend.
    ///
    /// A request refused again waits at least the backoff of its previous retry (1 s, 2 s, …)
    /// on top of the server's wait, so that a server that keeps saying "soon" (a reset a few
    /// milliseconds away) cannot use up the retries in a moment.
    fn rate_limited(&self, facts: &RequestFacts, hints: &Hints, rng: &mut impl Rng) -> Wait {
        let floor = match facts.retries {
            0 => Duration::ZERO,
            n => self.backoff.delay(n - 1),
        };
        let server_wait = |d: Duration, rng: &mut _| Wait {
            after: self.jitter.add(d.max(floor), rng),
            asked: Some(d),
            may_have_run: false,
        };
        match hints.limit_kind {
            // A parallel-request limit clears when one of the caller's requests ends, usually well
            // before `Retry-After`, which is then only an upper bound: back off from the base,
            // doubling, capped at `Retry-After`, jitter inside the cap.
            Some(LimitKind::Concurrency) => {
                let d = self.backoff.delay(facts.retries);
                // A zero `Retry-After` caps nothing: it would spend every retry at once.
                let cap = hints.retry_after.filter(|cap| !cap.is_zero());
                let d = cap.map_or(d, |cap| d.min(cap));
                Wait {
                    after: self.jitter.spread(d, rng),
                    asked: None,
                    may_have_run: false,
                }
            }
            // A window limit clears at its reset: wait for it, jitter on top.
            Some(LimitKind::Requests | LimitKind::Tokens) => match window_wait(hints) {
                Some(d) => server_wait(d, rng),
                None => self.unhinted(facts, rng),
            },
            // Unknown type: `Retry-After` is the least wait, then the reset time.
            Some(LimitKind::Other) | None => match hints.retry_after.or(hints.reset_after) {
                Some(d) => server_wait(d, rng),
                None => self.unhinted(facts, rng),
            },
        }
    }

    fn unhinted(&self, facts: &RequestFacts, rng: &mut impl Rng) -> Wait {
        Wait {
            after: self.jitter.spread(self.backoff.delay(facts.retries), rng),
            asked: None,
            may_have_run: false,
        }
    }
}

/// The wait until an exceeded window limit (requests or tokens per window) clears.
///
/// The gateway's `reset_at` ([`Hints::reset_after`]) is the real reset, so it comes first; its
/// `Retry-After` is the window's length, an upper bound on the reset, used only without one.
fn window_wait(hints: &Hints) -> Option<Duration> {
    hints.reset_after.or(hints.retry_after)
}

/// Whether a `403` is a rate limit rather than a refusal of access: GitHub-style APIs answer
/// `403` with `Retry-After` (secondary limits) or with 0 requests remaining and a reset time
/// (primary limits). Such a `403` is waited out as a `429` is; any other stays final (and one
/// with a final code, e.g. `entitlement-required`, is final whatever its headers).
fn is_rate_limit_403(hints: &Hints) -> bool {
    let used_up = hints
        .requests
        .is_some_and(|a| a.remaining == Some(0) && a.reset_after.is_some());
    hints.retry_after.is_some() || used_up
}

/// Whether an answer refuses a request for the rate limit: a 429, or a 403 that carries
/// rate-limit signals (waited out like a 429).
pub(crate) fn is_refusal(status: StatusCode, hints: &Hints) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS
        || (status == StatusCode::FORBIDDEN && is_rate_limit_403(hints))
}

/// How long every caller sharing the scope should hold off after this answer, if at all (the
/// shared cooldown):
/// - a window-type 429 (or a 429 with a reset time and no known type): until the reset;
/// - any answer, a 200 too, that reports 0 requests or 0 tokens remaining with a reset time:
///   until that reset (proactive pausing; the latest, if several are used up). The parser
///   already drops a `remaining` above its `limit`.
///
/// A used-up allowance's reset that falls on a whole second (read at wall-clock `read_at`) is
/// taken from the earliest it can be ([`reset::earliest`](crate::learn::reset::earliest):
/// rounded up by the server, up to 1 s late); a refusal's own reset is taken as stated.
///
/// A `Retry-After` on a success does not close it. A wait longer than `max_wait` closes
/// nothing: no caller is held that long in silence; each goes and receives the server's own
/// answer (a refusal it returns at once, with the wait it asks for).
pub(crate) fn cooldown(
    status: StatusCode,
    hints: &Hints,
    max_wait: Duration,
    read_at: SystemTime,
) -> Option<Duration> {
    let refused = if is_refusal(status, hints) {
        match hints.limit_kind {
            Some(LimitKind::Requests | LimitKind::Tokens) => window_wait(hints),
            Some(LimitKind::Concurrency) => None,
            Some(LimitKind::Other) | None => hints.reset_after,
        }
    } else {
        None
    };
    // Any allowance used up (requests, or tokens: the next request would be refused too).
    let exhausted = hints
        .allowances()
        .filter(|a| a.remaining == Some(0))
        .filter_map(|a| a.reset_after)
        .map(|d| crate::learn::reset::earliest(d, read_at))
        .max();
    refused.max(exhausted).filter(|&d| d <= max_wait)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::Allowance;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    const S: Duration = Duration::from_secs(1);

    /// A wall-clock read time a quarter second past a whole second: a reset of whole
    /// seconds from it is not on a whole second; one of `n * 1000 + 750` ms is.
    fn read_at() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_250)
    }

    fn policy(jitter: Jitter) -> RetryPolicy {
        RetryPolicy::new(6, Backoff::new(S, 60 * S), jitter, 120 * S)
    }

    fn facts(retries: u32) -> RequestFacts {
        RequestFacts::new(retries, false, true, true)
    }

    fn hints(kind: Option<LimitKind>, retry_after: Option<u64>, reset: Option<u64>) -> Hints {
        Hints {
            retry_after: retry_after.map(Duration::from_secs),
            limit_kind: kind,
            reset_after: reset.map(Duration::from_secs),
            ..Hints::default()
        }
    }

    fn decide_with(
        p: &RetryPolicy,
        f: &RequestFacts,
        status: u16,
        h: &Hints,
        codes: &[&str],
    ) -> Decision {
        let outcome = Outcome::Response {
            status: StatusCode::from_u16(status).unwrap(),
            hints: h,
            codes,
        };
        p.decide(f, outcome, &mut SmallRng::seed_from_u64(42))
    }

    fn decide(status: u16, h: &Hints) -> Decision {
        decide_with(&policy(Jitter::Off), &facts(0), status, h, &[])
    }

    fn retry(secs: u64) -> Decision {
        Decision::Retry {
            after: Duration::from_secs(secs),
            may_have_run: false,
        }
    }

    /// A retry of a failure (the request may have run).
    fn retry_failed(secs: u64) -> Decision {
        Decision::Retry {
            after: Duration::from_secs(secs),
            may_have_run: true,
        }
    }

    #[test]
    fn a_403_with_rate_limit_signals_is_waited_out_like_a_429() {
        let p = policy(Jitter::Off);
        // Secondary limit: Retry-After.
        let secondary = hints(None, Some(60), None);
        assert_eq!(decide(403, &secondary), retry(60));
        // Primary limit: 0 remaining with a reset.
        let primary = Hints {
            requests: Some(Allowance::new(Some(5000), Some(0), Some(30 * S))),
            ..Hints::default()
        };
        assert_eq!(decide(403, &primary), retry(1), "no window wait: backoff");
        assert_eq!(
            cooldown(StatusCode::FORBIDDEN, &primary, 120 * S, read_at()),
            Some(30 * S)
        );
        // No signal: a refusal of access, final as before (accepted as the answer).
        assert_eq!(decide(403, &Hints::default()), Decision::Accept);
        let some_left = Hints {
            requests: Some(Allowance::new(Some(5000), Some(10), Some(30 * S))),
            ..Hints::default()
        };
        assert_eq!(decide(403, &some_left), Decision::Accept);
        // A final code wins over the signals.
        assert_eq!(
            decide_with(&p, &facts(0), 403, &secondary, &["entitlement-required"]),
            Decision::Stop(StopReason::Final {
                status: 403,
                code: "entitlement-required".into()
            })
        );
    }

    #[test]
    fn after_a_redirect_only_what_is_safe_to_resend_is_resent() {
        let p = policy(Jitter::Off);
        let h = hints(None, Some(1), None);
        let post = facts(0).with_redirected(true);
        assert_eq!(
            decide_with(&p, &post, 429, &h, &[]),
            Decision::Stop(StopReason::RanBeforeRedirect)
        );
        let get = RequestFacts::new(0, true, true, true).with_redirected(true);
        assert_eq!(decide_with(&p, &get, 429, &h, &[]), retry(1));
        // Without a redirect a 429 is always safe to resend.
        assert_eq!(decide_with(&p, &facts(0), 429, &h, &[]), retry(1));
        // A final answer after a redirect is just accepted.
        assert_eq!(decide_with(&p, &post, 200, &h, &[]), Decision::Accept);
    }

    #[test]
    fn the_server_says_whether_to_retry() {
        let p = policy(Jitter::Off);
        let says = |v| Hints {
            should_retry: Some(v),
            ..Hints::default()
        };
        // A GET's 503 is retried, unless the server says not to.
        let get = RequestFacts::new(0, true, true, true);
        assert_eq!(
            decide_with(&p, &get, 503, &Hints::default(), &[]),
            retry_failed(1)
        );
        assert_eq!(
            decide_with(&p, &get, 503, &says(false), &[]),
            Decision::Stop(StopReason::ServerSaidNoRetry)
        );
        let h = Hints {
            should_retry: Some(false),
            ..hints(None, Some(2), None)
        };
        assert_eq!(
            decide_with(&p, &get, 429, &h, &[]),
            Decision::Stop(StopReason::ServerSaidNoRetry)
        );
        // A POST's 503 is not resent, unless the server vouches for it.
        let post = facts(0);
        assert_eq!(
            decide_with(&p, &post, 503, &Hints::default(), &[]),
            Decision::Stop(StopReason::NotSafeToResend)
        );
        assert_eq!(
            decide_with(&p, &post, 503, &says(true), &[]),
            retry_failed(1)
        );
        // `true` makes no answer retryable that was not: a 400 stays accepted.
        assert_eq!(
            decide_with(&p, &post, 400, &says(true), &[]),
            Decision::Accept
        );
    }

    #[test]
    fn a_wait_past_the_deadline_stops() {
        let p = policy(Jitter::Off);
        let h = hints(None, Some(3), None);
        let with_left = |left| facts(0).with_time_left(Some(left));
        let ms = Duration::from_millis(1);
        assert_eq!(
            decide_with(&p, &with_left(3 * S + ms), 429, &h, &[]),
            retry(3)
        );
        // A retry at the deadline itself could not be sent by it.
        assert_eq!(
            decide_with(&p, &with_left(3 * S), 429, &h, &[]),
            Decision::Stop(StopReason::Deadline)
        );
        // A rule broken before it is the reason given.
        let h = hints(None, Some(300), None);
        assert_eq!(
            decide_with(&p, &with_left(S), 429, &h, &[]),
            Decision::Stop(StopReason::WaitTooLong { asked: 300 * S })
        );
    }

    #[test]
    fn a_spent_budget_stops_retries_of_failures_only() {
        let p = policy(Jitter::Off);
        let spent = RequestFacts::new(0, true, true, true).with_budget_room(false);
        assert_eq!(
            decide_with(&p, &spent, 503, &Hints::default(), &[]),
            Decision::Stop(StopReason::RetryBudgetExhausted)
        );
        let h = hints(None, Some(2), None);
        assert_eq!(decide_with(&p, &spent, 429, &h, &[]), retry(2));
        let room = spent.with_budget_room(true);
        assert_eq!(
            decide_with(&p, &room, 503, &Hints::default(), &[]),
            retry_failed(1)
        );
        // Past the deadline as well: the deadline is named first.
        let both = spent.with_time_left(Some(Duration::ZERO));
        assert_eq!(
            decide_with(&p, &both, 503, &Hints::default(), &[]),
            Decision::Stop(StopReason::Deadline)
        );
    }

    #[test]
    fn success_and_plain_errors_are_accepted() {
        for status in [200, 201, 204, 301, 400, 403, 404, 409, 422] {
            assert_eq!(
                decide(status, &Hints::default()),
                Decision::Accept,
                "{status}"
            );
        }
    }

    #[test]
    fn window_429_waits_for_the_reset_not_retry_after() {
        let h = hints(Some(LimitKind::Requests), Some(60), Some(7));
        assert_eq!(decide(429, &h), retry(7));
        let h = hints(Some(LimitKind::Tokens), Some(60), None);
        assert_eq!(decide(429, &h), retry(60));
    }

    #[test]
    fn parallel_429_backs_off_from_base_capped_at_retry_after() {
        let h = hints(Some(LimitKind::Concurrency), Some(5), Some(60));
        let p = policy(Jitter::Off);
        let waits: Vec<_> = (0..5)
            .map(|r| decide_with(&p, &facts(r), 429, &h, &[]))
            .collect();
        assert_eq!(
            waits,
            vec![retry(1), retry(2), retry(4), retry(5), retry(5)]
        );
    }

    #[test]
    fn a_zero_retry_after_does_not_cap_a_parallel_backoff() {
        let h = hints(Some(LimitKind::Concurrency), Some(0), None);
        let p = policy(Jitter::Off);
        let waits: Vec<_> = (0..3)
            .map(|r| decide_with(&p, &facts(r), 429, &h, &[]))
            .collect();
        assert_eq!(waits, vec![retry(1), retry(2), retry(4)]);
    }

    #[test]
    fn parallel_429_jitter_stays_under_the_cap() {
        let h = hints(Some(LimitKind::Concurrency), Some(3), None);
        let p = policy(Jitter::On);
        for seed in 0..200 {
            let d = p.decide(
                &facts(4),
                Outcome::Response {
                    status: StatusCode::TOO_MANY_REQUESTS,
                    hints: &h,
                    codes: &[],
                },
                &mut SmallRng::seed_from_u64(seed),
            );
            let Decision::Retry { after, .. } = d else {
                panic!("expected a retry, got {d:?}")
            };
            assert!(after <= 3 * S && after >= 3 * S / 2, "{after:?}");
        }
    }

    #[test]
    fn untyped_429_honours_retry_after_as_the_least_wait() {
        let p = policy(Jitter::On);
        let h = hints(None, Some(12), None);
        for seed in 0..200 {
            let d = p.decide(
                &facts(0),
                Outcome::Response {
                    status: StatusCode::TOO_MANY_REQUESTS,
                    hints: &h,
                    codes: &[],
                },
                &mut SmallRng::seed_from_u64(seed),
            );
            let Decision::Retry { after, .. } = d else {
                panic!("expected a retry, got {d:?}")
            };
            assert!(after >= 12 * S && after <= 13 * S, "{after:?}");
        }
        assert_eq!(decide(429, &hints(None, None, Some(9))), retry(9));
    }

    #[test]
    fn unhinted_429_uses_exponential_backoff() {
        let p = policy(Jitter::Off);
        let h = Hints::default();
        let waits: Vec<_> = [0, 1, 2, 6, 7]
            .into_iter()
            .map(|r| {
                decide_with(
                    &p,
                    &RequestFacts {
                        retries: r,
                        ..facts(0)
                    },
                    429,
                    &h,
                    &[],
                )
            })
            .collect();
        let mut want = vec![retry(1), retry(2), retry(4), retry(60)];
        want.push(Decision::Stop(StopReason::RetriesExhausted));
        // retries = 6 is the last allowed retry count, so 7 is exhausted as well as 6.
        assert_eq!(waits[..3], want[..3]);
        assert_eq!(waits[3], Decision::Stop(StopReason::RetriesExhausted));
        assert_eq!(waits[4], Decision::Stop(StopReason::RetriesExhausted));
        let p = RetryPolicy {
            max_retries: 10,
            ..policy(Jitter::Off)
        };
        assert_eq!(decide_with(&p, &facts(6), 429, &h, &[]), retry(60));
    }

    #[test]
    fn a_429_refused_again_waits_at_least_the_previous_backoff() {
        let p = policy(Jitter::Off);
        let soon = Hints {
            retry_after: Some(Duration::from_millis(20)),
            ..hints(Some(LimitKind::Requests), None, None)
        };
        let waits: Vec<_> = (0..4)
            .map(|r| decide_with(&p, &facts(r), 429, &soon, &[]))
            .collect();
        let ms = |ms| Decision::Retry {
            after: Duration::from_millis(ms),
            may_have_run: false,
        };
        assert_eq!(waits, vec![ms(20), ms(1000), ms(2000), ms(4000)]);
        // A longer server wait stands as it is.
        let h = hints(None, Some(30), None);
        assert_eq!(decide_with(&p, &facts(2), 429, &h, &[]), retry(30));
    }

    #[test]
    fn a_429_is_resent_even_for_post() {
        // `resend_safe: false` in `facts`: a 429 never ran, so it is still retried.
        assert_eq!(decide(429, &hints(None, Some(2), None)), retry(2));
    }

    #[test]
    fn server_errors_need_resend_safety() {
        let h = hints(None, Some(3), None);
        let p = policy(Jitter::Off);
        for status in [408, 500, 502, 503, 504, 529] {
            assert_eq!(
                decide_with(&p, &facts(0), status, &h, &[]),
                Decision::Stop(StopReason::NotSafeToResend),
                "{status}"
            );
            let safe = RequestFacts {
                resend_safe: true,
                ..facts(0)
            };
            assert_eq!(
                decide_with(&p, &safe, status, &h, &[]),
                retry_failed(3),
                "{status}"
            );
            assert_eq!(
                decide_with(
                    &p,
                    &RequestFacts { retries: 2, ..safe },
                    status,
                    &Hints::default(),
                    &[]
                ),
                retry_failed(4),
                "{status}"
            );
        }
    }

    #[test]
    fn final_answers_are_not_retried() {
        let h = hints(None, Some(1), None);
        let fin = |status: u16, code: &str| {
            Decision::Stop(StopReason::Final {
                status,
                code: code.to_owned(),
            })
        };
        let p = policy(Jitter::Off);
        assert_eq!(decide(401, &h), fin(401, ""));
        for code in ["insufficient_quota", "quota_exceeded"] {
            assert_eq!(decide_with(&p, &facts(0), 429, &h, &[code]), fin(429, code));
        }
        assert_eq!(
            decide_with(
                &p,
                &facts(0),
                403,
                &h,
                &["entitlement-required", "limit_reached"]
            ),
            fin(403, "entitlement-required")
        );
        for code in ["idempotency_key_reused", "run_already_started"] {
            assert_eq!(decide_with(&p, &facts(0), 409, &h, &[code]), fin(409, code));
        }
    }

    #[test]
    fn idempotency_in_progress_waits_for_retry_after() {
        let p = policy(Jitter::Off);
        let code = ["idempotency_in_progress"];
        assert_eq!(
            decide_with(&p, &facts(0), 409, &hints(None, Some(3), None), &code),
            retry(3)
        );
        assert_eq!(
            decide_with(&p, &facts(0), 409, &Hints::default(), &code),
            retry(1)
        );
    }

    #[test]
    fn bounds_stop_a_retry_with_the_reason() {
        let p = policy(Jitter::Off);
        let h = hints(Some(LimitKind::Requests), None, Some(5));
        let no = RequestFacts {
            retry_allowed: false,
            ..facts(0)
        };
        assert_eq!(
            decide_with(&p, &no, 429, &h, &[]),
            Decision::Stop(StopReason::RetryDisabled)
        );
        let stream = RequestFacts {
            cloneable: false,
            ..facts(0)
        };
        assert_eq!(
            decide_with(&p, &stream, 429, &h, &[]),
            Decision::Stop(StopReason::BodyNotCloneable)
        );
        let far = hints(Some(LimitKind::Requests), None, Some(121));
        assert_eq!(
            decide_with(&p, &facts(0), 429, &far, &[]),
            Decision::Stop(StopReason::WaitTooLong { asked: 121 * S })
        );
    }

    #[test]
    fn transport_errors() {
        let p = policy(Jitter::Off);
        let rng = &mut SmallRng::seed_from_u64(0);
        let transient = Outcome::Transport { transient: true };
        let permanent = Outcome::Transport { transient: false };
        assert_eq!(
            p.decide(&facts(0), transient, rng),
            Decision::Stop(StopReason::NotSafeToResend)
        );
        let safe = RequestFacts {
            resend_safe: true,
            ..facts(1)
        };
        assert_eq!(p.decide(&safe, transient, rng), retry_failed(2));
        assert_eq!(p.decide(&safe, permanent, rng), Decision::Accept);
    }

    #[test]
    fn cooldown_only_for_window_limits() {
        let max = 120 * S;
        let tmr = StatusCode::TOO_MANY_REQUESTS;
        let c = |h: &Hints| cooldown(tmr, h, max, read_at());
        assert_eq!(
            c(&hints(Some(LimitKind::Requests), Some(60), Some(8))),
            Some(8 * S)
        );
        assert_eq!(
            c(&hints(Some(LimitKind::Tokens), Some(60), None)),
            Some(60 * S)
        );
        assert_eq!(
            c(&hints(Some(LimitKind::Concurrency), Some(60), Some(60))),
            None
        );
        assert_eq!(c(&hints(None, None, Some(4))), Some(4 * S));
        assert_eq!(c(&hints(None, Some(4), None)), None);
        // Longer than `max_server_wait`: nobody is held; each caller asks the server.
        assert_eq!(c(&hints(Some(LimitKind::Requests), None, Some(1000))), None);
        assert_eq!(
            c(&hints(Some(LimitKind::Requests), None, Some(120))),
            Some(max)
        );
        let ok = hints(Some(LimitKind::Requests), Some(60), Some(8));
        assert_eq!(cooldown(StatusCode::OK, &ok, max, read_at()), None);
    }

    #[test]
    fn cooldown_when_no_tokens_remain() {
        let max = 120 * S;
        let tokens = |remaining, reset| Allowance::new(Some(10_000), remaining, reset);
        let with = |tokens, input, output| Hints {
            requests: Some(Allowance::new(Some(100), Some(50), Some(S))),
            tokens,
            input_tokens: input,
            output_tokens: output,
            ..Hints::default()
        };
        let none_left = tokens(Some(0), Some(20 * S));
        let some_left = tokens(Some(900), Some(30 * S));
        let c = |h: &Hints| cooldown(StatusCode::OK, h, max, read_at());
        assert_eq!(c(&with(Some(none_left), None, None)), Some(20 * S));
        assert_eq!(c(&with(None, Some(none_left), None)), Some(20 * S));
        assert_eq!(c(&with(None, None, Some(none_left))), Some(20 * S));
        assert_eq!(c(&with(Some(some_left), None, None)), None);
        // Several used up: the latest reset.
        let later = tokens(Some(0), Some(40 * S));
        assert_eq!(c(&with(Some(none_left), Some(later), None)), Some(40 * S));
    }

    #[test]
    fn cooldown_when_no_requests_remain() {
        let max = 120 * S;
        let with = |remaining, reset| Hints {
            requests: Some(Allowance::new(Some(100), remaining, reset)),
            ..Hints::default()
        };
        assert_eq!(
            cooldown(StatusCode::OK, &with(Some(0), Some(9 * S)), max, read_at()),
            Some(9 * S)
        );
        assert_eq!(
            cooldown(
                StatusCode::OK,
                &with(Some(0), Some(900 * S)),
                max,
                read_at()
            ),
            None
        );
        assert_eq!(
            cooldown(StatusCode::OK, &with(Some(1), Some(9 * S)), max, read_at()),
            None
        );
        assert_eq!(
            cooldown(StatusCode::OK, &with(Some(0), None), max, read_at()),
            None
        );
        assert_eq!(
            cooldown(StatusCode::OK, &with(None, Some(9 * S)), max, read_at()),
            None
        );
        // The later of a 429's reset and the allowance's reset.
        let mut both = with(Some(0), Some(3 * S));
        both.limit_kind = Some(LimitKind::Requests);
        both.reset_after = Some(5 * S);
        assert_eq!(
            cooldown(StatusCode::TOO_MANY_REQUESTS, &both, max, read_at()),
            Some(5 * S)
        );
    }

    #[test]
    fn a_used_up_allowance_reset_on_a_whole_second_is_taken_from_its_earliest() {
        let ms = Duration::from_millis;
        let max = 120 * S;
        // 0 remaining, reset at the next whole second but one (1750 ms from a read at .250):
        // the true reset may be up to 1 s earlier.
        let mut h = Hints {
            requests: Some(Allowance::new(Some(120), Some(0), Some(ms(1_750)))),
            ..Hints::default()
        };
        assert_eq!(cooldown(StatusCode::OK, &h, max, read_at()), Some(ms(750)));
        // A refusal's own exact reset wins over the rounded one.
        h.limit_kind = Some(LimitKind::Requests);
        h.reset_after = Some(ms(1_234));
        assert_eq!(
            cooldown(StatusCode::TOO_MANY_REQUESTS, &h, max, read_at()),
            Some(ms(1_234))
        );
    }
}
