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

/// Locks `m`. A panic while holding an engine lock is a bug in the engine;
/// the state it protects is kept consistent by construction (every update is
/// a single assignment or list move), so a poisoned lock is entered anyway
/// rather than turning one panic into a cascade.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Waits on `cv`, releasing and re-taking the guard (see [`lock`] on poisoning).
pub(crate) fn wait<'a, T>(cv: &Condvar, g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(g).unwrap_or_else(|e| e.into_inner())
}
