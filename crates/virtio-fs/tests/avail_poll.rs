//! A request queue's vring thread polls its avail ring for a while after
//! the queue emptied (`DeviceConfig::poll_time`), with the device served
//! over a real vhost-user socket and a guest driver (EVENT_IDX) on the
//! other end:
//!
//! - a request the guest posts while the thread polls is served without
//!   a kick: the device has not asked for one;
//! - FORGETs on the hiprio queue are served meanwhile, not after the poll;
//! - once the window has passed the thread sleeps with notifications on:
//!   the guest's next request asks for a kick, and the thread burns no CPU;
//! - pauses longer than the most shrink the window to nothing, so a guest
//!   that sends a request now and then costs no polling, and requests
//!   that come often again grow it back;
//! - one wake-up polls for a bounded time, however busy the guest;
//! - a vring stopped while its thread polls ends the poll.

mod common;

use fuse_core::abi::{Attr, AttrOut, GetattrIn, Opcode};
use fuse_core::server::{Ctx, Filesystem, FsResult};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vhost::VhostBackend;
use virtio_fs::testing::guest::{Done, GuestDriver, Req};
use virtio_fs::{DeviceConfig, FsDevice};
use zerocopy::{FromZeros, IntoBytes};

/// Request queue 1 (vring thread 0, which also serves hiprio).
const Q: usize = 1;

/// The tests of this file one at a time: each times its polling thread
/// (windows of milliseconds, CPU used while it should sleep), which the
/// others' polling threads, on the same two CPUs, would disturb.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}
const PATIENCE: Duration = Duration::from_secs(10);

/// Answers GETATTR; counts FORGETs.
#[derive(Clone, Default)]
struct Attrs {
    forgets: Arc<AtomicU64>,
}

impl Filesystem for Attrs {
    type Inode = u64;
    type Handle = u64;
    type Io = ();

    fn new_io(&self, _: fuse_core::server::Wake) {}

    fn forget(&self, _: u64, nlookup: u64) {
        self.forgets.fetch_add(nlookup, Ordering::SeqCst);
    }

    fn getattr(&self, _: &Ctx, ino: u64, _: Option<u64>) -> FsResult<(Attr, Duration)> {
        common::dir_attr(ino)
    }
}

struct Served {
    _one: std::sync::MutexGuard<'static, ()>,
    base: PathBuf,
    fs: Attrs,
    guest: Option<GuestDriver>,
    dev: FsDevice<Attrs>,
    daemon: Option<JoinHandle<()>>,
}

/// One test at a time: the CPU tests read the whole process's CPU time,
/// which another test's polling thread would add to.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serve(name: &str, poll_time: Duration) -> Served {
    let one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let base = std::env::temp_dir().join(format!("fusebox-poll-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let sock = base.join("vfs.sock");
    let fs = Attrs::default();
    let dev = FsDevice::new(
        fs.clone(),
        DeviceConfig {
            queue_size: 128,
            inline_per_batch: usize::MAX,
            poll_time,
            ..DeviceConfig::default()
        },
    )
    .unwrap();
    let daemon = common::serve_device(&dev, &sock);
    let guest = common::connect_guest(&sock, 4, 4096);
    Served {
        _one: one,
        base,
        fs,
        guest: Some(guest),
        dev,
        daemon: Some(daemon),
    }
}

impl Served {
    fn g(&mut self) -> &mut GuestDriver {
        self.guest.as_mut().unwrap()
    }

    /// Posts a GETATTR and publishes it; returns whether the guest kicked.
    fn post_getattr(&mut self) -> bool {
        let body = GetattrIn::new_zeroed();
        self.g()
            .post(
                Q,
                0,
                &Req {
                    opcode: Opcode::Getattr,
                    nodeid: 1,
                    args: body.as_bytes(),
                    data_out: 0,
                    reply: std::mem::size_of::<AttrOut>() as u32,
                },
            )
            .unwrap();
        self.g().publish(Q)
    }

    /// Waits for the answer to the one request in flight.
    fn answer(&mut self) -> Done {
        let t0 = Instant::now();
        let mut out = Vec::new();
        while out.is_empty() {
            assert!(t0.elapsed() < PATIENCE, "no answer");
            self.g().wait(Q, PATIENCE).unwrap();
            self.g().reap(Q, &mut out).unwrap();
        }
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].out.error, 0);
        out.pop().unwrap()
    }

    /// One GETATTR, answered; returns whether the guest kicked for it.
    fn getattr(&mut self) -> bool {
        let kicked = self.post_getattr();
        self.answer();
        kicked
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        drop(self.guest.take());
        if let Some(d) = self.daemon.take() {
            let _ = d.join();
        }
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// This process's CPU time (user and system), all threads.
fn cpu() -> Duration {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the rusage it is given.
    let ru = unsafe {
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()), 0);
        ru.assume_init()
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[test]
fn requests_posted_while_it_polls_need_no_kick() {
    let _serial = serial();
    let mut s = serve("nokick", Duration::from_secs(1));
    // The first request after INIT: the device may be asleep.
    s.getattr();
    let mut kicks = 0;
    for _ in 0..50 {
        if s.getattr() {
            kicks += 1;
        }
    }
    // Each of these was posted within 1 s of the last answer: the device
    // was still polling, with no kick asked for; its counters say so.
    assert_eq!(kicks, 0);
    assert!(s.dev.stats().queues()[Q].polled() >= 50);
}

#[test]
fn forgets_are_served_while_it_polls() {
    let _serial = serial();
    let mut s = serve("forget", Duration::from_secs(3));
    s.getattr();
    // The request queue's thread now polls for 3 s. The hiprio queue has
    // four slots: a FORGET waits for a slot until the device serves one,
    // which must not take the poll's 3 s.
    let t0 = Instant::now();
    for _ in 0..12 {
        s.g()
            .forget(1, 1, Duration::from_secs(1))
            .expect("a FORGET waited for the poll to end");
    }
    while s.fs.forgets.load(Ordering::SeqCst) < 12 {
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "FORGETs wait for the poll to end"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // And the request queue is still served without a kick.
    assert!(!s.getattr());
}

#[test]
fn after_the_window_it_sleeps_and_asks_for_a_kick() {
    let _serial = serial();
    let window = Duration::from_millis(100);
    let mut s = serve("sleeps", window);
    s.getattr();
    assert!(!s.getattr(), "posted within the window");
    std::thread::sleep(window * 3);
    // Asleep: no CPU goes by.
    let (c0, t0) = (cpu(), Instant::now());
    std::thread::sleep(Duration::from_millis(500));
    let (used, took) = (cpu() - c0, t0.elapsed());
    assert!(used < took / 10, "{used:?} of CPU in {took:?} of sleep");
    assert!(s.dev.stats().queues()[Q].poll_misses() >= 1);
    // Notifications are on again: the next request kicks, and is served.
    assert!(s.post_getattr(), "no kick asked for after the window");
    s.answer();
}

#[test]
fn pauses_longer_than_the_most_stop_the_polling() {
    let _serial = serial();
    let most = Duration::from_millis(20);
    let mut s = serve("shrinks", most);
    s.getattr();
    assert!(!s.getattr(), "posted within the window");
    // Each pause is longer than the most, though shorter than the most
    // plus the window: the window halves each time (the gap counts from
    // the queue emptying, the poll included), from 20 ms to nothing
    // within 13 pauses.
    let pause = Duration::from_millis(30);
    for _ in 0..16 {
        std::thread::sleep(pause);
        s.getattr();
    }
    // Polled at the most, these ten pauses would burn 200 ms of CPU.
    let (c0, t0) = (cpu(), Instant::now());
    for _ in 0..10 {
        std::thread::sleep(pause);
        s.getattr();
    }
    let (used, took) = (cpu() - c0, t0.elapsed());
    assert!(used < took / 10, "{used:?} of CPU in {took:?} of pauses");
}

type Publish = Box<dyn FnMut() -> bool + Send>;

/// Answers GETATTR in line, and each time publishes the next of its
/// chains first: a guest that always refills the queue before the device
/// looks again.
#[derive(Clone, Default)]
struct Refill {
    /// Publishes one more chain; false once it has published enough.
    publish: Arc<std::sync::Mutex<Option<Publish>>>,
    served: Arc<AtomicU64>,
}

impl Filesystem for Refill {
    type Inode = u64;
    type Handle = u64;
    type Io = ();

    fn new_io(&self, _: fuse_core::server::Wake) {}

    fn getattr(&self, _: &Ctx, ino: u64, _: Option<u64>) -> FsResult<(Attr, Duration)> {
        self.served.fetch_add(1, Ordering::SeqCst);
        if let Some(publish) = self.publish.lock().unwrap().as_mut() {
            publish();
        }
        common::dir_attr(ino)
    }
}

#[test]
fn a_guest_that_keeps_its_queue_busy_still_lets_the_thread_back_to_its_epoll() {
    let _serial = serial();
    use common::{request, Harness, DATA, QSIZE};
    let fs = Refill::default();
    // A wake-up's span is four times the most polled, at least 2 ms: 100 ms
    // here, so a thread the host deschedules for a while still polls after
    // its first request.
    let h = Harness::new(
        fs.clone(),
        DeviceConfig {
            inline_per_batch: usize::MAX,
            poll_time: Duration::from_millis(25),
            ..DeviceConfig::default()
        },
    );
    vhost_user_backend::VhostUserBackend::set_event_idx(&h.dev, true);
    let vring = h.vring();
    vhost_user_backend::VringT::set_queue_event_idx(&vring, true);
    // Sixteen GETATTR chains, published in turn: each is answered long
    // before its turn comes again.
    let mut heads = Vec::new();
    let (mut desc, mut at) = (0, DATA);
    for i in 0..16u64 {
        let msg = request(Opcode::Getattr, i + 1, GetattrIn::new_zeroed().as_bytes());
        let (head, _, next, next_at) = h.chain(desc, at, &msg, 256);
        heads.push(head);
        (desc, at) = (next, next_at);
    }
    assert!(desc <= QSIZE);
    let limit = 200_000u64;
    let (mem, mut idx, mut n) = (h.mem.clone(), 1u16, 0u64);
    let first = heads[0];
    *fs.publish.lock().unwrap() = Some(Box::new(move || {
        if n >= limit {
            return false;
        }
        n += 1;
        let head = heads[(n % 16) as usize];
        let slot = common::AVAIL + 4 + 2 * u64::from(idx % QSIZE);
        vm_memory::Bytes::write_obj(&mem, head, vm_memory::GuestAddress(slot)).unwrap();
        idx = idx.wrapping_add(1);
        vm_memory::Bytes::write_obj(&mem, idx, vm_memory::GuestAddress(common::AVAIL + 2)).unwrap();
        true
    }));
    // Stops the guest however the test ends (a failed assertion must not
    // leave it refilling the queue under the other tests).
    let _stop = StopPublishing(fs.publish.clone());
    h.publish(&[first]);
    // The kick returns after about its span of serving, its resume
    // written, not after the 200 000 requests this guest would go on
    // sending.
    let t0 = Instant::now();
    h.kick(&vring, 1);
    let took = t0.elapsed();
    let served = fs.served.load(Ordering::SeqCst);
    assert!(served > 1, "the refilled queue was not served ({took:?})");
    assert!(
        served < limit / 2 && took < Duration::from_secs(5),
        "{served} requests in {took:?} on one wake-up"
    );
    // The resume event brings the thread back, and it serves on.
    h.resume(&vring, 1);
    assert!(fs.served.load(Ordering::SeqCst) > served);
}

/// Clears a [`Refill`]'s publisher when dropped.
struct StopPublishing(Arc<std::sync::Mutex<Option<Publish>>>);

impl Drop for StopPublishing {
    fn drop(&mut self) {
        // (A publisher that panicked poisoned the lock: still cleared.)
        let mut p = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *p = None;
    }
}

#[test]
fn a_window_shrunk_to_nothing_grows_back_when_the_guest_comes_often() {
    let _serial = serial();
    let most = Duration::from_millis(50);
    let mut s = serve("grows", most);
    s.getattr();
    // Pauses longer than the most: the window goes to nothing.
    for _ in 0..15 {
        std::thread::sleep(most + Duration::from_millis(10));
        s.getattr();
    }
    std::thread::sleep(Duration::from_millis(5));
    assert!(s.getattr(), "the thread still polls");
    // Requests 5 ms apart: each gap is within the most, and the window
    // doubles from 4 µs until it covers them (about 11 requests).
    let mut kicks = Vec::new();
    for _ in 0..30 {
        std::thread::sleep(Duration::from_millis(5));
        kicks.push(s.getattr());
    }
    assert!(
        kicks[20..].iter().all(|k| !k),
        "still kicked for every request: {kicks:?}"
    );
}

#[test]
fn a_vring_stopped_while_its_thread_polls_ends_the_poll() {
    let _serial = serial();
    let mut s = serve("stop", Duration::from_secs(3));
    s.getattr();
    // The thread polls for 3 s; the VMM stops the vring (GET_VRING_BASE):
    // INIT and the GETATTR were popped.
    let fe = s.g().frontend().clone();
    let index = s.g().queue_index(Q);
    assert_eq!(fe.get_vring_base(index).unwrap(), 2);
    // The poll ends: no CPU goes by.
    std::thread::sleep(Duration::from_millis(50));
    let (c0, t0) = (cpu(), Instant::now());
    std::thread::sleep(Duration::from_millis(300));
    let (used, took) = (cpu() - c0, t0.elapsed());
    assert!(
        used < took / 10,
        "{used:?} of CPU in {took:?} after the stop"
    );
}
