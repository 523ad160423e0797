//! Starting a request without waiting: READ, WRITE, FSYNC, FSYNCDIR
//! and FALLOCATE offered to the filesystem's `*_async` calls. A request
//! the filesystem declines comes back with its `IoDone` unused, to be
//! served the usual way.

use super::{ctx_of, Dispatcher};
use crate::abi::{self, Operation, Request};
use crate::chan::ClientMem;
use crate::server::{Filesystem, IoDone, Start};

impl<F: Filesystem> Dispatcher<F> {
    /// Starts a READ into the client's memory `mem` without waiting, when
    /// the filesystem can ([`Filesystem::start_read`]): Ok once `done` will
    /// answer it (with the bytes read, which are in `mem`); Err(done) for
    /// any other request, or a READ the filesystem serves the usual way.
    pub fn start_read(
        &self,
        start: Start<'_, F::Io>,
        req: &Request<'_>,
        mem: &std::sync::Arc<dyn ClientMem>,
        done: IoDone,
    ) -> Result<(), IoDone> {
        let Operation::Read { arg } = &req.op else {
            return Err(done);
        };
        let h = &req.header;
        let ctx = ctx_of(h);
        let len = (arg.size as usize).min(mem.len());
        self.fs.start_read(
            start.io,
            start.done,
            &ctx,
            F::Inode::from(h.nodeid),
            F::Handle::from(arg.fh),
            arg.offset,
            len,
            mem,
            done,
        )
    }

    /// Offers a decoded WRITE to the filesystem to start without waiting
    /// ([`Filesystem::start_write`]), its data being all of `mem` (the
    /// request's `size` bytes; anything else is served the usual way).
    /// Err(done) (unused) when it is not a WRITE or the filesystem
    /// declines; then serve the request as usual.
    pub fn start_write(
        &self,
        start: Start<'_, F::Io>,
        req: &Request<'_>,
        mem: &std::sync::Arc<dyn ClientMem>,
        done: IoDone,
    ) -> Result<(), IoDone> {
        let Operation::Write { arg, .. } = &req.op else {
            return Err(done);
        };
        if arg.size as usize != mem.len() {
            return Err(done);
        }
        let h = &req.header;
        let ctx = ctx_of(h);
        self.fs.start_write(
            start.io,
            start.done,
            &ctx,
            F::Inode::from(h.nodeid),
            F::Handle::from(arg.fh),
            arg.offset,
            mem,
            arg.write_flags,
            done,
        )
    }

    /// Offers a decoded FSYNC, FSYNCDIR or FALLOCATE (a request that
    /// carries no data and answers none) to the filesystem to start
    /// without waiting ([`Filesystem::start_fsync`],
    /// [`Filesystem::start_fallocate`]): Ok once `done` will answer it;
    /// Err(done) (unused) for any other request, or when the filesystem
    /// declines: then serve it as usual.
    pub fn start_no_data(
        &self,
        start: Start<'_, F::Io>,
        req: &Request<'_>,
        done: IoDone,
    ) -> Result<(), IoDone> {
        let h = &req.header;
        let ctx = ctx_of(h);
        let ino = F::Inode::from(h.nodeid);
        let (arg, dir) = match &req.op {
            Operation::Fsync { arg } => (arg, false),
            Operation::Fsyncdir { arg } => (arg, true),
            Operation::Fallocate { arg } => {
                return self.fs.start_fallocate(
                    start.io,
                    start.done,
                    &ctx,
                    ino,
                    F::Handle::from(arg.fh),
                    arg.mode,
                    arg.offset,
                    arg.length,
                    done,
                )
            }
            _ => return Err(done),
        };
        let datasync = arg.fsync_flags & abi::flags::FSYNC_FDATASYNC != 0;
        self.fs.start_fsync(
            start.io,
            start.done,
            &ctx,
            ino,
            F::Handle::from(arg.fh),
            datasync,
            dir,
            done,
        )
    }
}
