//! Per-request credentials, cache policies, read-only and xattr switches,
//! the fd cap, file handles and parallel direct writes.

mod common;

use common::{host_open_flags, Kind, Mount, Via};
use fuse_core::abi::{fattr, flags, fopen, init, SetattrIn, ROOT_ID};
use fuse_core::Errno;
use passthrough::{CachePolicy, Config};
use std::os::unix::fs::{MetadataExt, PermissionsExt};

const RW: u32 = libc::O_RDWR as u32;

fn chmod(m: &Mount, rel: &str, mode: u32) {
    std::fs::set_permissions(m.path(rel), std::fs::Permissions::from_mode(mode)).unwrap();
}

fn chown(m: &Mount, rel: &str, uid: u32, gid: u32) {
    std::os::unix::fs::chown(m.path(rel), Some(uid), Some(gid)).unwrap();
}

fn setup_dirs(m: &Mount) {
    for (d, mode) in [
        ("pub", 0o777),
        ("priv", 0o700),
        ("sticky", 0o1777),
        ("sgid", 0o2777),
    ] {
        std::fs::create_dir(m.path(d)).unwrap();
        chmod(m, d, mode);
    }
    chown(m, "sgid", 0, 555);
    std::fs::write(m.path("priv/secret"), b"s").unwrap();
    std::fs::write(m.path("rootfile"), b"r").unwrap();
    chmod(m, "rootfile", 0o600);
    std::fs::write(m.path("sticky/theirs"), b"t").unwrap();
    chown(m, "sticky/theirs", 1001, 1001);
}

#[test]
fn operations_run_with_the_callers_credentials() {
    let m = Mount::new(Kind::Tmpfs, Config::default(), Via::Device(2));
    assert!(m.fs().config().creds, "tests run as root");
    setup_dirs(&m);
    let root = &m.client;
    let user = m.client.as_user(1000, 1000);
    let pubd = root.lookup(ROOT_ID, b"pub").unwrap().nodeid;
    let privd = root.lookup(ROOT_ID, b"priv").unwrap().nodeid;
    let sticky = root.lookup(ROOT_ID, b"sticky").unwrap().nodeid;
    let sgid = root.lookup(ROOT_ID, b"sgid").unwrap().nodeid;
    let rootfile = root.lookup(ROOT_ID, b"rootfile").unwrap().nodeid;

    // New files belong to the caller.
    let (e, o) = user.create(pubd, b"mine", 0o644, RW, 0o022).unwrap();
    assert_eq!((e.attr.uid, e.attr.gid), (1000, 1000));
    let md = std::fs::metadata(m.path("pub/mine")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1000, 1000));
    let dir = user.mkdir(pubd, b"mydir", 0o777, 0o027).unwrap();
    assert_eq!(dir.attr.mode & 0o777, 0o750, "the caller's umask applies");
    assert_eq!(dir.attr.uid, 1000);
    // Search and write permission are the caller's.
    assert_eq!(
        user.lookup(privd, b"secret").unwrap_err(),
        Errno(libc::EACCES)
    );
    assert_eq!(
        user.create(privd, b"x", 0o644, RW, 0).unwrap_err(),
        Errno(libc::EACCES)
    );
    assert_eq!(
        user.mkdir(privd, b"x", 0o755, 0).unwrap_err(),
        Errno(libc::EACCES)
    );
    assert_eq!(
        user.open(rootfile, libc::O_RDONLY as u32).unwrap_err(),
        Errno(libc::EACCES)
    );
    assert_eq!(
        user.access(rootfile, libc::R_OK as u32).unwrap_err(),
        Errno(libc::EACCES)
    );
    user.access(e.nodeid, (libc::R_OK | libc::W_OK) as u32)
        .unwrap();
    // Ownership rules.
    let chmod_arg = SetattrIn {
        valid: fattr::MODE,
        mode: 0o666,
        ..Default::default()
    };
    assert_eq!(
        user.setattr(rootfile, &chmod_arg).unwrap_err(),
        Errno::EPERM
    );
    let give_away = SetattrIn {
        valid: fattr::UID,
        uid: 0,
        ..Default::default()
    };
    assert_eq!(
        user.setattr(e.nodeid, &give_away).unwrap_err(),
        Errno::EPERM
    );
    let times = SetattrIn {
        valid: fattr::MTIME,
        mtime: 5,
        ..Default::default()
    };
    assert_eq!(user.setattr(rootfile, &times).unwrap_err(), Errno::EPERM);
    // Sticky directory: another user's file cannot be removed or renamed.
    assert_eq!(user.unlink(sticky, b"theirs").unwrap_err(), Errno::EPERM);
    assert_eq!(
        user.rename(sticky, b"theirs", pubd, b"stolen", 0)
            .unwrap_err(),
        Errno::EPERM
    );
    // Setgid directory: new entries take its group; subdirectories keep the bit.
    let g = user.mkdir(sgid, b"sub", 0o755, 0).unwrap();
    assert_eq!(g.attr.gid, 555);
    assert_ne!(g.attr.mode & libc::S_ISGID, 0);
    // A non-owner's write clears setuid; the root caller's does not
    // (CAP_FSETID), exactly as on a local filesystem. (The client kernel
    // flags FUSE_WRITE_KILL_SUIDGID only for writers without CAP_FSETID,
    // so root's write comes unflagged.)
    chmod(&m, "pub/mine", 0o4777);
    let other = m.client.as_user(1001, 1001);
    let oo = other.open(e.nodeid, RW).unwrap();
    other
        .write(e.nodeid, oo.fh, 0, b"x", flags::WRITE_KILL_SUIDGID)
        .unwrap();
    assert_eq!(
        std::fs::metadata(m.path("pub/mine")).unwrap().mode() & 0o7777,
        0o777
    );
    chmod(&m, "pub/mine", 0o4777);
    root.write(e.nodeid, o.fh, 0, b"y", 0).unwrap();
    assert_eq!(
        std::fs::metadata(m.path("pub/mine")).unwrap().mode() & 0o7777,
        0o4777
    );
    // Truncation by a non-owner clears it too.
    let trunc = SetattrIn {
        valid: fattr::SIZE,
        size: 0,
        ..Default::default()
    };
    other.setattr(e.nodeid, &trunc).unwrap();
    assert_eq!(
        std::fs::metadata(m.path("pub/mine")).unwrap().mode() & 0o7777,
        0o777
    );
    // The worker thread got its own credentials back: root may do anything.
    root.lookup(privd, b"secret").unwrap();
    root.setattr(rootfile, &chmod_arg).unwrap();
}

#[test]
fn without_credential_switching_the_daemon_decides() {
    // The contrast: what libfuse's passthrough_hp does. Root's daemon lets
    // anyone in, and new files belong to the daemon.
    let cfg = Config {
        creds: false,
        ..Default::default()
    };
    let m = Mount::new(Kind::Tmpfs, cfg, Via::Device(1));
    setup_dirs(&m);
    let user = m.client.as_user(1000, 1000);
    let privd = m.client.lookup(ROOT_ID, b"priv").unwrap().nodeid;
    user.lookup(privd, b"secret").unwrap();
    let (e, _) = user.create(privd, b"x", 0o644, RW, 0).unwrap();
    assert_eq!(e.attr.uid, 0);
}

#[test]
fn readonly_and_xattr_switches() {
    let m = Mount::new(
        Kind::Tmpfs,
        Config {
            readonly: true,
            xattr: false,
            ..Default::default()
        },
        Via::Device(1),
    );
    std::fs::write(m.path("f"), b"data").unwrap();
    let c = &m.client;
    let f = c.lookup(ROOT_ID, b"f").unwrap().nodeid;
    let rofs = Errno(libc::EROFS);
    assert_eq!(c.mkdir(ROOT_ID, b"d", 0o755, 0).unwrap_err(), rofs);
    assert_eq!(c.create(ROOT_ID, b"n", 0o644, RW, 0).unwrap_err(), rofs);
    assert_eq!(c.unlink(ROOT_ID, b"f").unwrap_err(), rofs);
    assert_eq!(c.rename(ROOT_ID, b"f", ROOT_ID, b"g", 0).unwrap_err(), rofs);
    assert_eq!(c.symlink(ROOT_ID, b"s", b"f").unwrap_err(), rofs);
    assert_eq!(c.open(f, RW).unwrap_err(), rofs);
    assert_eq!(c.access(f, libc::W_OK as u32).unwrap_err(), rofs);
    let sa = SetattrIn {
        valid: fattr::MODE,
        mode: 0o777,
        ..Default::default()
    };
    assert_eq!(c.setattr(f, &sa).unwrap_err(), rofs);
    let o = c.open(f, libc::O_RDONLY as u32).unwrap();
    assert_eq!(c.read(f, o.fh, 0, 10).unwrap(), b"data");
    assert_eq!(c.write(f, o.fh, 0, b"x", 0).unwrap_err(), rofs);
    assert_eq!(c.getxattr(f, b"user.a", 10).unwrap_err(), Errno::ENOSYS);
    assert_eq!(c.listxattr(f, 10).unwrap_err(), Errno::ENOSYS);
    assert_eq!(std::fs::read(m.path("f")).unwrap(), b"data");
}

#[test]
fn cache_policies_and_writeback() {
    for (cache, valid, want, not) in [
        (
            CachePolicy::Never,
            0,
            fopen::DIRECT_IO | fopen::PARALLEL_DIRECT_WRITES,
            fopen::KEEP_CACHE,
        ),
        (
            CachePolicy::Metadata,
            86400,
            fopen::DIRECT_IO,
            fopen::KEEP_CACHE,
        ),
        (
            CachePolicy::Auto,
            1,
            0,
            fopen::DIRECT_IO | fopen::KEEP_CACHE,
        ),
        (
            CachePolicy::Always,
            86400,
            fopen::KEEP_CACHE,
            fopen::DIRECT_IO,
        ),
    ] {
        let cfg = Config {
            cache,
            writeback: true,
            ..Default::default()
        };
        let m = Mount::new(Kind::Tmpfs, cfg, Via::Device(1));
        let c = &m.client;
        let (e, o) = c
            .create(ROOT_ID, b"f", 0o644, libc::O_WRONLY as u32, 0)
            .unwrap();
        assert_eq!(e.entry_valid, valid, "{cache:?}");
        assert_eq!(o.open_flags & want, want, "{cache:?}");
        assert_eq!(o.open_flags & not, 0, "{cache:?}");
        let wb = c.chan().negotiated().unwrap().flags & init::WRITEBACK_CACHE != 0;
        assert_eq!(wb, cache != CachePolicy::Never, "{cache:?}");
        c.write(e.nodeid, o.fh, 0, b"abc", 0).unwrap();
        // With the writeback cache the client reads pages of write-only
        // files: the daemon opened it read-write.
        let got = c.read(e.nodeid, o.fh, 0, 3);
        if wb {
            assert_eq!(got.unwrap(), b"abc");
        } else {
            assert_eq!(got.unwrap_err(), Errno::EBADF);
        }
        let dh = c.opendir(ROOT_ID).unwrap();
        assert_eq!(
            dh.open_flags & fopen::CACHE_DIR != 0,
            cache == CachePolicy::Always
        );
    }
}

#[test]
fn fd_cap_answers_emfile_and_recovers() {
    let cfg = Config {
        max_fds: 24,
        ..Default::default()
    };
    let m = Mount::new(Kind::Tmpfs, cfg, Via::Device(2));
    let c = &m.client;
    let mut open = Vec::new();
    let err = loop {
        match c.create(ROOT_ID, format!("f{}", open.len()).as_bytes(), 0o644, RW, 0) {
            Ok((e, o)) => open.push((e.nodeid, o.fh)),
            Err(e) => break e,
        }
        assert!(open.len() < 100, "the cap never bit");
    };
    assert_eq!(err, Errno::EMFILE);
    assert!(m.fs().fds_in_use() <= 24);
    // Still serving: metadata of what is known, and a lookup that fails
    // cleanly at the cap.
    c.getattr(ROOT_ID, None).unwrap();
    c.getattr(open[0].0, None).unwrap();
    // Closing files gives fds back.
    for (n, fh) in open.drain(..).take(5) {
        c.release(n, fh, 0).unwrap();
    }
    let (e, o) = c.create(ROOT_ID, b"after", 0o644, RW, 0).unwrap();
    c.write(e.nodeid, o.fh, 0, b"ok", 0).unwrap();
}

#[test]
fn file_handles_keep_no_fd_per_inode_beyond_half_the_fd_budget() {
    // Inodes entered while fewer than half of the 64 fds are in use keep
    // their fd as a cache; every later one only its file handle.
    let m = Mount::new(
        Kind::Ext4,
        Config {
            inode_file_handles: true,
            max_fds: 64,
            ..Default::default()
        },
        Via::Device(2),
    );
    for i in 0..300 {
        std::fs::write(m.path(&format!("f{i}")), format!("{i}")).unwrap();
    }
    let c = &m.client;
    let nodes: Vec<u64> = (0..300)
        .map(|i| {
            c.lookup(ROOT_ID, format!("f{i}").as_bytes())
                .unwrap()
                .nodeid
        })
        .collect();
    assert_eq!(m.fs().inode_count(), 301);
    assert!(
        m.fs().fds_in_use() <= 34,
        "{} fds for 300 inodes",
        m.fs().fds_in_use()
    );
    // The handles reach the files: open, read, getattr, xattrs.
    let o = c.open(nodes[123], libc::O_RDONLY as u32).unwrap();
    assert_eq!(c.read(nodes[123], o.fh, 0, 10).unwrap(), b"123");
    assert_eq!(c.getattr(nodes[7], None).unwrap().attr.size, 1);
    c.setxattr(nodes[7], b"user.h", b"1", 0).unwrap();
    // A lookup of a known inode finds the same node.
    assert_eq!(c.lookup(ROOT_ID, b"f7").unwrap().nodeid, nodes[7]);
    // A replaced file (new inode, maybe the same number) is a new node.
    std::fs::remove_file(m.path("f8")).unwrap();
    std::fs::write(m.path("f8"), b"new").unwrap();
    let again = c.lookup(ROOT_ID, b"f8").unwrap();
    assert_ne!(again.nodeid, nodes[8]);
    assert_eq!(again.attr.size, 3);
    // The same for an inode held by its handle alone.
    std::fs::remove_file(m.path("f208")).unwrap();
    std::fs::write(m.path("f208"), b"newer").unwrap();
    let again = c.lookup(ROOT_ID, b"f208").unwrap();
    assert_ne!(again.nodeid, nodes[208]);
    assert_eq!(again.attr.size, 5);
    assert_eq!(c.getattr(nodes[250], None).unwrap().attr.size, 3);
}

#[test]
fn file_handle_inodes_keep_their_fd_while_the_budget_has_room() {
    // With room (the default budget), inodes keep their fd: operations on
    // them cost no open_by_handle_at.
    let m = Mount::new(
        Kind::Ext4,
        Config {
            inode_file_handles: true,
            ..Default::default()
        },
        Via::Device(2),
    );
    for i in 0..100 {
        std::fs::write(m.path(&format!("f{i}")), b"x").unwrap();
    }
    let before = m.fs().fds_in_use();
    for i in 0..100 {
        m.client
            .lookup(ROOT_ID, format!("f{i}").as_bytes())
            .unwrap();
    }
    // One each, and one on the mount for open_by_handle_at.
    assert_eq!(m.fs().fds_in_use(), before + 101);
}

#[test]
fn parallel_direct_writers_share_the_inode_lock() {
    for parallel in [true, false] {
        let cfg = Config {
            cache: CachePolicy::Never,
            parallel_direct_writes: parallel,
            ..Default::default()
        };
        let m = Mount::new(Kind::Tmpfs, cfg, Via::Device(4));
        let (e, _) = m.client.create(ROOT_ID, b"f", 0o644, RW, 0).unwrap();
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let c = m.client.clone();
                std::thread::spawn(move || {
                    let o = c.open(e.nodeid, RW).unwrap();
                    assert_eq!(o.open_flags & fopen::PARALLEL_DIRECT_WRITES != 0, parallel);
                    let buf = vec![t as u8; 256 * 1024];
                    for i in 0..100 {
                        c.write(e.nodeid, o.fh, (t * 100 + i) * 256 * 1024, &buf, 0)
                            .unwrap();
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let seen = m.fs().max_parallel_writers();
        if parallel {
            assert!(seen >= 2, "direct writers never overlapped");
        } else {
            assert_eq!(seen, 1);
        }
        assert_eq!(
            std::fs::metadata(m.path("f")).unwrap().len(),
            400 * 256 * 1024
        );
    }
}

#[test]
fn data_io_uses_io_uring_where_it_is_not_punted() {
    // ext4 files do non-blocking reads: io_uring completes them inline.
    // tmpfs files (6.18) do not, and buffered writes are punted even on
    // ext4: those use pread/pwrite. O_DIRECT writes on ext4 use the ring.
    for (kind, reads_via_ring) in [(Kind::Ext4, true), (Kind::Tmpfs, false)] {
        let m = Mount::new(kind, Config::default(), Via::Device(1));
        let c = &m.client;
        let (e, o) = c.create(ROOT_ID, b"f", 0o644, RW, 0).unwrap();
        c.write(e.nodeid, o.fh, 0, &[7u8; 8192], 0).unwrap();
        assert_eq!(c.read(e.nodeid, o.fh, 4096, 4096).unwrap(), vec![7u8; 4096]);
        let n = m.fs().io_counts();
        assert_eq!((n.write_uring, n.write_syscall), (0, 1), "{kind:?}");
        if reads_via_ring {
            assert_eq!((n.read_uring, n.read_syscall), (1, 0), "{kind:?}");
        } else {
            assert_eq!((n.read_uring, n.read_syscall), (0, 1), "{kind:?}");
        }
        if kind == Kind::Ext4 {
            let od = c.open(e.nodeid, RW | libc::O_DIRECT as u32).unwrap();
            c.write(e.nodeid, od.fh, 4096, &[9u8; 4096], 0).unwrap();
            assert_eq!(m.fs().io_counts().write_uring, 1);
            // The request buffers are not 4 KiB aligned: bounced.
            assert_eq!(
                c.read(e.nodeid, od.fh, 4096, 4096).unwrap(),
                vec![9u8; 4096]
            );
            assert_eq!(std::fs::read(m.path("f")).unwrap()[4096..], [9u8; 4096]);
        }
    }
    // io_uring off: always the syscalls.
    let cfg = Config {
        io_uring: false,
        ..Default::default()
    };
    let m = Mount::new(Kind::Ext4, cfg, Via::Device(1));
    let (e, o) = m.client.create(ROOT_ID, b"f", 0o644, RW, 0).unwrap();
    m.client.write(e.nodeid, o.fh, 0, b"x", 0).unwrap();
    m.client.read(e.nodeid, o.fh, 0, 1).unwrap();
    let n = m.fs().io_counts();
    assert_eq!((n.read_uring, n.write_uring), (0, 0));
}

#[test]
fn non_root_callers_have_no_capabilities() {
    let m = Mount::new(Kind::Tmpfs, Config::default(), Via::Device(1));
    setup_dirs(&m);
    let user = m.client.as_user(1000, 1000);
    let pubd = m.client.lookup(ROOT_ID, b"pub").unwrap().nodeid;
    let (e, _) = user.create(pubd, b"f", 0o644, RW, 0).unwrap();
    // CAP_SYS_ADMIN would let it set trusted.* xattrs.
    assert_eq!(
        user.setxattr(e.nodeid, b"trusted.x", b"1", 0).unwrap_err(),
        Errno::EPERM
    );
    user.setxattr(e.nodeid, b"user.x", b"1", 0).unwrap();
    // Root may, and the worker got its capabilities back after the user's call.
    m.client.setxattr(e.nodeid, b"trusted.x", b"1", 0).unwrap();
    // Hard links as the caller go through the daemon's /proc/self/fd.
    let l = user.link(e.nodeid, pubd, b"g").unwrap();
    assert_eq!(l.attr.nlink, 2);
}

#[test]
fn file_handles_work_for_non_root_callers() {
    let m = Mount::new(
        Kind::Ext4,
        Config {
            inode_file_handles: true,
            ..Default::default()
        },
        Via::Device(1),
    );
    std::fs::create_dir(m.path("d")).unwrap();
    std::fs::write(m.path("d/f"), b"hi").unwrap();
    let user = m.client.as_user(1000, 1000);
    let d = user.lookup(ROOT_ID, b"d").unwrap().nodeid;
    let f = user.lookup(d, b"f").unwrap().nodeid;
    let o = user.open(f, libc::O_RDONLY as u32).unwrap();
    assert_eq!(user.read(f, o.fh, 0, 10).unwrap(), b"hi");
    assert_eq!(user.open(f, RW).unwrap_err(), Errno(libc::EACCES));
}

#[test]
fn hostile_offsets_and_readdirplus_at_the_fd_cap() {
    let m = Mount::new(Kind::Ext4, Config::default(), Via::Device(1));
    let c = &m.client;
    let (e, o) = c.create(ROOT_ID, b"f", 0o644, RW, 0).unwrap();
    c.write(e.nodeid, o.fh, 0, b"data", 0).unwrap();
    for off in [u64::MAX, 1 << 63] {
        assert_eq!(
            c.read(e.nodeid, o.fh, off, 4096).unwrap_err(),
            Errno::EINVAL
        );
        assert_eq!(
            c.write(e.nodeid, o.fh, off, b"x", 0).unwrap_err(),
            Errno::EINVAL
        );
    }
    assert_eq!(c.read(e.nodeid, o.fh, 0, 10).unwrap(), b"data");

    // READDIRPLUS that hits the fd cap mid-listing hands over what it
    // looked up; nothing stays referenced that the client was not given.
    let m = Mount::new(
        Kind::Tmpfs,
        Config {
            max_fds: 4,
            ..Default::default()
        },
        Via::Device(1),
    );
    for i in 0..10 {
        std::fs::write(m.path(&format!("f{i}")), b"").unwrap();
    }
    let c = &m.client;
    let dh = c.opendir(ROOT_ID).unwrap().fh;
    let got = c.readdirplus(ROOT_ID, dh, 0, 64 * 1024).unwrap();
    let given: Vec<u64> = got
        .iter()
        .map(|e| e.entry.nodeid)
        .filter(|&n| n != 0)
        .collect();
    assert!(!given.is_empty() && given.len() < 10, "{}", given.len());
    assert_eq!(m.fs().inode_count(), 1 + given.len());
    for n in given {
        c.forget(n, 1);
    }
    let t = std::time::Instant::now();
    while m.fs().inode_count() != 1 {
        assert!(t.elapsed().as_secs() < 5);
        std::thread::yield_now();
    }
}

#[test]
fn lock_readdirplus_and_killpriv_offers_follow_the_config() {
    let bits = |cfg: Config| {
        let m = Mount::new(Kind::Tmpfs, cfg, Via::Device(1));
        m.client.chan().negotiated().unwrap().flags
    };
    let all = init::FLOCK_LOCKS
        | init::POSIX_LOCKS
        | init::DO_READDIRPLUS
        | init::READDIRPLUS_AUTO
        | init::HANDLE_KILLPRIV_V2;
    assert!(Config::default().creds, "tests run as root");
    assert_eq!(bits(Config::default()) & all, all, "offered by default");
    for (cfg, gone) in [
        (
            Config {
                flock_locks: false,
                ..Default::default()
            },
            init::FLOCK_LOCKS,
        ),
        (
            Config {
                posix_locks: false,
                ..Default::default()
            },
            init::POSIX_LOCKS,
        ),
        (
            Config {
                readdirplus: false,
                ..Default::default()
            },
            init::DO_READDIRPLUS | init::READDIRPLUS_AUTO,
        ),
        (
            Config {
                killpriv_v2: false,
                ..Default::default()
            },
            init::HANDLE_KILLPRIV_V2,
        ),
    ] {
        let f = bits(cfg);
        assert_eq!(f & gone, 0, "{gone:#x} still negotiated");
        assert_eq!(f & all, all & !gone, "only {gone:#x} left out");
    }
}

#[test]
fn o_direct_reaches_the_host_unless_direct_io_is_off() {
    for direct_io in [true, false] {
        let m = Mount::new(
            Kind::Tmpfs,
            Config {
                direct_io,
                ..Default::default()
            },
            Via::Device(1),
        );
        let c = &m.client;
        let (e, o) = c
            .create(ROOT_ID, b"f", 0o644, RW | libc::O_DIRECT as u32, 0)
            .unwrap();
        let od = c.open(e.nodeid, RW | libc::O_DIRECT as u32).unwrap();
        let flags = host_open_flags(&m.path("f"));
        assert_eq!(flags.len(), 2, "{flags:?}");
        for f in flags {
            assert_eq!(f & libc::O_DIRECT != 0, direct_io, "{f:o}");
        }
        // Served either way.
        c.write(e.nodeid, od.fh, 0, &[7u8; 4096], 0).unwrap();
        assert_eq!(c.read(e.nodeid, o.fh, 0, 4096).unwrap(), vec![7u8; 4096]);
    }
}
