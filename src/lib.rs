//! A `reqwest-middleware` layer that keeps a client, or a swarm of agents sharing one, inside a
//! rate-limited API's quota: it paces requests before they are sent, caps requests in flight,
//! and retries 429s (and other "later" answers) without a stampede and without losing a request.
//!
//! # Quick start
//! ```no_run
//! use std::time::Duration;
//! use reqwest_throttle::Throttle;
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let throttle = Throttle::builder()
//!     .sliding_window(120, Duration::from_secs(60)) // at most 120 sends in any 60 s
//!     .max_in_flight(20)                            // at most 20 requests open, bodies included
//!     .max_retries(6)
//!     .build()?;
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(throttle.clone())
//!     .build();
//! let response = client.get("http://127.0.0.1:8080/v1/chat").send().await?;
//! println!("{}", response.status());
//! Ok(())
//! }
//! ```
//!
//! # The path of one request
//! 1. **Scope**: what the server counts the request against ([`Scope`]: per authority by
//!    default, per API key, global, or a function of the request). Limits, cooldown and hints
//!    are kept per scope.
//! 2. **Queue**: the scope's waiters go highest [`Priority`] first, first in first out within a
//!    priority, with aging so that none starves.
//! 3. **Admission**, all or nothing, asked of the scope's [`store`]: the **cooldown** is open
//!    (after a window-type 429 every caller of the scope waits for the reset together), an
//!    **in-flight slot** is free (it rides on the response body until the body ends or is
//!    dropped; a body that fails keeps it until dropped, since its connection is still open),
//!    and every [sliding window](ThrottleBuilder::sliding_window) and
//!    [token bucket](ThrottleBuilder::token_bucket) admits the request's [`Cost`].
//! 4. **Send**, then read the [hints](headers) of the answer and [decide](policy): return it,
//!    or release the slot, wait, and send again.
//!
//! Every response returned carries a [`ThrottleInfo`] extension. When retries run out, the last
//! response is returned as `Ok`: nothing is lost.
//!
//! # Observe it
//! [`Throttle::events`] gives typed [`Event`]s (cooldowns, refusals, capacity warnings,
//! circuits opened and closed, limits learned), the
//! `metrics` feature records counters, gauges and histograms through the `metrics` facade, and
//! every call is a `tracing` span: see [`observe`] for every name, unit and level.
#![deny(missing_docs)]
#![forbid(unsafe_code)]
#![warn(missing_debug_implementations, unreachable_pub)]
#![doc(test(attr(deny(warnings))))]

mod body;
mod builder;
mod charge;
mod clock;
mod engine;
mod error;
mod extensions;
pub mod headers;
mod learn;
mod middleware;
pub mod observe;
pub mod policy;
pub mod store;
mod sync;
#[cfg(feature = "test-util")]
pub mod testing;
mod throttle;
mod transport;

pub use builder::{
    ThrottleBuilder, DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP, DEFAULT_MAX_RETRIES,
    DEFAULT_MAX_SCOPES, DEFAULT_MAX_SERVER_WAIT, DEFAULT_PRIORITY_AGING, DEFAULT_SCOPE_IDLE_TTL,
    DEFAULT_WINDOW_GUARD,
};
pub use charge::Charge;
pub use engine::Scope;
pub use error::{BuildError, ThrottleError, TransportError};
pub use extensions::{Cost, Deadline, NoRetry, Priority, ThrottleInfo, Waits};
/// `governor`'s token-bucket quota, for [`ThrottleBuilder::token_bucket`], re-exported so that
/// `governor` need not be a direct dependency.
pub use governor::Quota;
pub use headers::{Allowance, Hints, LimitKind};
pub use learn::{
    CircuitBreaker, CircuitState, LearnedLimits, LearnedWindow, RetryAfterPolicy,
    DEFAULT_BREAKER_FAILURES, DEFAULT_BREAKER_OPEN_FOR, DEFAULT_PROBE_AFTER,
};
pub use observe::Event;
pub use policy::StopReason;
pub use throttle::{Permit, ScopeStats, Stats, Throttle};

/// The README's examples, compiled as doctests so that they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
