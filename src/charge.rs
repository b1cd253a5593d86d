//! [`Charge`]: a request's quota charge, to settle with the true figure once it is known.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::store::{LeaseId, Settlement, StoreError};

/// What settles a charge in its scope's store.
pub(crate) trait Settle: Send + Sync {
    /// Settles the charge of `lease` with `settlement` (see
    /// [`Store::settle`](crate::store::Store::settle)).
    fn settle(
        &self,
        lease: LeaseId,
        settlement: Settlement,
    ) -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + '_>>;
}

/// The quota charge of a request sent through the throttle: its [`Cost`](crate::Cost) (an
/// estimate made before sending, e.g. prompt tokens + `max_tokens`), to settle with the true
/// figure once the answer tells it (e.g. the `usage` of an LLM API's JSON body).
///
/// Every response the throttle returns carries the charge of the attempt that produced it in
/// its extensions. Take it before the body is read (reading consumes the response):
///
/// ```no_run
/// use reqwest_throttle::{Charge, Cost};
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new()).build();
/// let response = client.post("https://api.example/v1/chat")
///     .with_extension(Cost(1_200)) // prompt tokens + max_tokens
///     .send()
///     .await?;
/// let charge = response.extensions().get::<Charge>().cloned();
/// let body: serde_json::Value = serde_json::from_slice(&response.bytes().await?)?;
/// if let (Some(charge), Some(used)) = (charge, body["usage"]["total_tokens"].as_u64()) {
///     charge.settle(u32::try_from(used).unwrap_or(u32::MAX)).await?;
/// }
/// # Ok(()) }
/// ```
///
/// Settling charges or refunds each quota that counts the cost the difference, at the place
/// of the original send (a sliding window then forgets it when that send leaves the window).
/// A refund is never larger than the estimate; an extra charge never takes a window past its
/// limit. A **token bucket is only ever charged more**, never refunded: it keeps no record of
/// when cells were taken, so a refund could let more through than the server's bucket
/// admits. Windows that count requests ([`Unit::Requests`](crate::store::Unit::Requests))
/// are not touched. A charge is settled once: settling it again (or a clone of it) changes
/// nothing.
///
/// Holding a `Charge` keeps its scope alive (it is not forgotten while idle); drop it once
/// settled.
#[derive(Clone)]
pub struct Charge {
    scope: Arc<dyn Settle>,
    lease: LeaseId,
    estimate: u32,
}

impl Charge {
    pub(crate) fn new(scope: Arc<dyn Settle>, lease: LeaseId, estimate: u32) -> Self {
        Self {
            scope,
            lease,
            estimate,
        }
    }

    /// The cost the request was admitted with, in quota units: its estimate.
    pub fn estimate(&self) -> u32 {
        self.estimate
    }

    /// Settles the charge with the request's true cost, `actual` quota units (e.g. the total
    /// tokens the answer reports used).
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot answer (the estimate then stands).
    ///
    /// # Cancel safety
    /// With the in-memory store the settlement is made at the first poll. A shared store's
    /// settlement dropped before it completes may or may not have been made.
    pub async fn settle(&self, actual: u32) -> Result<(), StoreError> {
        self.apply(Settlement::actual(actual)).await
    }

    /// Applies `settlement` to this charge.
    pub(crate) async fn apply(&self, settlement: Settlement) -> Result<(), StoreError> {
        self.scope.settle(self.lease, settlement).await
    }
}

impl fmt::Debug for Charge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Charge")
            .field("lease", &self.lease)
            .field("estimate", &self.estimate)
            .finish_non_exhaustive()
    }
}

/// The builder's [`settle_from_headers`](crate::ThrottleBuilder::settle_from_headers) hook.
#[derive(Clone)]
pub(crate) struct UsageFromHeaders(Arc<ReadUsage>);

/// Reads a true cost from an answer's headers.
type ReadUsage = dyn Fn(&http::HeaderMap) -> Option<u32> + Send + Sync;

impl UsageFromHeaders {
    pub(crate) fn new(f: impl Fn(&http::HeaderMap) -> Option<u32> + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// The true cost the answer's headers report, if they do.
    pub(crate) fn read(&self, headers: &http::HeaderMap) -> Option<u32> {
        (self.0)(headers)
    }
}

impl fmt::Debug for UsageFromHeaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("UsageFromHeaders(..)")
    }
}

/// The builder's [`settle_from_body`](crate::ThrottleBuilder::settle_from_body) hook.
#[derive(Clone)]
pub(crate) struct UsageFromBody {
    read: Arc<ReadBody>,
    max_bytes: usize,
}

/// Reads a true cost from an answer's whole body.
type ReadBody = dyn Fn(&[u8]) -> Option<u32> + Send + Sync;

impl UsageFromBody {
    pub(crate) fn new(
        max_bytes: usize,
        f: impl Fn(&[u8]) -> Option<u32> + Send + Sync + 'static,
    ) -> Self {
        Self {
            read: Arc::new(f),
            max_bytes,
        }
    }

    /// The true cost the whole body reports, if it does.
    pub(crate) fn read(&self, body: &[u8]) -> Option<u32> {
        (self.read)(body)
    }

    /// The longest body kept for the hook, in bytes.
    pub(crate) fn max_bytes(&self) -> usize {
        self.max_bytes
    }
}

impl fmt::Debug for UsageFromBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UsageFromBody")
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}
