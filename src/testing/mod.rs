//! A simulated rate-limited gateway on loopback, for tests (feature `test-util`).
