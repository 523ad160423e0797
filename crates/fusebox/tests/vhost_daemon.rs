//! The vhost-user daemon as operators run it: `fusebox --socket-path ...
//! --shared-dir ...` served to the engine acting as the guest
//! (virtio_fs::frontend), under each sandbox mode and the seccomp filter.
//! The serving process must have the shared directory as its root (and,
//! with `namespace`, mount and network namespaces of its own), serve the
//! guest, and exit cleanly when the frontend leaves.

use fuse_core::abi::ROOT_ID;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use virtio_fs::frontend::{FrontendConfig, VhostFrontend};

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn start(tag: &str, args: &[&str]) -> (Dir, PathBuf, PathBuf, Child) {
    let base = std::env::temp_dir().join(format!("fusebox-vhost-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let share = base.join("share");
    std::fs::create_dir_all(&share).unwrap();
    let sock = base.join("vfs.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .arg("--socket-path")
        .arg(&sock)
        .arg("--shared-dir")
        .arg(&share)
        .arg("--xattr")
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !sock.exists() {
        assert!(t.elapsed() < Duration::from_secs(10), "no socket");
        std::thread::sleep(Duration::from_millis(10));
    }
    (Dir(base), share, sock, child)
}

/// The process that serves: the started one, or its child in namespace mode.
fn server_pid(started: u32) -> u32 {
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let ppid: u32 = after.split(' ').nth(1).unwrap().parse().unwrap();
        if ppid == started {
            return pid;
        }
    }
    started
}

fn link(pid: u32, what: &str) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/{what}")).unwrap()
}

fn serve_and_check(tag: &str, args: &[&str], confined: bool, own_ns: bool) {
    let (_dir, share, sock, mut child) = start(tag, args);
    let fe = VhostFrontend::connect(&sock, &FrontendConfig::default()).unwrap();
    let pid = if own_ns {
        server_pid(child.id())
    } else {
        child.id()
    };
    // The magic link reaches the serving process's root even when its
    // path means nothing here (another mount namespace): compare inodes.
    use std::os::unix::fs::MetadataExt;
    let root = std::fs::metadata(format!("/proc/{pid}/root")).unwrap();
    let share = share.canonicalize().unwrap();
    let want = std::fs::metadata(if confined {
        share.as_path()
    } else {
        Path::new("/")
    })
    .unwrap();
    assert_eq!(
        (root.dev(), root.ino()),
        (want.dev(), want.ino()),
        "the serving process's root"
    );
    for ns in ["mnt", "net"] {
        let differs =
            link(pid, &format!("ns/{ns}")) != link(std::process::id(), &format!("ns/{ns}"));
        assert_eq!(differs, own_ns, "{ns} namespace");
    }
    // Serving works in the sandbox, xattrs included (fd-relative calls).
    let c = fe.client();
    let (f, o) = c
        .create(ROOT_ID, b"made-in-guest", 0o644, libc::O_RDWR as u32, 0)
        .unwrap();
    c.write(f.nodeid, o.fh, 0, b"hello", 0).unwrap();
    c.setxattr(f.nodeid, b"user.k", b"v", 0).unwrap();
    c.release(f.nodeid, o.fh, 0).unwrap();
    assert_eq!(
        std::fs::read(share.join("made-in-guest")).unwrap(),
        b"hello"
    );
    assert_eq!(
        c.lookup(ROOT_ID, b"..").unwrap().nodeid,
        ROOT_ID,
        "'..' of the root stays the root"
    );
    drop(fe);
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the daemon did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
}

#[test]
fn no_sandbox() {
    serve_and_check(
        "none",
        &["--sandbox", "none", "--seccomp", "none"],
        false,
        false,
    );
}

#[test]
fn the_defaults_are_virtiofsds_namespace_and_kill() {
    serve_and_check("default", &[], true, true);
}

#[test]
fn chroot_sandbox_with_seccomp() {
    serve_and_check(
        "chroot",
        &["--sandbox", "chroot", "--seccomp", "kill"],
        true,
        false,
    );
}

#[test]
fn namespace_sandbox_with_seccomp() {
    serve_and_check(
        "ns",
        &["--sandbox", "namespace", "--seccomp", "kill"],
        true,
        true,
    );
}

#[test]
fn mandatory_file_handles_refuse_a_filesystem_without_them() {
    // procfs gives no file handles; tmp directories here do.
    let dir = std::env::temp_dir().join(format!("fusebox-fh-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _d = Dir(dir.clone());
    let out = Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .args(["--socket-path"])
        .arg(dir.join("s.sock"))
        .args([
            "--shared-dir",
            "/proc/sys",
            "--inode-file-handles=mandatory",
        ])
        .args(["--sandbox", "none"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("gives no file handles"), "{err}");
}

#[test]
fn posix_acl_modes_as_virtiofsd() {
    let caps = Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .arg("--print-capabilities")
        .output()
        .unwrap();
    let caps = String::from_utf8(caps.stdout).unwrap();
    assert!(caps.contains("\"posix-acl-negotiation-mode\""), "{caps}");
    // fusebox-load's engine, like a guest kernel without ACL support, does
    // not offer FUSE_POSIX_ACL: `always` refuses it, `auto` serves it.
    let quiet = ["--sandbox", "none", "--seccomp", "none"];
    for (mode, served) in [("--posix-acl", false), ("--posix-acl=auto", true)] {
        let tag = if served { "aclauto" } else { "aclalways" };
        let (_d, _share, sock, mut child) = start(tag, &[&[mode][..], &quiet[..]].concat());
        let fe = VhostFrontend::connect(&sock, &FrontendConfig::default());
        assert_eq!(fe.is_ok(), served, "{mode}: {:?}", fe.as_ref().err());
        drop(fe);
        let _ = child.kill();
        let _ = child.wait();
    }
}
