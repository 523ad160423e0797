//! [`Filesystem`] for [`PassthroughFs`]: each operation forwards to the
//! module that implements it. An operation that changes the host first
//! enters its request's fence ([`Ctx::enter_host`]): a request its client
//! gave up (a device's stopped vring) fails with EINTR instead of acting,
//! and one already acting is counted until it returns.

use super::{PassthroughFs, PassthroughIo};
use fuse_core::abi::{Attr, FileLock, Kstatfs, SetattrIn, Statx, Xattr};
use fuse_core::server::state::StateError;
use fuse_core::server::{
    Completions, Created, Ctx, Deferred, DirPlusSink, DirSink, Entry, Filesystem, FsResult, IoDone,
    LockReq, MapSource, Opened, ReadSink, Wake, WriteSource,
};
use std::time::Duration;

impl Filesystem for PassthroughFs {
    type Inode = u64;
    type Handle = u64;
    type Io = PassthroughIo;

    /// A serving loop's ring, made when it first starts I/O (its eventfd
    /// says when to take completions: no wake-up is needed).
    fn new_io(&self, _: Wake) -> PassthroughIo {
        PassthroughIo::default()
    }

    fn init(&self, capable: u64) -> FsResult<u64> {
        self.init_flags(capable)
    }
    fn destroy(&self) {
        self.op_destroy();
    }
    fn save_state(&self) -> Result<Vec<u8>, StateError> {
        self.save_migration_state()
    }
    fn load_state(&self, state: &[u8]) -> Result<(), StateError> {
        self.load_migration_state(state)
    }
    fn lookup(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> FsResult<Entry<u64>> {
        self.op_lookup(ctx, parent, name)
    }
    fn forget(&self, inode: u64, nlookup: u64) {
        self.op_forget(inode, nlookup);
    }
    fn getattr(&self, _ctx: &Ctx, inode: u64, handle: Option<u64>) -> FsResult<(Attr, Duration)> {
        self.op_getattr(inode, handle)
    }
    fn setattr(&self, ctx: &Ctx, inode: u64, arg: &SetattrIn) -> FsResult<(Attr, Duration)> {
        let _host = ctx.enter_host()?;
        self.op_setattr(ctx, inode, arg)
    }
    fn readlink(&self, _ctx: &Ctx, inode: u64) -> FsResult<Vec<u8>> {
        self.op_readlink(inode)
    }
    fn symlink(&self, ctx: &Ctx, parent: u64, name: &[u8], target: &[u8]) -> FsResult<Entry<u64>> {
        let _host = ctx.enter_host()?;
        self.op_symlink(ctx, parent, name, target)
    }
    fn mknod(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u32,
        umask: u32,
    ) -> FsResult<Entry<u64>> {
        let _host = ctx.enter_host()?;
        self.op_mknod(ctx, parent, name, mode, rdev, umask)
    }
    fn mkdir(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> FsResult<Entry<u64>> {
        let _host = ctx.enter_host()?;
        self.op_mkdir(ctx, parent, name, mode, umask)
    }
    fn unlink(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> FsResult<()> {
        let _host = ctx.enter_host()?;
        self.op_unlink(ctx, parent, name)
    }
    fn rmdir(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> FsResult<()> {
        let _host = ctx.enter_host()?;
        self.op_rmdir(ctx, parent, name)
    }
    fn rename(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
    ) -> FsResult<()> {
        let _host = ctx.enter_host()?;
        self.op_rename(ctx, parent, name, newparent, newname, flags)
    }
    fn link(&self, ctx: &Ctx, inode: u64, newparent: u64, newname: &[u8]) -> FsResult<Entry<u64>> {
        let _host = ctx.enter_host()?;
        self.op_link(ctx, inode, newparent, newname)
    }
    fn open(&self, ctx: &Ctx, inode: u64, flags: u32) -> FsResult<Opened<u64>> {
        let _host = ctx.enter_host()?;
        self.op_open(ctx, inode, flags, false)
    }
    fn read(
        &self,
        ctx: &Ctx,
        _inode: u64,
        handle: u64,
        offset: u64,
        sink: &mut dyn ReadSink,
    ) -> FsResult<usize> {
        self.op_read(ctx, handle, offset, sink)
    }
    fn start_read(
        &self,
        io: &mut PassthroughIo,
        out: &mut Completions,
        ctx: &Ctx,
        _inode: u64,
        handle: u64,
        offset: u64,
        len: usize,
        mem: &std::sync::Arc<dyn fuse_core::ClientMem>,
        done: IoDone,
    ) -> Result<(), IoDone> {
        self.op_start_read(io, out, ctx.unique, handle, offset, len, mem, done)
    }
    fn start_write(
        &self,
        io: &mut PassthroughIo,
        _: &mut Completions,
        ctx: &Ctx,
        _inode: u64,
        handle: u64,
        offset: u64,
        mem: &std::sync::Arc<dyn fuse_core::ClientMem>,
        flags: u32,
        done: IoDone,
    ) -> Result<(), IoDone> {
        self.op_start_write(io, ctx, handle, offset, mem, flags, done)
    }
    fn start_fsync(
        &self,
        io: &mut PassthroughIo,
        _: &mut Completions,
        ctx: &Ctx,
        _inode: u64,
        handle: u64,
        datasync: bool,
        _dir: bool,
        done: IoDone,
    ) -> Result<(), IoDone> {
        self.op_start_fsync(io, ctx.unique, handle, datasync, done)
    }
    fn start_fallocate(
        &self,
        io: &mut PassthroughIo,
        _: &mut Completions,
        ctx: &Ctx,
        _inode: u64,
        handle: u64,
        mode: u32,
        offset: u64,
        length: u64,
        done: IoDone,
    ) -> Result<(), IoDone> {
        self.op_start_fallocate(io, ctx, handle, mode, offset, length, done)
    }
    fn submit_started(&self, io: &mut PassthroughIo) {
        self.op_submit_started(io)
    }
    fn collect_started(&self, io: &mut PassthroughIo, out: &mut Completions) -> usize {
        self.op_collect_started(io, out)
    }
    fn started_in_flight(&self, io: &PassthroughIo) -> usize {
        self.op_started_in_flight(io)
    }
    fn started_fd(&self, io: &PassthroughIo) -> Option<i32> {
        self.op_started_fd(io)
    }
    fn write(
        &self,
        ctx: &Ctx,
        _inode: u64,
        handle: u64,
        offset: u64,
        src: &dyn WriteSource,
        flags: u32,
    ) -> FsResult<usize> {
        let _host = ctx.enter_host()?;
        self.op_write(ctx, handle, offset, src, flags)
    }
    fn flush(&self, _ctx: &Ctx, _inode: u64, handle: u64, owner: u64) -> FsResult<()> {
        self.op_flush(handle, owner)
    }
    fn release(&self, _ctx: &Ctx, _inode: u64, handle: u64, _flags: u32) -> FsResult<()> {
        self.op_release(handle)
    }
    fn fsync(&self, ctx: &Ctx, _inode: u64, handle: u64, datasync: bool) -> FsResult<()> {
        self.op_fsync(ctx, handle, datasync)
    }
    fn opendir(&self, ctx: &Ctx, inode: u64, flags: u32) -> FsResult<Opened<u64>> {
        let _host = ctx.enter_host()?;
        self.op_open(ctx, inode, flags, true)
    }
    fn readdir(
        &self,
        _ctx: &Ctx,
        _inode: u64,
        handle: u64,
        offset: u64,
        sink: &mut dyn DirSink,
    ) -> FsResult<()> {
        self.op_readdir(handle, offset, sink)
    }
    fn readdirplus(
        &self,
        ctx: &Ctx,
        inode: u64,
        handle: u64,
        offset: u64,
        sink: &mut dyn DirPlusSink,
    ) -> FsResult<()> {
        self.op_readdirplus(ctx, inode, handle, offset, sink)
    }
    fn releasedir(&self, _ctx: &Ctx, _inode: u64, handle: u64) -> FsResult<()> {
        self.op_release(handle)
    }
    fn fsyncdir(&self, ctx: &Ctx, _inode: u64, handle: u64, datasync: bool) -> FsResult<()> {
        self.op_fsync(ctx, handle, datasync)
    }
    fn statfs(&self, _ctx: &Ctx, inode: u64) -> FsResult<Kstatfs> {
        self.op_statfs(inode)
    }
    fn setxattr(
        &self,
        ctx: &Ctx,
        inode: u64,
        name: &[u8],
        value: &[u8],
        flags: u32,
        ext_flags: u32,
    ) -> FsResult<()> {
        let _host = ctx.enter_host()?;
        self.op_setxattr(ctx, inode, name, value, flags, ext_flags)
    }
    fn getxattr(&self, ctx: &Ctx, inode: u64, name: &[u8], size: u32) -> FsResult<Xattr> {
        self.op_getxattr(ctx, inode, name, size)
    }
    fn listxattr(&self, ctx: &Ctx, inode: u64, size: u32) -> FsResult<Xattr> {
        self.op_listxattr(ctx, inode, size)
    }
    fn removexattr(&self, ctx: &Ctx, inode: u64, name: &[u8]) -> FsResult<()> {
        let _host = ctx.enter_host()?;
        self.op_removexattr(ctx, inode, name)
    }
    fn access(&self, ctx: &Ctx, inode: u64, mask: u32) -> FsResult<()> {
        self.op_access(ctx, inode, mask)
    }
    fn create(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> FsResult<Created<u64, u64>> {
        let _host = ctx.enter_host()?;
        self.op_create(ctx, parent, name, mode, flags, umask)
    }
    fn fallocate(
        &self,
        ctx: &Ctx,
        _inode: u64,
        handle: u64,
        mode: u32,
        offset: u64,
        length: u64,
    ) -> FsResult<()> {
        let _host = ctx.enter_host()?;
        self.op_fallocate(ctx, handle, mode, offset, length)
    }
    fn lseek(
        &self,
        _ctx: &Ctx,
        _inode: u64,
        handle: u64,
        offset: u64,
        whence: u32,
    ) -> FsResult<u64> {
        self.op_lseek(handle, offset, whence)
    }
    fn syncfs(&self, _ctx: &Ctx, inode: u64) -> FsResult<()> {
        self.op_syncfs(inode)
    }
    fn getlk(&self, _ctx: &Ctx, _inode: u64, handle: u64, req: &LockReq) -> FsResult<FileLock> {
        self.op_getlk(handle, req)
    }
    fn setlk(&self, ctx: &Ctx, _inode: u64, handle: u64, req: &LockReq) -> FsResult<()> {
        let _host = ctx.enter_host()?;
        self.op_setlk(ctx, handle, req)
    }
    fn setlkw(&self, ctx: &Ctx, _inode: u64, handle: u64, req: &LockReq, done: Deferred) {
        // Held while the lock is tried and the wait parked; a parked wait
        // is ended by the interrupt its client sends when it gives it up.
        match ctx.enter_host() {
            Ok(_host) => self.op_setlkw(ctx, handle, req, done),
            Err(e) => done.complete(Err(e)),
        }
    }
    fn interrupt(&self, unique: u64) {
        self.locks.interrupt(unique);
        self.cancel_io(unique);
    }
    fn tmpfile(
        &self,
        ctx: &Ctx,
        parent: u64,
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> FsResult<Created<u64, u64>> {
        let _host = ctx.enter_host()?;
        self.op_tmpfile(ctx, parent, mode, flags, umask)
    }
    fn copy_file_range(
        &self,
        ctx: &Ctx,
        _inode_in: u64,
        handle_in: u64,
        off_in: u64,
        _inode_out: u64,
        handle_out: u64,
        off_out: u64,
        len: u64,
        flags: u64,
    ) -> FsResult<u64> {
        let _host = ctx.enter_host()?;
        self.op_copy_file_range(ctx, handle_in, off_in, handle_out, off_out, len, flags)
    }
    fn statx(
        &self,
        _ctx: &Ctx,
        inode: u64,
        handle: Option<u64>,
        flags: u32,
        mask: u32,
    ) -> FsResult<(Statx, Duration)> {
        self.op_statx(inode, handle, flags, mask)
    }
    fn map_source(
        &self,
        ctx: &Ctx,
        inode: u64,
        handle: Option<u64>,
        write: bool,
        map: &mut dyn FnMut(MapSource<'_>) -> FsResult<()>,
    ) -> FsResult<()> {
        let Some(fh) = handle else {
            // The inode's file, opened for the call as the caller.
            let _host = ctx.enter_host()?;
            let flags = if write { libc::O_RDWR } else { libc::O_RDONLY };
            let fh = self.op_open(ctx, inode, flags as u32, false)?.handle;
            let r = self.op_map_source(inode, fh, map);
            self.op_release(fh)?;
            return r;
        };
        self.op_map_source(inode, fh, map)
    }
}
