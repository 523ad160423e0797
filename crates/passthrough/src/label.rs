//! Security labels of new inodes (FUSE_SECURITY_CTX, virtiofsd's
//! `--security-label`): the label the client's LSM made for an inode it
//! creates (CREATE, MKNOD, MKDIR, SYMLINK, TMPFILE) is on the host inode
//! before the reply, or the creation is undone and the request fails.
//!
//! Two routes: **atomic** (the host runs SELinux and the host name is
//! `security.selinux`: the label goes to `/proc/thread-self/attr/fscreate`
//! around the creation and is read back after it; a refused fscreate
//! write fails the request and never falls back to setxattr), or **right
//! after** (an xattr under its `--xattrmap` host name on the new inode,
//! which exists unlabelled in between). A name opened again to label it
//! must look like the inode just made, or nothing is set or undone. Labels
//! are set with the daemon's credentials, so only `security.*` names other
//! than `security.capability` are taken, and never a host name
//! `forbidden_host_name` refuses. See docs/DESIGN.md, "Security labels".

use super::creds::{Caps, Cred};
use super::{sys, PassthroughFs};
use fuse_core::abi::SecurityContext;
use fuse_core::Errno;
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::Path;

/// The host's SELinux label xattr, the one fscreate sets.
const SELINUX: &[u8] = b"security.selinux";

/// The thread's create context, under `/proc`.
const FSCREATE: &CStr = c"thread-self/attr/fscreate";

/// A label the host mount cannot hold.
const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);

/// Host xattr names a label is never written under, whatever
/// `--xattrmap` makes of the client's name: file capabilities, and
/// overlayfs's own metadata (`trusted.overlay.*`), which the daemon's
/// CAP_SYS_ADMIN could otherwise write for a client.
fn forbidden_host_name(host: &[u8]) -> bool {
    host == super::CAPS_XATTR || host.starts_with(b"trusted.overlay.")
}

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
        Fscreate::probe_at(wanted, Path::new("/sys/fs/selinux"), c"/proc")
    }

    /// [`Fscreate::probe`] with selinuxfs at `selinuxfs` and procfs at
    /// `proc` (tests hand in plain directories).
    pub(super) fn probe_at(wanted: bool, selinuxfs: &Path, proc: &CStr) -> Fscreate {
        let selinux = wanted && selinuxfs.join("enforce").exists();
        let proc_root = selinux
            .then(|| sys::openat(libc::AT_FDCWD, proc, libc::O_PATH | libc::O_DIRECTORY, 0))
            .and_then(Result::ok);
        Fscreate { proc_root }
    }

    /// Writes `label` as this thread's fscreate context: the next inode
    /// this thread makes gets it. Ok(None) if this route does not apply
    /// (no SELinux, or another host name): the caller sets the xattr after
    /// the creation. An error if the host refuses the context: then
    /// nothing may be made.
    fn set(&self, label: &Label<'_>) -> Result<Option<FscreateGuard>, Errno> {
        let Some(root) = self.proc_root.as_ref() else {
            return Ok(None);
        };
        if label.host.as_bytes() != SELINUX {
            return Ok(None);
        }
        let fd = sys::openat(root.as_raw_fd(), FSCREATE, libc::O_WRONLY, 0)?;
        write_all(fd.as_raw_fd(), label.value)?;
        Ok(Some(FscreateGuard { fd }))
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
            fuse_core::warn_limited!("clearing a worker's fscreate label: {e}");
        }
    }
}

fn write_all(fd: RawFd, b: &[u8]) -> Result<(), Errno> {
    let n = sys::write(fd, b)?;
    if n != b.len() {
        return Err(Errno::EIO);
    }
    Ok(())
}

/// What a creating operation does about its label: nothing, or the label
/// set by fscreate as the inode is made (then checked on it), or the
/// label to set on the new inode right after.
#[derive(Debug)]
pub(super) struct Plan<'a> {
    /// The label, if any.
    label: Option<Label<'a>>,
    /// Set as this thread's fscreate context until the creation is done.
    fscreate: Option<FscreateGuard>,
    /// The fscreate route was taken: check, do not set.
    atomic: bool,
}

impl<'a> Plan<'a> {
    /// No label.
    pub(super) fn none() -> Plan<'a> {
        Plan {
            label: None,
            fscreate: None,
            atomic: false,
        }
    }

    /// Whether there is a label to give.
    pub(super) fn labels(&self) -> bool {
        self.label.is_some()
    }

    /// The creation is done (or failed): clears the thread's fscreate
    /// context, so nothing else this thread makes gets the label.
    pub(super) fn created(&mut self) {
        self.fscreate = None;
    }

    /// Gives the new inode `fd` (any open fd of it, O_PATH included) its
    /// label, with the daemon's credentials: sets it, or checks that the
    /// host set it.
    pub(super) fn apply(&mut self, fs: &PassthroughFs, fd: RawFd) -> Result<(), Errno> {
        self.created();
        match &self.label {
            None => Ok(()),
            Some(l) if self.atomic => fs.check_label(fd, l),
            Some(l) => fs.set_label(fd, l),
        }
    }
}

/// What the inode a creating request just made by name looks like, to
/// tell it from another a racing rename put under the name.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fresh {
    /// Its type (S_IFMT bits).
    kind: u32,
    /// The uid it was made as.
    owner: u32,
    /// The coarse clock just before it was made, less a little for hosts
    /// whose clock is not ours (network filesystems).
    since: (i64, u32),
}

impl Fresh {
    /// Slack for a host filesystem's clock, in seconds.
    const SKEW: i64 = 2;

    /// Before making an inode of type `kind` as `owner`.
    pub(super) fn before(kind: u32, owner: u32) -> Fresh {
        // Timestamps come from the coarse clock, so this one is never
        // later than the new inode's ctime.
        let since = match sys::realtime_coarse() {
            Ok((sec, nsec)) => (sec - Fresh::SKEW, nsec as u32),
            Err(_) => (i64::MIN, 0),
        };
        Fresh { kind, owner, since }
    }

    /// Whether `st` (a statx with the basic stats) can be the inode made:
    /// its type, its owner, one link (a new directory: one or two), and
    /// changed no earlier than its making.
    pub(super) fn matches(&self, st: &libc::statx) -> bool {
        let want = libc::STATX_TYPE | libc::STATX_UID | libc::STATX_NLINK | libc::STATX_CTIME;
        if st.stx_mask & want != want {
            return false;
        }
        let kind = u32::from(st.stx_mode) & libc::S_IFMT;
        let links = if kind == libc::S_IFDIR { 1..=2 } else { 1..=1 };
        kind == self.kind
            && st.stx_uid == self.owner
            && links.contains(&st.stx_nlink)
            && (st.stx_ctime.tv_sec, st.stx_ctime.tv_nsec) >= self.since
    }
}

impl PassthroughFs {
    /// The plan for `secctx` (a CREATE's, MKNOD's... label): checked and
    /// its name mapped before anything is made, so a refused label makes
    /// nothing. With the fscreate route, the thread's create context is
    /// set from here until [`Plan::created`].
    pub(super) fn label_plan<'a>(
        &self,
        secctx: Option<SecurityContext<'a>>,
    ) -> Result<Plan<'a>, Errno> {
        let Some(l) = secctx else {
            return Ok(Plan::none());
        };
        if !self.cfg.security_label {
            return Ok(Plan::none());
        }
        if !l.name.starts_with(b"security.") || l.name == super::CAPS_XATTR {
            return Err(Errno::EPERM);
        }
        let host = self.host_xattr(l.name)?.into_owned();
        if forbidden_host_name(&host) {
            return Err(Errno::EPERM);
        }
        // The mapped name comes from the client's, which has no NUL.
        let host = CString::new(host).map_err(|e| {
            log::warn!("a label's host xattr name: {e}");
            Errno::EINVAL
        })?;
        let label = Label {
            host,
            value: l.value,
        };
        let fscreate = self.fscreate.set(&label)?;
        Ok(Plan {
            atomic: fscreate.is_some(),
            label: Some(label),
            fscreate,
        })
    }

    /// Sets `label` on the new inode `fd` (any open fd of it, O_PATH
    /// included), with the daemon's credentials.
    fn set_label(&self, fd: RawFd, label: &Label<'_>) -> Result<(), Errno> {
        let proc = self.proc_fd.as_raw_fd();
        sys::setxattr(&sys::FdName::new(proc, fd), &label.host, label.value, 0)
    }

    /// Checks that the host gave the new inode `fd` the label fscreate
    /// asked for: SELinux ignores the create context where the mount has
    /// no per-inode labels, and the inode then has the mount's. EOPNOTSUPP
    /// (what setting it there answers) if not.
    fn check_label(&self, fd: RawFd, label: &Label<'_>) -> Result<(), Errno> {
        let proc = self.proc_fd.as_raw_fd();
        let mut buf = vec![0u8; label.value.len() + 1];
        let got = match sys::getxattr(&sys::FdName::new(proc, fd), &label.host, &mut buf) {
            Ok(n) => buf.get(..n).unwrap_or(&[]),
            Err(e) if e == Errno::ERANGE || e == Errno::ENODATA || e == EOPNOTSUPP => {
                return Err(EOPNOTSUPP)
            }
            Err(e) => return Err(e),
        };
        if bare(got) == bare(label.value) {
            Ok(())
        } else {
            Err(EOPNOTSUPP)
        }
    }

    /// Undoes the creation of `name` in `dir` whose label could not be
    /// given: unlinks it, with the caller's credentials `cred`, if it is
    /// still the inode made (`ours`).
    pub(super) fn unmake(
        &self,
        cred: &Cred,
        dir: BorrowedFd<'_>,
        name: &CStr,
        ours: &dyn Fn(&libc::statx) -> bool,
    ) {
        let _c = match self.creds_as(cred, Caps::Caller) {
            Ok(c) => c,
            Err(e) => {
                fuse_core::warn_limited!(
                    "removing {name:?}, whose security label could not be set: {e}"
                );
                return;
            }
        };
        let now = sys::statx(
            dir.as_raw_fd(),
            name,
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BASIC_STATS,
        );
        let Some(st) = now.ok().filter(|st| ours(st)) else {
            return;
        };
        let flags = if u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFDIR {
            libc::AT_REMOVEDIR
        } else {
            0
        };
        if let Err(e) = sys::unlinkat(dir, name, flags) {
            fuse_core::warn_limited!(
                "removing {name:?}, whose security label could not be set: {e}"
            );
        }
    }
}

/// A label without the NUL SELinux counts in it (the host's reading may
/// or may not have it).
fn bare(v: &[u8]) -> &[u8] {
    v.strip_suffix(&[0]).unwrap_or(v)
}

/// Whether `st` is the inode `made` (its inode number and device).
pub(super) fn same_inode(made: &libc::statx, st: &libc::statx) -> bool {
    st.stx_ino == made.stx_ino
        && st.stx_dev_major == made.stx_dev_major
        && st.stx_dev_minor == made.stx_dev_minor
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;
    use fuse_core::abi::ROOT_ID;
    use fuse_core::server::Ctx;
    use std::path::PathBuf;

    const LABEL: &[u8] = b"system_u:object_r:container_file_t:s0\0";

    /// A scratch directory: `share` to serve, and beside it a fake
    /// selinuxfs and `/proc` for the fscreate route.
    struct Scratch {
        base: PathBuf,
    }

    impl Scratch {
        fn new(tag: &str) -> Scratch {
            let base = std::env::temp_dir().join(format!(
                "fusebox-label-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = std::fs::remove_dir_all(&base);
            std::fs::create_dir_all(base.join("share")).unwrap();
            Scratch { base }
        }
        fn share(&self) -> PathBuf {
            self.base.join("share")
        }
        /// A fake SELinux host whose fscreate file is a plain file, or a
        /// directory (`refuses`: opening it to write fails).
        fn fake_selinux(&self, refuses: bool) -> Fscreate {
            let sel = self.base.join("selinuxfs");
            std::fs::create_dir_all(&sel).unwrap();
            std::fs::write(sel.join("enforce"), b"1").unwrap();
            let attr = self.base.join("proc/thread-self/attr");
            std::fs::create_dir_all(&attr).unwrap();
            if refuses {
                std::fs::create_dir_all(attr.join("fscreate")).unwrap();
            } else {
                std::fs::write(attr.join("fscreate"), b"").unwrap();
            }
            let proc =
                CString::new(self.base.join("proc").into_os_string().into_encoded_bytes()).unwrap();
            let f = Fscreate::probe_at(true, &sel, &proc);
            assert!(f.proc_root.is_some());
            f
        }
        fn fscreate_written(&self) -> Vec<u8> {
            std::fs::read(self.base.join("proc/thread-self/attr/fscreate")).unwrap()
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.base);
        }
    }

    fn fs(s: &Scratch, xattrmap: Option<&str>) -> PassthroughFs {
        let cfg = Config {
            security_label: true,
            xattrmap: xattrmap.map(|m| m.parse().unwrap()),
            ..Config::default()
        };
        PassthroughFs::new(s.share(), cfg).unwrap()
    }

    fn ctx(name: &'static [u8]) -> Ctx<'static> {
        Ctx {
            unique: 2,
            uid: 0,
            gid: 0,
            pid: std::process::id(),
            secctx: Some(SecurityContext { name, value: LABEL }),
            ..Ctx::default()
        }
    }

    /// The host xattr `name` of `p` itself.
    fn host_get(p: &Path, name: &CStr) -> Option<Vec<u8>> {
        let path = CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        let mut buf = vec![0u8; 256];
        let n = sys::lgetxattr(&path, name, &mut buf).ok()?;
        buf.truncate(n);
        Some(buf)
    }

    /// Every creating operation of `fs` for `name` in the root, its result.
    fn each_creation(fs: &PassthroughFs, c: &Ctx<'_>, name: &str) -> Vec<(String, Errno)> {
        let mut errs = Vec::new();
        let rw = libc::O_RDWR as u32;
        let n = |k: &str| format!("{name}-{k}");
        let mut note = |k: &str, r: Result<(), Errno>| match r {
            Ok(()) => panic!("{k}: made"),
            Err(e) => errs.push((n(k), e)),
        };
        note(
            "dir",
            fs.op_mkdir(c, ROOT_ID, n("dir").as_bytes(), 0o755, 0)
                .map(drop),
        );
        note(
            "fifo",
            (fs.op_mknod(
                c,
                ROOT_ID,
                n("fifo").as_bytes(),
                libc::S_IFIFO | 0o644,
                0,
                0,
            ))
            .map(drop),
        );
        note(
            "link",
            (fs.op_symlink(c, ROOT_ID, n("link").as_bytes(), b"t")).map(drop),
        );
        note(
            "file",
            (fs.op_create(c, ROOT_ID, n("file").as_bytes(), 0o644, rw, 0)).map(drop),
        );
        note("tmp", fs.op_tmpfile(c, ROOT_ID, 0o644, rw, 0).map(drop));
        errs
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn an_fscreate_label_the_host_ignored_undoes_the_creation() {
        // SELinux takes the create context but the mount has no per-inode
        // labels: the new inode lacks it (here: no security.selinux at all).
        let s = Scratch::new("ignored");
        let mut fs = fs(&s, None);
        fs.fscreate = s.fake_selinux(false);
        for (what, e) in each_creation(&fs, &ctx(SELINUX), "n") {
            assert_eq!(e, EOPNOTSUPP, "{what}");
        }
        // The route was taken, and nothing is left.
        assert_eq!(s.fscreate_written(), LABEL);
        assert_eq!(names(&s.share()), Vec::<String>::new());
    }

    #[test]
    fn an_fscreate_label_the_host_refuses_is_not_forced_as_an_xattr() {
        let s = Scratch::new("refused");
        let mut fs = fs(&s, None);
        fs.fscreate = s.fake_selinux(true);
        for (what, e) in each_creation(&fs, &ctx(SELINUX), "n") {
            assert_eq!(e, Errno::EISDIR, "{what}");
        }
        assert_eq!(names(&s.share()), Vec::<String>::new());
    }

    #[test]
    fn the_host_name_is_checked_after_the_xattrmap_too() {
        let s = Scratch::new("hostname");
        // A prefix rule prepends to the whole name, so the host name is
        // `trusted.overlay.security.selinux` here: overlayfs metadata.
        for map in [
            ":prefix:all:security.:trusted.overlay.: :ok:all:::",
            ":map::trusted.overlay.:",
        ] {
            let fs = fs(&s, Some(map));
            for (what, e) in each_creation(&fs, &ctx(SELINUX), "n") {
                assert_eq!(e, Errno::EPERM, "{map}: {what}");
            }
            assert_eq!(names(&s.share()), Vec::<String>::new(), "{map}");
        }
    }

    #[test]
    fn a_rename_racing_a_mkdir_gets_no_label_and_is_not_undone() {
        let s = Scratch::new("race");
        let fs = fs(&s, None);
        let share = s.share();
        // Someone else's directory, renamed over the new name right after
        // the mkdir, before the daemon opens the name again to label it.
        std::fs::create_dir(share.join("other")).unwrap();
        std::os::unix::fs::chown(share.join("other"), Some(1234), Some(1234)).unwrap();
        let c = ctx(SELINUX);
        let r = fs.make(&c, ROOT_ID, b"d", 0, libc::S_IFDIR, |d, n| {
            sys::mkdirat(d, n, 0o755)?;
            std::fs::rename(share.join("d"), share.join("mine")).unwrap();
            std::fs::rename(share.join("other"), share.join("d")).unwrap();
            Ok(())
        });
        assert_eq!(r.unwrap_err(), Errno::EIO);
        assert!(share.join("d").is_dir(), "the other directory was removed");
        assert_eq!(host_get(&share.join("d"), c"security.selinux"), None);
        // A plain mkdir still gets its label.
        fs.op_mkdir(&c, ROOT_ID, b"e", 0o755, 0).unwrap();
        assert_eq!(
            host_get(&share.join("e"), c"security.selinux").as_deref(),
            Some(LABEL)
        );
    }

    #[test]
    fn a_make_whose_new_name_cannot_be_opened_is_undone() {
        let s = Scratch::new("unopened");
        let fs = fs(&s, None);
        let share = s.share();
        let c = ctx(SELINUX);
        // The directory is made, but the name cannot be opened again
        // afterwards: the daemon's fd budget is spent meanwhile.
        let mut held = Vec::new();
        let r = fs.make(&c, ROOT_ID, b"d", 0, libc::S_IFDIR, |d, n| {
            sys::mkdirat(d, n, 0o755)?;
            while let Ok(r) = fs.budget.reserve() {
                held.push(r);
            }
            Ok(())
        });
        drop(held);
        assert_eq!(r.unwrap_err(), Errno::EMFILE);
        assert!(!share.join("d").exists(), "left behind");
    }
}
