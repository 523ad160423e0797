//! Poison-tolerant locking, the one copy for the crate.
//!
//! A panic while a device lock is held (a filesystem callback that
//! panicked on a worker, say) must not take every later request of the
//! guest down with it: what these locks guard stays consistent between
//! statements (flags, counters, lists that are pushed to or drained), so
//! the guard is taken back from the poison rather than unwrapped.

use std::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `m`, poisoned or not.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Read-locks `l`, poisoned or not.
pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

/// Write-locks `l`, poisoned or not.
pub(crate) fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

/// Waits on `cv` with `guard`, poisoned or not.
pub(crate) fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(guard).unwrap_or_else(|e| e.into_inner())
}

/// Waits on `cv` with `guard` for at most `d`, poisoned or not.
pub(crate) fn wait_for<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    d: std::time::Duration,
) -> MutexGuard<'a, T> {
    match cv.wait_timeout(guard, d) {
        Ok((g, _)) => g,
        Err(e) => e.into_inner().0,
    }
}
