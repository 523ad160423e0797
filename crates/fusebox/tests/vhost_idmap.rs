//! `--translate-uid` / `--translate-gid` as operators pass them: the
//! fusebox binary (default sandbox and seccomp filter) served over its
//! vhost-user socket to the engine acting as the guest
//! (virtio_fs::testing::frontend), with the guest's root translated to host uid
//! and gid 1000. What the guest makes is the host's 1000's, the guest sees
//! its own IDs, a chown from the guest lands as the host's IDs, and a
//! forbidden guest ID gets EPERM and changes nothing. Capabilities follow
//! the host uid: the guest's root as host 1000 (or squashed onto 65534)
//! keeps none, so it gives no file away and makes no device node; a
//! guest user translated to host root has root's.
//! (`passthrough/tests/id_translation.rs` has every mapping type, reply,
//! ACLs and each capability; `src/compat_tests.rs` the option syntax.)

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
    // Guest 200 is host root, that way only.
    let (d, fe) = vhost_support::start(
        "idmap-root",
        &[
            "--translate-uid",
            "map:0:1000:100",
            "--translate-uid=forbid-guest:666:1",
            "--translate-uid=guest:200:0:1",
            "--translate-gid",
            "map:0:1000:100",
            "--translate-gid=guest:200:0:1",
        ],
        // The share is the guest's root's: host 1000's.
        |share| std::os::unix::fs::chown(share, Some(1000), Some(1000)).unwrap(),
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

    // The guest's root, host 1000, gives no file away; host root does,
    // to the translated host IDs.
    assert_eq!(chown(c, f.nodeid, 5, 6), Err(Errno::EPERM));
    assert_eq!(owner(&host), (1000, 1000));
    let root = c.as_user(200, 200);
    assert_eq!(chown(&root, f.nodeid, 5, 6), Ok((5, 6)));
    assert_eq!(owner(&host), (1005, 1006));
    let a = c.getattr(f.nodeid, None).unwrap().attr;
    assert_eq!((a.uid, a.gid), (5, 6));

    // Host files show the guest's IDs.
    std::fs::write(d.share().join("h"), b"x").unwrap();
    std::os::unix::fs::chown(d.share().join("h"), Some(1042), Some(1043)).unwrap();
    let h = c.lookup(ROOT_ID, b"h").unwrap();
    assert_eq!((h.attr.uid, h.attr.gid), (42, 43));

    // A forbidden guest ID: EPERM, and nothing changes.
    assert_eq!(chown(&root, f.nodeid, 666, 6), Err(Errno::EPERM));
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
        "host uid 1007 may not write the share's root (host 1000's, 0755)"
    );
}

#[test]
fn a_guest_root_squashed_onto_another_uid_makes_no_device_node() {
    // The command line of issue 31's report: the guest's root is host
    // 65534 and keeps none of the daemon's capabilities, so MKNOD of a
    // block or character device gets EPERM (as from a host process of
    // 65534) and leaves nothing; a FIFO, which needs no capability, is
    // made. The share is writable by all, so only CAP_MKNOD decides.
    for sandbox in ["none", "namespace"] {
        let (d, fe) = vhost_support::start(
            &format!("idmap-squash-{sandbox}"),
            &[
                "--translate-uid",
                "squash-guest:0:65534:1",
                "--translate-gid",
                "squash-guest:0:65534:1",
                "--sandbox",
                sandbox,
            ],
            |share| {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(share, std::fs::Permissions::from_mode(0o777)).unwrap();
            },
        );
        let c = fe.client();
        for (kind, rdev, name) in [
            (libc::S_IFBLK, 8 << 8, "sda"),
            (libc::S_IFCHR, (1 << 8) | 3, "null"),
        ] {
            assert_eq!(
                c.mknod(ROOT_ID, name.as_bytes(), kind | 0o666, rdev, 0)
                    .unwrap_err(),
                Errno::EPERM,
                "{sandbox}: {name}"
            );
        }
        let left: Vec<_> = std::fs::read_dir(d.share())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "{sandbox}: {left:?} in the share");
        c.mknod(ROOT_ID, b"fifo", libc::S_IFIFO | 0o644, 0, 0)
            .unwrap();
        assert_eq!(owner(&d.share().join("fifo")), (65534, 65534), "{sandbox}");
    }
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
