//! The `Store` conformance suite (tests/store_conformance) run against `MemoryStore`.

mod store_conformance;

store_conformance!(reqwest_throttle::store::MemoryStore);
