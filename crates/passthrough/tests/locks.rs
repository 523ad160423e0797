//! Lock edge cases: owner descriptions are bounded and released, a FLUSH
//! during a parked SETLKW keeps the lock it is then granted, duplicate
//! uniques and early interrupts.

mod common;

use common::{Kind, Mount, Via};
use fuse_core::abi::{FileLock, ROOT_ID};
use fuse_core::server::{Ctx, Deferred, Filesystem, LockReq};
use fuse_core::Errno;
use passthrough::Config;
use std::sync::mpsc;

const RW: u32 = libc::O_RDWR as u32;

fn wr(start: u64, end: u64) -> FileLock {
    FileLock {
        start,
        end,
        typ: libc::F_WRLCK as u32,
        pid: 0,
    }
}

fn wait_until(mut f: impl FnMut() -> bool) {
    let t = std::time::Instant::now();
    while !f() {
        assert!(t.elapsed().as_secs() < 5, "condition not reached");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

#[test]
fn owner_descriptions_are_bounded_and_released() {
    let m = Mount::new(Kind::Tmpfs, Config::default(), Via::Device(2));
    let c = &m.client;
    let (f, o) = c.create(ROOT_ID, b"f", 0o644, RW, 0).unwrap();
    // GETLK and unlocks by owners that hold nothing make no description.
    for owner in 0..200 {
        assert_eq!(
            c.getlk(f.nodeid, o.fh, owner, wr(0, 9)).unwrap().typ,
            libc::F_UNLCK as u32
        );
        let un = FileLock {
            typ: libc::F_UNLCK as u32,
            ..wr(0, 9)
        };
        c.setlk(f.nodeid, o.fh, owner, un, false).unwrap();
    }
    assert_eq!(m.fs().lock_owner_fds(), 0);
    // Owners that do lock are capped per inode.
    let mut err = None;
    for owner in 0..300u64 {
        if let Err(e) = c.setlk(f.nodeid, o.fh, owner, wr(owner, owner), false) {
            err = Some((owner, e));
            break;
        }
    }
    assert_eq!(err, Some((256, Errno(libc::ENOLCK))));
    // The inode's last release closes them all (and drops their locks).
    let o2 = c.open(f.nodeid, RW).unwrap();
    c.release(f.nodeid, o.fh, 0).unwrap();
    assert_eq!(m.fs().lock_owner_fds(), 256, "another handle is still open");
    c.release(f.nodeid, o2.fh, 0).unwrap();
    assert_eq!(m.fs().lock_owner_fds(), 0);
    let o3 = c.open(f.nodeid, RW).unwrap();
    c.setlk(f.nodeid, o3.fh, 999, wr(0, 1000), false).unwrap();
}

#[test]
fn a_lock_granted_after_a_flush_stays_held() {
    let m = Mount::new(Kind::Tmpfs, Config::default(), Via::Device(2));
    let c = &m.client;
    let (f, o) = c.create(ROOT_ID, b"f", 0o644, RW, 0).unwrap();
    c.setlk(f.nodeid, o.fh, 1, wr(0, 0), false).unwrap();
    let call = c.setlkw(f.nodeid, o.fh, 2, wr(0, 0), false);
    let w = std::thread::spawn(move || call.wait());
    wait_until(|| m.fs().parked_locks() == 1);
    // Owner 2 flushes while its SETLKW waits; then owner 1 lets go.
    c.flush(f.nodeid, o.fh, 2).unwrap();
    c.flush(f.nodeid, o.fh, 1).unwrap();
    w.join().unwrap().unwrap();
    // Owner 2 holds the lock: owner 3 cannot take it.
    assert_eq!(
        c.setlk(f.nodeid, o.fh, 3, wr(0, 0), false).unwrap_err(),
        Errno::EAGAIN
    );
    c.flush(f.nodeid, o.fh, 2).unwrap();
    c.setlk(f.nodeid, o.fh, 3, wr(0, 0), false).unwrap();
}

#[test]
fn duplicate_uniques_and_early_interrupts() {
    let m = Mount::new(Kind::Tmpfs, Config::default(), Via::Device(1));
    let c = &m.client;
    let (f, o) = c.create(ROOT_ID, b"f", 0o644, RW, 0).unwrap();
    c.setlk(f.nodeid, o.fh, 1, wr(0, 0), false).unwrap();
    let fs = m.fs();
    let req = LockReq {
        owner: 2,
        lock: wr(0, 0),
        flock: false,
    };
    let answer = || {
        let (tx, rx) = mpsc::channel();
        (
            Deferred::new(move |e| {
                let _ = tx.send(e);
            }),
            rx,
        )
    };
    let ctx = Ctx {
        unique: 77,
        ..Default::default()
    };
    let (d1, r1) = answer();
    fs.setlkw(&ctx, f.nodeid, o.fh, &req, d1);
    wait_until(|| fs.parked_locks() == 1);
    // The same unique again is refused, not parked over the first.
    let (d2, r2) = answer();
    fs.setlkw(&ctx, f.nodeid, o.fh, &req, d2);
    assert_eq!(r2.recv().unwrap(), Errno::EINVAL.to_wire());
    assert_eq!(fs.parked_locks(), 1);
    fs.interrupt(77);
    assert_eq!(r1.recv().unwrap(), Errno::EINTR.to_wire());
    // An interrupt that arrives before its SETLKW is parked still ends it.
    fs.interrupt(78);
    let (d3, r3) = answer();
    let ctx = Ctx {
        unique: 78,
        ..Default::default()
    };
    fs.setlkw(&ctx, f.nodeid, o.fh, &req, d3);
    assert_eq!(r3.recv().unwrap(), Errno::EINTR.to_wire());
    assert_eq!(fs.parked_locks(), 0);
}

#[test]
fn a_read_only_handle_cannot_take_a_write_lock() {
    let m = Mount::new(Kind::Tmpfs, Config::default(), Via::Device(1));
    let c = &m.client;
    let (f, _) = c.create(ROOT_ID, b"f", 0o644, RW, 0).unwrap();
    let ro = c.open(f.nodeid, libc::O_RDONLY as u32).unwrap();
    assert_eq!(
        c.setlk(f.nodeid, ro.fh, 1, wr(0, 0), false).unwrap_err(),
        Errno::EBADF
    );
    let rd = FileLock {
        typ: libc::F_RDLCK as u32,
        ..wr(0, 0)
    };
    c.setlk(f.nodeid, ro.fh, 1, rd, false).unwrap();
}

#[test]
fn setlkw_through_the_ring_parks_without_holding_the_queue() {
    // One ring entry (one worker): a waiting SETLKW must not keep the
    // queue from serving the request that releases its lock.
    let m = Mount::new(Kind::Tmpfs, Config::default(), Via::Ring(1));
    let c = &m.client;
    let (f, o) = c.create(ROOT_ID, b"f", 0o644, RW, 0).unwrap();
    c.setlk(f.nodeid, o.fh, 1, wr(0, 0), false).unwrap();
    let mut calls: Vec<_> = (2..5u64)
        .map(|owner| {
            let call = c.setlkw(f.nodeid, o.fh, owner, wr(0, 0), false);
            (owner, std::thread::spawn(move || call.wait()))
        })
        .collect();
    wait_until(|| m.fs().parked_locks() == 3);
    // Served meanwhile: metadata, data, and the unlock.
    c.getattr(f.nodeid, None).unwrap();
    c.write(f.nodeid, o.fh, 0, b"x", 0).unwrap();
    let un = FileLock {
        typ: libc::F_UNLCK as u32,
        ..wr(0, 0)
    };
    c.setlk(f.nodeid, o.fh, 1, un, false).unwrap();
    // The waiters get the lock one after the other: each holder's unlock
    // lets the next one in.
    while !calls.is_empty() {
        wait_until(|| calls.iter().any(|(_, t)| t.is_finished()));
        let i = calls.iter().position(|(_, t)| t.is_finished()).unwrap();
        let (owner, t) = calls.remove(i);
        t.join().unwrap().unwrap();
        assert_eq!(m.fs().parked_locks(), calls.len(), "one grant at a time");
        c.setlk(f.nodeid, o.fh, owner, un, false).unwrap();
    }
    assert_eq!(m.fs().parked_locks(), 0);
}

#[test]
fn getlk_names_the_pid_that_holds_the_lock() {
    let m = Mount::new(Kind::Tmpfs, Config::default(), Via::Device(2));
    let c = &m.client;
    let (f, o) = c.create(ROOT_ID, b"f", 0o644, RW, 0).unwrap();
    let rd = |start, end, pid| FileLock {
        typ: libc::F_RDLCK as u32,
        pid,
        ..wr(start, end)
    };
    // Owner 1 (pid 111) holds a write lock on 0..=9, owners 2 and 3 read
    // locks elsewhere: a third owner asking about 5..=5 is told pid 111.
    c.setlk(
        f.nodeid,
        o.fh,
        1,
        FileLock {
            pid: 111,
            ..wr(0, 9)
        },
        false,
    )
    .unwrap();
    c.setlk(f.nodeid, o.fh, 2, rd(20, 29, 222), false).unwrap();
    c.setlk(f.nodeid, o.fh, 3, rd(25, 35, 333), false).unwrap();
    let got = c.getlk(f.nodeid, o.fh, 9, wr(5, 5)).unwrap();
    assert_eq!(
        (got.typ, got.start, got.end, got.pid),
        (libc::F_WRLCK as u32, 0, 9, 111)
    );
    // A read lock held by one owner names that owner.
    let got = c.getlk(f.nodeid, o.fh, 9, wr(31, 31)).unwrap();
    assert_eq!((got.typ, got.pid), (libc::F_RDLCK as u32, 333));
    // Once owner 1 flushes (closes), the range is free.
    c.flush(f.nodeid, o.fh, 1).unwrap();
    let got = c.getlk(f.nodeid, o.fh, 9, wr(5, 5)).unwrap();
    assert_eq!(got.typ, libc::F_UNLCK as u32);
}

/// The size of the mapping that holds address `addr` in this process.
fn mapping_size(addr: u64) -> Option<u64> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().find_map(|l| {
        let range = l.split_whitespace().next()?;
        let (lo, hi) = range.split_once('-')?;
        let (lo, hi) = (
            u64::from_str_radix(lo, 16).ok()?,
            u64::from_str_radix(hi, 16).ok()?,
        );
        (lo..hi).contains(&addr).then_some(hi - lo)
    })
}

/// The stack mapping sizes of this process's lock waiter threads that
/// are blocked in a system call.
fn waiter_stacks() -> Vec<u64> {
    let mut stacks = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != "fusebox-lockwai" {
            continue;
        }
        let Ok(sc) = std::fs::read_to_string(task.path().join("syscall")) else {
            continue;
        };
        // "nr args... sp pc" while in a system call, "running" otherwise.
        let fields: Vec<&str> = sc.split_whitespace().collect();
        if fields.len() < 3 {
            continue;
        }
        let sp = fields[fields.len() - 2].trim_start_matches("0x");
        stacks.extend(mapping_size(u64::from_str_radix(sp, 16).unwrap()));
    }
    stacks
}

#[test]
fn parked_lock_waiters_have_small_stacks() {
    let m = Mount::new(Kind::Tmpfs, Config::default(), Via::Device(2));
    let c = &m.client;
    let (f, o) = c.create(ROOT_ID, b"f", 0o644, RW, 0).unwrap();
    c.setlk(f.nodeid, o.fh, 1, wr(0, 0), false).unwrap();
    let waits: Vec<_> = (2..6u64)
        .map(|owner| {
            let call = c.setlkw(f.nodeid, o.fh, owner, wr(0, 0), false);
            std::thread::spawn(move || call.wait())
        })
        .collect();
    wait_until(|| m.fs().parked_locks() == 4);
    // Each waiter is soon in its blocking fcntl; /proc/<tid>/syscall
    // gives its stack pointer, which lies in the thread's stack mapping.
    let mut stacks = Vec::new();
    wait_until(|| {
        stacks = waiter_stacks();
        stacks.len() >= 4
    });
    assert!(
        stacks.iter().all(|&s| s <= 256 << 10),
        "waiter stacks: {stacks:?}"
    );
    // Each holder's flush lets the next waiter in.
    wait_until(|| {
        for owner in 1..6 {
            c.flush(f.nodeid, o.fh, owner).unwrap();
        }
        waits.iter().all(|w| w.is_finished())
    });
    for w in waits {
        w.join().unwrap().unwrap();
    }
}

#[test]
fn a_lock_granted_on_a_replaced_description_stays_held() {
    let m = Mount::new(Kind::Tmpfs, Config::default(), Via::Device(2));
    let c = &m.client;
    let (f, rw) = c.create(ROOT_ID, b"f", 0o644, RW, 0).unwrap();
    let (node, rw) = (f.nodeid, rw.fh);
    let ro = c.open(node, libc::O_RDONLY as u32).unwrap().fh;
    let rd = |start, end| FileLock {
        typ: libc::F_RDLCK as u32,
        ..wr(start, end)
    };
    let un = |start, end| FileLock {
        typ: libc::F_UNLCK as u32,
        ..wr(start, end)
    };
    let free = |start, end| match c.setlk(node, rw, 9, wr(start, end), false) {
        Ok(()) => {
            c.setlk(node, rw, 9, un(start, end), false).unwrap();
            true
        }
        Err(e) => {
            assert_eq!(e, Errno::EAGAIN);
            false
        }
    };
    // A read lock waited for on owner 1's read-only description, which a
    // write lock of the same owner replaces while it waits.
    c.setlk(node, ro, 1, rd(0, 0), false).unwrap();
    c.setlk(node, rw, 2, wr(10, 10), false).unwrap();
    let call = c.setlkw(node, ro, 1, rd(10, 10), false);
    let w = std::thread::spawn(move || call.wait());
    wait_until(|| m.fs().parked_locks() == 1);
    c.setlk(node, rw, 1, wr(0, 0), false).unwrap();
    c.setlk(node, rw, 2, un(10, 10), false).unwrap();
    w.join().unwrap().unwrap();
    assert!(!free(10, 10), "the granted read lock");
    assert!(!free(0, 0), "the write lock");
    c.setlk(node, rw, 1, un(0, 10), false).unwrap();
    assert!(free(0, 10));

    // A write lock waited for on a description that its owner's FLUSH
    // took away, after which the owner locked again on a new one.
    c.setlk(node, rw, 2, wr(20, 20), false).unwrap();
    let call = c.setlkw(node, rw, 1, wr(20, 20), false);
    let w = std::thread::spawn(move || call.wait());
    wait_until(|| m.fs().parked_locks() == 1);
    c.flush(node, rw, 1).unwrap();
    c.setlk(node, rw, 1, wr(30, 30), false).unwrap();
    c.setlk(node, rw, 2, un(20, 20), false).unwrap();
    w.join().unwrap().unwrap();
    assert!(!free(20, 20), "the granted write lock");
    assert!(!free(30, 30));
    // Both live on the owner's description: its unlock reaches them.
    c.setlk(node, rw, 1, un(0, 100), false).unwrap();
    assert!(free(0, 100));
    assert_eq!(m.fs().lock_owner_fds(), 3, "owners 1, 2 and 9");

    // A read lock waited for on a read-only description is among the
    // ranges a later upgrade takes over.
    c.flush(node, rw, 1).unwrap();
    c.setlk(node, rw, 2, wr(40, 40), false).unwrap();
    let call = c.setlkw(node, ro, 1, rd(40, 40), false);
    let w = std::thread::spawn(move || call.wait());
    wait_until(|| m.fs().parked_locks() == 1);
    c.setlk(node, rw, 2, un(40, 40), false).unwrap();
    w.join().unwrap().unwrap();
    c.setlk(node, rw, 1, wr(45, 45), false).unwrap();
    assert!(!free(40, 40), "the waited-for read lock after the upgrade");
    assert!(!free(45, 45));
}
