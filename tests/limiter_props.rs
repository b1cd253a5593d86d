//! Property tests on admission itself (`Throttle::acquire`), with paused time: random
//! workloads with random cancellations never break the in-flight cap or a sliding window,
//! and leak no permit.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use reqwest_throttle::Throttle;
use tokio::time::Instant;

mod common;
use common::{busiest_window, paused_runtime};

#[derive(Debug, Clone)]
struct Job {
    cost: u32,
    start_ms: u64,
    hold_ms: u64,
    cancel_after_ms: Option<u64>,
}

fn job(max_cost: u32) -> impl Strategy<Value = Job> {
    (
        0..=max_cost,
        0u64..3_000,
        0u64..1_500,
        proptest::option::of(0u64..2_500),
    )
        .prop_map(|(cost, start_ms, hold_ms, cancel_after_ms)| Job {
            cost,
            start_ms,
            hold_ms,
            cancel_after_ms,
        })
}

/// Counts a job as in flight while it lives, even when its future is dropped mid-way.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn run(cap: usize, limit: u32, window: Duration, jobs: Vec<Job>) -> Result<(), TestCaseError> {
    let rt = paused_runtime();
    rt.block_on(async move {
        let throttle = Throttle::builder()
            .sliding_window(limit, window)
            .window_guard(Duration::ZERO)
            .max_in_flight(cap)
            .build()
            .unwrap();
        let sends: Arc<Mutex<Vec<(Instant, u32)>>> = Arc::default();
        let in_flight = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = jobs
            .into_iter()
            .map(|job| {
                let (throttle, sends) = (throttle.clone(), sends.clone());
                let (in_flight, peak) = (in_flight.clone(), peak.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(job.start_ms)).await;
                    let work = async {
                        let permit = throttle.acquire(job.cost).await.unwrap();
                        sends.lock().unwrap().push((Instant::now(), job.cost));
                        let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                        let _counted = InFlight(in_flight.clone());
                        peak.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(job.hold_ms)).await;
                        drop(permit);
                    };
                    match job.cancel_after_ms {
                        Some(ms) => {
                            let _ = tokio::time::timeout(Duration::from_millis(ms), work).await;
                        }
                        None => work.await,
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        prop_assert!(peak.load(Ordering::SeqCst) <= cap);
        let sends = sends.lock().unwrap();
        if let Some((used, start)) = busiest_window(&sends, window) {
            prop_assert!(
                used <= limit,
                "{used} units in the window from {start:?}: {sends:?}"
            );
        }
        let stats = throttle.stats();
        prop_assert_eq!(stats.available_permits, Some(cap));
        prop_assert_eq!((stats.in_flight, stats.queued), (0, 0));
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn cap_and_window_hold_under_cancellation(
        cap in 1usize..6,
        limit in 1u32..8,
        window_ms in 50u64..2_000,
        jobs in proptest::collection::vec(job(3), 1..40),
    ) {
        let jobs = jobs
            .into_iter()
            .map(|j| Job { cost: j.cost.min(limit), ..j })
            .collect();
        run(cap, limit, Duration::from_millis(window_ms), jobs)?;
    }
}

#[tokio::test(start_paused = true)]
async fn acquire_waits_for_a_permit_and_a_dropped_waiter_takes_nothing() {
    let throttle = Throttle::builder().max_in_flight(1).build().unwrap();
    let first = throttle.acquire(1).await.unwrap();
    let waiter = tokio::spawn({
        let t = throttle.clone();
        async move { t.acquire(1).await.map(drop) }
    });
    while throttle.stats().queued == 0 {
        tokio::task::yield_now().await;
    }
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    assert_eq!(throttle.stats().queued, 0);
    drop(first);
    let again = throttle.acquire(1).await.unwrap();
    assert_eq!(throttle.stats().available_permits, Some(0));
    drop(again);
    assert_eq!(throttle.stats().available_permits, Some(1));
}

/// Releases on other threads race with callers queueing: none may be missed, or a caller
/// would wait for a release that already happened. The timeout only guards against a hang.
#[test]
fn on_many_threads_no_waiter_misses_a_release() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        for round in 0..3000 {
            let throttle = Throttle::builder().max_in_flight(2).build().unwrap();
            let tasks: Vec<_> = (0..4)
                .map(|_| {
                    let throttle = throttle.clone();
                    tokio::spawn(async move {
                        let permit = throttle.acquire(1).await.unwrap();
                        tokio::task::yield_now().await;
                        drop(permit);
                    })
                })
                .collect();
            let all = futures::future::join_all(tasks);
            let done = tokio::time::timeout(Duration::from_secs(60), all).await;
            assert!(done.is_ok(), "round {round}: a waiter missed a release");
            let stats = throttle.stats();
            assert_eq!((stats.in_flight, stats.queued), (0, 0));
            assert_eq!(stats.available_permits, Some(2));
        }
    });
}
