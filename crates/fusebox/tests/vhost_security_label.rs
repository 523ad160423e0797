//! `--security-label` and `--modcaps` as operators pass them: the fusebox
//! binary (default sandbox and seccomp filter) over its vhost-user
//! socket, the engine acting as a guest whose LSM labels what it creates
//! (it offers FUSE_SECURITY_CTX and sends the label extension after the
//! arguments of CREATE, MKDIR, MKNOD, SYMLINK and TMPFILE, as the Linux
//! kernel does). The label lands on the host inode under the name
//! --xattrmap gives it and reads back through GETXATTR under the guest's name; a
//! label that cannot be set undoes the creation; a malformed extension
//! gets EINVAL (or EIO, when its length runs past the request) and the
//! daemon goes on serving. `--modcaps=-chown` leaves every thread of the
//! serving process without CAP_CHOWN, so a guest root's chown fails.
//! (`fuse-core/tests/secctx.rs` has the decoder's and the dispatcher's
//! tests, `src/compat_tests.rs` the options'.)

use fuse_core::abi::Xattr;
use fuse_core::abi::{encode, encode::Body, *};
use fuse_core::client::Client;
use fuse_core::{Args, Errno};
use std::ffi::CString;
use std::path::{Path, PathBuf};
use vhost_support::Daemon;
use virtio_fs::testing::frontend::{FrontendConfig, VhostFrontend};
use zerocopy::FromBytes;

mod vhost_support;

const NAME: &[u8] = b"security.selinux";
const LABEL: &[u8] = b"system_u:object_r:container_file_t:s0\0";

/// A guest whose kernel offers FUSE_SECURITY_CTX.
fn labelling_guest() -> FrontendConfig {
    FrontendConfig {
        offer_flags: init::SECURITY_CTX,
        ..FrontendConfig::default()
    }
}

fn start(tag: &str, args: &[&str]) -> (Daemon, VhostFrontend, PathBuf) {
    let (d, fe) =
        vhost_support::start_with(&format!("seclabel-{tag}"), args, &labelling_guest(), |_| {});
    let share = d.share();
    (d, fe, share)
}

/// The host xattr `name` of `p` itself (a symlink not followed).
fn host_get(p: &Path, name: &str) -> Option<Vec<u8>> {
    let path = CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let name = CString::new(name).unwrap();
    let mut buf = vec![0u8; 256];
    // SAFETY: NUL-terminated strings; `buf` is writable for its length.
    let r = unsafe {
        libc::lgetxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    (r >= 0).then(|| {
        buf.truncate(r as usize);
        buf
    })
}

/// A creating request `op` for `name` in the root, as a guest kernel with
/// an LSM sends it: the op's arguments, then `ext` (total_extlen set from
/// its length, or `extlen` when given). Returns the new node id.
fn make(
    cl: &Client,
    op: Opcode,
    name: &[u8],
    ext: &[u8],
    extlen: Option<u16>,
) -> Result<u64, Errno> {
    let (body, out) = match op {
        Opcode::Mkdir => (
            Body::new()
                .push(&MkdirIn {
                    mode: 0o755,
                    umask: 0o022,
                })
                .cstr(name),
            std::mem::size_of::<EntryOut>(),
        ),
        Opcode::Mknod => (
            Body::new()
                .push(&MknodIn {
                    mode: libc::S_IFIFO | 0o644,
                    ..Default::default()
                })
                .cstr(name),
            std::mem::size_of::<EntryOut>(),
        ),
        Opcode::Symlink => (
            Body::new().cstr(name).cstr(b"target"),
            std::mem::size_of::<EntryOut>(),
        ),
        Opcode::Create | Opcode::Tmpfile => (
            Body::new()
                .push(&CreateIn {
                    flags: libc::O_RDWR as u32,
                    mode: libc::S_IFREG | 0o644,
                    umask: 0o022,
                    open_flags: 0,
                })
                .cstr(name),
            std::mem::size_of::<EntryOut>() + std::mem::size_of::<OpenOut>(),
        ),
        _ => unreachable!(),
    };
    let mut args = Args::new(op, ROOT_ID)
        .body(body.bytes(ext).into_vec())
        .out(out, false)
        .creds(0, 0, 1);
    args.total_extlen = extlen.unwrap_or((ext.len() / 8) as u16);
    let r = cl.chan().send(args)?;
    let (e, _) = EntryOut::read_from_prefix(&r.data).map_err(|_| Errno::EPROTO)?;
    Ok(e.nodeid)
}

fn guest_label(cl: &Client, node: u64) -> Vec<u8> {
    match cl.getxattr(node, NAME, 256).unwrap() {
        Xattr::Data(v) => v,
        Xattr::Size(_) => panic!("a size"),
    }
}

#[test]
fn a_new_inodes_label_lands_under_its_mapped_name_and_reads_back() {
    let (_d, fe, share) = start(
        "user",
        &["--security-label", "--xattrmap", ":map::user.virtiofs.:"],
    );
    let cl = fe.client();
    let ext = encode::secctx_ext(NAME, LABEL);
    for (op, name) in [(Opcode::Create, "f"), (Opcode::Mkdir, "d")] {
        let node = make(cl, op, name.as_bytes(), &ext, None).unwrap();
        assert_eq!(
            host_get(&share.join(name), "user.virtiofs.security.selinux").as_deref(),
            Some(LABEL),
            "{op:?}"
        );
        assert_eq!(host_get(&share.join(name), "security.selinux"), None);
        assert_eq!(guest_label(cl, node), LABEL, "{op:?}");
    }
    // A TMPFILE's nameless inode too.
    let node = make(cl, Opcode::Tmpfile, b"/", &ext, None).unwrap();
    assert_eq!(guest_label(cl, node), LABEL);
    // A node and a symlink cannot carry user.* xattrs on the host: the
    // label cannot be set, so nothing is made and the guest gets why.
    for (op, name) in [(Opcode::Mknod, "p"), (Opcode::Symlink, "l")] {
        assert_eq!(
            make(cl, op, name.as_bytes(), &ext, None).unwrap_err(),
            Errno::EPERM,
            "{op:?}"
        );
        assert!(
            std::fs::symlink_metadata(share.join(name)).is_err(),
            "{op:?}: left on the host"
        );
    }
    // Without a label (nr_secctx 0, no LSM label): made, unlabelled.
    let none = Body::new()
        .push(&SecctxHeader {
            size: 8,
            nr_secctx: 0,
        })
        .into_vec();
    let node = make(cl, Opcode::Mkdir, b"plain", &none, None).unwrap();
    assert_eq!(
        cl.getxattr(node, NAME, 256).unwrap_err(),
        Errno(libc::ENODATA)
    );
}

#[test]
fn every_kind_of_inode_is_labelled_under_a_trusted_name() {
    // virtiofsd's README setup: trusted.* names, which a daemon running
    // as root may set on symlinks and nodes too.
    let (_d, fe, share) = start(
        "trusted",
        &[
            "--security-label",
            "--xattrmap",
            ":map:security.selinux:trusted.virtiofs.:",
        ],
    );
    let cl = fe.client();
    let ext = encode::secctx_ext(NAME, LABEL);
    for (op, name) in [
        (Opcode::Create, "f"),
        (Opcode::Mkdir, "d"),
        (Opcode::Mknod, "p"),
        (Opcode::Symlink, "l"),
    ] {
        let node = make(cl, op, name.as_bytes(), &ext, None).unwrap();
        assert_eq!(
            host_get(&share.join(name), "trusted.virtiofs.security.selinux").as_deref(),
            Some(LABEL),
            "{op:?}"
        );
        assert_eq!(guest_label(cl, node), LABEL, "{op:?}");
    }
}

#[test]
fn labels_only_with_the_option_and_only_lsm_names() {
    // Without --security-label the extension is not negotiated: ignored.
    let (_d, fe, share) = start("off", &["--xattrmap", ":map::user.virtiofs.:"]);
    let cl = fe.client();
    let ext = encode::secctx_ext(NAME, LABEL);
    make(cl, Opcode::Mkdir, b"d", &ext, None).unwrap();
    assert_eq!(
        host_get(&share.join("d"), "user.virtiofs.security.selinux"),
        None
    );
    drop(fe);
    // A name no LSM uses: refused, nothing made.
    let (_d2, fe, share) = start(
        "names",
        &["--security-label", "--xattrmap", ":map::user.virtiofs.:"],
    );
    let cl = fe.client();
    for name in [&b"security.capability"[..], b"trusted.x", b"user.x"] {
        let ext = encode::secctx_ext(name, b"v");
        assert_eq!(
            make(cl, Opcode::Create, b"f", &ext, None).unwrap_err(),
            Errno::EPERM
        );
        assert!(!share.join("f").exists());
    }
}

#[test]
fn a_malformed_extension_gets_a_clean_errno_and_serving_goes_on() {
    let (mut d, fe, share) = start(
        "bad",
        &["--security-label", "--xattrmap", ":map::user.virtiofs.:"],
    );
    let cl = fe.client();
    let mut two = encode::secctx_ext(NAME, LABEL);
    two[4] = 2; // two labels claimed
    let mut long = encode::secctx_ext(NAME, LABEL);
    long[8] = 0xff; // a label longer than the extension
    for (i, bad) in [two, long].iter().enumerate() {
        for op in [
            Opcode::Create,
            Opcode::Mkdir,
            Opcode::Mknod,
            Opcode::Symlink,
        ] {
            let name = format!("bad{i}{op:?}");
            assert_eq!(
                make(cl, op, name.as_bytes(), bad, None).unwrap_err(),
                Errno::EINVAL,
                "{op:?}"
            );
            assert!(std::fs::symlink_metadata(share.join(&name)).is_err());
        }
    }
    // total_extlen past the request: undecodable, EIO.
    let ext = encode::secctx_ext(NAME, LABEL);
    assert_eq!(
        make(cl, Opcode::Mkdir, b"past", &ext, Some(200)).unwrap_err(),
        Errno::EIO
    );
    // Still serving, and still labelling.
    let node = make(cl, Opcode::Mkdir, b"good", &ext, None).unwrap();
    assert_eq!(guest_label(cl, node), LABEL);
    assert!(d.child.try_wait().unwrap().is_none(), "the daemon exited");
}

#[test]
fn always_refuses_a_guest_that_cannot_label_and_auto_serves_it() {
    let base = std::env::temp_dir().join(format!("fusebox-seclabel-neg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(base.join("share")).unwrap();
    for (mode, connects) in [
        ("--security-label=always", false),
        ("--security-label=auto", true),
    ] {
        let sock = base.join(format!("{mode}.sock"));
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_fusebox"))
            .arg("--socket-path")
            .arg(&sock)
            .arg("--shared-dir")
            .arg(base.join("share"))
            .arg(mode)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let t = std::time::Instant::now();
        let r = loop {
            match VhostFrontend::connect(&sock, &FrontendConfig::default()) {
                Err(virtio_fs::testing::frontend::FrontendError::Init(e)) => break Err(e),
                Ok(fe) => break Ok(fe),
                Err(e) => {
                    assert!(t.elapsed().as_secs() < 10, "{e}");
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
        };
        match r {
            Ok(fe) => {
                assert!(connects, "{mode}: connected");
                fe.client().mkdir(ROOT_ID, b"d", 0o755, 0).unwrap();
            }
            Err(e) => {
                assert!(!connects, "{mode}: {e:?}");
                assert_eq!(e, Errno(libc::EPROTO), "{mode}");
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    let _ = std::fs::remove_dir_all(&base);
}

/// A capability set of `/proc/PID/task/TID/status` (`CapEff`...).
fn cap_set(status: &str, which: &str) -> u64 {
    let line = status
        .lines()
        .find(|l| l.starts_with(which))
        .unwrap_or_else(|| panic!("no {which}"));
    u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
}

/// Each thread's (effective, permitted, bounding) sets of process `pid`.
fn thread_caps(pid: u32) -> Vec<(u64, u64, u64)> {
    let mut v = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let Ok(s) = std::fs::read_to_string(t.path().join("status")) else {
            continue;
        };
        v.push((
            cap_set(&s, "CapEff:"),
            cap_set(&s, "CapPrm:"),
            cap_set(&s, "CapBnd:"),
        ));
    }
    v
}

/// CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_SYS_ADMIN (capabilities(7)).
const CHOWN: u64 = 1 << 0;
const DAC_OVERRIDE: u64 = 1 << 1;
const SYS_ADMIN: u64 = 1 << 21;

/// A file made by guest root, then chowned to 1234.
fn guest_chown(cl: &Client) -> Result<(), Errno> {
    let (e, o) = cl
        .create(
            ROOT_ID,
            b"owned",
            libc::S_IFREG | 0o644,
            libc::O_RDWR as u32,
            0,
        )
        .unwrap();
    cl.release(e.nodeid, o.fh, libc::O_RDWR as u32).unwrap();
    let a = SetattrIn {
        valid: fattr::UID,
        uid: 1234,
        ..Default::default()
    };
    cl.setattr(e.nodeid, &a).map(drop)
}

#[test]
fn modcaps_changes_what_the_serving_process_keeps() {
    // Without --modcaps: everything it was started with, CAP_CHOWN too.
    let (d, fe) = vhost_support::start("modcaps-none", &[], |_| {});
    let serving = vhost_support::child_of(d.child.id()).expect("no serving process");
    for (eff, _, _) in thread_caps(serving) {
        assert_ne!(eff & CHOWN, 0);
    }
    guest_chown(fe.client()).unwrap();
    drop(fe);
    drop(d);
    // -chown: gone from every thread's sets, bounding set included; the
    // rest of virtiofsd's set stays, what is not in it goes.
    let (d, fe) = vhost_support::start("modcaps-chown", &["--modcaps=-chown"], |_| {});
    let serving = vhost_support::child_of(d.child.id()).expect("no serving process");
    let threads = thread_caps(serving);
    assert!(threads.len() > 1, "{threads:?}");
    let mut with_dac = 0;
    for (eff, prm, bnd) in &threads {
        assert_eq!((eff | prm | bnd) & CHOWN, 0, "{threads:?}");
        assert_eq!((eff | prm | bnd) & SYS_ADMIN, 0, "{threads:?}");
        if eff & DAC_OVERRIDE != 0 {
            with_dac += 1;
        }
    }
    // Every thread but the signal thread (which keeps nothing).
    assert!(with_dac >= threads.len() - 1, "{threads:?}");
    assert_eq!(guest_chown(fe.client()).unwrap_err(), Errno::EPERM);
    drop(fe);
    drop(d);
    // +sys_admin: kept on top of the set.
    let (d, _fe) = vhost_support::start("modcaps-admin", &["--modcaps=+sys_admin"], |_| {});
    let serving = vhost_support::child_of(d.child.id()).expect("no serving process");
    let threads = thread_caps(serving);
    let main = threads
        .iter()
        .filter(|(e, _, _)| e & SYS_ADMIN != 0)
        .count();
    assert!(main >= threads.len() - 1, "{threads:?}");
}

#[test]
fn an_unknown_capability_is_an_error_at_start() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .args([
            "--socket-path=/nonexistent/s",
            "--shared-dir=/",
            "--modcaps=+nosuch",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("unknown capability \"nosuch\""), "{said}");
}
