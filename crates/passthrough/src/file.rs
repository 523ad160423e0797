//! Open files and directories: the handle table, OPEN/CREATE/TMPFILE,
//! READ/WRITE through io_uring, directory listing, and the small file ops.

use super::backing::Grant;
use super::creds::{private_umask, Caps, Cred};
use super::inode::{CountedFd, InodeData};
use super::label::{same_inode, Fresh};
use super::{component, io, sys, PassthroughFs};
use fuse_core::abi::flags as wflags;
use fuse_core::locks::{lock, read, write};
use fuse_core::server::{
    Created, Ctx, DirPlusSink, DirSink, FsResult, Opened, ReadSink, WriteSource,
};
use fuse_core::Errno;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// One open file or directory.
#[derive(Debug)]
pub struct HandleData {
    /// The open file description.
    pub fd: CountedFd,
    /// Its inode.
    pub inode: Arc<InodeData>,
    /// Opened for direct I/O (O_DIRECT, or the cache policy asks for it).
    pub direct: bool,
    /// Data I/O through io_uring (off where the file cannot do
    /// non-blocking I/O, so the ring would punt every op to a worker).
    pub uring: bool,
    /// Opened O_DIRECT on the host (writes then go through the ring too).
    pub odirect: bool,
    /// Holds a use of its inode's backing state (kernel passthrough
    /// configured: see `backing.rs`), given back at RELEASE.
    backing: bool,
    /// Serialises seek + getdents on a directory handle.
    dir: Mutex<()>,
    /// Who opened it (uid, gid, and the groups it had then): a writeback
    /// WRITE runs as the opener, since the client kernel sends those with
    /// uid = gid = 0 and a flusher thread's pid (`force && nocreds`).
    opener: Cred,
}

impl HandleData {
    /// Who opened it.
    pub(super) fn opener(&self) -> &Cred {
        &self.opener
    }
}

/// The handle table. Keyed with the standard (randomly keyed) hasher, not
/// `fuse_core::fasthash`: a migration's state stream, which is not
/// trusted, gives the ids of the handles it brings.
#[derive(Debug, Default)]
pub struct Handles {
    map: RwLock<HashMap<u64, Arc<HandleData>>>,
    /// Handles a migration could not take up (`--migration-on-error
    /// guest-error`): EIO until released.
    lost: RwLock<std::collections::HashSet<u64>>,
    next: AtomicU64,
    max_parallel: AtomicUsize,
}

impl Handles {
    /// Enters `h` under a new id, or under `at` (a migration taking up the
    /// source's handles: EEXIST if it is taken).
    fn insert(&self, h: HandleData, at: Option<u64>) -> Result<u64, Errno> {
        let mut map = write(&self.map);
        let id = match at {
            None => self.next.fetch_add(1, Ordering::Relaxed) + 1,
            Some(id) => {
                if id == 0
                    || id > super::inode::MAX_RESTORED_ID
                    || map.contains_key(&id)
                    || self.is_lost(id)
                {
                    return Err(Errno(libc::EEXIST));
                }
                self.next.fetch_max(id, Ordering::Relaxed);
                id
            }
        };
        map.insert(id, Arc::new(h));
        Ok(id)
    }
    fn is_lost(&self, fh: u64) -> bool {
        read(&self.lost).contains(&fh)
    }
    /// Records `fh` as lost in a migration (EIO until released).
    pub(super) fn restore_lost(&self, fh: u64) -> Result<(), Errno> {
        let map = read(&self.map);
        if fh == 0 || fh > super::inode::MAX_RESTORED_ID || map.contains_key(&fh) {
            return Err(Errno(libc::EEXIST));
        }
        if !write(&self.lost).insert(fh) {
            return Err(Errno(libc::EEXIST));
        }
        self.next.fetch_max(fh, Ordering::Relaxed);
        Ok(())
    }
    /// Every open handle, by id, and the lost ones.
    pub(super) fn snapshot(&self) -> (Vec<(u64, Arc<HandleData>)>, Vec<u64>) {
        let mut v: Vec<_> = read(&self.map)
            .iter()
            .map(|(&k, h)| (k, h.clone()))
            .collect();
        v.sort_by_key(|(k, _)| *k);
        let mut lost: Vec<u64> = read(&self.lost).iter().copied().collect();
        lost.sort_unstable();
        (v, lost)
    }
    /// The handle `fh`, or EBADF (EIO for one lost in a migration).
    pub fn get(&self, fh: u64) -> Result<Arc<HandleData>, Errno> {
        match read(&self.map).get(&fh) {
            Some(h) => Ok(h.clone()),
            None if self.is_lost(fh) => Err(Errno::EIO),
            None => Err(Errno::EBADF),
        }
    }
    fn remove(&self, fh: u64) -> Option<Arc<HandleData>> {
        let h = write(&self.map).remove(&fh);
        if h.is_none() {
            write(&self.lost).remove(&fh);
        }
        h
    }
    #[cfg(feature = "test-utils")]
    /// Open handles.
    pub fn len(&self) -> usize {
        read(&self.map).len()
    }
    #[cfg(feature = "test-utils")]
    /// The most writers seen in one inode's lock at once.
    pub fn max_parallel(&self) -> usize {
        self.max_parallel.load(Ordering::Relaxed)
    }
    pub(super) fn clear(&self) {
        write(&self.map).clear();
        write(&self.lost).clear();
    }
    /// Counts a writer of `inode` (in its `writers`, and in the most seen
    /// at once) until the result is dropped.
    pub(super) fn writer(&self, inode: &Arc<InodeData>) -> Writer {
        let now = inode.writers.fetch_add(1, Ordering::AcqRel) + 1;
        self.max_parallel.fetch_max(now, Ordering::Relaxed);
        Writer(inode.clone())
    }
}

/// A writer counted in its inode's `writers` until dropped.
#[derive(Debug)]
pub(super) struct Writer(Arc<InodeData>);

impl Drop for Writer {
    fn drop(&mut self) {
        self.0.writers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `struct linux_dirent64` header size (d_ino, d_off, d_reclen, d_type).
const DIRENT64_HDR: usize = 19;

/// One record of a getdents64 buffer.
struct Dent<'a> {
    ino: u64,
    off: u64,
    typ: u8,
    name: &'a [u8],
}

fn parse_dents(buf: &[u8]) -> Vec<Dent<'_>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + DIRENT64_HDR <= buf.len() {
        let r = &buf[at..];
        let ino = u64::from_ne_bytes(r[0..8].try_into().unwrap_or_default());
        let off = u64::from_ne_bytes(r[8..16].try_into().unwrap_or_default());
        let reclen = usize::from(u16::from_ne_bytes(r[16..18].try_into().unwrap_or_default()));
        if reclen < DIRENT64_HDR || reclen > r.len() {
            break;
        }
        let raw = &r[DIRENT64_HDR..reclen];
        let name = &raw[..raw.iter().position(|&b| b == 0).unwrap_or(raw.len())];
        out.push(Dent {
            ino,
            off,
            typ: r[18],
            name,
        });
        at += reclen;
    }
    out
}

impl PassthroughFs {
    /// Whether files on device `dev` get io_uring data I/O: probed on the
    /// first handle of each device (a write-only one through a read-only
    /// reopen), remembered after.
    fn uring_for(&self, fd: &CountedFd, dev: u64) -> bool {
        if !self.cfg.io_uring {
            return false;
        }
        let mut known = lock(&self.nowait);
        if let Some(&v) = known.get(&dev) {
            return v;
        }
        // A write-only fd cannot be read to probe: a read-only reopen of
        // the same file can. Not known either way: in line (taking the
        // ring there would send every op of such a handle on a file with
        // no non-blocking I/O, tmpfs, to io-wq).
        let probed = sys::supports_nowait(fd.raw()).or_else(|| {
            let name = std::ffi::CString::new(fd.raw().to_string()).ok()?;
            let proc = std::os::fd::AsRawFd::as_raw_fd(&self.proc_fd);
            let r = self
                .budget
                .open(|| sys::openat(proc, &name, libc::O_RDONLY | libc::O_CLOEXEC, 0))
                .ok()?;
            sys::supports_nowait(r.raw())
        });
        match probed {
            Some(v) => {
                known.insert(dev, v);
                v
            }
            None => false,
        }
    }

    /// Whether files on device `dev` are known to do non-blocking I/O (a
    /// handle of one was probed).
    pub(super) fn nowait_known(&self, dev: u64) -> bool {
        let known = lock(&self.nowait);
        known.get(&dev).copied().unwrap_or(false)
    }

    fn access_flags(&self, flags: u32) -> Result<i32, Errno> {
        let mut f = flags as i32 & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY);
        if !self.cfg.direct_io {
            // Served through the host's page cache (virtiofsd's default).
            f &= !libc::O_DIRECT;
        }
        if self.cfg.readonly && (f & libc::O_ACCMODE != libc::O_RDONLY || f & libc::O_TRUNC != 0) {
            return Err(Errno(libc::EROFS));
        }
        if self.writeback() {
            // The client's page cache may read a page of a file opened
            // write-only, and it does appends itself.
            if f & libc::O_ACCMODE == libc::O_WRONLY {
                f = (f & !libc::O_ACCMODE) | libc::O_RDWR;
            }
            f &= !libc::O_APPEND;
        }
        Ok(f | libc::O_CLOEXEC)
    }

    pub(super) fn new_handle(
        &self,
        fd: CountedFd,
        inode: Arc<InodeData>,
        flags: i32,
        dir: bool,
        opener: Cred,
        at: Option<u64>,
    ) -> Result<Opened<u64>, Errno> {
        let direct = flags & libc::O_DIRECT != 0;
        let mut open_flags = self.open_flags(direct, dir);
        let direct = direct || open_flags & fuse_core::abi::fopen::DIRECT_IO != 0;
        let uring = !dir && self.uring_for(&fd, inode.key.dev);
        let backing = !dir && self.offers_passthrough();
        let mut backing_id = 0;
        if backing {
            if let Grant::Passthrough(id) = self.backing.acquire(&inode.backing, fd.raw()) {
                // The kernel refuses FOPEN_KEEP_CACHE and the cache flags
                // with passthrough; the page cache is the host file's.
                open_flags = fuse_core::abi::fopen::PASSTHROUGH;
                backing_id = id;
            }
        }
        inode.handles.fetch_add(1, Ordering::AcqRel);
        let inode_ref = inode.clone();
        let handle = self.handles.insert(
            HandleData {
                fd,
                inode,
                direct,
                uring,
                odirect: flags & libc::O_DIRECT != 0,
                backing,
                dir: Mutex::new(()),
                opener,
            },
            at,
        );
        let handle = match handle {
            Ok(h) => h,
            Err(e) => {
                inode_ref.handles.fetch_sub(1, Ordering::AcqRel);
                if backing {
                    self.backing.release(&inode_ref.backing);
                }
                return Err(e);
            }
        };
        Ok(Opened {
            handle,
            open_flags,
            backing_id,
        })
    }

    pub(super) fn op_open(
        &self,
        ctx: &Ctx,
        ino: u64,
        flags: u32,
        dir: bool,
    ) -> FsResult<Opened<u64>> {
        let data = self.inodes.get(ino)?;
        // A client kernel opens device nodes, FIFOs and sockets itself and
        // never sends OPEN for them; one that does would have the daemon
        // open a host device (a guest-made block device naming the host's
        // disk, say). Only regular files and directories are opened.
        let ft = data.ftype;
        if (dir && ft != libc::S_IFDIR) || (!dir && ft != libc::S_IFREG) {
            return Err(if ft == libc::S_IFDIR {
                Errno::EISDIR
            } else if dir {
                Errno::ENOTDIR
            } else if ft == libc::S_IFLNK {
                Errno(libc::ELOOP)
            } else {
                Errno(libc::EACCES)
            });
        }
        let mut f = self.access_flags(flags)?;
        if dir {
            f = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
        }
        let opener = self.caller(ctx)?;
        let fd = {
            let _c = self.creds_as(&opener, Caps::Caller)?;
            self.reopen(&data, f)?
        };
        self.new_handle(fd, data, f, dir, opener, None)
    }

    pub(super) fn op_create(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> FsResult<Created<u64, u64>> {
        self.writable()?;
        let p = self.inodes.get(parent)?;
        let name = component(name)?;
        let excl = flags as i32 & libc::O_EXCL != 0;
        let f = self.access_flags(flags)?;
        // The kernel sends S_IFREG with the mode; openat2 refuses any bit
        // outside the permission bits.
        let mode = mode & 0o7777;
        // Always O_EXCL: an existing name is opened the way OPEN opens it
        // (regular files only), never by open(O_CREAT), which would open a
        // device node or block on a FIFO a hostile client made.
        let create = f | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        let opener = self.caller(ctx)?;
        // Held from before the creation, for undoing it.
        let pfd = p.fd(&self.budget)?;
        for _ in 0..8 {
            // Made afresh each time: an fscreate label is cleared once the
            // file is made (or not).
            let mut plan = self.label_plan(ctx.secctx)?;
            let fresh = Fresh::before(libc::S_IFREG, self.owner_of(&opener));
            let made = {
                let _c = self.creds_as(&opener, Caps::ALLOCATE)?;
                let _u = private_umask(umask)?;
                let resolve =
                    sys::RESOLVE_BENEATH | sys::RESOLVE_NO_SYMLINKS | sys::RESOLVE_NO_MAGICLINKS;
                self.budget.open(
                    || match sys::openat2(pfd.fd(), &name, create, mode, resolve) {
                        Err(Errno::ENOSYS) => sys::openat(pfd.raw(), &name, create, mode),
                        r => r,
                    },
                )
            };
            plan.created();
            match made {
                Ok(fd) => {
                    if let Err(e) = plan.apply(self, fd.raw()) {
                        // Undone if the name still names the file made:
                        // known by its inode, or, if even fstat fails,
                        // by what a file just made looks like.
                        let st = sys::statx(
                            fd.raw(),
                            c"",
                            libc::AT_EMPTY_PATH,
                            libc::STATX_INO | libc::STATX_TYPE,
                        )
                        .ok();
                        let ours = |now: &libc::statx| match &st {
                            Some(made) => same_inode(made, now),
                            None => fresh.matches(now),
                        };
                        self.unmake(&opener, pfd.fd(), &name, &ours);
                        return Err(e);
                    }
                    let entry = self.enter_fd(fd.raw())?;
                    let data = self.inodes.get(entry.inode)?;
                    return Ok((entry, self.new_handle(fd, data, f, false, opener, None)?));
                }
                Err(Errno::EEXIST) if !excl => {
                    let entry = match self.op_lookup(ctx, parent, name.as_bytes()) {
                        Ok(e) => e,
                        // Removed again meanwhile: create it after all.
                        Err(Errno::ENOENT) => continue,
                        Err(e) => return Err(e),
                    };
                    return match self.op_open(ctx, entry.inode, flags, false) {
                        Ok(o) => Ok((entry, o)),
                        Err(e) => {
                            self.inodes.forget(entry.inode, 1);
                            Err(e)
                        }
                    };
                }
                Err(e) => return Err(e),
            }
        }
        Err(Errno::EAGAIN)
    }

    pub(super) fn op_tmpfile(
        &self,
        ctx: &Ctx,
        parent: u64,
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> FsResult<Created<u64, u64>> {
        self.writable()?;
        let p = self.inodes.get(parent)?;
        let mode = mode & 0o7777;
        let mut f = self.access_flags(flags)?;
        if f & libc::O_ACCMODE == libc::O_RDONLY {
            f |= libc::O_RDWR;
        }
        let opener = self.caller(ctx)?;
        let mut plan = self.label_plan(ctx.secctx)?;
        let fd = {
            let _c = self.creds_as(&opener, Caps::ALLOCATE)?;
            let _u = private_umask(umask)?;
            let pfd = p.fd(&self.budget)?;
            self.budget
                .open(|| sys::openat(pfd.raw(), c".", f | libc::O_TMPFILE, mode))
        };
        plan.created();
        let fd = fd?;
        // Unlabelled, the nameless inode goes with its fd.
        plan.apply(self, fd.raw())?;
        let entry = self.enter_fd(fd.raw())?;
        let data = self.inodes.get(entry.inode)?;
        Ok((entry, self.new_handle(fd, data, f, false, opener, None)?))
    }

    pub(super) fn op_read(
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
            return super::client_io::read(
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
    /// capabilities (in line, or started: `started/write.rs`).
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
    pub(super) fn write_creds<'h>(
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
    pub(super) fn parallel_write(&self, h: &HandleData) -> bool {
        h.direct && self.cfg.parallel_direct_writes
    }

    pub(super) fn op_write(
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
                return super::client_io::write(
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

    pub(super) fn op_flush(&self, fh: u64, owner: u64) -> FsResult<()> {
        let h = self.handles.get(fh)?;
        // close(2) drops the caller's POSIX locks on the file.
        self.locks.drop_owner(h.inode.nodeid, owner);
        sys::flush_fd(h.fd.raw())
    }

    pub(super) fn op_release(&self, fh: u64) -> FsResult<()> {
        // Closing the description drops its flock locks; the inode's last
        // handle takes its owners' POSIX lock descriptions along.
        if let Some(h) = self.handles.remove(fh) {
            if h.backing {
                self.backing.release(&h.inode.backing);
            }
            if h.inode.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
                self.locks.drop_inode(h.inode.nodeid);
            }
        }
        Ok(())
    }

    pub(super) fn op_fsync(&self, ctx: &Ctx, fh: u64, datasync: bool) -> FsResult<()> {
        let h = self.handles.get(fh)?;
        io::fsync(h.uring, h.fd.raw(), datasync, ctx.unique, &self.io_stats)
    }

    fn dents(&self, fh: u64, offset: u64, mut each: impl FnMut(&Dent<'_>) -> bool) -> FsResult<()> {
        let h = self.handles.get(fh)?;
        let _pos = lock(&h.dir);
        let off = i64::try_from(offset).map_err(|_| Errno::EINVAL)?;
        sys::lseek(h.fd.raw(), off, libc::SEEK_SET)?;
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let n = sys::getdents64(h.fd.raw(), &mut buf)?;
            if n == 0 {
                return Ok(());
            }
            for d in parse_dents(&buf[..n]) {
                if !each(&d) {
                    return Ok(());
                }
            }
        }
    }

    pub(super) fn op_readdir(&self, fh: u64, offset: u64, sink: &mut dyn DirSink) -> FsResult<()> {
        self.dents(fh, offset, |d| {
            sink.add(d.ino, d.off, u32::from(d.typ), d.name)
        })
    }

    pub(super) fn op_readdirplus(
        &self,
        ctx: &Ctx,
        ino: u64,
        fh: u64,
        offset: u64,
        sink: &mut dyn DirPlusSink,
    ) -> FsResult<()> {
        let dir = self.inodes.get(ino)?;
        let _c = self.creds(ctx)?;
        let mut err = None;
        let mut added = 0usize;
        self.dents(fh, offset, |d| {
            if !sink.room(d.name.len()) {
                return false;
            }
            if d.name == b"." || d.name == b".." {
                return sink.add(None, d.ino, d.off, u32::from(d.typ), d.name);
            }
            let Ok(name) = component(d.name) else {
                return true;
            };
            match self.do_lookup(&dir, &name) {
                Ok(e) => {
                    let id = e.inode;
                    if !sink.add(Some(e), d.ino, d.off, u32::from(d.typ), d.name) {
                        self.inodes.forget(id, 1);
                        return false;
                    }
                    added += 1;
                    true
                }
                // Removed since getdents saw it.
                Err(Errno::ENOENT) => true,
                Err(e) => {
                    err = Some(e);
                    false
                }
            }
        })?;
        match err {
            // Entries already listed carry references the client must get:
            // they stand, and the error comes on the next call if it
            // persists.
            Some(e) if added == 0 => Err(e),
            _ => Ok(()),
        }
    }

    pub(super) fn op_fallocate(
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

    /// FALLOCATE through `h` in line, as `cred`.
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

    pub(super) fn op_lseek(&self, fh: u64, off: u64, whence: u32) -> FsResult<u64> {
        let h = self.handles.get(fh)?;
        let off = i64::try_from(off).map_err(|_| Errno::EINVAL)?;
        // Only SEEK_DATA and SEEK_HOLE reach the server; the handle's own
        // position is never used for I/O (all I/O is positioned).
        sys::lseek(h.fd.raw(), off, whence as i32)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn op_copy_file_range(
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

    pub(super) fn op_destroy(&self) {
        self.handles.clear();
        self.locks.clear();
        self.inodes.clear();
    }
}
