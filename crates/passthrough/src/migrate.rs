//! Live migration: the passthrough's state handed from one daemon to
//! another serving the same shared directory (`--migration-mode`).
//!
//! The source names each inode the client holds (node id, lookup
//! references) by its path below the shared directory (`find-paths`) or
//! by its file handle with the path along (`file-handles`), and each handle
//! by its host open flags and opener; the destination opens them again
//! under the same ids. What cannot be named or opened fails the save or
//! load (`--migration-on-error abort`) or is carried as lost (`guest-error`:
//! EIO for every request naming it, never another file). POSIX locks go
//! along (`locks/handover.rs`); flock(2) locks do not. The stream is
//! untrusted: every count is checked against the bytes left, nothing is
//! allocated for a count, paths are walked a component at a time with
//! O_NOFOLLOW, and a file opened by handle must lie below the shared
//! directory, but one unlinked while open (docs/DESIGN.md, "Live migration").

use super::creds::{with_dac_read_search, Cred};
use super::inode::{key_of, CountedFd, Found, InodeData};
use super::locks::SavedOwner;
use super::{component, sys, PassthroughFs, STATX_MASK};
use fuse_core::server::state::{StateError, StateReader, StateWriter};
use fuse_core::Errno;
use records::{
    get_handle, get_inode, get_owner, put_handle, put_inode, put_owner, FileHandle, HandleRec,
    InodeRec, Locator, HANDLE_MIN, INODE_MIN, OWNER_MIN, VERSION,
};
use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::sync::Arc;

mod records;

/// How the source names inodes for the destination (`--migration-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MigrationMode {
    /// By path below the shared directory.
    #[default]
    FindPaths,
    /// By file handle (both daemons on the same filesystem; the
    /// destination needs CAP_DAC_READ_SEARCH).
    FileHandles,
}

/// What a file that cannot be carried over does (`--migration-on-error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MigrationOnError {
    /// Fail the migration; the source goes on.
    #[default]
    Abort,
    /// Migrate; requests on that file get EIO.
    GuestError,
}

/// Migration options.
#[derive(Debug, Clone, Copy, Default)]
pub struct MigrationConfig {
    /// How inodes are named.
    pub mode: MigrationMode,
    /// What a file that cannot be carried over does.
    pub on_error: MigrationOnError,
    /// Send file handles with paths; the destination checks them.
    pub verify_handles: bool,
}

/// Tells the operator what `--migration-on-error guest-error` carries
/// over as lost (the guest gets EIO on it): on the daemon's standard
/// error, as the device's other migration reports.
fn lost(what: &str) {
    log::error!("migration: carried over as lost (EIO): {what}");
}

/// The link count of the file `fd` refers to.
fn nlink(fd: i32) -> Option<u32> {
    sys::statx(fd, c"", libc::AT_EMPTY_PATH, libc::STATX_NLINK)
        .ok()
        .map(|st| st.stx_nlink)
}

fn refused(what: String, e: Errno) -> StateError {
    StateError::Refused {
        what,
        source: Some(std::io::Error::from_raw_os_error(e.0)),
    }
}

/// Open flags a handle is opened again with.
fn reopen_flags(flags: i32) -> i32 {
    flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_NOCTTY | libc::O_PATH)
}

impl PassthroughFs {
    /// The path the kernel gives one of the daemon's fds.
    fn fd_path(&self, fd: i32) -> Result<Vec<u8>, Errno> {
        let name = CString::new(fd.to_string()).map_err(|_nul| Errno::EINVAL)?;
        sys::readlinkat(self.proc_fd.as_raw_fd(), &name)
    }

    /// The kernel's /proc/self/fdinfo text of one of the daemon's fds.
    fn fdinfo(&self, fd: i32) -> Result<String, Errno> {
        let name = CString::new(format!("../fdinfo/{fd}")).map_err(|_nul| Errno::EINVAL)?;
        let f = sys::openat(
            self.proc_fd.as_raw_fd(),
            &name,
            libc::O_RDONLY | libc::O_CLOEXEC,
            0,
        )?;
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(f), &mut text)
            .map_err(|e| sys::errno_of(&e))?;
        Ok(text)
    }

    /// `fd`'s path relative to the shared directory (`root`: its path).
    fn relative_path(&self, root: &[u8], fd: i32) -> Result<Vec<u8>, String> {
        let p = self.fd_path(fd).map_err(|e| format!("no path ({e:?})"))?;
        if p.ends_with(b" (deleted)") {
            return Err("unlinked while in use".into());
        }
        let rel = if root == b"/" {
            p.strip_prefix(b"/")
        } else {
            p.strip_prefix(root).and_then(|r| r.strip_prefix(b"/"))
        };
        match rel {
            Some(r) if !r.is_empty() => Ok(r.to_vec()),
            _ => Err(format!(
                "its path {} is outside the shared directory",
                String::from_utf8_lossy(&p)
            )),
        }
    }

    /// Opens `path` (relative) from the shared directory, a component at a
    /// time, following no symlink and refusing "." and "..".
    fn open_path_beneath(&self, root: &CountedFd, path: &[u8]) -> Result<CountedFd, Errno> {
        let mut cur: Option<CountedFd> = None;
        for name in path.split(|&b| b == b'/') {
            let c = component(name)?;
            let dir = cur.as_ref().map_or(root.raw(), CountedFd::raw);
            let next = self.budget.open(|| {
                sys::openat(
                    dir,
                    &c,
                    libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                    0,
                )
            })?;
            cur = Some(next);
        }
        cur.ok_or(Errno::EINVAL)
    }

    /// The locator of `data` under `mode`, or why there is none.
    fn locate(
        &self,
        data: &InodeData,
        root: &InodeData,
        root_path: &[u8],
    ) -> Result<(Locator, Option<FileHandle>), String> {
        let m = &self.cfg.migration;
        let fd = data
            .fd(&self.budget)
            .map_err(|e| format!("no fd ({e:?})"))?;
        let handle = || {
            sys::name_to_handle(fd.raw())
                .map(|(h, typ, _)| (typ, h))
                .map_err(|e| format!("no file handle ({e:?})"))
        };
        if m.mode == MigrationMode::FileHandles
            && data.key.mnt == root.key.mnt
            && (data.ftype == libc::S_IFREG || data.ftype == libc::S_IFDIR)
        {
            let (typ, handle) = handle()?;
            let path = match self.relative_path(root_path, fd.raw()) {
                Ok(p) => p,
                Err(_) if nlink(fd.raw()) == Some(0) => Vec::new(),
                Err(why) => return Err(why),
            };
            return Ok((Locator::Handle { typ, handle, path }, None));
        }
        let path = self.relative_path(root_path, fd.raw())?;
        // Confirm the name: it must lead from the shared directory to this
        // very inode now (the VM is stopped, but host processes are not).
        let rootfd = root.fd(&self.budget).map_err(|e| format!("{e:?}"))?;
        let c = CString::new(path.clone()).map_err(|_nul| "a NUL in its path".to_string())?;
        let st = sys::statx(rootfd.raw(), &c, libc::AT_SYMLINK_NOFOLLOW, STATX_MASK)
            .map_err(|e| format!("its path does not resolve ({e:?})"))?;
        if key_of(&st) != data.key {
            return Err("its path now names another file".into());
        }
        let verify = if m.verify_handles {
            Some(handle()?)
        } else {
            None
        };
        Ok((Locator::Path(path), verify))
    }

    /// Live migration, source side: see the module docs.
    pub(super) fn save_migration_state(&self) -> Result<Vec<u8>, StateError> {
        let m = self.cfg.migration;
        let root = self
            .inodes
            .get(fuse_core::abi::ROOT_ID)
            .map_err(|e| refused("the shared directory".into(), e))?;
        let root_path = {
            let fd = root
                .fd(&self.budget)
                .map_err(|e| refused("the shared directory".into(), e))?;
            self.fd_path(fd.raw())
                .map_err(|e| refused("the shared directory's path".into(), e))?
        };
        let mut inodes = Vec::new();
        let mut lost_ids = std::collections::HashSet::new();
        for (data, refs) in self.inodes.snapshot() {
            if data.nodeid == fuse_core::abi::ROOT_ID {
                continue;
            }
            let (loc, verify) = match self.locate(&data, &root, &root_path) {
                Ok(l) => l,
                Err(why) => {
                    let what = format!("node {} (inode {}): {why}", data.nodeid, data.key.ino);
                    if m.on_error == MigrationOnError::Abort {
                        return Err(StateError::refused(what));
                    }
                    lost(&what);
                    lost_ids.insert(data.nodeid);
                    // The destination names the node itself.
                    let why = format!("(inode {}) {why}", data.key.ino);
                    (Locator::Lost(why.into_bytes()), None)
                }
            };
            inodes.push(InodeRec {
                nodeid: data.nodeid,
                refs,
                ftype: data.ftype,
                loc,
                verify,
            });
        }
        for (id, refs) in self.inodes.lost() {
            inodes.push(InodeRec {
                nodeid: id,
                refs,
                ftype: 0,
                loc: Locator::Lost(b"lost in an earlier migration".to_vec()),
                verify: None,
            });
        }
        let (open, lost_handles) = self.handles.snapshot();
        // A handle whose inode is not among those saved was released (and
        // its inode forgotten) between the two snapshots, or made by a
        // request the guest never saw answered: not the guest's.
        let saved: std::collections::HashSet<u64> = inodes
            .iter()
            .map(|r| r.nodeid)
            .chain([fuse_core::abi::ROOT_ID])
            .collect();
        let open: Vec<_> = open
            .into_iter()
            .filter(|(_, h)| saved.contains(&h.inode.nodeid))
            .collect();
        let mut w = StateWriter::new();
        w.u32(VERSION).u32(inodes.len() as u32);
        for r in &inodes {
            put_inode(&mut w, r);
        }
        w.u32((open.len() + lost_handles.len()) as u32);
        for (fh, h) in &open {
            // A handle of a lost inode is lost with it (flags -1 mark it).
            let flags = if lost_ids.contains(&h.inode.nodeid) {
                -1
            } else {
                sys::getfl(h.fd.raw())
                    .map(reopen_flags)
                    .map_err(|e| refused(format!("handle {fh}: its open flags"), e))?
            };
            put_handle(&mut w, *fh, h.inode.nodeid, flags, h.opener());
        }
        for fh in lost_handles {
            put_handle(&mut w, fh, 0, -1, &Cred::default());
        }
        // flock(2) locks are not carried over (they belong to the
        // handle's description): refused under abort.
        if m.on_error == MigrationOnError::Abort {
            for (fh, h) in &open {
                let text = self.fdinfo(h.fd.raw()).unwrap_or_default();
                if text
                    .lines()
                    .any(|l| l.starts_with("lock:") && l.contains(" FLOCK "))
                {
                    return Err(StateError::refused(format!(
                        "handle {fh} holds a flock(2) lock, which is not carried over"
                    )));
                }
            }
        }
        let owners = self
            .locks
            .save(|fd| self.fdinfo(fd))
            .map_err(|e| refused("the POSIX locks held".into(), e))?;
        let owners: Vec<_> = owners
            .into_iter()
            .filter(|o| !lost_ids.contains(&o.nodeid) && saved.contains(&o.nodeid))
            .collect();
        w.u32(owners.len() as u32);
        for o in &owners {
            put_owner(&mut w, o);
        }
        Ok(w.finish())
    }

    /// Reads a whole state, handing each record to `inode`, `handle` or
    /// `owner` as it is read, in stream order (every inode before any
    /// handle, every handle before any lock owner). Nothing is allocated
    /// for a count: only each record's own strings and lists, as long as
    /// the stream holds them.
    fn parse(
        buf: &[u8],
        inode: &mut dyn FnMut(InodeRec) -> Result<(), StateError>,
        handle: &mut dyn FnMut(HandleRec) -> Result<(), StateError>,
        owner: &mut dyn FnMut(SavedOwner) -> Result<(), StateError>,
    ) -> Result<(), StateError> {
        let mut r = StateReader::new(buf);
        let version = r.u32("passthrough state version")?;
        if version != VERSION {
            return Err(StateError::Version {
                found: version,
                expected: VERSION,
            });
        }
        for _ in 0..r.count(INODE_MIN, "inodes")? {
            inode(get_inode(&mut r)?)?;
        }
        for _ in 0..r.count(HANDLE_MIN, "handles")? {
            handle(get_handle(&mut r)?)?;
        }
        for _ in 0..r.count(OWNER_MIN, "lock owners")? {
            owner(get_owner(&mut r)?)?;
        }
        r.end("passthrough state")
    }

    /// Opens what `rec` names, checked against what the source said.
    fn take_up(&self, root: &InodeData, rec: &InodeRec) -> Result<Found, String> {
        let rootfd = root.fd(&self.budget).map_err(|e| format!("{e:?}"))?;
        let rootfd = match rootfd {
            super::inode::InodeFd::Held(f) => f,
            super::inode::InodeFd::Opened(_) => return Err("the shared directory has no fd".into()),
        };
        let fd = match &rec.loc {
            Locator::Lost(why) => return Err(String::from_utf8_lossy(why).into_owned()),
            Locator::Path(p) => self
                .open_path_beneath(rootfd, p)
                .map_err(|e| format!("{}: cannot be opened ({e:?})", String::from_utf8_lossy(p)))?,
            Locator::Handle { typ, handle, path } => {
                let name = CString::new(rootfd.raw().to_string()).map_err(|_nul| "fd name")?;
                let proc = self.proc_fd.as_raw_fd();
                let mount = self
                    .budget
                    .open(|| sys::openat(proc, &name, libc::O_RDONLY | libc::O_DIRECTORY, 0))
                    .map_err(|e| format!("the shared directory ({e:?})"))?;
                let fd = self
                    .budget
                    .open(|| {
                        with_dac_read_search(|| {
                            sys::open_by_handle(mount.raw(), handle, *typ, libc::O_PATH)
                        })
                    })
                    .map_err(|e| format!("its file handle cannot be opened ({e:?})"))?;
                // A handle names any file of the filesystem, and the name
                // the kernel gives what it opens says little (a file's
                // dentry may be disconnected; in the sandbox the share is
                // "/"): a file with links is taken only if its path below
                // the shared directory leads to it. One unlinked while open
                // (no link left) cannot be checked: it is taken as the
                // stream says (see the module docs).
                if nlink(fd.raw()) == Some(0) {
                    fd
                } else {
                    let at = self.open_path_beneath(rootfd, path).map_err(|e| {
                        format!(
                            "its path {} cannot be opened ({e:?})",
                            String::from_utf8_lossy(path)
                        )
                    })?;
                    let same = |f: &CountedFd| {
                        sys::statx(f.raw(), c"", libc::AT_EMPTY_PATH, STATX_MASK)
                            .map(|st| key_of(&st))
                            .ok()
                    };
                    if same(&at).is_none() || same(&at) != same(&fd) {
                        return Err(
                            "its file handle names a file that is not at its path in the shared directory"
                                .into(),
                        );
                    }
                    // The same inode by its path: its dentry is connected
                    // (the handle's may not be, and a later migration from
                    // here names the file by what the kernel calls it).
                    at
                }
            }
        };
        let st = sys::statx(fd.raw(), c"", libc::AT_EMPTY_PATH, STATX_MASK)
            .map_err(|e| format!("stat ({e:?})"))?;
        if u32::from(st.stx_mode) & libc::S_IFMT != rec.ftype {
            return Err("it is now a file of another type".into());
        }
        if let Some((typ, h)) = &rec.verify {
            match sys::name_to_handle(fd.raw()) {
                Ok((mine, t, _)) if mine == *h && t == *typ => {}
                Ok(_) => return Err("its path leads to another inode than the source's".into()),
                Err(e) => return Err(format!("no file handle to verify ({e:?})")),
            }
        }
        Ok(Found { fd, st })
    }

    /// Live migration, destination side: see the module docs. The whole
    /// stream is read once to check it (a corrupt one takes nothing up),
    /// then again, each record taken up as it is read. On a failure under
    /// `abort` nothing taken up stays.
    pub(super) fn load_migration_state(&self, buf: &[u8]) -> Result<(), StateError> {
        Self::parse(buf, &mut |_| Ok(()), &mut |_| Ok(()), &mut |_| Ok(()))?;
        let r = self.take_up_all(buf);
        if r.is_err() {
            self.locks.clear();
            self.handles.clear();
            self.inodes.clear();
        }
        r
    }

    fn take_up_all(&self, buf: &[u8]) -> Result<(), StateError> {
        let abort = self.cfg.migration.on_error == MigrationOnError::Abort;
        let root = self
            .inodes
            .get(fuse_core::abi::ROOT_ID)
            .map_err(|e| refused("the shared directory".into(), e))?;
        Self::parse(
            buf,
            &mut |rec| self.take_up_inode(&root, &rec, abort),
            &mut |h| self.take_up_handle(h, abort),
            &mut |o| self.take_up_owner(&o, abort),
        )
    }

    fn take_up_inode(
        &self,
        root: &InodeData,
        rec: &InodeRec,
        abort: bool,
    ) -> Result<(), StateError> {
        match self.take_up(root, rec) {
            Ok(found) => {
                self.inodes
                    .restore(rec.nodeid, rec.refs, found)
                    .map_err(|_| dup(format!("node {} (or its file)", rec.nodeid)))?;
            }
            Err(why) => {
                if abort {
                    return Err(StateError::refused(format!("node {}: {why}", rec.nodeid)));
                }
                lost(&format!("node {}: {why}", rec.nodeid));
                self.inodes
                    .restore_lost(rec.nodeid, rec.refs)
                    .map_err(|_| dup(format!("node {}", rec.nodeid)))?;
            }
        }
        Ok(())
    }

    fn take_up_handle(&self, h: HandleRec, abort: bool) -> Result<(), StateError> {
        let data: Result<Arc<InodeData>, String> = match self.inodes.get(h.nodeid) {
            _ if h.flags == -1 => Err("its file was lost".into()),
            Ok(d) => Ok(d),
            Err(Errno::EIO) => Err("its file was lost".into()),
            Err(_) => {
                return Err(StateError::Corrupt(format!(
                    "handle {} names unknown node {}",
                    h.fh, h.nodeid
                )))
            }
        };
        let opened = data.and_then(|d| {
            let flags = reopen_flags(h.flags) | libc::O_CLOEXEC;
            let flags = if d.is_dir() {
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC
            } else {
                flags
            };
            let fd = self
                .reopen(&d, flags)
                .map_err(|e| format!("cannot be opened again ({e:?})"))?;
            let dir = d.is_dir();
            self.new_handle(fd, d, flags, dir, h.opener, Some(h.fh))
                .map_err(|_| format!("handle {} twice", h.fh))
        });
        if let Err(why) = opened {
            if abort {
                return Err(StateError::refused(format!("handle {}: {why}", h.fh)));
            }
            lost(&format!("handle {} (node {}): {why}", h.fh, h.nodeid));
            self.handles
                .restore_lost(h.fh)
                .map_err(|_| dup(format!("handle {}", h.fh)))?;
        }
        Ok(())
    }

    fn take_up_owner(&self, o: &SavedOwner, abort: bool) -> Result<(), StateError> {
        let data = match self.inodes.get(o.nodeid) {
            Ok(d) => d,
            // Its file was lost: so are its locks (EIO on it anyway).
            Err(Errno::EIO) => return Ok(()),
            Err(_) => {
                return Err(StateError::Corrupt(format!(
                    "locks on unknown node {}",
                    o.nodeid
                )))
            }
        };
        if let Err(e) = self
            .locks
            .restore(o, || self.reopen(&data, o.acc | libc::O_CLOEXEC))
        {
            let what = format!(
                "the POSIX locks of owner {:#x} on node {}",
                o.owner, o.nodeid
            );
            if abort || e == Errno::EINVAL {
                return Err(refused(what, e));
            }
            lost(&format!("{what}: cannot be taken ({e:?})"));
        }
        Ok(())
    }
}

/// A node id or handle the stream names twice (or one reserved).
fn dup(what: String) -> StateError {
    StateError::Corrupt(format!("{what} twice, or reserved"))
}
