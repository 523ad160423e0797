//! Helpers of the host-mount tests: a share and a mountpoint, and the
//! `fusebox mount` daemon serving one on the other.
#![allow(dead_code)]

pub mod depth;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
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
        // Every mount stacked there (a test may mount over the FUSE mount),
        // so that removing the tree never reaches into one.
        for _ in 0..4 {
            if top_mount(&self.mnt()).is_none() {
                break;
            }
            let _ = detach(&self.mnt());
        }
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// The filesystem type of the topmost mount on `mnt` in this namespace.
pub fn top_mount(mnt: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = mnt.to_str().unwrap();
    info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let sep = f.iter().position(|x| *x == "-")?;
        (f.get(4) == Some(&want)).then(|| f[sep + 1].to_string())
    })
}

/// Detaches the topmost mount on `mnt` (`umount -l`, MNT_DETACH) without
/// touching the mounted filesystem, which may be waiting for its server.
pub fn detach(mnt: &Path) -> std::io::Result<()> {
    let c = std::ffi::CString::new(mnt.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path that outlives the call.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Mounts a tmpfs on `mnt` (over whatever is there).
pub fn mount_tmpfs(mnt: &Path) {
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "fusebox-test"])
        .arg(mnt)
        .status()
        .unwrap();
    assert!(st.success());
}

/// The fusectl directory of the FUSE mount on `mnt`
/// (/sys/fs/fuse/connections/<its device>), fusectl mounted if need be.
pub fn fusectl_connection(mnt: &Path) -> PathBuf {
    let conns = Path::new("/sys/fs/fuse/connections");
    let m = std::fs::read_to_string("/proc/mounts").unwrap();
    if !m.lines().any(|l| l.starts_with("fusectl ")) {
        // Another test may be mounting it at the same time: the check that
        // follows tells.
        let _ = Command::new("mount")
            .args(["-t", "fusectl", "fusectl"])
            .arg(conns)
            .stderr(Stdio::null())
            .status();
    }
    let dev = std::os::unix::fs::MetadataExt::dev(&std::fs::metadata(mnt).unwrap());
    // fusectl names it by the kernel's encoding of the device number.
    let c = conns.join(((libc::major(dev) << 20) | libc::minor(dev)).to_string());
    assert!(c.exists(), "{} missing", c.display());
    c
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

pub fn exits_cleanly(child: Child) {
    exits_cleanly_within(child, Duration::from_secs(10));
}

pub fn exits_cleanly_within(child: Child, limit: Duration) {
    let st = exit_within(child, limit);
    assert!(st.is_some_and(|s| s.success()), "{st:?} within {limit:?}");
}

/// Waits up to `limit` for the daemon to exit: its status, or None (it is
/// killed then).
pub fn exit_within(mut child: Child, limit: Duration) -> Option<ExitStatus> {
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Asserts the daemon is still running after `d`.
pub fn still_running(child: &mut Child, d: Duration) {
    std::thread::sleep(d);
    assert!(child.try_wait().unwrap().is_none(), "the daemon exited");
}

pub fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}
