//! Vectored reads and writes on memory the driver does not own (a client's
//! mapped memory, such as guest RAM): like `read_into`, they wait for the
//! completion, so the kernel never holds the memory beyond the call.

use super::{result, Driver, Target};
use io_uring::{opcode, types};
use std::io;

/// At most this many iovecs per call (the kernel's UIO_MAXIOV).
pub const MAX_IOVECS: usize = 1024;

impl Driver {
    /// Reads at `offset` into the memory `iovs` describes (IORING_OP_READV,
    /// or preadv without one), waiting for the completion. `key` names the
    /// op for [`Driver::cancel`].
    ///
    /// # Safety
    ///
    /// Every iovec must describe mapped, writable memory that no Rust
    /// reference points into, mapped until this returns.
    pub unsafe fn readv_raw(
        &mut self,
        t: Target,
        iovs: &[libc::iovec],
        offset: u64,
        key: u64,
    ) -> io::Result<usize> {
        let n = iovs.len().min(MAX_IOVECS) as u32;
        if !self.supported.read {
            // SAFETY: the caller's contract on `iovs`.
            return unsafe { raw_rw(t, &iovs[..n as usize], offset, false) };
        }
        let e = match t {
            Target::Fd(fd) => opcode::Readv::new(types::Fd(fd), iovs.as_ptr(), n),
            Target::Fixed(i) => opcode::Readv::new(types::Fixed(i), iovs.as_ptr(), n),
        };
        // `blocking` waits for the completion: the iovec array (borrowed
        // here) and the memory it names (the caller's contract) outlive it.
        self.blocking(e.offset(offset).build(), key)
    }

    /// Writes from the memory `iovs` describes at `offset`
    /// (IORING_OP_WRITEV, or pwritev), waiting for the completion.
    ///
    /// # Safety
    ///
    /// Every iovec must describe mapped, readable memory, mapped until this
    /// returns.
    pub unsafe fn writev_raw(
        &mut self,
        t: Target,
        iovs: &[libc::iovec],
        offset: u64,
        key: u64,
    ) -> io::Result<usize> {
        let n = iovs.len().min(MAX_IOVECS) as u32;
        if !self.supported.write {
            // SAFETY: the caller's contract on `iovs`.
            return unsafe { raw_rw(t, &iovs[..n as usize], offset, true) };
        }
        let e = match t {
            Target::Fd(fd) => opcode::Writev::new(types::Fd(fd), iovs.as_ptr(), n),
            Target::Fixed(i) => opcode::Writev::new(types::Fixed(i), iovs.as_ptr(), n),
        };
        self.blocking(e.offset(offset).build(), key)
    }
}

/// preadv(2) into the memory `iovs` describes.
///
/// # Safety
///
/// As for [`Driver::readv_raw`].
pub unsafe fn preadv_raw(
    fd: std::os::fd::RawFd,
    iovs: &[libc::iovec],
    offset: u64,
) -> io::Result<usize> {
    // SAFETY: the caller's contract on `iovs`.
    unsafe { raw_rw(Target::Fd(fd), iovs, offset, false) }
}

/// pwritev(2) from the memory `iovs` describes.
///
/// # Safety
///
/// As for [`Driver::writev_raw`].
pub unsafe fn pwritev_raw(
    fd: std::os::fd::RawFd,
    iovs: &[libc::iovec],
    offset: u64,
) -> io::Result<usize> {
    // SAFETY: the caller's contract on `iovs`.
    unsafe { raw_rw(Target::Fd(fd), iovs, offset, true) }
}

/// # Safety
///
/// `iovs` must describe mapped memory, writable unless `write`.
unsafe fn raw_rw(t: Target, iovs: &[libc::iovec], offset: u64, write: bool) -> io::Result<usize> {
    let Target::Fd(fd) = t else {
        // Registered files exist only inside io_uring.
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    };
    let n = iovs.len().min(MAX_IOVECS) as libc::c_int;
    let off = offset as libc::off_t;
    let r = if write {
        // SAFETY: `iovs` is a valid array of `n` iovecs, each naming mapped
        // readable memory (the caller's contract); pwritev only reads it.
        unsafe { libc::pwritev(fd, iovs.as_ptr(), n, off) }
    } else {
        // SAFETY: as above, and the memory is writable and not a Rust
        // object, so the kernel may store into it.
        unsafe { libc::preadv(fd, iovs.as_ptr(), n, off) }
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        result(r.min(i32::MAX as isize) as i32)
    }
}
