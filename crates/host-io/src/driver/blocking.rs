//! Ops on memory the caller borrows ([`Driver::read_into`],
//! [`Driver::write_from`]) or that names none ([`Driver::fsync`]): each is
//! submitted and waited for before the call returns, so the kernel never
//! holds the borrow beyond it.

use super::owned::{build, fallback, syscall_write, Dir};
use super::{driver_io, result, started, Driver, Target};
use io_uring::squeue;
use std::io;
use std::time::Duration;

impl Driver {
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
        let entry = build(Dir::Read, t, buf.as_mut_ptr(), len, offset, None);
        // SAFETY: `buf` is exclusively borrowed for this whole call, and
        // `blocking` does not return while the kernel may write it.
        unsafe { self.blocking(entry, key) }
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
        let entry = build(Dir::Write, t, ptr, len, offset, None);
        // SAFETY: `buf` is borrowed for this whole call (the kernel only
        // reads it), and `blocking` does not return while the kernel may
        // read it.
        unsafe { self.blocking(entry, key) }
    }

    /// fsync (or fdatasync) through the ring, waiting for the completion.
    pub fn fsync(&mut self, t: Target, datasync: bool, key: u64) -> io::Result<usize> {
        // SAFETY: an fsync names no memory.
        unsafe { self.blocking(started::fsync_entry(t, datasync), key) }
    }

    /// Submits `entry`, which points into memory the caller borrows, and
    /// waits for its completion. Once the entry is queued this function
    /// does not return before the kernel is done with that memory: it
    /// aborts the process instead if the ring keeps failing.
    ///
    /// # Safety
    ///
    /// The memory `entry` names (its buffer, or iovec array and the memory
    /// those describe) must stay valid for the kernel's access (mapped;
    /// writable and reached through no Rust reference where the kernel
    /// writes) until this returns. A caller meets that by borrowing it for
    /// the call.
    pub(super) unsafe fn blocking(&mut self, entry: squeue::Entry, key: u64) -> io::Result<usize> {
        // SAFETY: the caller's contract holds until this returns, and from
        // here on this function returns only once the op's completion has
        // been reaped. Not queued (an error): the kernel never saw it.
        let id = unsafe { self.queue_entry(entry, key) }.map_err(driver_io)?;
        let ring_fd = self.ring_fd();
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
                Err(e) if super::transient(&e) => {}
                Err(e) => {
                    failures += 1;
                    if failures > super::MAX_FAILURES {
                        // The entry may still be in the ring with a pointer
                        // into the caller's borrow: returning would let the
                        // kernel write into freed memory.
                        log::error!("io_uring_enter keeps failing ({e}); aborting");
                        std::process::abort();
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            self.reap();
        }
    }
}
