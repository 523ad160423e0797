//! Data I/O of the passthrough: each worker thread has its own io_uring
//! [`Driver`], made on first use; READ and WRITE go straight between the
//! request's buffer and the host file. A thread whose ring cannot be set up
//! (or with io_uring off) uses pread/pwrite, and so do files that cannot do
//! non-blocking I/O (tmpfs on 6.18): io_uring would hand each of their ops
//! to an io-wq worker thread, which measured 10x slower than pread for a
//! 4 KiB read (docs/BENCHMARKS.md).

use crate::{Driver, Target};
use fuse_core::Errno;
use std::cell::RefCell;
use std::os::fd::RawFd;

thread_local! {
    static DRIVER: RefCell<Option<Driver>> = const { RefCell::new(None) };
    static NO_RING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// How data I/O was done.
#[derive(Debug, Default)]
pub struct IoStats {
    /// Reads and writes through io_uring.
    pub uring: std::sync::atomic::AtomicU64,
    /// Reads and writes through pread/pwrite.
    pub syscall: std::sync::atomic::AtomicU64,
}

impl IoStats {
    fn count(&self, uring: bool) {
        let c = if uring { &self.uring } else { &self.syscall };
        c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

fn errno(e: std::io::Error) -> Errno {
    Errno(e.raw_os_error().unwrap_or(libc::EIO))
}

/// Runs `f` on this thread's driver, or returns None when there is none.
fn with_driver<T>(uring: bool, f: impl FnOnce(&mut Driver) -> T) -> Option<T> {
    if !uring || NO_RING.with(|n| n.get()) {
        return None;
    }
    DRIVER.with(|d| {
        let mut d = d.try_borrow_mut().ok()?;
        if d.is_none() {
            match Driver::new(64) {
                Ok(drv) => *d = Some(drv),
                Err(_) => {
                    NO_RING.with(|n| n.set(true));
                    return None;
                }
            }
        }
        d.as_mut().map(f)
    })
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
    let mut done = 0;
    while done < buf.len() {
        let dst = &mut buf[done..];
        let at = off + done as u64;
        let n = match with_driver(uring, |d| d.read_into(Target::Fd(fd), dst, at, key)) {
            Some(r) => {
                stats.count(true);
                r
            }
            None => {
                stats.count(false);
                crate::driver::pread(fd, dst, at)
            }
        };
        match n {
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
    let mut done = 0;
    while done < buf.len() {
        let src = &buf[done..];
        let at = off + done as u64;
        let n = match with_driver(uring, |d| d.write_from(Target::Fd(fd), src, at, key)) {
            Some(r) => {
                stats.count(true);
                r
            }
            None => {
                stats.count(false);
                crate::driver::pwrite(fd, src, at)
            }
        };
        match n {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(_) if done > 0 => break,
            Err(e) => return Err(errno(e)),
        }
    }
    Ok(done)
}

/// fsync/fdatasync through the ring.
pub fn fsync(uring: bool, fd: RawFd, datasync: bool, key: u64) -> Result<(), Errno> {
    match with_driver(uring, |d| d.fsync(Target::Fd(fd), datasync, key)) {
        Some(r) => r.map(drop).map_err(errno),
        None => super::sys::fsync(fd, datasync),
    }
}
