//! Background admission and INIT gating, as the kernel does them. The
//! letters in the test names are the scenarios (the others: (c) and (d) in
//! `signals.rs`, (f) in `abort_timeout.rs`):
//! - (a) raising max_background admits parked background requesters at
//!   once, in arrival order, ahead of callers that come later;
//! - (b) a fixed pool of requesters at the limit takes up quota added
//!   later (the pre-fix single wake-up does not);
//! - (e) nothing is admitted before INIT, nor before every ring queue has
//!   an entry; an INIT without limits keeps those set before it.

mod common;
use common::*;
use fuse_core::abi::{init, InitOut, Opcode};
use fuse_core::{Args, Chan, ChanConfig, Errno};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// Parks `n` background requesters one after another (so their arrival
/// order is known); each records its index in `admitted` once admitted.
fn park_waiters(
    chan: &Chan,
    n: usize,
    admitted: &Arc<Mutex<Vec<usize>>>,
) -> Vec<std::thread::JoinHandle<()>> {
    let mut hs = Vec::new();
    for i in 0..n {
        let parked_before = chan.stats().parked;
        let (c, a) = (chan.clone(), admitted.clone());
        hs.push(std::thread::spawn(move || {
            c.send_background(noop(i as u64 + 100), fuse_core::EndFn::once(|_| {}))
                .unwrap();
            a.lock().unwrap().push(i);
        }));
        until("waiter parked", || chan.stats().parked == parked_before + 1);
    }
    hs
}

fn fill_to_limit(chan: &Chan, n: usize) {
    for i in 0..n {
        chan.send_background(noop(i as u64 + 1), fuse_core::EndFn::once(|_| {}))
            .unwrap();
    }
    assert!(chan.stats().blocked);
}

/// Completes the oldest pending request through the device.
fn complete_one(dev: &fuse_core::Device) {
    let (h, _) = read(dev);
    reply(dev, h.unique, 0, &[]).unwrap();
}

#[test]
fn a_raise_admits_all_90_waiters_without_completion() {
    let (chan, _dev) = chan(10);
    fill_to_limit(&chan, 10);
    let admitted = Arc::new(Mutex::new(Vec::new()));
    let hs = park_waiters(&chan, 90, &admitted);
    assert_eq!(chan.stats().parked, 90);
    assert_eq!(chan.stats().background, 10);

    chan.set_max_background(100);
    // Admission is a hand-off under bg_lock: all 90 hold a slot the moment
    // the raise returns, before any request completed.
    let s = chan.stats();
    assert_eq!((s.background, s.parked), (100, 0));
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(admitted.lock().unwrap().len(), 90);

    // A caller arriving after the raise finds no free slot and parks; it
    // was not admitted before any of the 90.
    let late = Arc::new(AtomicBool::new(false));
    let (c, l) = (chan.clone(), late.clone());
    let h = std::thread::spawn(move || {
        let r = c.send_background(noop(999), fuse_core::EndFn::once(|_| {}));
        l.store(true, Ordering::SeqCst);
        r
    });
    until("late caller parked", || chan.stats().parked == 1);
    assert!(!late.load(Ordering::SeqCst));
    // Abort releases the parked caller with ENOTCONN.
    chan.abort();
    assert_eq!(h.join().unwrap(), Err(Errno::ENOTCONN));
}

/// Waiters beyond the new limit stay parked and are admitted strictly in
/// arrival order, ahead of a caller that arrived after the raise.
#[test]
fn a_admission_is_fifo_and_late_callers_do_not_overtake() {
    let (chan, dev) = chan(10);
    fill_to_limit(&chan, 10);
    let admitted = Arc::new(Mutex::new(Vec::new()));
    let hs = park_waiters(&chan, 90, &admitted);
    chan.set_max_background(95); // 85 free slots for 90 waiters
    until("85 admitted", || admitted.lock().unwrap().len() == 85);
    let mut got = admitted.lock().unwrap().clone();
    got.sort();
    assert_eq!(
        got,
        (0..85).collect::<Vec<_>>(),
        "the oldest 85 must be admitted"
    );
    assert_eq!(chan.stats().parked, 5);

    // A late caller parks behind the five.
    let late_done = Arc::new(AtomicBool::new(false));
    let (c, l) = (chan.clone(), late_done.clone());
    let late = std::thread::spawn(move || {
        c.send_background(noop(999), fuse_core::EndFn::once(|_| {}))
            .unwrap();
        l.store(true, Ordering::SeqCst);
    });
    until("late caller parked", || chan.stats().parked == 6);

    for expect in 85..90 {
        complete_one(&dev);
        until("next waiter admitted", || {
            admitted.lock().unwrap().len() == expect + 1
        });
        assert_eq!(*admitted.lock().unwrap().last().unwrap(), expect);
        assert!(
            !late_done.load(Ordering::SeqCst),
            "late caller overtook waiter {expect}"
        );
    }
    complete_one(&dev);
    until("late caller admitted", || late_done.load(Ordering::SeqCst));
    for h in hs {
        h.join().unwrap();
    }
    late.join().unwrap();
}

/// Runs a fixed pool of `n` threads, each keeping one background request
/// outstanding, at limit `from`; raises the limit to `to`, then completes
/// requests one at a time. Returns num_background after the raise and after
/// each completion (sampled when the pool is quiescent).
fn pool_in_flight(n: usize, from: u32, to: u32, completions: usize, legacy: bool) -> Vec<u32> {
    let (chan, dev) = chan(from);
    chan.set_legacy_single_wake(legacy);
    let stop = Arc::new(AtomicBool::new(false));
    let between = Arc::new(AtomicUsize::new(0));
    let mut hs = Vec::new();
    for i in 0..n {
        let (c, stop, between) = (chan.clone(), stop.clone(), between.clone());
        hs.push(std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let (tx, rx) = mpsc::channel();
                let b = between.clone();
                let sent = c.send_background(
                    noop(i as u64 + 1),
                    fuse_core::EndFn::once(move |_| {
                        b.fetch_add(1, Ordering::SeqCst);
                        let _ = tx.send(());
                    }),
                );
                if sent.is_err() {
                    return;
                }
                let _ = rx.recv();
                between.fetch_sub(1, Ordering::SeqCst);
            }
        }));
    }
    let quiescent = |chan: &Chan| {
        until("pool quiescent", || {
            let s = chan.stats();
            s.parked + s.background as usize == n && between.load(Ordering::SeqCst) == 0
        });
        chan.stats().background
    };
    assert_eq!(quiescent(&chan), from.min(n as u32));
    chan.set_max_background(to);
    let mut samples = vec![quiescent(&chan)];
    for _ in 0..completions {
        complete_one(&dev);
        samples.push(quiescent(&chan));
    }
    stop.store(true, Ordering::SeqCst);
    chan.abort();
    for h in hs {
        h.join().unwrap();
    }
    samples
}

#[test]
fn b_fixed_pool_takes_up_added_quota() {
    let samples = pool_in_flight(8, 2, 5, 10, false);
    assert!(
        samples.iter().all(|&s| s == 5),
        "in flight must rise to min(N, limit): {samples:?}"
    );
    let samples = pool_in_flight(4, 2, 100, 5, false);
    assert!(
        samples.iter().all(|&s| s == 4),
        "capped by the pool size: {samples:?}"
    );
}

/// The same scenario with the pre-fix single wake-up: the added quota is
/// never taken up. This shows the test above would catch the bug.
#[test]
fn b_legacy_single_wake_never_takes_up_quota() {
    let samples = pool_in_flight(8, 2, 5, 10, true);
    assert!(
        samples.iter().all(|&s| s == 3),
        "pre-fix behaviour expected: {samples:?}"
    );
}

#[test]
fn e_nothing_admitted_before_init() {
    let chan = Chan::new(ChanConfig {
        spawn_scanner: false,
        ..Default::default()
    });
    let dev = chan.device().unwrap();
    let c = chan.clone();
    let sync = std::thread::spawn(move || c.send(noop(1)));
    let c = chan.clone();
    let bgr =
        std::thread::spawn(move || c.send_background(noop(2), fuse_core::EndFn::once(|_| {})));
    until("both parked", || chan.stats().parked == 2);
    assert!(
        try_read(&dev).is_none(),
        "nothing may reach the server before INIT"
    );

    // INIT is FORCE: it passes the gate it opens.
    let c = chan.clone();
    let init_thread = std::thread::spawn(move || c.init());
    let (h, _) = read(&dev);
    assert_eq!(h.opcode, Opcode::Init as u32);
    let out = InitOut {
        major: 7,
        minor: 45,
        max_background: 4,
        congestion_threshold: 3,
        max_write: 65536,
        ..Default::default()
    };
    reply(&dev, h.unique, 0, zerocopy::IntoBytes::as_bytes(&out)).unwrap();
    let neg = init_thread.join().unwrap().unwrap();
    assert_eq!(neg.max_background, 4);
    assert!(chan.is_initialized());
    until("both admitted", || chan.stats().parked == 0);
    for _ in 0..2 {
        let (h, _) = read(&dev);
        reply(&dev, h.unique, 0, &[]).unwrap();
    }
    assert!(sync.join().unwrap().is_ok());
    assert!(bgr.join().unwrap().is_ok());
}

#[test]
fn e_init_without_limits_keeps_the_max_background_set_before_it() {
    // The kernel: an INIT reply's zero max_background or
    // congestion_threshold leaves the connection's value as it is.
    let chan = Chan::new(ChanConfig {
        spawn_scanner: false,
        ..Default::default()
    });
    chan.set_max_background(5);
    chan.set_congestion_threshold(4);
    let out = InitOut {
        major: 7,
        minor: 45,
        max_write: 65536,
        ..Default::default()
    };
    let neg = chan.process_init_reply(&out).unwrap();
    assert_eq!(neg.max_background, 5, "INIT's 0 reset it");
    assert_eq!(neg.congestion_threshold, 4, "INIT's 0 reset it");
    assert_eq!(chan.negotiated(), Some(neg));
    let s = chan.stats();
    assert_eq!((s.max_background, s.congestion_threshold), (5, 4));
}

#[test]
fn e_ring_gate_holds_until_every_queue_has_an_entry() {
    use fuse_core::dev_uring::{cmd_area, EntryBufs};
    let cfg = ChanConfig {
        spawn_scanner: false,
        ring_queues: 2,
        ..Default::default()
    };
    let chan = Chan::new(cfg);
    let out = InitOut {
        major: 7,
        minor: 45,
        flags: init::INIT_EXT as u32,
        flags2: (init::OVER_IO_URING >> 32) as u32,
        ..Default::default()
    };
    let neg = chan.process_init_reply(&out).unwrap();
    assert_eq!(neg.ring_queues, 2);
    assert!(chan.is_initialized());
    let c = chan.clone();
    let t = std::thread::spawn(move || c.send(noop(1)));
    until("parked on ring gate", || chan.stats().parked == 1);
    let end = chan.ring_end(false);
    let h0 = end
        .register(&cmd_area(0, 0, 0), EntryBufs::with_payload(8192), None)
        .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(chan.stats().parked, 1, "one queue of two is not enough");
    end.register(&cmd_area(1, 0, 0), EntryBufs::with_payload(8192), None)
        .unwrap();
    // The request names queue 0.
    let mut f = end.fetch(h0, true).unwrap().unwrap();
    f.set_reply(0, 0);
    let area = f.commit_cmd();
    end.commit(&area, f, None).unwrap();
    assert!(t.join().unwrap().is_ok());
}

#[test]
fn init_with_wrong_major_aborts() {
    let chan = Chan::new(ChanConfig {
        spawn_scanner: false,
        ..Default::default()
    });
    let out = InitOut {
        major: 8,
        ..Default::default()
    };
    assert_eq!(chan.process_init_reply(&out), Err(Errno::EPROTO));
    assert!(!chan.is_connected());
    assert_eq!(
        chan.send(Args::new(Opcode::Getattr, 1)),
        Err(Errno::ENOTCONN)
    );
}
