//! Adversarial tests of the per-call state machine: deadlines at their exact edge, the report
//! of a kept answer, and waiters behind a head that waits on a quota. Paused tokio time.

use std::time::Duration;

use reqwest_throttle::{Cost, Deadline, Priority, Throttle, ThrottleError, Waits};
use tokio::time::Instant;

mod common;
use common::{info, json, refuses_once, status, windowed, FakeServer};

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

fn throttle_error(err: &reqwest_middleware::Error) -> &ThrottleError {
    match err {
        reqwest_middleware::Error::Middleware(e) => {
            e.downcast_ref::<ThrottleError>().expect("a ThrottleError")
        }
        other => panic!("not a throttle error: {other:?}"),
    }
}

// Symptom: with `Deadline::after(3 s)` and a 429 asking for `Retry-After: 3`, the call sleeps
// the whole 3 s and then returns the same 429 (`waits.retry == 3 s`): the retry can never be
// sent, since a send at the deadline is refused (`send` checks `deadline <= now`, admission
// refuses `ready >= deadline`).
// Root cause: src/policy/decide.rs:252 stops only for `wait.after > left`; a wait ending
// exactly at the deadline is started although nothing can follow it. The admission side
// (src/engine/slot.rs:320, `ready >= dl`) and src/middleware.rs:379 (`d <= now`) use the
// other edge.

#[tokio::test(start_paused = true)]
async fn a_retry_wait_that_ends_at_the_deadline_is_not_started() {
    let server = refuses_once("3");
    let throttle = Throttle::builder().jitter(false).build().unwrap();
    let c = server.client(&throttle);
    let t0 = Instant::now();
    let r = c
        .get("http://a.test/")
        .with_extension(Deadline::after(3 * S))
        .send()
        .await
        .unwrap();
    let i = info(&r);
    assert_eq!(r.status(), 429);
    assert_eq!(server.seen().len(), 1);
    assert_eq!(i.attempts, 1);
    assert_eq!(
        i.stopped,
        Some(reqwest_throttle::StopReason::Deadline),
        "{i:?}"
    );
    assert_eq!(i.waits.retry, Duration::ZERO, "{i:?}");
    assert_eq!(t0.elapsed(), Duration::ZERO, "returned at once");
}

// Symptom: a request whose in-flight slot frees at exactly its deadline is admitted (charged
// to the quotas, counted `sent`), then refused by `send`'s own deadline check without being
// handed on; the error says `attempts: 1` although nothing was sent.
// Root cause: src/engine/slot.rs:255 `admit` lets the admission finish at `deadline`
// (`timeout_at` polls the admission first), and src/middleware.rs:100 reports
// `deadline_reached(1, ..)` for a `DeadlinePassed` that `send` raised before sending. The
// quota units and the `sent` count are not given back.

#[tokio::test(start_paused = true)]
async fn a_request_admitted_at_its_deadline_is_not_charged_nor_counted_as_an_attempt() {
    let server = FakeServer::new(|_, _| json(200, &[], "{}"));
    let throttle = windowed(10, 60 * S).max_in_flight(1).build().unwrap();
    let c = server.client(&throttle);
    let t0 = Instant::now();
    // The first response holds the only slot until it is dropped, at exactly 1 s.
    let held = c.get("http://a.test/1").send().await.unwrap();
    // The second request queues (its deadline timer set) before the release is timed.
    let second = tokio::spawn({
        let c = c.clone();
        async move {
            c.get("http://a.test/2")
                .with_extension(Deadline(t0 + S))
                .send()
                .await
        }
    });
    tokio::task::yield_now().await;
    tokio::time::sleep_until(t0 + S).await;
    drop(held);
    let err = second.await.unwrap().unwrap_err();
    assert_eq!(server.seen().len(), 1, "the second request was never sent");
    match throttle_error(&err) {
        ThrottleError::DeadlineExceeded { attempts, .. } => {
            assert_eq!(*attempts, 0, "nothing was sent: {err}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        throttle.stats().sent,
        1,
        "counted as sent: {:?}",
        throttle.stats()
    );
    // Nothing was charged for it: 9 units are free at once.
    server.forget();
    let t = Instant::now();
    c.get("http://a.test/3")
        .with_extension(Cost(9))
        .send()
        .await
        .unwrap();
    assert_eq!(server.sent_at(t), vec![Duration::ZERO], "9 units were free");
}

// Symptom: the deadline passes during a retry, and the kept 429 (which closed the scope's
// cooldown) is returned with `ThrottleInfo::cooldown == None`.
// Root cause: src/middleware.rs:336 (`deadline_reached`) builds the report with
// `cooldown: None` instead of the cooldown the kept answer closed (still in `self.cooldown`,
// or to be kept with it in `last`).

#[tokio::test(start_paused = true)]
async fn a_kept_answer_returned_at_the_deadline_reports_the_cooldown_it_closed() {
    let server = refuses_once("2").with_delay(2 * S);
    let throttle = Throttle::builder().jitter(false).build().unwrap();
    let c = server.client(&throttle);
    // 429 at 2 s, retry wait to 4 s, second attempt cut at 5 s.
    let r = c
        .get("http://a.test/")
        .with_extension(Deadline::after(5 * S))
        .send()
        .await
        .unwrap();
    let i = info(&r);
    assert_eq!((r.status().as_u16(), i.attempts), (429, 2));
    assert_eq!(i.stopped, Some(reqwest_throttle::StopReason::Deadline));
    assert_eq!(i.cooldown, Some(2 * S), "{i:?}");
}

/// Four requests held by an in-flight cap of 1, then a head whose quota wait is long: who is
/// sent when.
struct Blocked {
    server: FakeServer,
    client: reqwest_middleware::ClientWithMiddleware,
    throttle: Throttle,
    t0: Instant,
}

/// 9 units of a 10-per-minute window are taken by a request in flight until 5 s (cap 1).
async fn nine_of_ten_in_flight() -> Blocked {
    let server = FakeServer::ok().with_delay(5 * S);
    let throttle = windowed(10, 60 * S)
        .max_in_flight(1)
        .priority_aging(30 * S)
        .build()
        .unwrap();
    let client = server.client(&throttle);
    let t0 = Instant::now();
    tokio::spawn({
        let c = client.clone();
        async move {
            drop(
                c.get("http://a.test/x")
                    .with_extension(Cost(9))
                    .send()
                    .await
                    .unwrap(),
            )
        }
    });
    tokio::task::yield_now().await;
    Blocked {
        server,
        client,
        throttle,
        t0,
    }
}

fn spawn_send(
    c: &reqwest_middleware::ClientWithMiddleware,
    path: &str,
    cost: u32,
    priority: Priority,
) -> tokio::task::JoinHandle<Duration> {
    let c = c.clone();
    let url = format!("http://a.test/{path}");
    tokio::spawn(async move {
        let r = c
            .get(url)
            .with_extension(Cost(cost))
            .with_extension(priority)
            .send()
            .await
            .unwrap();
        info(&r).waited
    })
}

// Symptom: a cost-0 request queued behind the head (both waiting for the in-flight slot)
// stays queued when the slot frees and the head then waits 55 s on a quota: it goes at 60 s,
// with the head, although the slot is free and no quota concerns it. Only a cost-0 request
// that *arrives* while the head waits on a quota goes past.
// Root cause: src/engine/slot.rs:317 `admit_inner` (the loop: `set_blocked` then sleep) records
// the head's quota block but wakes nobody behind it; the cost-0 bypass is checked only on
// arrival (src/engine/slot.rs:279, `past_the_head`), never by a waiter already queued.

#[tokio::test(start_paused = true)]
async fn a_queued_cost_0_request_goes_once_the_head_waits_on_a_quota() {
    let b = nine_of_ten_in_flight().await;
    let head = spawn_send(&b.client, "head", 10, Priority::Normal);
    tokio::task::yield_now().await;
    let free = spawn_send(&b.client, "free", 0, Priority::Normal);
    tokio::task::yield_now().await;
    assert_eq!(b.throttle.stats().queued, 2);
    let waited = free.await.unwrap();
    head.await.unwrap();
    let sent: Vec<_> = b
        .server
        .seen()
        .iter()
        .map(|s| (s.path.clone(), s.at - b.t0))
        .collect();
    // The slot frees at 5 s; the cost-0 request needs nothing else.
    assert_eq!(waited, 5 * S, "sent: {sent:?}");
}

// Symptom: with priority aging 30 s, a low-priority request queued at 0 s behind a critical
// head is not sent at 30 s although its single unit fits the quota and the in-flight slot is
// free: it goes only at 60 s, when the head's quota wait ends and the head, looking again,
// finds it aged.
// Root cause: src/engine/queue.rs:189 `head` makes a waiter the head by aging only when someone
// polls; the head sleeps on its quota wait (src/engine/slot.rs:328, `sleep_until(ready)`) and no
// timer wakes the waiter when it reaches the aging bound.

#[tokio::test(start_paused = true)]
async fn an_aged_waiter_goes_at_the_aging_bound_while_the_head_waits_on_a_quota() {
    let b = nine_of_ten_in_flight().await;
    let low = spawn_send(&b.client, "low", 1, Priority::Low);
    tokio::task::yield_now().await;
    let critical = spawn_send(&b.client, "critical", 10, Priority::Critical);
    tokio::task::yield_now().await;
    let waited = low.await.unwrap();
    critical.await.unwrap();
    let sent: Vec<_> = b
        .server
        .seen()
        .iter()
        .map(|s| (s.path.clone(), s.at - b.t0))
        .collect();
    assert!(waited <= 30 * S + MS, "waited {waited:?}; sent: {sent:?}");
}

// Covered risk: the breakdown always sums to `waited`, across a queue wait, a cooldown, a
// retry and a quota wait in one call.
#[tokio::test(start_paused = true)]
async fn the_parts_of_a_long_call_sum_to_the_time_waited() {
    let server = FakeServer::new(|i, _| match i {
        1 => json(
            429,
            &[("retry-after", "4"), ("rate_limit_type", "rpm")],
            "{}",
        ),
        _ => status(200),
    })
    .with_delay(S);
    let throttle = windowed(2, 10 * S).jitter(false).build().unwrap();
    let c = server.client(&throttle);
    let first = tokio::spawn({
        let c = c.clone();
        async move { info(&c.get("http://a.test/0").send().await.unwrap()) }
    });
    tokio::task::yield_now().await;
    let r = c.get("http://a.test/1").send().await.unwrap();
    let i = info(&r);
    let f = first.await.unwrap();
    for i in [&i, &f] {
        let w: Waits = i.waits;
        assert_eq!(w.total(), i.waited, "{i:?}");
    }
    assert_eq!(i.attempts, 2, "{i:?}");
    // 429 at 1 s, retry at 5 s (the window's two units are spent until 10 s): waits 5 s more.
    assert_eq!(i.waits.retry, 4 * S, "{i:?}");
    assert_eq!(
        i.waited,
        4 * S + i.waits.quota + i.waits.cooldown + i.waits.queue,
        "{i:?}"
    );
}
