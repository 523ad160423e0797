//! The open file descriptions behind POSIX locks: opened as the caller,
//! never with more access than the handle the lock came through, and
//! upgraded without a gap when a write lock needs one open for writing.

mod common;

use common::{host_open_flags, Kind, Mount, Via};
use fuse_core::abi::{FileLock, ROOT_ID};
use fuse_core::client::Client;
use fuse_core::server::{serve_device, Dispatcher, ServerConfig};
use fuse_core::Errno;
use host_mount::devfuse::{unmount, DevFuse, MountOptions};
use passthrough::{Config, PassthroughFs};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

const MAX: u64 = i64::MAX as u64;
const RO: u32 = libc::O_RDONLY as u32;
const WO: u32 = libc::O_WRONLY as u32;
const RW: u32 = libc::O_RDWR as u32;

fn lk(typ: i32, start: u64, end: u64) -> FileLock {
    FileLock {
        start,
        end,
        typ: typ as u32,
        pid: 0,
    }
}

fn rd(start: u64, end: u64) -> FileLock {
    lk(libc::F_RDLCK, start, end)
}

fn wr(start: u64, end: u64) -> FileLock {
    lk(libc::F_WRLCK, start, end)
}

fn un(start: u64, end: u64) -> FileLock {
    lk(libc::F_UNLCK, start, end)
}

/// The access modes (O_RDONLY, O_WRONLY, O_RDWR) of this process's open
/// files on `path`'s inode; O_PATH fds, which give no access, left out.
fn access_modes(path: &Path) -> Vec<i32> {
    let mut out: Vec<i32> = host_open_flags(path)
        .into_iter()
        .map(|f| f & libc::O_ACCMODE)
        .collect();
    out.sort();
    out
}

fn writers(path: &Path) -> usize {
    access_modes(path)
        .iter()
        .filter(|&&m| m != libc::O_RDONLY)
        .count()
}

/// Runs `path` on the host. A fork of another test's thread may hold a
/// copy of a writable fd for a moment (ETXTBSY until its exec), so that
/// is retried for a while; a writer the daemon keeps never goes.
fn exec(path: &Path) -> std::io::Result<std::process::ExitStatus> {
    let t = std::time::Instant::now();
    loop {
        match std::process::Command::new(path).status() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && t.elapsed().as_secs() < 3 => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

#[test]
fn a_read_lock_leaves_the_file_executable() {
    let m = Mount::new(Kind::Tmpfs, Config::default(), Via::Device(2));
    let bin = m.path("true");
    std::fs::copy("/bin/true", &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let user = m.client.as_user(65534, 65534);
    let e = user.lookup(ROOT_ID, b"true").unwrap();
    let o = user.open(e.nodeid, RO).unwrap();
    user.setlk(e.nodeid, o.fh, 1, rd(0, MAX), false).unwrap();
    // The lock is held: another owner is told of it.
    let got = user.getlk(e.nodeid, o.fh, 2, wr(0, 0)).unwrap();
    assert_eq!(got.typ, libc::F_RDLCK as u32);
    let status = exec(&bin).expect("exec of a file a client read-locks");
    assert!(status.success());
    assert_eq!(writers(&bin), 0, "{:?}", access_modes(&bin));
    user.setlk(e.nodeid, o.fh, 1, un(0, MAX), false).unwrap();
}

/// Runs `f` on a thread whose fsuid and fsgid are 65534.
fn as_nobody<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: setfsuid/setfsgid change only this thread's credentials.
        unsafe {
            libc::setfsgid(65534);
            libc::setfsuid(65534);
        }
        f()
    })
    .join()
    .unwrap()
}

fn fcntl_lock(f: &std::fs::File, cmd: i32, typ: i32) -> (i32, i16) {
    // SAFETY: a zeroed flock is a valid value of this plain C struct.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    // SAFETY: `fl` is a valid flock for the duration of the call.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), cmd, &mut fl) };
    (r, fl.l_type)
}

#[test]
fn a_read_lock_through_a_kernel_mount_leaves_the_file_executable() {
    // The same through the host kernel's FUSE client, as a host user
    // would do it.
    let host = common::HostDir::new(Kind::Tmpfs);
    let (share, mnt) = (host.path.join("share"), host.path.join("mnt"));
    std::fs::create_dir_all(&share).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    let bin = share.join("true");
    std::fs::copy("/bin/true", &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let fs = PassthroughFs::new(&share, Config::default()).unwrap();
    let disp = Arc::new(Dispatcher::new(fs, ServerConfig::default()));
    let dev = DevFuse::mount(&mnt, &MountOptions::default()).unwrap();
    let workers = serve_device(dev, disp.clone(), 2);
    let through = mnt.join("true");
    let locked = as_nobody(move || {
        let f = std::fs::File::open(&through).unwrap();
        assert_eq!(fcntl_lock(&f, libc::F_SETLK, libc::F_RDLCK).0, 0);
        f
    });
    // Held: another description sees it.
    let other = std::fs::File::open(mnt.join("true")).unwrap();
    assert_eq!(
        fcntl_lock(&other, libc::F_OFD_GETLK, libc::F_WRLCK),
        (0, libc::F_RDLCK as i16)
    );
    let status = exec(&bin);
    drop((locked, other));
    let _ = unmount(&mnt, true);
    for w in workers {
        let _ = w.join();
    }
    assert!(status.expect("exec of a file a user read-locks").success());
}

/// Owner `other` meets a conflict (EAGAIN) taking `l`, or takes it and
/// lets go again.
fn conflicts(c: &Client, node: u64, fh: u64, other: u64, l: FileLock) -> bool {
    match c.setlk(node, fh, other, l, false) {
        Err(Errno::EAGAIN) => true,
        Ok(()) => {
            c.setlk(node, fh, other, un(l.start, l.end), false).unwrap();
            false
        }
        Err(e) => panic!("{l:?}: {e:?}"),
    }
}

#[test]
fn a_write_lock_after_read_locks_keeps_the_read_ranges_held() {
    let m = Mount::new(Kind::Tmpfs, Config::default(), Via::Device(2));
    let path = m.path("f");
    std::fs::write(&path, b"data").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let user = m.client.as_user(65534, 65534);
    let f = user.lookup(ROOT_ID, b"f").unwrap().nodeid;
    let ro = user.open(f, RO).unwrap().fh;
    // Owner 1 read-locks through the read-only handle; an unlock in the
    // middle splits a range.
    for (s, e) in [(0, 9), (20, 29), (40, MAX)] {
        user.setlk(f, ro, 1, rd(s, e), false).unwrap();
    }
    user.setlk(f, ro, 1, un(22, 24), false).unwrap();
    assert_eq!(writers(&path), 0, "a read-only owner description");
    let rw = user.open(f, RW).unwrap().fh;
    let held = [(0, 9), (20, 21), (25, 29), (40, 100), (MAX, MAX)];
    let free = [(10, 19), (22, 24), (30, 39)];
    for (s, e) in held {
        assert!(conflicts(&user, f, rw, 2, wr(s, e)), "{s}..={e} before");
    }
    for (s, e) in free {
        assert!(!conflicts(&user, f, rw, 2, wr(s, e)), "{s}..={e} before");
    }
    // A write lock through the read-write handle: the owner's description
    // is replaced by one open for writing, with every read range kept.
    user.setlk(f, rw, 1, wr(5, 7), false).unwrap();
    for (s, e) in held {
        assert!(conflicts(&user, f, rw, 2, wr(s, e)), "{s}..={e} after");
    }
    for (s, e) in free {
        assert!(!conflicts(&user, f, rw, 2, wr(s, e)), "{s}..={e} after");
    }
    assert!(conflicts(&user, f, rw, 2, rd(5, 7)), "the write lock");
    assert!(!conflicts(&user, f, rw, 2, rd(0, 4)), "still a read lock");
    // The read-only description is gone: only the two handles and owner
    // 1's and owner 2's descriptions are open.
    let mut modes = access_modes(&path);
    modes.retain(|&m| m == libc::O_RDONLY);
    assert_eq!(modes.len(), 1, "{:?}", access_modes(&path));
    assert_eq!(m.fs().lock_owner_fds(), 2);
    // Unlocks after the upgrade reach the new description.
    user.setlk(f, rw, 1, un(0, MAX), false).unwrap();
    assert!(!conflicts(&user, f, rw, 2, wr(0, MAX)));

    // The same through SETLKW, which has to wait for another reader: the
    // owner's read range stays locked while it waits.
    user.setlk(f, ro, 3, rd(100, 109), false).unwrap();
    user.setlk(f, ro, 4, rd(105, 105), false).unwrap();
    let call = user.setlkw(f, rw, 3, wr(100, 109), false);
    let waiter = std::thread::spawn(move || call.wait());
    let t = std::time::Instant::now();
    while m.fs().parked_locks() == 0 {
        assert!(t.elapsed().as_secs() < 5, "SETLKW did not park");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert!(conflicts(&user, f, rw, 2, wr(100, 104)), "while waiting");
    user.setlk(f, ro, 4, un(105, 105), false).unwrap();
    waiter.join().unwrap().unwrap();
    assert!(conflicts(&user, f, rw, 2, rd(109, 109)), "the write lock");
}

#[test]
fn under_readonly_no_lock_opens_the_file_for_writing() {
    let host = common::HostDir::new(Kind::Tmpfs);
    let path = host.path.join("f");
    std::fs::write(&path, b"data").unwrap();
    let cfg = Config {
        readonly: true,
        ..Config::default()
    };
    let m = Mount::on(host, cfg, Via::Device(2));
    // Root, who could open the file for writing.
    let c = &m.client;
    let f = c.lookup(ROOT_ID, b"f").unwrap().nodeid;
    let ro = c.open(f, RO).unwrap().fh;
    for owner in 1..4 {
        c.setlk(f, ro, owner, rd(owner, owner + 10), false).unwrap();
        c.getlk(f, ro, owner + 10, wr(0, MAX)).unwrap();
    }
    assert_eq!(c.setlk(f, ro, 1, wr(0, 0), false), Err(Errno::EBADF));
    c.setlkw(f, ro, 5, rd(50, 60), false).wait().unwrap();
    c.setlk(f, ro, 0, rd(0, MAX), true).unwrap();
    assert_eq!(m.fs().lock_owner_fds(), 4);
    assert_eq!(writers(&path), 0, "{:?}", access_modes(&path));
}

#[test]
fn a_write_only_callers_lock_description_is_not_readable() {
    let m = Mount::new(Kind::Tmpfs, Config::default(), Via::Device(2));
    let path = m.path("f");
    std::fs::write(&path, b"data").unwrap();
    // Others may write but not read.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o622)).unwrap();
    let user = m.client.as_user(65534, 65534);
    let f = user.lookup(ROOT_ID, b"f").unwrap().nodeid;
    let wo = user.open(f, WO).unwrap().fh;
    user.setlk(f, wo, 1, wr(0, 9), false).unwrap();
    assert_eq!(
        access_modes(&path),
        [libc::O_WRONLY, libc::O_WRONLY],
        "the handle and the owner's description"
    );
    // A read lock of that owner through a readable handle (root's) cannot
    // go on its write-only description, which holds a write lock no second
    // description could take: EBADF, as fcntl says for a description of
    // the wrong mode.
    let ro = m.client.open(f, RO).unwrap().fh;
    assert_eq!(
        m.client.setlk(f, ro, 1, rd(20, 29), false),
        Err(Errno::EBADF)
    );
    // The owner's write lock is still held.
    assert_eq!(
        m.client.getlk(f, ro, 2, rd(0, 0)).unwrap().typ,
        libc::F_WRLCK as u32
    );
}

#[test]
fn a_lock_on_an_open_file_does_not_depend_on_its_mode_now() {
    // fcntl(2) checks no permission on an open file: a file whose mode
    // changed after the open can still be locked through it.
    let m = Mount::new(Kind::Tmpfs, Config::default(), Via::Device(2));
    let path = m.path("f");
    std::fs::write(&path, b"data").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let user = m.client.as_user(65534, 65534);
    let f = user.lookup(ROOT_ID, b"f").unwrap().nodeid;
    let ro = user.open(f, RO).unwrap().fh;
    let rw = user.open(f, RW).unwrap().fh;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o000)).unwrap();
    user.setlk(f, ro, 1, rd(0, 9), false).unwrap();
    user.setlk(f, rw, 2, wr(10, 19), false).unwrap();
    // And the read-only owner upgrades as well.
    user.setlk(f, rw, 1, wr(0, 0), false).unwrap();
    assert!(conflicts(&user, f, rw, 3, wr(9, 9)));
    assert!(conflicts(&user, f, rw, 3, rd(0, 0)));
    assert!(conflicts(&user, f, rw, 3, rd(15, 15)));
    // Still no access the handles do not have.
    let mut modes = access_modes(&path);
    modes.dedup();
    assert_eq!(modes, [libc::O_RDONLY, libc::O_RDWR]);
}
