//! Live migration of the passthrough's state: a source filesystem's node
//! ids and handles, saved, taken up by a second filesystem on the same
//! host directory, which then serves them as the source did (the client
//! never learns it changed daemons) — or refuses, or gives EIO on what it
//! cannot find, as `--migration-on-error` says; and a hostile state never
//! reaches outside the shared directory.

mod common;

use common::{HostDir, Kind};
use fuse_core::abi::{FileLock, ROOT_ID};
use fuse_core::client::Client;
use fuse_core::embedded::{Embedded, Options};
use fuse_core::server::state::{StateError, StateWriter};
use fuse_core::server::Filesystem;
use fuse_core::Errno;
use passthrough::{Config, PassthroughFs};
use passthrough::{MigrationConfig, MigrationMode, MigrationOnError};
use std::path::{Path, PathBuf};

const RW: u32 = libc::O_RDWR as u32;
const RO: u32 = libc::O_RDONLY as u32;
const APPEND: u32 = (libc::O_WRONLY | libc::O_APPEND) as u32;

struct Share {
    _host: HostDir,
    dir: PathBuf,
    outside: PathBuf,
}

fn share() -> Share {
    share_on(Kind::Tmpfs)
}

fn share_on(kind: Kind) -> Share {
    let host = HostDir::new(kind);
    let dir = host.path.join("share");
    let outside = host.path.join("outside");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    Share {
        _host: host,
        dir,
        outside,
    }
}

fn daemon(
    dir: &Path,
    mode: MigrationMode,
    on_error: MigrationOnError,
    verify: bool,
) -> Embedded<PassthroughFs> {
    let cfg = Config {
        migration: MigrationConfig {
            mode,
            on_error,
            verify_handles: verify,
        },
        ..Config::default()
    };
    Embedded::start(PassthroughFs::new(dir, cfg).unwrap(), Options::default()).unwrap()
}

fn paths(dir: &Path) -> Embedded<PassthroughFs> {
    daemon(
        dir,
        MigrationMode::FindPaths,
        MigrationOnError::Abort,
        false,
    )
}

/// A daemon that takes up handles by file handle (`--migration-mode
/// file-handles`) and aborts on a file it cannot find.
fn handles(dir: &Path) -> Embedded<PassthroughFs> {
    daemon(
        dir,
        MigrationMode::FileHandles,
        MigrationOnError::Abort,
        false,
    )
}

/// A find-paths daemon that carries a file it cannot find over as lost
/// (`--migration-on-error guest-error`: EIO on it).
fn lost_as_eio(dir: &Path) -> Embedded<PassthroughFs> {
    daemon(
        dir,
        MigrationMode::FindPaths,
        MigrationOnError::GuestError,
        false,
    )
}

/// Moves `src`'s state into `dst` (which must take it) and returns `dst`.
fn carry(src: &Embedded<PassthroughFs>, dst: Embedded<PassthroughFs>) -> Embedded<PassthroughFs> {
    let state = src.fs().save_state().unwrap();
    dst.fs().load_state(&state).unwrap();
    dst
}

fn refusal(r: Result<(), StateError>) -> String {
    match r {
        Err(e @ StateError::Refused { .. }) => e.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// What the guest of these tests holds: a subdirectory, a file written
/// through one handle and appended to through another, a file read
/// through a third, and a directory handle.
struct Held {
    d: u64,
    f: u64,
    g: u64,
    fh_rw: u64,
    fh_app: u64,
    fh_ro: u64,
    dh: u64,
}

fn hold(c: &Client, share: &Path) -> Held {
    let d = c.mkdir(ROOT_ID, b"d", 0o755, 0).unwrap().nodeid;
    let (e, o) = c.create(d, b"f", 0o644, RW, 0).unwrap();
    c.write(e.nodeid, o.fh, 0, b"one,", 0).unwrap();
    let fh_app = c.open(e.nodeid, APPEND).unwrap().fh;
    std::fs::write(share.join("d/g"), b"read me").unwrap();
    let g = c.lookup(d, b"g").unwrap().nodeid;
    let fh_ro = c.open(g, RO).unwrap().fh;
    let dh = c.opendir(d).unwrap().fh;
    Held {
        d,
        f: e.nodeid,
        g,
        fh_rw: o.fh,
        fh_app,
        fh_ro,
        dh,
    }
}

#[test]
fn the_destination_serves_the_sources_node_ids_and_handles_by_path() {
    let s = share();
    let src = paths(&s.dir);
    let h = hold(src.client(), &s.dir);
    let rh = src.client().opendir(ROOT_ID).unwrap().fh;
    let dst = carry(&src, paths(&s.dir));
    let c = dst.client();
    // A handle of the shared directory itself comes along too.
    let top: Vec<Vec<u8>> = c
        .readdir(ROOT_ID, rh, 0, 4096)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(top.contains(&b"d".to_vec()), "{top:?}");
    // Writes through the handles opened before the move land in the same
    // host file; the O_APPEND one still appends.
    c.write(h.f, h.fh_rw, 4, b"two,", 0).unwrap();
    c.write(h.f, h.fh_app, 0, b"three", 0).unwrap();
    assert_eq!(std::fs::read(s.dir.join("d/f")).unwrap(), b"one,two,three");
    assert_eq!(c.read(h.g, h.fh_ro, 0, 100).unwrap(), b"read me");
    // The read-only handle stays read-only.
    assert!(c.write(h.g, h.fh_ro, 0, b"x", 0).is_err());
    let names: Vec<Vec<u8>> = c
        .readdir(h.d, h.dh, 0, 4096)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(
        names.contains(&b"f".to_vec()) && names.contains(&b"g".to_vec()),
        "{names:?}"
    );
    // The directory's node id still names it (a cwd in the guest).
    assert_eq!(
        c.lookup(h.d, b"g").unwrap().nodeid,
        h.g,
        "the same inode, the same node id"
    );
    let st = std::fs::metadata(s.dir.join("d/f")).unwrap();
    assert_eq!(
        c.getattr(h.f, None).unwrap().attr.ino,
        std::os::unix::fs::MetadataExt::ino(&st)
    );
    // New node ids and handles do not collide with the taken-up ones.
    let (e, o) = c.create(h.d, b"new", 0o644, RW, 0).unwrap();
    assert!(e.nodeid > h.g && o.fh > h.fh_ro.max(h.dh).max(h.fh_app));
    // Lookup references came along (two: `hold`'s and the one above):
    // forgetting both ends the inode, one alone does not.
    c.release(h.g, h.fh_ro, 0).unwrap();
    c.forget(h.g, 1);
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(c.getattr(h.g, None).is_ok(), "one reference left");
    c.forget(h.g, 1);
    let gone = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(10));
        c.getattr(h.g, None).map(drop) == Err(Errno::EBADF)
    });
    assert!(gone, "forgotten on the destination");
}

#[test]
fn a_file_unlinked_while_open_goes_by_handle_and_fails_by_path_as_configured() {
    let s = share();
    // file-handles: the unlinked file is carried over.
    let src = handles(&s.dir);
    let c = src.client();
    let (e, o) = c.create(ROOT_ID, b"gone", 0o644, RW, 0).unwrap();
    c.write(e.nodeid, o.fh, 0, b"still here", 0).unwrap();
    c.unlink(ROOT_ID, b"gone").unwrap();
    let dst = carry(&src, handles(&s.dir));
    assert_eq!(
        dst.client().read(e.nodeid, o.fh, 0, 100).unwrap(),
        b"still here"
    );

    // find-paths, abort: the save is refused, naming why.
    let src = paths(&s.dir);
    let c = src.client();
    let (e, o) = c.create(ROOT_ID, b"gone2", 0o644, RW, 0).unwrap();
    let (k, ko) = c.create(ROOT_ID, b"kept", 0o644, RW, 0).unwrap();
    c.unlink(ROOT_ID, b"gone2").unwrap();
    let why = refusal(src.fs().save_state().map(drop));
    assert!(why.contains("unlinked"), "{why}");

    // find-paths, guest-error: it is carried over as lost, EIO on it and
    // its handle, the other file served.
    let src = lost_as_eio(&s.dir);
    let c2 = src.client();
    let (e2, o2) = c2.create(ROOT_ID, b"gone3", 0o644, RW, 0).unwrap();
    let (k2, ko2) = c2.create(ROOT_ID, b"kept3", 0o644, RW, 0).unwrap();
    c2.unlink(ROOT_ID, b"gone3").unwrap();
    let dst = carry(&src, lost_as_eio(&s.dir));
    let d = dst.client();
    assert_eq!(d.read(e2.nodeid, o2.fh, 0, 10), Err(Errno::EIO));
    assert_eq!(d.getattr(e2.nodeid, None).map(drop), Err(Errno::EIO));
    d.write(k2.nodeid, ko2.fh, 0, b"ok", 0).unwrap();
    assert_eq!(std::fs::read(s.dir.join("kept3")).unwrap(), b"ok");
    // Released and forgotten, the lost ids go like any other.
    d.release(e2.nodeid, o2.fh, 0).unwrap();
    d.forget(e2.nodeid, 1);
    let _ = (e, o, k, ko);
}

#[test]
fn file_handles_are_taken_up_with_a_cold_cache_and_checked_against_their_path() {
    // ext4, whose dentries the kernel evicts: a handle opened with none
    // cached gives a disconnected dentry (its /proc name says nothing).
    let s = share_on(Kind::Ext4);
    let src = handles(&s.dir);
    let h = hold(src.client(), &s.dir);
    let state = src.fs().save_state().unwrap();
    drop(src);
    std::fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    let dst = handles(&s.dir);
    dst.fs().load_state(&state).unwrap();
    let c = dst.client();
    assert_eq!(c.read(h.g, h.fh_ro, 0, 100).unwrap(), b"read me");
    c.write(h.f, h.fh_rw, 4, b"two", 0).unwrap();
    assert_eq!(std::fs::read(s.dir.join("d/f")).unwrap(), b"one,two");
    // And on again from there (the files it took up have their names).
    let state = dst.fs().save_state().unwrap();
    drop(dst);
    std::fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    let third = handles(&s.dir);
    third.fs().load_state(&state).unwrap();
    assert_eq!(
        third.client().read(h.g, h.fh_ro, 0, 100).unwrap(),
        b"read me"
    );
    drop(third);
    // A file moved out of the share: its handle still opens it, its path
    // no longer leads to it, so it is refused.
    let src = handles(&s.dir);
    let c = src.client();
    let d = c.lookup(ROOT_ID, b"d").unwrap().nodeid;
    let g = c.lookup(d, b"g").unwrap().nodeid;
    c.open(g, RO).unwrap();
    let state = src.fs().save_state().unwrap();
    drop(src);
    std::fs::rename(s.dir.join("d/g"), s.outside.join("g")).unwrap();
    std::fs::write(s.dir.join("d/g"), b"a new g").unwrap();
    let dst = handles(&s.dir);
    let why = refusal(dst.fs().load_state(&state));
    assert!(why.contains("not at its path"), "{why}");
}

#[test]
fn a_destination_that_cannot_find_a_file_aborts_or_gives_eio_never_another_file() {
    let s = share();
    let src = paths(&s.dir);
    let h = hold(src.client(), &s.dir);
    let state = src.fs().save_state().unwrap();
    // The destination's directory lacks d/g (moved away meanwhile).
    std::fs::rename(s.dir.join("d/g"), s.outside.join("g")).unwrap();

    let dst = paths(&s.dir);
    let why = refusal(dst.fs().load_state(&state));
    assert!(why.contains("d/g"), "{why}");
    // Nothing of the state stays after a refused load.
    assert_eq!(dst.client().getattr(h.f, None).map(drop), Err(Errno::EBADF));
    assert_eq!(dst.fs().inode_count(), 1);

    let dst = lost_as_eio(&s.dir);
    dst.fs().load_state(&state).unwrap();
    let c = dst.client();
    assert_eq!(c.read(h.g, h.fh_ro, 0, 10), Err(Errno::EIO));
    c.write(h.f, h.fh_rw, 4, b"two", 0).unwrap();
    assert_eq!(std::fs::read(s.dir.join("d/f")).unwrap(), b"one,two");
}

#[test]
fn verify_handles_refuses_a_path_that_now_leads_to_another_file() {
    let s = share();
    let src = daemon(
        &s.dir,
        MigrationMode::FindPaths,
        MigrationOnError::Abort,
        true,
    );
    let _h = hold(src.client(), &s.dir);
    let state = src.fs().save_state().unwrap();
    // Another file takes d/g's name (the source still holds the old one).
    std::fs::write(s.outside.join("g2"), b"impostor").unwrap();
    std::fs::rename(s.outside.join("g2"), s.dir.join("d/g")).unwrap();
    let why = refusal(paths(&s.dir).fs().load_state(&state));
    assert!(why.contains("another inode"), "{why}");
    // Without --migration-verify-handles the path is all there is.
    let src = paths(&s.dir);
    let c = src.client();
    let d = c.lookup(ROOT_ID, b"d").unwrap().nodeid;
    let g = c.lookup(d, b"g").unwrap().nodeid;
    let fh = c.open(g, RO).unwrap().fh;
    let state = src.fs().save_state().unwrap();
    std::fs::write(s.outside.join("g3"), b"second impostor").unwrap();
    std::fs::rename(s.outside.join("g3"), s.dir.join("d/g")).unwrap();
    let dst = paths(&s.dir);
    dst.fs().load_state(&state).unwrap();
    assert_eq!(
        dst.client().read(g, fh, 0, 100).unwrap(),
        b"second impostor"
    );
}

/// Whether a host process can take `typ` on `[start, start + len)` of
/// `path` now (F_OFD_SETLK on a description of its own, let go at once).
fn host_can_lock(path: &Path, typ: i32, start: i64, len: i64) -> bool {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    // SAFETY: a zeroed flock is a valid value of this plain C struct.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start;
    fl.l_len = len;
    // SAFETY: `fl` is a valid flock for F_OFD_SETLK on an open fd.
    let r = unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            libc::F_OFD_SETLK,
            &mut fl,
        )
    };
    r == 0
}

/// A lock of `typ` on `start..=end`, taken by pid 42.
fn lk(typ: i32, start: u64, end: u64) -> FileLock {
    FileLock {
        start,
        end,
        typ: typ as u32,
        pid: 42,
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = std::time::Instant::now();
    while !f() {
        assert!(t.elapsed() < std::time::Duration::from_secs(5), "{what}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn posix_locks_move_to_the_destination_once_the_source_lets_go() {
    let s = share();
    let path = s.dir.join("locked");
    let src = paths(&s.dir);
    let c = src.client();
    let (e, o) = c.create(ROOT_ID, b"locked", 0o644, RW, 0).unwrap();
    // Owner 7: a write lock on 0..=9; owner 8: a read lock on 100..=199.
    c.setlk(e.nodeid, o.fh, 7, lk(libc::F_WRLCK, 0, 9), false)
        .unwrap();
    c.setlk(e.nodeid, o.fh, 8, lk(libc::F_RDLCK, 100, 199), false)
        .unwrap();
    let dst = carry(&src, paths(&s.dir));
    let d = dst.client();
    // While the source lives it holds them; the destination's client
    // meanwhile unlocks owner 8's range (it is its own to change).
    assert!(!host_can_lock(&path, libc::F_WRLCK, 0, 10));
    d.setlk(e.nodeid, o.fh, 8, lk(libc::F_UNLCK, 100, 199), false)
        .unwrap();
    drop(src);
    // The source gone, the destination holds owner 7's lock, and not the
    // range owner 8 let go of.
    wait_until("the destination takes the write lock", || {
        !host_can_lock(&path, libc::F_RDLCK, 0, 10) && host_can_lock(&path, libc::F_WRLCK, 100, 100)
    });
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(
        host_can_lock(&path, libc::F_WRLCK, 100, 100),
        "an unlocked range stays unlocked"
    );
    // GETLK from another owner names the holder as the source knew it.
    let got = d.getlk(e.nodeid, o.fh, 9, lk(libc::F_WRLCK, 0, 0)).unwrap();
    assert_eq!(
        (got.typ, got.start, got.end, got.pid),
        (libc::F_WRLCK as u32, 0, 9, 42)
    );
    // The client's FLUSH of the owner lets go of it, as before the move.
    d.flush(e.nodeid, o.fh, 7).unwrap();
    assert!(host_can_lock(&path, libc::F_WRLCK, 0, 10));
}

#[test]
fn a_lock_still_pending_on_the_destination_is_its_owners_against_other_owners() {
    let s = share();
    let path = s.dir.join("locked");
    let src = paths(&s.dir);
    let c = src.client();
    let (e, o) = c.create(ROOT_ID, b"locked", 0o644, RW, 0).unwrap();
    c.setlk(e.nodeid, o.fh, 7, lk(libc::F_WRLCK, 0, 9), false)
        .unwrap();
    let dst = carry(&src, paths(&s.dir));
    let d = dst.client();
    // Another owner: refused, and told who holds it.
    assert_eq!(
        d.setlk(e.nodeid, o.fh, 9, lk(libc::F_RDLCK, 5, 5), false),
        Err(Errno::EAGAIN)
    );
    let got = d.getlk(e.nodeid, o.fh, 9, lk(libc::F_RDLCK, 0, 0)).unwrap();
    assert_eq!(
        (got.typ, got.start, got.end, got.pid),
        (libc::F_WRLCK as u32, 0, 9, 42)
    );
    // The owner itself sees no conflict with its own lock, and may
    // downgrade it while the source still holds the write lock.
    let mine = d.getlk(e.nodeid, o.fh, 7, lk(libc::F_WRLCK, 0, 9)).unwrap();
    assert_eq!(mine.typ, libc::F_UNLCK as u32);
    d.setlk(e.nodeid, o.fh, 7, lk(libc::F_RDLCK, 0, 9), false)
        .unwrap();
    // An upgrade back needs the host, where the source's lock still is.
    assert_eq!(
        d.setlk(e.nodeid, o.fh, 7, lk(libc::F_WRLCK, 0, 9), false),
        Err(Errno::EAGAIN)
    );
    // Another owner's SETLKW for a write lock waits, past the source's
    // end, for owner 7's read lock.
    let waiting = d.setlkw(e.nodeid, o.fh, 9, lk(libc::F_WRLCK, 0, 9), false);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = done.clone();
    let waiter = std::thread::spawn(move || {
        let r = waiting.wait().map(drop);
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
        r
    });
    drop(src);
    wait_until("owner 7's read lock is taken on the host", || {
        !host_can_lock(&path, libc::F_WRLCK, 0, 10) && host_can_lock(&path, libc::F_RDLCK, 0, 10)
    });
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(
        !done.load(std::sync::atomic::Ordering::SeqCst),
        "owner 9 waits for owner 7"
    );
    d.setlk(e.nodeid, o.fh, 7, lk(libc::F_UNLCK, 0, 9), false)
        .unwrap();
    waiter.join().unwrap().unwrap();
    assert!(
        !host_can_lock(&path, libc::F_RDLCK, 0, 10),
        "owner 9 holds it"
    );
}

#[test]
fn flock_locks_stop_the_save_under_abort() {
    let s = share();
    let src = paths(&s.dir);
    let c = src.client();
    let (e, o) = c.create(ROOT_ID, b"flocked", 0o644, RW, 0).unwrap();
    let lk = FileLock {
        start: 0,
        end: 0,
        typ: libc::F_WRLCK as u32,
        pid: 1,
    };
    c.setlk(e.nodeid, o.fh, 7, lk, true).unwrap();
    let why = refusal(src.fs().save_state().map(drop));
    assert!(why.contains("flock"), "{why}");
}

/// A state naming `loc` (tag and bytes as `migrate.rs` writes them).
fn state_with(nodeid: u64, ftype: u32, tag: u8, loc: impl FnOnce(&mut StateWriter)) -> Vec<u8> {
    let mut w = StateWriter::new();
    w.u32(1).u32(1).u64(nodeid).u64(1).u32(ftype).u8(tag);
    loc(&mut w);
    // No verify handle, no handles, no lock owners.
    w.u8(0).u32(0).u32(0);
    w.finish()
}

#[test]
fn a_hostile_state_is_an_error_and_reaches_nothing_outside_the_share() {
    let s = share();
    std::fs::write(s.outside.join("secret"), b"secret").unwrap();
    std::fs::write(s.dir.join("inside"), b"inside").unwrap();
    std::os::unix::fs::symlink(&s.outside, s.dir.join("link")).unwrap();
    let reg = libc::S_IFREG;
    let path = |p: &'static [u8]| {
        state_with(2, reg, 1, move |w| {
            w.bytes(p);
        })
    };
    let escapes = [
        path(b"../outside/secret"),
        path(b"/etc/passwd"),
        path(b"link/secret"),
        path(b"./inside/../../outside/secret"),
        path(b""),
        path(b"inside\0"),
    ];
    for st in &escapes {
        let dst = paths(&s.dir);
        assert!(dst.fs().load_state(st).is_err());
        assert_eq!(dst.fs().inode_count(), 1);
    }
    // A file handle of a file outside the share (same filesystem).
    let f = std::fs::File::open(s.outside.join("secret")).unwrap();
    let (handle, typ) = name_to_handle(&f);
    // Named with no path, or with the path of a file of the share: both
    // refused (it is not at that path).
    for path in [&b""[..], b"inside"] {
        let st = state_with(2, reg, 2, |w| {
            w.u32(typ as u32).bytes(&handle).bytes(path);
        });
        let dst = handles(&s.dir);
        assert!(dst.fs().load_state(&st).is_err(), "{path:?}");
    }
    let st = state_with(2, reg, 2, |w| {
        w.u32(typ as u32).bytes(&handle).bytes(b"inside");
    });
    let dst = handles(&s.dir);
    let why = refusal(dst.fs().load_state(&st));
    assert!(why.contains("not at its path"), "{why}");
    // Under guest-error it is lost, not served.
    let dst = daemon(
        &s.dir,
        MigrationMode::FileHandles,
        MigrationOnError::GuestError,
        false,
    );
    dst.fs().load_state(&st).unwrap();
    assert_eq!(dst.client().getattr(2, None).map(drop), Err(Errno::EIO));
    // The root's id, a duplicate id, a wrong type, a bad tag, a count
    // larger than the stream, another version: errors, no panic.
    let ok = path(b"inside");
    let dst = paths(&s.dir);
    dst.fs().load_state(&ok).unwrap();
    for bad in [
        state_with(ROOT_ID, reg, 1, |w| {
            w.bytes(b"inside");
        }),
        // Ids the destination's counters could not move past.
        state_with(u64::MAX, reg, 1, |w| {
            w.bytes(b"inside");
        }),
        state_with(2, libc::S_IFDIR, 1, |w| {
            w.bytes(b"inside");
        }),
        state_with(2, reg, 9, |w| {
            w.bytes(b"inside");
        }),
        {
            let mut w = StateWriter::new();
            w.u32(1).u32(u32::MAX);
            w.finish()
        },
        {
            let mut v = ok.clone();
            v[0] = 2;
            v
        },
    ] {
        assert!(paths(&s.dir).fs().load_state(&bad).is_err());
    }
    // Every truncation and every flipped byte of a real state: an error or
    // a load that serves only what the share holds, never a panic.
    let src = paths(&s.dir);
    let _h = hold(src.client(), &s.dir);
    let real = src.fs().save_state().unwrap();
    for cut in 0..real.len() {
        let _ = paths(&s.dir).fs().load_state(&real[..cut]);
    }
    for i in 0..real.len() {
        let mut v = real.clone();
        v[i] ^= 0xff;
        let _ = paths(&s.dir).fs().load_state(&v);
    }
}

fn name_to_handle(f: &std::fs::File) -> (Vec<u8>, i32) {
    #[repr(C)]
    struct Fh {
        bytes: u32,
        typ: i32,
        data: [u8; 128],
    }
    const _: () = assert!(std::mem::size_of::<Fh>() == 136);
    let mut fh = Fh {
        bytes: 128,
        typ: 0,
        data: [0; 128],
    };
    let mut mnt = 0i32;
    // SAFETY: `fh` is a struct file_handle with room for 128 bytes, `mnt`
    // a valid out-pointer, the path "" with AT_EMPTY_PATH names `f`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            std::os::fd::AsRawFd::as_raw_fd(f),
            c"".as_ptr(),
            &mut fh as *mut Fh,
            &mut mnt as *mut i32,
            libc::AT_EMPTY_PATH,
        )
    };
    assert_eq!(
        r,
        0,
        "name_to_handle_at: {}",
        std::io::Error::last_os_error()
    );
    (fh.data[..fh.bytes as usize].to_vec(), fh.typ)
}
