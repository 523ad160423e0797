//! Ops on memory the driver owns: a buffer that moves into the op's slot
//! ([`Driver::read`], [`Driver::write`]) or a range of a region the driver
//! allocated and registered ([`Driver::read_fixed`],
//! [`Driver::write_fixed`]); and the syscall fallbacks for kernels without
//! the opcodes.

use super::{result, Driver, DriverError, OpId, Slot, Target, INTERNAL, MAX_REGION};
use io_uring::{opcode, squeue, types};
use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

impl Driver {
    /// Queues `entry` (with a linked LINK_TIMEOUT after `deadline`, where
    /// the kernel has one) for the op in slot `id`; on an error the slot is
    /// freed again (nothing was queued: the kernel never saw it).
    ///
    /// # Safety
    ///
    /// As for [`Driver::push_all`]: the memory `entry` names stays valid
    /// for the kernel until the op's completion is reaped (for this file's
    /// callers: the slot's own buffer, or a registered region, which is
    /// replaced only with no op in flight).
    unsafe fn queue_in_slot(
        &mut self,
        id: OpId,
        entry: squeue::Entry,
        deadline: Option<Duration>,
    ) -> Result<OpId, DriverError> {
        let entry = entry.user_data(id.idx as u64);
        let pushed = match deadline.filter(|_| self.supported.link_timeout) {
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
                let pair = [
                    entry.flags(squeue::Flags::IO_LINK),
                    opcode::LinkTimeout::new(ptr).build().user_data(INTERNAL),
                ];
                // SAFETY: the caller's contract for `entry`; the timespec
                // is boxed in the op's slot, unmoved on the heap until the
                // op's completion is reaped (the kernel reads it when it
                // takes the SQE).
                unsafe { self.push_all(&pair) }
            }
            // SAFETY: the caller's contract.
            None => unsafe { self.push(&entry) },
        };
        if let Err(e) = pushed {
            self.release(id.idx);
            return Err(e);
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
        // Moving the Vec into the slot leaves its heap buffer where it is.
        let id = self.alloc(Slot::in_flight(Some(buf), key));
        let entry = build(dir, t, ptr, len, offset, None);
        // SAFETY: `ptr` is the buffer now owned by the op's slot, which
        // keeps it until `reap` takes the op's completion.
        unsafe { self.queue_in_slot(id, entry, deadline) }
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
            // The syscall borrows the region as a slice: not while a fixed
            // op of the other direction (supported) uses it.
            let res = if self.region_busy(index) {
                -libc::EBUSY
            } else {
                fallback(
                    dir,
                    t,
                    &mut self.regions[usize::from(index)][off..off + len],
                    offset,
                )
            };
            return Ok(self.alloc(Slot::Done { res, buf: None }));
        }
        let id = self.alloc(Slot::InFlight {
            buf: None,
            key,
            timeout: None,
            forgotten: false,
            region: Some(index),
        });
        let entry = build(dir, t, ptr, len as u32, offset, Some(index));
        // SAFETY: `ptr` is inside registered region `index`, which the
        // driver owns; `register_regions` replaces regions only with no op
        // in flight, `region`/`region_mut` refuse it while this op uses it,
        // and Drop waits for the op before the regions are freed.
        unsafe { self.queue_in_slot(id, entry, None) }
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

    /// A registered region; None while a READ_FIXED/WRITE_FIXED on it is
    /// in flight (the kernel may be writing it: no Rust reference may
    /// alias that).
    pub fn region(&self, index: u16) -> Option<&[u8]> {
        if self.region_busy(index) {
            return None;
        }
        self.regions.get(usize::from(index)).map(|r| &r[..])
    }

    /// A registered region, for filling before a WRITE_FIXED; None while
    /// an op on it is in flight (as [`Driver::region`]).
    pub fn region_mut(&mut self, index: u16) -> Option<&mut [u8]> {
        if self.region_busy(index) {
            return None;
        }
        self.regions.get_mut(usize::from(index)).map(|r| &mut r[..])
    }

    /// Whether an op in flight uses region `index`.
    fn region_busy(&self, index: u16) -> bool {
        self.slots
            .iter()
            .any(|s| matches!(s, Slot::InFlight { region: Some(i), .. } if *i == index))
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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Dir {
    Read,
    Write,
}

/// The SQE for a read or write, plain or fixed, on a plain or fixed file.
pub(super) fn build(
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
pub(super) fn fallback(dir: Dir, t: Target, buf: &mut [u8], offset: u64) -> i32 {
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

/// pwrite from a shared buffer; returns bytes or a negative errno.
pub(super) fn syscall_write(t: Target, buf: &[u8], offset: u64) -> i32 {
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
