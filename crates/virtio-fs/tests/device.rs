//! The device against a backend that hangs: a request that outlives the
//! timeout is answered EIO and counted, and the backend is asked to give
//! up on it, while other requests go on being served; the late answer
//! never reaches the guest; a queue that stalled
//! on full admission resumes when the slot frees.

mod common;

use common::*;
use fuse_core::abi::Opcode;
use fuse_core::Errno;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vhost_user_backend::VringT;
use virtio_fs::DeviceConfig;
use vm_memory::Bytes;
use zerocopy::{FromZeros, IntoBytes};

/// A device whose engine admits one background request at a time, in
/// front of a `HangFs` that is released when the guard (dropped before the
/// harness) goes.
fn one_slot() -> (HangFs, Harness<HangFs>, ReleaseOnDrop) {
    let fs = HangFs::default();
    let h = Harness::new(
        fs.clone(),
        DeviceConfig {
            max_background: 1,
            congestion_threshold: 1,
            workers_per_queue: 2,
            ..DeviceConfig::default()
        },
    );
    let release = ReleaseOnDrop(fs.release.clone());
    (fs, h, release)
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

#[test]
fn a_hung_backend_times_out_and_the_queue_keeps_moving() {
    let fs = HangFs::default();
    let h = Harness::new(
        fs.clone(),
        DeviceConfig {
            request_timeout: Duration::from_millis(1000),
            workers_per_queue: 2,
            ..DeviceConfig::default()
        },
    );
    let _release = ReleaseOnDrop(fs.release.clone());
    let vring = h.vring();
    let (a, ra, next, at) = h.chain(0, DATA, &getattr(1, 4242), 4096);
    let (b, rb, _, _) = h.chain(next, at, &getattr(2, 0), 4096);
    h.publish(&[a, b]);
    let t = Instant::now();
    h.kick(&vring, 1);
    // B is answered while A hangs.
    wait_for("the second request", || h.used_idx() >= 1);
    assert_eq!((h.reply(rb).unique, h.reply(rb).error), (2, 0));
    wait_for("the first request to reach the backend", || {
        fs.hung.load(Ordering::SeqCst) == 1
    });
    // A is answered EIO once it outlives the timeout, and counted.
    wait_for("the timeout", || h.used_idx() >= 2);
    assert!(t.elapsed() >= Duration::from_millis(1000));
    assert_eq!(h.reply(ra).unique, 1);
    assert_eq!(h.reply(ra).error, Errno::EIO.to_wire());
    assert_eq!(h.dev.stats().timeouts(), 1);
    // The backend was asked to give up on exactly that request (the
    // passthrough cancels its io_uring op); it returns, its answer is
    // dropped, the used ring does not move and the guest keeps the EIO.
    wait_for("the hung call to return", || {
        fs.finished.load(Ordering::SeqCst) == 1
    });
    assert_eq!(
        *fs.interrupted.lock().unwrap(),
        vec![fs.hung_unique.load(Ordering::SeqCst)]
    );
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(h.used_idx(), 2);
    assert_eq!(h.reply(ra).error, Errno::EIO.to_wire());
    assert_eq!(h.dev.engine().chan().stats().background, 0);
}

#[test]
fn a_queue_stalled_on_admission_resumes_when_a_slot_frees() {
    let (fs, h, _release) = one_slot();
    let vring = h.vring();
    let (a, ra, next, at) = h.chain(0, DATA, &getattr(1, 4242), 4096);
    let (b, rb, _, _) = h.chain(next, at, &getattr(2, 0), 4096);
    h.publish(&[a, b]);
    h.kick(&vring, 1);
    wait_for("the first request to reach the backend", || {
        fs.hung.load(Ordering::SeqCst) == 1
    });
    // A holds the only slot: B stays in the avail ring.
    assert_eq!(vring.queue_next_avail(), 1);
    assert_eq!(h.dev.stats().queues()[1].stalls(), 1);
    assert_eq!(h.used_idx(), 0);
    // A's end frees the slot and signals the queue's resume eventfd; the
    // vring thread would then serve the queue again.
    fs.release.store(true, Ordering::SeqCst);
    wait_for("the first answer", || h.used_idx() == 1);
    assert_eq!(h.reply(ra).error, 0);
    h.resume(&vring, 1);
    wait_for("the second answer", || h.used_idx() == 2);
    assert_eq!((h.reply(rb).unique, h.reply(rb).error), (2, 0));
    assert_eq!(h.dev.stats().queues()[1].in_flight(), 0);
}

#[test]
fn an_avail_index_far_ahead_does_not_spin_the_vring_thread() {
    let h = Harness::new(HangFs::default(), DeviceConfig::default());
    vhost_user_backend::VhostUserBackend::set_event_idx(&h.dev, true);
    let vring = h.vring();
    vring.set_queue_event_idx(true);
    // An index more than a vring's size ahead: nothing can be popped, yet the
    // queue keeps announcing work.
    h.mem
        .write_obj(QSIZE + 5, vm_memory::GuestAddress(AVAIL + 2))
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let dev = h.dev.clone();
    let v2 = vring.clone();
    std::thread::spawn(move || {
        kick(&dev, &v2, 1);
        tx.send(()).unwrap();
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("the vring thread did not come back");
    assert!(h.dev.stats().queues()[1].malformed() >= 1);
}

#[test]
fn lock_calls_and_releases_are_never_held_back_by_admission() {
    let (fs, h, _release) = one_slot();
    let vring = h.vring();
    let (a, _, next, at) = h.chain(0, DATA, &getattr(1, 4242), 4096);
    let lk = fuse_core::abi::LkIn::new_zeroed();
    let setlk = request_as(Opcode::Setlk, 2, 0, lk.as_bytes());
    let (b, rb, _, _) = h.chain(next, at, &setlk, 4096);
    h.publish(&[a, b]);
    h.kick(&vring, 1);
    // A holds the only background slot, yet the SETLK is served (this
    // filesystem has no locks: ENOSYS), as the kernel never queues locks.
    wait_for("the lock call", || h.used_idx() == 1);
    assert_eq!(h.reply(rb).unique, 2);
    assert_eq!(h.reply(rb).error, Errno::ENOSYS.to_wire());
    // A went to a worker and may reach the backend after the lock call
    // was answered; it must get there and stay there.
    wait_for("the first request to reach the backend", || {
        fs.hung.load(Ordering::SeqCst) == 1
    });
    assert_eq!(h.used_idx(), 1, "A was answered while its backend hangs");
}

#[test]
fn a_vring_stop_waits_for_a_workers_answer_before_it_returns() {
    // GET_VRING_BASE before a migration: the request a ring worker is
    // serving is answered into the used ring before the stop returns.
    let fs = HangFs::default();
    let h = Arc::new(Harness::new(fs.clone(), DeviceConfig::default()));
    let _release = ReleaseOnDrop(fs.release.clone());
    let vring = h.vring();
    let (a, ra, _, _) = h.chain(0, DATA, &getattr(1, 4242), 4096);
    h.publish(&[a]);
    h.kick(&vring, 1);
    wait_for("the request to reach the backend", || {
        fs.hung.load(Ordering::SeqCst) == 1
    });
    let h2 = h.clone();
    let stop = std::thread::spawn(move || {
        vhost_user_backend::VhostUserBackend::stop_vring(&h2.dev, 1).unwrap()
    });
    std::thread::sleep(Duration::from_millis(150));
    assert!(
        !stop.is_finished(),
        "the vring went back with a request unanswered"
    );
    fs.release.store(true, Ordering::SeqCst);
    stop.join().unwrap();
    assert_eq!(h.used_idx(), 1, "the answer is in the used ring");
    assert_eq!((h.reply(ra).unique, h.reply(ra).error), (1, 0));
    assert_eq!(h.dev.stats().lost_on_stop(), 0);
    assert!(fs.interrupted.lock().unwrap().is_empty(), "it was given up");
}

#[test]
fn replies_of_a_stopped_vring_never_reach_the_guest() {
    let fs = HangFs::default();
    // The stop waits this long for the hung request, then gives it up.
    let cfg = DeviceConfig {
        vring_stop_drain: Duration::from_millis(50),
        ..DeviceConfig::default()
    };
    let h = Harness::new(fs.clone(), cfg);
    let _release = ReleaseOnDrop(fs.release.clone());
    let vring = h.vring();
    let (a, ra, _, _) = h.chain(0, DATA, &getattr(1, 4242), 4096);
    h.publish(&[a]);
    h.kick(&vring, 1);
    wait_for("the request to reach the backend", || {
        fs.hung.load(Ordering::SeqCst) == 1
    });
    // GET_VRING_BASE: the frontend takes the vring back.
    vhost_user_backend::VhostUserBackend::stop_vring(&h.dev, 1).unwrap();
    assert_eq!(h.dev.stats().lost_on_stop(), 1);
    fs.release.store(true, Ordering::SeqCst);
    wait_for("the backend to finish", || {
        fs.finished.load(Ordering::SeqCst) == 1
    });
    wait_for("the dropped reply to be counted", || {
        h.dev.stats().aborted() == 1
    });
    assert_eq!(h.used_idx(), 0, "a reply reached the stopped vring");
    assert_eq!(h.reply(ra).unique, 0, "the guest buffer was written");
}

/// A device whose vring thread serves every request itself (standby
/// workers for the watchdog), in front of a `HangFs` released when the
/// guard goes.
fn serving_in_line() -> (HangFs, Arc<Harness<HangFs>>, ReleaseOnDrop) {
    let fs = HangFs::default();
    let h = Arc::new(Harness::new(fs.clone(), in_line_with_standby()));
    let release = ReleaseOnDrop(fs.release.clone());
    (fs, h, release)
}

#[test]
fn requests_popped_with_one_that_hangs_in_line_are_served_meanwhile() {
    // A and B come in one kick: the vring thread sends both in one round,
    // serves A itself and hangs in it; B, sent to the thread's own entries
    // in the same round, goes to a worker once the watchdog sees the
    // thread stuck.
    let (fs, h, _release) = serving_in_line();
    let vring = h.vring();
    let (a, ra, next, at) = h.chain(0, DATA, &getattr(1, 4242), 4096);
    let (b, rb, _, _) = h.chain(next, at, &getattr(2, 0), 4096);
    h.publish(&[a, b]);
    let (h2, v2) = (h.clone(), vring.clone());
    let kicker = std::thread::spawn(move || h2.kick(&v2, 1));
    wait_for("A to hang in line", || fs.hung.load(Ordering::SeqCst) == 1);
    wait_for("B, served by a worker", || h.used_idx() >= 1);
    assert_eq!((h.reply(rb).unique, h.reply(rb).error), (2, 0));
    assert!(!kicker.is_finished(), "A should still hang");
    fs.release.store(true, Ordering::SeqCst);
    kicker.join().unwrap();
    wait_for("A", || h.used_idx() == 2);
    assert_eq!((h.reply(ra).unique, h.reply(ra).error), (1, 0));
}

#[test]
fn a_vring_thread_stuck_in_line_does_not_stall_its_queue() {
    let (fs, h, _release) = serving_in_line();
    let vring = h.vring();
    let (a, ra, next, at) = h.chain(0, DATA, &getattr(1, 4242), 4096);
    let (b, rb, _, _) = h.chain(next, at, &getattr(2, 0), 4096);
    h.publish(&[a]);
    // The vring thread (here: this helper) serves A itself and hangs in it.
    let (h2, v2) = (h.clone(), vring.clone());
    let kicker = std::thread::spawn(move || h2.kick(&v2, 1));
    wait_for("A to hang in line", || fs.hung.load(Ordering::SeqCst) == 1);
    // The guest adds B; nobody is left to pop it but the watchdog.
    h.publish(&[a, b]);
    wait_for("B, served by a worker", || h.used_idx() >= 1);
    assert_eq!((h.reply(rb).unique, h.reply(rb).error), (2, 0));
    let q = &h.dev.stats().queues()[1];
    assert!(q.takeovers() >= 1);
    assert!(!kicker.is_finished(), "A should still hang");
    fs.release.store(true, Ordering::SeqCst);
    kicker.join().unwrap();
    wait_for("A", || h.used_idx() == 2);
    assert_eq!((h.reply(ra).unique, h.reply(ra).error), (1, 0));
    assert_eq!(q.inline(), 1);
}
