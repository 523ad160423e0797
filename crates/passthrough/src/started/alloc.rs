//! FALLOCATEs started without waiting (`Filesystem::start_fallocate`): the
//! kernel runs each on one of the ring's io-wq workers (a fallocate may
//! wait for the disk: zeroing or punching a large range, allocating in a
//! full filesystem), so the serving thread goes on at once. Files without
//! non-blocking I/O (tmpfs, where a fallocate only takes pages) are served
//! synchronously.
//!
//! **Credentials.** As the usual path (`op_fallocate`): the caller's,
//! without CAP_SYS_RESOURCE, in a personality of the ring (`write.rs`). One
//! refused with EACCES or EPERM is done again synchronously, as a refused write
//! is (a security module may refuse ops run with a personality).
//!
//! **Locking.** The usual path holds the inode's `io_lock` exclusively; a
//! started one holds nothing, as a started write (`write.rs`; what that
//! allows: docs/DESIGN.md, "Parallel direct writes").

use super::write::WriteCreds;
use super::{NoData, PassthroughFs, PassthroughIo};
use crate::creds::Caps;
use crate::file::HandleData;
use fuse_core::locks::write;
use fuse_core::server::{Ctx, IoDone};
use fuse_core::Errno;
use host_io::Target;

/// What a started FALLOCATE asked, and as whom it runs.
pub(super) struct Alloc {
    mode: u32,
    off: u64,
    len: u64,
    creds: WriteCreds,
}

impl PassthroughFs {
    /// Starts the FALLOCATE of `len` bytes at `off` through handle `fh`
    /// with `mode`, or gives `done` back (unused) to have it served the
    /// usual way, which answers it with the same effects or the errno this
    /// would not give.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn op_start_fallocate(
        &self,
        io: &mut PassthroughIo,
        ctx: &Ctx,
        fh: u64,
        mode: u32,
        off: u64,
        len: u64,
        done: IoDone,
    ) -> Result<(), IoDone> {
        // A read-only share or bad arguments: the usual path gives the
        // errno.
        if !self.cfg.io_uring
            || self.writable().is_err()
            || i64::try_from(off).is_err()
            || i64::try_from(len).is_err()
            || i32::try_from(mode).is_err()
        {
            return Err(done);
        }
        let Ok(h) = self.handles.get(fh) else {
            return Err(done);
        };
        if !h.uring {
            return Err(done);
        }
        let Ok(cred) = self.caller(ctx) else {
            return Err(done);
        };
        let creds = if self.cfg.creds {
            WriteCreds::As(cred, Caps::ALLOCATE)
        } else {
            WriteCreds::Own
        };
        let t = Target::Fd(h.fd.raw());
        let id = io.ring(&self.io_stats).and_then(|(d, personas)| {
            // Always one (the daemon's own with credential switching off):
            // see `op_start_fsync`.
            let personality = Some(personas.get(d, &creds).ok()?);
            d.start_fallocate(t, mode as i32, off, len, ctx.unique, personality)
                .ok()
        });
        let Some(id) = id else {
            return Err(done);
        };
        self.io_stats.count_alloc_started();
        // The renamed capability xattr goes now, as the host clears a real
        // one when the fallocate runs (the usual path clears it after).
        self.kill_mapped_caps(h.inode.nodeid);
        let op = NoData {
            done,
            h,
            alloc: Some(Alloc {
                mode,
                off,
                len,
                creds,
            }),
        };
        io.no_data.insert(id, op);
        Ok(())
    }

    /// The answer of the started FALLOCATE `a` through `h` whose
    /// completion gave `r`: refused with EACCES or EPERM, it is done again
    /// synchronously (see the module docs).
    pub(super) fn fallocate_finished(
        &self,
        h: &HandleData,
        a: &Alloc,
        r: Result<usize, Errno>,
    ) -> Result<usize, Errno> {
        match r {
            Err(Errno(libc::EACCES) | Errno::EPERM) => {
                let _w = write(&h.inode.io_lock);
                let _c = a.creds.enter()?;
                host_io::sys::fallocate(h.fd.raw(), a.mode as i32, a.off, a.len)?;
                Ok(0)
            }
            r => r,
        }
    }
}
