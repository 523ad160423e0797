//! `DevFuse::detach_if_mounted_on`, which `fusebox mount` calls on a stop
//! signal and once its connection has ended, detaches only the very mount
//! it made: never a mount made on the path after ours was unmounted, even
//! one that got our dead superblock's device number (anonymous device
//! numbers are handed out again, lowest first), which the device number
//! alone could not tell from ours. Needs root (mounts).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use uring_ring::devfuse::{DevFuse, MountOptions};

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let c = CString::new(self.0.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path; whatever is still mounted goes.
        while unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {}
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(tag: &str) -> Dir {
    let p = std::env::temp_dir().join(format!("fusebox-detach-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&p).unwrap();
    Dir(p)
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// The device of the mount on `p`, without asking a FUSE server (none runs
/// here: INIT is never answered).
fn device(p: &Path) -> (u32, u32) {
    // SAFETY: statx is plain data; all zeroes is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let c = cpath(p);
    // SAFETY: a NUL-terminated path and `stx` valid for writes.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_STATX_DONT_SYNC,
            0,
            &mut stx,
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    (stx.stx_dev_major, stx.stx_dev_minor)
}

/// The type of the topmost mount on `p`, from /proc/self/mountinfo.
fn top_mount(p: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .filter(|l| l.split(' ').nth(4) == Some(p.to_str().unwrap()))
        .filter_map(|l| l.split(" - ").nth(1))
        .filter_map(|rest| rest.split(' ').next())
        .map(str::to_string)
        .next_back()
}

fn mount_tmpfs(p: &Path) {
    let c = cpath(p);
    // SAFETY: NUL-terminated strings; no data.
    let r = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            c.as_ptr(),
            c"tmpfs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
}

/// Lazily: a `df` elsewhere on the machine could hold the never
/// initialised FUSE mount for a moment.
fn umount(p: &Path) {
    let c = cpath(p);
    // SAFETY: a NUL-terminated path.
    let r = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
}

/// Whether the kernel gives unique mount ids (STATX_MNT_ID_UNIQUE, Linux
/// 6.8), without which the device number is all a mount is told by.
fn unique_mount_ids() -> bool {
    // SAFETY: statx is plain data; all zeroes is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and `stx` valid for writes.
    let r = unsafe { libc::statx(libc::AT_FDCWD, c"/".as_ptr(), 0, 0x4000, &mut stx) };
    r == 0 && stx.stx_mask & 0x4000 != 0
}

#[test]
fn detaches_its_own_mount_and_leaves_one_made_with_its_old_device_number() {
    // Its own: detached.
    let d = dir("own");
    let dev = DevFuse::mount(&d.0, &MountOptions::default()).unwrap();
    assert_eq!(top_mount(&d.0).as_deref(), Some("fuse.fusebox"));
    assert!(dev.detach_if_mounted_on(&d.0).unwrap());
    assert_eq!(top_mount(&d.0), None);
    drop(dev);

    if !unique_mount_ids() {
        eprintln!("no unique mount ids (Linux < 6.8): the device number decides; not tested");
        return;
    }
    // Unmounted from outside (its superblock goes; the connection lives on
    // in the /dev/fuse fd), then a tmpfs mounted there: tmpfs takes an
    // anonymous device number too, the lowest free one, which is ours
    // again unless some other mount took it in between (retried).
    let d = dir("reused");
    let mut reused = false;
    for _ in 0..20 {
        let dev = DevFuse::mount(&d.0, &MountOptions::default()).unwrap();
        let ours = device(&d.0);
        umount(&d.0);
        mount_tmpfs(&d.0);
        let theirs = device(&d.0);
        assert!(
            !dev.detach_if_mounted_on(&d.0).unwrap(),
            "{ours:?} {theirs:?}"
        );
        assert_eq!(top_mount(&d.0).as_deref(), Some("tmpfs"));
        umount(&d.0);
        if ours == theirs {
            reused = true;
            break;
        }
    }
    assert!(
        reused,
        "no tmpfs got the FUSE mount's old device number: nothing tested"
    );
}
