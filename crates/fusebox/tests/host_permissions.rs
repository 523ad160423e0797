//! `fusebox mount` lets the kernel check permissions (`default_permissions`)
//! in every serving mode: what the daemon never sees, because the kernel
//! does it without asking, is refused all the same. Each case here passed
//! (wrongly) with the daemon's per-call credentials as the only check:
//! - a FIFO whose mode denies the caller: the kernel opens special files
//!   itself, no OPEN reaches the daemon;
//! - calls by another user through a directory that has just lost its
//!   search bit, on a file whose dentry the kernel holds from before: no
//!   LOOKUP reaches the daemon, whose calls on the inode itself walk no
//!   path.

mod common;

use common::{exits_cleanly, signal, start_with, Dirs};
use std::ffi::CString;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The serving modes CI runs the conformance suites in, and with POSIX
/// ACLs (which make the kernel check permissions by themselves: the
/// others fail without `default_permissions`).
const MODES: &[&[&str]] = &[
    &[],
    &["--posix-acl"],
    &["--io-uring"],
    &["--io-uring", "--kernel-passthrough"],
    &["--cache", "never"],
    &["--inode-file-handles"],
];

const USER: u32 = 1234;

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

/// The errno of a libc call's -1, or 0.
fn rc(r: libc::c_int) -> i32 {
    if r == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap()
    }
}

/// Runs `f` on a thread whose filesystem identity is `USER:USER` with no
/// supplementary groups (and so, as the kernel does on that switch,
/// without root's filesystem capabilities). Credentials are per thread in
/// the kernel; the raw system calls change only this one.
fn as_user<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: these change only this thread's credentials; setgroups
        // gets an empty list.
        unsafe {
            assert_eq!(
                libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()),
                0
            );
            libc::syscall(libc::SYS_setfsgid, USER);
            libc::syscall(libc::SYS_setfsuid, USER);
            assert_eq!(
                libc::syscall(libc::SYS_setfsuid, -1i32 as u32),
                i64::from(USER)
            );
        }
        f()
    })
    .join()
    .unwrap()
}

/// open(2) as `USER` with `flags`: 0 or the errno (the fd is closed).
fn open_as_user(p: &Path, flags: libc::c_int) -> i32 {
    let p = c(p);
    as_user(move || {
        // SAFETY: a NUL-terminated path; the fd is ours to close.
        let fd = unsafe { libc::open(p.as_ptr(), flags) };
        if fd < 0 {
            return rc(-1);
        }
        // SAFETY: the fd just opened.
        unsafe { libc::close(fd) };
        0
    })
}

#[test]
fn a_fifo_whose_mode_denies_the_caller_is_not_opened() {
    for (i, mode) in MODES.iter().enumerate() {
        let d = Dirs::new(&format!("permfifo{i}"));
        std::fs::set_permissions(d.share(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let child = start_with(&d, mode);
        let (closed, open) = (d.mnt().join("closed"), d.mnt().join("open"));
        for (p, m) in [(&closed, 0o600), (&open, 0o666)] {
            // SAFETY: a NUL-terminated path.
            assert_eq!(rc(unsafe { libc::mkfifo(c(p).as_ptr(), m) }), 0, "{mode:?}");
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
        }
        let flags = libc::O_RDONLY | libc::O_NONBLOCK;
        assert_eq!(open_as_user(&open, flags), 0, "{mode:?}: mode 0666");
        assert_eq!(
            open_as_user(&closed, flags),
            libc::EACCES,
            "{mode:?}: mode 0600"
        );
        assert_eq!(
            open_as_user(&closed, libc::O_WRONLY | libc::O_NONBLOCK),
            libc::EACCES,
            "{mode:?}"
        );
        signal(&child, libc::SIGTERM);
        exits_cleanly(child);
    }
}

#[test]
fn calls_through_a_directory_that_lost_its_search_bit_are_refused() {
    for (i, mode) in MODES.iter().enumerate() {
        let d = Dirs::new(&format!("permdir{i}"));
        std::fs::set_permissions(d.share(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let child = start_with(&d, mode);
        let dir = d.mnt().join("d");
        let f = dir.join("f");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(&f, b"data").unwrap();
        std::os::unix::fs::chown(&f, Some(USER), Some(USER)).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        // The user reaches the file (the kernel now holds its dentry).
        assert_eq!(open_as_user(&f, libc::O_RDONLY), 0, "{mode:?}");
        // Root takes the directory's search bit away from everyone else.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let (fc, link) = (c(&f), c(&d.mnt().join("link")));
        let errs = as_user(move || {
            // SAFETY: NUL-terminated paths.
            unsafe {
                [
                    ("chmod", rc(libc::chmod(fc.as_ptr(), 0o600))),
                    ("chown", rc(libc::chown(fc.as_ptr(), USER, USER))),
                    ("truncate", rc(libc::truncate(fc.as_ptr(), 0))),
                    ("link", rc(libc::link(fc.as_ptr(), link.as_ptr()))),
                ]
            }
        });
        for (op, e) in errs {
            assert_eq!(e, libc::EACCES, "{mode:?}: {op}");
        }
        assert_eq!(
            open_as_user(&f, libc::O_RDONLY),
            libc::EACCES,
            "{mode:?}: open"
        );
        // Nothing of it reached the host file.
        let host = d.share().join("d/f");
        assert_eq!(std::fs::read(&host).unwrap(), b"data", "{mode:?}");
        let m = std::fs::metadata(&host).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o644, "{mode:?}");
        assert!(!d.share().join("link").exists(), "{mode:?}");
        signal(&child, libc::SIGTERM);
        exits_cleanly(child);
    }
}
