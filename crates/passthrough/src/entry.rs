//! Names and attributes: lookup, creation and removal, rename, links,
//! attributes, xattrs, statfs, access.

use super::creds::{private_umask, Caps, Cred, Groups};
use super::idmap::{acl_to_guest, acl_to_host};
use super::label::{same_inode, Fresh};
use super::{component, sys, PassthroughFs, STATX_MASK};
use fuse_core::abi::{fattr, Attr, Kstatfs, SetattrIn, Statx, SxTime, Xattr, ROOT_ID};
use fuse_core::locks::write;
use fuse_core::server::{Ctx, Entry, FsResult};
use fuse_core::Errno;
use std::ffi::{CStr, CString};
use std::time::Duration;

const RENAME_NOREPLACE: u32 = 1;
const RENAME_EXCHANGE: u32 = 2;
const RENAME_WHITEOUT: u32 = 4;

/// Largest xattr value or list (XATTR_SIZE_MAX).
const XATTR_MAX: usize = 64 * 1024;

fn cstr(b: &[u8]) -> Result<CString, Errno> {
    CString::new(b).map_err(|_nul| Errno::EINVAL)
}

const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";

/// The xattr names of `p` without the ACL ones (NUL-terminated, in order).
fn list_all(p: &sys::FdName) -> Result<Vec<u8>, Errno> {
    let mut buf = Vec::new();
    // The list may grow between the size query and the read: ask again.
    for _ in 0..8 {
        let n = sys::listxattr(p, &mut [])?;
        buf.resize(n.min(XATTR_MAX), 0);
        match sys::listxattr(p, &mut buf) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(Errno(libc::ERANGE)) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Errno(libc::ERANGE))
}

/// A list of NUL-terminated xattr names without the ACL ones.
fn without_acls(names: &[u8]) -> Vec<u8> {
    names
        .split_inclusive(|&b| b == 0)
        .filter(|n| {
            let name = n.strip_suffix(&[0]).unwrap_or(n);
            name != ACL_ACCESS && name != ACL_DEFAULT
        })
        .flatten()
        .copied()
        .collect()
}

fn ts(sec: u64, nsec: u32, now: bool, set: bool) -> libc::timespec {
    libc::timespec {
        tv_sec: sec as libc::time_t,
        tv_nsec: if now {
            libc::UTIME_NOW
        } else if set {
            i64::from(nsec)
        } else {
            libc::UTIME_OMIT
        },
    }
}

fn sx_time(t: &libc::statx_timestamp) -> SxTime {
    SxTime {
        tv_sec: t.tv_sec,
        tv_nsec: t.tv_nsec,
        reserved: 0,
    }
}

impl PassthroughFs {
    pub(super) fn op_lookup(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> FsResult<Entry<u64>> {
        let p = self.inodes.get(parent)?;
        if name == b"." || (name == b".." && parent == ROOT_ID) {
            // Answered from the table: ".." at the root is the root.
            let st = self.stat(&p)?;
            let again = self.insert(super::inode::Found {
                fd: self.reopen_path(&p)?,
                st,
            })?;
            return Ok(self.entry(&again, &st));
        }
        if name == b".." {
            return self.lookup_dotdot(&p);
        }
        let name = component(name)?;
        let _c = self.creds(ctx)?;
        self.do_lookup(&p, &name)
    }

    /// An extra O_PATH fd of an inode the table holds.
    fn reopen_path(&self, data: &super::InodeData) -> Result<super::inode::CountedFd, Errno> {
        self.reopen(data, libc::O_PATH)
    }

    /// ".." below the root: only a directory the table already knows (the
    /// kernel asks for ".." only when it reconnects a known directory).
    fn lookup_dotdot(&self, p: &super::InodeData) -> FsResult<Entry<u64>> {
        let pfd = p.fd(&self.budget)?;
        let fd = self
            .budget
            .open(|| sys::openat(pfd.raw(), c"..", libc::O_PATH | libc::O_NOFOLLOW, 0))?;
        let st = sys::statx(fd.raw(), c"", libc::AT_EMPTY_PATH, STATX_MASK)?;
        if !self.inodes.contains(&super::inode::key_of(&st)) {
            // Not a directory the client knows: it may lie outside the
            // shared directory.
            return Err(Errno(libc::EACCES));
        }
        let known = self
            .inodes
            .insert(super::inode::Found { fd, st }, None, true)?;
        Ok(self.entry(&known, &st))
    }

    pub(super) fn op_forget(&self, ino: u64, n: u64) {
        self.inodes.forget(ino, n);
    }

    pub(super) fn op_getattr(&self, ino: u64, fh: Option<u64>) -> FsResult<(Attr, Duration)> {
        let st = match fh.and_then(|fh| self.handles.get(fh).ok()) {
            Some(h) => sys::statx(h.fd.raw(), c"", libc::AT_EMPTY_PATH, STATX_MASK)?,
            None => self.stat(&*self.inodes.get(ino)?)?,
        };
        Ok((self.attr(&st), self.cfg.cache.timeout()))
    }

    /// SETATTR. Everything runs as the caller. For a guest's caller
    /// whose host uid is not 0 (its groups unknown to the host,
    /// `Groups::None`), the two owner's changes the guest kernel has
    /// already checked against the caller's groups (virtiofs mounts always
    /// check permissions in the guest) are done as the guest allowed:
    ///
    /// - a chmod that sets the setgid bit runs with the file's group as
    ///   its fsgid, so a bit the guest let through (the caller is in the
    ///   file's group there) is not stripped by a host that does not know
    ///   that group; only where the guest could act as that group itself
    ///   (a host gid some guest gid translates to, not a forbidden one);
    ///   the host still refuses a chmod by anyone but the file's owner
    ///   (no CAP_FOWNER);
    /// - a chown that sets the group runs with that group as its fsgid,
    ///   so the host lets the file's owner give it a group the guest says
    ///   the caller belongs to; the host still checks that the caller owns
    ///   the file and leaves its uid alone or as it is (no CAP_CHOWN).
    ///
    /// Nothing else: no capability for a non-owner, no other uid, and a
    /// forbidden ID is refused before anything runs.
    pub(super) fn op_setattr(
        &self,
        ctx: &Ctx,
        ino: u64,
        a: &SetattrIn,
    ) -> FsResult<(Attr, Duration)> {
        self.writable()?;
        let data = self.inodes.get(ino)?;
        let handle = if a.valid & fattr::FH != 0 {
            self.handles.get(a.fh).ok()
        } else {
            None
        };
        let cred = self.caller(ctx)?;
        let caller = self.creds_as(&cred, Caps::Caller)?;
        // A guest's caller without capabilities, whose groups the host
        // does not know (see above).
        let guest = self.cfg.groups == Groups::None && !cred.is_root();
        let fd = data.fd(&self.budget)?;
        let name = CString::new(fd.raw().to_string()).map_err(|_nul| Errno::EINVAL)?;
        let proc = std::os::fd::AsRawFd::as_raw_fd(&self.proc_fd);
        if a.valid & fattr::MODE != 0 {
            let setgid = a.mode & libc::S_ISGID != 0;
            let group = if guest && setgid {
                let gid = self.stat(&data)?.stx_gid;
                self.claimable_gid(gid).then_some(gid)
            } else {
                None
            };
            let _owners = match group {
                Some(gid) => Some(self.creds_as(
                    &Cred {
                        gid,
                        ..cred.clone()
                    },
                    Caps::Caller,
                )?),
                None => None,
            };
            match &handle {
                Some(h) => sys::fchmod(h.fd.raw(), a.mode)?,
                None => sys::fchmodat(proc, &name, a.mode)?,
            }
        }
        if a.valid & (fattr::UID | fattr::GID) != 0 {
            // The client's IDs, as the host's (a forbidden one: EPERM).
            let uid = if a.valid & fattr::UID != 0 {
                self.cfg.translate_uid.to_host(a.uid)?
            } else {
                u32::MAX
            };
            let gid = if a.valid & fattr::GID != 0 {
                self.cfg.translate_gid.to_host(a.gid)?
            } else {
                u32::MAX
            };
            let _owners = if guest && gid != u32::MAX {
                Some(self.creds_as(
                    &Cred {
                        gid,
                        ..cred.clone()
                    },
                    Caps::Caller,
                )?)
            } else {
                None
            };
            sys::fchownat(fd.raw(), c"", uid, gid, libc::AT_EMPTY_PATH)?;
        }
        if a.valid & fattr::SIZE != 0 {
            match data.ftype {
                libc::S_IFREG => {}
                libc::S_IFDIR => return Err(Errno::EISDIR),
                _ => return Err(Errno::EINVAL),
            }
            let _io = write(&data.io_lock);
            match &handle {
                Some(h) => sys::ftruncate(h.fd.raw(), a.size)?,
                None => {
                    let f = self.reopen(&data, libc::O_WRONLY)?;
                    sys::ftruncate(f.raw(), a.size)?
                }
            }
        }
        let times = fattr::ATIME | fattr::MTIME | fattr::ATIME_NOW | fattr::MTIME_NOW;
        if a.valid & times != 0 {
            let t = [
                ts(
                    a.atime,
                    a.atimensec,
                    a.valid & fattr::ATIME_NOW != 0,
                    a.valid & fattr::ATIME != 0,
                ),
                ts(
                    a.mtime,
                    a.mtimensec,
                    a.valid & fattr::MTIME_NOW != 0,
                    a.valid & fattr::MTIME != 0,
                ),
            ];
            match &handle {
                Some(h) => sys::utimensat(h.fd.raw(), c"", &t, libc::AT_EMPTY_PATH)?,
                None => sys::utimensat(fd.raw(), c"", &t, libc::AT_EMPTY_PATH)?,
            }
        } else if a.valid & fattr::CTIME != 0
            && a.valid & !(fattr::CTIME | fattr::FH | fattr::LOCKOWNER) == 0
        {
            // Only ctime: a chown to the same owner updates ctime alone.
            sys::fchownat(fd.raw(), c"", u32::MAX, u32::MAX, libc::AT_EMPTY_PATH)?;
        }
        // With the daemon's own credentials (a renamed capability xattr
        // may be in a namespace the caller cannot write).
        drop(caller);
        if a.valid & (fattr::UID | fattr::GID | fattr::SIZE) != 0 {
            self.kill_mapped_caps(ino);
        }
        Ok((self.attr(&self.stat(&data)?), self.cfg.cache.timeout()))
    }

    pub(super) fn op_readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        let data = self.inodes.get(ino)?;
        let fd = data.fd(&self.budget)?;
        sys::readlink(fd.fd())
    }

    /// Runs a creating operation in `parent` as the caller with its umask,
    /// making an inode of type `kind`, gives the new inode the caller's
    /// security label (`label.rs`), then looks the new name up.
    pub(super) fn make(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        umask: u32,
        kind: u32,
        f: impl FnOnce(std::os::fd::BorrowedFd<'_>, &CStr) -> Result<(), Errno>,
    ) -> FsResult<Entry<u64>> {
        self.writable()?;
        let p = self.inodes.get(parent)?;
        let name = component(name)?;
        let cred = self.caller(ctx)?;
        let mut plan = self.label_plan(ctx.secctx)?;
        let pfd = p.fd(&self.budget)?;
        // What the inode made looks like, to know it again by.
        let fresh = Fresh::before(kind, self.owner_of(&cred));
        let found = {
            let _c = self.creds_as(&cred, Caps::ALLOCATE)?;
            let _u = private_umask(umask)?;
            f(pfd.fd(), &name).map(|()| self.open_beneath(&p, &name))
        };
        plan.created();
        let found = found?;
        if !plan.labels() {
            return self.enter_found(&p, found?);
        }
        let ours = |st: &libc::statx| fresh.matches(st);
        let found = match found {
            Ok(found) => found,
            Err(e) => {
                self.unmake(&cred, pfd.fd(), &name, &ours);
                return Err(e);
            }
        };
        // MKDIR, MKNOD and SYMLINK return no fd: what the name leads to now
        // must look like what was made before anything is set on it (or it
        // is unlinked).
        if !fresh.matches(&found.st) {
            fuse_core::warn_limited!(
                "{name:?} changed while it was being made; its security label is not set"
            );
            return Err(Errno::EIO);
        }
        if let Err(e) = plan.apply(self, found.fd.raw()) {
            let made = found.st;
            self.unmake(&cred, pfd.fd(), &name, &|st| {
                same_inode(&made, st) && fresh.matches(st)
            });
            return Err(e);
        }
        self.enter_found(&p, found)
    }

    pub(super) fn op_symlink(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        target: &[u8],
    ) -> FsResult<Entry<u64>> {
        let target = cstr(target)?;
        self.make(ctx, parent, name, 0, libc::S_IFLNK, |d, n| {
            sys::symlinkat(&target, d, n)
        })
    }

    pub(super) fn op_mknod(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u32,
        umask: u32,
    ) -> FsResult<Entry<u64>> {
        // mknod(2) makes a regular file of type bits 0.
        let kind = match mode & libc::S_IFMT {
            0 => libc::S_IFREG,
            k => k,
        };
        self.make(ctx, parent, name, umask, kind, |d, n| {
            sys::mknodat(d, n, mode, u64::from(rdev))
        })
    }

    pub(super) fn op_mkdir(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> FsResult<Entry<u64>> {
        self.make(ctx, parent, name, umask, libc::S_IFDIR, |d, n| {
            sys::mkdirat(d, n, mode)
        })
    }

    fn remove(&self, ctx: &Ctx, parent: u64, name: &[u8], flags: i32) -> FsResult<()> {
        self.writable()?;
        let p = self.inodes.get(parent)?;
        let name = component(name)?;
        let _c = self.creds(ctx)?;
        let pfd = p.fd(&self.budget)?;
        sys::unlinkat(pfd.fd(), &name, flags)
    }

    pub(super) fn op_unlink(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> FsResult<()> {
        self.remove(ctx, parent, name, 0)
    }

    pub(super) fn op_rmdir(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> FsResult<()> {
        self.remove(ctx, parent, name, libc::AT_REMOVEDIR)
    }

    pub(super) fn op_rename(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
    ) -> FsResult<()> {
        self.writable()?;
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT) != 0 {
            return Err(Errno::EINVAL);
        }
        let (p, np) = (self.inodes.get(parent)?, self.inodes.get(newparent)?);
        let (name, newname) = (component(name)?, component(newname)?);
        let _c = self.creds_allocating(ctx)?;
        let (pfd, npfd) = (p.fd(&self.budget)?, np.fd(&self.budget)?);
        sys::renameat2(pfd.fd(), &name, npfd.fd(), &newname, flags)
    }

    pub(super) fn op_link(
        &self,
        ctx: &Ctx,
        ino: u64,
        newparent: u64,
        newname: &[u8],
    ) -> FsResult<Entry<u64>> {
        self.writable()?;
        let data = self.inodes.get(ino)?;
        let np = self.inodes.get(newparent)?;
        let newname = component(newname)?;
        let _c = self.creds_allocating(ctx)?;
        let fd = data.fd(&self.budget)?;
        let npfd = np.fd(&self.budget)?;
        // linkat(fd, "", AT_EMPTY_PATH) needs CAP_DAC_READ_SEARCH, which
        // the caller's credentials drop; the daemon's own /proc/self/fd
        // entry links the same inode without it.
        let proc_name = CString::new(fd.raw().to_string()).map_err(|_nul| Errno::EINVAL)?;
        let proc = std::os::fd::AsRawFd::as_raw_fd(&self.proc_fd);
        sys::linkat(
            proc,
            &proc_name,
            npfd.fd(),
            &newname,
            libc::AT_SYMLINK_FOLLOW,
        )?;
        self.do_lookup(&np, &newname)
    }

    pub(super) fn op_statfs(&self, ino: u64) -> FsResult<Kstatfs> {
        let data = self.inodes.get(ino)?;
        let fd = data.fd(&self.budget)?;
        let s = sys::fstatfs(fd.raw())?;
        Ok(Kstatfs {
            blocks: s.f_blocks,
            bfree: s.f_bfree,
            bavail: s.f_bavail,
            files: s.f_files,
            ffree: s.f_ffree,
            bsize: s.f_bsize as u32,
            namelen: s.f_namemax as u32,
            frsize: s.f_frsize as u32,
            ..Default::default()
        })
    }

    pub(super) fn op_access(&self, ctx: &Ctx, ino: u64, mask: u32) -> FsResult<()> {
        let data = self.inodes.get(ino)?;
        if mask & libc::W_OK as u32 != 0 && self.cfg.readonly {
            return Err(Errno(libc::EROFS));
        }
        let _c = self.creds(ctx)?;
        let fd = data.fd(&self.budget)?;
        let name = CString::new(fd.raw().to_string()).map_err(|_nul| Errno::EINVAL)?;
        let proc = std::os::fd::AsRawFd::as_raw_fd(&self.proc_fd);
        sys::faccessat_eaccess(proc, &name, mask)
    }

    fn xattr_path(
        &self,
        ino: u64,
    ) -> Result<(std::sync::Arc<super::InodeData>, sys::FdName), Errno> {
        if !self.cfg.xattr {
            return Err(Errno::ENOSYS);
        }
        let data = self.inodes.get(ino)?;
        let proc = std::os::fd::AsRawFd::as_raw_fd(&self.proc_fd);
        let path = match &data.source {
            super::inode::Source::Fd(f)
            | super::inode::Source::Handle {
                cached: Some(f), ..
            } => sys::FdName::new(proc, f.raw()),
            // A handle-backed inode has no fd to name: open one for the call.
            super::inode::Source::Handle { .. } => return Err(Errno::EAGAIN),
        };
        Ok((data, path))
    }

    /// Runs an xattr call on `ino` through its /proc/self/fd entry. Special
    /// files and symlinks are refused for user.* names as the host does.
    fn with_xattr<T>(
        &self,
        ctx: &Ctx,
        ino: u64,
        f: impl FnOnce(&sys::FdName) -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        let _c = self.creds_allocating(ctx)?;
        self.daemon_xattr(ino, f)
    }

    pub(super) fn op_setxattr(
        &self,
        ctx: &Ctx,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: u32,
        ext_flags: u32,
    ) -> FsResult<()> {
        self.writable()?;
        self.acl_gate(name)?;
        // An ACL's IDs as the host's, first: a forbidden one changes
        // nothing (EPERM).
        let host_acl;
        let value = if self.translates_acl(name) {
            let mut v = value.to_vec();
            acl_to_host(&mut v, &self.cfg.translate_uid, &self.cfg.translate_gid)?;
            host_acl = v;
            &host_acl[..]
        } else {
            value
        };
        let killed = if name == ACL_ACCESS
            && ext_flags & fuse_core::abi::flags::SETXATTR_ACL_KILL_SGID != 0
        {
            self.set_mode(ctx, ino, |m| m & !libc::S_ISGID)?
        } else {
            None
        };
        let name = cstr(&self.host_xattr(name)?)?;
        let r = self.with_xattr(ctx, ino, |p| sys::setxattr(p, &name, value, flags as i32));
        if let (Err(_), Some(old)) = (&r, killed) {
            // No ACL was set: the setgid bit comes back (best effort).
            let _ = self.set_mode(ctx, ino, |_| old);
        }
        r
    }

    /// Removes the renamed `security.capability` of `ino` (see
    /// `PassthroughFs::mapped_caps`) after a write, truncate or chown, as
    /// the host kernel removes file capabilities then: a guest's file
    /// keeps no capabilities its new contents or owner were not given.
    /// Best effort (ENODATA is the usual answer).
    pub(super) fn kill_mapped_caps(&self, ino: u64) {
        let Some(name) = &self.mapped_caps else {
            return;
        };
        let _ = self.daemon_xattr(ino, |p| sys::removexattr(p, name));
    }

    /// An xattr call on `ino` with the daemon's own credentials.
    fn daemon_xattr<T>(
        &self,
        ino: u64,
        f: impl FnOnce(&sys::FdName) -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        match self.xattr_path(ino) {
            Ok((_data, path)) => f(&path),
            Err(Errno::EAGAIN) => {
                let data = self.inodes.get(ino)?;
                let fd = data.fd(&self.budget)?;
                let proc = std::os::fd::AsRawFd::as_raw_fd(&self.proc_fd);
                f(&sys::FdName::new(proc, fd.raw()))
            }
            Err(e) => Err(e),
        }
    }

    /// The host's name for the client's xattr `name` (`Config::xattrmap`),
    /// or the errno its rule refuses it with.
    pub(super) fn host_xattr<'a>(
        &self,
        name: &'a [u8],
    ) -> Result<std::borrow::Cow<'a, [u8]>, Errno> {
        match &self.cfg.xattrmap {
            None => Ok(std::borrow::Cow::Borrowed(name)),
            Some(m) => match m.to_host(name) {
                super::Mapped::Name(n) => Ok(n),
                super::Mapped::Refused(e) => Err(e),
            },
        }
    }

    /// Without FUSE_POSIX_ACL, the ACL xattrs are hidden unless
    /// `Config::pass_acl_xattrs`.
    fn acls_hidden(&self) -> bool {
        !self.posix_acl() && !self.cfg.pass_acl_xattrs
    }

    /// Whether `name` is an ACL xattr whose IDs are translated.
    fn translates_acl(&self, name: &[u8]) -> bool {
        (name == ACL_ACCESS || name == ACL_DEFAULT)
            && !(self.cfg.translate_uid.is_identity() && self.cfg.translate_gid.is_identity())
    }

    fn acl_gate(&self, name: &[u8]) -> Result<(), Errno> {
        if (name == ACL_ACCESS || name == ACL_DEFAULT) && self.acls_hidden() {
            return Err(Errno(libc::EOPNOTSUPP));
        }
        Ok(())
    }

    /// Changes the permission bits of `ino` to `f(mode)` as the caller, if
    /// that changes them; returns the mode before. SETXATTR_ACL_KILL_SGID
    /// uses it to clear S_ISGID before a new access ACL: the client found
    /// its caller outside the file's group and without CAP_FSETID, which
    /// the host cannot know when that caller is root (we keep CAP_FSETID).
    fn set_mode(&self, ctx: &Ctx, ino: u64, f: impl Fn(u32) -> u32) -> Result<Option<u32>, Errno> {
        let data = self.inodes.get(ino)?;
        let _c = self.creds(ctx)?;
        let mode = u32::from(self.stat(&data)?.stx_mode) & 0o7777;
        if f(mode) == mode {
            return Ok(None);
        }
        let fd = data.fd(&self.budget)?;
        let name = CString::new(fd.raw().to_string()).map_err(|_nul| Errno::EINVAL)?;
        let proc = std::os::fd::AsRawFd::as_raw_fd(&self.proc_fd);
        sys::fchmodat(proc, &name, f(mode))?;
        Ok(Some(mode))
    }

    pub(super) fn op_getxattr(
        &self,
        ctx: &Ctx,
        ino: u64,
        name: &[u8],
        size: u32,
    ) -> FsResult<Xattr> {
        self.acl_gate(name)?;
        let acl = self.translates_acl(name);
        let name = cstr(&self.host_xattr(name)?)?;
        self.with_xattr(ctx, ino, |p| {
            if size == 0 {
                return sys::getxattr(p, &name, &mut []).map(|n| Xattr::Size(n as u32));
            }
            let mut buf = vec![0u8; (size as usize).min(XATTR_MAX)];
            let n = sys::getxattr(p, &name, &mut buf)?;
            buf.truncate(n);
            if acl {
                // The same length: a size query stays right.
                acl_to_guest(&mut buf, &self.cfg.translate_uid, &self.cfg.translate_gid);
            }
            Ok(Xattr::Data(buf))
        })
    }

    pub(super) fn op_listxattr(&self, ctx: &Ctx, ino: u64, size: u32) -> FsResult<Xattr> {
        if self.acls_hidden() || self.cfg.xattrmap.is_some() {
            return self.with_xattr(ctx, ino, |p| {
                let mut names = list_all(p)?;
                if let Some(m) = &self.cfg.xattrmap {
                    names = m.list_to_guest(&names);
                }
                if self.acls_hidden() {
                    names = without_acls(&names);
                }
                match size {
                    0 => Ok(Xattr::Size(names.len() as u32)),
                    s if (s as usize) < names.len() => Err(Errno(libc::ERANGE)),
                    _ => Ok(Xattr::Data(names)),
                }
            });
        }
        self.with_xattr(ctx, ino, |p| {
            if size == 0 {
                return sys::listxattr(p, &mut []).map(|n| Xattr::Size(n as u32));
            }
            let mut buf = vec![0u8; (size as usize).min(XATTR_MAX)];
            let n = sys::listxattr(p, &mut buf)?;
            buf.truncate(n);
            Ok(Xattr::Data(buf))
        })
    }

    pub(super) fn op_removexattr(&self, ctx: &Ctx, ino: u64, name: &[u8]) -> FsResult<()> {
        self.writable()?;
        self.acl_gate(name)?;
        let name = cstr(&self.host_xattr(name)?)?;
        self.with_xattr(ctx, ino, |p| sys::removexattr(p, &name))
    }

    pub(super) fn op_statx(
        &self,
        ino: u64,
        fh: Option<u64>,
        flags: u32,
        mask: u32,
    ) -> FsResult<(Statx, Duration)> {
        let sync = flags as i32 & libc::AT_STATX_SYNC_TYPE;
        let st = match fh.and_then(|fh| self.handles.get(fh).ok()) {
            Some(h) => sys::statx(
                h.fd.raw(),
                c"",
                libc::AT_EMPTY_PATH | sync,
                mask | STATX_MASK,
            )?,
            None => {
                let data = self.inodes.get(ino)?;
                let fd = data.fd(&self.budget)?;
                sys::statx(
                    fd.raw(),
                    c"",
                    libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW | sync,
                    mask | STATX_MASK,
                )?
            }
        };
        let sx = Statx {
            mask: st.stx_mask & !libc::STATX_MNT_ID,
            blksize: st.stx_blksize,
            attributes: st.stx_attributes,
            nlink: st.stx_nlink,
            uid: self.cfg.translate_uid.to_guest(st.stx_uid),
            gid: self.cfg.translate_gid.to_guest(st.stx_gid),
            mode: st.stx_mode,
            ino: st.stx_ino,
            size: st.stx_size,
            blocks: st.stx_blocks,
            attributes_mask: st.stx_attributes_mask,
            atime: sx_time(&st.stx_atime),
            btime: sx_time(&st.stx_btime),
            ctime: sx_time(&st.stx_ctime),
            mtime: sx_time(&st.stx_mtime),
            rdev_major: st.stx_rdev_major,
            rdev_minor: st.stx_rdev_minor,
            dev_major: st.stx_dev_major,
            dev_minor: st.stx_dev_minor,
            ..Default::default()
        };
        Ok((sx, self.cfg.cache.timeout()))
    }

    pub(super) fn op_syncfs(&self, ino: u64) -> FsResult<()> {
        let mut data = self.inodes.get(ino)?;
        if !data.is_dir() && data.ftype != libc::S_IFREG {
            // Same filesystem as far as the client knows: the root's.
            data = self.inodes.get(ROOT_ID)?;
        }
        let f = self.reopen(&data, libc::O_RDONLY)?;
        sys::syncfs(f.raw())
    }
}
