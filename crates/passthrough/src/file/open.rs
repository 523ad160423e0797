//! Making and dropping handles: OPEN, CREATE and TMPFILE (run as the
//! caller, a new inode labelled before it is entered), RELEASE, and the
//! choice, per device, of io_uring or synchronous data I/O for a handle.

use super::HandleData;
use crate::backing::Grant;
use crate::creds::{private_umask, Caps, Cred};
use crate::inode::{CountedFd, InodeData};
use crate::label::{same_inode, Fresh};
use crate::mapped::MapSlot;
use crate::{component, sys, PassthroughFs};
use fuse_core::locks::lock;
use fuse_core::server::{Created, Ctx, FsResult, Opened};
use fuse_core::Errno;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

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
        // the same file can. Not known either way: synchronously (taking the
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

    /// Whether reads of a new handle (`fd`, open with `flags`, of an inode
    /// of type `ftype`) may go through a mapping of its
    /// file (`mapped.rs`): a readable regular file of a local file
    /// system, with mapped reads on.
    fn mappable(&self, fd: &CountedFd, flags: i32, ftype: u32) -> bool {
        if !(self.cfg.mapped_reads && self.cfg.io_uring && crate::mapped::SUPPORTED)
            || ftype != libc::S_IFREG
            || flags & libc::O_ACCMODE == libc::O_WRONLY
            || flags & libc::O_DIRECT != 0
        {
            return false;
        }
        // Asked of each file, not cached per device: a device number
        // comes back after an unmount, maybe for a network or FUSE mount.
        sys::fs_magic(fd.raw()).is_ok_and(|m| crate::backing::LOCAL_FS.contains(&m))
    }

    /// Whether files on device `dev` are known to do non-blocking I/O (a
    /// handle of one was probed).
    pub(crate) fn nowait_known(&self, dev: u64) -> bool {
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

    pub(crate) fn new_handle(
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
        let mappable = !dir && self.mappable(&fd, flags, inode.ftype);
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
                map: MapSlot::new(mappable),
                cold: Default::default(),
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

    pub(crate) fn op_open(
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

    pub(crate) fn op_create(
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

    pub(crate) fn op_tmpfile(
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

    pub(crate) fn op_release(&self, fh: u64) -> FsResult<()> {
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

    pub(crate) fn op_destroy(&self) {
        self.handles.clear();
        self.locks.clear();
        self.inodes.clear();
    }
}
