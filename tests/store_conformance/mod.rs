//! A conformance suite for [`Store`]: what every store must answer, checked against the
//! trait's documentation (src/store/mod.rs).
//!
//! Each check is a `pub async fn name<S: Store>(store: &S)` (the properties take a factory and
//! build a paused current-thread runtime per case). [`store_conformance!`] expands to one test
//! per check, so a store is covered with one line:
//!
//! ```ignore
//! mod store_conformance;
//! store_conformance!(reqwest_throttle::store::MemoryStore);
//! ```
//!
//! The store expression is evaluated inside each test's async body (it may `.await`). A
//! store that needs a server gives `ready = expr` too: a test whose `expr` is false returns
//! at once (skipped): `store_conformance!(make_store(), ready = server_is_up());`.
//!
//! Time is tokio time, paused: every expectation is exact. Each check opens its scopes under
//! fresh random [`ScopeId`]s, so a shared store may run checks in parallel.

use std::collections::HashSet;
use std::future::Future;
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use governor::clock::{Clock, FakeRelativeClock};
use governor::{Quota, RateLimiter};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::strategy::{BoxedStrategy, Union};
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use reqwest_throttle::store::{
    Admission, LeaseId, Limits, QuotaName, ScopeId, Settlement, Store, Unit, WindowQuota,
};
use tokio::time::{advance, Instant};

// ---------------------------------------------------------------------------------------------
// The macro.

/// One test per conformance check for the store `$make` (an expression evaluated in each
/// test's async body).
#[macro_export]
macro_rules! store_conformance {
    ($make:expr $(,)?) => {
        $crate::store_conformance!($make, ready = true);
    };
    ($make:expr, ready = $ready:expr $(,)?) => {
        $crate::store_conformance!(@async $make, $ready;
            sliding_window_admits_its_limit_then_waits_for_the_oldest_send,
            sliding_window_sends_leave_oldest_first,
            token_bucket_admits_its_burst_then_one_per_interval,
            token_bucket_matches_the_gcra_table,
            costs_take_units_from_windows_and_cells_from_buckets,
            cost_above_the_smallest_quota_is_too_large,
            cost_zero_passes_full_quotas_but_takes_a_lease,
            window_refusal_charges_no_bucket,
            in_flight_refusal_charges_no_quota,
            cooldown_refusal_charges_nothing,
            refusal_by_a_later_bucket_charges_no_earlier_bucket,
            in_flight_cap_and_releases,
            idle_after_releasing_every_lease_once_quotas_refill,
            cooldown_closes_and_only_lengthens,
            cooldown_of_duration_max_does_not_overflow,
            set_limits_growing_admits_at_once,
            set_limits_shrinking_the_in_flight_cap_keeps_leases,
            set_limits_shrinking_a_window_keeps_its_sends,
            set_limits_cost_above_the_new_capacity_is_too_large,
            is_idle_tracks_leases_cooldown_and_quotas,
            idle_again_after_an_attempt_refused_by_a_later_bucket,
            scopes_are_independent,
            admit_future_dropped_unpolled_charges_nothing,
            settle_refunds_at_the_send_and_never_more_than_its_charge,
            settle_charges_more_at_the_send_never_past_the_limit,
            settle_after_the_send_left_the_window_changes_nothing,
            settle_a_token_bucket_is_only_charged_more_never_past_empty,
            settle_counts_once_even_after_release,
            settle_tokens_remaining_lowers_only_token_windows,
            settle_tokens_remaining_of_an_unknown_lease_counts_now,
            requests_window_counts_one_per_request_whatever_the_cost,
        );
        $crate::store_conformance!(@prop $make, $ready;
            prop_in_flight_cap_resized_window_fixed,
            prop_window_limit_and_in_flight_cap_resized,
            prop_admit_futures_dropped_unpolled,
            prop_settle_matches_the_window_model,
        );
    };
    (@async $make:expr, $ready:expr; $($check:ident),* $(,)?) => {
        $(
            #[tokio::test(start_paused = true)]
            async fn $check() {
                if !$ready {
                    return;
                }
                let store = $make;
                $crate::store_conformance::$check(&store).await;
            }
        )*
    };
    (@prop $make:expr, $ready:expr; $($check:ident),* $(,)?) => {
        $(
            #[test]
            fn $check() {
                if !$ready {
                    return;
                }
                $crate::store_conformance::$check(|| async { $make });
            }
        )*
    };
}

// ---------------------------------------------------------------------------------------------
// Helpers.

/// `n` as a `NonZeroU32` (panics on 0).
pub fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("non-zero")
}

/// `n` milliseconds.
pub const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `n` seconds.
pub const fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A sliding window of `limit` units per `window`, each send counted for `window + guard`.
pub fn window(limit: u32, window: Duration, guard: Duration) -> WindowQuota {
    WindowQuota::new(nz(limit), window, guard)
}

/// A scope id no other check (nor another run against a shared store) uses.
pub fn fresh_id() -> ScopeId {
    ScopeId::from_u128(uuid::Uuid::new_v4().as_u128())
}

/// Opens a scope with `limits` under a fresh id.
pub fn open<S: Store>(store: &S, limits: &Limits) -> S::Scope {
    store.open(fresh_id(), limits)
}

/// One admission attempt; a store error fails the check.
pub async fn admit<S: Store>(store: &S, scope: &S::Scope, cost: u32) -> Admission {
    store
        .admit(scope, cost)
        .await
        .unwrap_or_else(|e| panic!("admit(cost {cost}) failed: {e}"))
}

/// The lease of an `Admitted` answer; any other answer fails the check.
#[track_caller]
pub fn admitted(answer: Admission) -> LeaseId {
    match answer {
        Admission::Admitted(lease) => lease,
        other => panic!("expected Admitted, got {other:?}"),
    }
}

/// `n` admissions of `cost` that must all be admitted now; their leases.
pub async fn admit_all<S: Store>(store: &S, scope: &S::Scope, cost: u32, n: usize) -> Vec<LeaseId> {
    let mut leases = Vec::with_capacity(n);
    for i in 0..n {
        match admit(store, scope, cost).await {
            Admission::Admitted(lease) => leases.push(lease),
            other => panic!(
                "admission {} of {n} (cost {cost}): expected Admitted, got {other:?}",
                i + 1
            ),
        }
    }
    leases
}

/// Releases every lease.
pub fn release_all<S: Store>(
    store: &S,
    scope: &S::Scope,
    leases: impl IntoIterator<Item = LeaseId>,
) {
    for lease in leases {
        store.release(scope, lease);
    }
}

async fn close_cooldown<S: Store>(store: &S, scope: &S::Scope, wait: Duration) {
    store
        .close_cooldown(scope, wait)
        .await
        .unwrap_or_else(|e| panic!("close_cooldown({wait:?}) failed: {e}"));
}

async fn set_limits<S: Store>(store: &S, scope: &S::Scope, limits: &Limits) {
    store
        .set_limits(scope, limits)
        .await
        .unwrap_or_else(|e| panic!("set_limits({limits:?}) failed: {e}"));
}

// ---------------------------------------------------------------------------------------------
// 1. Sliding windows.

/// Limit 3 per 10 s with a 250 ms guard: 3 at once, then the 4th waits exactly until the sends
/// leave (window + guard), not 1 ms less.
pub async fn sliding_window_admits_its_limit_then_waits_for_the_oldest_send<S: Store>(store: &S) {
    let span = ms(10_250);
    let scope = open(
        store,
        &Limits::new().with_window(window(3, secs(10), ms(250))),
    );
    admit_all(store, &scope, 1, 3).await;
    assert_eq!(admit(store, &scope, 1).await, Admission::NotBefore(span));
    advance(span - ms(1)).await;
    assert_eq!(admit(store, &scope, 1).await, Admission::NotBefore(ms(1)));
    advance(ms(1)).await;
    // All three sends were made at once, so all three have left.
    admit_all(store, &scope, 1, 3).await;
    assert_eq!(admit(store, &scope, 1).await, Admission::NotBefore(span));
}

/// Sends at 0 s, 2 s and 5 s (limit 3, window 10 s, guard 250 ms): each wait is the time until
/// the oldest send still counted leaves; a cost of 2 waits for the two oldest.
pub async fn sliding_window_sends_leave_oldest_first<S: Store>(store: &S) {
    let scope = open(
        store,
        &Limits::new().with_window(window(3, secs(10), ms(250))),
    );
    admitted(admit(store, &scope, 1).await);
    advance(secs(2)).await;
    admitted(admit(store, &scope, 1).await);
    advance(secs(3)).await;
    admitted(admit(store, &scope, 1).await);
    // Now 5 s: the send at 0 s leaves at 10.25 s.
    assert_eq!(
        admit(store, &scope, 1).await,
        Admission::NotBefore(ms(5_250))
    );
    advance(ms(5_249)).await;
    assert_eq!(admit(store, &scope, 1).await, Admission::NotBefore(ms(1)));
    advance(ms(1)).await;
    admitted(admit(store, &scope, 1).await);
    // Now 10.25 s, sends at 2 s, 5 s, 10.25 s: the one at 2 s leaves at 12.25 s.
    assert_eq!(admit(store, &scope, 1).await, Admission::NotBefore(secs(2)));
    // Two units need the sends at 2 s and 5 s gone: 15.25 s.
    assert_eq!(admit(store, &scope, 2).await, Admission::NotBefore(secs(5)));
    advance(secs(2)).await;
    admitted(admit(store, &scope, 1).await);
    assert_eq!(admit(store, &scope, 1).await, Admission::NotBefore(secs(3)));
}

// ---------------------------------------------------------------------------------------------
// 2. Token buckets.

/// 4 per second with a burst of 3: 3 at once, then one every 250 ms; each refusal names the
/// time to the next cell; an idle second refills the burst and no more.
pub async fn token_bucket_admits_its_burst_then_one_per_interval<S: Store>(store: &S) {
    let quota = Quota::per_second(nz(4)).allow_burst(nz(3));
    let scope = open(store, &Limits::new().with_bucket(quota));
    admit_all(store, &scope, 1, 3).await;
    assert_eq!(admit(store, &scope, 1).await, Admission::NotBefore(ms(250)));
    advance(ms(249)).await;
    assert_eq!(admit(store, &scope, 1).await, Admission::NotBefore(ms(1)));
    advance(ms(1)).await;
    admitted(admit(store, &scope, 1).await);
    assert_eq!(admit(store, &scope, 1).await, Admission::NotBefore(ms(250)));
    for _ in 0..8 {
        advance(ms(100)).await;
        assert_eq!(admit(store, &scope, 1).await, Admission::NotBefore(ms(150)));
        advance(ms(150)).await;
        admitted(admit(store, &scope, 1).await);
        assert_eq!(admit(store, &scope, 1).await, Admission::NotBefore(ms(250)));
    }
    advance(secs(1)).await;
    admit_all(store, &scope, 1, 3).await;
    assert_eq!(admit(store, &scope, 1).await, Admission::NotBefore(ms(250)));
}

/// What one attempt in [`GCRA_TABLE`] must get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gcra {
    /// Admitted.
    Admit,
    /// `NotBefore` this many milliseconds.
    Wait(u64),
}

/// The quota of [`GCRA_TABLE`]: 4 per second (one cell per 250 ms), burst 3.
pub fn gcra_table_quota() -> Quota {
    Quota::per_second(nz(4)).allow_burst(nz(3))
}

/// Attempts (milliseconds after the scope opened, cost) and what governor's GCRA answers,
/// for [`gcra_table_quota`]. A refused attempt changes nothing.
pub const GCRA_TABLE: &[(u64, u32, Gcra)] = &[
    (0, 1, Gcra::Admit),
    (0, 1, Gcra::Admit),
    (0, 1, Gcra::Admit),
    (0, 1, Gcra::Wait(250)),
    (100, 1, Gcra::Wait(150)),
    (249, 1, Gcra::Wait(1)),
    (250, 1, Gcra::Admit),
    (250, 1, Gcra::Wait(250)),
    (400, 1, Gcra::Wait(100)),
    (500, 1, Gcra::Admit),
    (600, 2, Gcra::Wait(400)),
    (1000, 2, Gcra::Admit),
    (1250, 1, Gcra::Admit),
    (1500, 1, Gcra::Admit),
    (2000, 3, Gcra::Wait(250)),
    (2000, 1, Gcra::Admit),
    (2100, 1, Gcra::Admit),
    (2750, 1, Gcra::Admit),
    (3000, 2, Gcra::Admit),
    (3250, 1, Gcra::Admit),
    (5000, 3, Gcra::Admit),
    (5000, 1, Gcra::Wait(250)),
    (5500, 2, Gcra::Admit),
    (5750, 2, Gcra::Wait(250)),
];

/// The table checked against governor itself (on a fake clock), then against the store.
pub async fn token_bucket_matches_the_gcra_table<S: Store>(store: &S) {
    // The table is governor's answer: a wrong row is the table's fault, not the store's.
    let clock = FakeRelativeClock::default();
    let limiter = RateLimiter::direct_with_clock(gcra_table_quota(), clock.clone());
    let mut at = 0;
    for (row, &(t, cost, expected)) in GCRA_TABLE.iter().enumerate() {
        clock.advance(ms(t - at));
        at = t;
        let got = match limiter.check_n(nz(cost)).expect("cost within the burst") {
            Ok(()) => Gcra::Admit,
            Err(not_until) => {
                let wait = not_until.wait_time_from(clock.now());
                Gcra::Wait(u64::try_from(wait.as_millis()).expect("small"))
            }
        };
        assert_eq!(
            got, expected,
            "governor disagrees with GCRA_TABLE row {row}"
        );
    }

    let scope = open(store, &Limits::new().with_bucket(gcra_table_quota()));
    let t0 = Instant::now();
    for (row, &(t, cost, expected)) in GCRA_TABLE.iter().enumerate() {
        advance((t0 + ms(t)).saturating_duration_since(Instant::now())).await;
        let want = match expected {
            Gcra::Admit => None,
            Gcra::Wait(w) => Some(Admission::NotBefore(ms(w))),
        };
        let got = admit(store, &scope, cost).await;
        match (want, got) {
            (None, Admission::Admitted(lease)) => store.release(&scope, lease),
            (want, got) => assert_eq!(
                Some(got),
                want,
                "row {row}: cost {cost} at {t} ms: expected {expected:?}"
            ),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 3. Costs.

/// A cost of c takes c units of a window and c cells of a bucket.
pub async fn costs_take_units_from_windows_and_cells_from_buckets<S: Store>(store: &S) {
    // A window of 5 units per 10 s.
    let w = open(
        store,
        &Limits::new().with_window(window(5, secs(10), Duration::ZERO)),
    );
    admitted(admit(store, &w, 3).await);
    assert_eq!(admit(store, &w, 3).await, Admission::NotBefore(secs(10)));
    admitted(admit(store, &w, 2).await);
    assert_eq!(admit(store, &w, 1).await, Admission::NotBefore(secs(10)));
    advance(secs(10)).await;
    admitted(admit(store, &w, 5).await);
    assert_eq!(admit(store, &w, 1).await, Admission::NotBefore(secs(10)));

    // A bucket of 10 per second (one cell per 100 ms), burst 8.
    let b = open(
        store,
        &Limits::new().with_bucket(Quota::per_second(nz(10)).allow_burst(nz(8))),
    );
    admitted(admit(store, &b, 5).await);
    assert_eq!(admit(store, &b, 4).await, Admission::NotBefore(ms(100)));
    admitted(admit(store, &b, 3).await);
    assert_eq!(admit(store, &b, 1).await, Admission::NotBefore(ms(100)));
    advance(ms(100)).await;
    admitted(admit(store, &b, 1).await);
    assert_eq!(admit(store, &b, 2).await, Admission::NotBefore(ms(200)));
    // 900 ms: the bucket has caught up (8 cells taken after 1, refilled at 100 ms each).
    advance(ms(800)).await;
    admitted(admit(store, &b, 8).await);
    assert_eq!(admit(store, &b, 1).await, Admission::NotBefore(ms(100)));
}

/// A cost above the smallest quota's limit or burst answers `CostTooLarge` with that capacity
/// and that quota, and charges nothing; without quotas any cost goes.
pub async fn cost_above_the_smallest_quota_is_too_large<S: Store>(store: &S) {
    let both = Limits::new()
        .with_window(window(5, secs(10), Duration::ZERO))
        .with_bucket(Quota::per_second(nz(10)).allow_burst(nz(8)));
    let scope = open(store, &both);
    let too_large = Admission::CostTooLarge {
        capacity: 5,
        quota: QuotaName::SlidingWindow {
            limit: 5,
            window: secs(10),
        },
    };
    assert_eq!(admit(store, &scope, 6).await, too_large);
    assert_eq!(admit(store, &scope, u32::MAX).await, too_large);
    // Nothing was charged: the whole capacity is still there.
    admitted(admit(store, &scope, 5).await);
    assert_eq!(admit(store, &scope, 6).await, too_large);

    let bucket = open(
        store,
        &Limits::new().with_bucket(Quota::per_second(nz(10)).allow_burst(nz(8))),
    );
    assert_eq!(
        admit(store, &bucket, 9).await,
        Admission::CostTooLarge {
            capacity: 8,
            quota: QuotaName::TokenBucket {
                burst: 8,
                replenish: ms(100),
            },
        }
    );
    admitted(admit(store, &bucket, 8).await);

    let window_only = open(
        store,
        &Limits::new().with_window(window(2, secs(1), Duration::ZERO)),
    );
    assert_eq!(
        admit(store, &window_only, 3).await,
        Admission::CostTooLarge {
            capacity: 2,
            quota: QuotaName::SlidingWindow {
                limit: 2,
                window: secs(1),
            },
        }
    );
    admitted(admit(store, &window_only, 2).await);

    let unlimited = open(store, &Limits::new());
    admitted(admit(store, &unlimited, 1_000_000).await);
}

/// Cost 0 goes through full quotas but takes an in-flight slot; it charges no quota.
pub async fn cost_zero_passes_full_quotas_but_takes_a_lease<S: Store>(store: &S) {
    let limits = Limits::new()
        .with_max_in_flight(Some(2))
        .with_window(window(1, secs(10), Duration::ZERO))
        .with_bucket(Quota::per_hour(nz(1)));
    let scope = open(store, &limits);
    let a = admitted(admit(store, &scope, 1).await);
    // Both quotas are now full; cost 0 still goes, up to the in-flight cap.
    let b = admitted(admit(store, &scope, 0).await);
    assert_eq!(admit(store, &scope, 0).await, Admission::InFlightFull);
    store.release(&scope, b);
    let c = admitted(admit(store, &scope, 0).await);
    assert_eq!(admit(store, &scope, 0).await, Admission::InFlightFull);
    release_all(store, &scope, [a, c]);

    // Cost 0 charges nothing: a fresh scope is idle again as soon as its lease is released.
    let fresh = open(store, &limits.clone().with_max_in_flight(Some(1)));
    for _ in 0..5 {
        let lease = admitted(admit(store, &fresh, 0).await);
        assert!(!store.is_idle(&fresh), "a lease is held");
        store.release(&fresh, lease);
        assert!(store.is_idle(&fresh), "cost 0 charged a quota");
    }
    admitted(admit(store, &fresh, 1).await);
}

// ---------------------------------------------------------------------------------------------
// 4. All or nothing.

/// A window of 1 per second in front of a slow bucket (burst 5, one cell a minute): attempts
/// the window refuses take no cell, so the bucket still admits its whole burst, one a second.
pub async fn window_refusal_charges_no_bucket<S: Store>(store: &S) {
    let limits = Limits::new()
        .with_window(window(1, secs(1), Duration::ZERO))
        .with_bucket(Quota::per_hour(nz(60)).allow_burst(nz(5)));
    let scope = open(store, &limits);
    for second in 0..5 {
        admitted(admit(store, &scope, 1).await);
        for _ in 0..10 {
            assert_eq!(
                admit(store, &scope, 1).await,
                Admission::NotBefore(secs(1)),
                "second {second}"
            );
        }
        advance(secs(1)).await;
    }
    // Now 5 s: the window has room; the bucket's 6th cell comes 60 s after the first was taken.
    assert_eq!(
        admit(store, &scope, 1).await,
        Admission::NotBefore(secs(55))
    );
}

/// Attempts refused because every in-flight slot is leased charge neither a window nor a
/// bucket (each of capacity 2, so one charge would show).
pub async fn in_flight_refusal_charges_no_quota<S: Store>(store: &S) {
    let cases = [
        (
            Limits::new().with_window(window(2, secs(10), Duration::ZERO)),
            secs(10),
        ),
        // One cell a minute, burst 2: after two at once, the next cell is 60 s away.
        (
            Limits::new().with_bucket(Quota::per_hour(nz(60)).allow_burst(nz(2))),
            secs(60),
        ),
    ];
    for (limits, wait) in cases {
        let scope = open(store, &limits.clone().with_max_in_flight(Some(1)));
        let a = admitted(admit(store, &scope, 1).await);
        for _ in 0..5 {
            assert_eq!(
                admit(store, &scope, 1).await,
                Admission::InFlightFull,
                "{limits:?}"
            );
        }
        store.release(&scope, a);
        let b = admitted(admit(store, &scope, 1).await);
        store.release(&scope, b);
        assert_eq!(
            admit(store, &scope, 1).await,
            Admission::NotBefore(wait),
            "{limits:?}"
        );
    }
}

/// Attempts refused by the cooldown charge nothing: with an in-flight cap, a window and a
/// bucket all of capacity 1, the first attempt after the cooldown is admitted.
pub async fn cooldown_refusal_charges_nothing<S: Store>(store: &S) {
    let limits = Limits::new()
        .with_max_in_flight(Some(1))
        .with_window(window(1, secs(10), Duration::ZERO))
        .with_bucket(Quota::per_hour(nz(1)));
    let scope = open(store, &limits);
    close_cooldown(store, &scope, secs(5)).await;
    for _ in 0..5 {
        assert_eq!(
            admit(store, &scope, 1).await,
            Admission::CoolingDown(secs(5))
        );
    }
    advance(secs(5)).await;
    assert!(
        store.is_idle(&scope),
        "the refused attempts left something counted"
    );
    admitted(admit(store, &scope, 1).await);
}

/// Two buckets: an attempt the second one refuses takes no cell of the first (the trait's
/// "all or nothing: otherwise nothing changes").
///
/// A: one cell a minute, burst 3; B: 2 per second, burst 2. Cost 2 empties B and leaves A one
/// cell; a cost-1 attempt then waits on B. Once B has refilled, A must still have its cell:
/// cost 2 waits for A's next cell (59 s), cost 1 goes.
pub async fn refusal_by_a_later_bucket_charges_no_earlier_bucket<S: Store>(store: &S) {
    let limits = Limits::new()
        .with_bucket(Quota::per_hour(nz(60)).allow_burst(nz(3)))
        .with_bucket(Quota::per_second(nz(2)).allow_burst(nz(2)));
    let scope = open(store, &limits);
    admitted(admit(store, &scope, 2).await);
    assert_eq!(admit(store, &scope, 1).await, Admission::NotBefore(ms(500)));
    advance(secs(1)).await;
    // B is full again; A still has one cell, and its next one comes at 60 s.
    assert_eq!(
        admit(store, &scope, 2).await,
        Admission::NotBefore(secs(59))
    );
    admitted(admit(store, &scope, 1).await);
}

// ---------------------------------------------------------------------------------------------
// 5. Leases.

/// With an in-flight cap of 3: 3 leases (distinct ids), then `InFlightFull`; releasing one
/// admits exactly one more; many leases held at once have distinct ids.
pub async fn in_flight_cap_and_releases<S: Store>(store: &S) {
    let scope = open(store, &Limits::new().with_max_in_flight(Some(3)));
    let leases = admit_all(store, &scope, 1, 3).await;
    assert_eq!(leases.iter().collect::<HashSet<_>>().len(), 3, "{leases:?}");
    assert_eq!(admit(store, &scope, 1).await, Admission::InFlightFull);
    assert_eq!(admit(store, &scope, 1).await, Admission::InFlightFull);
    store.release(&scope, leases[1]);
    let d = admitted(admit(store, &scope, 1).await);
    assert_eq!(admit(store, &scope, 1).await, Admission::InFlightFull);
    let held = [leases[0], leases[2], d];
    assert_eq!(held.iter().collect::<HashSet<_>>().len(), 3, "{held:?}");
    release_all(store, &scope, held);
    let again = admit_all(store, &scope, 1, 3).await;
    assert_eq!(admit(store, &scope, 1).await, Admission::InFlightFull);
    release_all(store, &scope, again);

    let many = open(store, &Limits::new().with_max_in_flight(Some(100)));
    let mut held = admit_all(store, &many, 0, 60).await;
    // Release every other one and take 40 more: 70 held, all distinct.
    let kept: Vec<_> = held.iter().copied().step_by(2).collect();
    release_all(store, &many, held.iter().copied().skip(1).step_by(2));
    held = kept;
    held.extend(admit_all(store, &many, 0, 40).await);
    assert_eq!(held.iter().collect::<HashSet<_>>().len(), 70);
    assert_eq!(admit_all(store, &many, 0, 30).await.len(), 30);
    assert_eq!(admit(store, &many, 0).await, Admission::InFlightFull);
}

/// Releasing every lease leaves the scope idle once its window has let the sends go.
pub async fn idle_after_releasing_every_lease_once_quotas_refill<S: Store>(store: &S) {
    let limits = Limits::new()
        .with_max_in_flight(Some(2))
        .with_window(window(10, secs(1), Duration::ZERO));
    let scope = open(store, &limits);
    let leases = admit_all(store, &scope, 1, 2).await;
    store.release(&scope, leases[0]);
    assert!(!store.is_idle(&scope), "a lease is still held");
    store.release(&scope, leases[1]);
    assert!(!store.is_idle(&scope), "the window still counts two sends");
    advance(ms(999)).await;
    assert!(
        !store.is_idle(&scope),
        "the window still counts two sends at 999 ms"
    );
    advance(ms(1)).await;
    assert!(
        store.is_idle(&scope),
        "every lease released and the window empty"
    );
}

// ---------------------------------------------------------------------------------------------
// 6. Cooldown.

/// `close_cooldown(d)` refuses for exactly d; a shorter close later does not shorten it, a
/// longer one lengthens it; then admission resumes.
pub async fn cooldown_closes_and_only_lengthens<S: Store>(store: &S) {
    let scope = open(store, &Limits::new());
    close_cooldown(store, &scope, Duration::ZERO).await;
    let lease = admitted(admit(store, &scope, 1).await);
    store.release(&scope, lease);

    close_cooldown(store, &scope, secs(5)).await;
    assert_eq!(
        admit(store, &scope, 1).await,
        Admission::CoolingDown(secs(5))
    );
    advance(secs(1)).await;
    assert_eq!(
        admit(store, &scope, 1).await,
        Admission::CoolingDown(secs(4))
    );
    close_cooldown(store, &scope, secs(2)).await;
    assert_eq!(
        admit(store, &scope, 1).await,
        Admission::CoolingDown(secs(4))
    );
    close_cooldown(store, &scope, secs(4)).await;
    assert_eq!(
        admit(store, &scope, 1).await,
        Admission::CoolingDown(secs(4))
    );
    close_cooldown(store, &scope, secs(6)).await;
    assert_eq!(
        admit(store, &scope, 1).await,
        Admission::CoolingDown(secs(6))
    );
    advance(secs(6) - ms(1)).await;
    assert_eq!(admit(store, &scope, 1).await, Admission::CoolingDown(ms(1)));
    advance(ms(1)).await;
    let lease = admitted(admit(store, &scope, 1).await);
    store.release(&scope, lease);
    assert!(store.is_idle(&scope));
}

/// A cooldown of `Duration::MAX` neither panics nor wraps: it answers a wait of at least a
/// year (a store may cap it).
pub async fn cooldown_of_duration_max_does_not_overflow<S: Store>(store: &S) {
    const YEAR: Duration = Duration::from_secs(365 * 24 * 60 * 60);
    let scope = open(store, &Limits::new());
    close_cooldown(store, &scope, Duration::MAX).await;
    let answer = admit(store, &scope, 1).await;
    let Admission::CoolingDown(wait) = answer else {
        panic!("expected CoolingDown, got {answer:?}");
    };
    assert!(
        wait >= YEAR,
        "a cooldown of Duration::MAX answered {wait:?}"
    );
    assert!(!store.is_idle(&scope));
    advance(secs(3600)).await;
    close_cooldown(store, &scope, secs(1)).await;
    let answer = admit(store, &scope, 1).await;
    let Admission::CoolingDown(later) = answer else {
        panic!("expected CoolingDown, got {answer:?}");
    };
    assert!(
        later >= YEAR,
        "a shorter close shortened the cooldown to {later:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 7. set_limits.

/// A larger window limit or in-flight cap admits at once; removing the cap admits.
pub async fn set_limits_growing_admits_at_once<S: Store>(store: &S) {
    let w = |limit| Limits::new().with_window(window(limit, secs(10), Duration::ZERO));
    let scope = open(store, &w(2));
    admit_all(store, &scope, 1, 2).await;
    assert_eq!(
        admit(store, &scope, 1).await,
        Admission::NotBefore(secs(10))
    );
    set_limits(store, &scope, &w(4)).await;
    admit_all(store, &scope, 1, 2).await;
    assert_eq!(
        admit(store, &scope, 1).await,
        Admission::NotBefore(secs(10))
    );

    let cap = |n| Limits::new().with_max_in_flight(n);
    let scope = open(store, &cap(Some(1)));
    let mut held = admit_all(store, &scope, 1, 1).await;
    assert_eq!(admit(store, &scope, 1).await, Admission::InFlightFull);
    set_limits(store, &scope, &cap(Some(3))).await;
    held.extend(admit_all(store, &scope, 1, 2).await);
    assert_eq!(admit(store, &scope, 1).await, Admission::InFlightFull);
    set_limits(store, &scope, &cap(None)).await;
    held.extend(admit_all(store, &scope, 1, 5).await);
    assert_eq!(held.iter().collect::<HashSet<_>>().len(), 8);
}

/// A smaller in-flight cap revokes no lease: it admits nothing until fewer than the new cap
/// are held.
pub async fn set_limits_shrinking_the_in_flight_cap_keeps_leases<S: Store>(store: &S) {
    let scope = open(store, &Limits::new().with_max_in_flight(Some(3)));
    let leases = admit_all(store, &scope, 1, 3).await;
    set_limits(store, &scope, &Limits::new().with_max_in_flight(Some(1))).await;
    assert_eq!(admit(store, &scope, 1).await, Admission::InFlightFull);
    store.release(&scope, leases[0]);
    assert_eq!(
        admit(store, &scope, 1).await,
        Admission::InFlightFull,
        "2 held, cap 1"
    );
    store.release(&scope, leases[1]);
    assert_eq!(
        admit(store, &scope, 1).await,
        Admission::InFlightFull,
        "1 held, cap 1"
    );
    assert!(!store.is_idle(&scope));
    store.release(&scope, leases[2]);
    let d = admitted(admit(store, &scope, 1).await);
    assert_eq!(admit(store, &scope, 1).await, Admission::InFlightFull);
    store.release(&scope, d);
    assert!(store.is_idle(&scope));
}

/// Sends counted stay counted: under a smaller limit until enough leave, and under a longer
/// window for the new length.
pub async fn set_limits_shrinking_a_window_keeps_its_sends<S: Store>(store: &S) {
    let w = |limit, len| Limits::new().with_window(window(limit, len, Duration::ZERO));
    let scope = open(store, &w(4, secs(10)));
    admit_all(store, &scope, 1, 3).await;
    set_limits(store, &scope, &w(2, secs(10))).await;
    assert_eq!(
        admit(store, &scope, 1).await,
        Admission::NotBefore(secs(10))
    );
    advance(secs(10)).await;
    admit_all(store, &scope, 1, 2).await;
    assert_eq!(
        admit(store, &scope, 1).await,
        Admission::NotBefore(secs(10))
    );

    // Sends at 0 s and 4 s, 3 per 10 s; stretched to 20 s, the one at 0 s counts until 20 s.
    let scope = open(store, &w(3, secs(10)));
    admitted(admit(store, &scope, 1).await);
    advance(secs(4)).await;
    admitted(admit(store, &scope, 1).await);
    set_limits(store, &scope, &w(2, secs(20))).await;
    advance(secs(8)).await;
    // 12 s: both still counted under the 20 s window.
    assert_eq!(admit(store, &scope, 1).await, Admission::NotBefore(secs(8)));
    advance(secs(8)).await;
    admitted(admit(store, &scope, 1).await);
    assert_eq!(admit(store, &scope, 1).await, Admission::NotBefore(secs(4)));
}

/// A cost above the new capacity answers `CostTooLarge` with it and its quota.
pub async fn set_limits_cost_above_the_new_capacity_is_too_large<S: Store>(store: &S) {
    let scope = open(
        store,
        &Limits::new().with_window(window(5, secs(1), Duration::ZERO)),
    );
    admitted(admit(store, &scope, 3).await);
    advance(secs(1)).await;
    set_limits(
        store,
        &scope,
        &Limits::new().with_window(window(2, secs(1), Duration::ZERO)),
    )
    .await;
    assert_eq!(
        admit(store, &scope, 3).await,
        Admission::CostTooLarge {
            capacity: 2,
            quota: QuotaName::SlidingWindow {
                limit: 2,
                window: secs(1),
            },
        }
    );
    let with_bucket = Limits::new()
        .with_window(window(2, secs(1), Duration::ZERO))
        .with_bucket(Quota::per_second(nz(1)));
    set_limits(store, &scope, &with_bucket).await;
    assert_eq!(
        admit(store, &scope, 2).await,
        Admission::CostTooLarge {
            capacity: 1,
            quota: QuotaName::TokenBucket {
                burst: 1,
                replenish: secs(1),
            },
        }
    );
    set_limits(store, &scope, &Limits::new()).await;
    admitted(admit(store, &scope, 3).await);
}

// ---------------------------------------------------------------------------------------------
// 8. is_idle.

/// Idle when fresh; not while a lease is held, the cooldown is closed, a send is counted in a
/// window or a bucket is short of cells; idle again once each is over.
pub async fn is_idle_tracks_leases_cooldown_and_quotas<S: Store>(store: &S) {
    let scope = open(store, &Limits::new().with_max_in_flight(Some(4)));
    assert!(store.is_idle(&scope), "fresh");
    let lease = admitted(admit(store, &scope, 1).await);
    assert!(!store.is_idle(&scope), "lease held");
    store.release(&scope, lease);
    assert!(store.is_idle(&scope), "lease released");
    close_cooldown(store, &scope, secs(2)).await;
    assert!(!store.is_idle(&scope), "cooldown closed");
    advance(secs(2) - ms(1)).await;
    assert!(!store.is_idle(&scope), "cooldown closed for 1 ms more");
    advance(ms(1)).await;
    assert!(store.is_idle(&scope), "cooldown over");

    let scope = open(
        store,
        &Limits::new().with_window(window(5, secs(1), ms(500))),
    );
    assert!(store.is_idle(&scope), "fresh window");
    let lease = admitted(admit(store, &scope, 1).await);
    store.release(&scope, lease);
    assert!(!store.is_idle(&scope), "a send in the window");
    advance(ms(1_499)).await;
    assert!(!store.is_idle(&scope), "a send in the window + guard");
    advance(ms(1)).await;
    assert!(store.is_idle(&scope), "the send has left");

    let scope = open(store, &Limits::new().with_bucket(Quota::per_second(nz(2))));
    assert!(store.is_idle(&scope), "fresh bucket");
    let lease = admitted(admit(store, &scope, 1).await);
    store.release(&scope, lease);
    assert!(!store.is_idle(&scope), "a cell taken");
    advance(ms(499)).await;
    assert!(!store.is_idle(&scope), "a cell short for 1 ms more");
    advance(secs(2)).await;
    assert!(store.is_idle(&scope), "the bucket is full again");
}

/// An attempt that waits on a second bucket and is then abandoned (its caller gave up) leaves
/// nothing behind: once every quota has refilled, the scope is idle (else it is never forgotten).
pub async fn idle_again_after_an_attempt_refused_by_a_later_bucket<S: Store>(store: &S) {
    let limits = Limits::new()
        .with_bucket(Quota::per_second(nz(10)))
        .with_bucket(Quota::per_second(nz(1)));
    let scope = open(store, &limits);
    let lease = admitted(admit(store, &scope, 1).await);
    assert_eq!(admit(store, &scope, 1).await, Admission::NotBefore(secs(1)));
    store.release(&scope, lease);
    advance(secs(3600)).await;
    assert!(
        store.is_idle(&scope),
        "an hour later, every bucket is full and nothing is held"
    );
}

// ---------------------------------------------------------------------------------------------
// 9. Scopes.

/// Two scopes of one store count separately: an in-flight slot, a window, a bucket and a
/// cooldown full or closed in one leave the other fresh.
pub async fn scopes_are_independent<S: Store>(store: &S) {
    let cases = [
        (
            Limits::new().with_max_in_flight(Some(1)),
            Admission::InFlightFull,
        ),
        (
            Limits::new().with_window(window(1, secs(10), Duration::ZERO)),
            Admission::NotBefore(secs(10)),
        ),
        (
            Limits::new().with_bucket(Quota::per_hour(nz(1))),
            Admission::NotBefore(secs(3600)),
        ),
    ];
    for (limits, full) in cases {
        let a = open(store, &limits);
        let b = open(store, &limits);
        let lease_a = admitted(admit(store, &a, 1).await);
        assert_eq!(admit(store, &a, 1).await, full, "{limits:?}");
        assert!(store.is_idle(&b), "{limits:?}: b is fresh");
        let lease_b = admitted(admit(store, &b, 1).await);
        assert_eq!(admit(store, &b, 1).await, full, "{limits:?}");
        // Releasing in b frees nothing in a.
        store.release(&b, lease_b);
        if limits.max_in_flight.is_some() {
            assert_eq!(admit(store, &a, 1).await, full, "{limits:?}");
            assert!(store.is_idle(&b));
        }
        store.release(&a, lease_a);
    }
    let a = open(store, &Limits::new());
    let b = open(store, &Limits::new());
    close_cooldown(store, &a, secs(5)).await;
    assert!(store.is_idle(&b));
    let lease = admitted(admit(store, &b, 1).await);
    store.release(&b, lease);
    assert_eq!(admit(store, &a, 1).await, Admission::CoolingDown(secs(5)));
}

// ---------------------------------------------------------------------------------------------
// Cancellation.

/// An admit future dropped before it is polled has charged and leased nothing (the trait's
/// cancel safety; a store that takes back a lease on expiry would pass only after it).
pub async fn admit_future_dropped_unpolled_charges_nothing<S: Store>(store: &S) {
    let limits = Limits::new()
        .with_max_in_flight(Some(1))
        .with_window(window(1, secs(10), Duration::ZERO))
        .with_bucket(Quota::per_hour(nz(1)));
    let scope = open(store, &limits);
    drop(store.admit(&scope, 1));
    assert!(
        store.is_idle(&scope),
        "a dropped, never polled admit left state behind"
    );
    let lease = admitted(admit(store, &scope, 1).await);
    store.release(&scope, lease);
}

// ---------------------------------------------------------------------------------------------
// 10. Settling a charge with the true figure (`Store::settle`).

async fn settle<S: Store>(store: &S, scope: &S::Scope, lease: LeaseId, settlement: Settlement) {
    store
        .settle(scope, lease, settlement)
        .await
        .unwrap_or_else(|e| panic!("settle({lease:?}, {settlement:?}) failed: {e}"));
}

/// A token window of `limit` per 10 s, no guard.
fn tokens(limit: u32) -> WindowQuota {
    window(limit, secs(10), Duration::ZERO).with_unit(Unit::Tokens)
}

/// An estimate of 6 settled at 2 gives 4 back, at its send's place; a refund never takes more
/// than the send's own charge, even from sends made at the same instant.
pub async fn settle_refunds_at_the_send_and_never_more_than_its_charge<S: Store>(store: &S) {
    for unit in [Unit::Tokens, Unit::Cost] {
        let scope = open(
            store,
            &Limits::new().with_window(window(10, secs(10), Duration::ZERO).with_unit(unit)),
        );
        let a = admitted(admit(store, &scope, 6).await);
        advance(secs(2)).await;
        admitted(admit(store, &scope, 3).await);
        settle(store, &scope, a, Settlement::actual(2)).await;
        // 2 + 3 counted: 5 more fit, 6 do not.
        assert_eq!(
            admit(store, &scope, 6).await,
            Admission::NotBefore(secs(8)),
            "{unit:?}"
        );
        admitted(admit(store, &scope, 5).await);
        // The 2 left of the first send leave with it, at 10 s.
        assert_eq!(admit(store, &scope, 1).await, Admission::NotBefore(secs(8)));
        advance(secs(8)).await;
        admitted(admit(store, &scope, 2).await);
        assert_eq!(admit(store, &scope, 1).await, Admission::NotBefore(secs(2)));
    }
    // Two sends of 4 at one instant: settling one at 0 gives back 4, not 8.
    let scope = open(store, &Limits::new().with_window(tokens(10)));
    let c = admitted(admit(store, &scope, 4).await);
    admitted(admit(store, &scope, 4).await);
    settle(store, &scope, c, Settlement::actual(0)).await;
    assert_eq!(
        admit(store, &scope, 7).await,
        Admission::NotBefore(secs(10))
    );
    admitted(admit(store, &scope, 6).await);
    assert_eq!(
        admit(store, &scope, 1).await,
        Admission::NotBefore(secs(10))
    );
}

/// An estimate of 2 settled at 100 takes the window to its limit and no further; the extra
/// units sit at the send's place and leave with it.
pub async fn settle_charges_more_at_the_send_never_past_the_limit<S: Store>(store: &S) {
    let scope = open(store, &Limits::new().with_window(tokens(10)));
    let a = admitted(admit(store, &scope, 2).await);
    advance(secs(1)).await;
    admitted(admit(store, &scope, 2).await);
    settle(store, &scope, a, Settlement::actual(100)).await;
    // Full: the first send now holds 8, and leaves at 10 s.
    assert_eq!(admit(store, &scope, 1).await, Admission::NotBefore(secs(9)));
    advance(secs(9)).await;
    // Had the window counted past its limit, more than 8 would still be held.
    admitted(admit(store, &scope, 8).await);
    assert_eq!(admit(store, &scope, 1).await, Admission::NotBefore(secs(1)));
}

/// A send that has left its window is neither refunded (a later send's units stay counted)
/// nor charged more.
pub async fn settle_after_the_send_left_the_window_changes_nothing<S: Store>(store: &S) {
    let scope = open(store, &Limits::new().with_window(tokens(10)));
    let a = admitted(admit(store, &scope, 6).await);
    let b = admitted(admit(store, &scope, 1).await);
    advance(secs(10)).await;
    admitted(admit(store, &scope, 10).await);
    settle(store, &scope, a, Settlement::actual(0)).await;
    assert_eq!(
        admit(store, &scope, 1).await,
        Admission::NotBefore(secs(10))
    );
    advance(secs(10)).await;
    settle(store, &scope, b, Settlement::actual(10)).await;
    admitted(admit(store, &scope, 10).await);
}

/// A token bucket (10 per second, burst 10) is charged more when the true cost is larger, up
/// to empty and never past it, and never refunded when it is smaller.
pub async fn settle_a_token_bucket_is_only_charged_more_never_past_empty<S: Store>(store: &S) {
    let limits = Limits::new().with_bucket(Quota::per_second(nz(10)));
    let scope = open(store, &limits);
    let a = admitted(admit(store, &scope, 5).await);
    settle(store, &scope, a, Settlement::actual(1)).await;
    // No refund: 5 cells left, not 9.
    assert_eq!(admit(store, &scope, 6).await, Admission::NotBefore(ms(100)));
    admitted(admit(store, &scope, 5).await);

    let scope = open(store, &limits);
    let b = admitted(admit(store, &scope, 2).await);
    settle(store, &scope, b, Settlement::actual(7)).await;
    // 5 more taken: 3 left.
    assert_eq!(admit(store, &scope, 4).await, Admission::NotBefore(ms(100)));
    admitted(admit(store, &scope, 3).await);

    let scope = open(store, &limits);
    let c = admitted(admit(store, &scope, 10).await);
    settle(store, &scope, c, Settlement::actual(50)).await;
    // Empty, not in debt: one cell comes back in one interval.
    assert_eq!(admit(store, &scope, 1).await, Admission::NotBefore(ms(100)));
    advance(ms(100)).await;
    admitted(admit(store, &scope, 1).await);
}

/// A charge is settled once (again, or with a clone's lease, nothing changes), also after its
/// lease was released; a lease the store does not know changes nothing.
pub async fn settle_counts_once_even_after_release<S: Store>(store: &S) {
    let scope = open(
        store,
        &Limits::new()
            .with_max_in_flight(Some(4))
            .with_window(tokens(10)),
    );
    let a = admitted(admit(store, &scope, 6).await);
    store.release(&scope, a);
    settle(store, &scope, a, Settlement::actual(2)).await;
    settle(store, &scope, a, Settlement::actual(0)).await;
    settle(store, &scope, a, Settlement::actual(100)).await;
    assert_eq!(
        admit(store, &scope, 9).await,
        Admission::NotBefore(secs(10))
    );
    let b = admitted(admit(store, &scope, 8).await);
    settle(store, &scope, LeaseId(u64::MAX - 7), Settlement::actual(0)).await;
    assert_eq!(
        admit(store, &scope, 1).await,
        Admission::NotBefore(secs(10))
    );
    store.release(&scope, b);
}

/// Tokens remaining reported by the server lower a token window's own remainder to it (at the
/// send's place); a larger report changes nothing; windows of other units are not touched.
pub async fn settle_tokens_remaining_lowers_only_token_windows<S: Store>(store: &S) {
    let scope = open(store, &Limits::new().with_window(tokens(100)));
    let a = admitted(admit(store, &scope, 10).await);
    settle(store, &scope, a, Settlement::tokens_remaining(1_000)).await;
    settle(store, &scope, a, Settlement::tokens_remaining(90)).await;
    admitted(admit(store, &scope, 5).await);
    settle(store, &scope, a, Settlement::tokens_remaining(50)).await;
    // 85 left locally, 50 by the server: 50 it is.
    assert_eq!(
        admit(store, &scope, 51).await,
        Admission::NotBefore(secs(10))
    );
    admitted(admit(store, &scope, 50).await);
    // The report does not settle the charge: its true cost still may.
    settle(store, &scope, a, Settlement::actual(0)).await;
    admitted(admit(store, &scope, 10).await);

    let cost = open(
        store,
        &Limits::new().with_window(window(100, secs(10), Duration::ZERO)),
    );
    let b = admitted(admit(store, &cost, 10).await);
    settle(store, &cost, b, Settlement::tokens_remaining(0)).await;
    admitted(admit(store, &cost, 90).await);
}

/// A report of tokens remaining for a lease the store does not know counts at the present
/// time.
pub async fn settle_tokens_remaining_of_an_unknown_lease_counts_now<S: Store>(store: &S) {
    let scope = open(store, &Limits::new().with_window(tokens(100)));
    advance(secs(5)).await;
    settle(
        store,
        &scope,
        LeaseId(u64::MAX - 7),
        Settlement::tokens_remaining(30),
    )
    .await;
    assert_eq!(
        admit(store, &scope, 31).await,
        Admission::NotBefore(secs(10))
    );
    admitted(admit(store, &scope, 30).await);
}

/// A window in `Unit::Requests` takes 1 per request whatever its cost (0 for cost 0), and a
/// cost never exceeds it.
pub async fn requests_window_counts_one_per_request_whatever_the_cost<S: Store>(store: &S) {
    let requests = window(2, secs(10), Duration::ZERO).with_unit(Unit::Requests);
    let scope = open(
        store,
        &Limits::new().with_window(requests).with_window(tokens(100)),
    );
    let a = admitted(admit(store, &scope, 50).await);
    admitted(admit(store, &scope, 0).await);
    admitted(admit(store, &scope, 30).await);
    assert_eq!(
        admit(store, &scope, 1).await,
        Admission::NotBefore(secs(10))
    );
    // The token window is the smallest quota a cost can exceed.
    assert_eq!(
        admit(store, &scope, 101).await,
        Admission::CostTooLarge {
            capacity: 100,
            quota: QuotaName::SlidingWindow {
                limit: 100,
                window: secs(10),
            },
        }
    );
    // Settling touches the token window only: the request count stays.
    settle(store, &scope, a, Settlement::actual(0)).await;
    assert_eq!(
        admit(store, &scope, 1).await,
        Admission::NotBefore(secs(10))
    );
}

// ---------------------------------------------------------------------------------------------
// 11. Properties: random operations checked against a model after every step.

/// The properties' window and guard: each send counted for 1.1 s.
pub const PROP_WINDOW: Duration = ms(1_000);
/// See [`PROP_WINDOW`].
pub const PROP_GUARD: Duration = ms(100);
const PROP_SPAN: Duration = ms(1_100);
/// The window limit of [`prop_in_flight_cap_resized_window_fixed`].
pub const PROP_FIXED_LIMIT: u32 = 4;

fn prop_limits(cap: usize, limit: u32) -> Limits {
    Limits::new()
        .with_max_in_flight(Some(cap))
        .with_window(window(limit, PROP_WINDOW, PROP_GUARD))
}

/// One step of a property case.
#[derive(Debug, Clone)]
pub enum Op {
    /// `admit(cost)`, awaited.
    Admit(u32),
    /// Releases a held lease (chosen by the index), if any.
    Release(Index),
    /// Advances time by this many milliseconds.
    Advance(u64),
    /// `set_limits` with this in-flight cap and window limit.
    SetLimits { cap: usize, limit: u32 },
    /// `close_cooldown` for this many milliseconds.
    CloseCooldown(u64),
    /// `admit(cost)` polled once, then dropped (its answer counts if it was ready).
    PollOnceThenDrop(u32),
    /// `admit(cost)` dropped before it is polled.
    DropUnpolled(u32),
}

/// A property case: the initial in-flight cap and window limit, then the steps.
#[derive(Debug, Clone)]
pub struct Case {
    /// Initial in-flight cap.
    pub cap: usize,
    /// Initial window limit.
    pub limit: u32,
    /// The steps.
    pub ops: Vec<Op>,
}

/// Cases whose window limit is fixed (`resize_window` false) or random and resized, with or
/// without admit futures dropped unpolled.
pub fn cases(resize_window: bool, unpolled: bool) -> impl Strategy<Value = Case> {
    let limit = move || -> BoxedStrategy<u32> {
        if resize_window {
            (1u32..=5).boxed()
        } else {
            Just(PROP_FIXED_LIMIT).boxed()
        }
    };
    let mut ops: Vec<(u32, BoxedStrategy<Op>)> = vec![
        (6, (0u32..=3).prop_map(Op::Admit).boxed()),
        (3, any::<Index>().prop_map(Op::Release).boxed()),
        (4, (0u64..=600).prop_map(Op::Advance).boxed()),
        (
            1,
            (1usize..=4, limit())
                .prop_map(|(cap, limit)| Op::SetLimits { cap, limit })
                .boxed(),
        ),
        (1, (0u64..=1_500).prop_map(Op::CloseCooldown).boxed()),
        (1, (0u32..=3).prop_map(Op::PollOnceThenDrop).boxed()),
    ];
    if unpolled {
        ops.push((2, (0u32..=3).prop_map(Op::DropUnpolled).boxed()));
    }
    (
        1usize..=4,
        limit(),
        prop::collection::vec(Union::new_weighted(ops), 1..60),
    )
        .prop_map(|(cap, limit, ops)| Case { cap, limit, ops })
}

/// Runs `property` on 64 cases of `strategy`, each in its own paused current-thread runtime
/// with a store from `make`. Failures persist as proptest does by default.
pub fn run_property<S, F, Fut>(name: &str, strategy: impl Strategy<Value = Case>, make: F)
where
    S: Store,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    let config = ProptestConfig {
        cases: 64,
        source_file: Some(file!()),
        ..ProptestConfig::default()
    };
    let mut runner = TestRunner::new(config);
    let result = runner.run(&strategy, |case| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a tokio runtime");
        rt.block_on(async {
            let store = make().await;
            run_case(&store, &case).await;
        });
        Ok(())
    });
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
}

/// In-flight cap resized at random, window limit fixed at [`PROP_FIXED_LIMIT`].
pub fn prop_in_flight_cap_resized_window_fixed<S, F, Fut>(make: F)
where
    S: Store,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    run_property("in-flight cap resized", cases(false, false), make);
}

/// Window limit and in-flight cap both resized at random.
pub fn prop_window_limit_and_in_flight_cap_resized<S, F, Fut>(make: F)
where
    S: Store,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    run_property("window and cap resized", cases(true, false), make);
}

/// As [`prop_window_limit_and_in_flight_cap_resized`], with admit futures dropped unpolled.
pub fn prop_admit_futures_dropped_unpolled<S, F, Fut>(make: F)
where
    S: Store,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    run_property("admit futures dropped unpolled", cases(true, true), make);
}

/// What the test knows of the scope: leases it holds, sends admitted, limits in force.
#[derive(Debug)]
struct Model {
    cap: usize,
    limit: u32,
    held: Vec<LeaseId>,
    /// Admitted sends of cost > 0: (when, units), oldest first.
    sends: Vec<(Instant, u32)>,
    cooldown_until: Option<Instant>,
    /// Whether the model knows everything the store counts, so its answers are predictable.
    /// False once a pending admit future was dropped (the store may then hold a lease or
    /// units until it takes them back).
    exact: bool,
}

impl Model {
    /// Units counted in the window at `now`.
    fn used(&self, now: Instant) -> u32 {
        self.sends
            .iter()
            .filter(|&&(at, _)| at + PROP_SPAN > now)
            .map(|&(_, units)| units)
            .sum()
    }

    fn cooldown(&self, now: Instant) -> Option<Duration> {
        self.cooldown_until.filter(|&u| u > now).map(|u| u - now)
    }

    /// How long until `cost` fits in the window, if it does not now (cost within the limit).
    fn window_wait(&self, cost: u32, now: Instant) -> Option<Duration> {
        let over = (self.used(now) + cost)
            .checked_sub(self.limit)
            .filter(|&o| o > 0)?;
        let mut freed = 0;
        for &(at, units) in self.sends.iter().filter(|&&(at, _)| at + PROP_SPAN > now) {
            freed += units;
            if freed >= over {
                return Some(at + PROP_SPAN - now);
            }
        }
        unreachable!("cost {cost} within limit {} frees enough", self.limit)
    }

    /// Every refusal a conforming store may answer for `cost` now (the order in which a store
    /// checks is its own); empty when it must admit.
    fn refusals(&self, cost: u32, now: Instant) -> Vec<Admission> {
        let mut refusals = Vec::new();
        let too_large = cost > self.limit;
        if too_large {
            refusals.push(Admission::CostTooLarge {
                capacity: self.limit,
                quota: QuotaName::SlidingWindow {
                    limit: self.limit,
                    window: PROP_WINDOW,
                },
            });
        }
        let cooldown = self.cooldown(now);
        if let Some(cd) = cooldown {
            refusals.push(Admission::CoolingDown(cd));
        }
        if self.held.len() >= self.cap {
            refusals.push(Admission::InFlightFull);
        }
        if !too_large && cost > 0 {
            if let Some(w) = self.window_wait(cost, now) {
                refusals.push(Admission::NotBefore(w));
            }
        }
        refusals
    }

    /// Checks the store's `answer` to `admit(cost)` and takes it into the model.
    fn answer(&mut self, cost: u32, answer: Admission, now: Instant) {
        let refusals = self.refusals(cost, now);
        match answer {
            Admission::Admitted(lease) => {
                assert!(
                    !self.held.contains(&lease),
                    "lease id {lease:?} handed out twice while held"
                );
                self.held.push(lease);
                assert!(
                    self.held.len() <= self.cap,
                    "admitted with {} leases held, cap {}",
                    self.held.len() - 1,
                    self.cap
                );
                // Each send of units fits, with those still counted, in the limit in force
                // when it is admitted (sends counted before a shrink may exceed the new limit
                // until they leave; cost 0 counts nothing).
                if cost > 0 {
                    self.sends.push((now, cost));
                    let used = self.used(now);
                    assert!(
                        used <= self.limit,
                        "{used} units in one window + guard, limit {}",
                        self.limit
                    );
                }
                if self.exact {
                    assert_eq!(
                        refusals,
                        vec![],
                        "admitted cost {cost}, but it had to be refused"
                    );
                }
            }
            refused => {
                if let Admission::NotBefore(d) = refused {
                    assert!(
                        d > Duration::ZERO && d <= PROP_SPAN,
                        "NotBefore({d:?}) outside (0, {PROP_SPAN:?}]"
                    );
                }
                if let Admission::CoolingDown(d) = refused {
                    let bound = self.cooldown(now).unwrap_or_default();
                    assert!(
                        d > Duration::ZERO && d <= bound,
                        "CoolingDown({d:?}) outside (0, {bound:?}]"
                    );
                }
                if self.exact {
                    assert!(
                        refusals.contains(&refused),
                        "answered {refused:?} to cost {cost}; expected {}",
                        if refusals.is_empty() {
                            "Admitted".to_owned()
                        } else {
                            format!("one of {refusals:?}")
                        }
                    );
                }
            }
        }
    }

    fn idle(&self, now: Instant) -> bool {
        self.held.is_empty() && self.cooldown(now).is_none() && self.used(now) == 0
    }
}

/// Plays `case` against `store`, checking every answer (and `is_idle`) against the model.
pub async fn run_case<S: Store>(store: &S, case: &Case) {
    let scope = open(store, &prop_limits(case.cap, case.limit));
    let mut model = Model {
        cap: case.cap,
        limit: case.limit,
        held: Vec::new(),
        sends: Vec::new(),
        cooldown_until: None,
        exact: true,
    };
    let t0 = Instant::now();
    for (step, op) in case.ops.iter().enumerate() {
        let now = Instant::now();
        let outcome = std::panic::AssertUnwindSafe(async {
            match *op {
                Op::Admit(cost) => {
                    let answer = admit(store, &scope, cost).await;
                    model.answer(cost, answer, now);
                }
                Op::Release(index) => {
                    if !model.held.is_empty() {
                        let lease = model.held.remove(index.index(model.held.len()));
                        store.release(&scope, lease);
                    }
                }
                Op::Advance(n) => advance(ms(n)).await,
                Op::SetLimits { cap, limit } => {
                    set_limits(store, &scope, &prop_limits(cap, limit)).await;
                    model.cap = cap;
                    model.limit = limit;
                }
                Op::CloseCooldown(n) => {
                    close_cooldown(store, &scope, ms(n)).await;
                    let until = now + ms(n);
                    model.cooldown_until = model.cooldown_until.max(Some(until));
                }
                Op::PollOnceThenDrop(cost) => {
                    let polled = {
                        let mut fut = pin!(store.admit(&scope, cost));
                        futures::poll!(fut.as_mut())
                    };
                    match polled {
                        Poll::Ready(answer) => {
                            let answer = answer.unwrap_or_else(|e| panic!("admit failed: {e}"));
                            model.answer(cost, answer, now);
                        }
                        Poll::Pending => model.exact = false,
                    }
                }
                Op::DropUnpolled(cost) => drop(store.admit(&scope, cost)),
            }
            if model.exact {
                let now = Instant::now();
                assert_eq!(store.is_idle(&scope), model.idle(now), "is_idle");
            }
        });
        if let Err(panic) = futures::FutureExt::catch_unwind(outcome).await {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            panic!(
                "step {step} ({op:?}) at {:?}: {message}\nmodel: {model:?}",
                now - t0
            );
        }
    }
    release_all(store, &scope, model.held);
}

// ---------------------------------------------------------------------------------------------
// 12. Settling against a model of one token window: admissions, settlements with a true cost,
// reports of tokens remaining and time, every answer compared exactly.

/// The token window of the settle property: 20 units per second, no guard.
const SETTLE_LIMIT: u32 = 20;
const SETTLE_SPAN: Duration = ms(1_000);

/// One step of a settle case.
#[derive(Debug, Clone)]
pub enum SettleOp {
    /// Admit a request of this cost (released at once: no in-flight cap).
    Admit(u32),
    /// Settle the charge of an admitted request (chosen by index) with this true cost.
    Settle(Index, u32),
    /// The server reports this many tokens remaining after an admitted request's answer.
    Remaining(Index, u64),
    /// Let this many milliseconds pass.
    Advance(u64),
}

/// A model of the token window by the rules of `Store::settle`: a log of (instant, units)
/// entries, one per instant, and the charges of the admissions.
#[derive(Debug, Default)]
struct WindowModel {
    log: Vec<(Instant, u32)>,
    /// (lease, sent at, estimate, settled).
    charges: Vec<(LeaseId, Instant, u32, bool)>,
}

impl WindowModel {
    fn expire(&mut self, now: Instant) {
        self.log.retain(|&(at, _)| at + SETTLE_SPAN > now);
    }

    fn used(&mut self, now: Instant) -> u32 {
        self.expire(now);
        self.log.iter().map(|e| e.1).sum()
    }

    /// Adds `units` at `at` (cut to the room left), when `at` is still counted.
    fn add_at(&mut self, at: Instant, units: u32, now: Instant) {
        let units = units.min(SETTLE_LIMIT - self.used(now));
        if units == 0 || at + SETTLE_SPAN <= now {
            return;
        }
        match self.log.iter_mut().find(|e| e.0 == at) {
            Some(entry) => entry.1 += units,
            None => {
                self.log.push((at, units));
                self.log.sort_by_key(|e| e.0);
            }
        }
    }

    fn admit(&mut self, cost: u32, now: Instant) -> Result<(), Duration> {
        let over = (self.used(now) + cost).saturating_sub(SETTLE_LIMIT);
        if over == 0 {
            if cost > 0 {
                self.add_at(now, cost, now);
            }
            return Ok(());
        }
        let mut freed = 0;
        for &(at, units) in &self.log {
            freed += units;
            if freed >= over {
                return Err(at + SETTLE_SPAN - now);
            }
        }
        unreachable!("a cost within the limit always fits once the log is gone")
    }

    fn settle(&mut self, i: usize, actual: u32, now: Instant) {
        let (_, at, estimate, settled) = self.charges[i];
        // An admission of cost 0 charged nothing: there is nothing to settle.
        if settled || estimate == 0 {
            return;
        }
        self.charges[i].3 = true;
        self.expire(now);
        if actual >= estimate {
            self.add_at(at, actual - estimate, now);
        } else if let Some(pos) = self.log.iter().position(|e| e.0 == at) {
            let back = (estimate - actual).min(self.log[pos].1);
            self.log[pos].1 -= back;
            if self.log[pos].1 == 0 {
                self.log.remove(pos);
            }
        }
    }

    fn remaining(&mut self, i: usize, server: u64, now: Instant) {
        let local = SETTLE_LIMIT - self.used(now);
        let over = u64::from(local).saturating_sub(server) as u32;
        // An admission of cost 0 charged nothing: the store need not know it.
        let (_, at, estimate, _) = self.charges[i];
        let at = if at + SETTLE_SPAN > now && estimate > 0 {
            at
        } else {
            now
        };
        self.add_at(at, over, now);
    }
}

/// Cases of the settle property.
pub fn settle_cases() -> impl Strategy<Value = Vec<SettleOp>> {
    let ops = Union::new_weighted(vec![
        (5, (0u32..=12).prop_map(SettleOp::Admit).boxed()),
        (
            4,
            (any::<Index>(), 0u32..=30)
                .prop_map(|(i, a)| SettleOp::Settle(i, a))
                .boxed(),
        ),
        (
            2,
            (any::<Index>(), 0u64..=25)
                .prop_map(|(i, r)| SettleOp::Remaining(i, r))
                .boxed(),
        ),
        (3, (0u64..=700).prop_map(SettleOp::Advance).boxed()),
    ]);
    prop::collection::vec(ops, 1..60)
}

/// Runs one settle case against `store` and the model.
pub async fn run_settle_case<S: Store>(store: &S, ops: &[SettleOp]) {
    let window = window(SETTLE_LIMIT, SETTLE_SPAN, Duration::ZERO).with_unit(Unit::Tokens);
    let scope = open(store, &Limits::new().with_window(window));
    let mut model = WindowModel::default();
    for (step, op) in ops.iter().enumerate() {
        let now = Instant::now();
        match *op {
            SettleOp::Admit(cost) => {
                let want = model.admit(cost, now);
                match (admit(store, &scope, cost).await, want) {
                    (Admission::Admitted(lease), Ok(())) => {
                        store.release(&scope, lease);
                        model.charges.push((lease, now, cost, false));
                    }
                    (Admission::NotBefore(got), Err(wait)) => {
                        assert_eq!(got, wait, "step {step} {op:?}: {ops:?}")
                    }
                    (got, want) => panic!("step {step} {op:?}: got {got:?}, model {want:?}"),
                }
            }
            SettleOp::Settle(i, actual) if !model.charges.is_empty() => {
                let i = i.index(model.charges.len());
                settle(
                    store,
                    &scope,
                    model.charges[i].0,
                    Settlement::actual(actual),
                )
                .await;
                model.settle(i, actual, now);
            }
            SettleOp::Remaining(i, server) if !model.charges.is_empty() => {
                let i = i.index(model.charges.len());
                let lease = model.charges[i].0;
                settle(store, &scope, lease, Settlement::tokens_remaining(server)).await;
                model.remaining(i, server, now);
            }
            SettleOp::Settle(..) | SettleOp::Remaining(..) => {}
            SettleOp::Advance(n) => advance(ms(n)).await,
        }
        assert!(model.used(Instant::now()) <= SETTLE_LIMIT);
    }
}

/// Random admissions, settlements, reports of tokens remaining and waits on one token window:
/// every admission answer is the model's (which never counts past the limit nor refunds more
/// than a charge).
pub fn prop_settle_matches_the_window_model<S, F, Fut>(make: F)
where
    S: Store,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    let config = ProptestConfig {
        cases: 128,
        source_file: Some(file!()),
        ..ProptestConfig::default()
    };
    let mut runner = TestRunner::new(config);
    let result = runner.run(&settle_cases(), |ops| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a tokio runtime");
        rt.block_on(async {
            let store = make().await;
            run_settle_case(&store, &ops).await;
        });
        Ok(())
    });
    if let Err(e) = result {
        panic!("settle against the window model: {e}");
    }
}
