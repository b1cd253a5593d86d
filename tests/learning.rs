//! Limits learned from answers, and the circuit breaker, through the middleware, against
//! in-process servers on paused time: nginx's `limit_req` (a GCRA that does not charge a
//! refused request), a sliding window, and a parallel cap. Deterministic; no wall clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::join_all;
use reqwest_middleware::ClientWithMiddleware;
use reqwest_throttle::{
    CircuitBreaker, CircuitState, Event, RetryAfterPolicy, Throttle, ThrottleError,
};
use tokio::time::Instant;

mod common;
use common::{json, status, FakeServer};

const URL: &str = "http://api.test/v1/chat";
const LABEL: &str = "http://api.test:80";
const SERVICE: Duration = Duration::from_millis(50);

/// nginx's `limit_req rate=R burst=B nodelay`: `B + 1` at once, then one every `1/R`; a
/// refused request is not charged.
struct LimitReq {
    rate: f64,
    burst: f64,
    excess: f64,
    last: Option<Instant>,
}

impl LimitReq {
    fn new(rate: f64, burst: u32) -> Self {
        Self {
            rate,
            burst: f64::from(burst),
            excess: 0.0,
            last: None,
        }
    }

    fn admit(&mut self, now: Instant) -> bool {
        let elapsed = self.last.map_or(0.0, |l| (now - l).as_secs_f64());
        let excess = (self.excess - self.rate * elapsed).max(0.0);
        if excess > self.burst + 1e-9 {
            return false;
        }
        self.excess = excess + 1.0;
        self.last = Some(now);
        true
    }
}

/// An nginx-like server: 429 with `Retry-After: 1` and `rate_limit_type: requests_per_second`
/// on a refusal (or no header at all with `hints: false`); admitted requests take `SERVICE`.
fn nginx(rate: f64, burst: u32, hints: bool) -> FakeServer {
    let limit = Mutex::new(LimitReq::new(rate, burst));
    FakeServer::new(move |_, _| {
        if limit.lock().unwrap().admit(Instant::now()) {
            status(200)
        } else if hints {
            json(
                429,
                &[
                    ("retry-after", "1"),
                    ("rate_limit_type", "requests_per_second"),
                ],
                "{}",
            )
        } else {
            json(429, &[], "{}")
        }
    })
    .with_delay(SERVICE)
}

/// `n` GET requests from `callers` tasks; every one must end in a 200.
async fn run(client: &ClientWithMiddleware, n: usize, callers: usize) {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks = (0..callers).map(|_| {
        let (client, next) = (client.clone(), next.clone());
        tokio::spawn(async move {
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < n {
                let r = client.get(URL).send().await.unwrap();
                assert_eq!(r.status(), 200);
            }
        })
    });
    for t in join_all(tasks).await {
        t.unwrap();
    }
}

fn learner(max_in_flight: usize) -> Throttle {
    Throttle::builder()
        .max_in_flight(max_in_flight)
        .jitter_seed(7)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_learned_rate_is_within_5_percent_of_nginx_limit_req() {
    let server = nginx(50.0, 20, true);
    let throttle = learner(10);
    run(&server.client(&throttle), 400, 40).await;
    let learned = throttle.learned(LABEL).unwrap();
    let rate = learned.rate.unwrap();
    assert!((rate - 50.0).abs() <= 2.5, "{learned:?}");
    assert!(learned.confidence > 0.9, "{learned:?}");
    assert!((18..=22).contains(&learned.burst.unwrap()), "{learned:?}");
    // Bounded: a refusal from idle, one at the exploring pace.
    assert!(learned.episodes <= 3, "{learned:?}");
}

#[tokio::test(start_paused = true)]
async fn refusals_of_one_episode_count_once() {
    let server = nginx(50.0, 20, true);
    let throttle = learner(10);
    run(&server.client(&throttle), 400, 40).await;
    let learned = throttle.learned(LABEL).unwrap();
    let refused = throttle.stats().responses_429;
    // The in-flight requests refused together are more than the episodes they make.
    assert!(
        refused > u64::from(learned.episodes),
        "{refused} {learned:?}"
    );
    assert!((2..=3).contains(&learned.episodes), "{learned:?}");
}

/// The waits of the cooldowns `throttle` closed while `n` requests ran against nginx(50, 20)
/// (refusals with `Retry-After: 1`), probing upward after 1 s clean.
async fn cooldowns_with(policy: RetryAfterPolicy, n: usize) -> Vec<Duration> {
    let server = nginx(50.0, 20, true);
    let throttle = Throttle::builder()
        .max_in_flight(10)
        .probe_after(Duration::from_secs(1))
        .retry_after_policy(policy)
        .jitter_seed(7)
        .build()
        .unwrap();
    let mut events = throttle.events();
    run(&server.client(&throttle), n, 40).await;
    let mut waits = Vec::new();
    while let Ok(e) = events.try_recv() {
        if let Event::CooldownClosed { wait, .. } = e {
            waits.push(wait);
        }
    }
    waits
}

#[tokio::test(start_paused = true)]
async fn the_learned_retry_after_policy_reopens_when_the_model_says_there_is_room() {
    // Strict: every refusal closes the cooldown for its whole Retry-After.
    let strict = cooldowns_with(RetryAfterPolicy::Strict, 600).await;
    assert!(strict.len() >= 3, "{strict:?}");
    assert!(
        strict.iter().all(|&w| w == Duration::from_secs(1)),
        "{strict:?}"
    );
    // Learned: once the rate is pinned, a refusal (of a probe above it) closes the cooldown
    // for one learned interval (1/50 s), not 1 s.
    let learned = cooldowns_with(RetryAfterPolicy::Learned, 600).await;
    let cut: Vec<&Duration> = learned
        .iter()
        .filter(|&&w| w < Duration::from_millis(100))
        .collect();
    assert!(!cut.is_empty(), "{learned:?}");
    assert!(
        cut.iter().all(|&&w| w >= Duration::from_millis(18)),
        "{learned:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn without_any_hint_the_rate_is_still_learned() {
    let server = nginx(20.0, 5, false);
    let throttle = learner(10);
    run(&server.client(&throttle), 300, 20).await;
    let learned = throttle.learned(LABEL).unwrap();
    let rate = learned.rate.unwrap();
    assert!((rate - 20.0).abs() <= 1.0, "{learned:?}");
}

#[tokio::test(start_paused = true)]
async fn a_warm_start_paces_from_the_first_request() {
    // What a run against this server learns (see the test above), saved and loaded.
    let mut saved = reqwest_throttle::LearnedLimits::default();
    saved.scope = LABEL.into();
    saved.rate = Some(49.5);
    saved.burst = Some(21);
    saved.max_in_flight = Some(10);
    saved.confidence = 0.99;
    let server = nginx(50.0, 20, true);
    let warm = learner(10);
    warm.load_learned([saved.clone()]);
    run(&server.client(&warm), 300, 40).await;
    let again = warm.learned(LABEL).unwrap();
    assert_eq!(warm.stats().responses_429, 0, "{again:?}");
    assert_eq!((again.rate, again.burst), (saved.rate, saved.burst));
    assert_eq!(again.confidence, saved.confidence);
    assert_eq!(again.episodes, 0);
    // A cold throttle against the same kind of server is refused at first.
    let server = nginx(50.0, 20, true);
    let cold = learner(10);
    run(&server.client(&cold), 300, 40).await;
    assert!(cold.stats().responses_429 > 0);
}

/// At most `limit` admitted in any `window`; a refusal says when the oldest leaves
/// (`reset_at`, here as seconds from now) and the cooldown waits for it. The instants of its
/// refusals go to `refused`.
fn sliding_window(limit: usize, window: Duration, refused: Arc<Mutex<Vec<Instant>>>) -> FakeServer {
    sliding_window_reporting(limit, window, refused, None)
}

/// [`sliding_window`], its refusals reporting `reset_at` as the text `lie` when given.
fn sliding_window_reporting(
    limit: usize,
    window: Duration,
    refused: Arc<Mutex<Vec<Instant>>>,
    lie: Option<&'static str>,
) -> FakeServer {
    let log = Mutex::new(std::collections::VecDeque::<Instant>::new());
    FakeServer::new(move |_, _| {
        let now = Instant::now();
        let mut log = log.lock().unwrap();
        while log.front().is_some_and(|&t| t + window <= now) {
            log.pop_front();
        }
        if log.len() < limit {
            log.push_back(now);
            return status(200);
        }
        refused.lock().unwrap().push(now);
        let reset = match lie {
            Some(text) => text.to_owned(),
            None => format!("{:.3}", (log[0] + window - now).as_secs_f64()),
        };
        json(
            429,
            &[
                ("rate_limit_type", "requests_per_minute"),
                ("reset_at", &reset),
            ],
            "{}",
        )
    })
    .with_delay(SERVICE)
}

#[tokio::test(start_paused = true)]
async fn a_window_server_teaches_its_limit_and_window() {
    let window = Duration::from_secs(3);
    let server = sliding_window(30, window, Arc::default());
    let throttle = learner(10);
    run(&server.client(&throttle), 100, 20).await;
    let learned = throttle.learned(LABEL).unwrap().window.unwrap();
    assert_eq!(learned.limit, 30);
    // The reset, in seconds from when the server decided, is read one answer's delay later:
    // the learned window is longer by that much (the margin between sending and counting).
    assert!(
        learned.window >= window && learned.window <= window + SERVICE + Duration::from_millis(2),
        "{learned:?}"
    );
    // Learned mid-run from the first refusal, the window paces the rest of the run counting
    // the sends already made: the sends in flight when it came were the only refusals.
    let refused = throttle.stats().responses_429;
    assert!((1..=10).contains(&refused), "{refused} refusals");
}

#[tokio::test(start_paused = true)]
async fn the_in_flight_cap_converges_and_never_exceeds_max_in_flight() {
    // The server allows 4 in progress; the throttle may have 10.
    let ends: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let peak = Arc::new(Mutex::new(0usize));
    let (e, p) = (ends.clone(), peak.clone());
    let server = FakeServer::new(move |_, _| {
        let now = Instant::now();
        let mut ends = e.lock().unwrap();
        ends.retain(|&end| end > now);
        let mut peak = p.lock().unwrap();
        *peak = (*peak).max(ends.len() + 1);
        if ends.len() >= 4 {
            return json(
                429,
                &[
                    ("retry-after", "1"),
                    ("rate_limit_type", "parallel_requests"),
                ],
                "{}",
            );
        }
        ends.push(now + SERVICE);
        status(200)
    })
    .with_delay(SERVICE);
    let throttle = learner(10);
    run(&server.client(&throttle), 600, 30).await;
    let cap = throttle.learned(LABEL).unwrap().max_in_flight.unwrap();
    assert!((2..=5).contains(&cap), "cap {cap}");
    assert!(*peak.lock().unwrap() <= 10);
    // Once learned, few refusals: each one halves the cap; ten successes raise it by one.
    let refused = throttle.stats().responses_429;
    assert!(refused < 60, "{refused} refusals for 600 requests");
}

fn breaker_throttle() -> Throttle {
    Throttle::builder()
        .max_retries(0)
        .circuit_breaker(Some(CircuitBreaker::new(5, Duration::from_secs(60))))
        .build()
        .unwrap()
}

fn circuit_error(err: &reqwest_middleware::Error) -> ThrottleError {
    ThrottleError::of(err).cloned().expect("a ThrottleError")
}

#[tokio::test(start_paused = true)]
async fn the_circuit_opens_after_5_failures_and_fails_fast() {
    let server = FakeServer::new(|_, _| status(503));
    let throttle = breaker_throttle();
    let client = server.client(&throttle);
    for _ in 0..5 {
        assert_eq!(client.get(URL).send().await.unwrap().status(), 503);
    }
    let err = client.get(URL).send().await.unwrap_err();
    assert_eq!(
        circuit_error(&err),
        ThrottleError::CircuitOpen {
            scope: LABEL.into(),
            retry_in: Some(Duration::from_secs(60)),
        }
    );
    assert_eq!(server.seen().len(), 5, "nothing sent while open");
    let stats = throttle.scope_stats();
    assert_eq!(
        stats[0].circuit,
        CircuitState::Open {
            retry_in: Duration::from_secs(60)
        }
    );
    assert_eq!(throttle.stats().circuits_open, 1);
    // 429s neither open nor close it.
    tokio::time::advance(Duration::from_secs(30)).await;
    let err = client.get(URL).send().await.unwrap_err();
    assert_eq!(
        circuit_error(&err),
        ThrottleError::CircuitOpen {
            scope: LABEL.into(),
            retry_in: Some(Duration::from_secs(30)),
        }
    );
}

#[tokio::test(start_paused = true)]
async fn half_open_sends_exactly_one_probe_under_concurrency() {
    let healthy = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let h = healthy.clone();
    let server = FakeServer::new(move |_, _| {
        if h.load(std::sync::atomic::Ordering::Relaxed) {
            status(200)
        } else {
            status(503)
        }
    })
    .with_delay(SERVICE);
    let throttle = breaker_throttle();
    let client = server.client(&throttle);
    for _ in 0..5 {
        client.get(URL).send().await.unwrap();
    }
    tokio::time::advance(Duration::from_secs(60)).await;
    healthy.store(true, std::sync::atomic::Ordering::Relaxed);
    server.forget();
    // 10 callers at once: one probe goes; the others fail at once, told a probe is under way.
    let results = join_all((0..10).map(|_| client.get(URL).send())).await;
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(ok, 1);
    assert_eq!(server.seen().len(), 1);
    for err in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(
            circuit_error(err),
            ThrottleError::CircuitOpen {
                scope: LABEL.into(),
                retry_in: None,
            }
        );
    }
    // The probe succeeded: closed, and requests go again.
    assert_eq!(throttle.scope_stats()[0].circuit, CircuitState::Closed);
    assert_eq!(client.get(URL).send().await.unwrap().status(), 200);
}

#[tokio::test(start_paused = true)]
async fn a_failed_probe_reopens_the_circuit() {
    let server = FakeServer::new(|_, _| status(503));
    let throttle = breaker_throttle();
    let client = server.client(&throttle);
    for _ in 0..5 {
        client.get(URL).send().await.unwrap();
    }
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(client.get(URL).send().await.unwrap().status(), 503);
    assert_eq!(
        throttle.scope_stats()[0].circuit,
        CircuitState::Open {
            retry_in: Duration::from_secs(60)
        }
    );
    assert_eq!(server.seen().len(), 6);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_probe_hands_the_probe_to_the_next_request() {
    let server = FakeServer::new(|_, _| status(503)).with_delay(SERVICE);
    let throttle = breaker_throttle();
    let client = server.client(&throttle);
    for _ in 0..5 {
        client.get(URL).send().await.unwrap();
    }
    tokio::time::advance(Duration::from_secs(60)).await;
    // The probe is cancelled while in flight.
    let probe = tokio::time::timeout(Duration::from_millis(10), client.get(URL).send()).await;
    assert!(probe.is_err(), "cancelled");
    assert_eq!(
        throttle.scope_stats()[0].circuit,
        CircuitState::HalfOpen { probing: false }
    );
    assert_eq!(client.get(URL).send().await.unwrap().status(), 503);
    assert_eq!(server.seen().len(), 7);
}

#[tokio::test(start_paused = true)]
async fn a_whole_second_reset_pauses_from_the_earliest_it_can_be() {
    // 0 remaining, reset stated in whole epoch seconds: up to 1 s early in truth.
    let server = FakeServer::new(|_, _| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        let reset = (now.as_secs() + 3).to_string();
        json(
            200,
            &[
                ("x-ratelimit-limit", "10"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", &reset),
            ],
            "{}",
        )
    });
    let throttle = Throttle::builder().build().unwrap();
    let r = server.client(&throttle).get(URL).send().await.unwrap();
    let cooldown = common::info(&r).cooldown.unwrap();
    // The stated reset is 2 to 3 s away; the pause is 1 s shorter.
    assert!(cooldown < Duration::from_secs(2), "{cooldown:?}");
    assert!(cooldown >= Duration::from_secs(1), "{cooldown:?}");
}

#[cfg(feature = "serde")]
#[test]
fn learned_limits_round_trip_through_serde() {
    let mut limits = reqwest_throttle::LearnedLimits::default();
    limits.scope = LABEL.into();
    limits.rate = Some(49.5);
    limits.burst = Some(21);
    limits.max_in_flight = Some(10);
    limits.confidence = 0.97;
    limits.episodes = 2;
    let text = serde_json::to_string(&limits).unwrap();
    let back: reqwest_throttle::LearnedLimits = serde_json::from_str(&text).unwrap();
    assert_eq!(back, limits);
}

#[tokio::test(start_paused = true)]
async fn limits_learned_events_tell_each_change_of_the_rate_and_end_at_what_was_learned() {
    let server = nginx(50.0, 20, true);
    // As `learner(10)`, with room for every event of the run.
    let throttle = Throttle::builder()
        .max_in_flight(10)
        .jitter_seed(7)
        .event_buffer(1 << 16)
        .build()
        .unwrap();
    let mut events = throttle.events();
    run(&server.client(&throttle), 400, 40).await;
    let mut learned = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let reqwest_throttle::Event::LimitsLearned {
            rate,
            burst,
            max_in_flight,
            ..
        } = event
        {
            learned.push((rate, burst, max_in_flight));
        }
    }
    // Sent on a change only: never twice the same in a row, and far fewer than the 400
    // answers (a pace raised while exploring is a change each time).
    assert!(!learned.is_empty());
    assert!(learned.windows(2).all(|w| w[0] != w[1]), "{learned:?}");
    assert!(learned.len() < 100, "{} events: {learned:?}", learned.len());
    let now = throttle.learned(LABEL).unwrap();
    assert_eq!(
        learned.last(),
        Some(&(now.rate, now.burst, now.max_in_flight))
    );
}

#[tokio::test(start_paused = true)]
async fn a_window_learned_mid_run_counts_the_sends_already_made() {
    // 15 sends at 0 s, 15 at 1.5 s, then a burst refused at 1.5 s: the window (30 per 3 s)
    // is learned then. At the reset (3 s) only the first 15 have left the server's window: a
    // learned window started empty would send 30 and see 15 refused.
    let window = Duration::from_secs(3);
    let refused = Arc::new(Mutex::new(Vec::new()));
    let server = sliding_window(30, window, refused.clone());
    let throttle = learner(20);
    let client = server.client(&throttle);
    let t0 = Instant::now();
    run(&client, 15, 15).await;
    tokio::time::sleep_until(t0 + Duration::from_millis(1_500)).await;
    run(&client, 15, 15).await;
    run(&client, 40, 20).await;
    let learned = throttle.learned(LABEL).unwrap().window.unwrap();
    assert_eq!(learned.limit, 30);
    let refused = refused.lock().unwrap().clone();
    assert!(!refused.is_empty());
    let late: Vec<Duration> = refused
        .iter()
        .map(|&t| t - t0)
        .filter(|&d| d > Duration::from_secs(2))
        .collect();
    assert_eq!(late, [], "refused after the window was learned");
}

/// A fixed window of `limit` requests per `window` from the first request, reporting
/// `x-ratelimit-{limit,remaining,reset}-requests` on every answer (the reset as a Go
/// duration to the millisecond, rounded up) and refusing with 429 when the window is used up.
fn fixed_window(limit: u32, window: Duration) -> FakeServer {
    // (start of the first window, number of the current window, requests admitted in it)
    let state = Mutex::new((None::<Instant>, 0u32, 0u32));
    FakeServer::new(move |_, _| {
        let now = Instant::now();
        let mut state = state.lock().unwrap();
        let t0 = *state.0.get_or_insert(now);
        let n = ((now - t0).as_nanos() / window.as_nanos()) as u32;
        if n != state.1 {
            (state.1, state.2) = (n, 0);
        }
        let code = if state.2 < limit {
            state.2 += 1;
            200
        } else {
            429
        };
        let end = t0 + window * (n + 1);
        let reset = format!("{}ms", (end - now).as_millis() + 1);
        let (limit, remaining) = (limit.to_string(), (limit - state.2).to_string());
        json(
            code,
            &[
                ("x-ratelimit-limit-requests", &limit),
                ("x-ratelimit-remaining-requests", &remaining),
                ("x-ratelimit-reset-requests", &reset),
            ],
            "{}",
        )
    })
    .with_delay(SERVICE)
}

#[tokio::test(start_paused = true)]
async fn the_remaining_requests_are_spread_over_the_time_to_the_reset() {
    // 40 per 4 s; 10 in flight of 50 ms could send 40 in 0.2 s and then wait 3.8 s.
    let window = Duration::from_secs(4);
    let server = fixed_window(40, window);
    let throttle = learner(10);
    let t0 = Instant::now();
    run(&server.client(&throttle), 100, 20).await;
    assert_eq!(throttle.stats().responses_429, 0);
    let sent = server.sent_at(t0);
    assert_eq!(sent.len(), 100);
    // Every window is used up: 40 in each of the first two.
    let first = sent.iter().filter(|&&t| t < window).count();
    let second = sent
        .iter()
        .filter(|&&t| t >= window && t < window * 2)
        .count();
    assert_eq!((first, second), (40, 40), "{sent:?}");
    // No burst then a long wait: the last of a window's requests are spread up to its reset.
    let gap = sent.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    assert!(
        gap < Duration::from_secs(1),
        "longest gap {gap:?}: {sent:?}"
    );
}

/// [`sliding_window`] whose refusals report `reset_at` as the text `lie` when given.
fn lying_window(limit: usize, window: Duration, lie: Option<&'static str>) -> FakeServer {
    sliding_window_reporting(limit, window, Arc::default(), lie)
}

#[tokio::test(start_paused = true)]
async fn a_window_refused_after_an_idle_time_learns_the_servers_window() {
    // 5 sends, a minute idle, then a run: the server's window (30 per 3 s) is empty again when
    // the run starts, so its first refusal's oldest send is the run's first, not the scope's.
    let window = Duration::from_secs(3);
    let server = lying_window(30, window, None);
    let throttle = learner(10);
    let client = server.client(&throttle);
    run(&client, 5, 5).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    let t0 = Instant::now();
    run(&client, 100, 20).await;
    let learned = throttle.learned(LABEL).unwrap().window.unwrap();
    assert_eq!(learned.limit, 30, "{learned:?}");
    assert!(learned.window <= window + 2 * SERVICE, "{learned:?}");
    // 100 sends at 30 per 3 s: done in about 10 s, not paced at 35 per minute.
    assert!(Instant::now() - t0 < Duration::from_secs(12));
}

#[tokio::test(start_paused = true)]
async fn a_refusal_with_a_reset_a_year_ahead_teaches_no_window() {
    // The server's window is 10 per second; its refusals say the oldest leaves in a year
    // (seconds from now, under MAX_RESET_AHEAD): a wait the throttle does not honour
    // (`max_server_wait`), so no window of a year is learned from it either.
    let server = lying_window(10, Duration::from_secs(1), Some("31536000"));
    let throttle = learner(10);
    let client = server.client(&throttle);
    let codes = join_all((0..15).map(|_| client.get(URL).send())).await;
    let refused = codes
        .iter()
        .filter(|r| r.as_ref().unwrap().status() == 429)
        .count();
    assert_eq!(refused, 5);
    assert_eq!(throttle.learned(LABEL).unwrap().window, None);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let next = tokio::time::timeout(Duration::from_secs(10), client.get(URL).send()).await;
    assert_eq!(next.unwrap().unwrap().status(), 200);
}

#[tokio::test(start_paused = true)]
async fn a_warm_start_of_garbage_neither_panics_nor_stalls_the_first_request() {
    let rates = [f64::NAN, 0.0, -1.0, f64::INFINITY, 1e300, 1e-300, 1e-18];
    let bursts = [0, 1, 100, u32::MAX];
    for rate in rates {
        for burst in bursts {
            let mut saved = reqwest_throttle::LearnedLimits::default();
            saved.scope = LABEL.into();
            saved.rate = Some(rate);
            saved.burst = Some(burst);
            saved.confidence = f64::NAN;
            let throttle = learner(10);
            throttle.load_learned([saved]);
            let server = FakeServer::ok();
            let r = tokio::time::timeout(
                Duration::from_secs(1),
                server.client(&throttle).get(URL).send(),
            )
            .await;
            assert_eq!(r.unwrap().unwrap().status(), 200, "{rate} {burst}");
            let learned = throttle.learned(LABEL).unwrap();
            assert!(learned.confidence.is_finite(), "{learned:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn calls_cancelled_in_flight_do_not_keep_a_window_from_being_learned() {
    // 5 calls cancelled while in flight (the server counts them), then a run into the window.
    let window = Duration::from_secs(3);
    let server = lying_window(30, window, None);
    let throttle = learner(10);
    let client = server.client(&throttle);
    for _ in 0..5 {
        let cancelled =
            tokio::time::timeout(Duration::from_millis(10), client.get(URL).send()).await;
        assert!(cancelled.is_err());
    }
    run(&client, 60, 20).await;
    let learned = throttle.learned(LABEL).unwrap().window;
    // The cancelled sends are unknown to the learner: the limit counts the others admitted.
    assert_eq!(learned.map(|w| w.limit), Some(25), "{learned:?}");
}
