//! FSYNCs and FALLOCATEs started without waiting
//! (`Filesystem::start_fsync`, `Filesystem::start_fallocate`) on the test
//! thread's own io_uring, as a transport's serving thread starts them: the
//! thread queues the op, submits, goes on, and takes the answer when the
//! ring's io-wq worker has waited for the disk. The files are written
//! through the engine's embedded client; the started ops go to the served
//! `PassthroughFs` directly, on this thread. Needs root (mount, loop
//! devices, other users' credentials).

mod common;

use common::{Kind, Loop, Mount, Via};
use fuse_core::abi::ROOT_ID;
use fuse_core::server::{Ctx, Filesystem, IoDone};
use passthrough::Config;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const RW: u32 = libc::O_RDWR as u32;

fn ctx() -> Ctx<'static> {
    ctx_as(0, 0)
}

fn ctx_as(uid: u32, gid: u32) -> Ctx<'static> {
    static UNIQUE: AtomicU64 = AtomicU64::new(1 << 41);
    Ctx {
        unique: UNIQUE.fetch_add(2, Ordering::Relaxed),
        uid,
        gid,
        pid: 1,
        ..Ctx::default()
    }
}

/// Offers the FSYNC of `fh` to the served filesystem: its unique if
/// started, None if declined (then it is served synchronously).
fn start(m: &Mount, lp: &mut Loop, node: u64, fh: u64, datasync: bool) -> Option<u64> {
    let ctx = ctx();
    let done = IoDone::new(ctx.unique);
    m.fs()
        .start_fsync(
            &mut lp.io,
            &mut lp.done,
            &ctx,
            node,
            fh,
            datasync,
            false,
            done,
        )
        .ok()
        .map(|()| ctx.unique)
}

/// Offers the FALLOCATE of `len` bytes at `off` through `fh`, by `ctx`:
/// its answer if started, None if declined.
#[allow(clippy::too_many_arguments)]
fn start_alloc(
    m: &Mount,
    lp: &mut Loop,
    ctx: &Ctx,
    node: u64,
    fh: u64,
    mode: i32,
    off: u64,
    len: u64,
) -> Option<u64> {
    let done = IoDone::new(ctx.unique);
    m.fs()
        .start_fallocate(
            &mut lp.io,
            &mut lp.done,
            ctx,
            node,
            fh,
            mode as u32,
            off,
            len,
            done,
        )
        .ok()
        .map(|()| ctx.unique)
}

/// Takes completions until nothing this loop started is in flight.
fn run(m: &Mount, lp: &mut Loop) {
    let t = Instant::now();
    while m.fs().started_in_flight(&lp.io) > 0 {
        assert!(t.elapsed() < Duration::from_secs(60), "syncs never ended");
        if m.fs().collect_started(&mut lp.io, &mut lp.done) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A file of `len` bytes written through the client (into the host's page
/// cache: dirty until a sync).
fn dirty_file(m: &Mount, name: &[u8], len: usize) -> (u64, u64) {
    let (e, o) = m.client.create(ROOT_ID, name, 0o644, RW, 0).unwrap();
    let chunk = vec![0x5au8; 1 << 20];
    for at in (0..len).step_by(chunk.len()) {
        let n = chunk.len().min(len - at);
        assert_eq!(
            m.client
                .write(e.nodeid, o.fh, at as u64, &chunk[..n], 0)
                .unwrap(),
            n as u32
        );
    }
    (e.nodeid, o.fh)
}

#[test]
fn a_sync_of_dirty_data_runs_on_while_the_thread_goes_on() {
    let m = Mount::new(Kind::Ext4, Config::default(), Via::Device(1));
    let mut lp = Loop::new(m.fs());
    let (node, fh) = dirty_file(&m, b"f", 64 << 20);
    let (node2, fh2) = dirty_file(&m, b"g", 1 << 20);
    let before = m.fs().io_counts().syncs_started;
    let a = start(&m, &mut lp, node, fh, false).expect("an fsync of an ext4 file is started");
    let b = start(&m, &mut lp, node2, fh2, true).expect("an fdatasync of an ext4 file is started");
    assert_eq!(m.fs().started_in_flight(&lp.io), 2);
    assert!(lp.answer(a).is_err(), "answered before it was submitted");
    lp.submit(m.fs());
    // The submit hands the syncs to io-wq workers and returns: 64 MiB are
    // still being written back when it does.
    assert!(
        m.fs().started_in_flight(&lp.io) >= 1 && lp.answer(a).is_err(),
        "the submit waited for the sync"
    );
    run(&m, &mut lp);
    assert_eq!(lp.answer(a).expect("the fsync was answered"), Ok(0));
    assert_eq!(lp.answer(b).expect("the fdatasync was answered"), Ok(0));
    assert_eq!(m.fs().io_counts().syncs_started, before + 2);
    m.client.release(node, fh, 0).unwrap();
    m.client.release(node2, fh2, 0).unwrap();
}

#[test]
fn syncs_that_would_not_wait_or_cannot_start_are_declined() {
    // tmpfs has nothing to write back (and no non-blocking I/O): its sync
    // costs less synchronously than a hand-off to a worker.
    let m = Mount::new(Kind::Tmpfs, Config::default(), Via::Device(1));
    let mut lp = Loop::new(m.fs());
    let (node, fh) = dirty_file(&m, b"f", 4096);
    assert!(
        start(&m, &mut lp, node, fh, false).is_none(),
        "tmpfs sync started"
    );
    assert!(
        start_alloc(&m, &mut lp, &ctx(), node, fh, 0, 0, 4096).is_none(),
        "tmpfs fallocate started"
    );
    // An unknown handle: the usual path answers it (EBADF).
    let m = Mount::new(Kind::Ext4, Config::default(), Via::Device(1));
    let mut lp = Loop::new(m.fs());
    assert!(start(&m, &mut lp, ROOT_ID, 0xdead_beef, false).is_none());
    // Without io_uring nothing is started.
    let cfg = Config {
        io_uring: false,
        ..Config::default()
    };
    let m = Mount::new(Kind::Ext4, cfg, Via::Device(1));
    let mut lp = Loop::new(m.fs());
    let (node, fh) = dirty_file(&m, b"f", 4096);
    assert!(start(&m, &mut lp, node, fh, false).is_none());
    assert!(start_alloc(&m, &mut lp, &ctx(), node, fh, 0, 0, 4096).is_none());
    assert_eq!(m.fs().io_counts().syncs_started, 0);
    assert_eq!(m.fs().io_counts().allocs_started, 0);
}

#[test]
fn started_fallocates_allocate_punch_and_keep_the_size_as_asked() {
    let m = Mount::new(Kind::Ext4, Config::default(), Via::Device(1));
    let mut lp = Loop::new(m.fs());
    let (node, fh) = dirty_file(&m, b"f", 1 << 20);
    let before = m.fs().io_counts().allocs_started;
    let grow = start_alloc(&m, &mut lp, &ctx(), node, fh, 0, 0, 8 << 20).expect("started");
    let keep = start_alloc(
        &m,
        &mut lp,
        &ctx(),
        node,
        fh,
        libc::FALLOC_FL_KEEP_SIZE,
        0,
        16 << 20,
    )
    .expect("started");
    lp.submit(m.fs());
    run(&m, &mut lp);
    assert_eq!(lp.answer(grow).unwrap(), Ok(0));
    assert_eq!(lp.answer(keep).unwrap(), Ok(0));
    let md = std::fs::metadata(m.path("f")).unwrap();
    assert_eq!(md.len(), 8 << 20, "KEEP_SIZE kept it; the first grew it");
    assert!(
        std::os::unix::fs::MetadataExt::blocks(&md) * 512 >= 16 << 20,
        "16 MiB allocated"
    );
    // A hole punched into written data reads back as zeros.
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    let p = start_alloc(&m, &mut lp, &ctx(), node, fh, punch, 4096, 8192).expect("started");
    run(&m, &mut lp);
    assert_eq!(lp.answer(p).unwrap(), Ok(0));
    let host = std::fs::read(m.path("f")).unwrap();
    assert!(host[..4096].iter().all(|&b| b == 0x5a));
    assert!(host[4096..12288].iter().all(|&b| b == 0));
    assert!(host[12288..1 << 20].iter().all(|&b| b == 0x5a));
    // Refusals come back as the host's errno: a mode it does not know.
    let bad = start_alloc(&m, &mut lp, &ctx(), node, fh, 0x4000_0000, 0, 4096).expect("started");
    run(&m, &mut lp);
    assert!(
        matches!(lp.answer(bad).unwrap(), Err(e) if e.0 == libc::EOPNOTSUPP || e.0 == libc::EINVAL)
    );
    assert_eq!(m.fs().io_counts().allocs_started, before + 4);
    m.client.release(node, fh, 0).unwrap();
}

/// A started FALLOCATE runs as its caller, as the usual path does: another
/// user's fallocate of their setuid file clears the setuid bit on the
/// host, which the host does only for a caller without CAP_FSETID. Run
/// with this (root) thread's own credentials, it would leave it.
#[test]
fn a_started_fallocate_runs_as_its_caller() {
    let m = Mount::new(Kind::Ext4, Config::default(), Via::Device(1));
    let mut lp = Loop::new(m.fs());
    let (node, fh) = dirty_file(&m, b"f", 4096);
    let path = m.path("f");
    std::os::unix::fs::chown(&path, Some(1000), Some(1000)).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o4755)).unwrap();
    let rx =
        start_alloc(&m, &mut lp, &ctx_as(1000, 1000), node, fh, 0, 0, 1 << 20).expect("started");
    lp.submit(m.fs());
    run(&m, &mut lp);
    assert_eq!(lp.answer(rx).unwrap(), Ok(0));
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
    assert_eq!(
        mode & 0o7777,
        0o755,
        "setuid left by a fallocate of another user"
    );
    m.client.release(node, fh, 0).unwrap();
}

/// A write-only handle cannot be read to probe its file for non-blocking
/// I/O; a read-only reopen tells instead. On tmpfs its syncs and
/// FALLOCATEs then stay synchronous, as a readable handle's do (a failed probe
/// must not count as "supported").
#[test]
fn a_write_only_tmpfs_handle_stays_in_line() {
    let cfg = Config {
        writeback: false,
        ..Config::default()
    };
    let m = Mount::new(Kind::Tmpfs, cfg, Via::Device(1));
    let mut lp = Loop::new(m.fs());
    let (e, o) = m
        .client
        .create(ROOT_ID, b"w", 0o644, libc::O_WRONLY as u32, 0)
        .unwrap();
    m.client.write(e.nodeid, o.fh, 0, &[1u8; 4096], 0).unwrap();
    assert!(
        start(&m, &mut lp, e.nodeid, o.fh, false).is_none(),
        "sync started"
    );
    assert!(
        start_alloc(&m, &mut lp, &ctx(), e.nodeid, o.fh, 0, 0, 1 << 20).is_none(),
        "fallocate started"
    );
    m.client.fallocate(e.nodeid, o.fh, 0, 0, 1 << 20).unwrap();
    m.client.fsync(e.nodeid, o.fh, false).unwrap();
    m.client.release(e.nodeid, o.fh, 0).unwrap();
}

/// A directory's FSYNCDIR (a journal commit on ext4) starts like a file's
/// FSYNC once a file of its device was found to do non-blocking I/O.
#[test]
fn an_ext4_directory_sync_is_started() {
    let m = Mount::new(Kind::Ext4, Config::default(), Via::Device(1));
    let mut lp = Loop::new(m.fs());
    let (node, fh) = dirty_file(&m, b"f", 4096);
    let d = m.client.mkdir(ROOT_ID, b"d", 0o755, 0).unwrap();
    let o = m.client.opendir(d.nodeid).unwrap();
    let c = ctx();
    let rx = c.unique;
    let done = IoDone::new(rx);
    let started = m.fs().start_fsync(
        &mut lp.io,
        &mut lp.done,
        &c,
        d.nodeid,
        o.fh,
        false,
        true,
        done,
    );
    assert!(started.is_ok(), "FSYNCDIR served synchronously");
    lp.submit(m.fs());
    run(&m, &mut lp);
    assert_eq!(lp.answer(rx).unwrap(), Ok(0));
    m.client.releasedir(d.nodeid, o.fh).unwrap();
    m.client.release(node, fh, 0).unwrap();
}

/// A FALLOCATE on a read-only share is declined (the usual path says
/// EROFS), one of an immutable file fails as it does synchronously (EPERM, after the
/// retry synchronously), and both paths remove the capability xattr renamed by
/// `--xattrmap`, as the host removes a real one.
#[test]
fn started_fallocates_fail_and_clear_capabilities_as_in_line() {
    let cfg = Config {
        readonly: true,
        ..Config::default()
    };
    let m = Mount::new(Kind::Ext4, cfg, Via::Device(1));
    let mut lp = Loop::new(m.fs());
    std::fs::write(m.path("f"), [0u8; 4096]).unwrap();
    let e = m.client.lookup(ROOT_ID, b"f").unwrap();
    let o = m.client.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
    assert!(start_alloc(&m, &mut lp, &ctx(), e.nodeid, o.fh, 0, 0, 4096).is_none());
    assert_eq!(
        m.client
            .fallocate(e.nodeid, o.fh, 0, 0, 4096)
            .unwrap_err()
            .0,
        libc::EROFS
    );
    m.client.release(e.nodeid, o.fh, 0).unwrap();

    let m = Mount::new(Kind::Ext4, Config::default(), Via::Device(1));

    let mut lp = Loop::new(m.fs());
    let (node, fh) = dirty_file(&m, b"i", 4096);
    common::run(
        std::process::Command::new("chattr")
            .arg("+i")
            .arg(m.path("i")),
    );
    let rx =
        start_alloc(&m, &mut lp, &ctx_as(1000, 1000), node, fh, 0, 0, 1 << 20).expect("started");
    lp.submit(m.fs());
    run(&m, &mut lp);
    let started = lp.answer(rx).unwrap();
    let inline = m.client.fallocate(node, fh, 0, 0, 1 << 20);
    common::run(
        std::process::Command::new("chattr")
            .arg("-i")
            .arg(m.path("i")),
    );
    assert_eq!(started, Err(fuse_core::Errno::EPERM));
    assert_eq!(inline, Err(fuse_core::Errno::EPERM));
    m.client.release(node, fh, 0).unwrap();

    let cfg = Config {
        xattr: true,
        xattrmap: Some(":map::user.virtiofs.:".parse().unwrap()),
        ..Config::default()
    };
    let m = Mount::new(Kind::Ext4, cfg, Via::Device(1));
    let mut lp = Loop::new(m.fs());
    let (node, fh) = dirty_file(&m, b"prog", 8192);
    let host = m.path("prog");
    let set_caps = || xattr_set(&host, "user.virtiofs.security.capability", b"caps");
    let has_caps = || xattr_has(&host, "user.virtiofs.security.capability");
    set_caps();
    m.client.fallocate(node, fh, 0, 0, 1 << 20).unwrap();
    assert!(
        !has_caps(),
        "a synchronous FALLOCATE left the renamed capability"
    );
    set_caps();
    let rx =
        start_alloc(&m, &mut lp, &ctx_as(1000, 1000), node, fh, 0, 0, 2 << 20).expect("started");
    lp.submit(m.fs());
    run(&m, &mut lp);
    assert_eq!(lp.answer(rx).unwrap(), Ok(0));
    assert!(
        !has_caps(),
        "a started FALLOCATE left the renamed capability"
    );
    m.client.release(node, fh, 0).unwrap();
}

fn xattr_set(p: &std::path::Path, name: &str, value: &[u8]) {
    let path = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let name = std::ffi::CString::new(name).unwrap();
    // SAFETY: NUL-terminated path and name, a value of that length.
    let r = unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(r, 0);
}

fn xattr_has(p: &std::path::Path, name: &str) -> bool {
    let path = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let name = std::ffi::CString::new(name).unwrap();
    // SAFETY: NUL-terminated path and name; size 0 only asks the length.
    unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) >= 0 }
}
