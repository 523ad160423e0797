//! READ and WRITE straight between the client's memory (a guest's buffers,
//! passed by reference through the engine) and the host file: one vectored
//! host call over the client's spans, no copy in this process.
//!
//! Like [`super::io`], a file that can do non-blocking I/O goes through an
//! io_uring of the pool (READV/WRITEV, cancellable by FUSE_INTERRUPT), other
//! files through preadv/pwritev. O_DIRECT needs aligned memory: spans that
//! are not go through an aligned bounce buffer.

use super::io::{self, IoStats};
use fuse_core::{ClientMap, ClientMem, Errno, HostSpan, IoGuard};
use host_io::Target;
use host_io::{preadv_raw, pwritev_raw, MAX_IOVECS};
use smallvec::SmallVec;
use std::os::fd::RawFd;

/// Guest buffers most READs and WRITEs have (one or two pages).
const USUAL_IOVECS: usize = 2;

/// The iovecs of a request's guest buffers.
pub(super) type Iovecs = SmallVec<[libc::iovec; USUAL_IOVECS]>;

/// The iovecs of bytes `skip..len` of `spans` (at most [`MAX_IOVECS`];
/// up to [`USUAL_IOVECS`] in place, no allocation).
pub(super) fn iovecs(spans: &[HostSpan], skip: usize, len: usize) -> Iovecs {
    let mut v = Iovecs::new();
    let mut at = 0usize;
    for s in spans {
        if at >= len || v.len() == MAX_IOVECS {
            break;
        }
        let end = (at + s.len).min(len);
        if end > skip {
            let from = skip.max(at);
            v.push(libc::iovec {
                iov_base: (s.addr + (from - at)) as *mut libc::c_void,
                iov_len: end - from,
            });
        }
        at += s.len;
    }
    v
}

/// Whether `map` is `d`'s fixed buffers now (registering it if it is new).
/// A map the kernel refused (RLIMIT_MEMLOCK, for one) is not tried again on
/// that ring: its ops go as plain READV/WRITEV. A driver busy with other
/// ops (EBUSY) tries again next time.
///
/// # Safety
///
/// The regions of `map` are mapped memory of this process, no Rust object.
pub(super) unsafe fn registered(d: &mut host_io::Driver, map: &ClientMap) -> bool {
    if d.client_map_id() == Some(map.id()) {
        return true;
    }
    if d.client_map_refused(map.id()) {
        return false;
    }
    // SAFETY: the caller's contract.
    match unsafe { d.register_client_map(map) } {
        Ok(()) => true,
        Err(host_io::DriverError::Register(e)) if e.raw_os_error() == Some(libc::EBUSY) => false,
        Err(_) => {
            d.refuse_client_map(map.id());
            false
        }
    }
}

/// Whether O_DIRECT can use the spans as they are.
pub(super) fn aligned(mem: &dyn ClientMem) -> bool {
    let n = mem.spans().len();
    mem.spans()
        .iter()
        .enumerate()
        .all(|(i, s)| s.addr % io::DIO_ALIGN == 0 && (i + 1 == n || s.len % io::DIO_ALIGN == 0))
}

/// Reads at most `len` bytes at `off` into `mem`, until full or end of file.
#[allow(clippy::too_many_arguments)]
pub fn read(
    uring: bool,
    odirect: bool,
    fd: RawFd,
    mem: &dyn ClientMem,
    len: usize,
    off: u64,
    key: u64,
    stats: &IoStats,
) -> Result<usize, Errno> {
    let len = len.min(mem.len());
    if odirect && !aligned(mem) {
        let mut buf = vec![0u8; len];
        let n = io::read_direct(uring, fd, &mut buf, off, key, stats)?;
        mem.write_at(0, &buf[..n])?;
        return Ok(n);
    }
    // The client may have taken its memory back (a timed-out request).
    let guard = mem.io().ok_or(Errno::EIO)?;
    transfer(
        false,
        uring,
        fd,
        &guard,
        mem.map().as_deref(),
        len,
        off,
        key,
        stats,
    )
}

/// Writes all of `mem` at `off` (a short count only if the host stops).
pub fn write(
    uring: bool,
    odirect: bool,
    fd: RawFd,
    mem: &dyn ClientMem,
    off: u64,
    key: u64,
    stats: &IoStats,
) -> Result<usize, Errno> {
    let len = mem.len();
    if odirect && !aligned(mem) {
        let mut buf = vec![0u8; len];
        mem.read_at(0, &mut buf)?;
        return io::write_direct(uring, fd, &buf, off, key, stats);
    }
    let guard = mem.io().ok_or(Errno::EIO)?;
    transfer(
        true,
        uring,
        fd,
        &guard,
        mem.map().as_deref(),
        len,
        off,
        key,
        stats,
    )
}

/// Moves `len` bytes between the guarded spans and the file at `off`, one
/// vectored host call per step: through a ring of the pool (as fixed-buffer
/// ops when `map` is registered there) or preadv/pwritev.
#[allow(clippy::too_many_arguments)]
fn transfer(
    write: bool,
    uring: bool,
    fd: RawFd,
    guard: &IoGuard<'_>,
    map: Option<&ClientMap>,
    len: usize,
    off: u64,
    key: u64,
    stats: &IoStats,
) -> Result<usize, Errno> {
    let t = Target::Fd(fd);
    io::repeat(len, off, |done, at| {
        let iovs = iovecs(guard.spans(), done, len);
        match io::with_driver(uring, stats, |d| {
            // SAFETY: `ClientMem`'s contract: the map's regions are mapped
            // while the memory (borrowed by `guard`) lives, and the spans
            // lie in them.
            if map.is_some_and(|m| unsafe { registered(d, m) }) {
                // SAFETY: as below, and the spans are in the map just
                // registered.
                let fixed = unsafe {
                    if write {
                        d.writev_client_fixed(t, &iovs, at, key)
                    } else {
                        d.readv_client_fixed(t, &iovs, at, key)
                    }
                };
                if let Some(r) = fixed {
                    stats.count_fixed(write);
                    return r;
                }
            }
            // SAFETY: `ClientMem`'s contract: while `guard` lives every span
            // is mapped, writable memory that is no Rust object and that
            // the client does not reuse; the iovecs stay inside the spans.
            unsafe {
                if write {
                    d.writev_raw(t, &iovs, at, key)
                } else {
                    d.readv_raw(t, &iovs, at, key)
                }
            }
        }) {
            Some(r) => {
                stats.count(write, true);
                r
            }
            None => {
                stats.count(write, false);
                // SAFETY: as above.
                unsafe {
                    if write {
                        pwritev_raw(fd, &iovs, at)
                    } else {
                        preadv_raw(fd, &iovs, at)
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use fuse_core::HostSpan;

    #[derive(Debug)]
    struct Spans(Vec<HostSpan>);
    // SAFETY: test spans are never dereferenced by these tests.
    unsafe impl ClientMem for Spans {
        fn spans(&self) -> &[HostSpan] {
            &self.0
        }
        fn begin_io(&self) -> bool {
            false
        }
        fn end_io(&self) {}
        fn read_at(&self, _: usize, _: &mut [u8]) -> Result<(), Errno> {
            Err(Errno::EIO)
        }
        fn write_at(&self, _: usize, _: &[u8]) -> Result<(), Errno> {
            Err(Errno::EIO)
        }
    }

    #[test]
    fn iovecs_skip_and_clip() {
        let m = Spans(vec![
            HostSpan {
                addr: 1000,
                len: 10,
            },
            HostSpan {
                addr: 5000,
                len: 20,
            },
            HostSpan { addr: 9000, len: 5 },
        ]);
        let v = |skip, len| {
            iovecs(m.spans(), skip, len)
                .iter()
                .map(|i| (i.iov_base as usize, i.iov_len))
                .collect::<Vec<_>>()
        };
        assert_eq!(v(0, 35), [(1000, 10), (5000, 20), (9000, 5)]);
        assert_eq!(v(12, 35), [(5002, 18), (9000, 5)]);
        assert_eq!(v(0, 15), [(1000, 10), (5000, 5)]);
        assert_eq!(v(10, 30), [(5000, 20)]);
        assert_eq!(v(35, 35), []);
        assert!(!aligned(&m));
    }
}
