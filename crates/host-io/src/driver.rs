//! A small io_uring driver for one worker thread.
//!
//! - An op owns its buffer from submission until its completion, in the
//!   driver's slot table (indexed by `user_data`); an op the caller gives
//!   up on ([`Driver::forget`]) leaves it there until the CQE arrives.
//! - Dropping the driver cancels everything in flight and waits for every
//!   completion before the ring and its buffers are freed (`teardown.rs`).
//! - Ops are queued and submitted together ([`Driver::submit`], or when
//!   waiting); missing opcodes fall back to pread/pwrite (probed at start).
//! - Fixed buffers (regions the driver owns, or a client's memory map) and
//!   fixed files; an op carries a key, the request's unique, for
//!   [`Driver::cancel`], and may carry a deadline (LINK_TIMEOUT).
//! - Unsafe: every SQE that names memory goes through [`Driver::push_all`],
//!   an `unsafe fn` whose contract is that the memory outlives the op; each
//!   caller says why that holds (Drop's cancels name none).

mod blocking;
mod owned;
mod personality;
mod started;
mod teardown;
mod vectored;
pub use owned::{pread, pwrite};
pub use vectored::{preadv_raw, pwritev_raw, MAX_IOVECS};

use io_uring::{opcode, squeue, types, IoUring, Probe};
use std::io;
use std::os::fd::RawFd;

/// user_data of the linked timeouts and cancel requests (never a slot).
const INTERNAL: u64 = u64::MAX;
/// Largest registered buffer piece.
const MAX_REGION: usize = 1 << 30;

/// Errors of the driver.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// io_uring could not be set up.
    #[error("setting up io_uring")]
    Setup(#[source] io::Error),
    /// Registering buffers or files failed.
    #[error("registering with io_uring")]
    Register(#[source] io::Error),
    /// io_uring_enter failed.
    #[error("submitting to io_uring")]
    Submit(#[source] io::Error),
    /// No such operation (already completed and taken, or never issued).
    #[error("unknown operation")]
    UnknownOp,
    /// A fixed-buffer access outside the registered region.
    #[error("fixed buffer {index} has no range {off}..{end}")]
    BadFixed {
        /// Region index.
        index: u16,
        /// Start offset.
        off: usize,
        /// End offset.
        end: usize,
    },
}

/// Opcodes the kernel supports (from the start-up probe).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Supported {
    /// IORING_OP_READ.
    pub read: bool,
    /// IORING_OP_WRITE.
    pub write: bool,
    /// IORING_OP_READ_FIXED.
    pub read_fixed: bool,
    /// IORING_OP_WRITE_FIXED.
    pub write_fixed: bool,
    /// IORING_OP_READV_FIXED (Linux 6.15).
    pub readv_fixed: bool,
    /// IORING_OP_WRITEV_FIXED (Linux 6.15).
    pub writev_fixed: bool,
    /// IORING_OP_ASYNC_CANCEL.
    pub cancel: bool,
    /// IORING_OP_LINK_TIMEOUT.
    pub link_timeout: bool,
}

/// Which file an op targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A plain file descriptor.
    Fd(RawFd),
    /// An index into the registered files.
    Fixed(u32),
}

/// An operation's handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpId {
    idx: usize,
    gen: u64,
}

/// A finished operation: its result and the buffer it owned.
#[derive(Debug)]
pub struct Completion {
    /// Bytes transferred, or the error (ECANCELED when cancelled or timed out).
    pub result: io::Result<usize>,
    /// The op's buffer, given back.
    pub buf: Option<Vec<u8>>,
}

enum Slot {
    Free,
    /// Submitted (or queued): the kernel may be using `buf`.
    InFlight {
        buf: Option<Vec<u8>>,
        key: u64,
        timeout: Option<Box<types::Timespec>>,
        forgotten: bool,
        /// The registered region a READ_FIXED/WRITE_FIXED uses (so
        /// [`Driver::region`] refuses it meanwhile).
        region: Option<u16>,
    },
    Done {
        res: i32,
        buf: Option<Vec<u8>>,
    },
}

impl Slot {
    /// An op about to be queued, owning `buf` (if any) until its
    /// completion.
    fn in_flight(buf: Option<Vec<u8>>, key: u64) -> Slot {
        Slot::InFlight {
            buf,
            key,
            timeout: None,
            forgotten: false,
            region: None,
        }
    }
}

/// One io_uring with its in-flight operations.
pub struct Driver {
    // Field order matters: the ring is dropped (and its registrations
    // released) before the memory it had registered.
    ring: IoUring,
    slots: Vec<Slot>,
    gens: Vec<u64>,
    free: Vec<usize>,
    queued: usize,
    supported: Supported,
    regions: Vec<Box<[u8]>>,
    /// The client map registered instead of `regions` (see `vectored`).
    client_map: Option<vectored::ClientPieces>,
    /// The client map the kernel refused to register (see `vectored`).
    refused_map: Option<u64>,
    cancels: Option<std::sync::Arc<crate::cancel::CancelRegistry>>,
    /// Started ops (see `started.rs`): their ids and keys, and the iovec
    /// arrays the kernel reads until each completes (by slot).
    started: Vec<(OpId, u64)>,
    iov_store: fuse_core::fasthash::IdMap<usize, Box<[libc::iovec]>>,
    /// Unique among this process's drivers (see `personality.rs`).
    serial: u64,
}

// SAFETY: a driver has no tie to the thread that made it: its ring is set
// up without SINGLE_ISSUER, so any one thread at a time may submit and
// reap on it (`&mut self`), and the raw pointers it keeps (the iovec arrays
// of started ops, the registered client map's pieces) name memory whose
// life its callers' contracts bind to the op, not to a thread.
unsafe impl Send for Driver {}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("supported", &self.supported)
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

impl Driver {
    /// A driver with a ring of `entries` submission entries.
    pub fn new(entries: u32) -> Result<Driver, DriverError> {
        let ring = IoUring::new(entries).map_err(DriverError::Setup)?;
        // As many io-wq workers for file ops (syncs, fallocates, large
        // reads handed off) as the ring holds entries: the kernel's default,
        // 4 per CPU, runs fewer blocking ops at once than a small host's
        // ring has in flight (docs/BENCHMARKS.md, "FSYNCs on the vring
        // thread's io_uring"). Best effort: the limit is per thread (its
        // io-wq), unbounded work keeps its own.
        let _ = ring
            .submitter()
            .register_iowq_max_workers(&mut [entries, 0]);
        let mut probe = Probe::new();
        let supported = match ring.submitter().register_probe(&mut probe) {
            Ok(()) => Supported {
                read: probe.is_supported(opcode::Read::CODE),
                write: probe.is_supported(opcode::Write::CODE),
                read_fixed: probe.is_supported(opcode::ReadFixed::CODE),
                write_fixed: probe.is_supported(opcode::WriteFixed::CODE),
                readv_fixed: probe.is_supported(opcode::ReadvFixed::CODE),
                writev_fixed: probe.is_supported(opcode::WritevFixed::CODE),
                cancel: probe.is_supported(opcode::AsyncCancel::CODE),
                link_timeout: probe.is_supported(opcode::LinkTimeout::CODE),
            },
            // Kernels without probing: assume nothing, use syscalls.
            Err(_) => Supported::default(),
        };
        Ok(Driver {
            ring,
            slots: Vec::new(),
            gens: Vec::new(),
            free: Vec::new(),
            queued: 0,
            supported,
            regions: Vec::new(),
            client_map: None,
            refused_map: None,
            cancels: None,
            started: Vec::new(),
            iov_store: Default::default(),
            serial: {
                static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
                NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            },
        })
    }

    /// Records this driver's waiting borrowed-buffer ops (`read_into`,
    /// `write_from`, `fsync`) in `registry`, so another thread can cancel
    /// them by key.
    pub fn set_cancel_registry(&mut self, registry: std::sync::Arc<crate::cancel::CancelRegistry>) {
        if let Some(old) = &self.cancels {
            if std::sync::Arc::ptr_eq(old, &registry) {
                return;
            }
            // Ops started under the old registry move to the new one, so
            // each leaves the registry it is in when it ends (left in the
            // old one, an entry would outlive this ring's fd, whose number
            // another ring may take).
            let ring = self.ring_fd();
            for &(id, key) in &self.started {
                old.leave(key, ring, id.idx as u64);
                registry.enter(key, ring, id.idx as u64);
            }
        }
        self.cancels = Some(registry);
    }

    /// What the probe found.
    pub fn supported(&self) -> Supported {
        self.supported
    }

    /// Pretends the kernel lacks every opcode, so the syscall fallbacks run
    /// (for tests of those paths).
    #[cfg(feature = "test-utils")]
    pub fn disable_uring_ops(&mut self) {
        self.supported = Supported::default();
    }

    /// Operations submitted or queued and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| matches!(s, Slot::InFlight { .. }))
            .count()
    }

    fn alloc(&mut self, slot: Slot) -> OpId {
        let idx = match self.free.pop() {
            Some(i) => {
                self.slots[i] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                self.gens.push(0);
                self.slots.len() - 1
            }
        };
        self.gens[idx] += 1;
        OpId {
            idx,
            gen: self.gens[idx],
        }
    }

    fn release(&mut self, idx: usize) {
        self.slots[idx] = Slot::Free;
        self.free.push(idx);
    }

    /// Queues `entries` together (all or none: a linked pair never has its
    /// link flag dangle onto an unrelated SQE), submitting what is queued
    /// first when they do not fit. On an error none of them was queued.
    ///
    /// # Safety
    ///
    /// Every memory an entry names (a buffer, an iovec array and the
    /// memory its iovecs describe, a timespec) must stay valid for the
    /// kernel's access (mapped; writable, and reached through no Rust
    /// reference, where the kernel writes) until that entry's completion
    /// has been reaped; entries of ops in slots must carry their slot's
    /// index as `user_data`, others [`INTERNAL`]. The driver's Drop waits
    /// for every completion (see `teardown.rs`), so memory the driver owns
    /// (slot buffers, timespecs, iovec arrays, regions) meets this by
    /// staying in the driver until `reap` takes the op's completion.
    unsafe fn push_all(&mut self, entries: &[squeue::Entry]) -> Result<(), DriverError> {
        loop {
            // SAFETY: the caller's contract.
            let pushed = unsafe { self.ring.submission().push_multiple(entries) };
            if pushed.is_ok() {
                self.queued += entries.len();
                return Ok(());
            }
            if self.ring.submission().capacity() < entries.len() {
                return Err(DriverError::Submit(io::Error::from_raw_os_error(
                    libc::EINVAL,
                )));
            }
            self.submit()?;
        }
    }

    /// [`Driver::push_all`] of one entry.
    ///
    /// # Safety
    ///
    /// As for [`Driver::push_all`].
    unsafe fn push(&mut self, entry: &squeue::Entry) -> Result<(), DriverError> {
        // SAFETY: the caller's contract.
        unsafe { self.push_all(std::slice::from_ref(entry)) }
    }

    /// Registers `fds` as fixed files (index = position).
    pub fn register_files(&mut self, fds: &[RawFd]) -> Result<(), DriverError> {
        let _ = self.ring.submitter().unregister_files();
        self.ring
            .submitter()
            .register_files(fds)
            .map_err(DriverError::Register)
    }

    /// Submits everything queued; returns how many were submitted. With
    /// nothing queued it only takes the completions posted meanwhile,
    /// without a system call (a serving thread calls this after each pass,
    /// most often with nothing new to submit), unless the kernel holds
    /// completions back for want of room in the completion queue, which
    /// only an enter flushes. (Task work needs no enter on this ring: it
    /// is set up without COOP_TASKRUN or DEFER_TASKRUN, so the kernel
    /// runs it on the thread's next return to user space. A ring with
    /// DEFER_TASKRUN would need IORING_SETUP_TASKRUN_FLAG for the
    /// `taskrun` test below to see it.)
    pub fn submit(&mut self) -> Result<usize, DriverError> {
        let idle = {
            let sq = self.ring.submission();
            sq.is_empty() && !sq.cq_overflow() && !sq.taskrun()
        };
        let n = if idle {
            0
        } else {
            let n = self.ring.submit().map_err(DriverError::Submit)?;
            self.sync_queued();
            n
        };
        self.reap();
        Ok(n)
    }

    /// What is still queued after a submit: an io_uring_enter may take
    /// fewer SQEs than were queued (the kernel stops at one it cannot
    /// take), and the rest must go with the next submit, not be forgotten.
    fn sync_queued(&mut self) {
        self.queued = self.ring.submission().len();
    }

    /// Moves every available completion into its slot.
    fn reap(&mut self) {
        let done: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (ud, res) in done {
            if ud == INTERNAL {
                continue;
            }
            let idx = ud as usize;
            let Some(slot) = self.slots.get_mut(idx) else {
                continue;
            };
            if let Slot::InFlight { buf, forgotten, .. } = slot {
                // The kernel is done with the op's iovec array.
                self.iov_store.remove(&idx);
                if *forgotten {
                    // The parked buffer can go now, and a started op's
                    // records with it, before the slot can hold another.
                    self.drop_started(idx);
                    self.release(idx);
                } else {
                    let buf = buf.take();
                    *slot = Slot::Done { res, buf };
                }
            }
        }
    }

    fn check(&self, id: OpId) -> Result<(), DriverError> {
        match self.gens.get(id.idx) {
            Some(g)
                if *g == id.gen
                    && !matches!(
                        self.slots[id.idx],
                        Slot::Free
                            | Slot::InFlight {
                                forgotten: true,
                                ..
                            }
                    ) =>
            {
                Ok(())
            }
            _ => Err(DriverError::UnknownOp),
        }
    }

    /// The completion of `id` if it has arrived (does not block).
    pub fn try_complete(&mut self, id: OpId) -> Result<Option<Completion>, DriverError> {
        self.check(id)?;
        self.submit()?;
        Ok(self.take(id))
    }

    fn take(&mut self, id: OpId) -> Option<Completion> {
        if !matches!(self.slots[id.idx], Slot::Done { .. }) {
            return None;
        }
        let Slot::Done { res, buf } = std::mem::replace(&mut self.slots[id.idx], Slot::Free) else {
            return None;
        };
        self.free.push(id.idx);
        Some(Completion {
            result: result(res),
            buf,
        })
    }

    /// Waits for `id` (submitting what is queued).
    pub fn wait(&mut self, id: OpId) -> Result<Completion, DriverError> {
        self.check(id)?;
        loop {
            if let Slot::Done { .. } = self.slots[id.idx] {
                // `take` cannot fail on a Done slot.
                if let Some(c) = self.take(id) {
                    return Ok(c);
                }
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(DriverError::Submit(e)),
            }
            self.sync_queued();
            self.reap();
        }
    }

    /// Gives up on `id`: its buffer stays parked in the driver until the
    /// kernel's completion arrives, then it is freed.
    pub fn forget(&mut self, id: OpId) {
        if self.check(id).is_err() {
            return;
        }
        match &mut self.slots[id.idx] {
            Slot::InFlight { forgotten, .. } => *forgotten = true,
            Slot::Done { .. } => {
                self.drop_started(id.idx);
                self.release(id.idx);
            }
            Slot::Free => {}
        }
    }

    /// Cancels every in-flight op carrying `key` (ASYNC_CANCEL). Returns
    /// how many cancellations were requested; each op still completes
    /// (with ECANCELED, or its result if it finished first).
    pub fn cancel(&mut self, key: u64) -> Result<usize, DriverError> {
        let targets: Vec<usize> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(s, Slot::InFlight { key: k, .. } if *k == key))
            .map(|(i, _)| i)
            .collect();
        if !self.supported.cancel {
            return Ok(0);
        }
        for &i in &targets {
            // SAFETY: a cancel names no memory, only the user_data of the
            // op it cancels.
            unsafe { self.push(&cancel_entry(i)) }?;
        }
        self.submit()?;
        Ok(targets.len())
    }
}

/// The SQE that cancels the op in slot `idx`.
fn cancel_entry(idx: usize) -> squeue::Entry {
    opcode::AsyncCancel::new(idx as u64)
        .build()
        .user_data(INTERNAL)
}

fn result(res: i32) -> io::Result<usize> {
    if res < 0 {
        Err(io::Error::from_raw_os_error(-res))
    } else {
        Ok(res as usize)
    }
}

fn driver_io(e: DriverError) -> io::Error {
    match e {
        DriverError::Setup(e) | DriverError::Register(e) | DriverError::Submit(e) => e,
        other => io::Error::other(other),
    }
}

/// Failed io_uring_enter calls (each followed by a 1 ms sleep) after which
/// the ring counts as broken.
const MAX_FAILURES: u32 = 1000;

/// An io_uring_enter failure to retry at once (a signal, or the kernel
/// short of room for completions for a moment).
fn transient(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
    )
}
