//! Helpers of the vhost-user daemon tests: the fusebox binary serving a
//! fresh share over its socket with the engine as the guest
//! (virtio_fs::testing::frontend), and the processes it makes.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use virtio_fs::testing::frontend::{FrontendConfig, VhostFrontend};

/// A daemon and its directory (share, socket, stderr log): killed and
/// removed when dropped.
pub struct Daemon {
    pub base: PathBuf,
    pub child: Child,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

impl Daemon {
    pub fn share(&self) -> PathBuf {
        self.base.join("share")
    }
}

/// fusebox serving a fresh share with `args` (`before` prepares the share
/// first), and the guest connected; its stderr is in `base/stderr`, shown
/// if it exits before the guest connects.
pub fn start(tag: &str, args: &[&str], before: impl FnOnce(&Path)) -> (Daemon, VhostFrontend) {
    start_with(tag, args, &FrontendConfig::default(), before)
}

/// [`start`] with the guest configured by `cfg`.
pub fn start_with(
    tag: &str,
    args: &[&str],
    cfg: &FrontendConfig,
    before: impl FnOnce(&Path),
) -> (Daemon, VhostFrontend) {
    start_bin(
        Path::new(env!("CARGO_BIN_EXE_fusebox")),
        tag,
        args,
        cfg,
        before,
    )
}

/// [`start_with`] for the daemon binary `bin` (fusebox, or another
/// daemon taking virtiofsd's options).
pub fn start_bin(
    bin: &Path,
    tag: &str,
    args: &[&str],
    cfg: &FrontendConfig,
    before: impl FnOnce(&Path),
) -> (Daemon, VhostFrontend) {
    let base = std::env::temp_dir().join(format!("fusebox-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let share = base.join("share");
    std::fs::create_dir_all(&share).unwrap();
    before(&share);
    let sock = base.join("vfs.sock");
    let log = base.join("stderr");
    let child = Command::new(bin)
        .arg("--socket-path")
        .arg(&sock)
        .arg("--shared-dir")
        .arg(&share)
        .args(args)
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut d = Daemon { base, child };
    let t = Instant::now();
    let fe = loop {
        match VhostFrontend::connect(&sock, cfg) {
            Ok(fe) => break fe,
            Err(e) => {
                if let Some(s) = d.child.try_wait().unwrap() {
                    let said = std::fs::read_to_string(&log).unwrap_or_default();
                    panic!("{} exited ({s}): {said}", bin.display());
                }
                assert!(t.elapsed() < Duration::from_secs(10), "{e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    (d, fe)
}

/// A child of process `parent` (the serving process of a daemon in
/// namespace mode), if it has one now.
pub fn child_of(parent: u32) -> Option<u32> {
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let ppid: u32 = after.split(' ').nth(1).unwrap().parse().unwrap();
        if ppid == parent {
            return Some(pid);
        }
    }
    None
}

/// The fusebox binary copied into a directory of its own under the
/// temporary directory, both mode 0755, for a test that runs it as another
/// user: that user may not reach the build's `target/` (a checkout in
/// root's 0700 home). Removed when dropped: keep it until the daemon has
/// started.
pub struct FuseboxCopy {
    dir: PathBuf,
}

impl FuseboxCopy {
    /// A fresh copy (`tag` names its directory).
    pub fn new(tag: &str) -> FuseboxCopy {
        use std::os::unix::fs::PermissionsExt;
        // A directory of its own, not one another user could have made at
        // a name known in advance (mktemp(1) makes it 0700, with a name
        // nobody guesses).
        let template = std::env::temp_dir().join(format!("fusebox-bin-{tag}.XXXXXX"));
        let out = Command::new("mktemp")
            .arg("-d")
            .arg(&template)
            .output()
            .unwrap();
        assert!(out.status.success(), "mktemp: {}", out.status);
        let dir = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim_end());
        let copy = FuseboxCopy { dir };
        // By cp(1), not from this process: a child another test forks while
        // this one had the copy open for writing would hold it so until its
        // exec, and an exec of the copy meanwhile fails with ETXTBSY.
        let status = Command::new("cp")
            .arg(env!("CARGO_BIN_EXE_fusebox"))
            .arg(copy.path())
            .status()
            .unwrap();
        assert!(status.success(), "cp: {status}");
        for p in [&copy.dir, &copy.path()] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        copy
    }

    /// The copy.
    pub fn path(&self) -> PathBuf {
        self.dir.join("fusebox")
    }
}

impl Drop for FuseboxCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
