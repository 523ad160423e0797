//! Vectored reads and writes on memory the driver does not own (a client's
//! mapped memory, such as guest RAM): like `read_into`, they wait for the
//! completion, so the kernel never holds the memory beyond the call.
//!
//! A client's whole memory map can also be registered as this ring's fixed
//! buffers ([`Driver::register_client_map`]); ops whose iovecs lie in one
//! registered piece then go as READ_FIXED/WRITE_FIXED (one iovec) or
//! READV_FIXED/WRITEV_FIXED (several, Linux 6.15), and the kernel skips
//! pinning the pages on every op.

use super::{result, Driver, DriverError, Target, MAX_REGION};
use fuse_core::{ClientMap, HostSpan};
use io_uring::{opcode, types};
use std::io;

/// A registered client map: its identity and the pieces (at most 1 GiB
/// each) registered as fixed buffers, by index.
#[derive(Debug)]
pub(super) struct ClientPieces {
    id: u64,
    pieces: Vec<HostSpan>,
}

impl ClientPieces {
    /// The piece holding every iovec of `iovs`.
    fn index_of(&self, iovs: &[libc::iovec]) -> Option<u16> {
        let first = iovs.first()?.iov_base as usize;
        let i = self
            .pieces
            .iter()
            .position(|p| first >= p.addr && first < p.addr + p.len)?;
        let p = self.pieces[i];
        let inside = |v: &libc::iovec| {
            let a = v.iov_base as usize;
            a >= p.addr
                && a.checked_add(v.iov_len)
                    .is_some_and(|e| e <= p.addr + p.len)
        };
        iovs.iter().all(inside).then_some(i as u16)
    }
}

/// `regions` cut into pieces of at most `max` bytes.
fn pieces(regions: &[HostSpan], max: usize) -> Vec<HostSpan> {
    let mut out = Vec::new();
    for r in regions {
        let mut at = 0;
        while at < r.len {
            let len = (r.len - at).min(max);
            out.push(HostSpan {
                addr: r.addr + at,
                len,
            });
            at += len;
        }
    }
    out
}

/// At most this many iovecs per call (the kernel's UIO_MAXIOV).
pub const MAX_IOVECS: usize = 1024;

impl Driver {
    /// Registers the client's memory `map` as this ring's fixed buffers,
    /// unless it is the map registered already. Replaces an earlier client
    /// map; refused (EBUSY) while ops are in flight or the driver has
    /// regions of its own. Registration pins the pages: the kernel then
    /// reaches them through the pins, never through what is mapped at
    /// those addresses later.
    ///
    /// # Safety
    ///
    /// Every region of `map` must be mapped memory of this process now,
    /// and no Rust object.
    pub unsafe fn register_client_map(&mut self, map: &ClientMap) -> Result<(), DriverError> {
        if self.client_map.as_ref().is_some_and(|c| c.id == map.id()) {
            return Ok(());
        }
        let busy = || DriverError::Register(io::Error::from_raw_os_error(libc::EBUSY));
        if self.in_flight() != 0 || !self.regions.is_empty() {
            return Err(busy());
        }
        let pieces = pieces(map.regions(), MAX_REGION);
        if pieces.is_empty() || pieces.len() > usize::from(u16::MAX) {
            return Err(DriverError::Register(io::Error::from_raw_os_error(
                libc::EINVAL,
            )));
        }
        if self.client_map.take().is_some() {
            self.ring
                .submitter()
                .unregister_buffers()
                .map_err(DriverError::Register)?;
        }
        let iovecs: Vec<libc::iovec> = pieces
            .iter()
            .map(|p| libc::iovec {
                iov_base: p.addr as *mut libc::c_void,
                iov_len: p.len,
            })
            .collect();
        // SAFETY: the caller's contract: the pieces are mapped memory that
        // is no Rust object; the kernel pins the pages for as long as they
        // stay registered.
        unsafe { self.ring.submitter().register_buffers(&iovecs) }
            .map_err(DriverError::Register)?;
        self.client_map = Some(ClientPieces {
            id: map.id(),
            pieces,
        });
        Ok(())
    }

    /// The identity of the registered client map.
    pub fn client_map_id(&self) -> Option<u64> {
        self.client_map.as_ref().map(|c| c.id)
    }

    /// Whether registering the client map `id` failed on this ring (not
    /// to be tried again: see [`Driver::refuse_client_map`]).
    pub fn client_map_refused(&self, id: u64) -> bool {
        self.refused_map == Some(id)
    }

    /// Records that the kernel refused to register the client map `id`
    /// (RLIMIT_MEMLOCK, for one): its ops go as plain vectored ops.
    pub fn refuse_client_map(&mut self, id: u64) {
        self.refused_map = Some(id);
    }

    /// [`Driver::readv_raw`] through the registered client map: None (do
    /// the op another way) when the iovecs are not all in one registered
    /// piece or the kernel lacks the opcode.
    ///
    /// # Safety
    ///
    /// As for [`Driver::readv_raw`], and the iovecs are client memory of
    /// the map registered now (the map the caller's spans came with).
    pub unsafe fn readv_client_fixed(
        &mut self,
        t: Target,
        iovs: &[libc::iovec],
        offset: u64,
        key: u64,
    ) -> Option<io::Result<usize>> {
        let e = self.client_fixed_entry(t, iovs, false)?;
        // SAFETY: `blocking` waits for the completion: the iovec array
        // (borrowed for this call) and the memory it names (the caller's
        // contract) outlive the op.
        Some(unsafe { self.blocking(e.offset(offset).build(), key) })
    }

    /// [`Driver::writev_raw`] through the registered client map (see
    /// [`Driver::readv_client_fixed`]).
    ///
    /// # Safety
    ///
    /// As for [`Driver::writev_raw`], and the iovecs are client memory of
    /// the map registered now.
    pub unsafe fn writev_client_fixed(
        &mut self,
        t: Target,
        iovs: &[libc::iovec],
        offset: u64,
        key: u64,
    ) -> Option<io::Result<usize>> {
        let e = self.client_fixed_entry(t, iovs, true)?;
        // SAFETY: as in `readv_client_fixed` (the kernel only reads).
        Some(unsafe { self.blocking(e.offset(offset).build(), key) })
    }

    /// The unsubmitted op for a fixed client-memory read or write.
    pub(super) fn client_fixed_entry(
        &self,
        t: Target,
        iovs: &[libc::iovec],
        write: bool,
    ) -> Option<FixedOp> {
        let iovs = &iovs[..iovs.len().min(MAX_IOVECS)];
        let index = self.client_map.as_ref()?.index_of(iovs)?;
        let s = self.supported;
        let fd = |t| match t {
            Target::Fd(fd) => Fd::Plain(types::Fd(fd)),
            Target::Fixed(i) => Fd::Fixed(types::Fixed(i)),
        };
        match (iovs, write) {
            ([one], false) if s.read_fixed => Some(FixedOp::Read(fd(t).read_fixed(
                one.iov_base.cast(),
                one.iov_len as u32,
                index,
            ))),
            ([one], true) if s.write_fixed => Some(FixedOp::Write(fd(t).write_fixed(
                one.iov_base.cast(),
                one.iov_len as u32,
                index,
            ))),
            (_, false) if s.readv_fixed => Some(FixedOp::Readv(fd(t).readv_fixed(iovs, index))),
            (_, true) if s.writev_fixed => Some(FixedOp::Writev(fd(t).writev_fixed(iovs, index))),
            _ => None,
        }
    }

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
        // SAFETY: `blocking` waits for the completion: the iovec array
        // (borrowed here) and the memory it names (the caller's contract)
        // outlive it.
        unsafe { self.blocking(e.offset(offset).build(), key) }
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
        // SAFETY: as in `readv_raw` (the kernel only reads).
        unsafe { self.blocking(e.offset(offset).build(), key) }
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

/// A plain or registered file, for building fixed ops on either.
enum Fd {
    Plain(types::Fd),
    Fixed(types::Fixed),
}

impl Fd {
    fn read_fixed(self, ptr: *mut u8, len: u32, index: u16) -> opcode::ReadFixed {
        match self {
            Fd::Plain(f) => opcode::ReadFixed::new(f, ptr, len, index),
            Fd::Fixed(f) => opcode::ReadFixed::new(f, ptr, len, index),
        }
    }
    fn write_fixed(self, ptr: *const u8, len: u32, index: u16) -> opcode::WriteFixed {
        match self {
            Fd::Plain(f) => opcode::WriteFixed::new(f, ptr, len, index),
            Fd::Fixed(f) => opcode::WriteFixed::new(f, ptr, len, index),
        }
    }
    fn readv_fixed(self, iovs: &[libc::iovec], index: u16) -> opcode::ReadvFixed {
        let n = iovs.len() as u32;
        match self {
            Fd::Plain(f) => opcode::ReadvFixed::new(f, iovs.as_ptr(), n, index),
            Fd::Fixed(f) => opcode::ReadvFixed::new(f, iovs.as_ptr(), n, index),
        }
    }
    fn writev_fixed(self, iovs: &[libc::iovec], index: u16) -> opcode::WritevFixed {
        let n = iovs.len() as u32;
        match self {
            Fd::Plain(f) => opcode::WritevFixed::new(f, iovs.as_ptr(), n, index),
            Fd::Fixed(f) => opcode::WritevFixed::new(f, iovs.as_ptr(), n, index),
        }
    }
}

/// A fixed client-memory op before its offset is set.
pub(super) enum FixedOp {
    Read(opcode::ReadFixed),
    Write(opcode::WriteFixed),
    Readv(opcode::ReadvFixed),
    Writev(opcode::WritevFixed),
}

impl FixedOp {
    pub(super) fn offset(self, offset: u64) -> FixedOp {
        match self {
            FixedOp::Read(o) => FixedOp::Read(o.offset(offset)),
            FixedOp::Write(o) => FixedOp::Write(o.offset(offset)),
            FixedOp::Readv(o) => FixedOp::Readv(o.offset(offset)),
            FixedOp::Writev(o) => FixedOp::Writev(o.offset(offset)),
        }
    }
    pub(super) fn build(self) -> io_uring::squeue::Entry {
        match self {
            FixedOp::Read(o) => o.build(),
            FixedOp::Write(o) => o.build(),
            FixedOp::Readv(o) => o.build(),
            FixedOp::Writev(o) => o.build(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iov(addr: usize, len: usize) -> libc::iovec {
        libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len,
        }
    }

    #[test]
    fn regions_are_cut_in_pieces_and_iovecs_found_in_one() {
        let p = pieces(
            &[
                HostSpan {
                    addr: 0x10000,
                    len: 0x2800,
                },
                HostSpan {
                    addr: 0x90000,
                    len: 0x100,
                },
            ],
            0x1000,
        );
        assert_eq!(
            p.iter().map(|s| (s.addr, s.len)).collect::<Vec<_>>(),
            [
                (0x10000, 0x1000),
                (0x11000, 0x1000),
                (0x12000, 0x800),
                (0x90000, 0x100)
            ]
        );
        let c = ClientPieces { id: 1, pieces: p };
        assert_eq!(c.index_of(&[iov(0x11000, 0x1000)]), Some(1));
        assert_eq!(
            c.index_of(&[iov(0x12000, 0x10), iov(0x12400, 0x400)]),
            Some(2)
        );
        // Across two pieces, past a piece's end, outside every piece.
        assert_eq!(c.index_of(&[iov(0x10800, 0x1000)]), None);
        assert_eq!(c.index_of(&[iov(0x10000, 0x10), iov(0x11000, 0x10)]), None);
        assert_eq!(c.index_of(&[iov(0x12400, 0x401)]), None);
        assert_eq!(c.index_of(&[iov(0x50000, 1)]), None);
        assert_eq!(c.index_of(&[iov(usize::MAX - 1, 8)]), None);
        assert_eq!(c.index_of(&[]), None);
    }
}
