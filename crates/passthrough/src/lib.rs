//! The passthrough filesystem: one host directory served through
//! [`fuse_core::server::Filesystem`].
//!
//! Confinement: no request resolves a path. Every client name is one
//! component (no "/" or NUL, at most 255 bytes; "." and ".." only in
//! LOOKUP, answered from the inode table), opened beneath its parent's
//! O_PATH fd with openat2 (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS`) and `O_NOFOLLOW` (openat before Linux 5.6);
//! held inodes are reopened through the daemon's own `/proc/self/fd/N`.
//!
//! Credentials: with [`Config::creds`] what creates, checks permissions or
//! changes data runs as the caller (`creds.rs`; a writeback WRITE as the
//! handle's opener), with IDs translated by [`Config::translate_uid`] and
//! [`Config::translate_gid`] (`idmap.rs`) and the capabilities of the host
//! uid it runs as (docs/SECURITY.md, "ID translation").

mod backing;
mod caller;
mod client_io;
mod cold;
mod config;
mod creds;
mod entry;
mod file;
mod fs;
mod idmap;
mod init;
mod inode;
mod io;
mod label;
mod locks;
mod mapped;
mod migrate;
mod started;
#[cfg(feature = "test-utils")]
pub mod testing;
mod xattrmap;

// The system calls live in host-io; `super::sys` in the modules names them.
use host_io::sys;

pub use config::{CachePolicy, Config};
pub use creds::Groups;
pub use idmap::{Forbidden, IdMap, IdMapError, IdMapping};
pub use inode::{FdBudget, InodeKey};
pub use io::IoCounts;
pub use migrate::{MigrationConfig, MigrationMode, MigrationOnError};
pub use started::PassthroughIo;
pub use xattrmap::{Mapped, XattrMap, XattrMapError};

/// The file capabilities' xattr.
const CAPS_XATTR: &[u8] = b"security.capability";

use file::Handles;
use fuse_core::abi::Attr;
use fuse_core::server::Entry;
use fuse_core::Errno;
use inode::{Found, InodeData, InodeTable};
use std::ffi::{CStr, CString};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

/// Errors setting up the passthrough.
#[derive(Debug, thiserror::Error)]
pub enum PassthroughError {
    /// The shared directory could not be opened.
    #[error("opening shared directory {path}")]
    Open {
        /// The directory.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The shared directory is not a directory.
    #[error("{0} is not a directory")]
    NotDir(String),
}

/// The passthrough filesystem.
pub struct PassthroughFs {
    cfg: Config,
    /// The host name `Config::xattrmap` gives `security.capability`, if
    /// not its own: the host kernel clears its own on a write, truncate
    /// or chown of the file, not a renamed one, so the daemon does
    /// (`kill_mapped_caps`).
    mapped_caps: Option<std::ffi::CString>,
    inodes: InodeTable,
    handles: Handles,
    budget: Arc<FdBudget>,
    locks: locks::Locks,
    /// `/proc/self/fd`, for reopening held O_PATH fds.
    proc_fd: OwnedFd,
    /// How new inodes get their labels atomically (`label.rs`).
    fscreate: label::Fscreate,
    openat2: std::sync::atomic::AtomicBool,
    /// FUSE_SUBMOUNTS was negotiated (and asked for).
    submounts: std::sync::atomic::AtomicBool,
    /// FUSE_POSIX_ACL was negotiated.
    posix_acl: std::sync::atomic::AtomicBool,
    /// Per device: whether its files do non-blocking I/O (see `io`).
    nowait: std::sync::Mutex<std::collections::HashMap<u64, bool>>,
    io_stats: io::IoStats,
    /// The thread that checks files for mapped reads (`mapped.rs`).
    map_checker: mapped::Checker,
    /// Kernel passthrough (host mounts).
    backing: backing::Backing,
}

impl std::fmt::Debug for PassthroughFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PassthroughFs")
            .field("cfg", &self.cfg)
            .field("inodes", &self.inodes)
            .field("fds", &self.budget.used())
            .finish_non_exhaustive()
    }
}

const STATX_MASK: u32 = libc::STATX_BASIC_STATS | libc::STATX_MNT_ID;

fn io_err(path: &Path, source: std::io::Error) -> PassthroughError {
    PassthroughError::Open {
        path: path.display().to_string(),
        source,
    }
}

/// Whether the directory `fd` (O_PATH) gives a file handle that the daemon
/// can open again (open_by_handle_at needs CAP_DAC_READ_SEARCH).
fn handles_work(proc_fd: &OwnedFd, fd: i32) -> bool {
    let Ok((handle, typ, _)) = sys::name_to_handle(fd) else {
        return false;
    };
    let Ok(name) = CString::new(fd.to_string()) else {
        return false;
    };
    let proc = std::os::fd::AsRawFd::as_raw_fd(proc_fd);
    let Ok(mount) = sys::openat(proc, &name, libc::O_RDONLY | libc::O_DIRECTORY, 0) else {
        return false;
    };
    sys::open_by_handle(
        std::os::fd::AsRawFd::as_raw_fd(&mount),
        &handle,
        typ,
        libc::O_PATH,
    )
    .is_ok()
}

/// One path component from the client, checked.
fn component(name: &[u8]) -> Result<CString, Errno> {
    if name.len() > 255 {
        return Err(Errno::ENAMETOOLONG);
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
        return Err(Errno::EINVAL);
    }
    CString::new(name).map_err(|_nul| Errno::EINVAL)
}

fn attr_of(st: &libc::statx) -> Attr {
    Attr {
        ino: st.stx_ino,
        size: st.stx_size,
        blocks: st.stx_blocks,
        atime: st.stx_atime.tv_sec as u64,
        mtime: st.stx_mtime.tv_sec as u64,
        ctime: st.stx_ctime.tv_sec as u64,
        atimensec: st.stx_atime.tv_nsec,
        mtimensec: st.stx_mtime.tv_nsec,
        ctimensec: st.stx_ctime.tv_nsec,
        mode: u32::from(st.stx_mode),
        nlink: st.stx_nlink,
        uid: st.stx_uid,
        gid: st.stx_gid,
        rdev: libc::makedev(st.stx_rdev_major, st.stx_rdev_minor) as u32,
        blksize: st.stx_blksize,
        flags: 0,
    }
}

impl PassthroughFs {
    /// Serves `dir` with `cfg`.
    pub fn new(dir: impl AsRef<Path>, cfg: Config) -> Result<PassthroughFs, PassthroughError> {
        creds::probe_groups_locked();
        let dir = dir.as_ref();
        let budget = FdBudget::new(cfg.max_fds.max(2));
        let cpath = CString::new(dir.as_os_str().as_encoded_bytes())
            .map_err(|e| io_err(dir, std::io::Error::other(e)))?;
        let open = |p: &CStr, flags| {
            sys::openat(libc::AT_FDCWD, p, flags, 0).map_err(|e| {
                io_err(
                    Path::new(&*p.to_string_lossy()),
                    std::io::Error::from_raw_os_error(e.0),
                )
            })
        };
        let root = open(&cpath, libc::O_PATH | libc::O_DIRECTORY)?;
        let proc_fd = open(c"/proc/self/fd", libc::O_PATH | libc::O_DIRECTORY)?;
        let st = sys::statx(
            std::os::fd::AsRawFd::as_raw_fd(&root),
            c"",
            libc::AT_EMPTY_PATH,
            STATX_MASK,
        )
        .map_err(|e| io_err(dir, std::io::Error::from_raw_os_error(e.0)))?;
        if u32::from(st.stx_mode) & libc::S_IFMT != libc::S_IFDIR {
            return Err(PassthroughError::NotDir(dir.display().to_string()));
        }
        let mut cfg = cfg;
        // Handles the daemon cannot open again (no CAP_DAC_READ_SEARCH, a
        // filesystem without them) would fail every later operation on
        // an inode entered without its fd: keep fds instead.
        if cfg.inode_file_handles && !handles_work(&proc_fd, std::os::fd::AsRawFd::as_raw_fd(&root))
        {
            cfg.inode_file_handles = false;
        }
        let reservation = budget
            .open(|| Ok(root))
            .map_err(|e| io_err(dir, std::io::Error::from_raw_os_error(e.0)))?;
        let mapped_caps = cfg
            .xattrmap
            .as_ref()
            .and_then(|m| match m.to_host(CAPS_XATTR) {
                Mapped::Name(n) if *n != *CAPS_XATTR => std::ffi::CString::new(n.into_owned()).ok(),
                _ => None,
            });
        Ok(PassthroughFs {
            fscreate: label::Fscreate::probe(cfg.security_label && cfg.xattr),
            mapped_caps,
            inodes: InodeTable::new(Found {
                fd: reservation,
                st,
            }),
            handles: Handles::default(),
            locks: locks::Locks::default(),
            budget,
            proc_fd,
            openat2: std::sync::atomic::AtomicBool::new(true),
            submounts: std::sync::atomic::AtomicBool::new(false),
            posix_acl: std::sync::atomic::AtomicBool::new(false),
            nowait: Default::default(),
            io_stats: Default::default(),
            map_checker: Default::default(),
            backing: Default::default(),
            cfg,
        })
    }

    /// The options in force.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Whether the shared directory's filesystem gives file handles (what
    /// [`Config::inode_file_handles`] uses where it can).
    pub fn file_handles_supported(&self) -> bool {
        let Ok(root) = self.inodes.get(fuse_core::abi::ROOT_ID) else {
            return false;
        };
        let Ok(fd) = root.fd(&self.budget) else {
            return false;
        };
        handles_work(&self.proc_fd, fd.raw())
    }

    /// Fds the daemon holds now (counted against [`Config::max_fds`]).
    #[cfg(feature = "test-utils")]
    pub fn fds_in_use(&self) -> usize {
        self.budget.used()
    }

    /// Inodes known (the root included).
    #[cfg(feature = "test-utils")]
    pub fn inode_count(&self) -> usize {
        self.inodes.len()
    }

    /// Gives the filesystem the /dev/fuse connection it serves, for kernel
    /// passthrough ([`Config::kernel_passthrough`]); call it before INIT.
    /// False if a connection was attached already.
    pub fn attach_device(&self, dev: impl host_io::BackingDevice + 'static) -> bool {
        self.backing.attach(Box::new(dev))
    }

    /// Whether kernel passthrough is in force (negotiated, and not turned
    /// off since by an EPERM from the kernel).
    pub fn kernel_passthrough(&self) -> bool {
        self.backing.active()
    }

    /// Backing files registered with the kernel now (one per inode with
    /// passthrough opens).
    #[cfg(feature = "test-utils")]
    pub fn backing_ids_open(&self) -> usize {
        self.backing.open_ids()
    }

    /// Open file and directory handles.
    #[cfg(feature = "test-utils")]
    pub fn handle_count(&self) -> usize {
        self.handles.len()
    }

    /// The lookup count of node `id` (None when unknown).
    #[cfg(feature = "test-utils")]
    pub fn lookup_count(&self, id: u64) -> Option<u64> {
        self.inodes.get(id).ok().map(|d| d.refs())
    }

    /// Data reads and writes done so far, by path (io_uring or syscall).
    pub fn io_counts(&self) -> IoCounts {
        self.io_stats.get()
    }

    /// Cancels the data I/O of request `unique` in flight on a worker's
    /// io_uring (FUSE_INTERRUPT): the request ends with EINTR. Returns how
    /// many ops were found.
    pub fn cancel_io(&self, unique: u64) -> usize {
        // A thread that serves the interrupt of a request it started
        // itself (a /dev/fuse worker reads both) does not wait for it to
        // leave: only this thread's next pass takes its completion. (Its
        // serving loop submits what it starts at once, so the cancel finds
        // it.)
        self.io_stats
            .cancels
            .cancel_here(unique, std::time::Duration::from_millis(20))
    }

    /// Open descriptions held for POSIX lock owners.
    #[cfg(feature = "test-utils")]
    pub fn lock_owner_fds(&self) -> usize {
        self.locks.owner_fds()
    }

    /// SETLKW requests parked on waiter threads now.
    #[cfg(feature = "test-utils")]
    pub fn parked_locks(&self) -> usize {
        self.locks.parked()
    }

    /// The highest number of direct writers seen holding one inode's lock
    /// together.
    #[cfg(feature = "test-utils")]
    pub fn max_parallel_writers(&self) -> usize {
        self.handles.max_parallel()
    }

    fn writable(&self) -> Result<(), Errno> {
        if self.cfg.readonly {
            Err(Errno(libc::EROFS))
        } else {
            Ok(())
        }
    }

    fn entry(&self, data: &InodeData, st: &libc::statx) -> Entry<u64> {
        Entry {
            inode: data.nodeid,
            generation: 0,
            attr: self.attr(st),
            entry_valid: self.cfg.cache.timeout(),
            attr_valid: self.cfg.cache.timeout(),
        }
    }

    /// Opens `name` in `parent` as O_PATH without following anything.
    fn open_beneath(&self, parent: &InodeData, name: &CStr) -> Result<Found, Errno> {
        let pfd = parent.fd(&self.budget)?;
        let fd = self.budget.open(|| {
            let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
            if self.openat2.load(std::sync::atomic::Ordering::Relaxed) {
                let resolve =
                    sys::RESOLVE_BENEATH | sys::RESOLVE_NO_SYMLINKS | sys::RESOLVE_NO_MAGICLINKS;
                match sys::openat2(pfd.fd(), name, flags, 0, resolve) {
                    Err(Errno::ENOSYS) => self
                        .openat2
                        .store(false, std::sync::atomic::Ordering::Relaxed),
                    r => return r,
                }
            }
            sys::openat(pfd.raw(), name, flags, 0)
        })?;
        let st = sys::statx(
            fd.raw(),
            c"",
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            STATX_MASK,
        )?;
        Ok(Found { fd, st })
    }

    /// Looks `name` up in `parent` and enters it with one reference.
    fn do_lookup(&self, parent: &InodeData, name: &CStr) -> Result<Entry<u64>, Errno> {
        let found = self.open_beneath(parent, name)?;
        self.enter_found(parent, found)
    }

    /// Enters what [`PassthroughFs::open_beneath`] found in `parent` with
    /// one reference.
    fn enter_found(&self, parent: &InodeData, found: Found) -> Result<Entry<u64>, Errno> {
        let st = found.st;
        let data = self.insert(found)?;
        let mut e = self.entry(&data, &st);
        if self.submounts.load(std::sync::atomic::Ordering::Relaxed)
            && data.ftype == libc::S_IFDIR
            && data.key.mnt != parent.key.mnt
        {
            e.attr.flags |= fuse_core::abi::flags::ATTR_SUBMOUNT;
        }
        Ok(e)
    }

    /// Enters what a lookup found in the inode table.
    fn insert(&self, found: Found) -> Result<Arc<InodeData>, Errno> {
        if !self.cfg.inode_file_handles {
            return self.inodes.insert(found, None, true);
        }
        let proc = std::os::fd::AsRawFd::as_raw_fd(&self.proc_fd);
        let open_mount = |fd: &inode::CountedFd| {
            let name = CString::new(fd.raw().to_string()).map_err(|_nul| Errno::EINVAL)?;
            let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY;
            self.budget.open(|| sys::openat(proc, &name, flags, 0))
        };
        let keep_fd = self.budget.has_room_to_cache();
        self.inodes.insert(found, Some(&open_mount), keep_fd)
    }

    /// Enters the inode `fd` (an open file, any mode) refers to.
    fn enter_fd(&self, fd: i32) -> Result<Entry<u64>, Errno> {
        let name = CString::new(fd.to_string()).map_err(|_nul| Errno::EINVAL)?;
        let proc = std::os::fd::AsRawFd::as_raw_fd(&self.proc_fd);
        let fd = self
            .budget
            .open(|| sys::openat(proc, &name, libc::O_PATH, 0))?;
        let st = sys::statx(fd.raw(), c"", libc::AT_EMPTY_PATH, STATX_MASK)?;
        let data = self.insert(Found { fd, st })?;
        Ok(self.entry(&data, &st))
    }

    /// Reopens an inode's O_PATH fd with real access `flags`. Only regular
    /// files and directories are ever opened for access: a device node
    /// would open a host device, a FIFO would block the worker.
    fn reopen(&self, data: &InodeData, flags: i32) -> Result<inode::CountedFd, Errno> {
        let openable = data.ftype == libc::S_IFREG || data.ftype == libc::S_IFDIR;
        if flags & libc::O_PATH == 0 && !openable {
            return Err(Errno(libc::EACCES));
        }
        let fd = data.fd(&self.budget)?;
        let name = CString::new(fd.raw().to_string()).map_err(|_nul| Errno::EINVAL)?;
        let proc = std::os::fd::AsRawFd::as_raw_fd(&self.proc_fd);
        let flags = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_NOFOLLOW);
        self.budget.open(|| sys::openat(proc, &name, flags, 0))
    }

    fn stat(&self, data: &InodeData) -> Result<libc::statx, Errno> {
        let fd = data.fd(&self.budget)?;
        sys::statx(
            fd.raw(),
            c"",
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            STATX_MASK,
        )
    }
}
