//! The `Store` conformance suite (tests/store_conformance) run against `RedisStore` on a
//! real `redis-server` (tests/common/redis.rs), on this process's paused tokio clock.

#![cfg(feature = "redis")]

mod common;
mod store_conformance;

use reqwest_throttle::store::RedisStore;

/// A store for the conformance checks: exact (tokio clock, no jitter, no timer), on the
/// binary's shared server.
fn conformance_store() -> RedisStore {
    let server = common::redis::shared().expect("checked by `ready`");
    RedisStore::builder(server.url())
        .local_clock_for_tests()
        .jitter(std::time::Duration::ZERO)
        .build()
        .expect("a valid URL")
}

store_conformance!(
    conformance_store(),
    ready = common::redis::shared().is_some()
);
