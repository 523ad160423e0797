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
mod client_io;
mod creds;
mod entry;
mod file;
mod fs;
mod idmap;
mod inode;
mod io;
mod label;
mod locks;
mod migrate;
mod started;
#[cfg(feature = "test-utils")]
pub mod testing;
mod xattrmap;

// The system calls live in host-io; `super::sys` in the modules names them.
use host_io::sys;

pub use creds::Groups;
pub use idmap::{Forbidden, IdMap, IdMapError, IdMapping};
pub use inode::{FdBudget, InodeKey};
pub use io::IoCounts;
pub use migrate::{MigrationConfig, MigrationMode, MigrationOnError};
pub use started::PassthroughIo;
pub use xattrmap::{Mapped, XattrMap, XattrMapError};

/// The file capabilities' xattr.
const CAPS_XATTR: &[u8] = b"security.capability";

use creds::{Caps, Cred, CredGuard};
use file::Handles;
use fuse_core::abi::{fopen, init, Attr};
use fuse_core::server::{Ctx, Entry};
use fuse_core::Errno;
use inode::{Found, InodeData, InodeTable};
use std::ffi::{CStr, CString};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

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

/// What the client may cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CachePolicy {
    /// Nothing: zero timeouts, direct I/O.
    Never,
    /// Names and attributes for a day, data never (direct I/O).
    Metadata,
    /// Names and attributes for a second, data until it changes.
    #[default]
    Auto,
    /// Everything for a day; data and directory pages kept across opens.
    Always,
}

impl CachePolicy {
    fn timeout(self) -> Duration {
        match self {
            CachePolicy::Never => Duration::ZERO,
            CachePolicy::Auto => Duration::from_secs(1),
            CachePolicy::Metadata | CachePolicy::Always => Duration::from_secs(86400),
        }
    }
}

/// Options of the passthrough.
#[derive(Debug, Clone)]
pub struct Config {
    /// Cache policy.
    pub cache: CachePolicy,
    /// Negotiate the writeback cache.
    pub writeback: bool,
    /// Refuse every change with EROFS.
    pub readonly: bool,
    /// Serve extended attributes (off: ENOSYS, and the client stops asking).
    pub xattr: bool,
    /// `--xattrmap`: how xattr names are renamed, hidden or refused
    /// between the client and the host (`xattrmap.rs`); None: unchanged.
    pub xattrmap: Option<XattrMap>,
    /// POSIX ACLs: INIT must agree on FUSE_POSIX_ACL (the client then
    /// enforces ACLs and default permissions itself), DONT_MASK and
    /// SETXATTR_EXT, or fails with EPROTO. Needs `xattr`.
    pub posix_acl: bool,
    /// With `posix_acl`: a client that cannot negotiate ACLs is served
    /// without them (as if `posix_acl` were off) instead of refused.
    pub posix_acl_optional: bool,
    /// Security labels (virtiofsd's `--security-label`): INIT offers
    /// FUSE_SECURITY_CTX, and the label a client sends with a creating
    /// request is set on the new host inode before the reply (`label.rs`),
    /// or the request fails and nothing is made. A client that cannot
    /// negotiate it fails INIT with EPROTO. Needs `xattr`.
    pub security_label: bool,
    /// With `security_label`: a client that cannot negotiate
    /// FUSE_SECURITY_CTX is served without labels instead of refused.
    pub security_label_optional: bool,
    /// Without `posix_acl`: pass the ACL xattrs (`system.posix_acl_access`,
    /// `system.posix_acl_default`) through as any other. Right for host
    /// mounts: every call runs as the caller with its real groups, so the
    /// host enforces the ACLs. Off (guests, whose groups the host does not
    /// know), they are refused with EOPNOTSUPP and left out of listxattr,
    /// as virtiofsd does.
    pub pass_acl_xattrs: bool,
    /// Direct-I/O opens get FOPEN_PARALLEL_DIRECT_WRITES; such writers hold
    /// the inode lock shared.
    pub parallel_direct_writes: bool,
    /// Keep file handles instead of an O_PATH fd per inode where the host
    /// filesystem supports them (needs CAP_DAC_READ_SEARCH).
    pub inode_file_handles: bool,
    /// Cap on fds the daemon holds (inodes, open files, lock fds); beyond
    /// it requests get EMFILE.
    pub max_fds: usize,
    /// Run operations under the caller's credentials.
    pub creds: bool,
    /// Where supplementary groups come from.
    pub groups: Groups,
    /// Data I/O through io_uring (off: pread/pwrite).
    pub io_uring: bool,
    /// Mark directories on another mount than their parent with
    /// FUSE_ATTR_SUBMOUNT (when the client negotiates FUSE_SUBMOUNTS), so
    /// the client gives them their own superblock and st_dev.
    pub announce_submounts: bool,
    /// Host mounts: negotiate FUSE_PASSTHROUGH and let the kernel do the
    /// reads, writes and mmaps of open files on the host files itself
    /// (see `backing.rs`). Needs [`PassthroughFs::attach_device`] before
    /// INIT and CAP_SYS_ADMIN; excludes the writeback cache.
    pub kernel_passthrough: bool,
    /// Offer FUSE_FLOCK_LOCKS: the client sends flock(2) locks to the
    /// daemon, which holds them on the host file. Off, the client keeps
    /// them to itself (virtiofsd's `-o no_flock`).
    pub flock_locks: bool,
    /// Offer FUSE_POSIX_LOCKS: the client sends fcntl(2) record locks to
    /// the daemon. Off, the client keeps them to itself (`-o
    /// no_posix_lock`).
    pub posix_locks: bool,
    /// Offer READDIRPLUS (FUSE_DO_READDIRPLUS and READDIRPLUS_AUTO). Off,
    /// the client lists directories with READDIR and looks each entry up
    /// (virtiofsd's `--no-readdirplus`).
    pub readdirplus: bool,
    /// Offer FUSE_HANDLE_KILLPRIV_V2 when `creds` is on (writes and
    /// truncates then run as the caller, so the host clears setuid/setgid
    /// itself). Off (virtiofsd's `--no-killpriv-v2`), the client clears
    /// them with a SETATTR of the mode, which runs as the caller too.
    pub killpriv_v2: bool,
    /// Open host files with the O_DIRECT the client asks for. Off
    /// (virtiofsd's `-o no_allow_direct_io`), O_DIRECT is dropped from the
    /// host open and the file is served through the host's page cache.
    pub direct_io: bool,
    /// How the client's uids become the host's and back (virtiofsd's
    /// `--translate-uid`); the default translates nothing.
    pub translate_uid: IdMap,
    /// The same for gids (`--translate-gid`).
    pub translate_gid: IdMap,
    /// Live migration (`--migration-mode` and the like; `migrate.rs`).
    pub migration: MigrationConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            cache: CachePolicy::Auto,
            writeback: false,
            readonly: false,
            xattr: true,
            xattrmap: None,
            posix_acl: false,
            posix_acl_optional: false,
            security_label: false,
            security_label_optional: false,
            pass_acl_xattrs: false,
            parallel_direct_writes: true,
            inode_file_handles: false,
            max_fds: 65536,
            creds: sys::geteuid() == 0,
            groups: Groups::None,
            io_uring: true,
            announce_submounts: false,
            kernel_passthrough: false,
            flock_locks: true,
            posix_locks: true,
            readdirplus: true,
            killpriv_v2: true,
            direct_io: true,
            translate_uid: IdMap::default(),
            translate_gid: IdMap::default(),
            migration: MigrationConfig::default(),
        }
    }
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

    /// `ctx`'s credentials on the host (its groups read only with creds
    /// on): its uid, gid and groups translated by [`Config::translate_uid`]
    /// and [`Config::translate_gid`]. EPERM if one is forbidden (then no
    /// host ID may act for it), with creds on or off.
    fn caller(&self, ctx: &Ctx) -> Result<Cred, Errno> {
        let groups = if self.cfg.creds {
            self.cfg.groups
        } else {
            Groups::None
        };
        let mut c = Cred::of(ctx, groups);
        c.uid = self.cfg.translate_uid.to_host(c.uid)?;
        c.gid = self.cfg.translate_gid.to_host(c.gid)?;
        if !self.cfg.translate_gid.is_identity() {
            c.groups = (c.groups.iter())
                .map(|&g| self.cfg.translate_gid.to_host(g))
                .collect::<Result<_, _>>()?;
        }
        Ok(c)
    }

    /// Whether a client could act as host gid `gid` itself: some client
    /// gid translates to it (it is not forbidden, and not a host gid no
    /// client gid reaches).
    fn claimable_gid(&self, gid: u32) -> bool {
        let t = &self.cfg.translate_gid;
        t.to_host(t.to_guest(gid)).ok() == Some(gid)
    }

    /// The host uid an inode `cred` makes is owned by: its own when
    /// operations run as the caller, else the daemon's.
    fn owner_of(&self, cred: &Cred) -> u32 {
        if self.cfg.creds {
            cred.uid
        } else {
            sys::geteuid()
        }
    }

    /// Whether `ctx` acts on the host as `cred` does, groups aside: the
    /// same translated uid and gid, so the same capabilities too (EPERM
    /// if forbidden).
    fn acts_as(&self, ctx: &Ctx, cred: &Cred) -> Result<bool, Errno> {
        Ok(self.cfg.translate_uid.to_host(ctx.uid)? == cred.uid
            && self.cfg.translate_gid.to_host(ctx.gid)? == cred.gid)
    }

    /// The attributes the client gets for `st`: owner and group translated
    /// to the client's IDs.
    fn attr(&self, st: &libc::statx) -> Attr {
        let mut a = attr_of(st);
        a.uid = self.cfg.translate_uid.to_guest(a.uid);
        a.gid = self.cfg.translate_gid.to_guest(a.gid);
        a
    }

    /// The caller's credentials in force until the guard drops.
    fn creds(&self, ctx: &Ctx) -> Result<CredGuard, Errno> {
        self.creds_as(&self.caller(ctx)?, Caps::Caller)
    }

    /// [`PassthroughFs::creds`] for an operation that may allocate space
    /// (new inodes, directory entries, xattr values): never with
    /// CAP_SYS_RESOURCE, root callers included, so quotas and reserved
    /// blocks bind them as they bind data writes.
    fn creds_allocating(&self, ctx: &Ctx) -> Result<CredGuard, Errno> {
        self.creds_as(&self.caller(ctx)?, Caps::ALLOCATE)
    }

    /// `cred` in force, with the capabilities `caps` leaves, until the
    /// guard drops.
    fn creds_as(&self, cred: &Cred, caps: Caps) -> Result<CredGuard, Errno> {
        if self.cfg.creds {
            CredGuard::enter(cred, caps)
        } else {
            Ok(CredGuard::none())
        }
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

    fn init_flags(&self, capable: u64) -> Result<u64, Errno> {
        let mut f = init::DONT_MASK
            | init::ATOMIC_O_TRUNC
            | init::PARALLEL_DIROPS
            // Shared mmap of files opened with FOPEN_DIRECT_IO (cache
            // never/metadata); without it the client refuses with ENODEV.
            | init::DIRECT_IO_ALLOW_MMAP;
        if self.cfg.posix_locks {
            f |= init::POSIX_LOCKS;
        }
        if self.cfg.flock_locks {
            f |= init::FLOCK_LOCKS;
        }
        if self.cfg.readdirplus {
            f |= init::DO_READDIRPLUS | init::READDIRPLUS_AUTO;
        }
        if self.offers_passthrough() {
            f |= init::PASSTHROUGH;
        } else if self.writeback() {
            f |= init::WRITEBACK_CACHE;
        }
        if self.cfg.creds && self.cfg.killpriv_v2 {
            // Writes and truncates run as the caller, so the host kernel
            // clears setuid/setgid bits exactly as it would locally.
            f |= init::HANDLE_KILLPRIV_V2;
        }
        if self.cfg.announce_submounts {
            f |= init::SUBMOUNTS;
        }
        if self.cfg.creds && self.cfg.groups == Groups::None {
            // A guest's kernel tells which of its caller's groups a new
            // inode's parent has (FUSE_EXT_GROUPS), the one group the
            // host needs to give it the mode the guest already allowed.
            f |= init::CREATE_SUPP_GROUP;
        }
        let acl = init::POSIX_ACL | init::DONT_MASK | init::SETXATTR_EXT;
        if self.cfg.posix_acl && (capable & acl == acl || !self.cfg.posix_acl_optional) {
            if capable & acl != acl {
                // --posix-acl promises ACLs the client enforces; a
                // client that cannot gets no connection.
                return Err(Errno(libc::EPROTO));
            }
            f |= acl;
        }
        if self.cfg.security_label && self.cfg.xattr {
            if capable & init::SECURITY_CTX != 0 {
                f |= init::SECURITY_CTX;
            } else if !self.cfg.security_label_optional {
                // --security-label=always: a client that would create
                // inodes without telling their labels gets no connection
                // (virtiofsd answers EPROTO too).
                return Err(Errno(libc::EPROTO));
            }
        }
        self.posix_acl.store(
            f & init::POSIX_ACL != 0,
            std::sync::atomic::Ordering::Relaxed,
        );
        self.submounts.store(
            f & capable & init::SUBMOUNTS != 0,
            std::sync::atomic::Ordering::Relaxed,
        );
        self.backing
            .set_active(f & capable & init::PASSTHROUGH != 0);
        Ok(f & capable)
    }

    /// Kernel passthrough is configured and has its connection.
    fn offers_passthrough(&self) -> bool {
        self.cfg.kernel_passthrough && self.backing.attached()
    }

    /// The writeback cache is asked for (never with kernel passthrough,
    /// which the kernel turns off when both are negotiated).
    fn writeback(&self) -> bool {
        self.cfg.writeback && self.cfg.cache != CachePolicy::Never && !self.offers_passthrough()
    }

    /// FUSE_POSIX_ACL is in force.
    fn posix_acl(&self) -> bool {
        self.posix_acl.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn open_flags(&self, direct: bool, dir: bool) -> u32 {
        let mut f = 0;
        match self.cfg.cache {
            CachePolicy::Never | CachePolicy::Metadata if !dir => f |= fopen::DIRECT_IO,
            CachePolicy::Always if dir => f |= fopen::CACHE_DIR,
            CachePolicy::Always => f |= fopen::KEEP_CACHE,
            _ => {}
        }
        if !dir && self.cfg.parallel_direct_writes && (direct || f & fopen::DIRECT_IO != 0) {
            f |= fopen::PARALLEL_DIRECT_WRITES;
        }
        f
    }
}
