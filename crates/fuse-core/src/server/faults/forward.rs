//! [`Faulty`]'s [`Filesystem`] impl: every operation forwards to the
//! wrapped filesystem through the plan's gate, which may delay, hang or
//! fail it first; READ and WRITE may also run on part of their data.
//! Calls that carry no request (init, forget, state) are not faulted.

use super::{cut, started_reads, Back, Decision, Fault, Faulty, FaultyIo};
use crate::abi::{Attr, Kstatfs, Opcode, SetattrIn, Statx};
use crate::chan::{ClientMem, Errno};
use crate::server::{
    Created, Ctx, Deferred, DirPlusSink, DirSink, Entry, FileLock, Filesystem, FsResult, LockReq,
    MapSource, Opened, ReadSink, WriteSource, Xattr,
};
use crate::sync::{lock, Arc, Ordering};
use std::time::Duration;

/// A READ sink cut to `n` bytes.
struct ShortSink<'a> {
    inner: &'a mut dyn ReadSink,
    n: usize,
}

impl ReadSink for ShortSink<'_> {
    fn buffer(&mut self) -> &mut [u8] {
        let n = self.n;
        let b = self.inner.buffer();
        let n = n.min(b.len());
        &mut b[..n]
    }
    fn client(&self) -> Option<(&dyn ClientMem, usize)> {
        self.inner.client().map(|(m, len)| (m, len.min(self.n)))
    }
}

/// WRITE data cut to `n` bytes (by copy: client memory cannot be cut).
struct ShortSource {
    data: Vec<u8>,
}

impl WriteSource for ShortSource {
    fn data(&self) -> &[u8] {
        &self.data
    }
}

impl<F: Filesystem> Filesystem for Faulty<F> {
    type Inode = F::Inode;
    type Handle = F::Handle;
    type Io = FaultyIo<F::Io>;

    fn new_io(&self, wake: crate::server::Wake) -> FaultyIo<F::Io> {
        FaultyIo {
            inner: self.inner.new_io(wake.clone()),
            back: Back::new(wake),
        }
    }

    fn init(&self, capable: u64) -> FsResult<u64> {
        self.inner.init(capable)
    }
    fn destroy(&self) {
        self.release_hangs();
        self.inner.destroy()
    }
    fn save_state(&self) -> Result<Vec<u8>, crate::server::state::StateError> {
        self.inner.save_state()
    }
    fn load_state(&self, state: &[u8]) -> Result<(), crate::server::state::StateError> {
        self.inner.load_state(state)
    }
    fn lookup(&self, ctx: &Ctx, parent: F::Inode, name: &[u8]) -> FsResult<Entry<F::Inode>> {
        self.gate(Opcode::Lookup, ctx, || self.inner.lookup(ctx, parent, name))
    }
    fn forget(&self, inode: F::Inode, nlookup: u64) {
        self.inner.forget(inode, nlookup)
    }
    fn getattr(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        handle: Option<F::Handle>,
    ) -> FsResult<(Attr, Duration)> {
        self.gate(Opcode::Getattr, ctx, || {
            self.inner.getattr(ctx, inode, handle)
        })
    }
    fn setattr(&self, ctx: &Ctx, inode: F::Inode, arg: &SetattrIn) -> FsResult<(Attr, Duration)> {
        self.gate(Opcode::Setattr, ctx, || self.inner.setattr(ctx, inode, arg))
    }
    fn readlink(&self, ctx: &Ctx, inode: F::Inode) -> FsResult<Vec<u8>> {
        self.gate(Opcode::Readlink, ctx, || self.inner.readlink(ctx, inode))
    }
    fn symlink(
        &self,
        ctx: &Ctx,
        parent: F::Inode,
        name: &[u8],
        target: &[u8],
    ) -> FsResult<Entry<F::Inode>> {
        self.gate(Opcode::Symlink, ctx, || {
            self.inner.symlink(ctx, parent, name, target)
        })
    }
    fn mknod(
        &self,
        ctx: &Ctx,
        parent: F::Inode,
        name: &[u8],
        mode: u32,
        rdev: u32,
        umask: u32,
    ) -> FsResult<Entry<F::Inode>> {
        self.gate(Opcode::Mknod, ctx, || {
            self.inner.mknod(ctx, parent, name, mode, rdev, umask)
        })
    }
    fn mkdir(
        &self,
        ctx: &Ctx,
        parent: F::Inode,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> FsResult<Entry<F::Inode>> {
        self.gate(Opcode::Mkdir, ctx, || {
            self.inner.mkdir(ctx, parent, name, mode, umask)
        })
    }
    fn unlink(&self, ctx: &Ctx, parent: F::Inode, name: &[u8]) -> FsResult<()> {
        self.gate(Opcode::Unlink, ctx, || self.inner.unlink(ctx, parent, name))
    }
    fn rmdir(&self, ctx: &Ctx, parent: F::Inode, name: &[u8]) -> FsResult<()> {
        self.gate(Opcode::Rmdir, ctx, || self.inner.rmdir(ctx, parent, name))
    }
    fn rename(
        &self,
        ctx: &Ctx,
        parent: F::Inode,
        name: &[u8],
        newparent: F::Inode,
        newname: &[u8],
        flags: u32,
    ) -> FsResult<()> {
        self.gate(Opcode::Rename, ctx, || {
            self.inner
                .rename(ctx, parent, name, newparent, newname, flags)
        })
    }
    fn link(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        newparent: F::Inode,
        newname: &[u8],
    ) -> FsResult<Entry<F::Inode>> {
        self.gate(Opcode::Link, ctx, || {
            self.inner.link(ctx, inode, newparent, newname)
        })
    }
    fn open(&self, ctx: &Ctx, inode: F::Inode, flags: u32) -> FsResult<Opened<F::Handle>> {
        self.gate(Opcode::Open, ctx, || self.inner.open(ctx, inode, flags))
    }
    fn read(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        handle: F::Handle,
        offset: u64,
        sink: &mut dyn ReadSink,
    ) -> FsResult<usize> {
        match self.decide(Opcode::Read, ctx.unique) {
            Decision::Fail(e) => Err(e),
            Decision::Run => self.inner.read(ctx, inode, handle, offset, sink),
            Decision::Short(r) => {
                let by_ref = sink.client().map(|(_, n)| n);
                let len = match by_ref {
                    Some(n) => n,
                    None => sink.buffer().len(),
                };
                let mut short = ShortSink {
                    inner: sink,
                    n: cut(len, r),
                };
                self.inner.read(ctx, inode, handle, offset, &mut short)
            }
        }
    }
    fn start_read(
        &self,
        io: &mut FaultyIo<F::Io>,
        out: &mut crate::server::Completions,
        ctx: &Ctx,
        inode: F::Inode,
        handle: F::Handle,
        offset: u64,
        len: usize,
        mem: &Arc<dyn crate::chan::ClientMem>,
        done: crate::server::IoDone,
    ) -> Result<(), crate::server::IoDone> {
        if self.plan.rules.is_empty() {
            return self.inner.start_read(
                &mut io.inner,
                out,
                ctx,
                inode,
                handle,
                offset,
                len,
                mem,
                done,
            );
        }
        // Without started-I/O faults, READs go the usual way, where the plan
        // applies.
        if !self.started_reads {
            return Err(done);
        }
        let read = started_reads::Read {
            ctx,
            inode,
            handle,
            offset,
            len,
            mem: mem.clone(),
        };
        self.read_started(io, out, read, done);
        Ok(())
    }
    fn start_write(
        &self,
        io: &mut FaultyIo<F::Io>,
        out: &mut crate::server::Completions,
        ctx: &Ctx,
        inode: F::Inode,
        handle: F::Handle,
        offset: u64,
        mem: &Arc<dyn crate::chan::ClientMem>,
        flags: u32,
        done: crate::server::IoDone,
    ) -> Result<(), crate::server::IoDone> {
        // With a plan, WRITEs go the usual way, where it applies.
        if !self.plan.rules.is_empty() {
            return Err(done);
        }
        self.inner.start_write(
            &mut io.inner,
            out,
            ctx,
            inode,
            handle,
            offset,
            mem,
            flags,
            done,
        )
    }
    fn start_fsync(
        &self,
        io: &mut FaultyIo<F::Io>,
        out: &mut crate::server::Completions,
        ctx: &Ctx,
        inode: F::Inode,
        handle: F::Handle,
        datasync: bool,
        dir: bool,
        done: crate::server::IoDone,
    ) -> Result<(), crate::server::IoDone> {
        // With a plan, syncs go the usual way, where it applies.
        if !self.plan.rules.is_empty() {
            return Err(done);
        }
        self.inner
            .start_fsync(&mut io.inner, out, ctx, inode, handle, datasync, dir, done)
    }
    fn start_fallocate(
        &self,
        io: &mut FaultyIo<F::Io>,
        out: &mut crate::server::Completions,
        ctx: &Ctx,
        inode: F::Inode,
        handle: F::Handle,
        mode: u32,
        offset: u64,
        length: u64,
        done: crate::server::IoDone,
    ) -> Result<(), crate::server::IoDone> {
        // With a plan, FALLOCATEs go the usual way, where it applies.
        if !self.plan.rules.is_empty() {
            return Err(done);
        }
        self.inner.start_fallocate(
            &mut io.inner,
            out,
            ctx,
            inode,
            handle,
            mode,
            offset,
            length,
            done,
        )
    }
    fn submit_started(&self, io: &mut FaultyIo<F::Io>) {
        self.inner.submit_started(&mut io.inner)
    }
    fn collect_started(
        &self,
        io: &mut FaultyIo<F::Io>,
        out: &mut crate::server::Completions,
    ) -> usize {
        self.completed(io, out)
    }
    fn started_in_flight(&self, io: &FaultyIo<F::Io>) -> usize {
        self.inner.started_in_flight(&io.inner)
    }
    fn started_fd(&self, io: &FaultyIo<F::Io>) -> Option<i32> {
        self.inner.started_fd(&io.inner)
    }
    fn write(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        handle: F::Handle,
        offset: u64,
        src: &dyn WriteSource,
        flags: u32,
    ) -> FsResult<usize> {
        match self.decide(Opcode::Write, ctx.unique) {
            Decision::Fail(e) => Err(e),
            Decision::Run => self.inner.write(ctx, inode, handle, offset, src, flags),
            Decision::Short(r) => {
                let data = src.data();
                if data.is_empty() {
                    return self.inner.write(ctx, inode, handle, offset, src, flags);
                }
                let short = ShortSource {
                    data: data[..cut(data.len(), r)].to_vec(),
                };
                self.inner.write(ctx, inode, handle, offset, &short, flags)
            }
        }
    }
    fn flush(&self, ctx: &Ctx, inode: F::Inode, handle: F::Handle, owner: u64) -> FsResult<()> {
        self.gate(Opcode::Flush, ctx, || {
            self.inner.flush(ctx, inode, handle, owner)
        })
    }
    fn release(&self, ctx: &Ctx, inode: F::Inode, handle: F::Handle, flags: u32) -> FsResult<()> {
        // Never faulted: a handle that is not released would leak.
        self.inner.release(ctx, inode, handle, flags)
    }
    fn fsync(&self, ctx: &Ctx, inode: F::Inode, handle: F::Handle, datasync: bool) -> FsResult<()> {
        self.gate(Opcode::Fsync, ctx, || {
            self.inner.fsync(ctx, inode, handle, datasync)
        })
    }
    fn opendir(&self, ctx: &Ctx, inode: F::Inode, flags: u32) -> FsResult<Opened<F::Handle>> {
        self.gate(Opcode::Opendir, ctx, || {
            self.inner.opendir(ctx, inode, flags)
        })
    }
    fn readdir(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        handle: F::Handle,
        offset: u64,
        sink: &mut dyn DirSink,
    ) -> FsResult<()> {
        self.gate(Opcode::Readdir, ctx, || {
            self.inner.readdir(ctx, inode, handle, offset, sink)
        })
    }
    fn releasedir(&self, ctx: &Ctx, inode: F::Inode, handle: F::Handle) -> FsResult<()> {
        self.inner.releasedir(ctx, inode, handle)
    }
    fn fsyncdir(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        handle: F::Handle,
        datasync: bool,
    ) -> FsResult<()> {
        self.gate(Opcode::Fsyncdir, ctx, || {
            self.inner.fsyncdir(ctx, inode, handle, datasync)
        })
    }
    fn statfs(&self, ctx: &Ctx, inode: F::Inode) -> FsResult<Kstatfs> {
        self.gate(Opcode::Statfs, ctx, || self.inner.statfs(ctx, inode))
    }
    fn setxattr(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        name: &[u8],
        value: &[u8],
        flags: u32,
        ext_flags: u32,
    ) -> FsResult<()> {
        self.gate(Opcode::Setxattr, ctx, || {
            self.inner
                .setxattr(ctx, inode, name, value, flags, ext_flags)
        })
    }
    fn getxattr(&self, ctx: &Ctx, inode: F::Inode, name: &[u8], size: u32) -> FsResult<Xattr> {
        self.gate(Opcode::Getxattr, ctx, || {
            self.inner.getxattr(ctx, inode, name, size)
        })
    }
    fn listxattr(&self, ctx: &Ctx, inode: F::Inode, size: u32) -> FsResult<Xattr> {
        self.gate(Opcode::Listxattr, ctx, || {
            self.inner.listxattr(ctx, inode, size)
        })
    }
    fn removexattr(&self, ctx: &Ctx, inode: F::Inode, name: &[u8]) -> FsResult<()> {
        self.gate(Opcode::Removexattr, ctx, || {
            self.inner.removexattr(ctx, inode, name)
        })
    }
    fn access(&self, ctx: &Ctx, inode: F::Inode, mask: u32) -> FsResult<()> {
        self.gate(Opcode::Access, ctx, || self.inner.access(ctx, inode, mask))
    }
    fn create(
        &self,
        ctx: &Ctx,
        parent: F::Inode,
        name: &[u8],
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> FsResult<Created<F::Inode, F::Handle>> {
        self.gate(Opcode::Create, ctx, || {
            self.inner.create(ctx, parent, name, mode, flags, umask)
        })
    }
    fn fallocate(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        handle: F::Handle,
        mode: u32,
        offset: u64,
        length: u64,
    ) -> FsResult<()> {
        self.gate(Opcode::Fallocate, ctx, || {
            self.inner
                .fallocate(ctx, inode, handle, mode, offset, length)
        })
    }
    fn lseek(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        handle: F::Handle,
        offset: u64,
        whence: u32,
    ) -> FsResult<u64> {
        self.gate(Opcode::Lseek, ctx, || {
            self.inner.lseek(ctx, inode, handle, offset, whence)
        })
    }
    fn syncfs(&self, ctx: &Ctx, inode: F::Inode) -> FsResult<()> {
        self.gate(Opcode::Syncfs, ctx, || self.inner.syncfs(ctx, inode))
    }
    fn readdirplus(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        handle: F::Handle,
        offset: u64,
        sink: &mut dyn DirPlusSink,
    ) -> FsResult<()> {
        self.gate(Opcode::Readdirplus, ctx, || {
            self.inner.readdirplus(ctx, inode, handle, offset, sink)
        })
    }
    fn getlk(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        handle: F::Handle,
        req: &LockReq,
    ) -> FsResult<FileLock> {
        self.gate(Opcode::Getlk, ctx, || {
            self.inner.getlk(ctx, inode, handle, req)
        })
    }
    fn setlk(&self, ctx: &Ctx, inode: F::Inode, handle: F::Handle, req: &LockReq) -> FsResult<()> {
        self.gate(Opcode::Setlk, ctx, || {
            self.inner.setlk(ctx, inode, handle, req)
        })
    }
    fn setlkw(&self, ctx: &Ctx, inode: F::Inode, handle: F::Handle, req: &LockReq, done: Deferred) {
        match self.decide(Opcode::Setlkw, ctx.unique) {
            Decision::Fail(e) => done.complete(Err(e)),
            Decision::Run | Decision::Short(_) => self.inner.setlkw(ctx, inode, handle, req, done),
        }
    }
    fn interrupt(&self, unique: u64) {
        if self.plan.rules.iter().any(|r| r.fault == Fault::Hang) {
            let mut h = lock(&self.hung);
            if let Some(i) = h.parked.iter().position(|(u, _, _)| *u == unique) {
                let (_, done, back) = h.parked.swap_remove(i);
                drop(h);
                self.counts
                    .hangs_interrupted
                    .fetch_add(1, Ordering::Relaxed);
                back.give(done, Err(Errno::EINTR));
                return self.inner.interrupt(unique);
            }
            // Interrupts of calls that never hung would pile up: keep a
            // bounded set (a hang checks it as soon as it starts).
            if h.interrupted.len() >= 4096 {
                h.interrupted.clear();
            }
            h.interrupted.insert(unique);
            self.hung_cv.notify_all();
        }
        self.inner.interrupt(unique)
    }
    fn tmpfile(
        &self,
        ctx: &Ctx,
        parent: F::Inode,
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> FsResult<Created<F::Inode, F::Handle>> {
        self.gate(Opcode::Tmpfile, ctx, || {
            self.inner.tmpfile(ctx, parent, mode, flags, umask)
        })
    }
    #[allow(clippy::too_many_arguments)]
    fn copy_file_range(
        &self,
        ctx: &Ctx,
        inode_in: F::Inode,
        handle_in: F::Handle,
        off_in: u64,
        inode_out: F::Inode,
        handle_out: F::Handle,
        off_out: u64,
        len: u64,
        flags: u64,
    ) -> FsResult<u64> {
        self.gate(Opcode::CopyFileRange, ctx, || {
            self.inner.copy_file_range(
                ctx, inode_in, handle_in, off_in, inode_out, handle_out, off_out, len, flags,
            )
        })
    }
    fn statx(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        handle: Option<F::Handle>,
        flags: u32,
        mask: u32,
    ) -> FsResult<(Statx, Duration)> {
        self.gate(Opcode::Statx, ctx, || {
            self.inner.statx(ctx, inode, handle, flags, mask)
        })
    }
    fn map_source(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        handle: Option<F::Handle>,
        write: bool,
        map: &mut dyn FnMut(MapSource<'_>) -> FsResult<()>,
    ) -> FsResult<()> {
        self.gate(Opcode::Setupmapping, ctx, || {
            self.inner.map_source(ctx, inode, handle, write, map)
        })
    }
}
