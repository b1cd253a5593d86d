//! `Throttle::events`: every event sent where documented, capacity warnings once per crossing,
//! and a receiver that lags never holds a request back.

mod common;

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{json, refuses_once, status, FakeServer};
use reqwest_throttle::observe::WarnedLimit;
use reqwest_throttle::store::QuotaName;
use reqwest_throttle::{BuildError, CircuitBreaker, Event, NoRetry, Quota, Throttle};
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

const S: Duration = Duration::from_secs(1);
const URL: &str = "http://api.test/v1";

/// The label and name of `event`'s scope.
fn scope_of(event: &Event) -> (String, Option<String>) {
    let s = event.scope();
    (s.label.to_string(), s.name.as_deref().map(str::to_owned))
}

/// Every event received so far, without waiting.
fn drain(rx: &mut tokio::sync::broadcast::Receiver<Event>) -> Vec<Event> {
    let mut all = Vec::new();
    loop {
        match rx.try_recv() {
            Ok(event) => all.push(event),
            Err(TryRecvError::Empty) => return all,
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_window_429_sends_refused_cooldown_closed_then_reopened() {
    let throttle = Throttle::builder().jitter(false).build().unwrap();
    let mut events = throttle.events();
    let server = refuses_once("5");
    let client = server.client(&throttle);
    let t0 = tokio::time::Instant::now();
    let answer = client.get(URL).send().await.unwrap();
    assert_eq!(answer.status(), 200);
    // The retry waited the 5 s asked; the cooldown reopened then, before the retry went.
    assert_eq!(server.sent_at(t0), [Duration::ZERO, 5 * S]);
    // The reopening is sent by a task woken at 5 s too.
    common::settle().await;
    let got = drain(&mut events);
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(got
        .iter()
        .all(|e| scope_of(e) == ("http://api.test:80".into(), None)));
    let Event::Refused {
        status,
        attempt,
        retry_after,
        ..
    } = &got[0]
    else {
        panic!("{:?}", got[0])
    };
    assert_eq!((*status, *attempt, *retry_after), (429, 1, Some(5 * S)));
    let Event::CooldownClosed { wait, .. } = &got[1] else {
        panic!("{:?}", got[1])
    };
    assert_eq!(*wait, 5 * S);
    let Event::CooldownReopened { closed_for, .. } = &got[2] else {
        panic!("{:?}", got[2])
    };
    assert_eq!(*closed_for, 5 * S);
}

#[tokio::test(start_paused = true)]
async fn a_cooldown_lengthened_while_closed_reopens_once_at_its_new_end() {
    let throttle = Throttle::builder().jitter(false).build().unwrap();
    let mut events = throttle.events();
    // Two 429s in a row: 2 s, then (at 2 s) 3 s more.
    let server = FakeServer::new(|i, _| match i {
        0 => json(
            429,
            &[("retry-after", "2"), ("rate_limit_type", "rpm")],
            "{}",
        ),
        1 => json(
            429,
            &[("retry-after", "3"), ("rate_limit_type", "rpm")],
            "{}",
        ),
        _ => status(200),
    });
    let client = server.client(&throttle);
    assert_eq!(client.get(URL).send().await.unwrap().status(), 200);
    common::settle().await;
    let kinds: Vec<_> = drain(&mut events)
        .into_iter()
        .map(|e| match e {
            Event::Refused { attempt, .. } => format!("refused {attempt}"),
            Event::CooldownClosed { wait, .. } => format!("closed {wait:?}"),
            Event::CooldownReopened { closed_for, .. } => format!("reopened {closed_for:?}"),
            other => format!("{other:?}"),
        })
        .collect();
    // The first cooldown reopened at 2 s, the instant of the retry that closed the second
    // (events of one instant may come in either order; a reopening always comes before the
    // next closing).
    assert_eq!(
        kinds,
        [
            "refused 1",
            "closed 2s",
            "refused 2",
            "reopened 2s",
            "closed 3s",
            "reopened 3s"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_cooldown_closed_twice_while_closed_is_one_closure() {
    let throttle = Throttle::builder().jitter(false).build().unwrap();
    let mut events = throttle.events();
    // Two callers sent together, refused together after 1 s: 2 s, then 4 s, while the
    // first cooldown is closed.
    let server = FakeServer::new(|i, _| match i {
        0 => json(
            429,
            &[("retry-after", "2"), ("rate_limit_type", "rpm")],
            "{}",
        ),
        1 => json(
            429,
            &[("retry-after", "4"), ("rate_limit_type", "rpm")],
            "{}",
        ),
        _ => status(200),
    })
    .with_delay(S);
    let client = server.client(&throttle);
    let (a, b) = tokio::join!(
        client.get(URL).with_extension(NoRetry).send(),
        client.get(URL).with_extension(NoRetry).send()
    );
    assert_eq!(
        (a.unwrap().status().as_u16(), b.unwrap().status().as_u16()),
        (429, 429)
    );
    tokio::time::sleep(10 * S).await;
    let got = drain(&mut events);
    let closed: Vec<_> = got
        .iter()
        .filter_map(|e| match e {
            Event::CooldownClosed { wait, .. } => Some(*wait),
            _ => None,
        })
        .collect();
    let reopened: Vec<_> = got
        .iter()
        .filter_map(|e| match e {
            Event::CooldownReopened { closed_for, .. } => Some(*closed_for),
            _ => None,
        })
        .collect();
    // One closure (whichever answer is read first closes it, the other lengthens it or
    // not), reopened once, at 5 s.
    assert_eq!(closed.len(), 1, "{got:?}");
    assert_eq!(reopened, [4 * S], "closed from 1 s until 5 s: {got:?}");
}

#[tokio::test(start_paused = true)]
async fn a_403_with_rate_limit_signals_is_a_refusal_and_a_plain_403_is_not() {
    let throttle = Throttle::builder().build().unwrap();
    let mut events = throttle.events();
    let server = FakeServer::new(|i, _| match i {
        0 => json(403, &[("retry-after", "1")], "{}"),
        _ => status(403),
    });
    let client = server.client(&throttle);
    for _ in 0..2 {
        let r = client
            .get(URL)
            .with_extension(NoRetry)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403);
    }
    let refused: Vec<_> = drain(&mut events)
        .into_iter()
        .filter_map(|e| match e {
            Event::Refused {
                status,
                retry_after,
                ..
            } => Some((status, retry_after)),
            _ => None,
        })
        .collect();
    assert_eq!(refused, [(403, Some(S))]);
}

#[tokio::test(start_paused = true)]
async fn events_of_a_named_scope_carry_its_name() {
    let example = reqwest::Request::new(reqwest::Method::GET, URL.parse().unwrap());
    let throttle = Throttle::builder()
        .name_scope("api", &example)
        .build()
        .unwrap();
    let mut events = throttle.events();
    let server = FakeServer::new(|_, _| status(429));
    let client = server.client(&throttle);
    client
        .get(URL)
        .with_extension(NoRetry)
        .send()
        .await
        .unwrap();
    client
        .get("http://other.test/")
        .with_extension(NoRetry)
        .send()
        .await
        .unwrap();
    let scopes: Vec<_> = drain(&mut events).iter().map(scope_of).collect();
    assert_eq!(
        scopes,
        [
            ("http://api.test:80".into(), Some("api".into())),
            ("http://other.test:80".into(), None)
        ]
    );
}

/// The capacity warnings received, as (limit, used, capacity).
fn warnings(events: Vec<Event>) -> Vec<(WarnedLimit, u64, u64)> {
    events
        .into_iter()
        .map(|e| match e {
            Event::CapacityWarning {
                limit,
                used,
                capacity,
                ..
            } => (limit, used, capacity),
            other => panic!("not a warning: {other:?}"),
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn the_in_flight_warning_fires_once_per_crossing_and_rearms_10_points_under_the_threshold() {
    let throttle = Throttle::builder().max_in_flight(10).build().unwrap();
    let mut events = throttle.events();
    let mut held = Vec::new();
    for _ in 0..7 {
        held.push(throttle.acquire(1).await.unwrap());
    }
    assert_eq!(warnings(drain(&mut events)), []);
    // The 8th of 10 reaches 80 %: one warning, and none for the 9th and 10th.
    for _ in 0..3 {
        held.push(throttle.acquire(1).await.unwrap());
    }
    assert_eq!(
        warnings(drain(&mut events)),
        [(WarnedLimit::InFlight, 8, 10)]
    );
    // Down to 8: still above, no new warning; up to 10 again: none either.
    held.truncate(8);
    held.push(throttle.acquire(1).await.unwrap());
    assert_eq!(warnings(drain(&mut events)), []);
    // Down to 7 (70 %) does not re-arm it: a count swinging across the threshold warns once.
    held.truncate(7);
    held.push(throttle.acquire(1).await.unwrap());
    assert_eq!(warnings(drain(&mut events)), []);
    // Down to 6 (under 70 %) re-arms it; the next crossing warns again.
    held.truncate(6);
    held.push(throttle.acquire(1).await.unwrap());
    assert_eq!(warnings(drain(&mut events)), []);
    held.push(throttle.acquire(1).await.unwrap());
    assert_eq!(
        warnings(drain(&mut events)),
        [(WarnedLimit::InFlight, 8, 10)]
    );
}

#[tokio::test(start_paused = true)]
async fn the_threshold_is_settable() {
    let throttle = Throttle::builder()
        .max_in_flight(4)
        .capacity_warning(50)
        .build()
        .unwrap();
    let mut events = throttle.events();
    let _one = throttle.acquire(1).await.unwrap();
    assert_eq!(warnings(drain(&mut events)), []);
    let _two = throttle.acquire(1).await.unwrap();
    assert_eq!(
        warnings(drain(&mut events)),
        [(WarnedLimit::InFlight, 2, 4)]
    );
}

#[tokio::test(start_paused = true)]
async fn a_sliding_window_warns_once_per_crossing_and_rearms_when_sends_leave_it() {
    let throttle = common::windowed(10, 60 * S).build().unwrap();
    let mut events = throttle.events();
    let quota = WarnedLimit::Quota(QuotaName::SlidingWindow {
        limit: 10,
        window: 60 * S,
    });
    for _ in 0..10 {
        drop(throttle.acquire(1).await.unwrap());
    }
    assert_eq!(warnings(drain(&mut events)), [(quota, 8, 10)]);
    // The window empties; the next admission finds 1 of 10 and re-arms; 7 more cross again.
    tokio::time::advance(61 * S).await;
    for _ in 0..8 {
        drop(throttle.acquire(1).await.unwrap());
    }
    assert_eq!(warnings(drain(&mut events)), [(quota, 8, 10)]);
}

#[tokio::test(start_paused = true)]
async fn a_token_bucket_warns_on_the_cells_taken_and_costs_count_in_units() {
    let per_minute = NonZeroU32::new(10).unwrap();
    let throttle = Throttle::builder()
        .token_bucket(Quota::per_minute(per_minute))
        .window_guard(Duration::ZERO)
        .build()
        .unwrap();
    let mut events = throttle.events();
    drop(throttle.acquire(7).await.unwrap());
    assert_eq!(warnings(drain(&mut events)), []);
    drop(throttle.acquire(2).await.unwrap());
    let bucket = WarnedLimit::Quota(QuotaName::TokenBucket {
        burst: 10,
        replenish: 6 * S,
    });
    assert_eq!(warnings(drain(&mut events)), [(bucket, 9, 10)]);
}

#[tokio::test(start_paused = true)]
async fn the_warning_names_the_most_used_quota() {
    let throttle = common::windowed(100, 60 * S)
        .sliding_window(10, S)
        .build()
        .unwrap();
    let mut events = throttle.events();
    drop(throttle.acquire(8).await.unwrap());
    let second = WarnedLimit::Quota(QuotaName::SlidingWindow {
        limit: 10,
        window: S,
    });
    assert_eq!(warnings(drain(&mut events)), [(second, 8, 10)]);
}

#[tokio::test(start_paused = true)]
async fn a_receiver_that_never_reads_holds_no_request_back_and_is_told_what_it_missed() {
    let throttle = Throttle::builder().event_buffer(4).build().unwrap();
    let mut slow = throttle.events();
    let server = FakeServer::new(|_, _| status(429));
    let client = server.client(&throttle);
    for _ in 0..100 {
        let r = client
            .get(URL)
            .with_extension(NoRetry)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 429);
    }
    assert_eq!(server.seen().len(), 100);
    assert_eq!(slow.recv().await, Err(RecvError::Lagged(96)));
    // Then the 4 newest: attempts refused 97 to 100 (each request's first).
    let kept = drain(&mut slow);
    assert_eq!(kept.len(), 4);
    let statuses: Vec<_> = kept
        .iter()
        .map(|e| match e {
            Event::Refused { status, .. } => *status,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(statuses, [429; 4]);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_receiver_and_no_receiver_change_nothing() {
    let throttle = Throttle::builder().max_in_flight(1).build().unwrap();
    drop(throttle.events());
    for _ in 0..10 {
        drop(throttle.acquire(1).await.unwrap());
    }
    // A receiver made later gets only what comes after it.
    let mut late = throttle.events();
    assert_eq!(late.try_recv(), Err(TryRecvError::Empty));
    let _p = throttle.acquire(1).await.unwrap();
    assert_eq!(warnings(drain(&mut late)), [(WarnedLimit::InFlight, 1, 1)]);
}

#[test]
fn bad_observe_settings_fail_the_build() {
    let err = |b: reqwest_throttle::ThrottleBuilder| b.build().unwrap_err();
    assert_eq!(
        err(Throttle::builder().capacity_warning(0)),
        BuildError::CapacityWarningOutOfRange { percent: 0 }
    );
    assert_eq!(
        err(Throttle::builder().capacity_warning(101)),
        BuildError::CapacityWarningOutOfRange { percent: 101 }
    );
    assert_eq!(
        err(Throttle::builder().event_buffer(0)),
        BuildError::ZeroEventBuffer
    );
    assert!(Throttle::builder().capacity_warning(100).build().is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_per_key_scope_is_named_by_an_example_with_its_key_and_the_key_never_shows() {
    let mut example = reqwest::Request::new(reqwest::Method::GET, URL.parse().unwrap());
    example
        .headers_mut()
        .insert("authorization", "Bearer sk-secret".parse().unwrap());
    let builder = Throttle::builder()
        .scope(reqwest_throttle::Scope::per_header(
            http::header::AUTHORIZATION,
        ))
        .name_scope("team_a", &example);
    let shown = format!("{builder:?}");
    assert!(shown.contains("team_a"), "{shown}");
    assert!(!shown.contains("secret"), "{shown}");
    let throttle = builder.build().unwrap();
    let mut events = throttle.events();
    let server = FakeServer::new(|_, _| status(429));
    let client = server.client(&throttle);
    for key in ["Bearer sk-secret", "Bearer other"] {
        let r = client
            .get("http://elsewhere.test/")
            .header("authorization", key);
        r.with_extension(NoRetry).send().await.unwrap();
    }
    let names: Vec<_> = drain(&mut events).iter().map(|e| scope_of(e).1).collect();
    assert_eq!(names, [Some("team_a".to_owned()), None]);
    let shown = format!("{:?}", throttle.scope_stats());
    assert!(!shown.contains("secret"), "{shown}");
}

#[tokio::test(start_paused = true)]
async fn under_a_global_scope_any_example_names_the_one_scope_acquire_uses_too() {
    let example = reqwest::Request::new(reqwest::Method::GET, URL.parse().unwrap());
    let throttle = Throttle::builder()
        .scope(reqwest_throttle::Scope::global())
        .max_in_flight(1)
        .name_scope("everything", &example)
        .build()
        .unwrap();
    let mut events = throttle.events();
    let _held = throttle.acquire(1).await.unwrap();
    let got = drain(&mut events);
    assert_eq!(
        got.iter().map(scope_of).collect::<Vec<_>>(),
        [("(unkeyed)".to_owned(), Some("everything".to_owned()))]
    );
    assert_eq!(warnings(got), [(WarnedLimit::InFlight, 1, 1)]);
}

/// The circuit and learning events received, as text (other events left out).
fn learning_events(events: Vec<Event>) -> Vec<String> {
    events
        .into_iter()
        .filter_map(|e| match e {
            Event::CircuitOpened { retry_in, .. } => Some(format!("opened {retry_in:?}")),
            Event::CircuitClosed { open_for, .. } => Some(format!("closed {open_for:?}")),
            Event::LimitsLearned {
                rate,
                burst,
                max_in_flight,
                ..
            } => Some(format!("learned {rate:?} {burst:?} {max_in_flight:?}")),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn the_circuit_sends_opened_at_the_last_failure_again_on_a_failed_probe_and_closed() {
    let throttle = Throttle::builder()
        .max_retries(0)
        .circuit_breaker(Some(CircuitBreaker::new(2, 10 * S)))
        .build()
        .unwrap();
    let mut events = throttle.events();
    let healthy = Arc::new(AtomicBool::new(false));
    let client = common::fails_until(healthy.clone()).client(&throttle);
    let get = || client.get(URL).send();
    assert_eq!(get().await.unwrap().status(), 503);
    assert_eq!(learning_events(drain(&mut events)), [] as [String; 0]);
    assert_eq!(get().await.unwrap().status(), 503);
    let got = drain(&mut events);
    assert_eq!(scope_of(&got[0]), ("http://api.test:80".into(), None));
    assert_eq!(learning_events(got), ["opened 10s"]);
    // Failing fast while open sends nothing; the failed probe opens it again.
    assert!(get().await.is_err());
    tokio::time::advance(10 * S).await;
    assert_eq!(get().await.unwrap().status(), 503);
    assert_eq!(learning_events(drain(&mut events)), ["opened 10s"]);
    // The next probe succeeds: closed, 20 s after it first opened.
    tokio::time::advance(10 * S).await;
    healthy.store(true, Ordering::Relaxed);
    assert_eq!(get().await.unwrap().status(), 200);
    assert_eq!(get().await.unwrap().status(), 200);
    assert_eq!(learning_events(drain(&mut events)), ["closed 20s"]);
}

#[tokio::test(start_paused = true)]
async fn limits_learned_is_sent_when_a_learned_value_changes_not_per_answer() {
    // A parallel-limit refusal halves the learned cap (8 to 4); 10 successes raise it to 5.
    let throttle = Throttle::builder().max_in_flight(8).build().unwrap();
    let mut events = throttle.events();
    let client = common::refuses_parallel_once().client(&throttle);
    let get = || client.get(URL).with_extension(NoRetry).send();
    assert_eq!(get().await.unwrap().status(), 429);
    assert_eq!(
        learning_events(drain(&mut events)),
        ["learned None None Some(4)"]
    );
    for _ in 0..9 {
        assert_eq!(get().await.unwrap().status(), 200);
    }
    assert_eq!(learning_events(drain(&mut events)), [] as [String; 0]);
    assert_eq!(get().await.unwrap().status(), 200);
    assert_eq!(
        learning_events(drain(&mut events)),
        ["learned None None Some(5)"]
    );
    let learned = throttle.learned("http://api.test:80").unwrap();
    assert_eq!(learned.max_in_flight, Some(5));
}

#[tokio::test(start_paused = true)]
async fn with_learning_and_the_breaker_off_neither_sends_anything() {
    let throttle = Throttle::builder()
        .max_in_flight(8)
        .max_retries(0)
        .learn_limits(false)
        .circuit_breaker(None)
        .build()
        .unwrap();
    let mut events = throttle.events();
    let client = common::refuses_parallel_once().client(&throttle);
    assert_eq!(client.get(URL).send().await.unwrap().status(), 429);
    let failing = FakeServer::new(|_, _| status(503)).client(&throttle);
    for _ in 0..10 {
        assert_eq!(failing.get(URL).send().await.unwrap().status(), 503);
    }
    assert_eq!(learning_events(drain(&mut events)), [] as [String; 0]);
}
