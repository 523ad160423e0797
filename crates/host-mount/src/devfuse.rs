//! The host kernel's FUSE device: `/dev/fuse`, mounted with mount(2), read
//! and written by the same device workers that serve the in-process engine
//! (`fuse_core::server::DeviceEnd`).

use fuse_core::abi::OutHeader;
use fuse_core::server::DeviceEnd;
use fuse_core::Errno;
use host_io::sys;
use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

mod mounting;
mod serve;
pub use serve::{serve_dev, DevStats, DevWorker};

/// `_IOR(229, 0, uint32_t)`: makes an fd of /dev/fuse another end of the
/// connection of the fd it is given.
const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;

/// Errors mounting and unmounting.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// /dev/fuse could not be opened.
    #[error("opening /dev/fuse")]
    Open(#[source] std::io::Error),
    /// The mount point is unusable.
    #[error("mount point {0}")]
    MountPoint(PathBuf, #[source] std::io::Error),
    /// mount(2) failed.
    #[error("mounting on {0}")]
    Mount(PathBuf, #[source] std::io::Error),
    /// umount2(2) failed.
    #[error("unmounting {0}")]
    Unmount(PathBuf, #[source] std::io::Error),
}

/// An open `/dev/fuse` connection. Cheap to clone (threads share the fd).
#[derive(Debug, Clone)]
pub struct DevFuse {
    fd: Arc<OwnedFd>,
    /// The device (major, minor) of the mount's superblock, which names
    /// this connection and no other for as long as the superblock lives
    /// (once it is gone the number may go to the next mount made).
    dev: Option<(u32, u32)>,
    /// The mount's unique id (STATX_MNT_ID_UNIQUE, Linux 6.8 on: never
    /// reused), where the kernel gives it.
    mnt: Option<u64>,
    /// Where the mount was made.
    at: Option<Arc<MountPlace>>,
    conn: Option<u32>,
    /// Replies written so far (shared by the clones): the first is INIT's,
    /// and once its write has returned the kernel has processed it.
    replies: Arc<std::sync::atomic::AtomicU64>,
}

/// Where a connection's mount was made.
#[derive(Debug)]
struct MountPlace {
    /// The kernel's name of the mount point as resolved when mounting (no
    /// symlink in it).
    path: PathBuf,
    /// Its parent directory's identity then (None for `/`).
    parent: Option<mounting::DirId>,
}

/// Options of a host mount.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// `fuse.<subtype>` in /proc/mounts.
    pub subtype: String,
    /// The `source` column.
    pub source: String,
    /// Let users other than the mounter in (`allow_other`).
    pub allow_other: bool,
    /// Let the kernel check permissions from the attributes
    /// (`default_permissions`); off when the server checks them itself.
    pub default_permissions: bool,
    /// Read-only mount.
    pub readonly: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            subtype: "fusebox".into(),
            source: "fusebox".into(),
            allow_other: true,
            default_permissions: false,
            readonly: false,
        }
    }
}

fn cpath(p: &Path) -> Result<CString, std::io::Error> {
    CString::new(p.as_os_str().as_encoded_bytes()).map_err(std::io::Error::other)
}

impl DevFuse {
    /// Opens /dev/fuse and mounts it on `mountpoint` (needs CAP_SYS_ADMIN).
    /// The mount point is resolved once (see `mounting.rs`): the mount goes
    /// on that directory, and the kernel's name for it is where
    /// [`DevFuse::detach_own_mount`] looks for the mount.
    pub fn mount(mountpoint: &Path, opts: &MountOptions) -> Result<DevFuse, MountError> {
        Self::mount_with(mountpoint, opts, true)
    }

    /// [`DevFuse::mount`] with mount(2), as on kernels that mount FUSE no
    /// other way: for tests of that path.
    #[cfg(feature = "test-utils")]
    pub fn mount_with_mount2(
        mountpoint: &Path,
        opts: &MountOptions,
    ) -> Result<DevFuse, MountError> {
        Self::mount_with(mountpoint, opts, false)
    }

    fn mount_with(
        mountpoint: &Path,
        opts: &MountOptions,
        new_api: bool,
    ) -> Result<DevFuse, MountError> {
        let at = mounting::Target::resolve(mountpoint)
            .map_err(|e| MountError::MountPoint(mountpoint.into(), e))?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .map_err(MountError::Open)?;
        let fd: OwnedFd = file.into();
        let err = |e| MountError::Mount(mountpoint.into(), e);
        let made = if new_api {
            mounting::mount_new(&at, &fd, opts).map_err(err)?
        } else {
            mounting::NewMount::Unavailable(std::io::Error::from_raw_os_error(libc::ENOSYS))
        };
        // Taken from the mount itself, or (mount(2)) right after mounting:
        // it later tells our mount from whatever the path leads to then,
        // and names the connection in fusectl once the mount is detached.
        let id = match made {
            mounting::NewMount::Done(id) => Some(id),
            mounting::NewMount::Unavailable(why) => {
                if new_api {
                    log::debug!("mounting with mount(2): the mount API said {why}");
                }
                mounting::mount_legacy(&at, &fd, opts).map_err(err)?
            }
        };
        let dev = id.map(|i| i.dev);
        // The mount point's parent, as it is now: where the detach looks
        // for the mount must still be in that very directory.
        let parent = mounting::parent_of(&at.path)
            .map_err(|e| MountError::MountPoint(mountpoint.into(), e))?
            .map(|(_, id)| id);
        Ok(DevFuse {
            fd: Arc::new(fd),
            dev,
            mnt: id.and_then(|i| i.mnt),
            at: Some(Arc::new(MountPlace {
                path: at.path,
                parent,
            })),
            conn: dev.and_then(|(major, minor)| kernel_dev(major, minor)),
            replies: Arc::default(),
        })
    }

    /// Another fd of the same connection (FUSE_DEV_IOC_CLONE), opened
    /// non-blocking: a read on it gives EAGAIN when no request waits. The
    /// kernel keeps the requests read from an fd in that fd's own
    /// processing list, so their replies must be written to it (as
    /// [`DeviceEnd::write_reply`] of the clone does); what waits to be
    /// read is shared by all of the connection's fds.
    pub fn clone_nonblocking(&self) -> Result<DevFuse, Errno> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/fuse")
            .map_err(|e| sys::errno_of(&e))?;
        let fd: OwnedFd = file.into();
        let old = u32::try_from(self.fd.as_raw_fd()).map_err(|_| Errno::EBADF)?;
        // SAFETY: FUSE_DEV_IOC_CLONE reads one u32 (the fd to clone) from
        // the pointer, which points at a live local.
        let r = unsafe { libc::ioctl(fd.as_raw_fd(), FUSE_DEV_IOC_CLONE, &old) };
        if r != 0 {
            return Err(sys::errno());
        }
        Ok(DevFuse {
            fd: Arc::new(fd),
            dev: self.dev,
            mnt: self.mnt,
            at: self.at.clone(),
            conn: self.conn,
            replies: self.replies.clone(),
        })
    }

    /// The connection number (`/sys/fs/fuse/connections/N`), if known.
    pub fn connection(&self) -> Option<u32> {
        self.conn
    }

    /// Lazily unmounts (MNT_DETACH) this connection's mount, if the place
    /// it was made still holds it: the mount point's name as the kernel
    /// gave it when mounting, resolved again following no symlink, must
    /// lead to the same unique mount id where the kernel gives one, else
    /// to the same superblock device. True if it did; false if it leads
    /// elsewhere (our mount was detached or unmounted, another one covers
    /// or replaced it, even one given our old device number, or a
    /// directory on the way is now a symlink) or this connection's mount
    /// is unknown; then nothing is unmounted. The check and the unmount
    /// act on one held reference to the mount, so a mount made on the
    /// path in between is never the one unmounted.
    pub fn detach_own_mount(&self) -> Result<bool, MountError> {
        let (Some(ours), Some(at)) = (self.dev, &self.at) else {
            return Ok(false);
        };
        let err = |e| MountError::Unmount(at.path.clone(), e);
        let held = match mounting::open_mount_point(&at.path, at.parent) {
            Ok(f) => f,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::ESTALE)
                ) =>
            {
                return Ok(false)
            }
            Err(e) => return Err(err(e)),
        };
        // The device first, asking for nothing more: FUSE answers any
        // other request of a mount whose server does not let us in
        // (another user's, without allow_other) with EACCES.
        if mounting::identity_of(&held, 0).map_err(err)?.dev != ours {
            return Ok(false);
        }
        // The device number alone could be a mount made since ours went
        // (it is given again once our superblock is gone); the unique
        // mount id never is (Linux 6.8 on; before, the device decides).
        if self.mnt.is_some() {
            match mounting::identity_of(&held, mounting::STATX_MNT_ID_UNIQUE) {
                Ok(now) if now.mnt == self.mnt => {}
                Ok(_) => return Ok(false),
                // Another user's FUSE mount that got our old device
                // number (ours lets us in).
                Err(e) if e.raw_os_error() == Some(libc::EACCES) => return Ok(false),
                Err(e) => return Err(err(e)),
            }
        }
        // The magic link resolves to the very mount `held` holds. Its root
        // is ours: only a mount's root is unmountable, so EINVAL means the
        // path leads inside our filesystem but not to a mount of it.
        let link = PathBuf::from(format!("/proc/self/fd/{}", held.as_raw_fd()));
        let r = match umount2(&link, libc::MNT_DETACH) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
            Err(e) => Err(err(e)),
        };
        // Closing `held` drops our own reference: the detached mount then
        // goes when its last other user does.
        drop(held);
        r
    }

    /// Where the mount was made (the kernel's name of the mount point when
    /// mounting), if this connection was mounted here.
    pub fn mount_point(&self) -> Option<&Path> {
        self.at.as_deref().map(|at| at.path.as_path())
    }

    /// Forgets the mount's unique id, so [`DevFuse::detach_own_mount`]
    /// tells the mount by its device alone, as on kernels before 6.8: for
    /// tests of that path.
    #[cfg(feature = "test-utils")]
    pub fn forget_unique_mount_id(&mut self) {
        self.mnt = None;
    }

    /// Waits up to `timeout` for the connection to end (unmounted,
    /// aborted, timed out by the kernel): true once it has. Needs no worker
    /// (all may be blocked in calls): the device polls as EPOLLERR from the
    /// moment the kernel disconnects it.
    pub fn wait_disconnected(&self, timeout: Duration) -> bool {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            // POLLERR is reported whatever is asked for; asking for nothing
            // keeps pending requests (POLLIN) from waking us.
            events: 0,
            revents: 0,
        };
        let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd, which outlives the call.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        n > 0 && p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0
    }

    /// Whether the connection has ended (not waiting).
    pub fn is_disconnected(&self) -> bool {
        self.wait_disconnected(Duration::ZERO)
    }

    /// Aborts this connection (as writing to
    /// /sys/fs/fuse/connections/N/abort does): every request ends with an
    /// error and the server's reads see ENODEV.
    /// Nothing is done once the connection has ended: its fusectl number
    /// may be another connection's by then.
    pub fn abort(&self) -> Result<(), std::io::Error> {
        if self.is_disconnected() {
            return Ok(());
        }
        let id = self
            .conn
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOENT))?;
        let path = format!("/sys/fs/fuse/connections/{id}/abort");
        if !Path::new(&path).exists() {
            mount_fusectl();
        }
        std::fs::write(path, "1")
    }

    /// Wraps an already mounted `/dev/fuse` fd (for example one passed by
    /// fusermount3).
    pub fn from_fd(fd: OwnedFd) -> DevFuse {
        DevFuse {
            fd: Arc::new(fd),
            dev: None,
            mnt: None,
            at: None,
            conn: None,
            replies: Arc::default(),
        }
    }

    /// How many replies were written to the device so far. The kernel
    /// processes a reply inside the write that carries it, so once INIT's
    /// (the connection's first) is counted, the connection is initialized
    /// as far as the kernel is concerned: FUSE-over-io_uring REGISTERs made
    /// after that are not refused with EAGAIN.
    pub fn replies_written(&self) -> u64 {
        self.replies.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Writes the notification `code` (a `fuse_notify_code`) with its
    /// `fuse_notify_*_out` body: an out header of unique 0 whose error
    /// field carries the code. Not counted as a reply.
    pub fn notify(&self, code: i32, body: &[u8]) -> Result<(), Errno> {
        self.write_msg(0, code, body)
    }

    /// Writes one message: an out header (`unique`, `error`) and `payload`.
    fn write_msg(&self, unique: u64, error: i32, payload: &[u8]) -> Result<(), Errno> {
        let hdr = OutHeader {
            len: (std::mem::size_of::<OutHeader>() + payload.len()) as u32,
            error,
            unique,
        };
        let h = zerocopy::IntoBytes::as_bytes(&hdr);
        let iov = [
            libc::iovec {
                iov_base: h.as_ptr().cast_mut().cast(),
                iov_len: h.len(),
            },
            libc::iovec {
                iov_base: payload.as_ptr().cast_mut().cast(),
                iov_len: payload.len(),
            },
        ];
        // SAFETY: both iovecs point at live buffers of the stated lengths,
        // which the kernel only reads.
        let n = unsafe { libc::writev(self.fd.as_raw_fd(), iov.as_ptr(), 2) };
        if n < 0 {
            return Err(sys::errno());
        }
        Ok(())
    }

    /// The fd.
    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// FUSE_DEV_IOC_BACKING_OPEN: makes the regular file open on `fd` a
    /// backing file of this connection and returns its id (> 0), for
    /// `fuse_open_out.backing_id` with FOPEN_PASSTHROUGH. The kernel keeps
    /// the calling thread's credentials and does every passthrough read,
    /// write and mmap on that file with them. Needs CAP_SYS_ADMIN and a
    /// connection that negotiated FUSE_PASSTHROUGH (EPERM otherwise);
    /// ELOOP when the file's filesystem stacks too deep.
    pub fn backing_open(&self, fd: i32) -> Result<u32, Errno> {
        let map = fuse_core::abi::BackingMap {
            fd,
            flags: 0,
            padding: 0,
        };
        // SAFETY: the ioctl reads one fuse_backing_map, which `map` is and
        // which outlives the call.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), BACKING_OPEN, &raw const map) };
        if r < 0 {
            return Err(sys::errno());
        }
        u32::try_from(r).map_err(|_negative| Errno::EIO)
    }

    /// FUSE_DEV_IOC_BACKING_CLOSE: forgets backing id `id`. Files the
    /// kernel already opened on it keep working until they close.
    pub fn backing_close(&self, id: u32) -> Result<(), Errno> {
        // SAFETY: the ioctl reads one u32, which `id` is and which outlives
        // the call.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), BACKING_CLOSE, &raw const id) };
        if r < 0 {
            return Err(sys::errno());
        }
        Ok(())
    }
}

/// `_IOW(229, 1, struct fuse_backing_map)`.
const BACKING_OPEN: libc::c_ulong = 0x4010_E501;
/// `_IOW(229, 2, uint32_t)`.
const BACKING_CLOSE: libc::c_ulong = 0x4004_E502;

/// The kernel's own encoding of a device number (MKDEV: 12 bits of major,
/// 20 of minor), which fusectl names connections by.
fn kernel_dev(major: u32, minor: u32) -> Option<u32> {
    if major >= 1 << 12 || minor >= 1 << 20 {
        return None;
    }
    Some((major << 20) | minor)
}

/// Mounts the fusectl filesystem on /sys/fs/fuse/connections if it is not
/// there (it usually is on systemd machines; not in minimal ones).
fn mount_fusectl() {
    // SAFETY: NUL-terminated literals; a failure (already mounted, no
    // permission) is harmless and reported by the write that follows.
    unsafe {
        libc::mount(
            c"fusectl".as_ptr(),
            c"/sys/fs/fuse/connections".as_ptr(),
            c"fusectl".as_ptr(),
            0,
            std::ptr::null(),
        );
    }
}

/// Unmounts `mountpoint` (lazily when `detach`: it goes as soon as it is
/// no longer busy). The connection's readers then see ENODEV.
pub fn unmount(mountpoint: &Path, detach: bool) -> Result<(), MountError> {
    let flags = if detach { libc::MNT_DETACH } else { 0 };
    umount2(mountpoint, flags).map_err(|e| MountError::Unmount(mountpoint.into(), e))
}

fn umount2(target: &Path, flags: libc::c_int) -> Result<(), std::io::Error> {
    let target = cpath(target)?;
    // SAFETY: a NUL-terminated path that outlives the call.
    if unsafe { libc::umount2(target.as_ptr(), flags) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl DeviceEnd for DevFuse {
    fn read_msg(&self, buf: &mut [u8]) -> Result<usize, Errno> {
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        usize::try_from(n).map_err(|_| sys::errno())
    }

    fn write_reply(&self, unique: u64, error: i32, payload: &[u8]) -> Result<(), Errno> {
        let payload = if error == 0 { payload } else { &[][..] };
        self.write_msg(unique, error, payload)?;
        self.replies
            .fetch_add(1, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    fn min_read_buffer(&self) -> usize {
        fuse_core::abi::MIN_READ_BUFFER
    }
}

impl host_io::BackingDevice for DevFuse {
    fn backing_open(&self, fd: i32) -> Result<u32, Errno> {
        DevFuse::backing_open(self, fd)
    }

    fn backing_close(&self, id: u32) -> Result<(), Errno> {
        DevFuse::backing_close(self, id)
    }
}
