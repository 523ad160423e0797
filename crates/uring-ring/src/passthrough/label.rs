//! Security labels of new inodes (FUSE_SECURITY_CTX, virtiofsd's
//! `--security-label`): the label the client's LSM made for an inode it
//! creates (CREATE, MKNOD, MKDIR, SYMLINK, TMPFILE) is set on the host
//! inode before the reply, so no guest ever sees the inode unlabelled.
//!
//! Two routes:
//! - **Atomic** (fscreate): when the host runs SELinux and the label's host
//!   name (after `--xattrmap`) is `security.selinux` itself, the label is
//!   written to `/proc/thread-self/attr/fscreate` before the creation and
//!   cleared after it, so the host kernel labels the inode as it makes it
//!   (the old C virtiofsd did this; the Rust virtiofsd does not). If the
//!   host refuses the write, the xattr route below is taken instead.
//! - **Right after** (xattr): otherwise the label is set as an xattr under
//!   its host name (so `:map:security.selinux:user.virtiofs.:` stores a
//!   guest's `security.selinux` as `user.virtiofs.security.selinux`) on the
//!   new inode before the reply. If that fails, the creation is undone
//!   (the name is unlinked, if it still names the inode made; a TMPFILE's
//!   inode just goes with its fd) and the request fails with the error.
//!   virtiofsd 1.14 does the same (set after creation, unlink on failure),
//!   without the check that the name still names the new inode.
//!
//! The label is set with the daemon's own credentials, not the caller's,
//! as virtiofsd does: a host name such as `trusted.virtiofs.*` needs
//! CAP_SYS_ADMIN, which no guest caller has on the host. Because of that,
//! only names an LSM uses are taken, `security.*` other than
//! `security.capability` (a client could otherwise give its file host
//! capabilities through the daemon): anything else is refused with EPERM
//! before anything is made.

use super::{sys, PassthroughFs};
use fuse_core::abi::SecCtx;
use fuse_core::Errno;
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

/// The host's SELinux label xattr, the one fscreate sets.
const SELINUX: &[u8] = b"security.selinux";

/// A label to set on an inode about to be made.
#[derive(Debug)]
pub(super) struct Label<'a> {
    /// Its host xattr name (`--xattrmap` applied).
    host: CString,
    /// The value, as the client sent it.
    value: &'a [u8],
}

/// How the host labels new inodes atomically, found at start.
#[derive(Debug)]
pub(super) struct Fscreate {
    /// The daemon's `/proc` (its pid namespace's), for
    /// `thread-self/attr/fscreate`; None: the host has no SELinux.
    proc_root: Option<OwnedFd>,
}

impl Fscreate {
    /// Looks for SELinux on the host (selinuxfs mounted and enforcing or
    /// permissive) and keeps `/proc` open for later, before any sandbox
    /// hides both. Nothing when `wanted` is false.
    pub(super) fn probe(wanted: bool) -> Fscreate {
        let selinux = wanted && std::path::Path::new("/sys/fs/selinux/enforce").exists();
        let proc_root = selinux
            .then(|| {
                sys::openat(
                    libc::AT_FDCWD,
                    c"/proc",
                    libc::O_PATH | libc::O_DIRECTORY,
                    0,
                )
            })
            .and_then(Result::ok);
        Fscreate { proc_root }
    }

    /// Writes `label` as this thread's fscreate context: the next inode
    /// this thread makes gets it. None if the host does not take it
    /// (then the caller sets the xattr after the creation).
    fn set(&self, label: &Label<'_>) -> Option<FscreateGuard> {
        let root = self.proc_root.as_ref()?;
        if label.host.as_bytes() != SELINUX {
            return None;
        }
        let fd = sys::openat(
            root.as_raw_fd(),
            c"thread-self/attr/fscreate",
            libc::O_WRONLY,
            0,
        )
        .ok()?;
        write_all(fd.as_raw_fd(), label.value).ok()?;
        Some(FscreateGuard { fd })
    }
}

/// Clears the thread's fscreate context when dropped.
#[derive(Debug)]
pub(super) struct FscreateGuard {
    fd: OwnedFd,
}

impl Drop for FscreateGuard {
    fn drop(&mut self) {
        // An empty write resets it to the policy's default. If even that
        // fails the thread's next creation would carry this label: nothing
        // better to do than say so.
        if let Err(e) = write_all(self.fd.as_raw_fd(), &[]) {
            eprintln!("fusebox: clearing a worker's fscreate label: {e}");
        }
    }
}

fn write_all(fd: RawFd, b: &[u8]) -> Result<(), Errno> {
    // SAFETY: `b` is readable for its length; the result is checked.
    let n = unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) };
    if n < 0 {
        return Err(sys::errno());
    }
    if n as usize != b.len() {
        return Err(Errno::EIO);
    }
    Ok(())
}

/// What a creating operation does about its label: nothing, or the
/// label set by fscreate (keep the guard until the inode is made), or the
/// label still to be set on the new inode.
#[derive(Debug)]
pub(super) enum Plan<'a> {
    /// No label.
    None,
    /// Being set by the host as the inode is made.
    Atomic(FscreateGuard),
    /// To set right after the creation.
    After(Label<'a>),
}

impl PassthroughFs {
    /// The plan for `secctx` (a CREATE's, MKNOD's... label): checked and
    /// its name mapped before anything is made, so a refused label makes
    /// nothing.
    pub(super) fn label_plan<'a>(&self, secctx: Option<SecCtx<'a>>) -> Result<Plan<'a>, Errno> {
        let Some(l) = secctx else {
            return Ok(Plan::None);
        };
        if !self.cfg.security_label {
            return Ok(Plan::None);
        }
        if !l.name.starts_with(b"security.") || l.name == super::CAPS_XATTR {
            return Err(Errno::EPERM);
        }
        let host =
            CString::new(self.host_xattr(l.name)?.into_owned()).map_err(|_nul| Errno::EINVAL)?;
        let label = Label {
            host,
            value: l.value,
        };
        Ok(match self.fscreate.set(&label) {
            Some(g) => Plan::Atomic(g),
            None => Plan::After(label),
        })
    }

    /// Sets `label` on the new inode `fd` (any open fd of it, O_PATH
    /// included), with the daemon's credentials.
    pub(super) fn set_label(&self, fd: RawFd, label: &Label<'_>) -> Result<(), Errno> {
        let proc = self.proc_fd.as_raw_fd();
        sys::setxattr(&sys::FdName::new(proc, fd), &label.host, label.value, 0)
    }

    /// Undoes the creation of `name` in `dir` whose label could not be
    /// set: unlinks it if it is still the inode made (`made`).
    pub(super) fn unmake(&self, dir: BorrowedFd<'_>, name: &CStr, made: &libc::statx) {
        let now = sys::statx(
            dir.as_raw_fd(),
            name,
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_INO | libc::STATX_TYPE,
        );
        let same = now.is_ok_and(|st| {
            st.stx_ino == made.stx_ino
                && st.stx_dev_major == made.stx_dev_major
                && st.stx_dev_minor == made.stx_dev_minor
        });
        if !same {
            return;
        }
        let flags = if u32::from(made.stx_mode) & libc::S_IFMT == libc::S_IFDIR {
            libc::AT_REMOVEDIR
        } else {
            0
        };
        if let Err(e) = sys::unlinkat(dir, name, flags) {
            eprintln!(
                "fusebox: removing {:?}, whose security label could not be set: {e:?}",
                name
            );
        }
    }
}
