//! Cancelling an in-flight op from another thread, by the FUSE request's
//! unique (for FUSE_INTERRUPT and request timeouts).
//!
//! A driver belongs to one thread, and the interrupt arrives on another.
//! Drivers that share a [`CancelRegistry`] record each waiting op (its
//! ring's fd and user_data) under the op's key while the op is in flight;
//! [`CancelRegistry::cancel`] issues IORING_REGISTER_SYNC_CANCEL (6.0+) on
//! that ring. The registry's lock is held across the syscall and an op
//! leaves the registry (under that lock) before its driver can drop the
//! ring, so the fd named is always that live ring.

use fuse_core::locks::lock;
use std::collections::BTreeSet;
use std::os::fd::RawFd;
use std::sync::Mutex;
use std::time::Duration;

/// IORING_REGISTER_SYNC_CANCEL.
const REGISTER_SYNC_CANCEL: libc::c_uint = 24;

/// `struct io_uring_sync_cancel_reg`.
#[repr(C)]
struct SyncCancelReg {
    addr: u64,
    fd: i32,
    flags: u32,
    timeout_sec: i64,
    timeout_nsec: i64,
    opcode: u8,
    pad: [u8; 7],
    pad2: [u64; 3],
}
const _: () = assert!(std::mem::size_of::<SyncCancelReg>() == 64);

/// Ops in flight by key, across the drivers that share it.
#[derive(Debug, Default)]
pub struct CancelRegistry {
    /// (key, ring fd, user_data): one set, so entering an op allocates
    /// nothing per request (a map of vectors did, on every READ).
    ops: Mutex<BTreeSet<(u64, RawFd, u64)>>,
    /// Rings owned by a serving loop, with its thread: their ops' completions
    /// are taken by that thread alone (see [`CancelRegistry::cancel_here`]).
    owned: Mutex<Vec<(RawFd, std::thread::ThreadId)>>,
}

impl CancelRegistry {
    fn ops(&self) -> std::sync::MutexGuard<'_, BTreeSet<(u64, RawFd, u64)>> {
        lock(&self.ops)
    }

    pub(crate) fn enter(&self, key: u64, ring: RawFd, user_data: u64) {
        self.ops().insert((key, ring, user_data));
    }

    pub(crate) fn leave(&self, key: u64, ring: RawFd, user_data: u64) {
        self.ops().remove(&(key, ring, user_data));
    }

    /// Records ring `ring` as this thread's own: only this thread takes
    /// its ops' completions, after submitting them.
    pub fn own(&self, ring: RawFd) {
        lock(&self.owned).push((ring, std::thread::current().id()));
    }

    /// Forgets ring `ring` (before it is closed).
    pub fn disown(&self, ring: RawFd) {
        lock(&self.owned).retain(|&(r, _)| r != ring);
    }

    /// [`CancelRegistry::cancel_from`] on this thread's own ring, if it
    /// has one ([`CancelRegistry::own`]): an interrupt served by the
    /// thread that started the op does not wait for it to leave.
    pub fn cancel_here(&self, key: u64, patience: Duration) -> usize {
        let me = std::thread::current().id();
        let own = lock(&self.owned)
            .iter()
            .find(|&&(_, t)| t == me)
            .map(|&(r, _)| r);
        self.cancel_from(key, patience, own)
    }

    /// Ops in flight now.
    pub fn in_flight(&self) -> usize {
        self.ops().len()
    }

    /// Cancels every op in flight under `key`; returns how many were found.
    /// An op that was queued but not yet submitted is caught by a retry
    /// (up to `patience`).
    pub fn cancel(&self, key: u64, patience: Duration) -> usize {
        self.cancel_from(key, patience, None)
    }

    /// [`CancelRegistry::cancel`] from the thread that owns ring `own`,
    /// whose queue it has just submitted: its ops there are cancelled
    /// once, not waited for (they leave the registry only when this very
    /// thread takes their completions, so a retry would wait out all of
    /// `patience` for nothing).
    pub fn cancel_from(&self, key: u64, patience: Duration, own: Option<RawFd>) -> usize {
        let start = std::time::Instant::now();
        let mut found = 0;
        loop {
            {
                let ops = self.ops();
                let list: Vec<(RawFd, u64)> = ops
                    .range((key, RawFd::MIN, 0)..=(key, RawFd::MAX, u64::MAX))
                    .map(|&(_, ring, ud)| (ring, ud))
                    .collect();
                if list.is_empty() {
                    return found;
                }
                found = found.max(list.len());
                let only_own = list.iter().all(|&(ring, _)| Some(ring) == own);
                for (ring, ud) in list {
                    let reg = SyncCancelReg {
                        addr: ud,
                        fd: 0,
                        flags: 0,
                        timeout_sec: 0,
                        timeout_nsec: 10_000_000,
                        opcode: 0,
                        pad: [0; 7],
                        pad2: [0; 3],
                    };
                    // SAFETY: `ring` is a live io_uring fd (see the module
                    // docs: the lock we hold keeps its driver from dropping
                    // it) and `reg` is a valid sync-cancel argument.
                    unsafe {
                        libc::syscall(
                            libc::SYS_io_uring_register,
                            ring,
                            REGISTER_SYNC_CANCEL,
                            &reg as *const SyncCancelReg,
                            1,
                        );
                    }
                }
                if only_own {
                    return found;
                }
            }
            if start.elapsed() >= patience {
                return found;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
