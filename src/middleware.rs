//! The `reqwest-middleware` adapter: admission, send, read hints, decide, and go again.
//!
//! Thin by design: admission lives in [`engine`](crate::engine), decisions in
//! [`policy`](crate::policy), hint parsing in [`headers`](crate::headers).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{Extensions, StatusCode};
use reqwest::{Request, Response};
use reqwest_middleware::{Error, Middleware, Next, Result};
use tokio::time::Instant;
use tracing::Instrument;

use crate::body::{
    has_error_body_to_read, hold_until_body_ends, read_error_body, settle_at_body_end,
};
use crate::charge::Charge;
use crate::clock::instant_after;
use crate::engine::{count, Lease, Probe, Refused, Sent, Slot};
use crate::error::{ThrottleError, TransportError};
use crate::extensions::{Cost, Deadline, NoRetry, Priority, ThrottleInfo, Waits};
use crate::headers::{self, ErrorBody, Hints};
use crate::observe::Stopwatch;
use crate::policy::{
    cooldown, has_idempotency_key, is_refusal, may_resend_after_failure, Decision, Outcome,
    RequestFacts, StopReason,
};
use crate::store::Settlement;
use crate::sync::lock;
use crate::throttle::{DefaultStore, Inner, Throttle};
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
    /// Dropping the future at any point releases the in-flight slot and leaves the queue.
    /// Quotas are charged, all or nothing, only for an attempt handed to the next layer to
    /// send.
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

/// One call through the throttle: what is known of the request, and what happened so far.
struct Call<'a> {
    throttle: &'a Inner,
    scope: Arc<Slot<DefaultStore>>,
    cost: u32,
    priority: Priority,
    deadline: Option<Instant>,
    facts: RequestFacts,
    /// Time waited in the throttle so far, by cause.
    waits: Waits,
    /// With a deadline, the previous answer is kept through the retry wait: if the deadline
    /// then stops the next attempt, that answer is returned rather than lost.
    last: Option<Kept>,
    /// The retry wait the deadline ruled out, for the error that says so.
    deadline_wait: Option<Duration>,
    /// The cooldown the last answer closed for the scope.
    cooldown: Option<Duration>,
    /// The half-open circuit's probe, when this call's next attempt is it.
    probe: Option<Probe>,
    /// The attempt in flight in the scope's send log, until its answer is learned.
    sent: Option<Sent<DefaultStore>>,
}

/// An answer kept through a retry wait, with the cooldown it closed and its charge.
struct Kept {
    response: Response,
    hints: Hints,
    cooldown: Option<Duration>,
    charge: Charge,
}

/// What one attempt came to.
type Attempt = Result<(Response, Hints)>;

impl Inner {
    async fn run(
        &self,
        mut req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> Result<Response> {
        let call = Call::start(self, &mut req, extensions);
        // Without a subscriber that wants DEBUG, no span and no wrapper around the call.
        if tracing::level_enabled!(tracing::Level::DEBUG) {
            let span = call.span();
            call.attempts(req, extensions, next).instrument(span).await
        } else {
            call.attempts(req, extensions, next).await
        }
    }
}

impl<'a> Call<'a> {
    /// Admission, send, judge and decide, until an answer is returned or the call fails.
    async fn attempts(
        self,
        mut req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> Result<Response> {
        let mut call = self;
        loop {
            let spare = call.spare(&req);
            let lease = match call.admit().await {
                Ok(lease) => lease,
                Err(end) => return end,
            };
            call.sent = Some(call.scope.learn_sent());
            let sent = Stopwatch::start();
            let result = match send(next.clone(), req, extensions, call.deadline).await {
                Ok(result) => result,
                Err(DeadlinePassed) => return call.deadline_reached(1, None, None),
            };
            call.scope.observe.answered(status_of(&result), sent);
            call.facts.cloneable = spare.is_some();
            let sent_to = spare.as_ref().map(Request::url);
            let (decision, attempt) = call.judge(result, sent_to).await;
            call.settle_answer(&lease, &attempt).await;
            match (decision, spare) {
                (Decision::Retry { after, .. }, Some(spare)) => {
                    call.wait(lease, attempt, after).await;
                    req = spare;
                }
                (decision, _) => return call.finish(decision, attempt, lease),
            }
        }
    }

    /// The call's span: see [`observe`](crate::observe) for its fields and events.
    fn span(&self) -> tracing::Span {
        tracing::debug_span!(
            "throttle_request",
            scope = %self.scope.label,
            name = self.scope.observe.name(),
            priority = ?self.priority,
            cost = self.cost,
        )
    }

    /// Reads the request's settings, gives it its idempotency key, and counts it for the
    /// retry budget.
    fn start(throttle: &'a Inner, req: &mut Request, extensions: &Extensions) -> Self {
        let started = Instant::now();
        let deadline = extensions
            .get::<Deadline>()
            .map(|d| d.0)
            .or_else(|| throttle.deadline.map(|d| instant_after(started, d)));
        if let Some(name) = &throttle.key_header {
            ensure_idempotency_key(req, name);
        }
        if let Some(budget) = &throttle.budget {
            lock(budget).record_request(started);
        }
        let resend_safe =
            may_resend_after_failure(req.method(), req.headers(), throttle.key_header.as_ref());
        let retry_allowed = extensions.get::<NoRetry>().is_none();
        let facts = RequestFacts::new(0, resend_safe, true, retry_allowed);
        let scope = throttle.engine.scope_of(req);
        scope.observe.request();
        Self {
            throttle,
            scope,
            cost: extensions.get::<Cost>().copied().unwrap_or_default().0,
            priority: extensions.get::<Priority>().copied().unwrap_or_default(),
            deadline,
            facts,
            waits: Waits::default(),
            last: None,
            deadline_wait: None,
            cooldown: None,
            probe: None,
            sent: None,
        }
    }

    /// A copy of the request for the next attempt, if one may follow.
    fn spare(&self, req: &Request) -> Option<Request> {
        let may_retry =
            self.facts.retry_allowed && self.facts.retries < self.throttle.policy.max_retries;
        may_retry.then(|| req.try_clone()).flatten()
    }

    /// Waits for the scope to admit the next attempt; `Err` holds how the call ends instead.
    async fn admit(&mut self) -> std::result::Result<Lease, Result<Response>> {
        match self.scope.circuit_check() {
            Ok(probe) => self.probe = probe,
            Err(open) => return Err(Err(Error::middleware(open))),
        }
        let before = self.waits.total();
        let admitted = self
            .scope
            .admit(self.cost, self.priority, self.deadline, &mut self.waits)
            .await;
        match admitted {
            Ok(lease) => {
                let retry = self.facts.retries > 0;
                if retry {
                    // Counted only once the retry is really going out.
                    count!(self.scope, retries, fetch_add);
                }
                let (attempt, waited) = (self.facts.retries + 1, self.waits.total() - before);
                self.scope.observe.attempt(retry, waited);
                if waited.is_zero() {
                    tracing::trace!(attempt, ?waited, "admitted");
                } else {
                    tracing::debug!(attempt, ?waited, "admitted");
                }
                Ok(lease)
            }
            Err(Refused::Deadline { would_wait }) => {
                Err(self.deadline_reached(0, would_wait, None))
            }
            Err(refused) => {
                let error = refused.into_error(self.facts.retries, self.waits.total());
                Err(Err(Error::middleware(error)))
            }
        }
    }

    /// Reads what one attempt produced, closes the scope's cooldown if it says so, and
    /// decides on it.
    /// `sent_to` is the URL the request was sent to, when a retry could follow: an answer from
    /// another URL came after a redirect, so the first hop ran.
    async fn judge(
        &mut self,
        result: Result<(Response, Option<ErrorBody>)>,
        sent_to: Option<&reqwest::Url>,
    ) -> (Decision, Attempt) {
        let (response, error_body) = match result {
            Ok(answer) => answer,
            Err(err) => {
                self.learn(None, None, SystemTime::now()).await;
                tracing::debug!(attempt = self.facts.retries + 1, error = %err, "answer");
                let transient = is_transient(&err);
                let decision = self.decide(Outcome::Transport { transient });
                return (decision, Err(err));
            }
        };
        self.facts.redirected = sent_to.is_some_and(|url| answered_elsewhere(url, &response));
        let read_at = SystemTime::now();
        let hints = headers::parse(response.headers(), read_at);
        let status = response.status();
        let cooldown_cap = self.learn(Some(status), Some(&hints), read_at).await;
        let attempt = self.facts.retries + 1;
        tracing::debug!(attempt, status = status.as_u16(), "answer");
        if status == StatusCode::TOO_MANY_REQUESTS {
            count!(self.scope, responses_429, fetch_add);
        }
        if is_refusal(status, &hints) {
            let observe = &self.scope.observe;
            observe.refused(status.as_u16(), attempt, hints.retry_after);
        }
        let codes: Vec<&str> = error_body.iter().flat_map(ErrorBody::codes).collect();
        let outcome = Outcome::Response {
            status,
            hints: &hints,
            codes: &codes,
        };
        let decision = self.decide(outcome);
        // A final answer (a used-up quota, a refused entitlement) is no reason to hold back
        // the other callers: waiting does not change it.
        let is_final = matches!(decision, Decision::Stop(StopReason::Final { .. }));
        let max_wait = self.throttle.policy.max_server_wait;
        self.cooldown = cooldown(status, &hints, max_wait, read_at)
            .filter(|_| !is_final)
            .map(|d| d.min(cooldown_cap.unwrap_or(d)))
            .filter(|d| !d.is_zero());
        if let Some(d) = self.cooldown {
            tracing::debug!(status = status.as_u16(), cooldown = ?d, "shared cooldown closed");
            self.scope.close_cooldown(d).await;
        }
        (decision, Ok((response, hints)))
    }

    /// Feeds the attempt's answer (`None`: a transport error; hints read at `read_at`) to the
    /// scope's learner; the cooldown cap it returns.
    async fn learn(
        &mut self,
        status: Option<StatusCode>,
        hints: Option<&Hints>,
        read_at: SystemTime,
    ) -> Option<Duration> {
        let sent = self.sent.take();
        let answer = crate::learn::Answer {
            // (No send logged: a number no send has.)
            seq: sent.as_ref().map_or(u64::MAX, |s| s.seq),
            now: Instant::now().into_std(),
            read_at,
            in_flight: 0,
            status,
            hints,
            probe: false,
        };
        let cap = self.scope.learn(answer, self.probe.take()).await;
        if let Some(sent) = sent {
            sent.answered();
        }
        cap
    }

    /// The policy's decision on `outcome`, with the deadline as it is now. The retry budget is
    /// consulted only for a retry of a failure (the one decision it can change): when it has
    /// room the retry is charged to it under the same lock, otherwise the policy decides again
    /// knowing it is spent.
    fn decide(&mut self, outcome: Outcome<'_>) -> Decision {
        let throttle = self.throttle;
        let now = Instant::now();
        let time_left = self.deadline.map(|d| d.saturating_duration_since(now));
        let facts = self.facts.with_time_left(time_left);
        let decide = |facts: &RequestFacts| {
            throttle
                .policy
                .decide(facts, outcome, &mut *lock(&throttle.rng))
        };
        let decision = decide(&facts);
        if decision == Decision::Stop(StopReason::Deadline) {
            // The wait that would pass the deadline, for the error that says so.
            if let Decision::Retry { after, .. } = decide(&facts.with_time_left(None)) {
                self.deadline_wait = Some(after);
            }
        }
        let (
            Decision::Retry {
                may_have_run: true, ..
            },
            Some(budget),
        ) = (&decision, &throttle.budget)
        else {
            return decision;
        };
        let mut budget = lock(budget);
        if budget.has_room(now) {
            budget.spend(now);
            return decision;
        }
        drop(budget);
        let decision = decide(&facts.with_budget_room(false));
        if decision == Decision::Stop(StopReason::RetryBudgetExhausted) {
            count!(self.scope, budget_exhausted, fetch_add);
        }
        decision
    }

    /// Settles the attempt's charge with what its answer says: the true cost read by the
    /// builder's [`settle_from_headers`](crate::ThrottleBuilder::settle_from_headers) hook,
    /// and the tokens remaining the server reports.
    async fn settle_answer(&self, lease: &Lease, attempt: &Attempt) {
        let Ok((response, hints)) = attempt else {
            return;
        };
        let hook = self.throttle.usage_from_headers.as_ref();
        let settlement = Settlement {
            actual: hook.and_then(|h| h.read(response.headers())),
            tokens_remaining: hints.tokens.and_then(|a| a.remaining),
        };
        if settlement != Settlement::default() {
            if let Err(e) = lease.charge().apply(settlement).await {
                tracing::warn!(scope = %self.scope.label, error = %e, "charge not settled");
            }
        }
    }

    /// `response`, its charge to be settled from its body once read, with the builder's
    /// [`settle_from_body`](crate::ThrottleBuilder::settle_from_body) hook.
    fn settle_from_body(&self, response: Response, charge: Charge) -> Response {
        match &self.throttle.usage_from_body {
            Some(hook) => settle_at_body_end(response, charge, hook.clone()),
            None => response,
        }
    }

    /// Releases the in-flight slot and waits `after` before the next attempt.
    async fn wait(&mut self, lease: Lease, attempt: Attempt, after: Duration) {
        tracing::debug!(attempt = self.facts.retries + 2, wait = ?after, "retrying");
        let charge = lease.charge();
        // The slot is released before the wait (and the answer too, without a deadline).
        drop(lease);
        // A newer answer replaces the kept one; a transport error does not.
        let deadline = self.deadline;
        let cooldown = self.cooldown;
        let newer = attempt.ok().map(|(response, hints)| Kept {
            response,
            hints,
            cooldown,
            charge,
        });
        self.last = newer.or(self.last.take()).filter(|_| deadline.is_some());
        tokio::time::sleep(after).await;
        self.waits.retry += after;
        self.facts.retries += 1;
    }

    /// Ends the call with this attempt, which is not retried.
    fn finish(mut self, decision: Decision, attempt: Attempt, lease: Lease) -> Result<Response> {
        let attempts = self.facts.retries + 1;
        if let Decision::Stop(reason) = &decision {
            tracing::debug!(attempts, ?reason, "not retried");
            self.scope.observe.stopped(reason);
        }
        let (response, hints) = match (attempt, decision.clone()) {
            (Ok(answer), _) => answer,
            // The deadline stops the retry of a broken attempt: an earlier answer is
            // returned if there is one, else the error says so, with the failure as its source.
            (Err(err), Decision::Stop(StopReason::Deadline)) => {
                let wait = self.deadline_wait;
                return self.deadline_reached(1, wait, Some(err));
            }
            // Retries were made and the last attempt failed too: the error says how many.
            (Err(Error::Reqwest(e)), Decision::Stop(stopped)) if self.facts.retries > 0 => {
                return Err(Error::middleware(ThrottleError::AttemptsFailed {
                    attempts,
                    waited: self.waits.total(),
                    stopped,
                    last_error: TransportError::new(e),
                }));
            }
            (Err(err), _) => return Err(err),
        };
        self.last = None;
        let stopped = match decision {
            Decision::Stop(reason) => Some(reason),
            Decision::Accept | Decision::Retry { .. } => None,
        };
        let info = ThrottleInfo {
            attempts,
            waited: self.waits.total(),
            waits: self.waits,
            hints,
            stopped,
            cooldown: self.cooldown,
        };
        let response = self.settle_from_body(response, lease.charge());
        Ok(finish(response, Some(lease), info))
    }

    /// The deadline stopped the call (`in_progress`: 1 when an attempt was under way or had
    /// just failed, 0 before one was sent; `would_wait`: the known wait that passes it, if it
    /// has not passed yet; `failed`: the last attempt's error): the previous answer if there
    /// is one (nothing is lost), else [`ThrottleError::DeadlineExceeded`].
    fn deadline_reached(
        &mut self,
        in_progress: u32,
        would_wait: Option<Duration>,
        failed: Option<Error>,
    ) -> Result<Response> {
        let attempts = self.facts.retries + in_progress;
        tracing::debug!(attempts, reason = ?StopReason::Deadline, "not retried");
        self.scope.observe.stopped(&StopReason::Deadline);
        if let Some(kept) = self.last.take() {
            let info = ThrottleInfo {
                attempts,
                waited: self.waits.total(),
                waits: self.waits,
                hints: kept.hints,
                stopped: Some(StopReason::Deadline),
                cooldown: kept.cooldown,
            };
            let response = self.settle_from_body(kept.response, kept.charge.clone());
            let mut response = finish(response, None, info);
            response.extensions_mut().insert(kept.charge);
            return Ok(response);
        }
        let last_error = match failed {
            Some(Error::Reqwest(e)) => Some(TransportError::new(e)),
            // Another middleware's error is returned as it is.
            Some(other) => return Err(other),
            None => None,
        };
        Err(Error::middleware(ThrottleError::DeadlineExceeded {
            attempts,
            waited: self.waits.total(),
            would_wait,
            last_error,
        }))
    }
}

/// The status of an attempt's answer, `None` for a transport error.
fn status_of(result: &Result<(Response, Option<ErrorBody>)>) -> Option<u16> {
    result.as_ref().ok().map(|(r, _)| r.status().as_u16())
}

/// Whether `response` came from another URL than `sent_to` (reqwest followed a redirect). A
/// response made without a URL (by another middleware: reqwest then gives it a placeholder
/// host) says nothing.
fn answered_elsewhere(sent_to: &reqwest::Url, response: &Response) -> bool {
    /// The host reqwest gives a response built without a URL.
    const NO_URL_HOST: &str = "no.url.provided.local";
    let url = response.url();
    url.host_str() != Some(NO_URL_HOST) && url != sent_to
}

/// Returns `response` with its report, its body holding `permit` until it ends when the
/// permit's scope has an in-flight cap (without one, nothing waits for the body's end: the
/// response is returned as it came and the request stops counting as in flight now).
fn finish(response: Response, permit: Option<Lease>, info: ThrottleInfo) -> Response {
    let charge = permit.as_ref().map(Lease::charge);
    let mut response = match permit {
        Some(lease) if lease.rides_on_body() => hold_until_body_ends(response, Some(lease)),
        _ => response,
    };
    response.extensions_mut().insert(info);
    if let Some(charge) = charge {
        response.extensions_mut().insert(charge);
    }
    response
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
    let head = next.run(req, extensions);
    let head = match deadline {
        Some(d) => tokio::time::timeout_at(d, head)
            .await
            .map_err(|_| DeadlinePassed)?,
        None => head.await,
    };
    Ok(match head {
        // Boxed: the read is rare, and its state would make every call's future larger.
        Ok(response) if has_error_body_to_read(&response) => {
            Ok(Box::pin(read_error_body(response, deadline)).await)
        }
        Ok(response) => Ok((response, None)),
        Err(err) => Err(err),
    })
}
