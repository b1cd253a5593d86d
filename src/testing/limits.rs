//! Per-user accounting of the simulated gateway, free of HTTP: a sliding-window log of
//! admitted arrivals, a count of requests in progress, and counters.
//!
//! Every method takes the current [`Instant`] from the caller, so the rules can be
//! checked with made-up instants.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::GatewayConfig;

/// Counters of a [`Gateway`](super::Gateway), in requests unless said otherwise.
///
/// Only the rate-limited routes (`/v1/chat`, `/v1/stream`) are counted; `/stats` is not.
/// `GET /stats` returns the same value as JSON, with these field names.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayStats {
    /// Requests received on the rate-limited routes, admitted or refused.
    pub requests: u64,
    /// Requests admitted (answered with 200).
    pub admitted: u64,
    /// Requests refused with 429 Too Many Requests
    /// (always `refused_parallel + refused_window + refused_tokens`).
    pub responses_429: u64,
    /// Requests refused because the user already had `max_parallel` requests in progress.
    pub refused_parallel: u64,
    /// Requests refused because the user already had `requests_per_window` admitted
    /// requests in the last `window`.
    pub refused_window: u64,
    /// The most requests one user had in progress at once (admitted, not yet finished).
    pub peak_parallel: u32,
    /// The most requests one user tried to have in progress at once: at each arrival,
    /// the user's requests in progress plus the new one, whether it was admitted or not.
    pub peak_parallel_attempted: u32,
    /// The most admitted requests of one user that arrived within any span of length
    /// `window` (exact: counted in the arrival log each time a request is admitted).
    pub max_in_window: u32,
    /// Requests refused because their tokens did not fit in the user's
    /// `tokens_per_window` (0 without a token limit).
    #[serde(default)]
    pub refused_tokens: u64,
    /// Tokens the answers reported used (`usage.total_tokens`), summed, in tokens.
    #[serde(default)]
    pub tokens_used: u64,
    /// The most tokens one user had counted in the window at once, in tokens: checked at
    /// each admission (requested tokens) and each answer (used tokens).
    #[serde(default)]
    pub max_tokens_in_window: u64,
}

/// Who a request belongs to: the raw `Authorization` header value, or `None` for
/// requests without one (all of which share one anonymous user).
pub(crate) type UserKey = Option<Vec<u8>>;

/// The limit that refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LimitType {
    /// Too many requests in progress.
    Parallel,
    /// Too many requests in the sliding window.
    Window,
    /// Too many tokens in the sliding window.
    Tokens,
}

impl LimitType {
    /// The value of the `rate_limit_type` header for this limit.
    pub(crate) fn header_value(self) -> &'static str {
        match self {
            LimitType::Parallel => "parallel_requests",
            LimitType::Window => "requests_per_minute",
            LimitType::Tokens => "tokens_per_minute",
        }
    }
}

/// What [`Limits::admit`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Admitted: the request holds one parallel slot until [`Limits::release`].
    Admitted,
    /// Refused; nothing was taken.
    Refused {
        /// The limit that was exceeded.
        limit: LimitType,
        /// When the limit clears (window: exactly; parallel: an upper bound).
        reset: Instant,
    },
}

#[derive(Debug, Default)]
struct UserState {
    /// Arrival instants of admitted requests within the window, oldest first.
    log: VecDeque<Instant>,
    /// Admitted requests not yet released.
    in_progress: u32,
    /// Tokens of admitted requests within the window, oldest first: requested at admission,
    /// replaced by the tokens used when the answer is made.
    spends: VecDeque<Spend>,
    /// The sum of `spends`.
    tokens: u64,
}

/// The tokens of one admitted request, at its arrival.
#[derive(Debug, Clone, Copy)]
struct Spend {
    at: Instant,
    ticket: u64,
    tokens: u32,
}

impl UserState {
    /// Forgets what left the window at `now`: an arrival at `t` counts while `now - t < window`.
    fn expire(&mut self, window: Duration, now: Instant) {
        while self.log.front().is_some_and(|&t| t + window <= now) {
            self.log.pop_front();
        }
        while let Some(spend) = self.spends.front().filter(|s| s.at + window <= now) {
            self.tokens -= u64::from(spend.tokens);
            self.spends.pop_front();
        }
    }

    /// When `tokens` more fit under `limit`: once enough of the oldest spends have left.
    fn tokens_fit_at(&self, tokens: u32, limit: u32, window: Duration, now: Instant) -> Instant {
        let over = (self.tokens + u64::from(tokens)).saturating_sub(limit.into());
        let mut freed = 0;
        for spend in &self.spends {
            freed += u64::from(spend.tokens);
            if freed >= over {
                return spend.at + window;
            }
        }
        now + window
    }
}

/// What a user's windows hold now, for the rate-limit headers of an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Allowances {
    /// Requests: limit, remaining, time until the window is whole again.
    pub(crate) requests: (u32, u32, Duration),
    /// Tokens, with a token limit: limit, remaining, time until the window is whole again.
    pub(crate) tokens: Option<(u32, u64, Duration)>,
}

/// The accounting of all users.
#[derive(Debug)]
pub(crate) struct Limits {
    requests_per_window: u32,
    window: Duration,
    max_parallel: u32,
    tokens_per_window: Option<u32>,
    users: HashMap<UserKey, UserState>,
    stats: GatewayStats,
    next_ticket: u64,
}

impl Limits {
    pub(crate) fn new(config: &GatewayConfig) -> Self {
        Limits {
            requests_per_window: config.requests_per_window,
            window: config.window,
            max_parallel: config.max_parallel,
            tokens_per_window: config.tokens_per_window,
            users: HashMap::new(),
            stats: GatewayStats::default(),
            next_ticket: 0,
        }
    }

    /// [`admit_tokens`](Self::admit_tokens) for a request of no tokens.
    #[cfg(test)]
    pub(crate) fn admit(&mut self, user: &UserKey, now: Instant) -> Decision {
        self.admit_tokens(user, 0, now).0
    }

    /// Decides on a request of `user` for `tokens` tokens arriving at `now`; with the
    /// decision, the ticket that names an admitted request's tokens for [`Self::settle`].
    ///
    /// The parallel cap is checked first, then the request window, then the token window; a
    /// request over several is refused for the first. An admitted request is logged in the
    /// windows (its tokens as requested) and takes a parallel slot; a refused one takes none.
    pub(crate) fn admit_tokens(
        &mut self,
        user: &UserKey,
        tokens: u32,
        now: Instant,
    ) -> (Decision, u64) {
        let window = self.window;
        let state = self.users.entry(user.clone()).or_default();
        state.expire(window, now);
        let token_limit = self.tokens_per_window;
        let stats = &mut self.stats;
        stats.requests += 1;
        stats.peak_parallel_attempted = stats
            .peak_parallel_attempted
            .max(state.in_progress.saturating_add(1));

        let refused = if state.in_progress >= self.max_parallel {
            stats.refused_parallel += 1;
            Some((LimitType::Parallel, now + window))
        } else if state.log.len() >= self.requests_per_window as usize {
            stats.refused_window += 1;
            let reset = state.log.front().map_or(now + window, |&t| t + window);
            Some((LimitType::Window, reset))
        } else if let Some(limit) =
            token_limit.filter(|&l| state.tokens + u64::from(tokens) > u64::from(l))
        {
            stats.refused_tokens += 1;
            let reset = state.tokens_fit_at(tokens, limit, window, now);
            Some((LimitType::Tokens, reset))
        } else {
            None
        };
        if let Some((limit, reset)) = refused {
            stats.responses_429 += 1;
            return (Decision::Refused { limit, reset }, 0);
        }

        state.log.push_back(now);
        state.in_progress += 1;
        self.next_ticket += 1;
        let ticket = self.next_ticket;
        if tokens > 0 {
            state.spends.push_back(Spend {
                at: now,
                ticket,
                tokens,
            });
            state.tokens += u64::from(tokens);
        }
        stats.admitted += 1;
        stats.peak_parallel = stats.peak_parallel.max(state.in_progress);
        let in_window = u32::try_from(state.log.len()).unwrap_or(u32::MAX);
        stats.max_in_window = stats.max_in_window.max(in_window);
        stats.max_tokens_in_window = stats.max_tokens_in_window.max(state.tokens);
        (Decision::Admitted, ticket)
    }

    /// The answer to the request of `ticket` reports `used` tokens: its spend in the token
    /// window becomes `used` (at its arrival), and the tokens are counted in the stats.
    pub(crate) fn settle(&mut self, user: &UserKey, ticket: u64, used: u32, now: Instant) {
        self.stats.tokens_used += u64::from(used);
        let Some(state) = self.users.get_mut(user) else {
            return;
        };
        state.expire(self.window, now);
        if let Ok(i) = state.spends.binary_search_by_key(&ticket, |s| s.ticket) {
            let spend = &mut state.spends[i];
            state.tokens = state.tokens - u64::from(spend.tokens) + u64::from(used);
            spend.tokens = used;
        }
        let stats = &mut self.stats;
        stats.max_tokens_in_window = stats.max_tokens_in_window.max(state.tokens);
    }

    /// What `user`'s windows hold at `now`.
    pub(crate) fn allowances(&mut self, user: &UserKey, now: Instant) -> Allowances {
        let window = self.window;
        let state = self.users.entry(user.clone()).or_default();
        state.expire(window, now);
        let whole_at = |last: Option<Instant>| last.map_or(Duration::ZERO, |t| t + window - now);
        let used = u32::try_from(state.log.len()).unwrap_or(u32::MAX);
        let requests = (
            self.requests_per_window,
            self.requests_per_window.saturating_sub(used),
            whole_at(state.log.back().copied()),
        );
        let tokens = self.tokens_per_window.map(|limit| {
            let remaining = u64::from(limit).saturating_sub(state.tokens);
            (
                limit,
                remaining,
                whole_at(state.spends.back().map(|s| s.at)),
            )
        });
        Allowances { requests, tokens }
    }

    /// What is left of `user`'s window at `now` (requests), and when its oldest counted
    /// request leaves it (`now + window` when none is counted).
    pub(crate) fn window_left(&self, user: &UserKey, now: Instant) -> (u32, Instant) {
        let window = self.window;
        let Some(state) = self.users.get(user) else {
            return (self.requests_per_window, now + window);
        };
        let counted: Vec<Instant> = state
            .log
            .iter()
            .copied()
            .filter(|&t| t + window > now)
            .collect();
        let used = u32::try_from(counted.len()).unwrap_or(u32::MAX);
        let reset = counted.first().map_or(now + window, |&t| t + window);
        (self.requests_per_window.saturating_sub(used), reset)
    }

    /// Gives back the parallel slot of one admitted request of `user`.
    pub(crate) fn release(&mut self, user: &UserKey) {
        if let Some(state) = self.users.get_mut(user) {
            state.in_progress = state.in_progress.saturating_sub(1);
        }
    }

    /// Requests of `user` in progress now.
    #[cfg(test)]
    pub(crate) fn in_progress(&self, user: &UserKey) -> u32 {
        self.users.get(user).map_or(0, |s| s.in_progress)
    }

    pub(crate) fn stats(&self) -> GatewayStats {
        self.stats.clone()
    }

    /// Sets every counter to zero; requests in progress and the window log are kept.
    pub(crate) fn reset_stats(&mut self) {
        self.stats = GatewayStats::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> UserKey {
        Some(name.as_bytes().to_vec())
    }

    fn limits(per_window: u32, window_secs: u64, parallel: u32) -> Limits {
        Limits::new(
            &GatewayConfig::default()
                .with_requests_per_window(per_window)
                .with_window(Duration::from_secs(window_secs))
                .with_max_parallel(parallel),
        )
    }

    /// Admits and releases at once, so only the window limit matters.
    fn hit(l: &mut Limits, u: &UserKey, now: Instant) -> Decision {
        let d = l.admit(u, now);
        if d == Decision::Admitted {
            l.release(u);
        }
        d
    }

    #[test]
    fn window_admits_exactly_n_then_refuses() {
        let t0 = Instant::now();
        let mut l = limits(3, 10, 100);
        let a = user("a");
        for i in 0..3 {
            assert_eq!(
                hit(&mut l, &a, t0 + Duration::from_secs(i)),
                Decision::Admitted
            );
        }
        let at = t0 + Duration::from_secs(5);
        assert_eq!(
            hit(&mut l, &a, at),
            Decision::Refused {
                limit: LimitType::Window,
                reset: t0 + Duration::from_secs(10),
            }
        );
        // Refused requests do not count: the oldest arrival still decides the reset.
        assert_eq!(
            hit(&mut l, &a, t0 + Duration::from_secs(9)),
            Decision::Refused {
                limit: LimitType::Window,
                reset: t0 + Duration::from_secs(10),
            }
        );
        // One nanosecond before the oldest arrival leaves the window: still full.
        let just_before = t0 + Duration::from_secs(10) - Duration::from_nanos(1);
        assert!(matches!(
            hit(&mut l, &a, just_before),
            Decision::Refused { .. }
        ));
        // At exactly arrival + window, the oldest no longer counts.
        assert_eq!(
            hit(&mut l, &a, t0 + Duration::from_secs(10)),
            Decision::Admitted
        );
        // Arrivals at 1 s, 2 s, 10 s are in the window now; next frees at 11 s.
        assert_eq!(
            hit(&mut l, &a, t0 + Duration::from_secs(10)),
            Decision::Refused {
                limit: LimitType::Window,
                reset: t0 + Duration::from_secs(11),
            }
        );
        let s = l.stats();
        assert_eq!(s.requests, 8);
        assert_eq!(s.admitted, 4);
        assert_eq!(s.refused_window, 4);
        assert_eq!(s.refused_parallel, 0);
        assert_eq!(s.responses_429, 4);
        assert_eq!(s.max_in_window, 3);
        assert_eq!(s.peak_parallel, 1);
    }

    #[test]
    fn any_window_holds_at_most_n_admitted() {
        // One attempt every 100 ms for 60 s against 7 per 2 s: check every span of 2 s.
        let t0 = Instant::now();
        let mut l = limits(7, 2, 100);
        let a = user("a");
        let mut admitted = Vec::new();
        for i in 0..600u64 {
            let now = t0 + Duration::from_millis(100 * i);
            if hit(&mut l, &a, now) == Decision::Admitted {
                admitted.push(now);
            }
        }
        for (i, &start) in admitted.iter().enumerate() {
            let in_span = admitted[i..]
                .iter()
                .take_while(|&&t| t < start + Duration::from_secs(2))
                .count();
            assert!(in_span <= 7, "{in_span} admitted within 2 s of {i}");
        }
        // The limiter is work-conserving: 7 at the start of each 2 s span, 30 spans.
        assert_eq!(admitted.len(), 7 * 30);
        assert_eq!(l.stats().max_in_window, 7);
        assert_eq!(l.stats().admitted, 210);
        assert_eq!(l.stats().refused_window, 600 - 210);
    }

    #[test]
    fn users_are_separate_and_anonymous_is_one_user() {
        let t0 = Instant::now();
        let mut l = limits(1, 60, 10);
        assert_eq!(hit(&mut l, &user("a"), t0), Decision::Admitted);
        assert_eq!(hit(&mut l, &user("b"), t0), Decision::Admitted);
        assert_eq!(hit(&mut l, &None, t0), Decision::Admitted);
        assert!(matches!(hit(&mut l, &None, t0), Decision::Refused { .. }));
        assert!(matches!(
            hit(&mut l, &user("a"), t0),
            Decision::Refused { .. }
        ));
        assert_eq!(l.stats().max_in_window, 1);
        assert_eq!(l.stats().admitted, 3);
    }

    #[test]
    fn parallel_cap_and_release() {
        let t0 = Instant::now();
        let mut l = limits(100, 60, 2);
        let a = user("a");
        assert_eq!(l.admit(&a, t0), Decision::Admitted);
        assert_eq!(l.admit(&a, t0), Decision::Admitted);
        assert_eq!(l.in_progress(&a), 2);
        assert_eq!(
            l.admit(&a, t0 + Duration::from_secs(1)),
            Decision::Refused {
                limit: LimitType::Parallel,
                reset: t0 + Duration::from_secs(61),
            }
        );
        // Another user is not affected.
        assert_eq!(l.admit(&user("b"), t0), Decision::Admitted);
        l.release(&a);
        assert_eq!(l.in_progress(&a), 1);
        assert_eq!(l.admit(&a, t0 + Duration::from_secs(2)), Decision::Admitted);
        let s = l.stats();
        assert_eq!(s.peak_parallel, 2);
        assert_eq!(s.peak_parallel_attempted, 3);
        assert_eq!(s.refused_parallel, 1);
        assert_eq!(s.admitted, 4);
        assert_eq!(s.max_in_window, 3);
    }

    #[test]
    fn parallel_is_checked_before_window() {
        let t0 = Instant::now();
        let mut l = limits(1, 60, 1);
        let a = user("a");
        assert_eq!(l.admit(&a, t0), Decision::Admitted);
        // Over both limits: reported as parallel.
        assert!(matches!(
            l.admit(&a, t0),
            Decision::Refused {
                limit: LimitType::Parallel,
                ..
            }
        ));
        l.release(&a);
        assert!(matches!(
            l.admit(&a, t0),
            Decision::Refused {
                limit: LimitType::Window,
                ..
            }
        ));
        let s = l.stats();
        assert_eq!(
            (s.refused_parallel, s.refused_window, s.responses_429),
            (1, 1, 2)
        );
        assert_eq!(l.in_progress(&a), 0);
    }

    #[test]
    fn zero_limits_refuse_everything() {
        let t0 = Instant::now();
        let mut l = limits(0, 5, 10);
        assert_eq!(
            l.admit(&None, t0),
            Decision::Refused {
                limit: LimitType::Window,
                reset: t0 + Duration::from_secs(5)
            }
        );
        let mut l = limits(10, 5, 0);
        assert!(matches!(
            l.admit(&None, t0),
            Decision::Refused {
                limit: LimitType::Parallel,
                ..
            }
        ));
        assert_eq!(l.stats().peak_parallel, 0);
        assert_eq!(l.stats().peak_parallel_attempted, 1);
    }

    #[test]
    fn reset_stats_keeps_accounting() {
        let t0 = Instant::now();
        let mut l = limits(2, 60, 5);
        let a = user("a");
        assert_eq!(l.admit(&a, t0), Decision::Admitted);
        assert_eq!(l.admit(&a, t0), Decision::Admitted);
        l.reset_stats();
        assert_eq!(l.stats(), GatewayStats::default());
        assert!(matches!(
            l.admit(&a, t0),
            Decision::Refused {
                limit: LimitType::Window,
                ..
            }
        ));
        assert_eq!(l.in_progress(&a), 2);
        assert_eq!(l.stats().refused_window, 1);
        assert_eq!(l.stats().requests, 1);
    }

    fn token_limits(tokens: u32) -> Limits {
        Limits::new(
            &GatewayConfig::default()
                .with_window(Duration::from_secs(60))
                .with_tokens_per_window(tokens),
        )
    }

    #[test]
    fn tokens_are_counted_as_requested_then_as_used_at_their_arrival() {
        let t0 = Instant::now();
        let mut l = token_limits(100);
        let a = user("a");
        let (d, first) = l.admit_tokens(&a, 70, t0);
        assert_eq!(d, Decision::Admitted);
        let t1 = t0 + Duration::from_secs(10);
        // 70 + 40 > 100: refused until the first request leaves the window.
        assert_eq!(
            l.admit_tokens(&a, 40, t1).0,
            Decision::Refused {
                limit: LimitType::Tokens,
                reset: t0 + Duration::from_secs(60)
            }
        );
        // Its answer used 20: now 40 fit.
        l.settle(&a, first, 20, t1);
        assert_eq!(l.admit_tokens(&a, 40, t1).0, Decision::Admitted);
        assert_eq!(
            l.admit_tokens(&a, 41, t1).0,
            Decision::Refused {
                limit: LimitType::Tokens,
                reset: t0 + Duration::from_secs(60)
            }
        );
        // Another user has a window of its own.
        assert_eq!(l.admit_tokens(&user("b"), 100, t1).0, Decision::Admitted);
        let s = l.stats();
        assert_eq!(
            (s.refused_tokens, s.responses_429, s.tokens_used),
            (2, 2, 20)
        );
        assert_eq!(s.max_tokens_in_window, 100);
    }

    #[test]
    fn allowances_report_what_is_left_and_when_the_window_is_whole() {
        let t0 = Instant::now();
        let mut l = token_limits(100);
        let a = user("a");
        l.admit_tokens(&a, 30, t0);
        let t1 = t0 + Duration::from_secs(15);
        l.admit_tokens(&a, 10, t1);
        let got = l.allowances(&a, t1);
        assert_eq!(
            got,
            Allowances {
                requests: (120, 118, Duration::from_secs(60)),
                tokens: Some((100, 60, Duration::from_secs(60))),
            }
        );
        let fresh = l.allowances(&user("b"), t1);
        assert_eq!(fresh.requests, (120, 120, Duration::ZERO));
        assert_eq!(fresh.tokens, Some((100, 100, Duration::ZERO)));
        // Without a token limit, no token allowance.
        let mut plain = limits(2, 60, 5);
        assert_eq!(plain.allowances(&a, t0).tokens, None);
    }

    #[tokio::test(start_paused = true)]
    async fn window_frees_after_sleeping_in_paused_time() {
        let mut l = limits(2, 60, 5);
        let a = user("a");
        assert_eq!(hit(&mut l, &a, Instant::now()), Decision::Admitted);
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(hit(&mut l, &a, Instant::now()), Decision::Admitted);
        let Decision::Refused { reset, .. } = hit(&mut l, &a, Instant::now()) else {
            panic!("third request in the window was admitted");
        };
        assert_eq!(reset - Instant::now(), Duration::from_secs(30));
        tokio::time::sleep_until(reset).await;
        assert_eq!(hit(&mut l, &a, Instant::now()), Decision::Admitted);
        assert_eq!(l.stats().max_in_window, 2);
    }
}
