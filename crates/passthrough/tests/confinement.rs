//! Adversarial confinement: whatever the client sends, no request reaches
//! a file outside the shared directory. The shared directory is `share/`
//! on a fresh tmpfs; `outside/secret` sits next to it, and after every
//! attack its content, mode, size, link count, times and xattrs are
//! checked unchanged and no node the client holds is that inode.

mod common;

use common::{HostDir, Kind, Mount, Via};
use fuse_core::abi::{fattr, SetattrIn, ROOT_ID};
use fuse_core::server::{Ctx, Filesystem};
use fuse_core::Errno;
use passthrough::Config;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const RW: u32 = libc::O_RDWR as u32;

struct Setup {
    m: Mount,
    secret: PathBuf,
    outside_ino: u64,
    snapshot: (Vec<u8>, u32, u64, u64, i64, i64),
}

fn snapshot(p: &PathBuf) -> (Vec<u8>, u32, u64, u64, i64, i64) {
    let md = std::fs::symlink_metadata(p).unwrap();
    (
        std::fs::read(p).unwrap(),
        md.mode(),
        md.len(),
        md.nlink(),
        md.mtime(),
        md.ctime(),
    )
}

fn setup() -> Setup {
    let host = HostDir::new(Kind::Tmpfs);
    let share = host.path.join("share");
    let outside = host.path.join("outside");
    std::fs::create_dir_all(share.join("sub/deeper")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    let secret = outside.join("secret");
    std::fs::write(&secret, b"SECRET").unwrap();
    let links: [(&str, String); 6] = [
        ("to_root", "/".into()),
        ("to_up", "../..".into()),
        ("to_secret", secret.display().to_string()),
        ("to_secret_rel", "../outside/secret".into()),
        ("to_proc_root", "/proc/self/root".into()),
        ("to_proc_fd", "/proc/self/fd/3".into()),
    ];
    for (name, target) in &links {
        std::os::unix::fs::symlink(target, share.join(name)).unwrap();
    }
    std::os::unix::fs::symlink("../../outside", share.join("sub/deeper/up")).unwrap();
    let outside_ino = std::fs::metadata(&secret).unwrap().ino();
    let snap = snapshot(&secret);
    let m = Mount::sharing(host, &share, Config::default(), Via::Device(2));
    Setup {
        m,
        secret,
        outside_ino,
        snapshot: snap,
    }
}

impl Setup {
    fn untouched(&self) {
        assert_eq!(
            snapshot(&self.secret),
            self.snapshot,
            "the outside file changed"
        );
        let mut buf = [0u8; 256];
        let p = std::ffi::CString::new(self.secret.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: valid path and buffer.
        let n = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        assert!(n <= 0, "xattrs appeared on the outside file");
    }
    fn not_secret(&self, r: Result<fuse_core::abi::EntryOut, Errno>) {
        if let Ok(e) = r {
            assert_ne!(
                e.attr.ino, self.outside_ino,
                "a lookup reached the outside file"
            );
        }
    }
}

#[test]
fn symlinks_are_never_followed() {
    let s = setup();
    let c = &s.m.client;
    for name in [
        "to_root",
        "to_up",
        "to_secret",
        "to_secret_rel",
        "to_proc_root",
        "to_proc_fd",
    ] {
        let e = c.lookup(ROOT_ID, name.as_bytes()).unwrap();
        assert_eq!(
            e.attr.mode & libc::S_IFMT,
            libc::S_IFLNK,
            "{name} was followed"
        );
        let n = e.nodeid;
        // Through the link: it is not a directory to the daemon.
        for child in ["etc", "secret", "outside", "passwd", "3"] {
            let r = c.lookup(n, child.as_bytes());
            assert_eq!(r.unwrap_err(), Errno::ENOTDIR, "{name}/{child}");
        }
        assert!(c.mkdir(n, b"x", 0o755, 0).is_err());
        assert!(c.create(n, b"x", 0o644, RW, 0).is_err());
        assert!(c.symlink(n, b"x", b"/").is_err());
        assert!(c.opendir(n).is_err(), "{name}: opendir of a symlink");
        assert_eq!(c.open(n, RW).unwrap_err(), Errno(libc::ELOOP), "{name}");
        assert_eq!(
            c.open(n, libc::O_RDONLY as u32).unwrap_err(),
            Errno(libc::ELOOP)
        );
        // Attribute changes apply to the link itself or fail; never to the target.
        for valid in [
            fattr::MODE,
            fattr::SIZE,
            fattr::ATIME | fattr::MTIME,
            fattr::UID,
        ] {
            let sa = SetattrIn {
                valid,
                mode: 0o777,
                size: 0,
                atime: 1,
                mtime: 1,
                uid: 4242,
                ..Default::default()
            };
            let _ = c.setattr(n, &sa);
        }
        let _ = c.setxattr(n, b"user.evil", b"1", 0);
        let _ = c.setxattr(n, b"trusted.evil", b"1", 0);
        // A hard link of the symlink is another symlink, not a link to the target.
        let l = c.link(n, ROOT_ID, format!("hl_{name}").as_bytes()).unwrap();
        assert_eq!(l.attr.mode & libc::S_IFMT, libc::S_IFLNK);
        s.untouched();
    }
    // A symlink deeper down, to a directory outside.
    let sub = c.lookup(ROOT_ID, b"sub").unwrap().nodeid;
    let deeper = c.lookup(sub, b"deeper").unwrap().nodeid;
    let up = c.lookup(deeper, b"up").unwrap();
    assert_eq!(up.attr.mode & libc::S_IFMT, libc::S_IFLNK);
    s.not_secret(c.lookup(up.nodeid, b"secret"));
    // Creating over a symlink to the outside file never follows it.
    assert!(c
        .create(ROOT_ID, b"to_secret", 0o644, RW | libc::O_TRUNC as u32, 0)
        .is_err());
    assert!(c.create(ROOT_ID, b"to_secret_rel", 0o644, RW, 0).is_err());
    assert!(c
        .mknod(ROOT_ID, b"to_secret", libc::S_IFREG | 0o644, 0, 0)
        .is_err());
    s.untouched();
}

#[test]
fn dot_dot_and_bad_names() {
    let s = setup();
    let c = &s.m.client;
    // ".." and "." at the root are the root.
    assert_eq!(c.lookup(ROOT_ID, b"..").unwrap().nodeid, ROOT_ID);
    assert_eq!(c.lookup(ROOT_ID, b".").unwrap().nodeid, ROOT_ID);
    let sub = c.lookup(ROOT_ID, b"sub").unwrap().nodeid;
    assert_eq!(c.lookup(sub, b"..").unwrap().nodeid, ROOT_ID);
    let deeper = c.lookup(sub, b"deeper").unwrap().nodeid;
    assert_eq!(c.lookup(deeper, b"..").unwrap().nodeid, sub);
    // Names with "/" (the decoder refuses them on the wire; the filesystem
    // refuses them too when called directly).
    for bad in [&b"../outside"[..], b"sub/../../outside", b"/etc", b"a/b"] {
        assert_eq!(c.lookup(ROOT_ID, bad).unwrap_err(), Errno::EIO, "{bad:?}");
        let fs = s.m.fs();
        let ctx = Ctx::default();
        assert_eq!(fs.lookup(&ctx, ROOT_ID, bad).unwrap_err(), Errno::EINVAL);
        assert_eq!(
            fs.mkdir(&ctx, ROOT_ID, bad, 0o755, 0).unwrap_err(),
            Errno::EINVAL
        );
        assert_eq!(fs.unlink(&ctx, ROOT_ID, bad).unwrap_err(), Errno::EINVAL);
        assert_eq!(
            fs.rename(&ctx, ROOT_ID, b"sub", ROOT_ID, bad, 0)
                .unwrap_err(),
            Errno::EINVAL
        );
        assert_eq!(
            fs.symlink(&ctx, ROOT_ID, bad, b"x").unwrap_err(),
            Errno::EINVAL
        );
        assert_eq!(fs.link(&ctx, sub, ROOT_ID, bad).unwrap_err(), Errno::EINVAL);
    }
    let fs = s.m.fs();
    let ctx = Ctx::default();
    // A NUL inside a name (possible only by calling the filesystem directly).
    assert_eq!(
        fs.lookup(&ctx, ROOT_ID, b"sub\0x").unwrap_err(),
        Errno::EINVAL
    );
    // "." and ".." as the name of a new entry, or of what to remove.
    for dot in [&b"."[..], b".."] {
        assert_eq!(
            fs.mkdir(&ctx, sub, dot, 0o755, 0).unwrap_err(),
            Errno::EINVAL
        );
        assert_eq!(fs.rmdir(&ctx, sub, dot).unwrap_err(), Errno::EINVAL);
        assert_eq!(
            fs.rename(&ctx, sub, b"deeper", ROOT_ID, dot, 0)
                .unwrap_err(),
            Errno::EINVAL
        );
        assert_eq!(
            fs.rename(&ctx, sub, dot, ROOT_ID, b"x", 0).unwrap_err(),
            Errno::EINVAL
        );
    }
    // Over-long names.
    assert_eq!(
        c.lookup(ROOT_ID, &[b'a'; 256]).unwrap_err(),
        Errno::ENAMETOOLONG
    );
    assert_eq!(
        c.mkdir(ROOT_ID, &[b'a'; 256], 0o755, 0).unwrap_err(),
        Errno::ENAMETOOLONG
    );
    assert_eq!(
        c.mkdir(ROOT_ID, &[b'a'; 4000], 0o755, 0).unwrap_err(),
        Errno::ENAMETOOLONG
    );
    c.mkdir(ROOT_ID, &[b'a'; 255], 0o755, 0).unwrap();
    // Unknown and forgotten nodes.
    assert_eq!(c.lookup(987_654, b"x").unwrap_err(), Errno::EBADF);
    assert_eq!(c.link(987_654, ROOT_ID, b"x").unwrap_err(), Errno::EBADF);
    s.untouched();
}

#[test]
fn hard_links_and_renames_stay_inside() {
    let s = setup();
    let c = &s.m.client;
    let sub = c.lookup(ROOT_ID, b"sub").unwrap().nodeid;
    // A directory cannot be hard-linked; a rename cannot name "..".
    assert_eq!(c.link(sub, ROOT_ID, b"dirlink").unwrap_err(), Errno::EPERM);
    let fs = s.m.fs();
    assert_eq!(
        fs.rename(
            &Ctx::default(),
            ROOT_ID,
            b"sub",
            ROOT_ID,
            b"../outside/x",
            0
        )
        .unwrap_err(),
        Errno::EINVAL
    );
    // Moving a directory under itself is refused by the host.
    let deeper = c.lookup(sub, b"deeper").unwrap().nodeid;
    assert_eq!(
        c.rename(ROOT_ID, b"sub", deeper, b"loop", 0).unwrap_err(),
        Errno::EINVAL
    );
    s.untouched();
}

#[test]
fn swap_races_never_escape() {
    let s = setup();
    let share = s.m.share.clone();
    // The host keeps swapping share/race between a real directory and a
    // symlink to the outside, with RENAME_EXCHANGE, while the client
    // looks names up through it.
    std::fs::create_dir(share.join("race")).unwrap();
    std::fs::write(share.join("race/secret"), b"inside").unwrap();
    std::os::unix::fs::symlink("../outside", share.join("race_link")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (stop, share) = (stop.clone(), share.clone());
        std::thread::spawn(move || {
            let a =
                std::ffi::CString::new(share.join("race").as_os_str().as_encoded_bytes()).unwrap();
            let b = std::ffi::CString::new(share.join("race_link").as_os_str().as_encoded_bytes())
                .unwrap();
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: valid NUL-terminated paths.
                let r = unsafe {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        a.as_ptr(),
                        libc::AT_FDCWD,
                        b.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    )
                };
                assert_eq!(r, 0);
                swaps += 1;
            }
            swaps
        })
    };
    let c = &s.m.client;
    let mut reached = 0;
    for i in 0..3000 {
        let name: &[u8] = if i % 2 == 0 { b"race" } else { b"race_link" };
        match c.lookup(ROOT_ID, name) {
            Ok(e) => {
                s.not_secret(Ok(e));
                if e.attr.mode & libc::S_IFMT == libc::S_IFDIR {
                    let r = c.lookup(e.nodeid, b"secret");
                    if let Ok(x) = r {
                        reached += 1;
                        s.not_secret(Ok(x));
                        c.forget(x.nodeid, 1);
                    }
                } else {
                    s.not_secret(c.lookup(e.nodeid, b"secret"));
                }
                c.forget(e.nodeid, 1);
            }
            Err(e) => assert_eq!(e, Errno::ENOENT),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert!(swaps > 100, "the race did not run ({swaps} swaps)");
    assert!(reached > 0, "never looked inside the real directory");
    s.untouched();
}

#[test]
fn rename_races_with_held_directories() {
    // The client holds share/a/b; the host keeps moving b between a and
    // the root, and a symlink named b into a: lookups relative to the
    // held node stay in that directory, wherever it is in the tree.
    let s = setup();
    let share = s.m.share.clone();
    std::fs::create_dir_all(share.join("a/b")).unwrap();
    std::fs::write(share.join("a/b/f"), b"f").unwrap();
    let c = &s.m.client;
    let a = c.lookup(ROOT_ID, b"a").unwrap().nodeid;
    let b = c.lookup(a, b"b").unwrap().nodeid;
    let stop = Arc::new(AtomicBool::new(false));
    let mover = {
        let (stop, share) = (stop.clone(), share.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                std::fs::rename(share.join("a/b"), share.join("b_moved")).unwrap();
                std::os::unix::fs::symlink("../../outside", share.join("a/b")).unwrap();
                std::fs::remove_file(share.join("a/b")).unwrap();
                std::fs::rename(share.join("b_moved"), share.join("a/b")).unwrap();
                n += 1;
            }
            n
        })
    };
    for _ in 0..3000 {
        let e = c.lookup(b, b"f").unwrap();
        assert_eq!(e.attr.size, 1);
        c.forget(e.nodeid, 1);
        s.not_secret(c.lookup(b, b"secret"));
        if let Ok(e) = c.lookup(a, b"b") {
            s.not_secret(c.lookup(e.nodeid, b"secret"));
            c.forget(e.nodeid, 1);
        }
    }
    stop.store(true, Ordering::Relaxed);
    assert!(mover.join().unwrap() > 10);
    s.untouched();
}

#[test]
fn device_nodes_are_never_opened_by_the_daemon() {
    // A guest may create device nodes (its root has CAP_MKNOD), and a
    // hostile guest kernel may then send OPEN for one: the daemon must not
    // open the host device it names (here the host's own root disk).
    let s = setup();
    let c = &s.m.client;
    let root_dev = std::fs::metadata("/").unwrap().dev();
    let (maj, min) = (libc::major(root_dev), libc::minor(root_dev));
    let rdev = libc::makedev(maj, min) as u32;
    let blk = c
        .mknod(ROOT_ID, b"disk", libc::S_IFBLK | 0o666, rdev, 0)
        .unwrap();
    assert_eq!(
        c.open(blk.nodeid, libc::O_RDONLY as u32).unwrap_err(),
        Errno(libc::EACCES)
    );
    let chr = c
        .mknod(
            ROOT_ID,
            b"mem",
            libc::S_IFCHR | 0o666,
            libc::makedev(1, 1) as u32,
            0,
        )
        .unwrap();
    assert_eq!(c.open(chr.nodeid, RW).unwrap_err(), Errno(libc::EACCES));
    let fifo = c
        .mknod(ROOT_ID, b"fifo", libc::S_IFIFO | 0o666, 0, 0)
        .unwrap();
    assert_eq!(
        c.open(fifo.nodeid, libc::O_RDONLY as u32).unwrap_err(),
        Errno(libc::EACCES)
    );
    assert_eq!(c.opendir(blk.nodeid).unwrap_err(), Errno::ENOTDIR);
    let sub = c.lookup(ROOT_ID, b"sub").unwrap().nodeid;
    assert_eq!(
        c.open(sub, libc::O_RDONLY as u32).unwrap_err(),
        Errno::EISDIR
    );
    // Nothing but the root is open as a file description besides handles.
    assert_eq!(s.m.fs().handle_count(), 0);
    s.untouched();
}

/// Runs `f` on a thread and fails if it does not finish in 5 s (a FIFO
/// opened by the daemon would block it forever).
fn within_5s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(5))
        .expect("the daemon blocked")
}

#[test]
fn special_files_are_never_opened_by_create_setattr_or_syncfs() {
    let s = setup();
    let c = s.m.client.clone();
    c.mknod(ROOT_ID, b"fifo", libc::S_IFIFO | 0o666, 0, 0)
        .unwrap();
    let mem = libc::makedev(1, 1) as u32;
    c.mknod(ROOT_ID, b"mem", libc::S_IFCHR | 0o666, mem, 0)
        .unwrap();
    for name in [&b"fifo"[..], b"mem"] {
        let (c2, n) = (c.clone(), name.to_vec());
        // CREATE without O_EXCL of an existing special file.
        let r = within_5s(move || c2.create(ROOT_ID, &n, 0o644, RW, 0));
        assert_eq!(r.unwrap_err(), Errno(libc::EACCES), "{name:?}");
        let node = c.lookup(ROOT_ID, name).unwrap().nodeid;
        // Truncation by node, and SYNCFS on the node.
        let c2 = c.clone();
        let sa = SetattrIn {
            valid: fattr::SIZE,
            ..Default::default()
        };
        let r = within_5s(move || c2.setattr(node, &sa));
        assert_eq!(r.unwrap_err(), Errno::EINVAL);
        let c2 = c.clone();
        within_5s(move || c2.syncfs(node)).unwrap();
    }
    // CREATE of an existing regular file without O_EXCL opens it, O_TRUNC
    // included; an existing directory or symlink is refused.
    std::fs::write(s.m.path("reg"), b"old").unwrap();
    let (e, o) = c
        .create(ROOT_ID, b"reg", 0o644, RW | libc::O_TRUNC as u32, 0)
        .unwrap();
    c.write(e.nodeid, o.fh, 0, b"new", 0).unwrap();
    assert_eq!(std::fs::read(s.m.path("reg")).unwrap(), b"new");
    assert_eq!(
        c.create(ROOT_ID, b"sub", 0o644, RW, 0).unwrap_err(),
        Errno::EISDIR
    );
    assert_eq!(
        c.create(ROOT_ID, b"to_secret", 0o644, RW, 0).unwrap_err(),
        Errno(libc::ELOOP)
    );
    s.untouched();
}
