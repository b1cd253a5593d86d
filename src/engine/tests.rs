//! Engine tests that need its crate-internal API (resizing limits).

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::extensions::{Priority, Waits};
use crate::store::{MemoryStore, WindowQuota};

const S: Duration = Duration::from_secs(1);

fn engine(limits: Limits) -> Engine<MemoryStore> {
    Engine::new(EngineConfig {
        store: MemoryStore,
        scope: Scope::global(),
        limits,
        aging: 30 * S,
        bounds: Bounds {
            max_scopes: 10,
            idle_ttl: 600 * S,
        },
        learn: Arc::new(crate::learn::LearnConfig::off()),
        observe: crate::observe::ObserveConfig::default(),
        names: Vec::new(),
    })
}

fn window(limit: u32, window: Duration) -> WindowQuota {
    WindowQuota::new(NonZeroU32::new(limit).unwrap(), window, Duration::ZERO)
}

#[tokio::test(start_paused = true)]
async fn a_larger_in_flight_cap_admits_waiters_at_once() {
    let engine = engine(Limits::new().with_max_in_flight(Some(1)));
    let slot = engine.unkeyed().clone();
    let held = slot
        .admit(1, Priority::Normal, None, &mut Waits::default())
        .await
        .unwrap();
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let slot = slot.clone();
            tokio::spawn(async move {
                slot.admit(1, Priority::Normal, None, &mut Waits::default())
                    .await
                    .map(drop)
            })
        })
        .collect();
    tokio::task::yield_now().await;
    assert_eq!(slot.available_permits(), Some(0));
    slot.set_limits(&Limits::new().with_max_in_flight(Some(3)), &[])
        .await
        .unwrap();
    for w in waiters {
        w.await.unwrap().unwrap();
    }
    assert_eq!(slot.available_permits(), Some(2));
    drop(held);
    assert_eq!(slot.available_permits(), Some(3));
}

#[tokio::test(start_paused = true)]
async fn a_smaller_cap_revokes_nothing_and_admits_once_below_it() {
    let engine = engine(Limits::new().with_max_in_flight(Some(3)));
    let slot = engine.unkeyed().clone();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(
            slot.admit(1, Priority::Normal, None, &mut Waits::default())
                .await
                .unwrap(),
        );
    }
    slot.set_limits(&Limits::new().with_max_in_flight(Some(1)), &[])
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let slot = slot.clone();
        async move {
            slot.admit(1, Priority::Normal, None, &mut Waits::default())
                .await
                .map(drop)
        }
    });
    for _ in 0..2 {
        held.pop();
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "still at or above the new cap");
    }
    held.pop();
    waiter.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_grown_window_wakes_a_waiter_before_its_planned_time() {
    let engine = engine(Limits::new().with_window(window(1, 60 * S)));
    let slot = engine.unkeyed().clone();
    let t0 = Instant::now();
    drop(
        slot.admit(1, Priority::Normal, None, &mut Waits::default())
            .await
            .unwrap(),
    );
    let waiter = tokio::spawn({
        let slot = slot.clone();
        async move {
            slot.admit(1, Priority::Normal, None, &mut Waits::default())
                .await
                .map(drop)?;
            Ok::<_, Refused>(Instant::now())
        }
    });
    tokio::time::sleep(5 * S).await;
    slot.set_limits(&Limits::new().with_window(window(2, 60 * S)), &[])
        .await
        .unwrap();
    assert_eq!(waiter.await.unwrap(), Ok(t0 + 5 * S));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_whose_cost_no_longer_fits_is_refused() {
    let engine = engine(Limits::new().with_window(window(10, 60 * S)));
    let slot = engine.unkeyed().clone();
    drop(
        slot.admit(10, Priority::Normal, None, &mut Waits::default())
            .await
            .unwrap(),
    );
    let waiter = tokio::spawn({
        let slot = slot.clone();
        async move {
            slot.admit(8, Priority::Normal, None, &mut Waits::default())
                .await
                .map(drop)
        }
    });
    tokio::time::sleep(S).await;
    slot.set_limits(&Limits::new().with_window(window(5, 60 * S)), &[])
        .await
        .unwrap();
    let refused = waiter.await.unwrap().unwrap_err();
    let expected = crate::ThrottleError::CostExceedsQuota {
        cost: 8,
        capacity: 5,
        quota: crate::store::QuotaName::SlidingWindow {
            limit: 5,
            window: 60 * S,
        },
    };
    assert_eq!(refused, Refused::Cost(expected));
}

mod resize_under_load {
    //! Random jobs (costs, priorities, holds, cancellations) while the in-flight cap and the
    //! window limit change at random: no admission ever breaks the limits in force when it is
    //! made, nobody is stranded, and nothing leaks.

    use std::sync::Mutex;

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    struct Job {
        cost: u32,
        priority: Priority,
        start_ms: u64,
        hold_ms: u64,
        cancel_after_ms: Option<u64>,
    }

    #[derive(Debug, Clone, Copy)]
    struct Resize {
        at_ms: u64,
        cap: usize,
        limit: u32,
    }

    fn job() -> impl Strategy<Value = Job> {
        let priority = prop_oneof![
            Just(Priority::Low),
            Just(Priority::Normal),
            Just(Priority::High),
            Just(Priority::Critical),
        ];
        (
            0u32..=2,
            priority,
            0u64..2_000,
            0u64..800,
            proptest::option::of(0u64..1_500),
        )
            .prop_map(|(cost, priority, start_ms, hold_ms, cancel_after_ms)| Job {
                cost,
                priority,
                start_ms,
                hold_ms,
                cancel_after_ms,
            })
    }

    fn resize() -> impl Strategy<Value = Resize> {
        (0u64..2_500, 1usize..5, 2u32..6).prop_map(|(at_ms, cap, limit)| Resize {
            at_ms,
            cap,
            limit,
        })
    }

    /// What the limits were when each admission was made, and what it took.
    #[derive(Debug, Default)]
    struct Log {
        cap: usize,
        limit: u32,
        held: usize,
        /// (instant, units) of every admission.
        sends: Vec<(Instant, u32)>,
        violations: Vec<String>,
    }

    const WINDOW: Duration = Duration::from_millis(500);

    /// Counts a lease as held in the log while it lives, even when its job is cancelled.
    struct Held(Arc<Mutex<Log>>);

    impl Drop for Held {
        fn drop(&mut self) {
            self.0.lock().unwrap().held -= 1;
        }
    }

    fn limits(cap: usize, limit: u32) -> Limits {
        Limits::new()
            .with_max_in_flight(Some(cap))
            .with_window(window(limit, WINDOW))
    }

    fn run(
        cap: usize,
        limit: u32,
        jobs: Vec<Job>,
        resizes: Vec<Resize>,
    ) -> Result<(), TestCaseError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async move {
            let engine = engine(limits(cap, limit));
            let slot = engine.unkeyed().clone();
            let log = Arc::new(Mutex::new(Log {
                cap,
                limit,
                ..Log::default()
            }));
            let resizer = tokio::spawn({
                let (slot, log) = (slot.clone(), log.clone());
                let mut resizes = resizes;
                resizes.sort_by_key(|r| r.at_ms);
                async move {
                    let t0 = Instant::now();
                    for r in resizes {
                        tokio::time::sleep_until(t0 + Duration::from_millis(r.at_ms)).await;
                        // Recorded first: an admission woken by the change sees the new limits.
                        {
                            let mut log = log.lock().unwrap();
                            log.cap = r.cap;
                            log.limit = r.limit;
                        }
                        slot.set_limits(&limits(r.cap, r.limit), &[]).await.unwrap();
                    }
                }
            });
            let tasks: Vec<_> = jobs
                .into_iter()
                .map(|job| {
                    let (slot, log) = (slot.clone(), log.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(job.start_ms)).await;
                        let work = async {
                            let cost = job.cost.min(2);
                            let _lease = match slot
                                .admit(cost, job.priority, None, &mut Waits::default())
                                .await
                            {
                                Ok(lease) => lease,
                                // A cost above a shrunk limit is refused, never admitted.
                                Err(Refused::Cost(_)) => return,
                                Err(e) => panic!("{e:?}"),
                            };
                            let now = Instant::now();
                            {
                                let mut log = log.lock().unwrap();
                                log.held += 1;
                                if log.held > log.cap {
                                    let msg = format!("{} held, cap {}", log.held, log.cap);
                                    log.violations.push(msg);
                                }
                                log.sends.push((now, cost));
                                let used: u32 = log
                                    .sends
                                    .iter()
                                    .filter(|(t, _)| *t + WINDOW > now)
                                    .map(|(_, c)| c)
                                    .sum();
                                // A cost of 0 takes nothing from a window, however full.
                                if cost > 0 && used > log.limit {
                                    let msg =
                                        format!("{used} units in the window, limit {}", log.limit);
                                    log.violations.push(msg);
                                }
                            }
                            // Dropped before the lease (declared after it).
                            let _held = Held(log.clone());
                            tokio::time::sleep(Duration::from_millis(job.hold_ms)).await;
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
            // Everyone ends: nobody is stranded in the queue with room free.
            let all = futures::future::join_all(tasks);
            let done = tokio::time::timeout(Duration::from_secs(3600), all).await;
            prop_assert!(done.is_ok(), "a waiter was stranded");
            resizer.await.unwrap();
            let log = log.lock().unwrap();
            prop_assert!(log.violations.is_empty(), "{:?}", log.violations);
            let total = engine.total();
            let queued = total.queued.load(std::sync::atomic::Ordering::Relaxed);
            let in_flight = total.in_flight.load(std::sync::atomic::Ordering::Relaxed);
            prop_assert_eq!((queued, in_flight), (0, 0));
            Ok(())
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn limits_hold_while_they_change(
            cap in 1usize..5,
            limit in 2u32..6,
            jobs in proptest::collection::vec(job(), 1..30),
            resizes in proptest::collection::vec(resize(), 0..6),
        ) {
            run(cap, limit, jobs, resizes)?;
        }
    }
}
