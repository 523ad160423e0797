//! The `fusebox mount` binary against the host kernel: it mounts, serves,
//! and leaves cleanly on SIGINT/SIGTERM or an outside unmount; a killed
//! daemon leaves an aborted connection (ENOTCONN), never a hung one.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Dirs {
    base: PathBuf,
}

impl Dirs {
    fn new(tag: &str) -> Dirs {
        let base = std::env::temp_dir().join(format!("fusebox-host-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(base.join("share")).unwrap();
        std::fs::create_dir_all(base.join("mnt")).unwrap();
        Dirs { base }
    }
    fn share(&self) -> PathBuf {
        self.base.join("share")
    }
    fn mnt(&self) -> PathBuf {
        self.base.join("mnt")
    }
}

impl Drop for Dirs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.mnt()).status();
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

fn mounted(mnt: &Path) -> bool {
    let m = std::fs::read_to_string("/proc/mounts").unwrap();
    let want = format!(" {} fuse.fusebox ", mnt.display());
    m.contains(&want)
}

fn wait(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(10), "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn start(d: &Dirs) -> Child {
    start_with(d, &[])
}

fn start_with(d: &Dirs, extra: &[&str]) -> Child {
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

fn exits_cleanly(mut child: Child) {
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

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

#[test]
fn serves_files_and_unmounts_on_sigterm_and_sigint() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let d = Dirs::new(&format!("sig{sig}"));
        let child = start(&d);
        std::fs::write(d.mnt().join("f"), b"through the kernel").unwrap();
        assert_eq!(
            std::fs::read(d.share().join("f")).unwrap(),
            b"through the kernel"
        );
        signal(&child, sig);
        exits_cleanly(child);
        assert!(!mounted(&d.mnt()));
    }
}

#[test]
fn an_outside_unmount_ends_the_daemon() {
    let d = Dirs::new("outside");
    let child = start(&d);
    assert!(Command::new("umount")
        .arg(d.mnt())
        .status()
        .unwrap()
        .success());
    exits_cleanly(child);
}

#[test]
fn a_killed_daemon_leaves_an_aborted_connection() {
    let d = Dirs::new("killed");
    let mut child = start(&d);
    std::fs::write(d.mnt().join("f"), b"x").unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    // The mount is still there, but every access fails at once.
    let t = Instant::now();
    let err = std::fs::read(d.mnt().join("f")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN));
    assert!(t.elapsed() < Duration::from_secs(2));
}

#[test]
fn serves_over_the_kernels_fuse_over_io_uring() {
    let d = Dirs::new("uring");
    let child = start_with(&d, &["--io-uring"]);
    assert_eq!(
        std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
            .unwrap()
            .trim(),
        "Y"
    );
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(d.mnt().join("big"), &data).unwrap();
    assert_eq!(std::fs::read(d.mnt().join("big")).unwrap(), data);
    assert_eq!(std::fs::read(d.share().join("big")).unwrap(), data);
    std::fs::create_dir(d.mnt().join("dir")).unwrap();
    std::fs::rename(d.mnt().join("big"), d.mnt().join("dir/moved")).unwrap();
    assert!(d.share().join("dir/moved").exists());
    signal(&child, libc::SIGTERM);
    exits_cleanly(child);
    assert!(!mounted(&d.mnt()));
}

#[test]
fn a_second_signal_aborts_a_busy_mount() {
    // A file open on the mount keeps the lazy unmount of the first signal
    // from finishing; the second signal aborts the connection.
    let d = Dirs::new("busy");
    let child = start(&d);
    std::fs::write(d.mnt().join("f"), b"x").unwrap();
    let held = std::fs::File::open(d.mnt().join("f")).unwrap();
    signal(&child, libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(300));
    let mut child = child;
    assert!(child.try_wait().unwrap().is_none(), "busy: still serving");
    signal(&child, libc::SIGTERM);
    exits_cleanly(child);
    let mut buf = [0u8; 1];
    let err = std::os::unix::fs::FileExt::read_at(&held, &mut buf, 0).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN));
}
