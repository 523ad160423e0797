//! READ and WRITE data by reference: the filesystem gets the guest's own
//! buffers (`ReadSink::client` / `WriteSource::client`), split exactly as
//! the guest's descriptors are; one that asks for a plain buffer still
//! works (the device's engine copies); and a request that times out while
//! the filesystem is doing I/O on its guest buffers is answered only when
//! that I/O ends, so the guest never gets back a buffer still being written.

mod common;

use common::*;
use fuse_core::abi::{Opcode, ReadIn, WriteIn, WriteOut};
use fuse_core::server::{Ctx, Filesystem, FsResult, ReadSink, WriteSource};
use fuse_core::Errno;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use virtio_fs::DeviceConfig;
use vm_memory::{Bytes, GuestAddress};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

/// Offsets select what the filesystem does.
const BY_REF: u64 = 0;
const BUFFERED: u64 = 1;
/// Holds an I/O guard on the guest's buffers until released.
const HOLD_IO: u64 = 2;
/// Waits (no guard) until released, then tries to start I/O.
const LATE_IO: u64 = 3;

#[derive(Clone, Default)]
struct Direct {
    /// Span lengths seen by the last by-reference call.
    spans: Arc<Mutex<Vec<usize>>>,
    written: Arc<Mutex<Vec<u8>>>,
    release: Arc<AtomicBool>,
    holding: Arc<AtomicUsize>,
    /// What `io()` gave a LATE_IO read: Some(true) a guard, Some(false) none.
    late_io: Arc<Mutex<Option<bool>>>,
}

/// Releases held calls when dropped (declared after the harness, so it
/// goes first and a failed assertion does not hang the engine's workers).
struct ReleaseOnDrop(Arc<AtomicBool>);
impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl Direct {
    fn guard(&self) -> ReleaseOnDrop {
        ReleaseOnDrop(self.release.clone())
    }
    fn wait_release(&self) {
        while !self.release.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + 3) as u8).collect()
}

impl Filesystem for Direct {
    type Inode = u64;
    type Handle = u64;
    type Io = ();

    fn new_io(&self, _: fuse_core::server::Wake) {}

    fn read(&self, _: &Ctx, _: u64, _: u64, off: u64, sink: &mut dyn ReadSink) -> FsResult<usize> {
        if off == BUFFERED {
            let b = sink.buffer();
            let n = b.len();
            b.copy_from_slice(&pattern(n));
            return Ok(n);
        }
        let (mem, n) = sink.client().ok_or(Errno::ENOSYS)?;
        match off {
            HOLD_IO => {
                let g = mem.io().ok_or(Errno::EIO)?;
                *self.spans.lock().unwrap() = g.spans().iter().map(|s| s.len).collect();
                mem.write_at(0, &pattern(n))?;
                self.holding.fetch_add(1, Ordering::SeqCst);
                self.wait_release();
                drop(g);
                Ok(n)
            }
            LATE_IO => {
                self.wait_release();
                let g = mem.io();
                *self.late_io.lock().unwrap() = Some(g.is_some());
                g.map(|_| 0).ok_or(Errno::EIO)
            }
            _ => {
                *self.spans.lock().unwrap() = mem.spans().iter().map(|s| s.len).collect();
                mem.write_at(0, &pattern(n))?;
                Ok(n)
            }
        }
    }

    fn write(
        &self,
        _: &Ctx,
        _: u64,
        _: u64,
        off: u64,
        src: &dyn WriteSource,
        _: u32,
    ) -> FsResult<usize> {
        if off == BUFFERED {
            *self.written.lock().unwrap() = src.data().to_vec();
            return Ok(src.data().len());
        }
        let mem = src.client().ok_or(Errno::ENOSYS)?;
        *self.spans.lock().unwrap() = mem.spans().iter().map(|s| s.len).collect();
        let mut v = vec![0u8; mem.len()];
        mem.read_at(0, &mut v)?;
        *self.written.lock().unwrap() = v;
        Ok(mem.len())
    }
}

fn read_in(off: u64, size: u32) -> Vec<u8> {
    ReadIn {
        offset: off,
        size,
        ..ReadIn::new_zeroed()
    }
    .as_bytes()
    .to_vec()
}

/// Writable pieces of a READ's reply: 16 + 100 bytes, then 200, then 300,
/// each at its own address (so 600 bytes of data in three spans).
const PIECES: [(u64, u32); 3] = [(0x8000, 116), (0x9000, 200), (0xa000, 300)];

/// A READ chain at descriptor 0: the request, then the three pieces.
fn read_chain(h: &Harness<Direct>, unique: u64, off: u64) {
    let msg = request(Opcode::Read, unique, &read_in(off, 600));
    h.mem.write_slice(&msg, GuestAddress(DATA)).unwrap();
    h.desc(0, DATA, msg.len() as u32, F_NEXT, 1);
    for (i, (a, l)) in PIECES.iter().enumerate() {
        let last = i + 1 == PIECES.len();
        h.desc(
            1 + i as u16,
            *a,
            *l,
            F_WRITE | if last { 0 } else { F_NEXT },
            2 + i as u16,
        );
    }
    h.publish(&[0]);
}

/// The READ's reply data, gathered from the three pieces.
fn read_data(h: &Harness<Direct>) -> Vec<u8> {
    let mut v = Vec::new();
    for (i, (a, l)) in PIECES.iter().enumerate() {
        let skip = if i == 0 { 16 } else { 0 };
        let mut b = vec![0u8; *l as usize - skip];
        h.mem
            .read_slice(&mut b, GuestAddress(a + skip as u64))
            .unwrap();
        v.extend_from_slice(&b);
    }
    v
}

fn used_len(h: &Harness<Direct>) -> u32 {
    h.mem.read_obj(GuestAddress(USED + 4 + 4)).unwrap()
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn device(fs: &Direct, timeout_ms: u64) -> Harness<Direct> {
    Harness::new(
        fs.clone(),
        DeviceConfig {
            request_timeout: Duration::from_millis(timeout_ms),
            workers_per_queue: 2,
            ..DeviceConfig::default()
        },
    )
}

#[test]
fn a_read_lands_in_the_guests_own_buffers() {
    let fs = Direct::default();
    let h = device(&fs, 0);
    let vring = h.vring();
    read_chain(&h, 5, BY_REF);
    h.kick(&vring, 1);
    wait_for("the READ", || h.used_idx() == 1);
    let r = h.reply(PIECES[0].0);
    assert_eq!((r.unique, r.error, r.len), (5, 0, 16 + 600));
    assert_eq!(used_len(&h), 616);
    assert_eq!(read_data(&h), pattern(600));
    // The filesystem saw the guest's descriptors, not one copied buffer.
    assert_eq!(*fs.spans.lock().unwrap(), vec![100, 200, 300]);
}

#[test]
fn a_filesystem_that_wants_a_buffer_still_reads_into_the_guest() {
    let fs = Direct::default();
    let h = device(&fs, 0);
    let vring = h.vring();
    read_chain(&h, 6, BUFFERED);
    h.kick(&vring, 1);
    wait_for("the READ", || h.used_idx() == 1);
    assert_eq!(h.reply(PIECES[0].0).len, 616);
    assert_eq!(read_data(&h), pattern(600));
}

/// A WRITE whose 1000 data bytes sit in three readable descriptors after
/// the one holding the headers.
fn write_chain(h: &Harness<Direct>, unique: u64, off: u64, data: &[u8]) {
    let wi = WriteIn {
        offset: off,
        size: data.len() as u32,
        ..WriteIn::new_zeroed()
    };
    let mut msg = request(Opcode::Write, unique, wi.as_bytes());
    let total = msg.len() + data.len();
    msg[..4].copy_from_slice(&(total as u32).to_le_bytes());
    h.mem.write_slice(&msg, GuestAddress(DATA)).unwrap();
    h.desc(0, DATA, msg.len() as u32, F_NEXT, 1);
    let cuts = [(0x8000u64, 0..100), (0x9000, 100..600), (0xa000, 600..1000)];
    for (i, (a, r)) in cuts.iter().enumerate() {
        h.mem
            .write_slice(&data[r.clone()], GuestAddress(*a))
            .unwrap();
        h.desc(1 + i as u16, *a, r.len() as u32, F_NEXT, 2 + i as u16);
    }
    h.desc(4, 0xb000, 16 + 8, F_WRITE, 0);
    h.publish(&[0]);
}

#[test]
fn a_write_comes_straight_from_the_guests_buffers() {
    for (mode, spans) in [(BY_REF, vec![100, 500, 400]), (BUFFERED, vec![])] {
        let fs = Direct::default();
        let h = device(&fs, 0);
        let vring = h.vring();
        let data = pattern(1000);
        write_chain(&h, 9, mode, &data);
        h.kick(&vring, 1);
        wait_for("the WRITE", || h.used_idx() == 1);
        let r = h.reply(0xb000);
        assert_eq!((r.unique, r.error, r.len), (9, 0, 24));
        let (out, _) = WriteOut::read_from_prefix(
            &h.mem.read_obj::<[u8; 8]>(GuestAddress(0xb010)).unwrap()[..],
        )
        .unwrap();
        assert_eq!(out.size, 1000);
        assert_eq!(*fs.written.lock().unwrap(), data, "mode {mode}");
        assert_eq!(*fs.spans.lock().unwrap(), spans, "mode {mode}");
    }
}

#[test]
fn a_timed_out_read_waits_for_io_on_its_buffers_to_end() {
    let fs = Direct::default();
    let h = device(&fs, 300);
    let _release = fs.guard();
    let vring = h.vring();
    read_chain(&h, 7, HOLD_IO);
    let t = Instant::now();
    h.kick(&vring, 1);
    wait_for("the read to start its I/O", || {
        fs.holding.load(Ordering::SeqCst) == 1
    });
    wait_for("the timeout", || h.dev.stats().timeouts() == 1);
    assert!(t.elapsed() >= Duration::from_millis(300));
    // Timed out, but the buffers are still being written: no answer yet.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        h.used_idx(),
        0,
        "answered while the guest's buffers were in use"
    );
    fs.release.store(true, Ordering::SeqCst);
    wait_for("the deferred answer", || h.used_idx() == 1);
    let r = h.reply(PIECES[0].0);
    assert_eq!((r.unique, r.error), (7, Errno::EIO.to_wire()));
    // The late reply of the filesystem is dropped.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(h.used_idx(), 1);
    assert_eq!(h.reply(PIECES[0].0).error, Errno::EIO.to_wire());
}

#[test]
fn a_timed_out_read_without_io_is_answered_at_once_and_its_buffers_refused() {
    let fs = Direct::default();
    let h = device(&fs, 300);
    let _release = fs.guard();
    let vring = h.vring();
    read_chain(&h, 8, LATE_IO);
    h.kick(&vring, 1);
    wait_for("the timeout answer", || h.used_idx() == 1);
    assert_eq!(h.reply(PIECES[0].0).error, Errno::EIO.to_wire());
    // The guest has its buffers back: the filesystem may no longer use them.
    fs.release.store(true, Ordering::SeqCst);
    wait_for("the late read", || fs.late_io.lock().unwrap().is_some());
    assert_eq!(*fs.late_io.lock().unwrap(), Some(false));
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(h.used_idx(), 1);
}

#[test]
fn a_large_read_with_junk_after_its_arguments_is_served_synchronously() {
    // Junk after its arguments keeps a READ from being started by
    // reference: served synchronously, its reply still reaches guest memory
    // whole, however it compares with the ring entry's buffer.
    let fs = Direct::default();
    let h = Harness::new(
        fs.clone(),
        DeviceConfig {
            max_write: 64 * 1024,
            inline_per_batch: usize::MAX,
            ..DeviceConfig::default()
        },
    );
    let vring = h.vring();
    // The largest READ the device allows (max_write; the engine's payload
    // buffers are that size): the junk has it served synchronously.
    let n = 64 * 1024u32;
    let mut msg = request(Opcode::Read, 11, &read_in(BY_REF, n));
    msg.extend_from_slice(&[0xAA; 8]);
    let len = msg.len() as u32;
    msg[..4].copy_from_slice(&len.to_le_bytes());
    h.mem.write_slice(&msg, GuestAddress(DATA)).unwrap();
    h.desc(0, DATA, len, F_NEXT, 1);
    h.desc(1, 0x10000, 16 + n, F_WRITE, 0);
    h.publish(&[0]);
    h.kick(&vring, 1);
    wait_for("the READ", || h.used_idx() == 1);
    let r = h.reply(0x10000);
    assert_eq!((r.unique, r.error, r.len), (11, 0, 16 + n));
    let mut back = vec![0u8; n as usize];
    h.mem.read_slice(&mut back, GuestAddress(0x10010)).unwrap();
    assert!(back == pattern(n as usize));

    // Past that limit (a guest ignoring INIT's max_pages) the READ gets a
    // clean error, not a reply past the buffer, and the queue serves on.
    let big = 100 * 1024u32;
    let mut msg = request(Opcode::Read, 12, &read_in(BY_REF, big));
    msg.extend_from_slice(&[0xAA; 8]);
    let len = msg.len() as u32;
    msg[..4].copy_from_slice(&len.to_le_bytes());
    h.mem.write_slice(&msg, GuestAddress(DATA)).unwrap();
    h.desc(2, DATA, len, F_NEXT, 3);
    h.desc(3, 0x40000, 16 + big, F_WRITE, 0);
    h.publish_from(1, &[2]);
    h.kick(&vring, 1);
    wait_for("the oversized READ", || h.used_idx() == 2);
    let r = h.reply(0x40000);
    assert_eq!((r.unique, r.len), (12, 16));
    assert!(
        r.error < 0,
        "an oversized synchronous READ must fail cleanly"
    );
    let mut msg = request(Opcode::Read, 13, &read_in(BY_REF, 4096));
    msg.extend_from_slice(&[0xAA; 8]);
    let len = msg.len() as u32;
    msg[..4].copy_from_slice(&len.to_le_bytes());
    h.mem.write_slice(&msg, GuestAddress(DATA)).unwrap();
    h.desc(4, DATA, len, F_NEXT, 5);
    h.desc(5, 0x80000, 16 + 4096, F_WRITE, 0);
    h.publish_from(2, &[4]);
    h.kick(&vring, 1);
    wait_for("the READ after it", || h.used_idx() == 3);
    let r = h.reply(0x80000);
    assert_eq!((r.unique, r.error, r.len), (13, 0, 16 + 4096));
}

#[test]
fn an_abort_waits_for_io_on_the_guests_buffers() {
    // Review finding: an engine abort ended a request whose buffers a
    // server was still writing, and the guest got them back.
    let fs = Direct::default();
    let h = device(&fs, 0);
    let _release = fs.guard();
    let vring = h.vring();
    read_chain(&h, 12, HOLD_IO);
    h.kick(&vring, 1);
    wait_for("the read to start its I/O", || {
        fs.holding.load(Ordering::SeqCst) == 1
    });
    h.dev.engine().abort();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        h.used_idx(),
        0,
        "answered while the guest's buffers were in use"
    );
    fs.release.store(true, Ordering::SeqCst);
    wait_for("the answer", || h.used_idx() == 1);
    assert_ne!(h.reply(PIECES[0].0).error, 0);
}

#[test]
fn stopping_the_vring_waits_for_io_on_its_buffers() {
    // Review finding: a vring stop (GET_VRING_BASE, a guest reboot) only
    // dropped late replies; a READ still in the host could write into
    // pages the guest had reused.
    use vhost_user_backend::VhostUserBackend;
    let fs = Direct::default();
    // The stop waits this long for the READ to be answered, then gives
    // it up: still not before its I/O ended.
    let h = std::sync::Arc::new(Harness::new(
        fs.clone(),
        DeviceConfig {
            workers_per_queue: 2,
            vring_stop_drain: Duration::from_millis(50),
            ..DeviceConfig::default()
        },
    ));
    let _release = fs.guard();
    let vring = h.vring();
    read_chain(&h, 13, HOLD_IO);
    h.kick(&vring, 1);
    wait_for("the read to start its I/O", || {
        fs.holding.load(Ordering::SeqCst) == 1
    });
    let h2 = h.clone();
    let stop = std::thread::spawn(move || h2.dev.stop_vring(1).unwrap());
    std::thread::sleep(Duration::from_millis(100));
    assert!(!stop.is_finished(), "the stop did not wait for the I/O");
    fs.release.store(true, Ordering::SeqCst);
    stop.join().unwrap();
    // The reply of the stopped vring never reaches the guest.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(h.used_idx(), 0);
}
