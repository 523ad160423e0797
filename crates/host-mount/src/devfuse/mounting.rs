//! Making a connection's mount, and finding that very mount again to
//! detach it.
//!
//! The mount point is resolved once, when mounting (symlinks followed, as
//! the operator named it): the mount goes on that very directory, through
//! an fd of it, and the kernel's name for it (no symlink in it) is where
//! the daemon later looks for its mount, resolving that name with no
//! symlink followed (`openat2` RESOLVE_NO_SYMLINKS, or O_NOFOLLOW a
//! component at a time before Linux 5.6) and its parent directory checked
//! to be the one it was: a host user who controls a directory on the way
//! cannot point it at another mount. The mount's identity (its superblock's
//! device; its unique mount id, Linux 6.8 on) is read from the new mount
//! before it is attached (fsopen/fsmount/move_mount), or, where only
//! mount(2) can mount FUSE, from that name right after mounting.

use super::MountOptions;
use host_io::sys;
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// What names a mount: its superblock's device and, where the kernel
/// gives it, its unique mount id.
#[derive(Debug, Clone, Copy)]
pub(super) struct MountIdentity {
    pub(super) dev: (u32, u32),
    pub(super) mnt: Option<u64>,
}

/// `STATX_MNT_ID_UNIQUE` (Linux 6.8): `stx_mnt_id` is the mount's 64-bit
/// id, never reused.
pub(super) const STATX_MNT_ID_UNIQUE: u32 = 0x4000;

/// The device (major, minor) of the filesystem `fd` is on and, with
/// `mask` STATX_MNT_ID_UNIQUE, the unique id of its mount (where the
/// kernel gives it), from the kernel's cached attributes
/// (AT_STATX_DONT_SYNC): a FUSE mount is asked nothing, so this never
/// waits for a server, ours included.
pub(super) fn identity_of(fd: &impl AsRawFd, mask: u32) -> Result<MountIdentity, std::io::Error> {
    let stx = sys::statx(
        fd.as_raw_fd(),
        c"",
        libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC,
        mask,
    )
    .map_err(io)?;
    Ok(MountIdentity {
        dev: (stx.stx_dev_major, stx.stx_dev_minor),
        mnt: (mask & stx.stx_mask & STATX_MNT_ID_UNIQUE != 0).then_some(stx.stx_mnt_id),
    })
}

fn io(e: fuse_core::Errno) -> std::io::Error {
    std::io::Error::from_raw_os_error(e.0)
}

fn cstr(s: &str) -> Result<CString, std::io::Error> {
    CString::new(s).map_err(std::io::Error::other)
}

/// The place a mount goes: the mount point as resolved once.
#[derive(Debug)]
pub(super) struct Target {
    /// An O_PATH fd of it.
    fd: OwnedFd,
    /// The kernel's name for it, from the process's root.
    pub(super) path: PathBuf,
    /// Its file type (S_IFDIR, or S_IFREG: FUSE mounts on files too).
    pub(super) ftype: u32,
}

impl Target {
    /// Resolves `mountpoint` (following symlinks, as mount(2) would).
    pub(super) fn resolve(mountpoint: &Path) -> Result<Target, std::io::Error> {
        let c = CString::new(mountpoint.as_os_str().as_encoded_bytes())
            .map_err(std::io::Error::other)?;
        let fd = sys::openat(libc::AT_FDCWD, &c, libc::O_PATH, 0).map_err(io)?;
        let st =
            sys::statx(fd.as_raw_fd(), c"", libc::AT_EMPTY_PATH, libc::STATX_TYPE).map_err(io)?;
        let name = cstr(&format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        let path = sys::readlinkat(libc::AT_FDCWD, &name).map_err(io)?;
        if !path.starts_with(b"/") {
            // Not reachable from our root (another namespace's, or gone).
            return Err(std::io::Error::from_raw_os_error(libc::ENOENT));
        }
        Ok(Target {
            fd,
            path: PathBuf::from(<std::ffi::OsString as OsStringExt>::from_vec(path)),
            ftype: u32::from(st.stx_mode) & libc::S_IFMT,
        })
    }
}

/// Opens `path` (absolute) with O_PATH, following no symlink on the way
/// or at its end: ELOOP if any component is one.
pub(super) fn open_no_symlinks(path: &Path) -> Result<OwnedFd, std::io::Error> {
    let root =
        sys::openat(libc::AT_FDCWD, c"/", libc::O_PATH | libc::O_DIRECTORY, 0).map_err(io)?;
    let rel = path
        .strip_prefix("/")
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    if rel.as_os_str().is_empty() {
        return Ok(root);
    }
    let c = CString::new(rel.as_os_str().as_encoded_bytes()).map_err(std::io::Error::other)?;
    match sys::openat2(
        root.as_fd(),
        &c,
        libc::O_PATH | libc::O_CLOEXEC,
        0,
        sys::RESOLVE_NO_SYMLINKS,
    ) {
        Err(e) if e.0 == libc::ENOSYS => walk_no_symlinks(root, rel),
        r => r.map_err(io),
    }
}

/// A directory's identity: its device and inode.
pub(super) type DirId = (u64, u64);

/// The directory the mount point `path` (absolute) is in, opened with no
/// symlink followed, and its identity (device, inode), or None for `/`.
/// The mount point is told by its parent's identity, recorded when
/// mounting: a host user who renames directories on the way (no symlink
/// needed) cannot lead the daemon to another mount at the same name, since
/// a directory with a mount on it cannot be renamed into place itself.
pub(super) fn parent_of(path: &Path) -> Result<Option<(OwnedFd, DirId)>, std::io::Error> {
    let Some(parent) = path.parent() else {
        return Ok(None);
    };
    let fd = open_no_symlinks(parent)?;
    // Cached attributes: a FUSE server is never asked (as `identity_of`).
    let flags = libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC;
    let st = sys::statx(fd.as_raw_fd(), c"", flags, libc::STATX_INO).map_err(io)?;
    let dev = (u64::from(st.stx_dev_major) << 32) | u64::from(st.stx_dev_minor);
    Ok(Some((fd, (dev, st.stx_ino))))
}

/// Opens the mount point `path` (absolute) with O_PATH, following no
/// symlink, through its parent, which must still be the directory whose
/// identity `parent` recorded (ELOOP: a symlink on the way; ESTALE: the
/// parent is another directory now).
pub(super) fn open_mount_point(
    path: &Path,
    parent: Option<DirId>,
) -> Result<OwnedFd, std::io::Error> {
    let (Some((dir, now)), Some(name)) = (parent_of(path)?, path.file_name()) else {
        return open_no_symlinks(path);
    };
    if parent != Some(now) {
        return Err(std::io::Error::from_raw_os_error(libc::ESTALE));
    }
    let c = CString::new(name.as_encoded_bytes()).map_err(std::io::Error::other)?;
    let fd = sys::openat(dir.as_raw_fd(), &c, libc::O_PATH | libc::O_NOFOLLOW, 0).map_err(io)?;
    let flags = libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC;
    let st = sys::statx(fd.as_raw_fd(), c"", flags, libc::STATX_TYPE).map_err(io)?;
    if u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFLNK {
        return Err(std::io::Error::from_raw_os_error(libc::ELOOP));
    }
    Ok(fd)
}

/// [`open_no_symlinks`] before openat2 (Linux 5.6): a component at a time
/// with O_NOFOLLOW, each checked not to be a symlink.
fn walk_no_symlinks(root: OwnedFd, rel: &Path) -> Result<OwnedFd, std::io::Error> {
    let mut cur = root;
    for part in rel.components() {
        let std::path::Component::Normal(name) = part else {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        };
        let c = CString::new(name.as_encoded_bytes()).map_err(std::io::Error::other)?;
        let next =
            sys::openat(cur.as_raw_fd(), &c, libc::O_PATH | libc::O_NOFOLLOW, 0).map_err(io)?;
        let flags = libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC;
        let st = sys::statx(next.as_raw_fd(), c"", flags, libc::STATX_TYPE).map_err(io)?;
        if u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFLNK {
            return Err(std::io::Error::from_raw_os_error(libc::ELOOP));
        }
        cur = next;
    }
    Ok(cur)
}

/// `fsopen` flags, `fsconfig` commands, `fsmount` flags and attributes,
/// `move_mount` flags (linux/mount.h; the libc crate does not have them).
const FSOPEN_CLOEXEC: libc::c_uint = 0x1;
const FSCONFIG_SET_FLAG: libc::c_uint = 0;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 0x1;
const MOUNT_ATTR_RDONLY: libc::c_uint = 0x1;
const MOUNT_ATTR_NOSUID: libc::c_uint = 0x2;
const MOUNT_ATTR_NODEV: libc::c_uint = 0x4;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;

fn fd_of(r: libc::c_long) -> Result<OwnedFd, std::io::Error> {
    let fd = libc::c_int::try_from(r).map_err(std::io::Error::other)?;
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned `fd` as a new descriptor that
    // nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// One fsconfig(2) call: a string (`value` Some) or a flag.
fn fsconfig(
    fs: &OwnedFd,
    cmd: libc::c_uint,
    key: Option<&CStr>,
    value: Option<&CStr>,
) -> Result<(), std::io::Error> {
    let ptr = |c: Option<&CStr>| c.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: a filesystem context fd; the key and value are NUL-terminated
    // strings (or null where the command takes none) that outlive the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            cmd,
            ptr(key),
            ptr(value),
            0 as libc::c_int,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// How [`mount_new`] ended.
pub(super) enum NewMount {
    /// Mounted; the new mount's identity.
    Done(MountIdentity),
    /// The kernel cannot make this mount with the new API (no fsopen, or
    /// FUSE refused an option there): nothing was made, and mount(2) may
    /// be tried instead.
    Unavailable(std::io::Error),
}

/// Mounts the FUSE connection `dev` on `at` with `opts` through a mount fd
/// (fsopen, fsconfig, fsmount), whose identity is read before
/// move_mount attaches it on `at` itself.
pub(super) fn mount_new(
    at: &Target,
    dev: &OwnedFd,
    opts: &MountOptions,
) -> Result<NewMount, std::io::Error> {
    // SAFETY: a NUL-terminated name; the result is a new fd or -1.
    let fs =
        match fd_of(unsafe { libc::syscall(libc::SYS_fsopen, c"fuse".as_ptr(), FSOPEN_CLOEXEC) }) {
            Ok(fs) => fs,
            Err(e) => return Ok(NewMount::Unavailable(e)),
        };
    let mut strings = vec![
        ("source", opts.source.clone()),
        ("subtype", opts.subtype.clone()),
        ("fd", dev.as_raw_fd().to_string()),
        ("rootmode", format!("{:o}", at.ftype)),
        ("user_id", "0".into()),
        ("group_id", "0".into()),
    ];
    if opts.subtype.is_empty() {
        strings.retain(|(k, _)| *k != "subtype");
    }
    for (key, value) in strings {
        let (k, v) = (cstr(key)?, cstr(&value)?);
        if let Err(e) = fsconfig(&fs, FSCONFIG_SET_STRING, Some(&k), Some(&v)) {
            return Ok(NewMount::Unavailable(e));
        }
    }
    let flags = [
        ("allow_other", opts.allow_other),
        ("default_permissions", opts.default_permissions),
        ("ro", opts.readonly),
    ];
    for (key, _) in flags.iter().filter(|(_, on)| *on) {
        if let Err(e) = fsconfig(&fs, FSCONFIG_SET_FLAG, Some(&cstr(key)?), None) {
            return Ok(NewMount::Unavailable(e));
        }
    }
    // Linux 5.2 and 5.3 take any key above and refuse an unknown one only
    // here: then mount(2) may still make the mount (were the connection
    // already bound, that mount fails with EINVAL, making nothing).
    if let Err(e) = fsconfig(&fs, FSCONFIG_CMD_CREATE, None, None) {
        return Ok(NewMount::Unavailable(e));
    }
    let mut attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    if opts.readonly {
        attrs |= MOUNT_ATTR_RDONLY;
    }
    // SAFETY: a filesystem context fd on which CMD_CREATE succeeded; the
    // result is a new fd or -1.
    let mnt =
        fd_of(unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), FSMOUNT_CLOEXEC, attrs) })?;
    let id = identity_of(&mnt, STATX_MNT_ID_UNIQUE)?;
    // SAFETY: two fds (the new mount, the mount point) with empty
    // NUL-terminated paths and the EMPTY_PATH flags for both.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mnt.as_raw_fd(),
            c"".as_ptr(),
            at.fd.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // Closing `mnt` now leaves the attached mount in place.
    Ok(NewMount::Done(id))
}

/// Mounts the FUSE connection `dev` on `at` with mount(2), through the
/// magic link of `at`'s fd (so on that very directory), and reads the
/// identity of the mount then found at `at`'s name without following
/// symlinks (None if that is not a new mount on it).
pub(super) fn mount_legacy(
    at: &Target,
    dev: &OwnedFd,
    opts: &MountOptions,
) -> Result<Option<MountIdentity>, std::io::Error> {
    let mut data = format!(
        "fd={},rootmode={:o},user_id=0,group_id=0",
        dev.as_raw_fd(),
        at.ftype
    );
    if opts.allow_other {
        data.push_str(",allow_other");
    }
    if opts.default_permissions {
        data.push_str(",default_permissions");
    }
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
    if opts.readonly {
        flags |= libc::MS_RDONLY;
    }
    let target = cstr(&format!("/proc/self/fd/{}", at.fd.as_raw_fd()))?;
    let source = cstr(&opts.source)?;
    let fstype = if opts.subtype.is_empty() {
        cstr("fuse")?
    } else {
        cstr(&format!("fuse.{}", opts.subtype))?
    };
    let data = cstr(&data)?;
    let before = identity_of(&at.fd, 0)?;
    // SAFETY: every pointer is a NUL-terminated string that outlives the
    // call.
    let r = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(open_no_symlinks(&at.path)
        .and_then(|f| identity_of(&f, STATX_MNT_ID_UNIQUE))
        .ok()
        .filter(|id| id.dev != before.dev))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ino(fd: &OwnedFd) -> (u32, u32, u64) {
        let st = sys::statx(fd.as_raw_fd(), c"", libc::AT_EMPTY_PATH, libc::STATX_INO).unwrap();
        (st.stx_dev_major, st.stx_dev_minor, st.stx_ino)
    }

    #[test]
    fn a_symlink_anywhere_on_the_path_is_refused_with_openat2_and_without() {
        let base = std::env::temp_dir().join(format!("fusebox-nosymlinks-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("a/b")).unwrap();
        std::os::unix::fs::symlink("a", base.join("l")).unwrap();
        std::os::unix::fs::symlink("b", base.join("a/lb")).unwrap();
        let base = std::fs::canonicalize(&base).unwrap();
        let root = || sys::openat(libc::AT_FDCWD, c"/", libc::O_PATH, 0).unwrap();
        let rel = |p: &Path| p.strip_prefix("/").unwrap().to_path_buf();
        let want = sys::openat(
            libc::AT_FDCWD,
            &CString::new(base.join("a/b").as_os_str().as_encoded_bytes()).unwrap(),
            libc::O_PATH,
            0,
        )
        .unwrap();
        let got = open_no_symlinks(&base.join("a/b")).unwrap();
        assert_eq!(ino(&got), ino(&want));
        let got = walk_no_symlinks(root(), &rel(&base.join("a/b"))).unwrap();
        assert_eq!(ino(&got), ino(&want));
        for p in [base.join("l/b"), base.join("a/lb")] {
            let e = open_no_symlinks(&p).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{p:?}");
            let e = walk_no_symlinks(root(), &rel(&p)).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{p:?}");
        }
        let e = walk_no_symlinks(root(), &rel(&base.join("a/../a/b"))).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        let _ = std::fs::remove_dir_all(&base);
    }
}
