//! Poison-tolerant locking, the crate's one copy.
//!
//! A panic while a lock is held (a filesystem call that panics on one
//! server thread) poisons it; every other request would then fail on it
//! for good. The data these locks guard stays consistent at every point a
//! panic can happen (tables updated by single inserts and removals), so
//! the crate takes a poisoned lock as it is rather than stop serving.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `m`, poisoned or not.
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Read-locks `l`, poisoned or not.
pub(crate) fn read_lock<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

/// Write-locks `l`, poisoned or not.
pub(crate) fn write_lock<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

/// The contents of `m`, which the caller owns outright, poisoned or not.
pub(crate) fn get_mut<T: ?Sized>(m: &mut Mutex<T>) -> &mut T {
    m.get_mut().unwrap_or_else(|e| e.into_inner())
}
