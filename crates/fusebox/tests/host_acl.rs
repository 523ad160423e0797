//! `fusebox mount --posix-acl` against the host kernel: the kernel itself
//! checks permissions and ACLs stored on the host, a default ACL decides a
//! new file's mode where the umask would, and a caller without CAP_FSETID
//! loses the setgid bit when it sets an ACL. Without it (the default) the
//! kernel checks the mode bits alone and the ACL xattrs pass through,
//! where the host enforces them.

mod common;

use common::{exits_cleanly, signal, start_with, Dirs};
use passthrough::testing::acl::{
    acl, host_setxattr, host_xattr, reader_acl, GROUP_OBJ, MASK, NONE, OTHER, USER, USER_OBJ,
};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

const ACCESS: &[u8] = b"system.posix_acl_access";
const DEFAULT: &[u8] = b"system.posix_acl_default";

/// `cat FILE` as uid:gid (no supplementary groups): its output, or None.
fn cat_as(uid: u32, file: &Path) -> Option<Vec<u8>> {
    let out = Command::new("cat")
        .arg(file)
        .uid(uid)
        .gid(uid)
        .output()
        .unwrap();
    out.status.success().then_some(out.stdout)
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().mode()
}

#[test]
fn the_kernel_enforces_acls_that_live_on_the_host() {
    let d = Dirs::new("acl");
    let child = start_with(&d, &["--posix-acl"]);
    let f = d.mnt().join("f");
    std::fs::write(&f, b"secret").unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(cat_as(1234, &f), None, "mode 0600 keeps uid 1234 out");
    let a = reader_acl(1234);
    host_setxattr(&f, ACCESS, &a);
    assert_eq!(host_xattr(&d.share().join("f"), ACCESS).unwrap(), a);
    assert_eq!(mode(&f) & 0o777, 0o640, "the mask became the group bits");
    assert_eq!(cat_as(1234, &f).as_deref(), Some(&b"secret"[..]));
    assert_eq!(cat_as(1235, &f), None);

    // A default ACL: new files take their ACL from it, not the umask.
    let dir = d.mnt().join("d");
    std::fs::create_dir(&dir).unwrap();
    let dflt = acl(&[
        (USER_OBJ, 7, NONE),
        (USER, 7, 1234),
        (GROUP_OBJ, 5, NONE),
        (MASK, 7, NONE),
        (OTHER, 0, NONE),
    ]);
    host_setxattr(&dir, DEFAULT, &dflt);
    let st = Command::new("sh")
        .arg("-c")
        .arg("umask 077 && echo x > d/f && mkdir d/sub && echo y > plain")
        .current_dir(d.mnt())
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(mode(&d.share().join("d/f")) & 0o777, 0o660);
    assert!(host_xattr(&d.share().join("d/f"), ACCESS).is_some());
    assert_eq!(host_xattr(&d.share().join("d/sub"), DEFAULT).unwrap(), dflt);
    assert_eq!(
        cat_as(1234, &d.mnt().join("d/f")).as_deref(),
        Some(&b"x\n"[..])
    );
    assert_eq!(
        mode(&d.share().join("plain")) & 0o777,
        0o600,
        "no default ACL: the umask"
    );
    signal(&child, libc::SIGTERM);
    exits_cleanly(child);
}

const CAP_DAC_OVERRIDE: u32 = 1;
const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_FSETID: u32 = 4;

/// Drops `caps` from this thread's effective set (capabilities are per
/// thread); the test's other threads keep theirs.
fn drop_caps_in_this_thread(caps: &[u32]) {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const _: () = assert!(std::mem::size_of::<Header>() == 8);
    const _: () = assert!(std::mem::size_of::<Data>() == 12);
    let mut h = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget fills two Data for version 3; both live here.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut h, data.as_mut_ptr()) };
    assert_eq!(r, 0);
    for c in caps {
        data[0].effective &= !(1 << c);
    }
    // SAFETY: as above; capset only reads them.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut h, data.as_ptr()) };
    assert_eq!(r, 0);
}

#[test]
fn an_acl_set_without_cap_fsetid_clears_the_setgid_bit() {
    let d = Dirs::new("aclsgid");
    let child = start_with(&d, &["--posix-acl"]);
    let a = acl(&[(USER_OBJ, 7, NONE), (GROUP_OBJ, 5, NONE), (OTHER, 0, NONE)]);
    for (name, fsetid) in [("keep", true), ("kill", false)] {
        let f = d.mnt().join(name);
        std::fs::write(&f, b"x").unwrap();
        // A group we are not in, and the setgid bit.
        std::os::unix::fs::chown(&f, Some(0), Some(4321)).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o2755)).unwrap();
        let a = a.clone();
        let f2 = f.clone();
        std::thread::spawn(move || {
            if !fsetid {
                drop_caps_in_this_thread(&[CAP_FSETID]);
            }
            host_setxattr(&f2, ACCESS, &a);
        })
        .join()
        .unwrap();
        let m = mode(&d.share().join(name));
        assert_eq!(m & libc::S_ISGID != 0, fsetid, "{name}: {m:o}");
        assert_eq!(m & 0o777, 0o750, "{name}: {m:o}");
    }
    signal(&child, libc::SIGTERM);
    exits_cleanly(child);
}

/// Reads `f` as root without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH.
/// The daemon serves a root caller with all its capabilities, so the host
/// always lets it read: only the kernel's own check can refuse.
fn read_without_dac_caps(f: &Path) -> Result<Vec<u8>, Option<i32>> {
    let f = f.to_path_buf();
    std::thread::spawn(move || {
        drop_caps_in_this_thread(&[CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH]);
        std::fs::read(&f).map_err(|e| e.raw_os_error())
    })
    .join()
    .unwrap()
}

#[test]
fn the_kernel_itself_checks_modes_and_acls() {
    for (tag, args) in [
        ("kcheck", &["--posix-acl"][..]),
        ("kdefault", &[][..]),
        ("knoacl", &["--posix-acl=false"][..]),
    ] {
        let d = Dirs::new(tag);
        let child = start_with(&d, args);
        let f = d.mnt().join("f");
        std::fs::write(&f, b"data").unwrap();
        std::os::unix::fs::chown(&f, Some(5), Some(5)).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        // The host, as root with every capability, would allow it: only
        // the kernel's own check refuses.
        assert_eq!(read_without_dac_caps(&f), Err(Some(libc::EACCES)), "{tag}");
        // An entry for uid 0: with ACLs the kernel reads it and lets it
        // in; without, it checks the mode bits alone.
        let a = reader_acl(0);
        host_setxattr(&f, ACCESS, &a);
        if tag != "kcheck" {
            assert_eq!(read_without_dac_caps(&f), Err(Some(libc::EACCES)), "{tag}");
        } else {
            assert_eq!(
                read_without_dac_caps(&f).as_deref(),
                Ok(&b"data"[..]),
                "{tag}"
            );
        }
        signal(&child, libc::SIGTERM);
        exits_cleanly(child);
    }
}

#[test]
fn without_posix_acl_acls_pass_through_and_the_host_enforces_them() {
    let d = Dirs::new("noacl");
    let child = start_with(&d, &["--posix-acl=false"]);
    let f = d.mnt().join("f");
    std::fs::write(&f, b"secret").unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
    // Everyone may read by the mode bits, except uid 1234 by its entry.
    let a = acl(&[
        (USER_OBJ, 6, NONE),
        (USER, 0, 1234),
        (GROUP_OBJ, 4, NONE),
        (MASK, 4, NONE),
        (OTHER, 4, NONE),
    ]);
    host_setxattr(&f, ACCESS, &a);
    assert_eq!(host_xattr(&d.share().join("f"), ACCESS).unwrap(), a);
    assert_eq!(host_xattr(&f, ACCESS).unwrap(), a);
    // The kernel's mode check lets both in; the host's ACL check, which
    // the daemon's calls as the caller meet, stops 1234.
    assert_eq!(cat_as(1235, &f).as_deref(), Some(&b"secret"[..]));
    assert_eq!(cat_as(1234, &f), None);
    signal(&child, libc::SIGTERM);
    exits_cleanly(child);
}

#[test]
fn a_bare_posix_acl_flag_takes_no_value_from_the_mountpoint() {
    let d = Dirs::new("aclflag");
    // `--posix-acl` right before the mountpoint: the flag, not its value.
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .arg("mount")
        .arg("--shared-dir")
        .arg(d.share())
        .arg("--posix-acl")
        .arg(d.mnt())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    common::wait("mounted", || common::mounted(&d.mnt()));
    signal(&child, libc::SIGTERM);
    exits_cleanly(child);
}
