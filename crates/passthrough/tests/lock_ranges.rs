//! Lock ranges from the client at the edges of the offset space: checked
//! as the kernel checks them, never overflowing, and what one owner is
//! granted is what the other is told about.

mod common;

use common::{Kind, Mount, Via};
use fuse_core::abi::{FileLock, ROOT_ID};
use fuse_core::server::{Ctx, Filesystem, LockReq};
use fuse_core::Errno;
use passthrough::Config;
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestRunner};

const MAX: u64 = i64::MAX as u64;
const RD: u32 = libc::F_RDLCK as u32;
const WR: u32 = libc::F_WRLCK as u32;
const UN: u32 = libc::F_UNLCK as u32;

fn req(owner: u64, typ: u32, start: u64, end: u64) -> LockReq {
    LockReq {
        owner,
        lock: FileLock {
            start,
            end,
            typ,
            // Each owner takes its locks as its own pid.
            pid: owner as u32 * 101,
        },
        flock: false,
    }
}

#[test]
fn getlk_beyond_offset_max_is_einval_not_a_panic() {
    let m = Mount::new(Kind::Tmpfs, Config::default(), Via::Device(1));
    let (f, o) = m
        .client
        .create(ROOT_ID, b"f", 0o644, libc::O_RDWR as u32, 0)
        .unwrap();
    let (fs, ctx) = (m.fs(), Ctx::default());
    fs.setlk(&ctx, f.nodeid, o.fh, &req(1, WR, 0, MAX)).unwrap();
    // Ranges that start or end beyond OFFSET_MAX, or end before they
    // start, meeting a lock that runs to end of file.
    for (start, end) in [
        (1 << 63, 5),
        (1 << 63, (1 << 63) + 5),
        (u64::MAX, u64::MAX),
        (u64::MAX, 0),
        (0, u64::MAX),
        (MAX, MAX + 1),
        (MAX, 0),
        (10, 9),
    ] {
        for typ in [RD, WR] {
            let r = req(2, typ, start, end);
            assert_eq!(fs.getlk(&ctx, f.nodeid, o.fh, &r), Err(Errno::EINVAL));
            assert_eq!(fs.setlk(&ctx, f.nodeid, o.fh, &r), Err(Errno::EINVAL));
        }
    }
    // The last byte is a byte like any other: owner 1's lock is named.
    let got = fs
        .getlk(&ctx, f.nodeid, o.fh, &req(2, RD, MAX, MAX))
        .unwrap();
    assert_eq!((got.typ, got.start, got.end, got.pid), (WR, 0, MAX, 101));
    fs.setlk(&ctx, f.nodeid, o.fh, &req(1, UN, MAX, MAX))
        .unwrap();
    fs.setlk(&ctx, f.nodeid, o.fh, &req(2, WR, MAX, MAX))
        .unwrap();
    let got = fs.getlk(&ctx, f.nodeid, o.fh, &req(1, RD, 0, MAX)).unwrap();
    assert_eq!((got.typ, got.start, got.end, got.pid), (WR, MAX, MAX, 202));
}

/// Whether a conflict of type `typ` reported with `pid` names `holder`.
/// A write lock has one holder, always named; a read lock may be shared
/// with the asker's own read locks there, which keeps the holder from
/// being told apart (pid 0).
fn named(typ: u32, pid: u32, holder: u64) -> bool {
    pid == holder as u32 * 101 || (typ == RD && pid == 0)
}

/// One request: owner (1 or 2), GETLK or SETLK, type, start, end.
#[derive(Debug, Clone)]
struct Op {
    owner: u64,
    getlk: bool,
    typ: u32,
    start: u64,
    end: u64,
}

fn offset() -> impl Strategy<Value = u64> {
    prop_oneof![
        prop::sample::select(vec![
            0,
            1,
            1 << 62,
            MAX - 1,
            MAX,
            MAX + 1,
            u64::MAX - 1,
            u64::MAX
        ]),
        0u64..40,
        any::<u64>(),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let typ = prop_oneof![
        4 => prop::sample::select(vec![RD, WR, UN]),
        1 => any::<u32>(),
    ];
    (1u64..=2, any::<bool>(), typ, offset(), offset()).prop_map(
        |(owner, getlk, typ, start, end)| Op {
            owner,
            getlk,
            typ,
            start,
            end,
        },
    )
}

#[test]
fn extreme_lock_ranges_are_answered_consistently() {
    let m = Mount::new(Kind::Tmpfs, Config::default(), Via::Device(1));
    let (fs, ctx) = (m.fs(), Ctx::default());
    let n = std::cell::Cell::new(0);
    let mut runner = TestRunner::new(RunnerConfig {
        cases: 200,
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let strategy = prop::collection::vec(op(), 1..40);
    runner
        .run(&strategy, |ops| {
            n.set(n.get() + 1);
            let name = format!("f{}", n.get());
            let (f, o) = m
                .client
                .create(ROOT_ID, name.as_bytes(), 0o644, libc::O_RDWR as u32, 0)
                .unwrap();
            let node = f.nodeid;
            for op in ops {
                let r = req(op.owner, op.typ, op.start, op.end);
                let other = 3 - op.owner;
                let valid = [RD, WR, UN].contains(&op.typ) && op.start <= op.end && op.end <= MAX;
                // What `other` is told about [start, end]: (type, pid) of
                // a conflicting lock.
                let seen_by_other = |typ| {
                    let got = fs
                        .getlk(&ctx, node, o.fh, &req(other, typ, op.start, op.end))
                        .unwrap();
                    if got.typ != UN {
                        assert!(got.start <= got.end && got.end <= MAX, "{got:?}");
                        assert!(got.start <= op.end && got.end >= op.start, "{got:?}");
                    }
                    (got.typ, got.pid)
                };
                if op.getlk {
                    let got = fs.getlk(&ctx, node, o.fh, &r);
                    if !valid {
                        prop_assert_eq!(got, Err(Errno::EINVAL), "{:?}", op);
                        continue;
                    }
                    let got = got.unwrap();
                    if op.typ == UN {
                        // F_OFD_GETLK's F_UNLCK: the asker's own lock.
                        prop_assert!(got.typ == UN || got.pid == op.owner as u32 * 101);
                    } else if got.typ != UN {
                        // Only the other owner can conflict.
                        prop_assert!(got.start <= got.end && got.end <= MAX, "{:?}", got);
                        prop_assert!(got.start <= op.end && got.end >= op.start, "{:?}", got);
                        prop_assert!(op.typ == WR || got.typ == WR, "{:?}", got);
                        prop_assert!(named(got.typ, got.pid, other), "{:?}", got);
                    }
                    continue;
                }
                match fs.setlk(&ctx, node, o.fh, &r) {
                    Err(Errno::EINVAL) if !valid => {}
                    Ok(()) if valid && op.typ != UN => {
                        let (typ, pid) = seen_by_other(WR);
                        prop_assert_eq!(typ, op.typ, "{:?}", op);
                        prop_assert!(named(typ, pid, op.owner), "{:?}: pid {}", op, pid);
                    }
                    Ok(()) if valid => {
                        prop_assert_eq!(seen_by_other(WR).0, UN, "{:?}", op);
                    }
                    Err(Errno::EAGAIN) if valid && op.typ != UN => {
                        // GETLK of the same request names the conflict,
                        // the other owner's.
                        let got = fs.getlk(&ctx, node, o.fh, &r).unwrap();
                        prop_assert!(got.typ == WR || op.typ == WR, "{:?}", got);
                        prop_assert!(named(got.typ, got.pid, other), "{:?}", got);
                    }
                    r => prop_assert!(false, "{:?}: {:?}", op, r),
                }
            }
            m.client.release(node, o.fh, 0).unwrap();
            Ok(())
        })
        .unwrap();
}
