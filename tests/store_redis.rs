//! The `Store` conformance suite (tests/store_conformance) run against `RedisStore` on a
//! real `redis-server` (tests/common/redis.rs), on this process's paused tokio clock.

#![cfg(feature = "redis")]

mod common;
mod store_conformance;

use reqwest_throttle::store::RedisStore;

/// A store for the conformance checks: exact on paused time, on the binary's shared server.
fn conformance_store() -> RedisStore {
    common::redis::exact_store(common::redis::shared().expect("checked by `ready`"))
}

store_conformance!(
    conformance_store(),
    ready = common::redis::shared().is_some()
);
