//! A small io_uring driver for one worker thread.
//!
//! - An operation owns its buffer from submission until its completion: the
//!   buffer lives in the driver's slot table (indexed by `user_data`), not
//!   with the caller. A caller that gives up on an op ([`Driver::forget`])
//!   leaves the buffer parked there until the CQE arrives.
//! - Dropping the driver cancels everything in flight and drains the
//!   completions before the ring and its buffers are freed.
//! - Submissions are batched: ops are queued and submitted together by
//!   [`Driver::submit`] or when waiting.
//! - At start-up the driver probes the opcodes it uses and falls back to
//!   the plain syscall (pread/pwrite) where one is missing.
//! - Fixed buffers: memory regions owned by the driver are registered once
//!   (in pieces of at most 1 GiB) for READ_FIXED/WRITE_FIXED; or a
//!   client's memory map (guest RAM), for READ(V)_FIXED/WRITE(V)_FIXED
//!   straight into it; fixed files.
//! - An op carries a key (the FUSE request's unique): [`Driver::cancel`]
//!   cancels every op with that key (ASYNC_CANCEL); an op may carry a
//!   deadline (a linked LINK_TIMEOUT).

mod personality;
mod started;
mod vectored;
pub use vectored::{preadv_raw, pwritev_raw, MAX_IOVECS};

use io_uring::{opcode, squeue, types, IoUring, Probe};
use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

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
    },
    Done {
        res: i32,
        buf: Option<Vec<u8>>,
    },
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
    cancels: Option<std::sync::Arc<crate::cancel::CancelRegistry>>,
    /// Started ops (see `started.rs`): their ids and keys, and the iovec
    /// arrays the kernel reads until each completes (by slot).
    started: Vec<(OpId, u64)>,
    iov_store: fuse_core::fasthash::IdMap<usize, Box<[libc::iovec]>>,
    /// Unique among this process's drivers (see `personality.rs`).
    serial: u64,
}

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
        // 4 per CPU, held 16 FSYNCs in flight on this 2-CPU host to 8 at a
        // time (the device's syncwrite-16 row: 1.2-1.4x ops/s with 32,
        // 1.1-1.3x more with 64; docs/BENCHMARKS.md). Best effort: the
        // limit is per thread (its io-wq), unbounded work keeps its own.
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
        self.cancels = Some(registry);
    }

    /// What the probe found.
    pub fn supported(&self) -> Supported {
        self.supported
    }

    /// Pretends the kernel lacks every opcode, so the syscall fallbacks run
    /// (for tests of those paths).
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

    /// Queues `entry`, flushing the queue first when it is full.
    fn push(&mut self, entry: &squeue::Entry) -> Result<(), DriverError> {
        loop {
            // SAFETY: every buffer or timespec an entry points to is owned by
            // this driver's slot table (or its registered regions) and stays
            // there, unmoved on the heap, until the entry's completion has
            // been reaped; the driver's Drop drains all completions first.
            let pushed = unsafe { self.ring.submission().push(entry) };
            if pushed.is_ok() {
                self.queued += 1;
                return Ok(());
            }
            self.submit()?;
        }
    }

    fn with_deadline(
        &mut self,
        id: OpId,
        mut entry: squeue::Entry,
        deadline: Option<Duration>,
    ) -> Result<OpId, DriverError> {
        entry = entry.user_data(id.idx as u64);
        match deadline.filter(|_| self.supported.link_timeout) {
            Some(d) => {
                let ts = Box::new(
                    types::Timespec::new()
                        .sec(d.as_secs())
                        .nsec(d.subsec_nanos()),
                );
                let ptr: *const types::Timespec = &*ts;
                if let Slot::InFlight { timeout, .. } = &mut self.slots[id.idx] {
                    *timeout = Some(ts);
                }
                self.push(&entry.flags(squeue::Flags::IO_LINK))?;
                self.push(&opcode::LinkTimeout::new(ptr).build().user_data(INTERNAL))?;
            }
            None => self.push(&entry)?,
        }
        Ok(id)
    }

    /// Reads `buf.len()` bytes at `offset` into `buf` (which the op owns
    /// until it completes). `key` names the op for [`Driver::cancel`].
    pub fn read(
        &mut self,
        t: Target,
        buf: Vec<u8>,
        offset: u64,
        key: u64,
        deadline: Option<Duration>,
    ) -> Result<OpId, DriverError> {
        self.owned(Dir::Read, t, buf, offset, key, deadline)
    }

    /// Writes `buf` at `offset` (the op owns `buf` until it completes).
    pub fn write(
        &mut self,
        t: Target,
        buf: Vec<u8>,
        offset: u64,
        key: u64,
        deadline: Option<Duration>,
    ) -> Result<OpId, DriverError> {
        self.owned(Dir::Write, t, buf, offset, key, deadline)
    }

    fn supports(&self, dir: Dir, fixed: bool) -> bool {
        let s = self.supported;
        match (dir, fixed) {
            (Dir::Read, false) => s.read,
            (Dir::Write, false) => s.write,
            (Dir::Read, true) => s.read_fixed,
            (Dir::Write, true) => s.write_fixed,
        }
    }

    fn owned(
        &mut self,
        dir: Dir,
        t: Target,
        mut buf: Vec<u8>,
        offset: u64,
        key: u64,
        deadline: Option<Duration>,
    ) -> Result<OpId, DriverError> {
        if !self.supports(dir, false) {
            let res = fallback(dir, t, &mut buf, offset);
            return Ok(self.alloc(Slot::Done {
                res,
                buf: Some(buf),
            }));
        }
        let (ptr, len) = (buf.as_mut_ptr(), buf.len() as u32);
        let id = self.alloc(Slot::InFlight {
            buf: Some(buf),
            key,
            timeout: None,
            forgotten: false,
        });
        self.with_deadline(id, build(dir, t, ptr, len, offset, None), deadline)
    }

    #[allow(clippy::too_many_arguments)]
    fn fixed(
        &mut self,
        dir: Dir,
        t: Target,
        index: u16,
        off: usize,
        len: usize,
        offset: u64,
        key: u64,
    ) -> Result<OpId, DriverError> {
        let ptr = self.fixed_ptr(index, off, len)?;
        if !self.supports(dir, true) {
            let res = fallback(
                dir,
                t,
                &mut self.regions[usize::from(index)][off..off + len],
                offset,
            );
            return Ok(self.alloc(Slot::Done { res, buf: None }));
        }
        let id = self.alloc(Slot::InFlight {
            buf: None,
            key,
            timeout: None,
            forgotten: false,
        });
        self.with_deadline(
            id,
            build(dir, t, ptr, len as u32, offset, Some(index)),
            None,
        )
    }

    /// Allocates regions of `sizes` bytes (each split into pieces of at most
    /// 1 GiB) and registers them as fixed buffers. Returns the index of the
    /// first piece of each region. Replaces earlier registrations.
    pub fn register_regions(&mut self, sizes: &[usize]) -> Result<Vec<u16>, DriverError> {
        if self.in_flight() != 0 {
            return Err(DriverError::Register(io::Error::from_raw_os_error(
                libc::EBUSY,
            )));
        }
        let _ = self.ring.submitter().unregister_buffers();
        self.client_map = None;
        let mut regions = Vec::new();
        let mut firsts = Vec::new();
        for &size in sizes {
            firsts.push(regions.len() as u16);
            let mut left = size;
            while left > 0 {
                let n = left.min(MAX_REGION);
                regions.push(vec![0u8; n].into_boxed_slice());
                left -= n;
            }
        }
        let iovecs: Vec<libc::iovec> = regions
            .iter_mut()
            .map(|r| libc::iovec {
                iov_base: r.as_mut_ptr().cast(),
                iov_len: r.len(),
            })
            .collect();
        // SAFETY: the regions are owned by the driver (boxed slices, never
        // moved or freed while registered: they are replaced only after
        // unregistering, and the ring is dropped before them).
        unsafe { self.ring.submitter().register_buffers(&iovecs) }
            .map_err(DriverError::Register)?;
        self.regions = regions;
        Ok(firsts)
    }

    /// A registered region.
    pub fn region(&self, index: u16) -> Option<&[u8]> {
        self.regions.get(usize::from(index)).map(|r| &r[..])
    }

    /// A registered region, for filling before a WRITE_FIXED. Do not touch
    /// a range an op in flight uses.
    pub fn region_mut(&mut self, index: u16) -> Option<&mut [u8]> {
        self.regions.get_mut(usize::from(index)).map(|r| &mut r[..])
    }

    fn fixed_ptr(&mut self, index: u16, off: usize, len: usize) -> Result<*mut u8, DriverError> {
        let end = off.saturating_add(len);
        let r = self
            .regions
            .get_mut(usize::from(index))
            .filter(|r| end <= r.len());
        let r = r.ok_or(DriverError::BadFixed { index, off, end })?;
        Ok(r[off..end].as_mut_ptr())
    }

    /// READ_FIXED of `len` bytes at file `offset` into region `index` at `off`.
    pub fn read_fixed(
        &mut self,
        t: Target,
        index: u16,
        off: usize,
        len: usize,
        offset: u64,
        key: u64,
    ) -> Result<OpId, DriverError> {
        self.fixed(Dir::Read, t, index, off, len, offset, key)
    }

    /// WRITE_FIXED of `len` bytes from region `index` at `off` to file `offset`.
    pub fn write_fixed(
        &mut self,
        t: Target,
        index: u16,
        off: usize,
        len: usize,
        offset: u64,
        key: u64,
    ) -> Result<OpId, DriverError> {
        self.fixed(Dir::Write, t, index, off, len, offset, key)
    }

    /// Registers `fds` as fixed files (index = position).
    pub fn register_files(&mut self, fds: &[RawFd]) -> Result<(), DriverError> {
        let _ = self.ring.submitter().unregister_files();
        self.ring
            .submitter()
            .register_files(fds)
            .map_err(DriverError::Register)
    }

    /// Submits everything queued; returns how many were submitted.
    pub fn submit(&mut self) -> Result<usize, DriverError> {
        let n = self.ring.submit().map_err(DriverError::Submit)?;
        self.sync_queued();
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
                    // The parked buffer can go now.
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
        if self.queued > 0 {
            self.submit()?;
        } else {
            self.reap();
        }
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

    /// Reads into a borrowed buffer: submits and waits for the completion
    /// before returning, so the kernel never holds the borrow beyond it.
    pub fn read_into(
        &mut self,
        t: Target,
        buf: &mut [u8],
        offset: u64,
        key: u64,
    ) -> io::Result<usize> {
        if !self.supported.read {
            return result(fallback(Dir::Read, t, buf, offset));
        }
        let len = buf.len().min(u32::MAX as usize) as u32;
        self.blocking(
            build(Dir::Read, t, buf.as_mut_ptr(), len, offset, None),
            key,
        )
    }

    /// Writes from a borrowed buffer, waiting for the completion.
    pub fn write_from(
        &mut self,
        t: Target,
        buf: &[u8],
        offset: u64,
        key: u64,
    ) -> io::Result<usize> {
        if !self.supported.write {
            return result(syscall_write(t, buf, offset));
        }
        let len = buf.len().min(u32::MAX as usize) as u32;
        // The kernel only reads through this pointer for a write.
        let ptr = buf.as_ptr().cast_mut();
        self.blocking(build(Dir::Write, t, ptr, len, offset, None), key)
    }

    /// fsync (or fdatasync) through the ring, waiting for the completion.
    pub fn fsync(&mut self, t: Target, datasync: bool, key: u64) -> io::Result<usize> {
        self.blocking(started::fsync_entry(t, datasync), key)
    }

    /// Submits `entry`, which points into memory the caller borrows, and
    /// waits for its completion. Once the entry is queued this function
    /// does not return before the kernel is done with that memory.
    fn blocking(&mut self, entry: squeue::Entry, key: u64) -> io::Result<usize> {
        // Not queued: the kernel never saw the pointer.
        let id = self.queue_entry(entry, key).map_err(driver_io)?;
        let ring_fd = std::os::fd::AsRawFd::as_raw_fd(&self.ring);
        let cancels = self.cancels.clone();
        if let Some(r) = &cancels {
            r.enter(key, ring_fd, id.idx as u64);
        }
        let mut failures = 0;
        loop {
            if let Some(c) = self.take(id) {
                if let Some(r) = &cancels {
                    r.leave(key, ring_fd, id.idx as u64);
                }
                return c.result;
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => self.sync_queued(),
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                    ) => {}
                Err(e) => {
                    failures += 1;
                    if failures > 1000 {
                        // The entry may still be in the ring with a pointer
                        // into the caller's borrow: returning would let the
                        // kernel write into freed memory.
                        eprintln!("uring-ring: io_uring_enter keeps failing ({e}); aborting");
                        std::process::abort();
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
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
            Slot::Done { .. } => self.release(id.idx),
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
            self.push(
                &opcode::AsyncCancel::new(i as u64)
                    .build()
                    .user_data(INTERNAL),
            )?;
        }
        self.submit()?;
        Ok(targets.len())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    Read,
    Write,
}

/// The SQE for a read or write, plain or fixed, on a plain or fixed file.
fn build(
    dir: Dir,
    t: Target,
    ptr: *mut u8,
    len: u32,
    offset: u64,
    fixed: Option<u16>,
) -> squeue::Entry {
    macro_rules! on {
        ($fd:expr) => {
            match (dir, fixed) {
                (Dir::Read, None) => opcode::Read::new($fd, ptr, len).offset(offset).build(),
                (Dir::Write, None) => opcode::Write::new($fd, ptr, len).offset(offset).build(),
                (Dir::Read, Some(i)) => opcode::ReadFixed::new($fd, ptr, len, i)
                    .offset(offset)
                    .build(),
                (Dir::Write, Some(i)) => opcode::WriteFixed::new($fd, ptr, len, i)
                    .offset(offset)
                    .build(),
            }
        };
    }
    match t {
        Target::Fd(fd) => on!(types::Fd(fd)),
        Target::Fixed(i) => on!(types::Fixed(i)),
    }
}

/// The syscall path for a kernel without the opcode.
fn fallback(dir: Dir, t: Target, buf: &mut [u8], offset: u64) -> i32 {
    match t {
        Target::Fd(fd) => syscall_rw(fd, buf, offset, dir == Dir::Write),
        // Registered files exist only inside io_uring.
        Target::Fixed(_) => -libc::EBADF,
    }
}

/// pread(2), for callers without a ring.
pub fn pread(fd: RawFd, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    result(syscall_rw(fd, buf, offset, false))
}

/// pwrite(2), for callers without a ring.
pub fn pwrite(fd: RawFd, buf: &[u8], offset: u64) -> io::Result<usize> {
    result(syscall_write(Target::Fd(fd), buf, offset))
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

/// pwrite from a shared buffer; returns bytes or a negative errno.
fn syscall_write(t: Target, buf: &[u8], offset: u64) -> i32 {
    let Target::Fd(fd) = t else {
        return -libc::EBADF;
    };
    // SAFETY: `buf` is a valid slice for the duration of the call and its
    // length is passed with it; pwrite only reads from it.
    let n = unsafe { libc::pwrite(fd, buf.as_ptr().cast(), buf.len(), offset as libc::off_t) };
    if n < 0 {
        -io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    } else {
        n as i32
    }
}

/// pread/pwrite fallback; returns bytes or a negative errno.
fn syscall_rw(fd: RawFd, buf: &mut [u8], offset: u64, write: bool) -> i32 {
    let off = offset as libc::off_t;
    // SAFETY: `buf` is a valid, exclusively borrowed slice for the duration
    // of the call and its length is passed with it.
    let n = unsafe {
        if write {
            libc::pwrite(fd, buf.as_ptr().cast(), buf.len(), off)
        } else {
            libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), off)
        }
    };
    if n < 0 {
        -io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    } else {
        n as i32
    }
}

impl Drop for Driver {
    /// Cancels what is in flight and drains every completion, so no buffer
    /// is freed while the kernel may still write to it.
    fn drop(&mut self) {
        let keys: Vec<usize> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(s, Slot::InFlight { .. }))
            .map(|(i, _)| i)
            .collect();
        for i in keys {
            // SAFETY: see `push`; a cancel entry points to no memory.
            let _ = unsafe {
                self.ring.submission().push(
                    &opcode::AsyncCancel::new(i as u64)
                        .build()
                        .user_data(INTERNAL),
                )
            };
        }
        while self.in_flight() > 0 {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(_) => break,
            }
            self.reap();
        }
    }
}
