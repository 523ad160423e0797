//! Poison-tolerant locking of `std` locks: the workspace's one copy (the
//! engine's own locks go through `sync.rs`, which model-checks them under
//! loom).
//!
//! A panic while a lock is held (a filesystem call that panics on one
//! server thread, say) poisons it, and every later request would fail on
//! it for good. What fusebox's locks guard stays consistent at every point
//! a panic can happen (single assignments, list and table inserts and
//! removals), so a poisoned lock is entered as it is rather than turning
//! one panic into a stopped daemon.

use std::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

/// Locks `m`, poisoned or not.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Read-locks `l`, poisoned or not.
pub fn read<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

/// Write-locks `l`, poisoned or not.
pub fn write<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

/// The contents of `m`, which the caller owns outright, poisoned or not.
pub fn get_mut<T: ?Sized>(m: &mut Mutex<T>) -> &mut T {
    m.get_mut().unwrap_or_else(|e| e.into_inner())
}

/// Waits on `cv` with `guard`, poisoned or not.
pub fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(guard).unwrap_or_else(|e| e.into_inner())
}

/// Waits on `cv` with `guard` for at most `d`, poisoned or not.
pub fn wait_for<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>, d: Duration) -> MutexGuard<'a, T> {
    match cv.wait_timeout(guard, d) {
        Ok((g, _)) => g,
        Err(e) => e.into_inner().0,
    }
}
