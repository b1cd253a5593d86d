//! `ThrottleBuilder::build`: every `BuildError`, each from a real builder call, and the valid
//! builds at the edges of each check.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::Quota;
use reqwest_throttle::policy::{Backoff, Jitter, RetryBudget, RetryPolicy};
use reqwest_throttle::{
    BuildError, Throttle, ThrottleBuilder, DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP,
    DEFAULT_MAX_RETRIES, DEFAULT_MAX_SERVER_WAIT,
};
use tokio::sync::Semaphore;

const S: Duration = Duration::from_secs(1);

/// The error `builder` fails with.
fn error(builder: ThrottleBuilder) -> BuildError {
    builder.build().expect_err("the build should fail")
}

/// `n` token buckets of one request per second.
fn with_buckets(n: usize) -> ThrottleBuilder {
    let quota = Quota::per_second(NonZeroU32::MIN);
    (0..n).fold(Throttle::builder(), |b, _| b.token_bucket(quota))
}

#[test]
fn a_zero_sliding_window_limit() {
    assert_eq!(
        error(Throttle::builder().sliding_window(0, S)),
        BuildError::ZeroLimit
    );
    // A bad window after a good one is still found.
    let b = Throttle::builder()
        .sliding_window(5, S)
        .sliding_window(0, S);
    assert_eq!(error(b), BuildError::ZeroLimit);
}

#[test]
fn a_zero_sliding_window_length() {
    assert_eq!(
        error(Throttle::builder().sliding_window(5, Duration::ZERO)),
        BuildError::ZeroWindow
    );
}

#[test]
fn a_token_bucket_slower_than_a_century() {
    let year = Duration::from_secs(365 * 24 * 3600);
    let slow = Quota::with_period(101 * year).unwrap();
    assert_eq!(
        error(Throttle::builder().token_bucket(slow)),
        BuildError::TokenBucketTooSlow { refill: 101 * year }
    );
    // The burst counts: 60 years a cell, 2 cells.
    let burst = Quota::with_period(60 * year)
        .unwrap()
        .allow_burst(NonZeroU32::new(2).unwrap());
    assert_eq!(
        error(Throttle::builder().token_bucket(burst)),
        BuildError::TokenBucketTooSlow { refill: 120 * year }
    );
    let century = Quota::with_period(100 * year).unwrap();
    assert!(Throttle::builder().token_bucket(century).build().is_ok());
}

#[test]
fn a_zero_scope_cap() {
    assert_eq!(
        error(Throttle::builder().max_scopes(0)),
        BuildError::ZeroMaxScopes
    );
    assert!(Throttle::builder().max_scopes(1).build().is_ok());
}

#[test]
fn a_zero_in_flight_cap() {
    assert_eq!(
        error(Throttle::builder().max_in_flight(0)),
        BuildError::ZeroInFlight
    );
}

#[test]
fn an_in_flight_cap_above_the_semaphore_limit() {
    for max in [Semaphore::MAX_PERMITS + 1, usize::MAX] {
        assert_eq!(
            error(Throttle::builder().max_in_flight(max)),
            BuildError::InFlightTooLarge { max }
        );
    }
}

#[test]
fn more_than_64_token_buckets() {
    assert_eq!(
        error(with_buckets(65)),
        BuildError::TooManyTokenBuckets { count: 65 }
    );
}

#[test]
fn an_invalid_retry_budget() {
    let budgets = [
        RetryBudget {
            ratio: -0.1,
            ..RetryBudget::default()
        },
        RetryBudget {
            ratio: f64::NAN,
            ..RetryBudget::default()
        },
        RetryBudget {
            ratio: f64::INFINITY,
            ..RetryBudget::default()
        },
        RetryBudget {
            window: Duration::ZERO,
            ..RetryBudget::default()
        },
    ];
    for budget in budgets {
        assert_eq!(
            error(Throttle::builder().retry_budget(Some(budget))),
            BuildError::InvalidRetryBudget,
            "{budget:?}"
        );
    }
}

#[test]
fn a_zero_backoff_base() {
    assert_eq!(
        error(Throttle::builder().backoff(Duration::ZERO, S)),
        BuildError::ZeroBackoffBase
    );
}

#[test]
fn a_backoff_base_above_its_cap() {
    let (base, cap) = (2 * S, S);
    assert_eq!(
        error(Throttle::builder().backoff(base, cap)),
        BuildError::BackoffBaseAboveCap { base, cap }
    );
}

#[test]
fn the_defaults_build() {
    let throttle = Throttle::builder().build().expect("the defaults are valid");
    let defaults = RetryPolicy::new(
        DEFAULT_MAX_RETRIES,
        Backoff::new(DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP),
        Jitter::On,
        DEFAULT_MAX_SERVER_WAIT,
    );
    assert_eq!(*throttle.retry_policy(), defaults);
    assert_eq!(throttle.stats().available_permits, None);
}

#[tokio::test]
async fn valid_settings_at_the_edge_of_every_check_build() {
    let throttle = with_buckets(64)
        .sliding_window(1, Duration::from_nanos(1))
        .sliding_window(u32::MAX, Duration::MAX)
        .max_in_flight(Semaphore::MAX_PERMITS)
        .max_retries(3)
        .backoff(2 * S, 2 * S)
        .jitter(false)
        .max_server_wait(10 * S)
        .retry_budget(Some(RetryBudget {
            ratio: 0.0,
            min_per_second: 0,
            window: Duration::from_nanos(1),
        }))
        .build()
        .expect("every setting is valid");
    let policy = RetryPolicy::new(3, Backoff::new(2 * S, 2 * S), Jitter::Off, 10 * S);
    assert_eq!(*throttle.retry_policy(), policy);
    // Before the first admission: the cap a scope starts with.
    assert_eq!(
        throttle.stats().available_permits,
        Some(Semaphore::MAX_PERMITS)
    );
    let permit = throttle.acquire(1).await.unwrap();
    assert_eq!(
        throttle.stats().available_permits,
        Some(Semaphore::MAX_PERMITS - 1)
    );
    drop(permit);
    assert!(Throttle::builder().retry_budget(None).build().is_ok());
}
