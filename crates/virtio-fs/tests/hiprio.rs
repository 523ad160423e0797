//! The hiprio queue serves FORGETs on its own thread: a stop of the queue
//! (GET_VRING_BASE, before a device state is saved) returns only once the
//! forgets its thread took have reached the filesystem; a forget is served
//! in the kick that takes it, not queued for an engine worker; while
//! request queue 0's thread (which serves hiprio too) hangs in a host
//! call, the watchdog serves the hiprio queue in its place.

mod common;

use common::*;
use fuse_core::abi::{ForgetIn, GetattrIn, Opcode};
use fuse_core::server::{Filesystem, Wake};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vhost_user_backend::{VhostUserBackend, VringT};
use virtio_fs::DeviceConfig;
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::epoll::EventSet;
use zerocopy::{FromZeros, IntoBytes};

/// How long each forget takes.
const SLOW: Duration = Duration::from_millis(300);

/// A filesystem whose forget takes [`SLOW`]; counts forgets started and
/// lookups dropped.
#[derive(Clone, Default)]
struct SlowForget {
    started: Arc<AtomicU64>,
    dropped: Arc<AtomicU64>,
}

impl Filesystem for SlowForget {
    type Inode = u64;
    type Handle = u64;
    type Io = ();

    fn new_io(&self, _: Wake) {}
    fn forget(&self, _ino: u64, nlookup: u64) {
        self.started.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(SLOW);
        self.dropped.fetch_add(nlookup, Ordering::SeqCst);
    }
}

/// A FORGET of `nlookup` lookups of node 1 at head 0 of the hiprio vring.
fn forget_chain(h: &Harness<SlowForget>, nlookup: u64) {
    let msg = request(Opcode::Forget, 0, ForgetIn { nlookup }.as_bytes());
    h.chain(0, DATA, &msg, 0);
    h.publish_from(0, &[0]);
}

#[test]
fn a_hiprio_stop_waits_for_the_forgets_its_thread_took() {
    let fs = SlowForget::default();
    let h = Arc::new(Harness::new(fs.clone(), DeviceConfig::default()));
    let hv = h.vring();
    forget_chain(&h, 3);
    let (h2, hv2) = (h.clone(), hv.clone());
    let serving = std::thread::spawn(move || h2.kick(&hv2, 0));
    wait_for("the forget to start", || {
        fs.started.load(Ordering::SeqCst) == 1
    });
    // GET_VRING_BASE: the queue is made not ready, then the device told.
    let t = Instant::now();
    hv.set_queue_ready(false);
    VhostUserBackend::stop_vring(&h.dev, 0).unwrap();
    let waited = t.elapsed();
    assert_eq!(
        fs.dropped.load(Ordering::SeqCst),
        3,
        "the stop returned (after {waited:?}) before the forget reached the filesystem"
    );
    serving.join().unwrap();
    assert_eq!(h.dev.stats().queues()[0].completed(), 1);
}

#[test]
fn a_forget_is_served_in_the_kick_that_takes_it() {
    // No engine worker is asked for: the hiprio thread serves the FORGET
    // itself, and nothing is left queued in the engine.
    let fs = SlowForget::default();
    let h = Harness::new(fs.clone(), DeviceConfig::default());
    let hv = h.vring();
    forget_chain(&h, 2);
    h.kick(&hv, 0);
    assert_eq!(fs.dropped.load(Ordering::SeqCst), 2, "served in the kick");
    assert_eq!(h.dev.engine().chan().forgets_queued(), 0);
}

/// The hiprio vring, at its own addresses (request queue 0 has the
/// harness's).
const HP_DESC: u64 = 0x60000;
const HP_AVAIL: u64 = 0x61000;
const HP_USED: u64 = 0x62000;
const HP_DATA: u64 = 0x64000;

#[test]
fn forgets_are_served_while_request_queue_0s_thread_hangs_in_line() {
    let fs = HangFs::default();
    let h = Arc::new(Harness::new(fs.clone(), in_line_with_standby()));
    let _release = ReleaseOnDrop(fs.release.clone());
    // Vring thread 0's vrings, as the event loop hands them over: hiprio,
    // then request queue 0.
    let vrings = vec![vring_at(&h, HP_DESC, HP_AVAIL, HP_USED), h.vring()];
    let getattr = request_as(Opcode::Getattr, 1, 4242, GetattrIn::new_zeroed().as_bytes());
    let (a, _, _, _) = h.chain(0, DATA, &getattr, 4096);
    h.publish(&[a]);
    let (dev, v2) = (h.dev.clone(), vrings.clone());
    // Request queue 0's kick (device event 1 of thread 0): the thread
    // serves the GETATTR in line and hangs in it.
    let thread0 = std::thread::spawn(move || dev.handle_event(1, EventSet::IN, &v2, 0).unwrap());
    wait_for("the GETATTR to hang in line", || {
        fs.hung.load(Ordering::SeqCst) > 0
    });
    // The guest forgets 3 lookups on hiprio; the thread that would take
    // the kick hangs.
    let msg = request(Opcode::Forget, 2, ForgetIn { nlookup: 3 }.as_bytes());
    h.mem.write_slice(&msg, GuestAddress(HP_DATA)).unwrap();
    let mut d = [0u8; 16];
    d[..8].copy_from_slice(&HP_DATA.to_le_bytes());
    d[8..12].copy_from_slice(&(msg.len() as u32).to_le_bytes());
    h.mem.write_slice(&d, GuestAddress(HP_DESC)).unwrap();
    h.mem.write_obj(0u16, GuestAddress(HP_AVAIL + 4)).unwrap();
    h.mem.write_obj(1u16, GuestAddress(HP_AVAIL + 2)).unwrap();
    let t = Instant::now();
    while fs.dropped.load(Ordering::SeqCst) < 3 && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(2));
    }
    let used: u16 = h.mem.read_obj(GuestAddress(HP_USED + 2)).unwrap();
    assert_eq!(
        (fs.dropped.load(Ordering::SeqCst), used),
        (3, 1),
        "(lookups dropped, hiprio chains given back) 2 s after the FORGET, \
         while request queue 0's thread hangs"
    );
    assert!(!thread0.is_finished(), "the GETATTR should still hang");
    fs.release.store(true, Ordering::SeqCst);
    thread0.join().unwrap();
}
