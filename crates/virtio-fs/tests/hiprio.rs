//! The hiprio queue serves FORGETs on its own thread: a stop of the queue
//! (GET_VRING_BASE, before a device state is saved) returns only once the
//! forgets its thread took have reached the filesystem; a forget is served
//! in the kick that takes it, not queued for an engine worker.

mod common;

use common::*;
use fuse_core::abi::{ForgetIn, Opcode};
use fuse_core::server::{Filesystem, Wake};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vhost_user_backend::{VhostUserBackend, VringT};
use virtio_fs::DeviceConfig;
use zerocopy::IntoBytes;

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

/// A FORGET of `nlookup` lookups of node 1 at head 0 of the hiprio ring.
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
    assert_eq!(h.dev.stats().queues[0].completed.load(Ordering::SeqCst), 1);
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
