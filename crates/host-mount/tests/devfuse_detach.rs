//! `DevFuse::detach_own_mount`, which `fusebox mount` calls on a stop
//! signal and once its connection has ended, detaches only the very mount
//! it made: never a mount made on the path after ours was unmounted, even
//! one that got our dead superblock's device number (anonymous device
//! numbers are handed out again, lowest first), which the device number
//! alone could not tell from ours; and never another mount that a
//! directory on the mount point's path, swapped for a symlink or renamed,
//! leads to.
//! Each is tried with the mount made through a mount fd and with mount(2),
//! and with the unique mount id (Linux 6.8) and without it (the device
//! number alone, as before 6.8). Needs root (mounts).

use host_mount::devfuse::{DevFuse, MountOptions};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The ways a mount is made and told: through a mount fd or with
/// mount(2); with its unique mount id or by its device alone.
const WAYS: [(bool, bool); 4] = [(false, false), (false, true), (true, false), (true, true)];

/// A mount on `p` made by mount(2) (`mount2`) or through a mount fd, told
/// by its device alone (`device_only`) or also by its unique mount id.
fn mount(p: &Path, mount2: bool, device_only: bool) -> DevFuse {
    let opts = MountOptions::default();
    let mut dev = if mount2 {
        DevFuse::mount_with_mount2(p, &opts)
    } else {
        DevFuse::mount(p, &opts)
    }
    .unwrap();
    if device_only {
        dev.forget_unique_mount_id();
    }
    dev
}

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        // Whatever is still mounted on it or below it goes (deepest first).
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mut points: Vec<&str> = info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|p| Path::new(p).starts_with(&self.0))
            .collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for p in points {
            let c = CString::new(p).unwrap();
            // SAFETY: a NUL-terminated path.
            while unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {}
        }
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
    for (mount2, device_only) in WAYS {
        let way = format!("mount(2) {mount2}, device only {device_only}");
        // Its own: detached.
        let d = dir("own");
        let dev = mount(&d.0, mount2, device_only);
        assert_eq!(top_mount(&d.0).as_deref(), Some("fuse.fusebox"), "{way}");
        assert!(dev.detach_own_mount().unwrap(), "{way}");
        assert_eq!(top_mount(&d.0), None, "{way}");
        drop(dev);
        drop(d);
        // Reached through a symlink when mounted: detached all the same
        // (the mount point is resolved once, when mounting).
        let d = dir("vialink");
        std::fs::create_dir(d.0.join("real")).unwrap();
        std::os::unix::fs::symlink("real", d.0.join("link")).unwrap();
        let dev = mount(&d.0.join("link"), mount2, device_only);
        assert_eq!(dev.mount_point(), Some(d.0.join("real").as_path()), "{way}");
        assert!(dev.detach_own_mount().unwrap(), "{way}");
        assert_eq!(top_mount(&d.0.join("real")), None, "{way}");
        drop(dev);
        drop(d);
    }

    if !unique_mount_ids() {
        eprintln!("no unique mount ids (Linux < 6.8): the device number decides; not tested");
        return;
    }
    // Unmounted from outside (its superblock goes; the connection lives on
    // in the /dev/fuse fd), then a tmpfs mounted there: tmpfs takes an
    // anonymous device number too, the lowest free one, which is ours
    // again unless some other mount took it in between (retried). Without
    // the unique id the device decides, and the tmpfs would be taken for
    // ours: that way is not tried here.
    for mount2 in [false, true] {
        let d = dir("reused");
        let mut reused = false;
        for _ in 0..20 {
            let dev = mount(&d.0, mount2, false);
            let ours = device(&d.0);
            umount(&d.0);
            mount_tmpfs(&d.0);
            let theirs = device(&d.0);
            assert!(
                !dev.detach_own_mount().unwrap(),
                "{ours:?} {theirs:?} mount(2) {mount2}"
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
}

/// The mount point is D/via/mnt. Our mount goes (unmounted from outside),
/// a tmpfs is mounted on D/other/mnt and gets our old device number, and
/// `lead` (undone by `undo`), as a host user who controls D could, makes
/// the mount point's name lead to the tmpfs: the detach must leave it
/// alone, however the mount was made and told.
fn never_detached_when_led(tag: &str, lead: fn(&Path), undo: fn(&Path)) {
    for (mount2, device_only) in WAYS {
        let way = format!("{tag}: mount(2) {mount2}, device only {device_only}");
        let d = dir(tag);
        let (via, other) = (d.0.join("via"), d.0.join("other"));
        let (mnt, theirs_at) = (via.join("mnt"), other.join("mnt"));
        std::fs::create_dir_all(&mnt).unwrap();
        std::fs::create_dir_all(&theirs_at).unwrap();
        let mut reused = false;
        for _ in 0..20 {
            let dev = mount(&mnt, mount2, device_only);
            let ours = device(&mnt);
            umount(&mnt);
            mount_tmpfs(&theirs_at);
            let theirs = device(&theirs_at);
            lead(&d.0);
            assert_eq!(device(&mnt), theirs, "{way}: the path leads to the tmpfs");
            assert!(
                !dev.detach_own_mount().unwrap(),
                "{way}: {ours:?} {theirs:?}"
            );
            // Where the tmpfs is mounted, by the name mountinfo gives it.
            let theirs_now = std::fs::canonicalize(&mnt).unwrap();
            assert_eq!(
                top_mount(&theirs_now).as_deref(),
                Some("tmpfs"),
                "{way}: the other mount was detached"
            );
            umount(&theirs_now);
            undo(&d.0);
            if ours == theirs {
                reused = true;
                break;
            }
        }
        assert!(
            reused,
            "{way}: no tmpfs got the FUSE mount's old device number: nothing tested"
        );
    }
}

#[test]
fn a_directory_on_the_path_swapped_for_a_symlink_never_leads_the_detach_to_another_mount() {
    never_detached_when_led(
        "swap",
        |d| {
            std::fs::rename(d.join("via"), d.join("via-was")).unwrap();
            std::os::unix::fs::symlink("other", d.join("via")).unwrap();
        },
        |d| {
            std::fs::remove_file(d.join("via")).unwrap();
            std::fs::rename(d.join("via-was"), d.join("via")).unwrap();
        },
    );
}

#[test]
fn directories_on_the_path_renamed_never_lead_the_detach_to_another_mount() {
    // No symlink: D/via is renamed away and D/other renamed to D/via.
    never_detached_when_led(
        "rename",
        |d| {
            std::fs::rename(d.join("via"), d.join("via-was")).unwrap();
            std::fs::rename(d.join("other"), d.join("via")).unwrap();
        },
        |d| {
            std::fs::rename(d.join("via"), d.join("other")).unwrap();
            std::fs::rename(d.join("via-was"), d.join("via")).unwrap();
        },
    );
}
