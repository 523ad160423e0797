//! Synchronisation primitives: `std` normally, `loom` under `--cfg loom` so
//! the engine's real code is model-checked.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize};
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize};
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

pub(crate) use std::sync::atomic::Ordering;
// Sharing uses std's Arc even under loom: loom's Arc has no Weak, and the
// models check the locks, condvars and atomics, not reference counts.
pub(crate) use std::sync::{Arc, Weak};

/// Locks `m` (poisoned or not, see [`crate::locks`]).
#[cfg(loom)]
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Waits on `cv`, releasing and re-taking the guard (poisoned or not).
#[cfg(loom)]
pub(crate) fn wait<'a, T>(cv: &Condvar, g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(g).unwrap_or_else(|e| e.into_inner())
}

/// The value in `m`, owned by the caller (poisoned or not).
#[cfg(loom)]
pub(crate) fn get_mut<T>(m: &mut Mutex<T>) -> &mut T {
    m.get_mut().unwrap_or_else(|e| e.into_inner())
}

#[cfg(not(loom))]
pub(crate) use crate::locks::{get_mut, lock, wait};
