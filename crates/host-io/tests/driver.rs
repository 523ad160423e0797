//! The io_uring driver against the real kernel: files in a temporary
//! directory and pipes (whose reads block until written, so cancellation,
//! deadlines, forgotten ops and drop-while-in-flight can be shown).

use host_io::{Driver, DriverError, Target};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::time::{Duration, Instant};

fn temp_file(name: &str) -> (File, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("host-io-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    (f, path)
}

fn pipe() -> (File, File) {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both descriptors were just created and are owned by nothing else.
    unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
}

fn errno(r: &std::io::Result<usize>) -> Option<i32> {
    r.as_ref().err().and_then(|e| e.raw_os_error())
}

fn write_then_read(d: &mut Driver, fd: RawFd) {
    let data: Vec<u8> = (0..3 * 4096u32).map(|i| (i % 253) as u8).collect();
    // Three writes batched into one submission.
    let ws: Vec<_> = (0..3)
        .map(|i| {
            d.write(
                Target::Fd(fd),
                data[i * 4096..(i + 1) * 4096].to_vec(),
                (i * 4096) as u64,
                1,
                None,
            )
            .unwrap()
        })
        .collect();
    for w in ws {
        let c = d.wait(w).unwrap();
        assert_eq!(c.result.unwrap(), 4096);
        assert_eq!(c.buf.unwrap().len(), 4096, "the buffer comes back");
    }
    let r = d
        .read(Target::Fd(fd), vec![0; 3 * 4096], 0, 2, None)
        .unwrap();
    let c = d.wait(r).unwrap();
    assert_eq!(c.result.unwrap(), 3 * 4096);
    assert_eq!(c.buf.unwrap(), data);
    // Reading past the end returns what there is.
    let r = d
        .read(Target::Fd(fd), vec![0; 4096], 2 * 4096 + 100, 3, None)
        .unwrap();
    assert_eq!(d.wait(r).unwrap().result.unwrap(), 4096 - 100);
    assert_eq!(d.in_flight(), 0);
}

#[test]
fn read_and_write_through_the_ring() {
    let mut d = Driver::new(8).unwrap();
    let s = d.supported();
    assert!(
        s.read && s.write && s.read_fixed && s.write_fixed && s.cancel && s.link_timeout,
        "{s:?}"
    );
    let (f, _) = temp_file("rw");
    write_then_read(&mut d, f.as_raw_fd());
}

#[test]
fn syscall_fallback_gives_the_same_results() {
    let mut d = Driver::new(8).unwrap();
    d.disable_uring_ops();
    let (f, _) = temp_file("fallback");
    write_then_read(&mut d, f.as_raw_fd());
    // A bad descriptor is a clean error, not a panic.
    let r = d.read(Target::Fd(-1), vec![0; 8], 0, 0, None).unwrap();
    assert_eq!(errno(&d.wait(r).unwrap().result), Some(libc::EBADF));
}

#[test]
fn fixed_buffers_and_fixed_files() {
    let mut d = Driver::new(8).unwrap();
    let (f, path) = temp_file("fixed");
    let firsts = d.register_regions(&[8192, 2 << 20]).unwrap();
    assert_eq!(firsts, vec![0, 1]);
    d.region_mut(0).unwrap()[..4096].fill(0x5a);
    let w = d
        .write_fixed(Target::Fd(f.as_raw_fd()), 0, 0, 4096, 4096, 7)
        .unwrap();
    assert_eq!(d.wait(w).unwrap().result.unwrap(), 4096);
    let mut on_disk = Vec::new();
    File::open(&path)
        .unwrap()
        .read_to_end(&mut on_disk)
        .unwrap();
    assert_eq!(&on_disk[4096..], &[0x5a; 4096][..]);
    // Into the middle of the big region, through a registered file.
    d.register_files(&[f.as_raw_fd()]).unwrap();
    let r = d
        .read_fixed(Target::Fixed(0), 1, 1 << 20, 4096, 4096, 8)
        .unwrap();
    assert_eq!(d.wait(r).unwrap().result.unwrap(), 4096);
    assert_eq!(
        &d.region(1).unwrap()[1 << 20..(1 << 20) + 4096],
        &[0x5a; 4096][..]
    );
    // Outside the region: refused before anything is submitted.
    assert!(matches!(
        d.read_fixed(Target::Fd(f.as_raw_fd()), 0, 8000, 4096, 0, 9),
        Err(DriverError::BadFixed { index: 0, .. })
    ));
    assert!(matches!(
        d.read_fixed(Target::Fd(f.as_raw_fd()), 5, 0, 1, 0, 9),
        Err(DriverError::BadFixed { .. })
    ));
}

#[test]
fn cancel_by_key() {
    let mut d = Driver::new(8).unwrap();
    let (rx, _tx) = pipe();
    let a = d
        .read(Target::Fd(rx.as_raw_fd()), vec![0; 16], 0, 42, None)
        .unwrap();
    let b = d
        .read(Target::Fd(rx.as_raw_fd()), vec![0; 16], 0, 43, None)
        .unwrap();
    d.submit().unwrap();
    assert!(
        d.try_complete(a).unwrap().is_none(),
        "blocked on the empty pipe"
    );
    assert_eq!(d.cancel(42).unwrap(), 1);
    let c = d.wait(a).unwrap();
    assert_eq!(errno(&c.result), Some(libc::ECANCELED));
    assert_eq!(c.buf.unwrap().len(), 16);
    // The other key is untouched.
    assert!(d.try_complete(b).unwrap().is_none());
    assert_eq!(d.cancel(43).unwrap(), 1);
    assert_eq!(errno(&d.wait(b).unwrap().result), Some(libc::ECANCELED));
}

#[test]
fn deadline_cancels_an_op_that_outlives_it() {
    let mut d = Driver::new(8).unwrap();
    let (rx, mut tx) = pipe();
    let start = Instant::now();
    let r = d
        .read(
            Target::Fd(rx.as_raw_fd()),
            vec![0; 16],
            0,
            1,
            Some(Duration::from_millis(50)),
        )
        .unwrap();
    let c = d.wait(r).unwrap();
    assert_eq!(errno(&c.result), Some(libc::ECANCELED));
    assert!(start.elapsed() >= Duration::from_millis(50));
    // An op that finishes in time is not affected by its deadline.
    tx.write_all(b"hi").unwrap();
    let r = d
        .read(
            Target::Fd(rx.as_raw_fd()),
            vec![0; 16],
            0,
            1,
            Some(Duration::from_secs(5)),
        )
        .unwrap();
    assert_eq!(d.wait(r).unwrap().result.unwrap(), 2);
}

#[test]
fn forgotten_op_parks_its_buffer_until_completion() {
    let mut d = Driver::new(8).unwrap();
    let (rx, mut tx) = pipe();
    let r = d
        .read(Target::Fd(rx.as_raw_fd()), vec![0; 16], 0, 1, None)
        .unwrap();
    d.submit().unwrap();
    d.forget(r);
    assert_eq!(d.in_flight(), 1, "the kernel still owns the buffer");
    assert!(
        matches!(d.wait(r), Err(DriverError::UnknownOp)),
        "a forgotten op has no handle"
    );
    tx.write_all(b"late").unwrap();
    let start = Instant::now();
    while d.in_flight() != 0 {
        assert!(start.elapsed() < Duration::from_secs(5));
        d.submit().unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    // The slot is reused and the old handle is stale.
    let w = d
        .write(Target::Fd(tx.as_raw_fd()), b"x".to_vec(), 0, 2, None)
        .unwrap();
    assert_eq!(d.wait(w).unwrap().result.unwrap(), 1);
    assert!(matches!(d.try_complete(r), Err(DriverError::UnknownOp)));
}

#[test]
fn dropping_the_driver_cancels_and_drains() {
    let (rx, _tx) = pipe();
    let mut d = Driver::new(8).unwrap();
    for _ in 0..4 {
        d.read(Target::Fd(rx.as_raw_fd()), vec![0; 4096], 0, 1, None)
            .unwrap();
    }
    d.submit().unwrap();
    assert_eq!(d.in_flight(), 4);
    let start = Instant::now();
    drop(d);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "drop must not hang on blocked ops"
    );
}

/// Dropping a driver with reads in flight on a pipe nobody writes: every
/// read is cancelled and has completed before `drop` returns, so none is
/// left in the kernel to take bytes written afterwards (into buffers the
/// drop has freed, or client memory its owner has unmapped). More ops than
/// the ring's submission queue holds, the last ones still queued
/// unsubmitted, so the cancels need room made for them (a drop that pushed
/// them only while there was room waited for ever).
#[test]
fn drop_cancels_and_waits_for_every_op_before_returning() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let registry = Arc::new(host_io::CancelRegistry::default());
    let (mut rx, tx) = pipe();
    let fd = rx.as_raw_fd();
    let mut d = Driver::new(4).unwrap();
    d.set_cancel_registry(registry.clone());
    for _ in 0..8 {
        d.read(Target::Fd(fd), vec![0; 64], 0, 1, None).unwrap();
    }
    // A started read into memory the test owns (client memory's stand-in).
    let mut client = vec![0u8; 64];
    let iov = vec![libc::iovec {
        iov_base: client.as_mut_ptr().cast(),
        iov_len: client.len(),
    }]
    .into_boxed_slice();
    // SAFETY: `client` is not touched until the driver is dropped below,
    // and the drop waits for the op.
    unsafe { d.start_readv(Target::Fd(fd), iov, 0, 2, false, false) }.unwrap();
    d.submit().unwrap();
    // A full submission queue, not submitted.
    for _ in 0..4 {
        d.read(Target::Fd(fd), vec![0; 64], 0, 3, None).unwrap();
    }
    assert_eq!(d.in_flight(), 13);
    assert_eq!(registry.in_flight(), 1);
    // A drop that hangs is released (the reads fed) so the test fails
    // rather than hangs.
    let dropped = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let dropped = dropped.clone();
        let mut tx = tx;
        std::thread::spawn(move || {
            let t = Instant::now();
            while !dropped.load(Ordering::Acquire) {
                if t.elapsed() > Duration::from_secs(10) {
                    tx.write_all(&[0xee; 13 * 64]).unwrap();
                    return (tx, true);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            (tx, false)
        })
    };
    drop(d);
    dropped.store(true, Ordering::Release);
    let (mut tx, hung) = watchdog.join().unwrap();
    assert!(!hung, "drop waited for ops it had not cancelled");
    assert_eq!(registry.in_flight(), 0, "the started op left the registry");
    // No read is left in the kernel: all of this stays in the pipe, and
    // none of it lands in the client's memory (nothing was written before
    // the drop, so only a read that outlived it could put bytes there).
    tx.write_all(b"after drop").unwrap();
    drop(tx);
    let mut rest = Vec::new();
    rx.read_to_end(&mut rest).unwrap();
    assert_eq!(
        client, [0u8; 64],
        "a read outlived the drop and wrote client memory"
    );
    assert_eq!(rest, b"after drop");
}

#[test]
fn another_thread_cancels_a_waiting_op_by_key() {
    // A borrowed-buffer read blocks on an empty pipe in one thread; another
    // thread cancels it by its key (FUSE_INTERRUPT's path) and it returns
    // ECANCELED. A different key cancels nothing.
    let registry = std::sync::Arc::new(host_io::CancelRegistry::default());
    let (r, mut w) = pipe();
    let reg = registry.clone();
    let fd = r.as_raw_fd();
    let reader = std::thread::spawn(move || {
        let mut d = Driver::new(8).unwrap();
        d.set_cancel_registry(reg);
        let mut buf = [0u8; 16];
        d.read_into(Target::Fd(fd), &mut buf, 0, 42)
    });
    let t = Instant::now();
    while registry.in_flight() == 0 {
        assert!(t.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(registry.cancel(7, Duration::from_millis(10)), 0);
    assert!(!reader.is_finished());
    assert_eq!(registry.cancel(42, Duration::from_millis(500)), 1);
    let t = Instant::now();
    while !reader.is_finished() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    if !reader.is_finished() {
        // Not cancelled: release the reader so the test fails, not hangs.
        w.write_all(b"x").unwrap();
        panic!("the op was not cancelled");
    }
    let err = reader.join().unwrap().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ECANCELED));
    assert_eq!(registry.in_flight(), 0);
    drop(r);
}

/// An anonymous shared mapping of `len` bytes (client memory stand-in).
struct Mapping {
    addr: usize,
    len: usize,
}

impl Mapping {
    fn new(len: usize) -> Mapping {
        // SAFETY: a fresh anonymous mapping; checked for failure below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Mapping {
            addr: p as usize,
            len,
        }
    }
    fn span(&self) -> fuse_core::HostSpan {
        fuse_core::HostSpan {
            addr: self.addr,
            len: self.len,
        }
    }
    fn iov(&self, off: usize, len: usize) -> libc::iovec {
        assert!(off + len <= self.len);
        libc::iovec {
            iov_base: (self.addr + off) as *mut libc::c_void,
            iov_len: len,
        }
    }
    fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        // SAFETY: the range is inside the mapping, which no Rust object uses.
        unsafe {
            std::ptr::copy_nonoverlapping((self.addr + off) as *const u8, v.as_mut_ptr(), len)
        };
        v
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

#[test]
fn a_client_map_is_registered_once_and_replaced_when_the_memory_changes() {
    let (mut f, _path) = temp_file("client-map");
    let data: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 253) as u8).collect();
    f.write_all(&data).unwrap();
    let fd = f.as_raw_fd();
    let mut d = Driver::new(8).unwrap();
    let (a, b) = (Mapping::new(1 << 20), Mapping::new(1 << 20));
    let (map_a, map_b) = (
        fuse_core::ClientMap::new(vec![a.span()]),
        fuse_core::ClientMap::new(vec![b.span()]),
    );
    assert_ne!(map_a.id(), map_b.id());
    // SAFETY: both mappings live until the end of the test.
    unsafe { d.register_client_map(&map_a) }.unwrap();
    assert_eq!(d.client_map_id(), Some(map_a.id()));
    // Again: a no-op.
    // SAFETY: as above.
    unsafe { d.register_client_map(&map_a) }.unwrap();
    // One iovec: READ_FIXED; two: READV_FIXED.
    let one = [a.iov(4096, 8192)];
    // SAFETY: the iovecs are inside mapping A, registered now.
    let r = unsafe { d.readv_client_fixed(Target::Fd(fd), &one, 100, 1) };
    assert_eq!(r.unwrap().unwrap(), 8192);
    assert_eq!(a.bytes(4096, 8192), &data[100..8292]);
    let two = [a.iov(0x20000, 1000), a.iov(0x30000, 3000)];
    // SAFETY: as above.
    let r = unsafe { d.readv_client_fixed(Target::Fd(fd), &two, 0, 1) };
    assert_eq!(r.unwrap().unwrap(), 4000);
    assert_eq!(a.bytes(0x20000, 1000), &data[..1000]);
    assert_eq!(a.bytes(0x30000, 3000), &data[1000..4000]);
    // Memory outside the registered map is not done as fixed.
    // SAFETY: nothing is submitted for memory outside the map.
    assert!(unsafe { d.readv_client_fixed(Target::Fd(fd), &[b.iov(0, 10)], 0, 1) }.is_none());
    // A new memory table: the new map replaces the old, and data lands in
    // the new memory, not in the pages of the old registration.
    // SAFETY: as above.
    unsafe { d.register_client_map(&map_b) }.unwrap();
    assert_eq!(d.client_map_id(), Some(map_b.id()));
    let before = a.bytes(0, 8192);
    // SAFETY: as above.
    let r = unsafe { d.readv_client_fixed(Target::Fd(fd), &[b.iov(0, 8192)], 500, 1) };
    assert_eq!(r.unwrap().unwrap(), 8192);
    assert_eq!(b.bytes(0, 8192), &data[500..8692]);
    assert_eq!(a.bytes(0, 8192), before);
    // A write from the registered memory.
    let fill: Vec<u8> = (0..5000u32).map(|i| (i % 7) as u8 + 1).collect();
    // SAFETY: the range is inside mapping B, which no Rust object uses.
    unsafe { std::ptr::copy_nonoverlapping(fill.as_ptr(), (b.addr + 0x40000) as *mut u8, 5000) };
    // SAFETY: the iovec is inside mapping B, registered now.
    let r = unsafe { d.writev_client_fixed(Target::Fd(fd), &[b.iov(0x40000, 5000)], 10, 1) };
    assert_eq!(r.unwrap().unwrap(), 5000);
    let mut back = vec![0u8; 5000];
    assert_eq!(host_io::pread(fd, &mut back, 10).unwrap(), 5000);
    assert_eq!(back, fill);
}

/// The kernel lets a thread's io-wq run 4 file ops per CPU at once (8 here),
/// which held 16 started FSYNCs to 8 at a time; a driver raises that to its
/// ring's entries.
#[test]
fn a_drivers_thread_runs_as_many_blocking_file_ops_as_its_ring_holds() {
    let d = Driver::new(64).unwrap();
    let [bounded, _] = d.iowq_max_workers().unwrap();
    assert_eq!(bounded, 64);
}

/// The thread that started an op cancels it itself (a /dev/fuse worker
/// reads the FUSE_INTERRUPT of its own request): one cancel, no wait for
/// the op to leave the registry, which only this thread's next take of
/// completions does. Waiting held such a worker for the whole patience
/// (20 ms in the passthrough) on every interrupt.
#[test]
fn the_owning_thread_cancels_its_started_op_without_waiting() {
    let registry = std::sync::Arc::new(host_io::CancelRegistry::default());
    let (r, mut w) = pipe();
    let mut d = Driver::new(8).unwrap();
    d.set_cancel_registry(registry.clone());
    let mut buf = vec![0u8; 16];
    let iov = vec![libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    }]
    .into_boxed_slice();
    // SAFETY: `buf` outlives the op: its completion is taken below before
    // `buf` is dropped.
    let id = unsafe { d.start_readv(Target::Fd(r.as_raw_fd()), iov, 0, 42, false, false) }.unwrap();
    d.submit().unwrap();
    let t = Instant::now();
    let found = registry.cancel_from(42, Duration::from_secs(2), Some(d.ring_fd()));
    assert_eq!(found, 1);
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "waited {:?} for its own op to leave",
        t.elapsed()
    );
    let mut out = Vec::new();
    let t = Instant::now();
    while out.is_empty() {
        if t.elapsed() > Duration::from_secs(5) {
            w.write_all(b"x").unwrap();
            panic!("the op was not cancelled");
        }
        d.take_started(&mut out).unwrap();
    }
    assert_eq!(out[0].0, id);
    assert_eq!(
        out[0].1.as_ref().unwrap_err().raw_os_error(),
        Some(libc::ECANCELED)
    );
    assert_eq!(registry.in_flight(), 0);
}

/// A started op that is forgotten ends with nobody to tell: it leaves the
/// started list and the cancel registry when it completes, and the op that
/// reuses its slot gets its own completion, not a stale one.
#[test]
fn a_forgotten_started_op_leaves_no_trace_and_its_slot_serves_the_next() {
    let registry = std::sync::Arc::new(host_io::CancelRegistry::default());
    let (r, mut w) = pipe();
    let mut d = Driver::new(2).unwrap();
    d.set_cancel_registry(registry.clone());
    let mut buf = vec![0u8; 16];
    let iov = |b: &mut Vec<u8>| {
        vec![libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        }]
        .into_boxed_slice()
    };
    // SAFETY: `buf` outlives the op: the loop below sees it complete (the
    // driver's in-flight count falls to 0) before `buf` is dropped.
    let id = unsafe { d.start_readv(Target::Fd(r.as_raw_fd()), iov(&mut buf), 0, 7, false, false) }
        .unwrap();
    d.submit().unwrap();
    d.forget(id);
    w.write_all(b"first").unwrap();
    let mut out = Vec::new();
    let t = Instant::now();
    while d.in_flight() != 0 || registry.in_flight() != 0 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the forgotten op never left"
        );
        d.take_started(&mut out).unwrap();
    }
    assert!(out.is_empty(), "a forgotten op was reported: {out:?}");
    let mut buf2 = vec![0u8; 16];
    // SAFETY: `buf2` outlives the op: its completion is taken below.
    let id2 = unsafe {
        d.start_readv(
            Target::Fd(r.as_raw_fd()),
            iov(&mut buf2),
            0,
            8,
            false,
            false,
        )
    }
    .unwrap();
    w.write_all(b"second").unwrap();
    let t = Instant::now();
    while out.is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the second op never completed"
        );
        d.take_started(&mut out).unwrap();
    }
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, id2);
    assert_eq!(*out[0].1.as_ref().unwrap(), 6);
    assert_eq!(&buf2[..6], b"second");
    assert_eq!(&buf[..5], b"first");
}

/// A driver given another cancel registry while an op it started runs
/// moves the op there: the op leaves the registry it is in when it ends,
/// and none keeps an entry naming this ring after it is gone.
#[test]
fn a_started_op_follows_its_driver_to_a_new_cancel_registry() {
    let (a, b) = (
        std::sync::Arc::new(host_io::CancelRegistry::default()),
        std::sync::Arc::new(host_io::CancelRegistry::default()),
    );
    let (r, mut w) = pipe();
    let mut d = Driver::new(4).unwrap();
    d.set_cancel_registry(a.clone());
    let mut buf = vec![0u8; 8];
    let iov = vec![libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    }]
    .into_boxed_slice();
    // SAFETY: `buf` outlives the op: its completion is taken below.
    let id = unsafe { d.start_readv(Target::Fd(r.as_raw_fd()), iov, 0, 5, false, false) }.unwrap();
    d.submit().unwrap();
    assert_eq!((a.in_flight(), b.in_flight()), (1, 0));
    d.set_cancel_registry(b.clone());
    assert_eq!((a.in_flight(), b.in_flight()), (0, 1));
    w.write_all(b"x").unwrap();
    let mut out = Vec::new();
    let t = Instant::now();
    while out.is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the read never completed"
        );
        d.take_started(&mut out).unwrap();
    }
    assert_eq!(out[0].0, id);
    assert_eq!((a.in_flight(), b.in_flight()), (0, 0));
}
