//! WRITEs started without waiting (`Filesystem::start_write`) on the test
//! thread's own io_uring, straight from client memory (a raw allocation
//! standing in for guest RAM), submitted with one `submit_started` and
//! answered by `collect_started`, as a transport drives them. The files are
//! opened through the engine's embedded client; the started writes go to
//! the served `PassthroughFs` directly, on this thread. Needs root (mount,
//! loop devices, other users' credentials).

mod common;

use common::{Kind, Loop, Mem, Mount, Via};
use fuse_core::abi::flags::WRITE_KILL_SUIDGID;
use fuse_core::abi::ROOT_ID;
use fuse_core::server::{Ctx, Filesystem, FsResult, IoDone};
use fuse_core::{ClientMem, Errno};
use passthrough::{CachePolicy, Config, PassthroughFs};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const RW: u32 = libc::O_RDWR as u32;
const DIRECT: u32 = libc::O_DIRECT as u32;
const USER: u32 = 1000;

fn ctx(uid: u32, gid: u32) -> Ctx<'static> {
    static UNIQUE: AtomicU64 = AtomicU64::new(1 << 40);
    Ctx {
        unique: UNIQUE.fetch_add(2, Ordering::Relaxed),
        uid,
        gid,
        pid: 1,
        ..Ctx::default()
    }
}

/// Offers the WRITE of `mem` to `fs` on `lp`: its unique if started, None
/// if declined.
#[allow(clippy::too_many_arguments)]
fn start(
    fs: &PassthroughFs,
    lp: &mut Loop,
    ctx: &Ctx,
    node: u64,
    fh: u64,
    off: u64,
    mem: &Arc<Mem>,
    flags: u32,
) -> Option<u64> {
    let done = IoDone::new(ctx.unique);
    let m: Arc<dyn ClientMem> = mem.clone();
    fs.start_write(
        &mut lp.io,
        &mut lp.done,
        ctx,
        node,
        fh,
        off,
        &m,
        flags,
        done,
    )
    .ok()
    .map(|()| ctx.unique)
}

/// Submits what `lp` started and takes completions until none is in
/// flight.
fn run(fs: &PassthroughFs, lp: &mut Loop) {
    lp.submit(fs);
    let t = Instant::now();
    while fs.started_in_flight(&lp.io) > 0 {
        assert!(t.elapsed() < Duration::from_secs(20), "writes never ended");
        if fs.collect_started(&mut lp.io, &mut lp.done) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn answer(lp: &mut Loop, unique: u64) -> FsResult<usize> {
    lp.answer(unique).expect("a started write was not answered")
}

/// A writable ext4 served through device workers.
fn mount(cfg: Config) -> Mount {
    assert!(cfg.creds, "these tests run as root");
    Mount::new(Kind::Ext4, cfg, Via::Device(1))
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

fn set_mode(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// This thread's fsuid now.
fn fsuid() -> u32 {
    // SAFETY: -1 is no valid id: the call only reports the current one.
    unsafe { libc::setfsuid(u32::MAX) as u32 }
}

fn pattern(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|k| (i * 31 + k / 7) as u8).collect()
}

#[test]
fn sixteen_started_writes_land_byte_for_byte() {
    let m = mount(Config::default());
    let fs = m.fs();
    let mut lp = Loop::new(fs);
    let (e, o) = m
        .client
        .create(ROOT_ID, b"f", 0o644, RW | DIRECT, 0)
        .unwrap();
    const LEN: usize = 64 << 10;
    let before = fs.io_counts();
    let mut started = Vec::new();
    // Out of order, from one thread, none submitted before the last.
    for i in [5, 0, 15, 9, 1, 12, 3, 7, 14, 2, 8, 11, 4, 13, 6, 10] {
        let mem = Mem::new(&pattern(i, LEN), 0);
        let rx = start(
            fs,
            &mut lp,
            &ctx(0, 0),
            e.nodeid,
            o.fh,
            (i * LEN) as u64,
            &mem,
            0,
        )
        .expect("an O_DIRECT write to ext4 is started");
        started.push((mem, rx));
    }
    assert_eq!(fs.started_in_flight(&lp.io), 16);
    assert!(
        fs.max_parallel_writers() >= 16,
        "started writes are writers"
    );
    for (mem, rx) in &started {
        assert_eq!(mem.held(), 1, "memory held from the start");
        assert!(
            lp.answer(rx.to_owned()).is_err(),
            "answered before its completion"
        );
    }
    run(fs, &mut lp);
    for (mem, rx) in &started {
        assert_eq!(answer(&mut lp, rx.to_owned()), Ok(LEN));
        assert_eq!(mem.held(), 0, "memory held after the answer");
    }
    let counts = fs.io_counts();
    assert!(counts.write_uring >= before.write_uring + 16);
    assert_eq!(counts.write_syscall, before.write_syscall);
    let host = std::fs::read(m.path("f")).unwrap();
    let want: Vec<u8> = (0..16).flat_map(|i| pattern(i, LEN)).collect();
    assert!(host == want, "the file differs from what was written");
    m.client.release(e.nodeid, o.fh, 0).unwrap();
}

#[test]
fn a_write_of_more_spans_than_one_call_takes_is_continued() {
    // One WRITEV carries at most 1024 iovecs: the rest of a write of 1100
    // spans goes in a second op, started from the first one's completion.
    let m = mount(Config::default());
    let fs = m.fs();
    let mut lp = Loop::new(fs);
    let (e, o) = m
        .client
        .create(ROOT_ID, b"f", 0o644, RW | DIRECT, 0)
        .unwrap();
    let data = pattern(9, 1100 * 4096);
    let mem = Mem::split(&data, 4096);
    let before = fs.io_counts().write_uring;
    let rx = start(fs, &mut lp, &ctx(0, 0), e.nodeid, o.fh, 4096, &mem, 0).expect("started");
    run(fs, &mut lp);
    assert_eq!(answer(&mut lp, rx.to_owned()), Ok(data.len()));
    assert_eq!(fs.io_counts().write_uring, before + 2, "one continuation");
    assert_eq!(mem.held(), 0);
    let host = std::fs::read(m.path("f")).unwrap();
    assert!(host[..4096].iter().all(|&b| b == 0) && host[4096..] == data[..]);
    m.client.release(e.nodeid, o.fh, 0).unwrap();
}

#[test]
fn a_started_write_clears_setuid_as_the_inline_write_does() {
    let m = mount(Config::default());
    let fs = m.fs();
    let mut lp = Loop::new(fs);
    let prog = m.path("prog");
    std::fs::write(&prog, vec![0u8; 8192]).unwrap();
    std::os::unix::fs::chown(&prog, Some(USER), Some(USER)).unwrap();
    let node = m.client.lookup(ROOT_ID, b"prog").unwrap().nodeid;
    let user = m.client.as_user(USER, USER);
    let uo = user.open(node, RW | DIRECT).unwrap();
    let ro = m.client.open(node, RW | DIRECT).unwrap();
    let data = vec![0x42u8; 4096];

    // The baseline without a personality: an io_uring write this thread
    // (root, with CAP_FSETID) submits keeps setuid and setgid.
    set_mode(&prog, 0o6755);
    let f = std::fs::OpenOptions::new().write(true).open(&prog).unwrap();
    let mut d = host_io::Driver::new(4).unwrap();
    let fd = host_io::Target::Fd(std::os::fd::AsRawFd::as_raw_fd(&f));
    assert_eq!(d.write_from(fd, &data, 0, 1).unwrap(), 4096);
    assert_eq!(mode(&prog), 0o6755);

    // Started by the owner (no CAP_FSETID): submitted and completed later
    // by this thread as root, it still runs as the owner and clears them.
    let mem = Mem::new(&data, 0);
    let rx = start(fs, &mut lp, &ctx(USER, USER), node, uo.fh, 0, &mem, 0).expect("started");
    assert_eq!(fsuid(), 0, "the thread is itself again before the submit");
    run(fs, &mut lp);
    assert_eq!(answer(&mut lp, rx.to_owned()), Ok(4096));
    assert_eq!(mode(&prog), 0o755, "the started write kept setuid/setgid");

    // As the synchronous write does.
    set_mode(&prog, 0o6755);
    assert_eq!(user.write(node, uo.fh, 4096, &data, 0), Ok(4096));
    assert_eq!(
        mode(&prog),
        0o755,
        "the synchronous write kept setuid/setgid"
    );

    // A root caller keeps them, synchronously and started...
    set_mode(&prog, 0o6755);
    assert_eq!(m.client.write(node, ro.fh, 0, &data, 0), Ok(4096));
    let rx = start(fs, &mut lp, &ctx(0, 0), node, ro.fh, 0, &mem, 0).expect("started");
    run(fs, &mut lp);
    assert_eq!(answer(&mut lp, rx.to_owned()), Ok(4096));
    assert_eq!(mode(&prog), 0o6755, "root's started write cleared them");
    // ...unless the client says it lacks CAP_FSETID.
    let rx = start(
        fs,
        &mut lp,
        &ctx(0, 0),
        node,
        ro.fh,
        0,
        &mem,
        WRITE_KILL_SUIDGID,
    )
    .expect("started");
    run(fs, &mut lp);
    assert_eq!(answer(&mut lp, rx.to_owned()), Ok(4096));
    assert_eq!(mode(&prog), 0o755, "KILL_SUIDGID did not clear them");
    user.release(node, uo.fh, 0).unwrap();
    m.client.release(node, ro.fh, 0).unwrap();
}

#[test]
fn buffered_host_writes_are_served_in_line_whatever_their_size() {
    // With cache=never every open is direct I/O for the client (the lock
    // is taken shared) while the host file is written through its page
    // cache. io_uring would run such writes on io-wq workers, where the
    // host serialises them on the inode lock anyway: they are declined,
    // small and large, and the usual path writes them.
    let m = mount(Config {
        cache: CachePolicy::Never,
        ..Config::default()
    });
    let fs = m.fs();
    let mut lp = Loop::new(fs);
    let f = m.path("f");
    std::fs::write(&f, b"").unwrap();
    let node = m.client.lookup(ROOT_ID, b"f").unwrap().nodeid;
    let o = m.client.open(node, RW).unwrap();
    for len in [4096, 1 << 20] {
        let mem = Mem::new(&pattern(1, len), 0);
        assert!(
            start(fs, &mut lp, &ctx(0, 0), node, o.fh, 0, &mem, 0).is_none(),
            "a buffered write of {len} bytes was started"
        );
        assert_eq!(mem.held(), 0);
    }
    m.client.release(node, o.fh, 0).unwrap();
}

#[test]
fn writes_the_usual_path_refuses_are_declined_or_fail_alike() {
    let m = mount(Config::default());
    let fs = m.fs();
    let mut lp = Loop::new(fs);
    std::fs::write(m.path("f"), vec![7u8; 8192]).unwrap();
    let node = m.client.lookup(ROOT_ID, b"f").unwrap().nodeid;
    let data = vec![1u8; 4096];
    let mem = Mem::new(&data, 0);

    // A read-only handle: started, and the host refuses it as it refuses
    // the synchronous write.
    let o = m.client.open(node, libc::O_RDONLY as u32 | DIRECT).unwrap();
    assert_eq!(m.client.write(node, o.fh, 0, &data, 0), Err(Errno::EBADF));
    let rx = start(fs, &mut lp, &ctx(0, 0), node, o.fh, 0, &mem, 0).expect("started");
    run(fs, &mut lp);
    assert_eq!(answer(&mut lp, rx.to_owned()), Err(Errno::EBADF));
    m.client.release(node, o.fh, 0).unwrap();

    // A handle whose writes take the inode's lock exclusively (buffered,
    // no direct I/O): declined.
    let o = m.client.open(node, RW).unwrap();
    assert!(start(fs, &mut lp, &ctx(0, 0), node, o.fh, 0, &mem, 0).is_none());
    m.client.release(node, o.fh, 0).unwrap();

    // No such handle; nothing to write.
    assert!(start(fs, &mut lp, &ctx(0, 0), node, 999_999, 0, &mem, 0).is_none());
    assert_eq!(
        m.client.write(node, 999_999, 0, &data, 0),
        Err(Errno::EBADF)
    );
    assert_eq!(mem.held(), 0, "a declined write holds no memory");
    assert_eq!(fs.started_in_flight(&lp.io), 0);
    assert!(std::fs::read(m.path("f")).unwrap() == vec![7u8; 8192]);

    // A read-only share: declined, and the synchronous write says EROFS.
    drop(m);
    let m = mount(Config {
        readonly: true,
        ..Config::default()
    });
    std::fs::write(m.path("f"), b"x").unwrap();
    let node = m.client.lookup(ROOT_ID, b"f").unwrap().nodeid;
    let o = m.client.open(node, libc::O_RDONLY as u32 | DIRECT).unwrap();
    assert!(start(
        m.fs(),
        &mut Loop::new(m.fs()),
        &ctx(0, 0),
        node,
        o.fh,
        0,
        &mem,
        0
    )
    .is_none());
    assert_eq!(
        m.client.write(node, o.fh, 0, &data, 0),
        Err(Errno(libc::EROFS))
    );
    m.client.release(node, o.fh, 0).unwrap();
}

#[test]
fn unaligned_memory_to_an_o_direct_handle_is_declined() {
    let m = mount(Config::default());
    let fs = m.fs();
    let mut lp = Loop::new(fs);
    let (e, o) = m
        .client
        .create(ROOT_ID, b"f", 0o644, RW | DIRECT, 0)
        .unwrap();
    let data = pattern(3, 4096);
    let skewed = Mem::new(&data, 512);
    assert!(start(fs, &mut lp, &ctx(0, 0), e.nodeid, o.fh, 0, &skewed, 0).is_none());
    assert_eq!(skewed.held(), 0);
    // The synchronous path writes it through a bounce buffer.
    assert_eq!(m.client.write(e.nodeid, o.fh, 0, &data, 0), Ok(4096));
    // Aligned, the same write is started.
    let aligned = Mem::new(&data, 0);
    let rx = start(fs, &mut lp, &ctx(0, 0), e.nodeid, o.fh, 4096, &aligned, 0).expect("started");
    run(fs, &mut lp);
    assert_eq!(answer(&mut lp, rx.to_owned()), Ok(4096));
    let host = std::fs::read(m.path("f")).unwrap();
    assert!(host[..4096] == data[..] && host[4096..] == data[..]);
    m.client.release(e.nodeid, o.fh, 0).unwrap();
}

#[test]
fn a_started_write_is_found_by_its_requests_unique() {
    // FUSE_INTERRUPT and the device's timeout cancel by the request's
    // unique: a started write is registered under it until it completes.
    let m = mount(Config::default());
    let fs = m.fs();
    let mut lp = Loop::new(fs);
    let (e, o) = m
        .client
        .create(ROOT_ID, b"f", 0o644, RW | DIRECT, 0)
        .unwrap();
    let mem = Mem::new(&pattern(0, 4096), 0);
    let c = ctx(0, 0);
    let rx = start(fs, &mut lp, &c, e.nodeid, o.fh, 0, &mem, 0).expect("started");
    assert_eq!(fs.cancel_io(c.unique + 2), 0);
    // Found by its unique. `cancel_io` submits this thread's queue first
    // (a worker cancelling its own op), so the cancel reaches the write:
    // it ends cancelled (EINTR), or written if it finished first.
    assert_eq!(fs.cancel_io(c.unique), 1);
    run(fs, &mut lp);
    let r = answer(&mut lp, rx.to_owned());
    assert!(matches!(r, Ok(4096) | Err(Errno::EINTR)), "{r:?}");
    assert_eq!(fs.cancel_io(c.unique), 0, "still registered after its end");
    m.client.release(e.nodeid, o.fh, 0).unwrap();
}

#[test]
fn more_callers_than_the_ring_keeps_personalities_for() {
    // Past the personalities kept per ring the cache starts over: the
    // writes queued under the old ones are submitted before those are
    // given back, and every write still lands.
    let m = mount(Config::default());
    let fs = m.fs();
    let mut lp = Loop::new(fs);
    let (e, o) = m
        .client
        .create(ROOT_ID, b"f", 0o666, RW | DIRECT, 0)
        .unwrap();
    const N: usize = 100;
    let started: Vec<_> = (0..N)
        .map(|i| {
            let mem = Mem::new(&pattern(i, 4096), 0);
            let uid = 2000 + i as u32;
            let off = (i * 4096) as u64;
            let rx =
                start(fs, &mut lp, &ctx(uid, uid), e.nodeid, o.fh, off, &mem, 0).expect("started");
            (mem, rx)
        })
        .collect();
    run(fs, &mut lp);
    for (_, rx) in &started {
        assert_eq!(answer(&mut lp, rx.to_owned()), Ok(4096));
    }
    let want: Vec<u8> = (0..N).flat_map(|i| pattern(i, 4096)).collect();
    assert!(std::fs::read(m.path("f")).unwrap() == want);
    m.client.release(e.nodeid, o.fh, 0).unwrap();
}

/// The synchronous write removes a renamed `security.capability`
/// (`--xattrmap`) once its data is written; a started write removes it
/// when it starts, as the host clears a real one. (Removed only when its
/// completion was taken, a thread that ended first, on a connection abort
/// or with its frontend gone, left the data on the host and the renamed
/// capability with it.)
#[test]
fn a_write_that_landed_when_its_thread_ended_still_cleared_mapped_caps() {
    let m = mount(Config {
        xattr: true,
        xattrmap: Some(":map::user.virtiofs.:".parse().unwrap()),
        ..Config::default()
    });
    let fs = m.fs();
    let host = m.path("prog");
    std::fs::write(&host, vec![0u8; 8192]).unwrap();
    let name = c"user.virtiofs.security.capability";
    let path = std::ffi::CString::new(host.as_os_str().as_encoded_bytes()).unwrap();
    let set_caps = || {
        // SAFETY: NUL-terminated path and name, a 4-byte value.
        let r =
            unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), b"caps".as_ptr().cast(), 4, 0) };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    };
    let has_caps = || {
        // SAFETY: as above; size 0 only asks for the length.
        unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) >= 0 }
    };
    let node = m.client.lookup(ROOT_ID, b"prog").unwrap().nodeid;
    let o = m.client.open(node, RW | DIRECT).unwrap();
    let data = vec![0x42u8; 4096];

    // Synchronously: written, and the renamed capability is gone.
    set_caps();
    assert_eq!(m.client.write(node, o.fh, 0, &data, 0), Ok(4096));
    assert!(
        !has_caps(),
        "the synchronous write left the mapped capability"
    );

    // Started on a serving loop that ends (its thread with it) before it
    // takes the completion.
    set_caps();
    let mem = Mem::new(&pattern(5, 4096), 0);
    let answer = std::thread::scope(|s| {
        s.spawn(|| {
            let mut lp = Loop::new(fs);
            let rx = start(fs, &mut lp, &ctx(0, 0), node, o.fh, 4096, &mem, 0).expect("started");
            lp.submit(fs);
            let t = Instant::now();
            while std::fs::read(&host).unwrap()[4096..] != pattern(5, 4096)[..] {
                assert!(t.elapsed() < Duration::from_secs(10), "never landed");
                std::thread::sleep(Duration::from_millis(1));
            }
            lp.answer(rx)
        })
        .join()
        .unwrap()
    });
    assert_eq!(mem.held(), 0);
    assert!(
        !has_caps(),
        "data written by a started write ({answer:?}), mapped capability kept"
    );
    m.client.release(node, o.fh, 0).unwrap();
}
