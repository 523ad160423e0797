//! The passthrough filesystem, every opcode, through the in-process engine
//! against real directories on tmpfs and on a loop-mounted ext4, with real
//! io_uring. The host side of each result is checked with std::fs.

mod common;

use common::{Kind, Mount, Via};
use fuse_core::abi::Xattr;
use fuse_core::abi::{fattr, FileLock, SetattrIn, ROOT_ID};
use fuse_core::Errno;
use passthrough::Config;
use std::os::unix::fs::MetadataExt;

const RW: u32 = libc::O_RDWR as u32;

fn names(m: &Mount, node: u64) -> Vec<String> {
    let c = &m.client;
    let fh = c.opendir(node).unwrap().fh;
    let mut out = Vec::new();
    let mut off = 0;
    loop {
        // A small buffer, so listing pages through offsets.
        let ents = c.readdir(node, fh, off, 200).unwrap();
        let Some(last) = ents.last() else { break };
        off = last.off;
        out.extend(
            ents.iter()
                .map(|e| String::from_utf8(e.name.clone()).unwrap()),
        );
    }
    c.releasedir(node, fh).unwrap();
    out.retain(|n| n != "." && n != "..");
    out.sort();
    out
}

fn every_op(kind: Kind, via: Via) {
    let m = Mount::new(kind, Config::default(), via);
    let c = &m.client;

    // LOOKUP: ".", ".." at the root, a miss.
    assert_eq!(c.lookup(ROOT_ID, b".").unwrap().nodeid, ROOT_ID);
    assert_eq!(c.lookup(ROOT_ID, b"..").unwrap().nodeid, ROOT_ID);
    assert_eq!(c.lookup(ROOT_ID, b"nope").unwrap_err(), Errno::ENOENT);

    // MKDIR, CREATE, WRITE, READ, GETATTR.
    let d = c.mkdir(ROOT_ID, b"d", 0o755, 0o022).unwrap();
    assert!(m.path("d").is_dir());
    assert_eq!(c.mkdir(ROOT_ID, b"d", 0o755, 0).unwrap_err(), Errno::EEXIST);
    let (f, o) = c
        .create(
            d.nodeid,
            b"f",
            libc::S_IFREG | 0o640,
            RW | libc::O_EXCL as u32,
            0,
        )
        .unwrap();
    assert_eq!(
        c.create(d.nodeid, b"f", 0o640, RW | libc::O_EXCL as u32, 0)
            .unwrap_err(),
        Errno::EEXIST
    );
    assert_eq!(f.attr.mode & 0o7777, 0o640);
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
    assert_eq!(
        c.write(f.nodeid, o.fh, 0, &data, 0).unwrap(),
        data.len() as u32
    );
    assert_eq!(c.read(f.nodeid, o.fh, 0, 300_000).unwrap(), data);
    assert_eq!(
        c.read(f.nodeid, o.fh, 199_990, 100).unwrap(),
        &data[199_990..]
    );
    assert_eq!(std::fs::read(m.path("d/f")).unwrap(), data);
    assert_eq!(c.getattr(f.nodeid, None).unwrap().attr.size, 200_000);
    assert_eq!(c.getattr(f.nodeid, Some(o.fh)).unwrap().attr.size, 200_000);
    c.flush(f.nodeid, o.fh, 7).unwrap();
    c.fsync(f.nodeid, o.fh, false).unwrap();
    c.fsync(f.nodeid, o.fh, true).unwrap();

    // SETATTR: truncate (by handle and by inode), mode, owner, times, ctime.
    let mut sa = SetattrIn {
        valid: fattr::SIZE | fattr::FH,
        fh: o.fh,
        size: 1000,
        ..Default::default()
    };
    assert_eq!(c.setattr(f.nodeid, &sa).unwrap().attr.size, 1000);
    sa = SetattrIn {
        valid: fattr::SIZE,
        size: 10,
        ..Default::default()
    };
    assert_eq!(c.setattr(f.nodeid, &sa).unwrap().attr.size, 10);
    sa = SetattrIn {
        valid: fattr::MODE,
        mode: 0o600,
        ..Default::default()
    };
    assert_eq!(c.setattr(f.nodeid, &sa).unwrap().attr.mode & 0o7777, 0o600);
    sa = SetattrIn {
        valid: fattr::UID | fattr::GID,
        uid: 1234,
        gid: 4321,
        ..Default::default()
    };
    let a = c.setattr(f.nodeid, &sa).unwrap().attr;
    assert_eq!((a.uid, a.gid), (1234, 4321));
    assert_eq!(std::fs::metadata(m.path("d/f")).unwrap().uid(), 1234);
    sa = SetattrIn {
        valid: fattr::ATIME | fattr::MTIME,
        atime: 1_000_000,
        atimensec: 5,
        mtime: 2_000_000,
        mtimensec: 7,
        ..Default::default()
    };
    let a = c.setattr(f.nodeid, &sa).unwrap().attr;
    assert_eq!(
        (a.atime, a.atimensec, a.mtime, a.mtimensec),
        (1_000_000, 5, 2_000_000, 7)
    );
    sa = SetattrIn {
        valid: fattr::MTIME_NOW,
        ..Default::default()
    };
    assert!(c.setattr(f.nodeid, &sa).unwrap().attr.mtime > 2_000_000);
    let before = c.getattr(f.nodeid, None).unwrap().attr;
    std::thread::sleep(std::time::Duration::from_millis(20));
    sa = SetattrIn {
        valid: fattr::CTIME,
        ..Default::default()
    };
    let after = c.setattr(f.nodeid, &sa).unwrap().attr;
    assert!((after.ctime, after.ctimensec) > (before.ctime, before.ctimensec));
    assert_eq!(after.mtime, before.mtime);

    // SYMLINK, READLINK, MKNOD.
    let s = c.symlink(d.nodeid, b"s", b"../../../etc/passwd").unwrap();
    assert_eq!(c.readlink(s.nodeid).unwrap(), b"../../../etc/passwd");
    assert_eq!(s.attr.mode & libc::S_IFMT, libc::S_IFLNK);
    let p = c
        .mknod(d.nodeid, b"pipe", libc::S_IFIFO | 0o644, 0, 0)
        .unwrap();
    assert_eq!(p.attr.mode & libc::S_IFMT, libc::S_IFIFO);

    // LINK, UNLINK, RMDIR.
    let l = c.link(f.nodeid, ROOT_ID, b"hard").unwrap();
    assert_eq!(l.nodeid, f.nodeid, "a hard link is the same inode");
    assert_eq!(l.attr.nlink, 2);
    c.unlink(ROOT_ID, b"hard").unwrap();
    c.forget(l.nodeid, 1);
    assert_eq!(c.lookup(ROOT_ID, b"hard").unwrap_err(), Errno::ENOENT);
    assert_eq!(c.rmdir(ROOT_ID, b"d").unwrap_err(), Errno::ENOTEMPTY);
    assert_eq!(c.unlink(ROOT_ID, b"d").unwrap_err(), Errno::EISDIR);
    let e = c.mkdir(ROOT_ID, b"empty", 0o700, 0).unwrap();
    c.rmdir(ROOT_ID, b"empty").unwrap();
    assert!(!m.path("empty").exists());
    c.forget(e.nodeid, 1);

    // RENAME, RENAME2 NOREPLACE / EXCHANGE / WHITEOUT.
    std::fs::write(m.path("a"), b"A").unwrap();
    std::fs::write(m.path("b"), b"B").unwrap();
    c.rename(ROOT_ID, b"a", d.nodeid, b"a2", 0).unwrap();
    assert_eq!(std::fs::read(m.path("d/a2")).unwrap(), b"A");
    c.rename(d.nodeid, b"a2", ROOT_ID, b"b", 0).unwrap();
    assert_eq!(
        std::fs::read(m.path("b")).unwrap(),
        b"A",
        "rename over an existing file"
    );
    std::fs::write(m.path("c"), b"C").unwrap();
    assert_eq!(
        c.rename(ROOT_ID, b"c", ROOT_ID, b"b", 1).unwrap_err(),
        Errno::EEXIST
    );
    c.rename(ROOT_ID, b"c", ROOT_ID, b"b", 2).unwrap();
    assert_eq!(std::fs::read(m.path("b")).unwrap(), b"C");
    assert_eq!(std::fs::read(m.path("c")).unwrap(), b"A");
    c.rename(ROOT_ID, b"c", ROOT_ID, b"w", 4).unwrap();
    let wh = std::fs::symlink_metadata(m.path("c")).unwrap();
    assert_eq!(
        wh.mode() & libc::S_IFMT,
        libc::S_IFCHR,
        "whiteout left behind"
    );
    assert_eq!(
        c.rename(ROOT_ID, b"b", ROOT_ID, b"x", 64).unwrap_err(),
        Errno::EINVAL
    );

    // OPEN of an existing file, O_TRUNC, O_APPEND.
    let w = c.lookup(ROOT_ID, b"w").unwrap();
    let o2 = c.open(w.nodeid, RW | libc::O_TRUNC as u32).unwrap();
    assert_eq!(c.getattr(w.nodeid, None).unwrap().attr.size, 0);
    c.write(w.nodeid, o2.fh, 0, b"hello world", 0).unwrap();
    c.release(w.nodeid, o2.fh, 0).unwrap();
    assert_eq!(c.read(w.nodeid, o2.fh, 0, 10).unwrap_err(), Errno::EBADF);

    // STATFS, ACCESS, STATX.
    let st = c.statfs(ROOT_ID).unwrap();
    assert!(st.blocks > 0 && st.namelen == 255);
    c.access(f.nodeid, libc::R_OK as u32).unwrap();
    let sx = c.statx(w.nodeid, None, 0, libc::STATX_BASIC_STATS).unwrap();
    assert_eq!(sx.stat.size, 11);
    assert_eq!(sx.stat.ino, std::fs::metadata(m.path("w")).unwrap().ino());

    // XATTRS.
    c.setxattr(w.nodeid, b"user.k", b"value", 0).unwrap();
    assert_eq!(c.getxattr(w.nodeid, b"user.k", 0).unwrap(), Xattr::Size(5));
    assert_eq!(
        c.getxattr(w.nodeid, b"user.k", 64).unwrap(),
        Xattr::Data(b"value".to_vec())
    );
    assert_eq!(
        c.getxattr(w.nodeid, b"user.k", 2).unwrap_err(),
        Errno::ERANGE
    );
    assert_eq!(
        c.getxattr(w.nodeid, b"user.none", 64).unwrap_err(),
        Errno::ENODATA
    );
    assert_eq!(
        c.setxattr(w.nodeid, b"user.k", b"v", 1).unwrap_err(),
        Errno::EEXIST,
        "XATTR_CREATE"
    );
    match c.listxattr(w.nodeid, 256).unwrap() {
        Xattr::Data(l) => assert!(l.split(|&b| b == 0).any(|n| n == b"user.k")),
        other => panic!("{other:?}"),
    }
    c.removexattr(w.nodeid, b"user.k").unwrap();
    assert_eq!(
        c.removexattr(w.nodeid, b"user.k").unwrap_err(),
        Errno::ENODATA
    );

    // READDIR (paged) and READDIRPLUS (each entry a lookup reference).
    for i in 0..40 {
        std::fs::write(m.path(&format!("d/many-{i:02}")), b"").unwrap();
    }
    let listed = names(&m, d.nodeid);
    assert_eq!(listed.len(), 43, "{listed:?}");
    assert!(listed.contains(&"many-39".to_string()) && listed.contains(&"pipe".to_string()));
    // The FORGETs sent above need not be applied yet (the engine queues
    // them): the count to come back to is the one after them.
    common_wait(|| {
        m.fs().lookup_count(e.nodeid).is_none() && m.fs().lookup_count(f.nodeid) == Some(1)
    });
    let inodes_before = m.fs().inode_count();
    let fh = c.opendir(d.nodeid).unwrap().fh;
    let plus = c.readdirplus(d.nodeid, fh, 0, 64 * 1024).unwrap();
    c.releasedir(d.nodeid, fh).unwrap();
    let looked: Vec<_> = plus.iter().filter(|e| e.entry.nodeid != 0).collect();
    assert_eq!(looked.len(), 43);
    assert!(plus
        .iter()
        .filter(|e| e.entry.nodeid == 0)
        .all(|e| e.dirent.name == b"." || e.dirent.name == b".."));
    let fnode = looked.iter().find(|e| e.dirent.name == b"f").unwrap();
    assert_eq!(fnode.entry.nodeid, f.nodeid);
    assert_eq!(m.fs().lookup_count(f.nodeid), Some(2));
    for e in &looked {
        c.forget(e.entry.nodeid, 1);
    }
    common_wait(|| {
        m.fs().inode_count() == inodes_before && m.fs().lookup_count(f.nodeid) == Some(1)
    });
    let dh = c.opendir(d.nodeid).unwrap().fh;
    c.fsyncdir(d.nodeid, dh, false).unwrap();
    c.releasedir(d.nodeid, dh).unwrap();

    // TMPFILE.
    let (t, to) = c.tmpfile(d.nodeid, 0o600, RW, 0).unwrap();
    c.write(t.nodeid, to.fh, 0, b"tmp", 0).unwrap();
    assert_eq!(c.read(t.nodeid, to.fh, 0, 10).unwrap(), b"tmp");
    assert_eq!(t.attr.nlink, 0);
    c.release(t.nodeid, to.fh, 0).unwrap();

    // FALLOCATE, LSEEK (SEEK_DATA / SEEK_HOLE), COPY_FILE_RANGE.
    let (sp, so) = c.create(ROOT_ID, b"sparse", 0o644, RW, 0).unwrap();
    c.fallocate(sp.nodeid, so.fh, 0, 0, 1 << 20).unwrap();
    assert_eq!(c.getattr(sp.nodeid, None).unwrap().attr.size, 1 << 20);
    c.fallocate(
        sp.nodeid,
        so.fh,
        (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as u32,
        0,
        1 << 20,
    )
    .unwrap();
    c.write(sp.nodeid, so.fh, 512 * 1024, &[1u8; 4096], 0)
        .unwrap();
    assert_eq!(
        c.lseek(sp.nodeid, so.fh, 0, libc::SEEK_DATA as u32)
            .unwrap(),
        512 * 1024
    );
    let hole = c
        .lseek(sp.nodeid, so.fh, 512 * 1024, libc::SEEK_HOLE as u32)
        .unwrap();
    assert!((512 * 1024 + 4096..=1 << 20).contains(&hole));
    assert_eq!(
        c.lseek(sp.nodeid, so.fh, 1 << 21, libc::SEEK_DATA as u32)
            .unwrap_err(),
        Errno(libc::ENXIO)
    );
    let (cp, co) = c.create(ROOT_ID, b"copy", 0o644, RW, 0).unwrap();
    assert_eq!(
        c.copy_file_range(sp.nodeid, so.fh, 512 * 1024, cp.nodeid, co.fh, 0, 4096)
            .unwrap(),
        4096
    );
    assert_eq!(std::fs::read(m.path("copy")).unwrap(), vec![1u8; 4096]);

    // SYNCFS, errors on unknown nodes and handles, DESTROY.
    c.syncfs(ROOT_ID).unwrap();
    assert_eq!(c.getattr(999_999, None).unwrap_err(), Errno::EBADF);
    assert_eq!(c.read(f.nodeid, 999_999, 0, 1).unwrap_err(), Errno::EBADF);
    assert_eq!(
        c.lookup(ROOT_ID, &[b'x'; 256]).unwrap_err(),
        Errno::ENAMETOOLONG
    );
    c.destroy().unwrap();
    assert_eq!(m.fs().inode_count(), 1);
    assert_eq!(m.fs().handle_count(), 0);
    assert_eq!(m.fs().fds_in_use(), 1, "only the root's fd is left");
}

fn common_wait(mut cond: impl FnMut() -> bool) {
    let t = std::time::Instant::now();
    while !cond() {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
            "condition not reached"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

#[test]
fn every_op_on_tmpfs() {
    every_op(Kind::Tmpfs, Via::Device(2));
}

#[test]
fn every_op_on_ext4() {
    every_op(Kind::Ext4, Via::Device(2));
}

#[test]
fn every_op_through_the_ring() {
    every_op(Kind::Tmpfs, Via::Ring(2));
}

#[test]
fn locks_posix_flock_and_parked_setlkw() {
    let m = Mount::new(Kind::Tmpfs, Config::default(), Via::Device(2));
    let c = &m.client;
    let (f, o) = c.create(ROOT_ID, b"l", 0o644, RW, 0).unwrap();
    let o2 = c.open(f.nodeid, RW).unwrap();
    let wr = |start, end| FileLock {
        start,
        end,
        typ: libc::F_WRLCK as u32,
        pid: 0,
    };
    // Owner 1 locks 0..99; owner 2 sees the conflict and cannot lock.
    c.setlk(f.nodeid, o.fh, 1, wr(0, 99), false).unwrap();
    let got = c.getlk(f.nodeid, o2.fh, 2, wr(50, 60)).unwrap();
    assert_eq!((got.typ, got.start, got.end), (libc::F_WRLCK as u32, 0, 99));
    assert_eq!(
        c.getlk(f.nodeid, o2.fh, 2, wr(100, 200)).unwrap().typ,
        libc::F_UNLCK as u32
    );
    assert_eq!(
        c.setlk(f.nodeid, o2.fh, 2, wr(50, 60), false).unwrap_err(),
        Errno::EAGAIN
    );
    // The same owner may relock its own range.
    c.setlk(f.nodeid, o.fh, 1, wr(10, 20), false).unwrap();

    // SETLKW parks without pinning a worker: with 2 workers, 3 waiters
    // park and the server still answers.
    let spawn = |call: fuse_core::Call| {
        let sig = call.signal();
        (sig, std::thread::spawn(move || call.wait()))
    };
    let waits: Vec<_> = (0..3)
        .map(|i| spawn(c.setlkw(f.nodeid, o2.fh, 10 + i, wr(0, 0), false)))
        .collect();
    common_wait(|| m.fs().parked_locks() == 3);
    c.getattr(f.nodeid, None).unwrap();
    // An interrupt ends one wait with EINTR.
    let mut waits = waits.into_iter();
    let (sig, first) = waits.next().unwrap();
    sig.interrupt();
    assert_eq!(first.join().unwrap().unwrap_err(), Errno::EINTR);
    common_wait(|| m.fs().parked_locks() == 2);
    // FLUSH by owner 1 (its close) drops its locks: exactly one of the two
    // remaining waiters gets the lock, the other stays parked until the
    // winner's owner flushes too.
    c.flush(f.nodeid, o.fh, 1).unwrap();
    common_wait(|| m.fs().parked_locks() == 1);
    let (_, w1) = waits.next().unwrap();
    let (_, w2) = waits.next().unwrap();
    common_wait(|| w1.is_finished() || w2.is_finished());
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(
        !(w1.is_finished() && w2.is_finished()),
        "both got one exclusive lock"
    );
    let (winner, loser, owner) = if w1.is_finished() {
        (w1, w2, 11)
    } else {
        (w2, w1, 12)
    };
    winner.join().unwrap().unwrap();
    c.flush(f.nodeid, o2.fh, owner).unwrap();
    loser.join().unwrap().unwrap();
    c.flush(f.nodeid, o2.fh, 11).unwrap();
    c.flush(f.nodeid, o2.fh, 12).unwrap();

    // flock: exclusive on one open file excludes the other open file.
    c.setlk(f.nodeid, o.fh, 0, wr(0, 0), true).unwrap();
    assert_eq!(
        c.setlk(f.nodeid, o2.fh, 0, wr(0, 0), true).unwrap_err(),
        Errno::EAGAIN
    );
    let (_, w) = spawn(c.setlkw(f.nodeid, o2.fh, 0, wr(0, 0), true));
    common_wait(|| m.fs().parked_locks() == 1);
    c.release(f.nodeid, o.fh, 0).unwrap();
    w.join().unwrap().unwrap();
}
