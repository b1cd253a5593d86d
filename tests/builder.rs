//! `ThrottleBuilder::build`: every `BuildError`, each from a real builder call, several at
//! once, their messages, and the valid builds at the edges of each check.

use std::num::NonZeroU32;
use std::time::Duration;

use reqwest_throttle::policy::{Backoff, Jitter, RetryBudget, RetryPolicy};
use reqwest_throttle::{
    BuildError, Quota, Throttle, ThrottleBuilder, DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP,
    DEFAULT_MAX_RETRIES, DEFAULT_MAX_SERVER_WAIT, DEFAULT_WINDOW_GUARD,
};
use tokio::sync::Semaphore;

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

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
        BuildError::ZeroLimit { window: 0 }
    );
    // A bad window after a good one is still found, and named by its index.
    let b = Throttle::builder()
        .sliding_window(5, S)
        .sliding_window(0, S);
    assert_eq!(error(b), BuildError::ZeroLimit { window: 1 });
}

#[test]
fn a_zero_sliding_window_length() {
    assert_eq!(
        error(Throttle::builder().sliding_window(5, Duration::ZERO)),
        BuildError::ZeroWindow { window: 0 }
    );
    // The guard is not also reported against a window of no length.
    let b = Throttle::builder()
        .sliding_window(5, S)
        .sliding_window(5, 60 * S)
        .sliding_window(5, Duration::ZERO);
    assert_eq!(error(b), BuildError::ZeroWindow { window: 2 });
}

#[test]
fn a_window_guard_longer_than_a_sliding_window() {
    // The default guard (100 ms) against a 50 ms window.
    assert_eq!(
        error(Throttle::builder().sliding_window(5, 50 * MS)),
        BuildError::WindowGuardTooLong {
            window: 0,
            length: 50 * MS,
            guard: DEFAULT_WINDOW_GUARD,
        }
    );
    // A guard set longer than the second of two windows, whichever is called first.
    let b = Throttle::builder()
        .window_guard(2 * S)
        .sliding_window(100, 60 * S)
        .sliding_window(2, S);
    assert_eq!(
        error(b),
        BuildError::WindowGuardTooLong {
            window: 1,
            length: S,
            guard: 2 * S,
        }
    );
    // A guard as long as the window is accepted, and so is a zero guard for any window.
    let b = Throttle::builder().sliding_window(2, S).window_guard(S);
    assert!(b.build().is_ok());
    let b = Throttle::builder()
        .sliding_window(5, 50 * MS)
        .window_guard(Duration::ZERO);
    assert!(b.build().is_ok());
    assert!(Throttle::builder()
        .sliding_window(5, DEFAULT_WINDOW_GUARD)
        .build()
        .is_ok());
}

#[test]
fn a_zero_max_server_wait() {
    assert_eq!(
        error(Throttle::builder().max_server_wait(Duration::ZERO)),
        BuildError::ZeroMaxServerWait
    );
    assert!(Throttle::builder()
        .max_server_wait(Duration::from_nanos(1))
        .build()
        .is_ok());
}

#[test]
fn a_zero_deadline() {
    assert_eq!(
        error(Throttle::builder().deadline(Duration::ZERO)),
        BuildError::ZeroDeadline
    );
    assert!(Throttle::builder()
        .deadline(Duration::from_nanos(1))
        .build()
        .is_ok());
}

#[test]
fn a_token_bucket_slower_than_a_century() {
    let year = Duration::from_secs(365 * 24 * 3600);
    let slow = Quota::with_period(101 * year).unwrap();
    assert_eq!(
        error(Throttle::builder().token_bucket(slow)),
        BuildError::TokenBucketTooSlow {
            bucket: 0,
            refill: 101 * year
        }
    );
    // The burst counts: 60 years a cell, 2 cells. The bucket is named by its index.
    let burst = Quota::with_period(60 * year)
        .unwrap()
        .allow_burst(NonZeroU32::new(2).unwrap());
    let b = Throttle::builder()
        .token_bucket(Quota::per_second(NonZeroU32::MIN))
        .token_bucket(burst);
    assert_eq!(
        error(b),
        BuildError::TokenBucketTooSlow {
            bucket: 1,
            refill: 120 * year
        }
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
fn every_problem_is_reported_at_once_in_a_fixed_order() {
    let year = Duration::from_secs(365 * 24 * 3600);
    let slow = Quota::with_period(101 * year).unwrap();
    let b = with_buckets(64)
        .token_bucket(slow)
        .sliding_window(0, Duration::ZERO)
        .sliding_window(0, 50 * MS)
        .max_in_flight(0)
        .backoff(Duration::ZERO, Duration::ZERO)
        .max_server_wait(Duration::ZERO)
        .deadline(Duration::ZERO)
        .retry_budget(Some(RetryBudget {
            ratio: f64::NAN,
            ..RetryBudget::default()
        }))
        .max_scopes(0);
    let all = vec![
        BuildError::ZeroLimit { window: 0 },
        BuildError::ZeroWindow { window: 0 },
        BuildError::ZeroLimit { window: 1 },
        BuildError::WindowGuardTooLong {
            window: 1,
            length: 50 * MS,
            guard: DEFAULT_WINDOW_GUARD,
        },
        BuildError::TooManyTokenBuckets { count: 65 },
        BuildError::TokenBucketTooSlow {
            bucket: 64,
            refill: 101 * year,
        },
        BuildError::ZeroInFlight,
        BuildError::ZeroBackoffBase,
        BuildError::ZeroMaxServerWait,
        BuildError::ZeroDeadline,
        BuildError::InvalidRetryBudget,
        BuildError::ZeroMaxScopes,
    ];
    let err = error(b);
    assert_eq!(err.problems(), all);
    assert_eq!(err, BuildError::Several(all));

    let b = Throttle::builder()
        .max_in_flight(usize::MAX)
        .backoff(2 * S, S);
    let err = error(b);
    let both = [
        BuildError::InFlightTooLarge { max: usize::MAX },
        BuildError::BackoffBaseAboveCap {
            base: 2 * S,
            cap: S,
        },
    ];
    assert_eq!(err, BuildError::Several(both.to_vec()));
    assert_eq!(
        err.to_string(),
        format!(
            "2 invalid settings: max_in_flight {} is above the largest supported ({}); \
             backoff base (2s) is larger than its cap (1s)",
            usize::MAX,
            Semaphore::MAX_PERMITS
        )
    );
    // One problem alone is not wrapped, and is its own only problem.
    let one = error(Throttle::builder().max_in_flight(0));
    assert_eq!(one, BuildError::ZeroInFlight);
    assert_eq!(one.problems(), [BuildError::ZeroInFlight]);
}

#[test]
fn messages_name_the_setting() {
    let message = |b: ThrottleBuilder| error(b).to_string();
    let b = Throttle::builder()
        .sliding_window(5, S)
        .sliding_window(0, S);
    assert_eq!(
        message(b),
        "sliding window 1: the limit must be at least 1 request"
    );
    assert_eq!(
        message(Throttle::builder().sliding_window(5, Duration::ZERO)),
        "sliding window 0: the window length must be greater than zero"
    );
    assert_eq!(
        message(Throttle::builder().sliding_window(5, 50 * MS)),
        "window_guard 100ms is longer than sliding window 0 (50ms); \
         lower the guard or lengthen the window"
    );
    let slow = Quota::with_period(Duration::MAX).unwrap();
    assert_eq!(
        message(Throttle::builder().token_bucket(slow)),
        format!(
            "token bucket 0 refills its burst in {:?}; at most 100 years is supported",
            Duration::MAX
        )
    );
    assert_eq!(
        message(Throttle::builder().max_server_wait(Duration::ZERO)),
        "max_server_wait must be greater than zero"
    );
    assert_eq!(
        message(Throttle::builder().deadline(Duration::ZERO)),
        "deadline must be greater than zero"
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
        .window_guard(Duration::from_nanos(1))
        .deadline(Duration::from_nanos(1))
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
