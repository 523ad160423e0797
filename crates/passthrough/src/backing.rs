//! Kernel FUSE passthrough for host mounts (`Config::kernel_passthrough`):
//! the kernel reads, writes and maps an open file straight on the host
//! file, and those calls never reach the daemon.
//!
//! The daemon still serves OPEN and CREATE: it opens the host file as the
//! caller (that open is the permission check, and does O_TRUNC), then
//! registers the file with FUSE_DEV_IOC_BACKING_OPEN and answers with
//! FOPEN_PASSTHROUGH and the backing id. The kernel opens its own file on
//! the same path with the client file's flags, under the credentials of
//! the thread that made the ioctl, and does all passthrough I/O with them.
//!
//! # Credentials of passthrough I/O
//!
//! The kernel stores the ioctl caller's credentials with the backing file
//! and does every passthrough call of every open of the inode with them,
//! whoever the caller is. The daemon's own (fsuid 0, every capability)
//! would change what a write does, so the ioctl runs as a delegate
//! (`creds::as_io_delegate`): fsuid and fsgid 65534, no groups, and only
//! CAP_SYS_ADMIN (the ioctl), CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH (the
//! kernel's own open of the backing file, which the daemon's open as the
//! caller already allowed) and CAP_FOWNER (that open may carry O_NOATIME).
//! Without CAP_FSETID a write clears setuid and setgid: with
//! HANDLE_KILLPRIV_V2 the FUSE client leaves that to the host file's write
//! path, which skips it for a writer with CAP_FSETID, so a user could
//! otherwise write into another user's setuid program and keep it setuid.
//! Without CAP_SYS_RESOURCE quota limits bind, and without fsuid 0 so do
//! ext4's and f2fs's root-reserved blocks. One credential serves every
//! writer: a root writer's write clears setuid too, where a local one
//! keeps it (the safe side; the daemon cannot tell writers apart).
//!
//! Only files on local leaf filesystems become backing files (a network
//! filesystem decides by the fsuid, and the delegate's is nobody's), and
//! never append-only or immutable ones: the kernel takes the flags of an
//! asynchronous passthrough write from the client's file, whose O_APPEND
//! the caller may clear with fcntl, so the host's append-only rule would
//! not hold. Those files are served by the daemon as the caller.
//!
//! # One backing file per inode
//!
//! The kernel wants every open of an inode that has a passthrough open to
//! be a passthrough open on the same backing file, and refuses a
//! passthrough open while cached opens of the inode exist. Each inode
//! therefore has one [`BackingState`] (guarded by `InodeData::backing`, a
//! leaf lock: nothing else is taken while it is held):
//!
//! ```text
//! Idle --open, BACKING_OPEN ok--> Passthrough { id, users: 1 }
//! Idle --open, not backable or BACKING_OPEN fails--> Cached { users: 1 }
//! Passthrough { users: n } --open--> Passthrough { users: n + 1 }
//! Cached { users: n } --open--> Cached { users: n + 1 }
//! Passthrough { users: 1 } --RELEASE, BACKING_CLOSE--> Idle
//! Cached { users: 1 } --RELEASE--> Idle
//! ```
//!
//! The id is closed at the last RELEASE, never earlier: the kernel looks
//! the id up when the opener's thread handles the reply, after the reply
//! was written, so an id closed right after the reply could be gone.

use super::creds::as_io_delegate;
use fuse_core::locks::lock;
use fuse_core::Errno;
use host_io::sys;
use host_io::BackingDevice;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Local filesystems whose files may be backing files (`f_type`): ext2/3/4,
/// xfs, btrfs, tmpfs, f2fs, bcachefs. A network filesystem would see every
/// passthrough call from the delegate's fsuid (an NFS server with
/// root_squash, or a FUSE server below, decides by it), so those files are
/// served by the daemon as the caller.
const LOCAL_FS: [i64; 6] = [
    0xEF53,
    0x5846_5342,
    0x9123_683E,
    0x0102_1994,
    0xF2F5_2010,
    0xCA45_1A4E,
];

/// Whether the host file open on `fd` may become a backing file: on a
/// local filesystem, and neither append-only nor immutable (the kernel
/// takes the flags of asynchronous passthrough writes from the client's
/// file, whose O_APPEND a caller may clear with fcntl: the host's
/// append-only rule would not hold).
fn may_back(fd: i32) -> bool {
    let local = sys::fs_magic(fd).is_ok_and(|m| LOCAL_FS.contains(&m));
    let attrs = sys::statx(fd, c"", libc::AT_EMPTY_PATH, 0).map(|st| st.stx_attributes);
    let pinned = (libc::STATX_ATTR_APPEND | libc::STATX_ATTR_IMMUTABLE) as u64;
    local && attrs.is_ok_and(|a| a & pinned == 0)
}

/// One inode's backing file (see the module docs for the transitions).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum BackingState {
    /// No open handle.
    #[default]
    Idle,
    /// Open handles do passthrough on backing id `id`.
    Passthrough {
        /// The backing id.
        id: u32,
        /// Open handles using it.
        users: usize,
    },
    /// Open handles are served by the daemon (BACKING_OPEN failed for the
    /// first of them).
    Cached {
        /// Open handles.
        users: usize,
    },
}

/// What an open got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// FOPEN_PASSTHROUGH with this backing id.
    Passthrough(u32),
    /// Served by the daemon.
    Cached,
}

/// The connection's side of kernel passthrough.
#[derive(Debug, Default)]
pub struct Backing {
    /// The /dev/fuse connection the ioctls go to (set once, before INIT).
    dev: OnceLock<Box<dyn BackingDevice>>,
    /// FUSE_PASSTHROUGH was negotiated and not found unusable since.
    active: AtomicBool,
    /// Backing ids open now.
    open_ids: AtomicUsize,
}

impl Backing {
    /// Sets the connection; false if one was set already.
    pub fn attach(&self, dev: Box<dyn BackingDevice>) -> bool {
        self.dev.set(dev).is_ok()
    }

    /// Whether a connection is attached (so FUSE_PASSTHROUGH may be
    /// offered).
    pub fn attached(&self) -> bool {
        self.dev.get().is_some()
    }

    /// Records INIT's outcome.
    pub fn set_active(&self, on: bool) {
        self.active.store(on, Ordering::Relaxed);
    }

    /// Whether opens get passthrough now.
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    #[cfg(feature = "test-utils")]
    /// Backing ids open now.
    pub fn open_ids(&self) -> usize {
        self.open_ids.load(Ordering::Relaxed)
    }

    /// An open of the inode whose state is `state`, on the host file `fd`
    /// just opened for the caller.
    pub fn acquire(&self, state: &Mutex<BackingState>, fd: i32) -> Grant {
        let mut st = lock(state);
        match *st {
            BackingState::Passthrough { id, users } => {
                *st = BackingState::Passthrough {
                    id,
                    users: users + 1,
                };
                return Grant::Passthrough(id);
            }
            BackingState::Cached { users } => {
                *st = BackingState::Cached { users: users + 1 };
                return Grant::Cached;
            }
            BackingState::Idle => {}
        }
        let opened = match self.dev.get() {
            Some(dev) if self.active() && may_back(fd) => {
                Some(as_io_delegate(|| dev.backing_open(fd)))
            }
            _ => None,
        };
        let refused = match opened {
            Some(Ok(Ok(id))) => {
                self.open_ids.fetch_add(1, Ordering::Relaxed);
                *st = BackingState::Passthrough { id, users: 1 };
                return Grant::Passthrough(id);
            }
            // Not CAP_SYS_ADMIN (or the kernel says no).
            Some(Ok(Err(e))) if e == Errno::EPERM => {
                Some("refused (EPERM: needs CAP_SYS_ADMIN)".to_string())
            }
            // The delegate's credentials could not be set: never hand the
            // kernel the daemon's own.
            Some(Err(e)) => Some(format!("setting its credentials failed: {e}")),
            _ => None,
        };
        if let Some(why) = refused {
            if self.active.swap(false, Ordering::Relaxed) {
                // Every open from now on is served by the daemon.
                log::warn!("kernel passthrough off: {why}; serving file data in the daemon");
            }
        }
        *st = BackingState::Cached { users: 1 };
        Grant::Cached
    }

    /// The RELEASE of an open that got `grant` from [`Backing::acquire`].
    pub fn release(&self, state: &Mutex<BackingState>) {
        let mut st = lock(state);
        *st = match *st {
            BackingState::Passthrough { id, users: 1 } => {
                if let Some(dev) = self.dev.get() {
                    // ENOENT after an abort or unmount: the id is gone
                    // with the connection anyway.
                    let _ = dev.backing_close(id);
                }
                self.open_ids.fetch_sub(1, Ordering::Relaxed);
                BackingState::Idle
            }
            BackingState::Passthrough { id, users } => BackingState::Passthrough {
                id,
                users: users - 1,
            },
            BackingState::Cached { users: 0 | 1 } | BackingState::Idle => BackingState::Idle,
            BackingState::Cached { users } => BackingState::Cached { users: users - 1 },
        };
    }
}
