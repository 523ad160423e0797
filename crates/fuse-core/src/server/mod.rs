//! The server side: a transport-agnostic FUSE dispatcher over a
//! [`Filesystem`], and worker loops that attach it to a transport end. The
//! dispatcher depends on the ABI only, never on engine internals, so the
//! same code serves the in-process device, the emulated ring, and (through
//! host-mount) the host kernel's `/dev/fuse` and FUSE-over-io_uring.
//!
//! # Lookup counts
//!
//! Every successful reply that hands the kernel an entry (LOOKUP, MKNOD,
//! MKDIR, SYMLINK, LINK, CREATE, TMPFILE, and each entry of READDIRPLUS
//! other than "." and "..") adds one to that inode's lookup count. FORGET
//! and BATCH_FORGET subtract `nlookup`. An inode may be dropped by the
//! filesystem only when its count reaches zero; the root's count is never
//! decremented below one. A reply that fails after [`Filesystem::lookup`]
//! succeeded must not be sent; the dispatcher never does that.

mod dispatch;
mod engine;
pub mod faults;
mod started;
pub mod state;
mod uring_worker;
mod worker;

pub use dispatch::{DeferFn, Dispatcher, Handled, Outcome, ServerConfig};
pub use engine::{Engine, EngineConfig};
pub use started::{Completions, Start, StartedIo, Wake};
pub use uring_worker::{
    answer_slot, complete_started, run_ring_worker, serve_slot, RingSlot, RingTransport, Served,
};
pub use worker::{run_device_worker, serve_device, DeviceEnd};

use crate::abi::{Attr, FileLock, Kstatfs, SecurityContext, SetattrIn, Statx, SuppGids, Xattr};
use crate::chan::{ClientMem, Errno, Fence, FenceGuard};
use std::sync::Arc;
use std::time::Duration;

/// Result of a filesystem operation.
pub type FsResult<T> = Result<T, Errno>;

/// Who is asking, and what the request's extensions say about it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ctx<'a> {
    /// The request's unique id.
    pub unique: u64,
    /// Caller uid.
    pub uid: u32,
    /// Caller gid.
    pub gid: u32,
    /// Caller pid.
    pub pid: u32,
    /// The security label the new inode is to get: only on CREATE, MKNOD,
    /// MKDIR, SYMLINK and TMPFILE, only once the filesystem asked for
    /// FUSE_SECURITY_CTX in INIT ([`Filesystem::init`]) and the client
    /// agreed, and only when the client's LSM made one. A label extension
    /// that does not parse fails the request with EINVAL before the
    /// filesystem sees it.
    pub secctx: Option<SecurityContext<'a>>,
    /// Supplementary groups the client says the caller has (the
    /// FUSE_EXT_GROUPS extension: Linux sends the parent directory's group
    /// when the caller belongs to it and it is not its gid): only on
    /// CREATE, MKNOD, MKDIR, SYMLINK and TMPFILE, only once the filesystem
    /// asked for FUSE_CREATE_SUPP_GROUP in INIT and the client agreed;
    /// empty otherwise. An extension that does not parse fails the
    /// request with EINVAL before the filesystem sees it.
    pub groups: SuppGids<'a>,
    /// The fence the client may close to give the request up (a device
    /// whose ring was stopped): see [`Ctx::enter_host`].
    pub fence: Option<&'a Arc<Fence>>,
}

impl Ctx<'_> {
    /// Call right before a host call that changes something: EINTR if the
    /// client has given the request up (then nothing may be done for it);
    /// otherwise the call counts as running under the request's fence until
    /// the guard drops, so the client can wait for it.
    pub fn enter_host(&self) -> Result<Option<FenceGuard>, Errno> {
        match self.fence {
            None => Ok(None),
            Some(f) => f.enter().map(Some).ok_or(Errno::EINTR),
        }
    }
}

/// A directory entry handed to the kernel (adds one lookup reference).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<I> {
    /// The inode.
    pub inode: I,
    /// Generation: inode + generation are unique over the fs's lifetime.
    pub generation: u64,
    /// Attributes.
    pub attr: Attr,
    /// How long the name may be cached.
    pub entry_valid: Duration,
    /// How long the attributes may be cached.
    pub attr_valid: Duration,
}

/// An open file or directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened<H> {
    /// The handle.
    pub handle: H,
    /// `fopen` flags for the kernel.
    pub open_flags: u32,
    /// With `fopen::PASSTHROUGH`: the backing id (from the kernel's
    /// FUSE_DEV_IOC_BACKING_OPEN) the kernel does this file's reads,
    /// writes and mmaps on. 0 otherwise.
    pub backing_id: u32,
}

/// What CREATE returns: the new entry and its open handle.
pub type Created<I, H> = (Entry<I>, Opened<H>);

/// Where READDIR entries go. `add` returns false once the buffer is full;
/// the filesystem stops and the kernel asks again from the last offset.
pub trait DirSink {
    /// Adds one entry; `offset` is the offset of the *next* entry.
    fn add(&mut self, ino: u64, offset: u64, typ: u32, name: &[u8]) -> bool;
}

/// Where READDIRPLUS entries go. The filesystem asks [`DirPlusSink::room`]
/// before it looks an entry up, so it never takes a lookup reference for an
/// entry that does not fit.
pub trait DirPlusSink {
    /// Whether an entry with a name of `namelen` bytes still fits.
    fn room(&self, namelen: usize) -> bool;
    /// Adds one entry; `entry` is `None` for "." and ".." (no lookup
    /// reference is handed over). Returns false if it did not fit, in which
    /// case the caller still owns the reference and must drop it.
    fn add(
        &mut self,
        entry: Option<Entry<u64>>,
        ino: u64,
        offset: u64,
        typ: u32,
        name: &[u8],
    ) -> bool;
}

/// Completes a parked request (a blocking SETLKW) from any thread with 0 or
/// an errno. Dropping it unanswered answers EIO.
pub struct Deferred {
    done: Option<Box<dyn FnOnce(i32) + Send>>,
}

impl std::fmt::Debug for Deferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deferred").finish_non_exhaustive()
    }
}

impl Deferred {
    /// A completion that runs `done` with the wire error (0 or -errno).
    pub fn new(done: impl FnOnce(i32) + Send + 'static) -> Self {
        Deferred {
            done: Some(Box::new(done)),
        }
    }
    /// Answers the parked request.
    pub fn complete(mut self, r: FsResult<()>) {
        if let Some(d) = self.done.take() {
            d(r.err().map_or(0, Errno::to_wire));
        }
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        if let Some(d) = self.done.take() {
            d(Errno::EIO.to_wire());
        }
    }
}

/// The token of a READ, WRITE, FSYNC, FSYNCDIR or FALLOCATE whose host
/// I/O a filesystem started without waiting ([`Filesystem::start_read`]
/// and the others): the request's unique, and the fence guard that keeps
/// started host I/O that changes something counted under its request's
/// fence until it is handed back (its host I/O is over by then). The
/// filesystem hands it back with the result into the serving loop's [`Completions`] (from
/// [`Filesystem::collect_started`] on that loop's thread, or before the
/// start returns); one that declines gives it back unused. A token dropped
/// instead answers nothing: its request stays held until its loop ends
/// (then the transport fails it).
pub struct IoDone {
    unique: u64,
    /// Keeps the started host I/O counted under its request's fence
    /// until it is handed back.
    fence: Option<FenceGuard>,
}

impl std::fmt::Debug for IoDone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoDone")
            .field("unique", &self.unique)
            .finish_non_exhaustive()
    }
}

impl IoDone {
    /// The token of request `unique`.
    pub fn new(unique: u64) -> Self {
        IoDone {
            unique,
            fence: None,
        }
    }
    /// The request's unique.
    pub fn unique(&self) -> u64 {
        self.unique
    }
    /// Counts the started host I/O under its request's fence (`g`, from
    /// [`Ctx::enter_host`]) until it is handed back or dropped.
    pub fn hold(&mut self, g: FenceGuard) {
        self.fence = Some(g);
    }
}

/// A lock request (GETLK/SETLK/SETLKW).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockReq {
    /// The lock owner (`fl_owner` of the client).
    pub owner: u64,
    /// The range and type (`typ` is F_RDLCK, F_WRLCK or F_UNLCK).
    pub lock: FileLock,
    /// A BSD flock(2) lock rather than a POSIX record lock.
    pub flock: bool,
}

/// Where READ data goes: the request's own reply buffer (device scratch,
/// ring payload buffer, or the client's pages on a zero-copy queue). The
/// filesystem writes into it directly and returns how much it wrote.
///
/// When the transport passes the client's memory by reference (a guest's
/// buffers), [`ReadSink::client`] offers it: a filesystem that can do host
/// I/O reads straight into its spans and returns how much it read. One that
/// calls [`ReadSink::buffer`] instead gets an ordinary buffer whose contents
/// are then copied to the client.
pub trait ReadSink {
    /// The buffer, exactly as large as the READ asked (or the transport's
    /// limit, whichever is smaller).
    fn buffer(&mut self) -> &mut [u8];
    /// The client's memory and how many bytes to read into it at most
    /// (what [`ReadSink::buffer`]'s length would be), when the data can go
    /// there directly.
    fn client(&self) -> Option<(&dyn ClientMem, usize)> {
        None
    }
}

/// Where WRITE data comes from, without an intermediate copy: the request's
/// buffer, or the client's memory by reference ([`WriteSource::client`]).
pub trait WriteSource {
    /// The data (copied out of the client's memory when it lives there).
    fn data(&self) -> &[u8];
    /// The client's memory holding the data, when the transport passed it
    /// by reference: a filesystem that can do host I/O writes from it and
    /// never needs [`WriteSource::data`].
    fn client(&self) -> Option<&dyn ClientMem> {
        None
    }
}

impl ReadSink for &mut [u8] {
    fn buffer(&mut self) -> &mut [u8] {
        self
    }
}

impl WriteSource for &[u8] {
    fn data(&self) -> &[u8] {
        self
    }
}

/// The file a DAX mapping maps ([`Filesystem::map_source`]), lent for
/// one call.
#[derive(Debug, Clone, Copy)]
pub struct MapSource<'a> {
    /// The handle's open file.
    pub fd: std::os::fd::BorrowedFd<'a>,
    /// Opened for writing: a writable mapping may be made of it.
    pub writable: bool,
    /// The file's size when it was lent.
    pub size: u64,
}

/// A FUSE filesystem. Every operation defaults to ENOSYS. `Inode` and
/// `Handle` map to the protocol's 64-bit node ids and file handles.
#[allow(unused_variables)]
pub trait Filesystem: Send + Sync {
    /// Inode type (node id 1 is the root).
    type Inode: Copy + From<u64> + Into<u64> + Send + Sync;
    /// File and directory handle type.
    type Handle: Copy + From<u64> + Into<u64> + Send + Sync;
    /// The host I/O context of one serving loop (an I/O ring, the I/O
    /// started on it): made by [`Filesystem::new_io`] for a loop, owned by
    /// it and lent to the calls that start I/O and take its completions,
    /// so what one loop started only that loop completes. `()` for a
    /// filesystem that starts nothing.
    type Io: Send + 'static;

    /// The host I/O context of a serving loop; `wake` wakes that loop when
    /// I/O it started ends on another thread (to take it with
    /// [`Filesystem::collect_started`]).
    fn new_io(&self, wake: Wake) -> Self::Io;

    /// INIT: `capable` are the INIT flags the kernel offers; returns those
    /// the filesystem wants (the dispatcher keeps only offered ones).
    fn init(&self, capable: u64) -> FsResult<u64> {
        Ok(0)
    }
    /// DESTROY.
    fn destroy(&self) {}
    /// Live migration, source side: what the client holds (node ids it
    /// looked up, handles it opened) as bytes another instance of the same
    /// filesystem can take up with [`Filesystem::load_state`]. Called while
    /// no request is being served.
    fn save_state(&self) -> Result<Vec<u8>, state::StateError> {
        Err(state::StateError::Unsupported)
    }
    /// Live migration, destination side: takes up state saved by
    /// [`Filesystem::save_state`] before any request of the migrated
    /// client arrives.
    fn load_state(&self, state: &[u8]) -> Result<(), state::StateError> {
        Err(state::StateError::Unsupported)
    }
    /// LOOKUP `name` in `parent`.
    fn lookup(&self, ctx: &Ctx, parent: Self::Inode, name: &[u8]) -> FsResult<Entry<Self::Inode>> {
        Err(Errno::ENOSYS)
    }
    /// FORGET / one entry of BATCH_FORGET.
    fn forget(&self, inode: Self::Inode, nlookup: u64) {}
    /// GETATTR.
    fn getattr(
        &self,
        ctx: &Ctx,
        inode: Self::Inode,
        handle: Option<Self::Handle>,
    ) -> FsResult<(Attr, Duration)> {
        Err(Errno::ENOSYS)
    }
    /// SETATTR (`valid` bits in `arg.valid`).
    fn setattr(
        &self,
        ctx: &Ctx,
        inode: Self::Inode,
        arg: &SetattrIn,
    ) -> FsResult<(Attr, Duration)> {
        Err(Errno::ENOSYS)
    }
    /// READLINK.
    fn readlink(&self, ctx: &Ctx, inode: Self::Inode) -> FsResult<Vec<u8>> {
        Err(Errno::ENOSYS)
    }
    /// SYMLINK `name` -> `target` in `parent`.
    fn symlink(
        &self,
        ctx: &Ctx,
        parent: Self::Inode,
        name: &[u8],
        target: &[u8],
    ) -> FsResult<Entry<Self::Inode>> {
        Err(Errno::ENOSYS)
    }
    /// MKNOD.
    fn mknod(
        &self,
        ctx: &Ctx,
        parent: Self::Inode,
        name: &[u8],
        mode: u32,
        rdev: u32,
        umask: u32,
    ) -> FsResult<Entry<Self::Inode>> {
        Err(Errno::ENOSYS)
    }
    /// MKDIR.
    fn mkdir(
        &self,
        ctx: &Ctx,
        parent: Self::Inode,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> FsResult<Entry<Self::Inode>> {
        Err(Errno::ENOSYS)
    }
    /// UNLINK.
    fn unlink(&self, ctx: &Ctx, parent: Self::Inode, name: &[u8]) -> FsResult<()> {
        Err(Errno::ENOSYS)
    }
    /// RMDIR.
    fn rmdir(&self, ctx: &Ctx, parent: Self::Inode, name: &[u8]) -> FsResult<()> {
        Err(Errno::ENOSYS)
    }
    /// RENAME / RENAME2 (`flags`: RENAME_NOREPLACE, RENAME_EXCHANGE, ...).
    fn rename(
        &self,
        ctx: &Ctx,
        parent: Self::Inode,
        name: &[u8],
        newparent: Self::Inode,
        newname: &[u8],
        flags: u32,
    ) -> FsResult<()> {
        Err(Errno::ENOSYS)
    }
    /// LINK `inode` as `newname` in `newparent`.
    fn link(
        &self,
        ctx: &Ctx,
        inode: Self::Inode,
        newparent: Self::Inode,
        newname: &[u8],
    ) -> FsResult<Entry<Self::Inode>> {
        Err(Errno::ENOSYS)
    }
    /// OPEN.
    fn open(&self, ctx: &Ctx, inode: Self::Inode, flags: u32) -> FsResult<Opened<Self::Handle>> {
        Err(Errno::ENOSYS)
    }
    /// READ into `sink`; returns the bytes written (short at end of file).
    fn read(
        &self,
        ctx: &Ctx,
        inode: Self::Inode,
        handle: Self::Handle,
        offset: u64,
        sink: &mut dyn ReadSink,
    ) -> FsResult<usize> {
        Err(Errno::ENOSYS)
    }
    /// WRITE from `src`; returns the bytes written.
    fn write(
        &self,
        ctx: &Ctx,
        inode: Self::Inode,
        handle: Self::Handle,
        offset: u64,
        src: &dyn WriteSource,
        flags: u32,
    ) -> FsResult<usize> {
        Err(Errno::ENOSYS)
    }
    /// FLUSH.
    fn flush(
        &self,
        ctx: &Ctx,
        inode: Self::Inode,
        handle: Self::Handle,
        owner: u64,
    ) -> FsResult<()> {
        Err(Errno::ENOSYS)
    }
    /// RELEASE.
    fn release(
        &self,
        ctx: &Ctx,
        inode: Self::Inode,
        handle: Self::Handle,
        flags: u32,
    ) -> FsResult<()> {
        Ok(())
    }
    /// FSYNC.
    fn fsync(
        &self,
        ctx: &Ctx,
        inode: Self::Inode,
        handle: Self::Handle,
        datasync: bool,
    ) -> FsResult<()> {
        Err(Errno::ENOSYS)
    }
    /// OPENDIR.
    fn opendir(&self, ctx: &Ctx, inode: Self::Inode, flags: u32) -> FsResult<Opened<Self::Handle>> {
        Err(Errno::ENOSYS)
    }
    /// READDIR from `offset` into `sink`.
    fn readdir(
        &self,
        ctx: &Ctx,
        inode: Self::Inode,
        handle: Self::Handle,
        offset: u64,
        sink: &mut dyn DirSink,
    ) -> FsResult<()> {
        Err(Errno::ENOSYS)
    }
    /// RELEASEDIR.
    fn releasedir(&self, ctx: &Ctx, inode: Self::Inode, handle: Self::Handle) -> FsResult<()> {
        Ok(())
    }
    /// FSYNCDIR.
    fn fsyncdir(
        &self,
        ctx: &Ctx,
        inode: Self::Inode,
        handle: Self::Handle,
        datasync: bool,
    ) -> FsResult<()> {
        Err(Errno::ENOSYS)
    }
    /// STATFS.
    fn statfs(&self, ctx: &Ctx, inode: Self::Inode) -> FsResult<Kstatfs> {
        Err(Errno::ENOSYS)
    }
    /// SETXATTR. `flags` are setxattr(2)'s (XATTR_CREATE, XATTR_REPLACE);
    /// `ext_flags` the FUSE_SETXATTR_* bits of a SETXATTR_EXT connection
    /// (0 otherwise), such as `SETXATTR_ACL_KILL_SGID`.
    fn setxattr(
        &self,
        ctx: &Ctx,
        inode: Self::Inode,
        name: &[u8],
        value: &[u8],
        flags: u32,
        ext_flags: u32,
    ) -> FsResult<()> {
        Err(Errno::ENOSYS)
    }
    /// GETXATTR (`size` 0 asks for the size only).
    fn getxattr(&self, ctx: &Ctx, inode: Self::Inode, name: &[u8], size: u32) -> FsResult<Xattr> {
        Err(Errno::ENOSYS)
    }
    /// LISTXATTR (`size` 0 asks for the size only).
    fn listxattr(&self, ctx: &Ctx, inode: Self::Inode, size: u32) -> FsResult<Xattr> {
        Err(Errno::ENOSYS)
    }
    /// REMOVEXATTR.
    fn removexattr(&self, ctx: &Ctx, inode: Self::Inode, name: &[u8]) -> FsResult<()> {
        Err(Errno::ENOSYS)
    }
    /// ACCESS.
    fn access(&self, ctx: &Ctx, inode: Self::Inode, mask: u32) -> FsResult<()> {
        Err(Errno::ENOSYS)
    }
    /// CREATE: create and open.
    #[allow(clippy::too_many_arguments)]
    fn create(
        &self,
        ctx: &Ctx,
        parent: Self::Inode,
        name: &[u8],
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> FsResult<Created<Self::Inode, Self::Handle>> {
        Err(Errno::ENOSYS)
    }
    /// FALLOCATE.
    fn fallocate(
        &self,
        ctx: &Ctx,
        inode: Self::Inode,
        handle: Self::Handle,
        mode: u32,
        offset: u64,
        length: u64,
    ) -> FsResult<()> {
        Err(Errno::ENOSYS)
    }
    /// LSEEK (SEEK_DATA / SEEK_HOLE); returns the new offset.
    fn lseek(
        &self,
        ctx: &Ctx,
        inode: Self::Inode,
        handle: Self::Handle,
        offset: u64,
        whence: u32,
    ) -> FsResult<u64> {
        Err(Errno::ENOSYS)
    }
    /// SYNCFS.
    fn syncfs(&self, ctx: &Ctx, inode: Self::Inode) -> FsResult<()> {
        Err(Errno::ENOSYS)
    }
    /// READDIRPLUS from `offset` into `sink` (each entry but "." and ".."
    /// carries a lookup reference).
    fn readdirplus(
        &self,
        ctx: &Ctx,
        inode: Self::Inode,
        handle: Self::Handle,
        offset: u64,
        sink: &mut dyn DirPlusSink,
    ) -> FsResult<()> {
        Err(Errno::ENOSYS)
    }
    /// GETLK: the first lock that would conflict with `req`, or `req.lock`
    /// with type F_UNLCK when there is none.
    fn getlk(
        &self,
        ctx: &Ctx,
        inode: Self::Inode,
        handle: Self::Handle,
        req: &LockReq,
    ) -> FsResult<FileLock> {
        Err(Errno::ENOSYS)
    }
    /// SETLK (non-blocking; EAGAIN on conflict) and unlock.
    fn setlk(
        &self,
        ctx: &Ctx,
        inode: Self::Inode,
        handle: Self::Handle,
        req: &LockReq,
    ) -> FsResult<()> {
        Err(Errno::ENOSYS)
    }
    /// SETLKW: take the lock, waiting for it. A filesystem that may wait
    /// parks the request and answers through `done` later, so it never pins
    /// the calling worker; an interrupt for `ctx.unique` arrives through
    /// [`Filesystem::interrupt`].
    fn setlkw(
        &self,
        ctx: &Ctx,
        inode: Self::Inode,
        handle: Self::Handle,
        req: &LockReq,
        done: Deferred,
    ) {
        done.complete(Err(Errno::ENOSYS));
    }
    /// FUSE_INTERRUPT for the request `unique` (advisory).
    fn interrupt(&self, unique: u64) {}
    /// Starts a READ of at most `len` bytes at `offset` into the client's
    /// memory `mem` (a guest's buffers, by reference) without waiting for
    /// it, on the serving loop's I/O context `io`: Ok once `done` will be
    /// handed back with the bytes read, into the loop's completions from
    /// [`Filesystem::collect_started`] with this `io`, or was into `out`
    /// before returning (a read that did not have to wait: the page cache
    /// held the data); Err(done) to have the READ served as usual
    /// ([`Filesystem::read`]). Started I/O runs once
    /// [`Filesystem::submit_started`] is called. `mem` is lent: a
    /// filesystem that keeps it past the call (started I/O) clones it.
    #[allow(clippy::too_many_arguments)]
    fn start_read(
        &self,
        io: &mut Self::Io,
        out: &mut Completions,
        ctx: &Ctx,
        inode: Self::Inode,
        handle: Self::Handle,
        offset: u64,
        len: usize,
        mem: &std::sync::Arc<dyn ClientMem>,
        done: IoDone,
    ) -> Result<(), IoDone> {
        Err(done)
    }
    /// Starts a WRITE of all of the client's memory `mem` (the request's
    /// data, by reference) at `offset` without waiting, as
    /// [`Filesystem::start_read`] starts a READ: Ok once `done` will be
    /// handed back with the bytes written (from
    /// [`Filesystem::collect_started`] with this `io`), or was into `out`
    /// before returning; Err(done) to have
    /// the WRITE served as usual ([`Filesystem::write`], with the same
    /// data). `flags` are `fuse_write_in.write_flags`. The write must have
    /// the effects [`Filesystem::write`] would (credentials, setuid and
    /// setgid clearing, limits), and `mem` stays untouched until `done`.
    #[allow(clippy::too_many_arguments)]
    fn start_write(
        &self,
        io: &mut Self::Io,
        out: &mut Completions,
        ctx: &Ctx,
        inode: Self::Inode,
        handle: Self::Handle,
        offset: u64,
        mem: &std::sync::Arc<dyn ClientMem>,
        flags: u32,
        done: IoDone,
    ) -> Result<(), IoDone> {
        Err(done)
    }
    /// Starts an FSYNC (or, with `dir`, an FSYNCDIR) of `handle` without
    /// waiting, as [`Filesystem::start_read`] starts a READ: Ok once `done`
    /// will be handed back with `Ok(0)` or the error (from
    /// [`Filesystem::collect_started`] with this `io`), or was into `out`
    /// before returning; Err(done) to have it served as usual
    /// ([`Filesystem::fsync`], [`Filesystem::fsyncdir`]). The sync must
    /// cover what [`Filesystem::fsync`] would: every write answered before
    /// it was started.
    #[allow(clippy::too_many_arguments)]
    fn start_fsync(
        &self,
        io: &mut Self::Io,
        out: &mut Completions,
        ctx: &Ctx,
        inode: Self::Inode,
        handle: Self::Handle,
        datasync: bool,
        dir: bool,
        done: IoDone,
    ) -> Result<(), IoDone> {
        Err(done)
    }
    /// Starts a FALLOCATE of `handle` without waiting, as
    /// [`Filesystem::start_fsync`] starts a sync: Ok once `done` will be
    /// handed back with `Ok(0)` or the error, or was before returning;
    /// Err(done) to have it served as usual ([`Filesystem::fallocate`]),
    /// which must then answer it with the same effects.
    #[allow(clippy::too_many_arguments)]
    fn start_fallocate(
        &self,
        io: &mut Self::Io,
        out: &mut Completions,
        ctx: &Ctx,
        inode: Self::Inode,
        handle: Self::Handle,
        mode: u32,
        offset: u64,
        length: u64,
        done: IoDone,
    ) -> Result<(), IoDone> {
        Err(done)
    }
    /// Submits the I/O started on `io` since the last call (one system
    /// call for all of it).
    fn submit_started(&self, io: &mut Self::Io) {}
    /// Hands the tokens of `io`'s finished I/O back into `out` with their
    /// results, without waiting; returns how many.
    fn collect_started(&self, io: &mut Self::Io, out: &mut Completions) -> usize {
        0
    }
    /// I/O started on `io` that has not completed yet.
    fn started_in_flight(&self, io: &Self::Io) -> usize {
        0
    }
    /// A file descriptor that is readable (and may be read to reset) when
    /// `io`'s started I/O has completions to take: a serving loop waits on
    /// it together with its other events. None before `io` started any.
    fn started_fd(&self, io: &Self::Io) -> Option<i32> {
        None
    }
    /// TMPFILE: an unnamed file in `parent`, opened.
    fn tmpfile(
        &self,
        ctx: &Ctx,
        parent: Self::Inode,
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> FsResult<Created<Self::Inode, Self::Handle>> {
        Err(Errno::ENOSYS)
    }
    /// COPY_FILE_RANGE; returns the bytes copied.
    #[allow(clippy::too_many_arguments)]
    fn copy_file_range(
        &self,
        ctx: &Ctx,
        inode_in: Self::Inode,
        handle_in: Self::Handle,
        off_in: u64,
        inode_out: Self::Inode,
        handle_out: Self::Handle,
        off_out: u64,
        len: u64,
        flags: u64,
    ) -> FsResult<u64> {
        Err(Errno::ENOSYS)
    }
    /// FUSE_SETUPMAPPING's file: calls `map` with `handle`'s open file,
    /// which stays open until `map` returns, and returns what `map` does.
    /// EBADF if `handle` is not open, EINVAL if it is open on another
    /// inode than `inode` or on no regular file. Without a handle (Linux
    /// sends none: its mappings are the inode's), `inode`'s file is opened
    /// for the call as the caller, for reading and, with `write`, writing
    /// (so the caller's permissions decide).
    fn map_source(
        &self,
        ctx: &Ctx,
        inode: Self::Inode,
        handle: Option<Self::Handle>,
        write: bool,
        map: &mut dyn FnMut(MapSource<'_>) -> FsResult<()>,
    ) -> FsResult<()> {
        Err(Errno::ENOSYS)
    }
    /// STATX (`mask` as statx(2); `flags` the AT_STATX_* sync flags).
    fn statx(
        &self,
        ctx: &Ctx,
        inode: Self::Inode,
        handle: Option<Self::Handle>,
        flags: u32,
        mask: u32,
    ) -> FsResult<(Statx, Duration)> {
        Err(Errno::ENOSYS)
    }
}
