//! `Config::posix_acl`: what INIT must agree on, the ACL xattrs refused
//! without it, the client's SETXATTR_ACL_KILL_SGID, and default ACLs
//! deciding a new file's mode where the umask would otherwise.
//! (The kernel's enforcement of ACLs is shown through a real mount in
//! fusebox's host_mount tests.)

mod common;

use common::{HostDir, Kind, Mount, Via};
use fuse_core::abi::Xattr;
use fuse_core::abi::{flags, init, ROOT_ID};
use fuse_core::Errno;
use passthrough::testing::acl::{
    acl, host_setxattr, host_xattr, reader_acl, GROUP_OBJ, MASK, NONE, OTHER, USER, USER_OBJ,
};
use passthrough::Config;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

const ACCESS: &[u8] = b"system.posix_acl_access";
const DEFAULT: &[u8] = b"system.posix_acl_default";
const RW: u32 = libc::O_RDWR as u32;

fn acl_mount(add: u64) -> Result<Mount, Errno> {
    acl_mount_without(add, 0)
}

fn acl_mount_without(add: u64, drop: u64) -> Result<Mount, Errno> {
    let host = HostDir::new(Kind::Tmpfs);
    let share = host.path.clone();
    let cfg = Config {
        posix_acl: true,
        ..Config::default()
    };
    Mount::offering(host, &share, cfg, Via::Device(2), add, drop)
}

/// The names of a listxattr reply, and that its size query agrees.
fn names(c: &fuse_core::client::Client, node: u64) -> Vec<Vec<u8>> {
    let Xattr::Size(n) = c.listxattr(node, 0).unwrap() else {
        panic!("no size")
    };
    let Xattr::Data(d) = c.listxattr(node, 4096).unwrap() else {
        panic!("no data")
    };
    assert_eq!(n as usize, d.len());
    d.split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(<[u8]>::to_vec)
        .collect()
}

#[test]
fn posix_acl_needs_a_client_that_enforces_acls() {
    assert_eq!(
        acl_mount(0).err(),
        Some(Errno(libc::EPROTO)),
        "a client that does not offer FUSE_POSIX_ACL gets no connection"
    );
    for missing in [init::DONT_MASK, init::SETXATTR_EXT] {
        assert_eq!(
            acl_mount_without(init::POSIX_ACL, missing).err(),
            Some(Errno(libc::EPROTO)),
            "without {missing:#x}"
        );
    }
    let m = acl_mount(init::POSIX_ACL).unwrap();
    let want = init::POSIX_ACL | init::DONT_MASK | init::SETXATTR_EXT;
    let got = m.client.chan().negotiated().unwrap().flags;
    assert_eq!(got & want, want, "negotiated {got:#x}");
}

#[test]
fn optional_posix_acl_serves_a_client_without_them() {
    // `--posix-acl=auto`: no FUSE_POSIX_ACL from the client, a connection
    // without ACLs (their xattrs refused, as with ACLs off).
    let host = HostDir::new(Kind::Tmpfs);
    let share = host.path.clone();
    let cfg = Config {
        posix_acl: true,
        posix_acl_optional: true,
        ..Config::default()
    };
    let m = Mount::offering(host, &share, cfg.clone(), Via::Device(2), 0, 0).unwrap();
    let got = m.client.chan().negotiated().unwrap().flags;
    assert_eq!(got & init::POSIX_ACL, 0, "negotiated {got:#x}");
    let (e, _) = m.client.create(ROOT_ID, b"f", 0o644, RW, 0).unwrap();
    let a = acl(&[(USER_OBJ, 6, NONE), (GROUP_OBJ, 4, NONE), (OTHER, 4, NONE)]);
    assert_eq!(
        m.client.setxattr(e.nodeid, ACCESS, &a, 0).unwrap_err(),
        Errno(libc::EOPNOTSUPP)
    );
    // A client that can gets them.
    let host = HostDir::new(Kind::Tmpfs);
    let share = host.path.clone();
    let m = Mount::offering(host, &share, cfg, Via::Device(2), init::POSIX_ACL, 0).unwrap();
    let got = m.client.chan().negotiated().unwrap().flags;
    assert_ne!(got & init::POSIX_ACL, 0, "negotiated {got:#x}");
}

#[test]
fn without_posix_acl_the_acl_xattrs_are_refused() {
    let m = Mount::new(Kind::Tmpfs, Config::default(), Via::Device(2));
    let c = &m.client;
    let (e, _) = c.create(ROOT_ID, b"f", 0o644, RW, 0).unwrap();
    let a = acl(&[
        (USER_OBJ, 6, NONE),
        (USER, 4, 1234),
        (GROUP_OBJ, 4, NONE),
        (MASK, 4, NONE),
        (OTHER, 4, NONE),
    ]);
    let eopnotsupp = Errno(libc::EOPNOTSUPP);
    assert_eq!(c.setxattr(e.nodeid, ACCESS, &a, 0).unwrap_err(), eopnotsupp);
    assert_eq!(
        c.setxattr(e.nodeid, DEFAULT, &a, 0).unwrap_err(),
        eopnotsupp
    );
    assert_eq!(c.getxattr(e.nodeid, ACCESS, 0).unwrap_err(), eopnotsupp);
    assert_eq!(c.removexattr(e.nodeid, ACCESS).unwrap_err(), eopnotsupp);
    assert_eq!(host_xattr(&m.path("f"), ACCESS), None);
    // Other xattrs are served as before.
    c.setxattr(e.nodeid, b"user.k", b"v", 0).unwrap();
    assert_eq!(host_xattr(&m.path("f"), b"user.k").unwrap(), b"v");
    // An ACL the host file has anyway is left out of the list too.
    host_setxattr(&m.path("f"), ACCESS, &a);
    assert_eq!(names(c, e.nodeid), [b"user.k".to_vec()]);
    assert_eq!(c.getxattr(e.nodeid, ACCESS, 0).unwrap_err(), eopnotsupp);
}

#[test]
fn pass_acl_xattrs_serves_them_without_posix_acl() {
    // Host mounts: the host enforces the ACLs, as the caller with its groups.
    let cfg = Config {
        pass_acl_xattrs: true,
        ..Config::default()
    };
    let m = Mount::new(Kind::Tmpfs, cfg, Via::Device(2));
    let c = &m.client;
    let (e, _) = c.create(ROOT_ID, b"f", 0o600, RW, 0).unwrap();
    let a = reader_acl(1234);
    c.setxattr(e.nodeid, ACCESS, &a, 0).unwrap();
    assert_eq!(host_xattr(&m.path("f"), ACCESS).unwrap(), a);
    assert_eq!(names(c, e.nodeid), [ACCESS.to_vec()]);
    c.as_user(1234, 1234)
        .open(e.nodeid, libc::O_RDONLY as u32)
        .unwrap();
    assert_eq!(
        c.as_user(1235, 1235)
            .open(e.nodeid, libc::O_RDONLY as u32)
            .unwrap_err(),
        Errno(libc::EACCES)
    );
}

#[test]
fn an_acl_is_stored_on_the_host_and_sets_the_mode() {
    let m = acl_mount(init::POSIX_ACL).unwrap();
    let c = &m.client;
    let (e, _) = c.create(ROOT_ID, b"f", 0o600, RW, 0).unwrap();
    let a = reader_acl(1234);
    c.setxattr(e.nodeid, ACCESS, &a, 0).unwrap();
    assert_eq!(host_xattr(&m.path("f"), ACCESS).unwrap(), a);
    // The group class bits are now the mask's.
    let mode = std::fs::metadata(m.path("f")).unwrap().mode();
    assert_eq!(mode & 0o777, 0o640);
    assert_eq!(c.getattr(e.nodeid, None).unwrap().attr.mode & 0o777, 0o640);
    match c.getxattr(e.nodeid, ACCESS, 4096).unwrap() {
        Xattr::Data(d) => assert_eq!(d, a),
        other => panic!("{other:?}"),
    }
    // The user named in the ACL reads through the host's own check.
    let user = c.as_user(1234, 1234);
    let other = c.as_user(1235, 1235);
    user.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
    assert_eq!(
        other.open(e.nodeid, libc::O_RDONLY as u32).unwrap_err(),
        Errno(libc::EACCES)
    );
    c.removexattr(e.nodeid, ACCESS).unwrap();
    assert_eq!(host_xattr(&m.path("f"), ACCESS), None);
}

#[test]
fn the_clients_kill_sgid_flag_clears_setgid_before_the_acl() {
    let m = acl_mount(init::POSIX_ACL).unwrap();
    let c = &m.client;
    let a = acl(&[
        (USER_OBJ, 7, NONE),
        (USER, 5, 1234),
        (GROUP_OBJ, 5, NONE),
        (MASK, 7, NONE),
        (OTHER, 0, NONE),
    ]);
    for (name, ext, sgid_after) in [
        ("kill", flags::SETXATTR_ACL_KILL_SGID, false),
        ("keep", 0, true),
    ] {
        let (e, _) = c.create(ROOT_ID, name.as_bytes(), 0o644, RW, 0).unwrap();
        std::os::unix::fs::chown(m.path(name), Some(0), Some(4321)).unwrap();
        std::fs::set_permissions(m.path(name), std::fs::Permissions::from_mode(0o2750)).unwrap();
        // We are root with CAP_FSETID, so the host alone keeps the bit;
        // only the client's flag (its caller lacked CAP_FSETID) drops it.
        c.setxattr_ext(e.nodeid, ACCESS, &a, 0, ext).unwrap();
        let mode = std::fs::metadata(m.path(name)).unwrap().mode();
        assert_eq!(mode & libc::S_ISGID != 0, sgid_after, "{name}: {mode:o}");
        assert_eq!(mode & 0o777, 0o770, "{name}: the ACL set the mode");
        assert_eq!(host_xattr(&m.path(name), ACCESS).unwrap(), a);
    }
    // A refused ACL leaves the setgid bit where it was.
    let (e, _) = c.create(ROOT_ID, b"bad", 0o644, RW, 0).unwrap();
    std::os::unix::fs::chown(m.path("bad"), Some(0), Some(4321)).unwrap();
    std::fs::set_permissions(m.path("bad"), std::fs::Permissions::from_mode(0o2750)).unwrap();
    let kill = flags::SETXATTR_ACL_KILL_SGID;
    let bad = c.setxattr_ext(e.nodeid, ACCESS, b"not an acl", 0, kill);
    assert!(bad.is_err(), "{bad:?}");
    let mode = std::fs::metadata(m.path("bad")).unwrap().mode();
    assert_eq!(mode & 0o7777, 0o2750, "{mode:o}");
}

#[test]
fn a_default_acl_decides_a_new_files_mode_where_the_umask_would() {
    let m = acl_mount(init::POSIX_ACL).unwrap();
    let c = &m.client;
    let d = c.mkdir(ROOT_ID, b"d", 0o755, 0).unwrap();
    let dflt = acl(&[
        (USER_OBJ, 7, NONE),
        (USER, 7, 1234),
        (GROUP_OBJ, 5, NONE),
        (MASK, 7, NONE),
        (OTHER, 0, NONE),
    ]);
    c.setxattr(d.nodeid, DEFAULT, &dflt, 0).unwrap();
    // umask 077 is ignored under a default ACL: the file's ACL comes from
    // it, masked by the create mode (0666 -> mask rw-).
    c.create(d.nodeid, b"f", 0o666, RW, 0o077).unwrap();
    let md = std::fs::metadata(m.path("d/f")).unwrap();
    assert_eq!(md.mode() & 0o777, 0o660);
    assert!(host_xattr(&m.path("d/f"), ACCESS).is_some());
    // A new directory inherits the default ACL itself.
    c.mkdir(d.nodeid, b"sub", 0o777, 0o077).unwrap();
    assert_eq!(host_xattr(&m.path("d/sub"), DEFAULT).unwrap(), dflt);
    // Without a default ACL the umask applies.
    c.create(ROOT_ID, b"plain", 0o666, RW, 0o077).unwrap();
    assert_eq!(
        std::fs::metadata(m.path("plain")).unwrap().mode() & 0o777,
        0o600
    );
    assert_eq!(host_xattr(&m.path("plain"), ACCESS), None);
}
