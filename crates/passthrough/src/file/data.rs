//! Data on open handles: READ and WRITE (through io_uring where the
//! handle's file does non-blocking I/O, synchronously otherwise, or straight
//! into the client's memory), and FLUSH, FSYNC, FALLOCATE, LSEEK and
//! COPY_FILE_RANGE; the file a DAX mapping maps. A writeback WRITE runs as
//! the handle's opener.

use super::HandleData;
use crate::creds::{Caps, Cred};
use crate::{io, sys, PassthroughFs};
use fuse_core::abi::flags as wflags;
use fuse_core::locks::{read, write};
use fuse_core::server::{Ctx, FsResult, MapSource, ReadSink, WriteSource};
use fuse_core::Errno;
use std::borrow::Cow;

impl PassthroughFs {
    pub(crate) fn op_read(
        &self,
        ctx: &Ctx,
        fh: u64,
        off: u64,
        sink: &mut dyn ReadSink,
    ) -> FsResult<usize> {
        // The kernel never asks beyond the largest file offset; io_uring
        // would take -1 as "the current position".
        if off > i64::MAX as u64 {
            return Err(Errno::EINVAL);
        }
        let h = self.handles.get(fh)?;
        if let Some((mem, len)) = sink.client() {
            return crate::client_io::read(
                h.uring,
                h.odirect,
                h.fd.raw(),
                mem,
                len,
                off,
                ctx.unique,
                &self.io_stats,
            );
        }
        let read = if h.odirect {
            io::read_direct
        } else {
            io::read_full
        };
        read(
            h.uring,
            h.fd.raw(),
            sink.buffer(),
            off,
            ctx.unique,
            &self.io_stats,
        )
    }

    /// Who a WRITE on `h` with `write_flags` runs as, and with which
    /// capabilities (synchronously, or started: `started/write.rs`).
    ///
    /// Every write runs under credentials, so the host applies quotas,
    /// reserved blocks and setuid clearing as for a local writer. A
    /// writeback (or mmap) write carries no caller: it runs as the
    /// handle's opener. A caller with the opener's uid and gid takes the
    /// opener's groups too (host mounts: read at OPEN rather than from
    /// /proc on every WRITE; they differ only for a process that changed
    /// its groups since).
    ///
    /// FUSE_WRITE_KILL_SUIDGID says the writer lacks CAP_FSETID: the host
    /// write then runs without it, so it clears setuid/setgid as the host
    /// kernel would for such a writer (a non-root caller has no
    /// capabilities anyway).
    pub(crate) fn write_creds<'h>(
        &self,
        ctx: &Ctx,
        h: &'h HandleData,
        flags: u32,
    ) -> Result<(Cow<'h, Cred>, Caps), Errno> {
        let cache = flags & wflags::WRITE_CACHE != 0;
        let cred = if cache || self.acts_as(ctx, &h.opener)? {
            Cow::Borrowed(&h.opener)
        } else {
            Cow::Owned(self.caller(ctx)?)
        };
        let caps = Caps::Data {
            kill_suidgid: flags & wflags::WRITE_KILL_SUIDGID != 0,
        };
        Ok((cred, caps))
    }

    /// Whether a WRITE through `h` holds its inode's `io_lock` shared
    /// (parallel direct writes), not exclusively.
    pub(crate) fn parallel_write(&self, h: &HandleData) -> bool {
        h.direct && self.cfg.parallel_direct_writes
    }

    pub(crate) fn op_write(
        &self,
        ctx: &Ctx,
        fh: u64,
        off: u64,
        src: &dyn WriteSource,
        flags: u32,
    ) -> FsResult<usize> {
        self.writable()?;
        if off > i64::MAX as u64 {
            return Err(Errno::EINVAL);
        }
        let h = self.handles.get(fh)?;
        let (cred, caps) = self.write_creds(ctx, &h, flags)?;
        let (_r, _w);
        if self.parallel_write(&h) {
            _r = read(&h.inode.io_lock);
        } else {
            _w = write(&h.inode.io_lock);
        }
        let writer = self.handles.writer(&h.inode);
        let r = (|| {
            let _c = self.creds_as(&cred, caps)?;
            if let Some(mem) = src.client() {
                return crate::client_io::write(
                    h.uring && h.odirect,
                    h.odirect,
                    h.fd.raw(),
                    mem,
                    off,
                    ctx.unique,
                    &self.io_stats,
                );
            }
            let write = if h.odirect {
                io::write_direct
            } else {
                io::write_full
            };
            write(
                h.uring && h.odirect,
                h.fd.raw(),
                src.data(),
                off,
                ctx.unique,
                &self.io_stats,
            )
        })();
        drop(writer);
        if matches!(r, Ok(n) if n > 0) {
            self.kill_mapped_caps(h.inode.nodeid);
        }
        r
    }

    pub(crate) fn op_flush(&self, fh: u64, owner: u64) -> FsResult<()> {
        let h = self.handles.get(fh)?;
        // close(2) drops the caller's POSIX locks on the file.
        self.locks.drop_owner(h.inode.nodeid, owner);
        sys::flush_fd(h.fd.raw())
    }

    pub(crate) fn op_fsync(&self, ctx: &Ctx, fh: u64, datasync: bool) -> FsResult<()> {
        let h = self.handles.get(fh)?;
        io::fsync(h.uring, h.fd.raw(), datasync, ctx.unique, &self.io_stats)
    }

    pub(crate) fn op_fallocate(
        &self,
        ctx: &Ctx,
        fh: u64,
        mode: u32,
        off: u64,
        len: u64,
    ) -> FsResult<()> {
        self.writable()?;
        let h = self.handles.get(fh)?;
        let cred = self.caller(ctx)?;
        self.fallocate_as(&h, &cred, mode, off, len)
    }

    /// FALLOCATE through `h` synchronously, as `cred`.
    pub(super) fn fallocate_as(
        &self,
        h: &HandleData,
        cred: &Cred,
        mode: u32,
        off: u64,
        len: u64,
    ) -> FsResult<()> {
        let _w = write(&h.inode.io_lock);
        {
            // Allocates: as the caller, without CAP_SYS_RESOURCE.
            let _c = self.creds_as(cred, Caps::ALLOCATE)?;
            sys::fallocate(h.fd.raw(), mode as i32, off, len)?;
        }
        // The host removes a file's capabilities on fallocate; a renamed
        // one it does not know of goes too.
        self.kill_mapped_caps(h.inode.nodeid);
        Ok(())
    }

    /// FUSE_SETUPMAPPING's file: handle `fh`'s, if it is open on `inode`
    /// and a regular file; writable as its open mode says (never on a
    /// read-only share).
    pub(crate) fn op_map_source(
        &self,
        inode: u64,
        fh: u64,
        map: &mut dyn FnMut(MapSource<'_>) -> FsResult<()>,
    ) -> FsResult<()> {
        let h = self.handles.get(fh)?;
        if h.inode.nodeid != inode || h.inode.ftype != libc::S_IFREG {
            return Err(Errno::EINVAL);
        }
        let fd = h.fd.raw();
        let mode = sys::getfl(fd)? & libc::O_ACCMODE;
        let st = sys::statx(fd, c"", libc::AT_EMPTY_PATH, libc::STATX_SIZE)?;
        // `h` keeps the file open while `map` has it.
        map(MapSource {
            fd: h.fd.borrow(),
            writable: mode != libc::O_RDONLY && !self.cfg.readonly,
            size: st.stx_size,
        })
    }

    pub(crate) fn op_lseek(&self, fh: u64, off: u64, whence: u32) -> FsResult<u64> {
        let h = self.handles.get(fh)?;
        let off = i64::try_from(off).map_err(|_| Errno::EINVAL)?;
        // Only SEEK_DATA and SEEK_HOLE reach the server; the handle's own
        // position is never used for I/O (all I/O is positioned).
        sys::lseek(h.fd.raw(), off, whence as i32)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn op_copy_file_range(
        &self,
        ctx: &Ctx,
        fh_in: u64,
        off_in: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
        flags: u64,
    ) -> FsResult<u64> {
        self.writable()?;
        if flags != 0 {
            return Err(Errno::EINVAL);
        }
        let (i, o) = (self.handles.get(fh_in)?, self.handles.get(fh_out)?);
        // The destination allocates: as the caller, without
        // CAP_SYS_RESOURCE.
        let _c = self.creds_as(&self.caller(ctx)?, Caps::ALLOCATE)?;
        sys::copy_file_range(i.fd.raw(), off_in, o.fd.raw(), off_out, len)
    }
}
