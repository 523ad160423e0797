//! Helpers of the host-mount tests: a share and a mountpoint, and the
//! `fusebox mount` daemon serving one on the other.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Dirs {
    base: PathBuf,
}

impl Dirs {
    pub fn new(tag: &str) -> Dirs {
        let base = std::env::temp_dir().join(format!("fusebox-host-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(base.join("share")).unwrap();
        std::fs::create_dir_all(base.join("mnt")).unwrap();
        Dirs { base }
    }
    pub fn share(&self) -> PathBuf {
        self.base.join("share")
    }
    pub fn mnt(&self) -> PathBuf {
        self.base.join("mnt")
    }
}

impl Drop for Dirs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.mnt())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

pub fn mounted(mnt: &Path) -> bool {
    let m = std::fs::read_to_string("/proc/mounts").unwrap();
    let want = format!(" {} fuse.fusebox ", mnt.display());
    m.contains(&want)
}

pub fn wait(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(10), "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn start(d: &Dirs) -> Child {
    start_with(d, &[])
}

pub fn start_with(d: &Dirs, extra: &[&str]) -> Child {
    let child = Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .arg("mount")
        .args(extra)
        .arg("--shared-dir")
        .arg(d.share())
        .arg(d.mnt())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait("mounted", || mounted(&d.mnt()));
    child
}

pub fn exits_cleanly(mut child: Child) {
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success(), "{st:?}");
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "daemon did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}
