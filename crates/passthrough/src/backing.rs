//! Kernel FUSE passthrough for host mounts (`Config::kernel_passthrough`):
//! the kernel reads, writes and maps an open file straight on the host
//! file, and those calls never reach the daemon.
//!
//! The daemon still serves OPEN and CREATE: it opens the host file as the
//! caller (the permission check, O_TRUNC), registers it with
//! FUSE_DEV_IOC_BACKING_OPEN and answers FOPEN_PASSTHROUGH with the id.
//! The kernel does all passthrough I/O of the inode with the credentials
//! of the ioctl's caller, so the ioctl runs as a delegate
//! ([`as_io_delegate`]); only files `may_back` accepts become backing
//! files, the others are served by the daemon as the caller. Each inode
//! has one [`BackingState`]: all its opens are passthrough opens on one
//! backing id, or none is, and the id is closed at the last RELEASE. See
//! docs/DESIGN.md, "Host mounts".

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
pub(crate) const LOCAL_FS: [i64; 6] = [
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

/// One inode's backing file, guarded by `InodeData::backing` (a leaf
/// lock: nothing else is taken while it is held). The kernel wants every
/// open of an inode with a passthrough open to be a passthrough open on
/// the same backing file, and refuses one while cached opens exist:
///
/// ```text
/// Idle --open, BACKING_OPEN ok--> Passthrough { id, users: 1 }
/// Idle --open, not backable or BACKING_OPEN fails--> Cached { users: 1 }
/// Passthrough { users: n } --open--> Passthrough { users: n + 1 }
/// Cached { users: n } --open--> Cached { users: n + 1 }
/// Passthrough { users: 1 } --RELEASE, BACKING_CLOSE--> Idle
/// Cached { users: 1 } --RELEASE--> Idle
/// ```
///
/// The id is closed at the last RELEASE, never earlier: the kernel looks
/// it up when the opener's thread handles the reply, after the reply was
/// written, so an id closed right after the reply could be gone.
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
