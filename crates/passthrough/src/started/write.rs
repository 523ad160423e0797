//! WRITEs started without waiting (`Filesystem::start_write`): queued on
//! the serving loop's ring straight from the client's memory, submitted by
//! `submit_started`, answered by `collect_started`, with the effects of the
//! usual path (`op_write`): its credentials, setuid and setgid clearing by
//! the host, a renamed capability xattr cleared, short writes continued.
//!
//! **Credentials.** The kernel issues an op later than it is queued, or on
//! an io-wq worker, so each write carries a personality of the ring
//! registered while the thread had the credentials `op_write` would use
//! (kept per ring by those credentials, at most [`MAX_PERSONAS`]).
//!
//! **Locking.** Only writes the usual path would run under the inode's
//! `io_lock` shared are started, and they hold nothing (no guard can live
//! until the completion): a write the host takes in several calls may have
//! a truncate or FALLOCATE land between its parts (docs/DESIGN.md).

use super::{PassthroughFs, Pending};
use crate::client_io::{aligned, iovecs};
use crate::creds::{Caps, Cred, CredGuard};
use crate::file::Writer;
use crate::io;
use fuse_core::server::{Ctx, IoDone};
use fuse_core::{ClientMem, Errno};
use std::collections::HashMap;
use std::sync::Arc;

/// Personalities kept per ring; past it, all are given back and the cache
/// starts over (a daemon serving more callers than this at once pays a
/// registration, two credential switches, per write of a caller not in it).
const MAX_PERSONAS: usize = 64;

/// The credentials a write runs with: what `PassthroughFs::creds_as`
/// switches to for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum WriteCreds {
    /// The thread's own (credential switching is off).
    Own,
    /// A caller's or opener's, with the capabilities the rule leaves.
    As(Cred, Caps),
}

impl WriteCreds {
    /// These credentials in force on this thread until the guard drops.
    pub(super) fn enter(&self) -> Result<CredGuard, Errno> {
        match self {
            WriteCreds::Own => Ok(CredGuard::none()),
            WriteCreds::As(cred, caps) => CredGuard::enter(cred, *caps),
        }
    }
}

/// What a started WRITE carries beyond a READ.
#[derive(Debug)]
pub(super) struct WriteOp {
    /// As whom it runs (its personality is looked up by these again for a
    /// continuation: the cache may have started over meanwhile).
    creds: WriteCreds,
    /// Counted among its inode's writers until it ends.
    _writer: Writer,
}

/// A serving loop's ring's personalities, by the credentials each holds.
#[derive(Debug, Default)]
pub(super) struct Personas {
    /// The ring they belong to ([`host_io::Driver::serial`]).
    ring: u64,
    ids: HashMap<WriteCreds, u16>,
}

impl Personas {
    /// The personality `p` is to run with: a write's (see
    /// [`Personas::get`]), none for a read.
    pub(super) fn of(
        &mut self,
        d: &mut host_io::Driver,
        p: &Pending,
    ) -> Result<Option<u16>, Errno> {
        p.write.as_ref().map(|w| self.get(d, &w.creds)).transpose()
    }

    /// The personality of `d`'s ring that holds `creds`, registered now
    /// (with `creds` in force on this thread for the call) if there is none.
    pub(super) fn get(
        &mut self,
        d: &mut host_io::Driver,
        creds: &WriteCreds,
    ) -> Result<u16, Errno> {
        if self.ring != d.serial() {
            // Another ring (this thread's was made again): its ids are not
            // ours, and ours went with the old ring.
            self.ids.clear();
            self.ring = d.serial();
        }
        if let Some(&id) = self.ids.get(creds) {
            return Ok(id);
        }
        if self.ids.len() >= MAX_PERSONAS {
            let ids: Vec<u16> = self.ids.values().copied().collect();
            // The driver submits what is queued first (an SQE's
            // personality is looked up when the kernel takes it); ops
            // taken hold their own reference to their credentials.
            match d.unregister_personalities(&ids) {
                Ok(()) => self.ids.clear(),
                // Each was tried: one that failed is not registered either.
                Err(host_io::DriverError::Register(e)) if e.raw_os_error() != Some(libc::EBUSY) => {
                    self.ids.clear()
                }
                // None was given back (an entry stayed queued, or the
                // submit failed): all stay, and the next miss tries again.
                Err(_) => {}
            }
        }
        let id = {
            let _c = creds.enter()?;
            d.register_personality()
        }
        .map_err(super::driver_errno)?;
        self.ids.insert(creds.clone(), id);
        Ok(id)
    }
}

impl PassthroughFs {
    /// Starts the WRITE of all of `mem` at `off` through handle `fh`, or
    /// gives `done` back (unused) to have it served the usual way, which
    /// answers it with the same effects, or with the errno this would not.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn op_start_write(
        &self,
        io: &mut super::PassthroughIo,
        ctx: &Ctx,
        fh: u64,
        off: u64,
        mem: &Arc<dyn ClientMem>,
        flags: u32,
        done: IoDone,
    ) -> Result<(), IoDone> {
        let len = mem.len();
        // A read-only share: the usual path says EROFS.
        if !self.cfg.io_uring || off > i64::MAX as u64 || len == 0 || self.writable().is_err() {
            return Err(done);
        }
        let Ok(h) = self.handles.get(fh) else {
            return Err(done);
        };
        // Only what the usual path would write holding the inode's lock
        // shared (see the module docs).
        if !self.parallel_write(&h) {
            return Err(done);
        }
        // Only O_DIRECT to a file with non-blocking I/O, issued inside the
        // submit and completed by the device. A buffered host write would
        // run on an io-wq worker: the host serialises buffered writes to a
        // file on its inode lock, so the workers add only hand-offs
        // (docs/BENCHMARKS.md, "With depth (issue 16)").
        let in_submit = h.uring && h.odirect;
        if !in_submit || !aligned(&**mem) {
            return Err(done);
        }
        // A caller the ID maps refuse: the usual path gives the errno.
        let Ok((cred, caps)) = self.write_creds(ctx, &h, flags) else {
            return Err(done);
        };
        let creds = if self.cfg.creds {
            WriteCreds::As(cred.into_owned(), caps)
        } else {
            WriteCreds::Own
        };
        if !mem.begin_io() {
            // The client took its memory back: the usual path says EIO.
            return Err(done);
        }
        let writer = self.handles.writer(&h.inode);
        let nodeid = h.inode.nodeid;
        let p = Pending {
            done,
            mem: mem.clone(),
            h,
            off,
            len,
            got: 0,
            key: ctx.unique,
            fixed: true,
            punt: false,
            write: Some(WriteOp {
                creds,
                _writer: writer,
            }),
        };
        self.start_pending(io, p)?;
        // The capability xattr the host does not clear (renamed by the
        // xattr map) goes now, as the host clears a real one when a write
        // starts: whatever happens to this thread before the completion
        // is taken, a file written to keeps no capability.
        self.kill_mapped_caps(nodeid);
        Ok(())
    }

    /// The answer of the started write `p` (its `WriteOp` `w` taken out)
    /// whose last completion gave `r`: the rest written synchronously first if
    /// a continuation could not be started (`stalled`). A first write the
    /// kernel refused with EACCES or EPERM, nothing written, is written in
    /// line: a security module may refuse ops that carry a personality
    /// (SELinux's `io_uring { override_creds }`, AppArmor's) where the
    /// same credentials switched on the thread are allowed, and the usual
    /// path gives the host's own answer.
    ///
    /// # Safety
    ///
    /// `p.mem` must still be held for I/O (`end_io` not yet called).
    pub(super) unsafe fn write_finished(
        &self,
        p: &Pending,
        w: WriteOp,
        r: Result<usize, Errno>,
        stalled: bool,
    ) -> Result<usize, Errno> {
        let rest = |p: &Pending| {
            // SAFETY: `p.mem` is held for I/O (this fn's contract).
            unsafe { self.write_rest(p, &w.creds) }
        };
        let r = match r {
            Ok(got) if stalled => Ok(got + rest(p).unwrap_or(0)),
            Err(Errno(libc::EACCES) | Errno::EPERM) if p.got == 0 => rest(p),
            r => r,
        };
        // No longer a writer.
        drop(w);
        r
    }

    /// Writes bytes `p.got..p.len` of `p` synchronously, with `creds` in force,
    /// as the usual path would; how many were written, or the error of
    /// the first call.
    ///
    /// # Safety
    ///
    /// `p.mem` must be held for I/O (`begin_io` succeeded, `end_io` not
    /// yet called) for the whole call.
    unsafe fn write_rest(&self, p: &Pending, creds: &WriteCreds) -> Result<usize, Errno> {
        let _c = creds.enter()?;
        let fd = p.h.fd.raw();
        let rest = io::repeat(p.len - p.got, p.off + p.got as u64, |done, at| {
            let iovs = iovecs(p.mem.spans(), p.got + done, p.len);
            self.io_stats.count(true, false);
            // SAFETY: `ClientMem`'s contract: the memory is held for I/O
            // (this fn's contract), so every span is mapped and not reused;
            // the iovecs stay inside the spans.
            unsafe { host_io::pwritev_raw(fd, &iovs, at) }
        });
        rest
    }
}
