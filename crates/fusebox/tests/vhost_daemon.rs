//! The vhost-user daemon as operators run it: `fusebox --socket-path ...
//! --shared-dir ...` served to the engine acting as the guest
//! (virtio_fs::testing::frontend), under each sandbox mode and the seccomp filter.
//! The serving process must have the shared directory as its root (and,
//! with `namespace`, mount and network namespaces of its own), serve the
//! guest, and exit cleanly when the frontend leaves.

use fuse_core::abi::ROOT_ID;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use virtio_fs::testing::frontend::{FrontendConfig, VhostFrontend};

mod vhost_support;

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
    vhost_support::child_of(started).unwrap_or(started)
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

/// Runs `f` on a thread of its own; None if it did not return in time.
fn within<T: Send + 'static>(d: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(d).ok()
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill with integer arguments.
    unsafe { libc::kill(child.id() as libc::pid_t, sig) };
}

/// Kills the daemon if a test fails before it exited (in namespace mode
/// its serving child dies with it: PR_SET_PDEATHSIG).
struct Reap(Child);
impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn exits_within(child: &mut Child, d: Duration) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if t.elapsed() > d {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the daemon did not exit within {d:?} of a stop signal");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What a guest can leave in its share for the daemon's next start: the
/// paths a confined daemon (or glibc in it) would resolve if it named them
/// by absolute path after the sandbox made the share its root, as FIFOs
/// (an open would block): /proc/self/fdinfo/N for every fd number,
/// /etc/localtime (glibc's time zone, for any local-time call), glibc malloc's
/// /proc/sys/vm/overcommit_memory.
fn plant_traps(share: &Path) {
    let fifo = |p: &Path| {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path that lives across the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0, "{p:?}");
    };
    for n in 0..=200 {
        fifo(&share.join(format!("proc/self/fdinfo/{n}")));
    }
    fifo(&share.join("etc/localtime"));
    fifo(&share.join("proc/sys/vm/overcommit_memory"));
}

#[test]
fn files_a_guest_planted_in_its_share_are_never_opened_by_the_daemon() {
    for (tag, sandbox) in [("plant-ns", "namespace"), ("plant-chroot", "chroot")] {
        let base = std::env::temp_dir().join(format!("fusebox-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let _dir = Dir(base.clone());
        let share = base.join("share");
        plant_traps(&share);
        let sock = base.join("vfs.sock");
        // --syslog: the log's path that reaches the most of libc (the log
        // itself stamps UTC); --rlimit-nofile below the hard limit: no
        // warning is logged before confinement.
        let child = Command::new(env!("CARGO_BIN_EXE_fusebox"))
            .arg("--socket-path")
            .arg(&sock)
            .arg("--shared-dir")
            .arg(&share)
            .args([
                "--xattr",
                "--syslog",
                "--rlimit-nofile",
                "4096",
                "--sandbox",
                sandbox,
            ])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut child = Reap(child);
        let t = Instant::now();
        while !sock.exists() {
            assert!(t.elapsed() < Duration::from_secs(10), "no socket");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Serving, with enough allocation churn on the serving threads for
        // their malloc heaps to shrink, and log lines.
        let served = within(Duration::from_secs(60), move || -> Result<(), String> {
            let fe = VhostFrontend::connect(&sock, &FrontendConfig::default())
                .map_err(|e| e.to_string())?;
            let c = fe.client();
            let big = vec![7u8; 512 * 1024];
            for i in 0..40 {
                let name = format!("f{i}");
                let (e, o) = c
                    .create(ROOT_ID, name.as_bytes(), 0o644, libc::O_RDWR as u32, 0)
                    .map_err(|e| format!("create: {e:?}"))?;
                c.write(e.nodeid, o.fh, 0, &big, 0)
                    .map_err(|e| format!("write: {e:?}"))?;
                c.read(e.nodeid, o.fh, 0, 512 * 1024)
                    .map_err(|e| format!("read: {e:?}"))?;
                c.release(e.nodeid, o.fh, 0)
                    .map_err(|e| format!("release: {e:?}"))?;
                c.unlink(ROOT_ID, name.as_bytes())
                    .map_err(|e| format!("unlink: {e:?}"))?;
            }
            drop(fe);
            Ok(())
        });
        assert_eq!(served, Some(Ok(())), "{sandbox}: the guest was not served");
        let status = exits_within(&mut child.0, Duration::from_secs(10));
        assert!(status.success(), "{sandbox}: {status:?}");
    }
}

#[test]
fn a_stop_signal_ends_the_daemon_while_its_start_is_blocked() {
    // The shared directory is on a FUSE mount that never answers: the
    // daemon blocks resolving it, before anything else.
    let base = std::env::temp_dir().join(format!("fusebox-stuckstart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let _dir = Dir(base.clone());
    let (src, mnt) = (base.join("src"), base.join("mnt"));
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    let mount = Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .arg("mount")
        .args([
            "--inject-faults",
            "lookup:hang,getattr:hang",
            "--shared-dir",
        ])
        .arg(&src)
        .arg(&mnt)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut mount = Reap(mount);
    // Whatever happens, the mount does not outlive the test.
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(mnt.clone());
    let t = Instant::now();
    while !std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .contains(&format!(" {} fuse", mnt.display()))
    {
        assert!(t.elapsed() < Duration::from_secs(10), "not mounted");
        std::thread::sleep(Duration::from_millis(10));
    }
    let child = Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .arg("--socket-path")
        .arg(base.join("vfs.sock"))
        .arg("--shared-dir")
        .arg(mnt.join("sub"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = Reap(child);
    std::thread::sleep(Duration::from_millis(500));
    assert!(child.0.try_wait().unwrap().is_none(), "blocked, not gone");
    signal(&child.0, libc::SIGTERM);
    let t = Instant::now();
    while child.0.try_wait().unwrap().is_none() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the daemon did not end on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The hung mount: abort it (two stop signals).
    signal(&mount.0, libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(200));
    signal(&mount.0, libc::SIGTERM);
    let _ = exits_within(&mut mount.0, Duration::from_secs(10));
}

/// What the daemon logs to stderr for a connect and disconnect at
/// `level` (the frontend leaves, the daemon exits).
fn logged_at(tag: &str, level: &str) -> String {
    use std::io::Read;
    let (_dir, _share, sock, mut child) = start(tag, &["--sandbox", "none", "--log-level", level]);
    let fe = VhostFrontend::connect(&sock, &FrontendConfig::default()).unwrap();
    fe.client().getattr(ROOT_ID, None).unwrap();
    drop(fe);
    assert!(exits_within(&mut child, Duration::from_secs(10)).success());
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    err
}

#[test]
fn log_lines_follow_the_log_level() {
    let info = logged_at("log-info", "info");
    for want in [
        "fusebox: sharing ",
        "fusebox: frontend connected",
        "fusebox: frontend disconnected",
    ] {
        assert!(info.contains(want), "{want:?} not in {info}");
    }
    // A multi-line message: each line of it carries the prefix.
    assert!(
        info.lines().all(|l| l.starts_with("fusebox: ")),
        "a line without the prefix in {info}"
    );
    let quiet = logged_at("log-error", "error");
    assert!(
        !quiet.contains("sharing") && !quiet.contains("frontend"),
        "{quiet}"
    );
}
