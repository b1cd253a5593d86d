//! The `reqwest-middleware` adapter: admission, send, read hints, decide, and go again.
//!
//! Thin by design: admission lives in [`limiter`](crate::limiter), decisions in
//! [`policy`](crate::policy), hint parsing in [`headers`](crate::headers).

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use http::{Extensions, StatusCode};
use reqwest::{Request, Response};
use reqwest_middleware::{Error, Middleware, Next, Result};
use tokio::time::Instant;

use crate::body::{hold_until_body_ends, read_error_body};
use crate::extensions::{Cost, Deadline, NoRetry, ThrottleInfo};
use crate::headers::{self, ErrorBody, Hints};
use crate::limiter::{lock, InFlight, Refused};
use crate::policy::{
    cooldown, has_idempotency_key, may_resend_after_failure, Decision, Outcome, RequestFacts,
    StopReason,
};
use crate::throttle::{Inner, Throttle};
use crate::transport::is_transient;

#[async_trait::async_trait]
impl Middleware for Throttle {
    /// Sends `req` through the throttle: waits for the cooldown, an in-flight permit and the
    /// quotas, sends, and retries as the [`RetryPolicy`](crate::policy::RetryPolicy) decides.
    ///
    /// # Errors
    /// The last transport error when it is not retried, or
    /// [`ThrottleError`](crate::ThrottleError) (as `Error::Middleware`) when the throttle refuses
    /// the request itself. A server's answer is always returned as `Ok`.
    ///
    /// # Cancel safety
    /// Dropping the future at any point releases the in-flight permit. A sliding window is
    /// charged only for an attempt handed to the next layer to send; with several token
    /// buckets, cells already taken by a dropped request go to the next request of the same
    /// cost, or are lost (which only slows admission, never exceeds a quota).
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> Result<Response> {
        self.inner.run(req, extensions, next).await
    }
}

/// Puts a fresh UUID v4 in header `name` unless `req` already has a non-blank value there.
fn ensure_idempotency_key(req: &mut Request, name: &http::HeaderName) {
    if !has_idempotency_key(req.headers(), name) {
        let key = uuid::Uuid::new_v4().hyphenated().to_string();
        if let Ok(value) = http::HeaderValue::from_str(&key) {
            req.headers_mut().insert(name.clone(), value);
        }
    }
}

impl Inner {
    async fn run(
        &self,
        mut req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> Result<Response> {
        let started = Instant::now();
        let cost = extensions.get::<Cost>().copied().unwrap_or_default().0;
        let retry_allowed = extensions.get::<NoRetry>().is_none();
        let deadline = extensions
            .get::<Deadline>()
            .map(|d| d.0)
            // A deadline too far to represent is no deadline.
            .or_else(|| self.deadline.and_then(|d| started.checked_add(d)));
        if let Some(name) = &self.key_header {
            ensure_idempotency_key(&mut req, name);
        }
        let resend_safe =
            may_resend_after_failure(req.method(), req.headers(), self.key_header.as_ref());
        if let Some(budget) = &self.budget {
            lock(budget).record_request(started);
        }
        let counters = self.limiter.counters();
        let mut waited = Duration::ZERO;
        let mut retries = 0;
        // With a deadline, the previous answer is kept through the retry wait: if the deadline
        // then stops the next attempt, that answer is returned rather than lost.
        let mut last: Option<(Response, Hints)> = None;
        loop {
            let spare = if retry_allowed && retries < self.policy.max_retries {
                req.try_clone()
            } else {
                None
            };
            let queued_at = Instant::now();
            let admitted = self.limiter.admit(cost, deadline).await;
            waited += queued_at.elapsed();
            let permit = match admitted {
                Ok(permit) if retries > 0 => {
                    // Counted only once the retry is really going out.
                    counters.retries.fetch_add(1, Ordering::Relaxed);
                    permit
                }
                Ok(permit) => permit,
                Err(Refused::Deadline) => return deadline_reached(last, retries, waited),
                Err(refused) => return Err(Error::middleware(refused.into_error(retries, waited))),
            };
            let result = match send(next.clone(), req, extensions, deadline).await {
                Ok(result) => result,
                Err(DeadlinePassed) => return deadline_reached(last, retries + 1, waited),
            };
            let facts = RequestFacts {
                retries,
                resend_safe,
                cloneable: spare.is_some(),
                retry_allowed,
            };
            let (decision, response) = self.judge(&facts, result);
            let decision = match decision {
                Decision::Retry {
                    after,
                    may_have_run,
                } => self.bound_retry(after, may_have_run, deadline),
                other => other,
            };
            let (after, spare) = match (decision, spare) {
                (Decision::Retry { after, .. }, Some(spare)) => (after, spare),
                (decision, _) => {
                    if let Decision::Stop(reason) = &decision {
                        tracing::debug!(attempts = retries + 1, ?reason, "not retried");
                    }
                    let (response, hints) = match response {
                        Ok(answer) => answer,
                        // The deadline stops the retry of a broken attempt: an earlier answer
                        // is returned if there is one.
                        Err(_)
                            if decision == Decision::Stop(StopReason::Deadline)
                                && last.is_some() =>
                        {
                            return deadline_reached(last, retries + 1, waited)
                        }
                        Err(err) => return Err(err),
                    };
                    let stopped = match decision {
                        Decision::Stop(reason) => Some(reason),
                        Decision::Accept | Decision::Retry { .. } => None,
                    };
                    let info = ThrottleInfo {
                        attempts: retries + 1,
                        waited,
                        hints,
                        stopped,
                    };
                    return Ok(finish(response, Some(permit), info));
                }
            };
            tracing::debug!(attempt = retries + 1, wait = ?after, "retrying");
            // The permit is released before the wait (and the answer too, without a deadline).
            drop(permit);
            // A newer answer replaces the kept one; a transport error does not.
            last = response.ok().or(last).filter(|_| deadline.is_some());
            tokio::time::sleep(after).await;
            waited += after;
            retries += 1;
            req = spare;
        }
    }

    /// Reads what one attempt produced, applies its cooldown, and decides on it.
    fn judge(
        &self,
        facts: &RequestFacts,
        result: Result<(Response, Option<ErrorBody>)>,
    ) -> (Decision, Result<(Response, Hints)>) {
        let (response, error_body) = match result {
            Ok(answer) => answer,
            Err(err) => {
                let transient = is_transient(&err);
                let decision = self.decide(facts, Outcome::Transport { transient });
                return (decision, Err(err));
            }
        };
        let hints = headers::parse(response.headers(), SystemTime::now());
        let status = response.status();
        if status == StatusCode::TOO_MANY_REQUESTS {
            let counters = self.limiter.counters();
            counters.responses_429.fetch_add(1, Ordering::Relaxed);
        }
        let codes: Vec<&str> = error_body.iter().flat_map(ErrorBody::codes).collect();
        let outcome = Outcome::Response {
            status,
            hints: &hints,
            codes: &codes,
        };
        let decision = self.decide(facts, outcome);
        // A final answer (a used-up quota, a refused entitlement) is no reason to hold back
        // the other callers: waiting does not change it.
        let is_final = matches!(decision, Decision::Stop(StopReason::Final { .. }));
        if let Some(d) = cooldown(status, &hints, self.policy.max_server_wait).filter(|_| !is_final)
        {
            tracing::debug!(status = status.as_u16(), cooldown = ?d, "shared cooldown closed");
            self.limiter.close_until(Instant::now() + d);
        }
        (decision, Ok((response, hints)))
    }

    fn decide(&self, facts: &RequestFacts, outcome: Outcome<'_>) -> Decision {
        self.policy.decide(facts, outcome, &mut *lock(&self.rng))
    }

    /// A retry the policy chose, unless the deadline or (for an attempt that may have run,
    /// a failure) the retry budget rules it out.
    fn bound_retry(
        &self,
        after: Duration,
        may_have_run: bool,
        deadline: Option<Instant>,
    ) -> Decision {
        let now = Instant::now();
        if deadline.is_some_and(|d| now.checked_add(after).is_none_or(|end| end > d)) {
            return Decision::Stop(StopReason::Deadline);
        }
        if let Some(budget) = self.budget.as_ref().filter(|_| may_have_run) {
            if !lock(budget).try_retry(now) {
                let counters = self.limiter.counters();
                counters.budget_exhausted.fetch_add(1, Ordering::Relaxed);
                return Decision::Stop(StopReason::RetryBudgetExhausted);
            }
        }
        Decision::Retry {
            after,
            may_have_run,
        }
    }
}

/// Returns `response` with its report, its body holding `permit` (if any) until it ends.
fn finish(response: Response, permit: Option<InFlight>, info: ThrottleInfo) -> Response {
    let mut response = hold_until_body_ends(response, permit);
    response.extensions_mut().insert(info);
    response
}

/// The deadline stopped the next attempt: the previous answer if there is one (nothing is
/// lost), else the error.
fn deadline_reached(
    last: Option<(Response, Hints)>,
    attempts: u32,
    waited: Duration,
) -> Result<Response> {
    match last {
        Some((response, hints)) => {
            let info = ThrottleInfo {
                attempts,
                waited,
                hints,
                stopped: Some(StopReason::Deadline),
            };
            Ok(finish(response, None, info))
        }
        None => Err(Error::middleware(
            Refused::Deadline.into_error(attempts, waited),
        )),
    }
}

/// The deadline passed while an attempt was in progress.
struct DeadlinePassed;

/// Sends one attempt and, for an error answer that may carry a decisive code, reads its small
/// body. The answer's head must come by `deadline`; the body read stops there too, keeping
/// the answer (an answer in hand is never lost to the deadline).
async fn send(
    next: Next<'_>,
    req: Request,
    extensions: &mut Extensions,
    deadline: Option<Instant>,
) -> std::result::Result<Result<(Response, Option<ErrorBody>)>, DeadlinePassed> {
    if deadline.is_some_and(|d| d <= Instant::now()) {
        return Err(DeadlinePassed);
    }
    let head = next.run(req, extensions);
    let head = match deadline {
        Some(d) => tokio::time::timeout_at(d, head)
            .await
            .map_err(|_| DeadlinePassed)?,
        None => head.await,
    };
    Ok(match head {
        Ok(response) => Ok(read_error_body(response, deadline).await),
        Err(err) => Err(err),
    })
}
