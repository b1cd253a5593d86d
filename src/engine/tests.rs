//! Engine tests that need its crate-internal API (resizing limits).

use std::num::NonZeroU32;
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::extensions::Priority;
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
    })
}

fn window(limit: u32, window: Duration) -> WindowQuota {
    WindowQuota::new(NonZeroU32::new(limit).unwrap(), window, Duration::ZERO)
}

#[tokio::test(start_paused = true)]
async fn a_larger_in_flight_cap_admits_waiters_at_once() {
    let engine = engine(Limits::new().with_max_in_flight(Some(1)));
    let slot = engine.unkeyed().clone();
    let held = slot.admit(1, Priority::Normal, None).await.unwrap();
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let slot = slot.clone();
            tokio::spawn(async move { slot.admit(1, Priority::Normal, None).await.map(drop) })
        })
        .collect();
    tokio::task::yield_now().await;
    assert_eq!(slot.available_permits(), Some(0));
    slot.set_limits(&Limits::new().with_max_in_flight(Some(3)))
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
        held.push(slot.admit(1, Priority::Normal, None).await.unwrap());
    }
    slot.set_limits(&Limits::new().with_max_in_flight(Some(1)))
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let slot = slot.clone();
        async move { slot.admit(1, Priority::Normal, None).await.map(drop) }
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
    drop(slot.admit(1, Priority::Normal, None).await.unwrap());
    let waiter = tokio::spawn({
        let slot = slot.clone();
        async move {
            slot.admit(1, Priority::Normal, None).await.map(drop)?;
            Ok::<_, Refused>(Instant::now())
        }
    });
    tokio::time::sleep(5 * S).await;
    slot.set_limits(&Limits::new().with_window(window(2, 60 * S)))
        .await
        .unwrap();
    assert_eq!(waiter.await.unwrap(), Ok(t0 + 5 * S));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_whose_cost_no_longer_fits_is_refused() {
    let engine = engine(Limits::new().with_window(window(10, 60 * S)));
    let slot = engine.unkeyed().clone();
    drop(slot.admit(10, Priority::Normal, None).await.unwrap());
    let waiter = tokio::spawn({
        let slot = slot.clone();
        async move { slot.admit(8, Priority::Normal, None).await.map(drop) }
    });
    tokio::time::sleep(S).await;
    slot.set_limits(&Limits::new().with_window(window(5, 60 * S)))
        .await
        .unwrap();
    let refused = waiter.await.unwrap().unwrap_err();
    let expected = crate::ThrottleError::CostExceedsQuota {
        cost: 8,
        capacity: 5,
    };
    assert_eq!(refused, Refused::Cost(expected));
}
