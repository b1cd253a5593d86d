//! reqwest-throttle (work in progress).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod headers;
#[cfg(feature = "test-util")]
pub mod testing;
