//! `--translate-uid` / `--translate-gid` as operators pass them: the
//! fusebox binary (default sandbox and seccomp filter) served over its
//! vhost-user socket to the engine acting as the guest
//! (virtio_fs::testing::frontend), with the guest's root translated to host uid
//! and gid 1000. What the guest makes is the host's 1000's, the guest sees
//! its own IDs, a chown from the guest lands as the host's IDs, and a
//! forbidden guest ID gets EPERM and changes nothing.
//! (`uring-ring/tests/id_translation.rs` has every mapping type, reply and
//! ACLs; `src/compat_tests.rs` the option syntax.)

use fuse_core::abi::{fattr, SetattrIn, ROOT_ID};
use fuse_core::client::Client;
use fuse_core::Errno;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use vhost_support::Daemon;
use virtio_fs::testing::frontend::VhostFrontend;

mod vhost_support;

/// fusebox serving a fresh share with `args`, and the guest connected.
fn start(tag: &str, args: &[&str]) -> (Daemon, VhostFrontend) {
    vhost_support::start(&format!("idmap-{tag}"), args, |_| {})
}

fn owner(p: &Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.uid(), m.gid())
}

fn chown(c: &Client, node: u64, uid: u32, gid: u32) -> Result<(u32, u32), Errno> {
    let sa = SetattrIn {
        valid: fattr::UID | fattr::GID,
        uid,
        gid,
        ..Default::default()
    };
    c.setattr(node, &sa).map(|a| (a.attr.uid, a.attr.gid))
}

const RW: u32 = libc::O_RDWR as u32;

#[test]
fn the_guests_root_acts_as_the_translated_host_ids() {
    let (d, fe) = start(
        "root",
        &[
            "--translate-uid",
            "map:0:1000:100",
            "--translate-uid=forbid-guest:666:1",
            "--translate-gid",
            "map:0:1000:100",
        ],
    );
    let c = fe.client();
    // Made by the guest's root: the host's 1000's; the guest sees 0.
    let (f, o) = c.create(ROOT_ID, b"f", 0o644, RW, 0).unwrap();
    c.write(f.nodeid, o.fh, 0, b"data", 0).unwrap();
    c.release(f.nodeid, o.fh, 0).unwrap();
    let host = d.share().join("f");
    assert_eq!(owner(&host), (1000, 1000));
    assert_eq!((f.attr.uid, f.attr.gid), (0, 0));
    let a = c.getattr(f.nodeid, None).unwrap().attr;
    assert_eq!((a.uid, a.gid), (0, 0));
    let m = c.mkdir(ROOT_ID, b"d", 0o755, 0).unwrap();
    assert_eq!(owner(&d.share().join("d")), (1000, 1000));
    assert_eq!((m.attr.uid, m.attr.gid), (0, 0));

    // chown from the guest: the translated host IDs.
    assert_eq!(chown(c, f.nodeid, 5, 6), Ok((5, 6)));
    assert_eq!(owner(&host), (1005, 1006));
    let a = c.getattr(f.nodeid, None).unwrap().attr;
    assert_eq!((a.uid, a.gid), (5, 6));

    // Host files show the guest's IDs.
    std::fs::write(d.share().join("h"), b"x").unwrap();
    std::os::unix::fs::chown(d.share().join("h"), Some(1042), Some(1043)).unwrap();
    let h = c.lookup(ROOT_ID, b"h").unwrap();
    assert_eq!((h.attr.uid, h.attr.gid), (42, 43));

    // A forbidden guest ID: EPERM, and nothing changes.
    assert_eq!(chown(c, f.nodeid, 666, 6), Err(Errno::EPERM));
    assert_eq!(owner(&host), (1005, 1006));
    let forbidden = c.as_user(666, 0);
    assert_eq!(
        forbidden.create(ROOT_ID, b"g", 0o644, RW, 0).unwrap_err(),
        Errno::EPERM
    );
    assert_eq!(
        forbidden.mkdir(ROOT_ID, b"e", 0o755, 0).unwrap_err(),
        Errno::EPERM
    );
    assert!(!d.share().join("g").exists() && !d.share().join("e").exists());
    // A guest user in the range: its translated host uid, no capabilities.
    let user = c.as_user(7, 7);
    assert_eq!(
        user.create(ROOT_ID, b"u", 0o644, RW, 0).unwrap_err(),
        Errno(libc::EACCES),
        "host uid 1007 may not write the share's root (host root's, 0755)"
    );
}

#[test]
fn without_translation_ids_pass_as_they_are() {
    let (d, fe) = start("none", &[]);
    let c = fe.client();
    let (f, o) = c.create(ROOT_ID, b"f", 0o644, RW, 0).unwrap();
    c.release(f.nodeid, o.fh, 0).unwrap();
    assert_eq!(owner(&d.share().join("f")), (0, 0));
    assert_eq!(chown(c, f.nodeid, 5, 6), Ok((5, 6)));
    assert_eq!(owner(&d.share().join("f")), (5, 6));
    assert_eq!(chown(c, f.nodeid, 666, 6), Ok((666, 6)));
}
