//! `--xattrmap` as operators pass it: the fusebox binary (default sandbox
//! and seccomp filter) over its vhost-user socket, the engine acting as
//! the guest (virtio_fs::testing::frontend). A guest's SELinux-style
//! `security.selinux` label lives on the host as
//! `user.virtiofs.security.selinux`, reads back and lists under its own
//! name; the host's own unmapped xattrs stay hidden from the guest; a
//! guest may not reach the mapped names directly; a renamed
//! `security.capability` goes when the file is written, as the host
//! kernel drops its own. (`passthrough/src/xattrmap.rs` has the
//! rule language's unit tests; `src/compat_tests.rs` the option's.)

use fuse_core::abi::Xattr;
use fuse_core::abi::ROOT_ID;
use fuse_core::Errno;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use vhost_support::Daemon;
use virtio_fs::testing::frontend::VhostFrontend;

mod vhost_support;

/// fusebox serving a fresh share with `--xattrmap RULES`, the guest
/// connected, and `f` made in the share beforehand with the host xattr
/// `user.host` (the host's own, not the guest's).
fn start(tag: &str, rules: &str) -> (Daemon, VhostFrontend, PathBuf) {
    let (d, fe) = vhost_support::start(&format!("xmap-{tag}"), &["--xattrmap", rules], |share| {
        std::fs::write(share.join("f"), b"data").unwrap();
        host_set(&share.join("f"), "user.host", b"h");
    });
    let share = d.share();
    (d, fe, share)
}

fn c(s: &str) -> CString {
    CString::new(s).unwrap()
}

fn path(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

fn host_set(p: &Path, name: &str, v: &[u8]) {
    // SAFETY: NUL-terminated strings; `v` is readable for its length.
    let r = unsafe {
        libc::setxattr(
            path(p).as_ptr(),
            c(name).as_ptr(),
            v.as_ptr().cast(),
            v.len(),
            0,
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
}

fn host_get(p: &Path, name: &str) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    // SAFETY: NUL-terminated strings; `buf` is writable for its length.
    let r = unsafe {
        libc::getxattr(
            path(p).as_ptr(),
            c(name).as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    (r >= 0).then(|| {
        buf.truncate(r as usize);
        buf
    })
}

fn names(r: Xattr) -> Vec<String> {
    let Xattr::Data(d) = r else { panic!("a size") };
    let mut v: Vec<String> = d
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8(n.to_vec()).unwrap())
        .collect();
    v.sort();
    v
}

#[test]
fn a_guests_security_label_lives_under_a_user_prefix_on_the_host() {
    let (_d, fe, share) = start("all", ":map::user.virtiofs.:");
    let cl = fe.client();
    let f = cl.lookup(ROOT_ID, b"f").unwrap().nodeid;
    let label = b"system_u:object_r:container_file_t:s0";
    cl.setxattr(f, b"security.selinux", label, 0).unwrap();
    let host = share.join("f");
    assert_eq!(
        host_get(&host, "user.virtiofs.security.selinux").as_deref(),
        Some(&label[..])
    );
    assert_ne!(
        host_get(&host, "security.selinux").as_deref(),
        Some(&label[..])
    );
    match cl.getxattr(f, b"security.selinux", 256).unwrap() {
        Xattr::Data(v) => assert_eq!(v, label),
        Xattr::Size(_) => panic!("a size"),
    }
    // The guest lists its own names only: the host's user.host is hidden.
    let listed = names(cl.listxattr(f, 4096).unwrap());
    assert_eq!(listed, ["security.selinux"]);
    // A size query agrees with the list.
    let Xattr::Size(n) = cl.listxattr(f, 0).unwrap() else {
        panic!("data")
    };
    assert_eq!(n as usize, "security.selinux\0".len());
    assert_eq!(
        cl.getxattr(f, b"user.host", 256).unwrap_err(),
        Errno(libc::ENODATA)
    );
    cl.removexattr(f, b"security.selinux").unwrap();
    assert_eq!(host_get(&host, "user.virtiofs.security.selinux"), None);
    assert_eq!(host_get(&host, "user.host").as_deref(), Some(&b"h"[..]));
}

#[test]
fn one_namespace_mapped_and_its_target_out_of_reach() {
    let (_d, fe, share) = start("one", "/map/security./user.virtiofs./");
    let cl = fe.client();
    let f = cl.lookup(ROOT_ID, b"f").unwrap().nodeid;
    cl.setxattr(f, b"security.selinux", b"l", 0).unwrap();
    cl.setxattr(f, b"user.plain", b"p", 0).unwrap();
    let host = share.join("f");
    assert_eq!(
        host_get(&host, "user.virtiofs.security.selinux").as_deref(),
        Some(&b"l"[..])
    );
    assert_eq!(host_get(&host, "user.plain").as_deref(), Some(&b"p"[..]));
    // The mapped names themselves: refused, whatever the guest's rights.
    assert_eq!(
        cl.setxattr(f, b"user.virtiofs.security.selinux", b"x", 0)
            .unwrap_err(),
        Errno::EPERM
    );
    assert_eq!(
        cl.getxattr(f, b"user.virtiofs.security.selinux", 256)
            .unwrap_err(),
        Errno::EPERM
    );
    let listed = names(cl.listxattr(f, 4096).unwrap());
    assert_eq!(listed, ["security.selinux", "user.host", "user.plain"]);
}

#[test]
fn a_renamed_security_capability_goes_when_the_file_is_written() {
    let (_d, fe, share) = start("caps", ":map::user.virtiofs.:");
    let cl = fe.client();
    let f = cl.lookup(ROOT_ID, b"f").unwrap().nodeid;
    let caps = [0u8; 20];
    cl.setxattr(f, b"security.capability", &caps, 0).unwrap();
    let host = share.join("f");
    assert!(host_get(&host, "user.virtiofs.security.capability").is_some());
    let o = cl.open(f, libc::O_RDWR as u32).unwrap();
    cl.write(f, o.fh, 0, b"new", 0).unwrap();
    cl.release(f, o.fh, libc::O_RDWR as u32).unwrap();
    assert_eq!(
        host_get(&host, "user.virtiofs.security.capability"),
        None,
        "kept after a write"
    );
    assert_eq!(
        cl.getxattr(f, b"security.capability", 256).unwrap_err(),
        Errno(libc::ENODATA)
    );
    // Set again, then a truncate: gone too.
    cl.setxattr(f, b"security.capability", &caps, 0).unwrap();
    let a = fuse_core::abi::SetattrIn {
        valid: fuse_core::abi::fattr::SIZE,
        size: 1,
        ..Default::default()
    };
    cl.setattr(f, &a).unwrap();
    assert_eq!(
        host_get(&host, "user.virtiofs.security.capability"),
        None,
        "kept after a truncate"
    );
}
