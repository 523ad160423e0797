//! Operations that allocate or change file data (WRITE, FALLOCATE,
//! COPY_FILE_RANGE) run with the caller's credentials and without
//! CAP_SYS_RESOURCE, so the host's limits bind them as they bind a local
//! writer; a writeback WRITE, which the client kernel sends with
//! uid = gid = 0 and a flusher thread's pid, runs as the handle's opener.
//!
//! The limit used is ext4's root-reserved blocks (`mkfs.ext4 -m 50`: half
//! the blocks are for the reserved uid, or a holder of CAP_SYS_RESOURCE).
//! Requests come from the engine's embedded client, built as the kernel
//! builds them, and, in the last test, from the kernel itself through a
//! /dev/fuse mount. Needs root (mount, loop devices).

mod common;

use common::{run, HostDir, Mount, Via};
use fuse_core::abi::flags::{WRITE_CACHE, WRITE_KILL_SUIDGID};
use fuse_core::client::Client;
use fuse_core::Errno;
use passthrough::Config;
use passthrough::Groups;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

const RW: u32 = libc::O_RDWR as u32;
/// The engine's client writes at most this much per WRITE (max_write).
const CHUNK: usize = 128 << 10;
const NOBODY: u32 = 65534;
/// The pid a writeback WRITE carries: a kernel thread's (kthreadd), whose
/// groups are none.
const FLUSHER_PID: u32 = 2;

/// A fresh 64 MiB ext4 with half its blocks reserved (`-m 50`) for root,
/// or for `resuid` (uid and gid) when given, with a directory `pub`
/// anyone may write.
fn reserved_ext4(resuid: Option<u32>) -> HostDir {
    let host = HostDir::ext4(64 << 20, |img| {
        run(Command::new("mkfs.ext4")
            // No journal: freed blocks are free at once, not at the
            // next commit.
            .args(["-q", "-F", "-m", "50", "-O", "^has_journal"])
            .arg(img));
        if let Some(id) = resuid {
            let id = id.to_string();
            run(Command::new("tune2fs")
                .args(["-u", &id, "-g", &id])
                .arg(img));
        }
    });
    std::fs::create_dir(host.path.join("pub")).unwrap();
    set_mode(&host.path.join("pub"), 0o777);
    host
}

/// [`reserved_ext4`] served through the engine's embedded client.
fn reserved_share(cfg: Config, resuid: Option<u32>) -> Mount {
    Mount::on(reserved_ext4(resuid), cfg, Via::Device(2))
}

fn writeback_cfg() -> Config {
    let cfg = Config {
        writeback: true,
        ..Config::default()
    };
    assert!(cfg.creds, "these tests run as root");
    cfg
}

fn set_mode(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// Bytes free for users other than the reserved one, and bytes reserved.
fn space(p: &Path) -> (u64, u64) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a zeroed statvfs is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a valid out-pointer.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    (
        st.f_bavail * st.f_frsize,
        (st.f_bfree - st.f_bavail) * st.f_frsize,
    )
}

/// Runs `op(offset)` (which does up to `step` bytes at `offset` and says
/// how many it did) at consecutive offsets until it fails; the bytes done
/// before, and the error.
fn fill(step: u64, mut op: impl FnMut(u64) -> Result<u64, Errno>) -> (u64, Errno) {
    let mut done = 0u64;
    loop {
        assert!(done < 1 << 30, "no error after {done} bytes");
        match op(done) {
            Ok(0) => panic!("nothing done and no error at {done}"),
            Ok(n) => {
                assert!(n <= step);
                done += n;
            }
            Err(e) => return (done, e),
        }
    }
}

/// WRITEs of [`CHUNK`] bytes by `c` (with `flags`) until one fails.
fn fill_by_writes(c: &Client, node: u64, fh: u64, flags: u32) -> (u64, Errno) {
    let chunk = vec![0x5Au8; CHUNK];
    fill(CHUNK as u64, |off| {
        c.write(node, fh, off, &chunk, flags).map(u64::from)
    })
}

/// The written amount stopped where the space for users ends, and not
/// long before it (it did write, as the opener).
fn assert_stopped_at_users_space(what: &str, done: u64, err: Errno, for_users: u64) {
    assert_eq!(err, Errno::ENOSPC, "{what}: {done} bytes, then {err:?}");
    assert!(
        done <= for_users,
        "{what}: {done} bytes written where {for_users} were free for users"
    );
    assert!(
        done >= for_users / 4 * 3,
        "{what}: only {done} of {for_users} bytes written"
    );
}

/// Removes `pub/name` (node `node`, one lookup) and waits until the
/// daemon dropped its fd of it, so its blocks are free again.
fn remove(m: &Mount, name: &str, node: u64) {
    use std::os::unix::fs::MetadataExt;
    let file = m.path("pub").join(name);
    let blocks = std::fs::metadata(&file).unwrap().blocks() * 512;
    let free = |p: &Path| {
        let (users, reserved) = space(p);
        users + reserved
    };
    let before = free(&m.path("pub"));
    std::fs::remove_file(&file).unwrap();
    m.client.forget(node, 1);
    let t = std::time::Instant::now();
    while m.fs().lookup_count(node).is_some() {
        assert!(t.elapsed() < std::time::Duration::from_secs(10));
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // The daemon's last fd of the file may be closed from io_uring's side
    // (a file an I/O went through is let go of by a kernel worker): its
    // blocks are free a moment after the inode left the table.
    while free(&m.path("pub")) < before + blocks {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "{name}'s blocks never freed"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// The node id of `pub`.
fn pub_dir(m: &Mount) -> u64 {
    m.client
        .lookup(fuse_core::abi::ROOT_ID, b"pub")
        .unwrap()
        .nodeid
}

#[test]
fn writeback_writes_run_as_the_opener_and_stop_at_root_reserved_blocks() {
    let m = reserved_share(writeback_cfg(), None);
    let nobody = m.client.as_user(NOBODY, NOBODY);
    let (e, o) = nobody
        .create(pub_dir(&m), b"fill", 0o644, RW, 0o022)
        .unwrap();
    let (for_users, reserved) = space(&m.path("pub"));
    assert!(reserved > 16 << 20);
    // Exactly as the kernel sends page-cache writeback: FUSE_WRITE_CACHE,
    // header uid = gid = 0, a kernel thread's pid.
    let flusher = m.client.as_user(0, 0).with_pid(FLUSHER_PID);
    let (done, err) = fill_by_writes(&flusher, e.nodeid, o.fh, WRITE_CACHE);
    assert_stopped_at_users_space("writeback", done, err, for_users);
    m.client.release(e.nodeid, o.fh, 0).unwrap();
}

#[test]
fn a_users_plain_write_stops_at_root_reserved_blocks() {
    let m = reserved_share(writeback_cfg(), None);
    let nobody = m.client.as_user(NOBODY, NOBODY);
    let (e, o) = nobody
        .create(pub_dir(&m), b"fill", 0o644, RW, 0o022)
        .unwrap();
    let (for_users, _) = space(&m.path("pub"));
    // No FUSE_WRITE_KILL_SUIDGID: the write still runs as its caller.
    let (done, err) = fill_by_writes(&nobody, e.nodeid, o.fh, 0);
    assert_stopped_at_users_space("plain write", done, err, for_users);
    nobody.release(e.nodeid, o.fh, 0).unwrap();
}

#[test]
fn a_users_direct_writes_through_io_uring_stop_at_root_reserved_blocks() {
    // O_DIRECT writes go through the worker's io_uring; an allocating one
    // is punted to an io-wq thread, which must carry the caller's
    // credentials, not the daemon's.
    let m = reserved_share(writeback_cfg(), None);
    let nobody = m.client.as_user(NOBODY, NOBODY);
    let flags = RW | libc::O_DIRECT as u32;
    let (e, o) = nobody
        .create(pub_dir(&m), b"fill", 0o644, flags, 0o022)
        .unwrap();
    let (for_users, _) = space(&m.path("pub"));
    let before = m.fs().io_counts().write_uring;
    let (done, err) = fill_by_writes(&nobody, e.nodeid, o.fh, 0);
    assert!(
        m.fs().io_counts().write_uring > before + 100,
        "the writes did not go through io_uring"
    );
    assert_stopped_at_users_space("direct write", done, err, for_users);
    nobody.release(e.nodeid, o.fh, 0).unwrap();
}

#[test]
fn a_users_fallocate_stops_at_root_reserved_blocks() {
    let m = reserved_share(writeback_cfg(), None);
    let nobody = m.client.as_user(NOBODY, NOBODY);
    let (e, o) = nobody
        .create(pub_dir(&m), b"fill", 0o644, RW, 0o022)
        .unwrap();
    let (for_users, reserved) = space(&m.path("pub"));
    assert!(for_users > 16 << 20 && reserved > 16 << 20);
    // More than users may have, less than is free.
    let len = for_users + reserved / 2;
    assert_eq!(
        nobody.fallocate(e.nodeid, o.fh, 0, 0, len).unwrap_err(),
        Errno::ENOSPC
    );
    nobody.release(e.nodeid, o.fh, 0).unwrap();
}

#[test]
fn a_root_callers_data_ops_stop_at_blocks_reserved_for_another_user() {
    // The reserved blocks belong to uid/gid 4242: fsuid 0 gets them only
    // through CAP_SYS_RESOURCE, which a caller's data operations never
    // have. (With ext4's default resuid 0 a root caller gets them by
    // rule, capability or not.) Where the daemon itself lacks
    // CAP_SYS_RESOURCE (a container whose bounding set drops it) this
    // holds whatever the daemon does; it guards the rule on hosts that
    // grant it.
    let m = reserved_share(writeback_cfg(), Some(4242));
    let root = &m.client;
    let share = m.path("pub");
    let (for_users, reserved) = space(&share);
    assert!(reserved > 16 << 20);
    let d = pub_dir(&m);

    let (e, o) = root.create(d, b"write", 0o644, RW, 0o022).unwrap();
    let (done, err) = fill_by_writes(root, e.nodeid, o.fh, 0);
    assert_stopped_at_users_space("root's write", done, err, for_users);
    root.release(e.nodeid, o.fh, 0).unwrap();
    remove(&m, "write", e.nodeid);

    let (for_users, reserved) = space(&share);
    assert!(for_users > 16 << 20 && reserved > 16 << 20);
    let (e, o) = root.create(d, b"falloc", 0o644, RW, 0o022).unwrap();
    assert_eq!(
        root.fallocate(e.nodeid, o.fh, 0, 0, for_users + reserved / 2)
            .unwrap_err(),
        Errno::ENOSPC,
        "root's fallocate"
    );
    root.release(e.nodeid, o.fh, 0).unwrap();
    remove(&m, "falloc", e.nodeid);

    // A sparse source: copying it allocates only in the destination.
    let (for_users, _) = space(&share);
    assert!(for_users > 16 << 20);
    let src = std::fs::File::create(share.join("sparse")).unwrap();
    src.set_len(1 << 30).unwrap();
    let s = root.lookup(d, b"sparse").unwrap();
    let so = root.open(s.nodeid, libc::O_RDONLY as u32).unwrap();
    let (e, o) = root.create(d, b"copy", 0o644, RW, 0o022).unwrap();
    let (done, err) = fill(4 << 20, |off| {
        root.copy_file_range(s.nodeid, so.fh, off, e.nodeid, o.fh, off, 4 << 20)
    });
    assert_stopped_at_users_space("root's copy_file_range", done, err, for_users);
    root.release(e.nodeid, o.fh, 0).unwrap();
    root.release(s.nodeid, so.fh, 0).unwrap();
    remove(&m, "copy", e.nodeid);

    // With the users' space used up, a root caller's metadata that needs
    // blocks (a directory, an xattr value, a long symlink target) is
    // refused as a user's would be.
    let (e, o) = root.create(d, b"full", 0o644, RW, 0o022).unwrap();
    let (_, err) = fill_by_writes(root, e.nodeid, o.fh, 0);
    assert_eq!(err, Errno::ENOSPC);
    let mut refused = 0;
    for i in 0..64 {
        if root
            .mkdir(d, format!("dir{i}").as_bytes(), 0o755, 0)
            .is_err()
        {
            refused += 1;
        }
    }
    assert!(refused > 0, "root's directories took reserved blocks");
    let value = vec![b'v'; 60 * 1024];
    let xattrs_refused = (0..64)
        .filter(|i| {
            root.setxattr(e.nodeid, format!("user.big{i}").as_bytes(), &value, 0)
                .is_err()
        })
        .count();
    assert!(
        xattrs_refused > 0,
        "root's xattr values took reserved blocks"
    );
    let target = vec![b't'; 4000];
    let links_refused = (0..64)
        .filter(|i| {
            root.symlink(d, format!("l{i}").as_bytes(), &target)
                .is_err()
        })
        .count();
    assert!(links_refused > 0, "root's symlinks took reserved blocks");
    root.release(e.nodeid, o.fh, 0).unwrap();
}

#[test]
fn blocks_reserved_for_a_user_go_to_that_users_writes() {
    // ext4 gives its reserved blocks to the reserved uid: a WRITE gets
    // them exactly when the host sees the caller's fsuid.
    let m = reserved_share(writeback_cfg(), Some(4242));
    let (for_users, reserved) = space(&m.path("pub"));
    assert!(reserved > 16 << 20);
    let owner = m.client.as_user(4242, 4242);
    let (e, o) = owner
        .create(pub_dir(&m), b"owner", 0o644, RW, 0o022)
        .unwrap();
    let (done, err) = fill_by_writes(&owner, e.nodeid, o.fh, 0);
    assert_eq!(err, Errno::ENOSPC);
    assert!(
        done > for_users + reserved / 2,
        "the reserved uid wrote only {done} bytes ({for_users} free for users)"
    );
    owner.release(e.nodeid, o.fh, 0).unwrap();
}

#[test]
fn data_ops_run_as_the_translated_host_uid() {
    // --translate-uid: the host decides by the translated fsuid. The
    // guest's root as host uid 100000 stops where users' space ends (it
    // would get root's reserved blocks as fsuid 0), by plain and by
    // writeback writes; the guest's uid 7 as host uid 4242 gets the blocks
    // reserved for 4242.
    let ids = |specs: &[&str]| {
        let m: Vec<passthrough::IdMapping> = specs.iter().map(|s| s.parse().unwrap()).collect();
        passthrough::IdMap::new(&m).unwrap()
    };
    let cfg = Config {
        translate_uid: ids(&["map:0:100000:1", "guest:7:4242:1"]),
        translate_gid: ids(&["map:0:100000:1", "guest:7:4242:1"]),
        ..writeback_cfg()
    };
    let m = reserved_share(cfg.clone(), None);
    let root = &m.client;
    let d = pub_dir(&m);
    let (for_users, reserved) = space(&m.path("pub"));
    assert!(reserved > 16 << 20);
    let (e, o) = root.create(d, b"root", 0o644, RW, 0o022).unwrap();
    let (done, err) = fill_by_writes(root, e.nodeid, o.fh, 0);
    assert_stopped_at_users_space("translated root's write", done, err, for_users);
    let flusher = root.as_user(0, 0).with_pid(FLUSHER_PID);
    // (From offset 0: over what is written, then on into free blocks.)
    let (again, err) = fill_by_writes(&flusher, e.nodeid, o.fh, WRITE_CACHE);
    assert_eq!(err, Errno::ENOSPC);
    assert!(
        again < done + (1 << 20),
        "writeback went on to {again} bytes, past the {done} of users' space"
    );
    root.release(e.nodeid, o.fh, 0).unwrap();
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(m.path("pub/root")).unwrap()),
        100000
    );
    drop(m);

    let m = reserved_share(cfg, Some(4242));
    let (for_users, reserved) = space(&m.path("pub"));
    let seven = m.client.as_user(7, 7);
    let (e, o) = seven.create(pub_dir(&m), b"7", 0o644, RW, 0o022).unwrap();
    let (done, err) = fill_by_writes(&seven, e.nodeid, o.fh, 0);
    assert_eq!(err, Errno::ENOSPC);
    assert!(
        done > for_users + reserved / 2,
        "guest uid 7 (host 4242) wrote only {done} bytes ({for_users} free for users)"
    );
    seven.release(e.nodeid, o.fh, 0).unwrap();
}

#[test]
fn a_writeback_write_clears_setuid_as_its_openers_write_would() {
    let m = reserved_share(writeback_cfg(), None);
    let prog = m.path("pub/prog");
    std::fs::write(&prog, b"#!/bin/sh\n").unwrap();
    let p = m.client.lookup(pub_dir(&m), b"prog").unwrap().nodeid;
    let flusher = m.client.as_user(0, 0).with_pid(FLUSHER_PID);
    // Opened by uid 65534 (not in the file's group 0, no CAP_FSETID): its
    // own write would clear setuid and setgid, and so does the writeback
    // of its data, though the header says uid 0.
    set_mode(&prog, 0o6777);
    let nobody = m.client.as_user(NOBODY, NOBODY);
    let o = nobody.open(p, RW).unwrap();
    flusher.write(p, o.fh, 0, b"echo 1\n", WRITE_CACHE).unwrap();
    assert_eq!(mode(&prog), 0o777, "setuid/setgid survived nobody's write");
    nobody.release(p, o.fh, 0).unwrap();
    // Opened by root: its write keeps them (CAP_FSETID), so does the
    // writeback on its handle.
    set_mode(&prog, 0o6777);
    let o = m.client.open(p, RW).unwrap();
    flusher.write(p, o.fh, 0, b"echo 2\n", WRITE_CACHE).unwrap();
    assert_eq!(mode(&prog), 0o6777, "root's write cleared setuid/setgid");
    m.client.release(p, o.fh, 0).unwrap();
}

#[test]
fn a_writeback_write_keeps_the_groups_its_opener_had() {
    // Host mounts read a caller's groups from /proc/<pid>/status. The
    // opener's must be read at OPEN: at writeback its process may be gone
    // and the header names a kernel thread.
    let m = reserved_share(
        Config {
            groups: Groups::Proc,
            ..writeback_cfg()
        },
        None,
    );
    let prog = m.path("pub/prog");
    std::fs::write(&prog, b"#!/bin/sh\n").unwrap();
    std::os::unix::fs::chown(&prog, Some(0), Some(4321)).unwrap();
    // Setgid without group execute: a write clears it only when the
    // writer is outside the file's group (with group execute it always
    // goes, like setuid).
    set_mode(&prog, 0o6767);
    let p = m.client.lookup(pub_dir(&m), b"prog").unwrap().nodeid;
    let mut cmd = Command::new("sleep");
    cmd.arg("60");
    // SAFETY: setgroups is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            let g: [libc::gid_t; 1] = [4321];
            if libc::setgroups(1, g.as_ptr()) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let mut child = cmd.spawn().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    assert!(
        status.lines().any(|l| l == "Groups:\t4321 "),
        "the opener's groups: {status}"
    );
    let opener = m.client.as_user(NOBODY, NOBODY).with_pid(child.id());
    let o = opener.open(p, RW).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let flusher = m.client.as_user(0, 0).with_pid(FLUSHER_PID);
    flusher.write(p, o.fh, 0, b"echo 1\n", WRITE_CACHE).unwrap();
    // Setuid goes (no CAP_FSETID); setgid stays: the opener was in the
    // file's group 4321, as for its own write on the host.
    assert_eq!(mode(&prog), 0o2767);
    m.client.release(p, o.fh, 0).unwrap();
}

#[test]
fn a_write_flagged_kill_suidgid_clears_setuid_for_a_root_caller_too() {
    // The client kernel sets FUSE_WRITE_KILL_SUIDGID when the writer lacks
    // CAP_FSETID (a root process without it, say): the host write must
    // then clear setuid/setgid as it would for such a writer. Without the
    // flag a root caller's write keeps them.
    let m = reserved_share(writeback_cfg(), None);
    let prog = m.path("pub/prog");
    std::fs::write(&prog, b"#!/bin/sh\n").unwrap();
    let p = m.client.lookup(pub_dir(&m), b"prog").unwrap().nodeid;
    let root = &m.client;
    let o = root.open(p, RW).unwrap();
    set_mode(&prog, 0o6777);
    root.write(p, o.fh, 0, b"echo 1\n", 0).unwrap();
    assert_eq!(mode(&prog), 0o6777);
    root.write(p, o.fh, 0, b"echo 2\n", WRITE_KILL_SUIDGID)
        .unwrap();
    assert_eq!(mode(&prog), 0o777);
    root.release(p, o.fh, 0).unwrap();
}

#[test]
fn a_users_writeback_through_the_kernel_stops_at_root_reserved_blocks() {
    // The same through a real /dev/fuse mount with the writeback cache:
    // the kernel's own writeback WRITEs (header uid 0) of data a user
    // wrote must fail where that user's space ends, so fsync reports
    // ENOSPC and the host file holds no reserved block.
    use fuse_core::server::{serve_device, Dispatcher, ServerConfig};
    use host_mount::devfuse::{unmount, DevFuse, MountOptions};
    use std::io::Write;
    let host = reserved_ext4(None);
    let fs = passthrough::PassthroughFs::new(&host.path, writeback_cfg()).unwrap();
    let disp = std::sync::Arc::new(Dispatcher::new(fs, ServerConfig::default()));
    let mnt = host.path.with_extension("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let dev = DevFuse::mount(&mnt, &MountOptions::default()).unwrap();
    let workers = serve_device(dev, disp.clone(), 2);
    let (for_users, reserved) = space(&host.path.join("pub"));
    let path = mnt.join("pub/fill");
    let total = for_users + reserved / 2;
    // A thread with fsuid/fsgid 65534: the kernel checks permissions and
    // sends OPEN/CREATE with these ids.
    let user = std::thread::spawn(move || {
        // SAFETY: setfsuid/setfsgid change only this thread's credentials.
        unsafe {
            libc::setfsgid(NOBODY);
            libc::setfsuid(NOBODY);
        }
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0x5Au8; 1 << 20];
        let mut n = 0u64;
        while n < total {
            match f.write(&chunk) {
                Ok(k) => n += k as u64,
                Err(_) => break,
            }
        }
        (n, f.sync_all())
    })
    .join();
    let blocks = std::fs::metadata(host.path.join("pub/fill"))
        .map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512);
    let _ = unmount(&mnt, true);
    for w in workers {
        let _ = w.join();
    }
    let _ = std::fs::remove_dir(&mnt);
    let (wrote, synced) = user.unwrap();
    let blocks = blocks.unwrap();
    // Only the writeback cache takes more than there is room for.
    assert!(wrote > for_users, "the page cache took only {wrote} bytes");
    assert_eq!(
        synced.map_err(|e| e.raw_os_error()),
        Err(Some(libc::ENOSPC)),
        "writeback of {wrote} bytes ({for_users} free for users)"
    );
    assert!(
        blocks <= for_users,
        "the host file has {blocks} bytes of blocks; users had {for_users}"
    );
}
