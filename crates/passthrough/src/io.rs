//! Data I/O of the passthrough served synchronously: READ and WRITE go straight
//! between the request's buffer and the host file through an io_uring
//! [`Driver`] taken from the filesystem's pool for the call (made when none
//! is free, given back after; its ops are cancellable by FUSE_INTERRUPT
//! through the cancel registry). With no ring to be had (or io_uring off)
//! pread/pwrite do it, and so do files that cannot do non-blocking I/O
//! (tmpfs on 6.18): io_uring would hand each of their ops to an io-wq
//! worker thread, far slower than pread for small reads. Buffered writes
//! are punted even on ext4, so only O_DIRECT writes use the ring
//! (docs/BENCHMARKS.md, "host-io driver (criterion)").

use fuse_core::locks::lock;
use fuse_core::Errno;
use host_io::{Driver, Target};
use std::os::fd::RawFd;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

/// The filesystem's I/O state: how data I/O was done ([read, write] x
/// [io_uring, syscall]), the ops in flight by request unique, for
/// FUSE_INTERRUPT, and the rings of the I/O served synchronously.
#[derive(Debug, Default)]
pub struct IoStats {
    counts: [[std::sync::atomic::AtomicU64; 2]; 2],
    /// [read, write] through the client's registered memory map.
    fixed: [std::sync::atomic::AtomicU64; 2],
    /// Syncs started on a serving thread's ring (not waited for).
    syncs_started: std::sync::atomic::AtomicU64,
    /// FALLOCATEs started so.
    allocs_started: std::sync::atomic::AtomicU64,
    /// READs copied out of a mapping of the file.
    mapped: std::sync::atomic::AtomicU64,
    /// Mapped READs a SIGBUS stopped (then read the usual way).
    mapped_faults: std::sync::atomic::AtomicU64,
    /// READs started on a ring with no synchronous try (`cold.rs`).
    cold_skips: std::sync::atomic::AtomicU64,
    /// Ops in flight on the workers' rings, by request unique.
    pub cancels: std::sync::Arc<host_io::CancelRegistry>,
    /// Rings free for I/O served synchronously (each taken for one call).
    drivers: Mutex<Vec<Driver>>,
    /// A ring could not be set up: synchronous I/O goes through syscalls.
    no_ring: AtomicBool,
}

impl IoStats {
    pub(super) fn count(&self, write: bool, uring: bool) {
        self.counts[usize::from(write)][usize::from(!uring)]
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    pub(super) fn count_fixed(&self, write: bool) {
        self.fixed[usize::from(write)].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    pub(super) fn count_mapped(&self) {
        self.mapped
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    pub(super) fn count_mapped_fault(&self) {
        self.mapped_faults
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    pub(super) fn count_cold_skip(&self) {
        self.cold_skips
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    pub(super) fn count_sync_started(&self) {
        self.syncs_started
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    pub(super) fn count_alloc_started(&self) {
        self.allocs_started
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    /// A snapshot.
    pub fn get(&self) -> IoCounts {
        let g = |w: usize, u: usize| self.counts[w][u].load(std::sync::atomic::Ordering::Relaxed);
        let f = |w: usize| self.fixed[w].load(std::sync::atomic::Ordering::Relaxed);
        IoCounts {
            read_uring: g(0, 0),
            read_syscall: g(0, 1),
            write_uring: g(1, 0),
            write_syscall: g(1, 1),
            read_fixed: f(0),
            write_fixed: f(1),
            syncs_started: self
                .syncs_started
                .load(std::sync::atomic::Ordering::Relaxed),
            allocs_started: self
                .allocs_started
                .load(std::sync::atomic::Ordering::Relaxed),
            read_mapped: self.mapped.load(std::sync::atomic::Ordering::Relaxed),
            read_mapped_faults: self
                .mapped_faults
                .load(std::sync::atomic::Ordering::Relaxed),
            read_cold_skips: self.cold_skips.load(std::sync::atomic::Ordering::Relaxed),
        }
    }
}

/// Data reads and writes done so far, by path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IoCounts {
    /// Reads through io_uring.
    pub read_uring: u64,
    /// Reads through pread.
    pub read_syscall: u64,
    /// Writes through io_uring.
    pub write_uring: u64,
    /// Writes through pwrite.
    pub write_syscall: u64,
    /// Of the reads through io_uring, those straight into the client's
    /// registered memory (READ_FIXED, READV_FIXED).
    pub read_fixed: u64,
    /// Of the writes through io_uring, those from the client's registered
    /// memory (WRITE_FIXED, WRITEV_FIXED).
    pub write_fixed: u64,
    /// FSYNCs and FSYNCDIRs started on a serving thread's ring, not
    /// waited for.
    pub syncs_started: u64,
    /// FALLOCATEs started so.
    pub allocs_started: u64,
    /// READs copied out of a shared mapping of the file (counted apart
    /// from the others).
    pub read_mapped: u64,
    /// Mapped READs a SIGBUS stopped (a host truncation; then read the
    /// usual way and counted there).
    pub read_mapped_faults: u64,
    /// Of the reads through io_uring, those started with no synchronous
    /// try of the page cache first: their handle's reads kept finding
    /// nothing cached.
    pub read_cold_skips: u64,
}

pub(super) fn errno(e: std::io::Error) -> Errno {
    match e.raw_os_error() {
        // Cancelled by FUSE_INTERRUPT: the interrupted request's answer.
        Some(libc::ECANCELED) => Errno::EINTR,
        Some(n) => Errno(n),
        None => Errno::EIO,
    }
}

/// Entries of each ring.
pub(super) const RING_ENTRIES: u32 = 64;

/// Runs `f` on a ring of the pool (taken for the call: `f` waits for its
/// ops), or returns None when there is none to be had. Its ops are
/// recorded in `io.cancels`.
pub(super) fn with_driver<T>(
    uring: bool,
    io: &IoStats,
    f: impl FnOnce(&mut Driver) -> T,
) -> Option<T> {
    use std::sync::atomic::Ordering::Relaxed;
    if !uring || io.no_ring.load(Relaxed) {
        return None;
    }
    let free = lock(&io.drivers).pop();
    let mut d = match free {
        Some(d) => d,
        None => match Driver::new(RING_ENTRIES) {
            Ok(mut d) => {
                d.set_cancel_registry(io.cancels.clone());
                d
            }
            Err(_) => {
                io.no_ring.store(true, Relaxed);
                return None;
            }
        },
    };
    let r = f(&mut d);
    lock(&io.drivers).push(d);
    Some(r)
}

/// Reads at `off` until `buf` is full or end of file.
pub fn read_full(
    uring: bool,
    fd: RawFd,
    buf: &mut [u8],
    off: u64,
    key: u64,
    stats: &IoStats,
) -> Result<usize, Errno> {
    let len = buf.len();
    repeat(len, off, |done, at| {
        let dst = &mut buf[done..];
        match with_driver(uring, stats, |d| d.read_into(Target::Fd(fd), dst, at, key)) {
            Some(r) => {
                stats.count(false, true);
                r
            }
            None => {
                stats.count(false, false);
                host_io::pread(fd, dst, at)
            }
        }
    })
}

/// Runs `op(done, offset)` until `len` bytes are done, end of file (0), or
/// an error (returned only if nothing was done; EINTR is retried).
pub(super) fn repeat(
    len: usize,
    off: u64,
    mut op: impl FnMut(usize, u64) -> std::io::Result<usize>,
) -> Result<usize, Errno> {
    let mut done = 0;
    while done < len {
        let at = off.checked_add(done as u64).ok_or(Errno::EINVAL)?;
        match op(done, at) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(_) if done > 0 => break,
            Err(e) => return Err(errno(e)),
        }
    }
    Ok(done)
}

/// Writes all of `buf` at `off` (a short count only if the host stops).
pub fn write_full(
    uring: bool,
    fd: RawFd,
    buf: &[u8],
    off: u64,
    key: u64,
    stats: &IoStats,
) -> Result<usize, Errno> {
    repeat(buf.len(), off, |done, at| {
        let src = &buf[done..];
        match with_driver(uring, stats, |d| d.write_from(Target::Fd(fd), src, at, key)) {
            Some(r) => {
                stats.count(true, true);
                r
            }
            None => {
                stats.count(true, false);
                host_io::pwrite(fd, src, at)
            }
        }
    })
}

/// fsync/fdatasync through the ring.
pub fn fsync(uring: bool, fd: RawFd, datasync: bool, key: u64, io: &IoStats) -> Result<(), Errno> {
    match with_driver(uring, io, |d| d.fsync(Target::Fd(fd), datasync, key)) {
        Some(r) => r.map(drop).map_err(errno),
        None => host_io::sys::fsync(fd, datasync),
    }
}

/// Alignment O_DIRECT needs of memory (the largest logical block size).
pub(super) const DIO_ALIGN: usize = 4096;

/// A buffer of `len` bytes whose start is aligned for O_DIRECT.
fn aligned(len: usize) -> (Vec<u8>, usize) {
    let v = vec![0u8; len + DIO_ALIGN];
    let off = v.as_ptr().align_offset(DIO_ALIGN).min(DIO_ALIGN);
    (v, off)
}

fn misaligned(p: *const u8) -> bool {
    p.align_offset(DIO_ALIGN) != 0
}

/// [`read_full`] for a file opened O_DIRECT: the request's buffer sits
/// wherever the transport put it, so a misaligned one goes through an
/// aligned bounce buffer.
pub fn read_direct(
    uring: bool,
    fd: RawFd,
    buf: &mut [u8],
    off: u64,
    key: u64,
    stats: &IoStats,
) -> Result<usize, Errno> {
    if !misaligned(buf.as_ptr()) {
        return read_full(uring, fd, buf, off, key, stats);
    }
    let (mut v, a) = aligned(buf.len());
    let n = read_full(uring, fd, &mut v[a..a + buf.len()], off, key, stats)?;
    buf[..n].copy_from_slice(&v[a..a + n]);
    Ok(n)
}

/// [`write_full`] for a file opened O_DIRECT (see [`read_direct`]).
pub fn write_direct(
    uring: bool,
    fd: RawFd,
    buf: &[u8],
    off: u64,
    key: u64,
    stats: &IoStats,
) -> Result<usize, Errno> {
    if !misaligned(buf.as_ptr()) {
        return write_full(uring, fd, buf, off, key, stats);
    }
    let (mut v, a) = aligned(buf.len());
    v[a..a + buf.len()].copy_from_slice(buf);
    write_full(uring, fd, &v[a..a + buf.len()], off, key, stats)
}
