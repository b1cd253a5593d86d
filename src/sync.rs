//! Locks that survive a panicking holder.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, going on with the data of a holder that panicked (the data stays consistent:
/// every critical section in this crate is a single update).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
