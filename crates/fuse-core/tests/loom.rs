//! loom models of the engine's real code: admission and wake-up, abort vs
//! completion, interrupt vs reply, the ring's fetch and commit against
//! an abort, and an INIT that keeps the limits in force against a
//! `set_max_background`. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p fuse-core --test loom --release`.
#![cfg(loom)]

use fuse_core::abi::{self, init, InHeader, Opcode};
use fuse_core::dev_uring::{cmd_area, EntHandle, EntryBufs, RingEnd};
use fuse_core::{Args, Chan, ChanConfig, Errno, Negotiated};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use zerocopy::FromBytes;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

fn chan(max_background: u32) -> Chan {
    let chan = Chan::new(ChanConfig {
        spawn_scanner: false,
        ..Default::default()
    });
    chan.set_initialized(Negotiated {
        max_write: 4096,
        congestion_threshold: max_background,
        ..Negotiated::with_max_background(max_background)
    });
    chan
}

fn noop() -> Args {
    Args::new(Opcode::Getattr, 1)
}

fn read_unique(dev: &fuse_core::Device) -> u64 {
    let mut b = vec![0u8; dev.min_read_buffer()];
    let n = dev.try_read(&mut b).unwrap();
    InHeader::read_from_prefix(&b[..n]).unwrap().0.unique
}

/// Two requesters park at max_background = 1 while one request holds the
/// slot; raising the limit to 3 must admit both without any completion.
fn raise_admits_every_waiter(legacy: bool) {
    model(move || {
        let chan = chan(1);
        chan.set_legacy_single_wake(legacy);
        chan.send_background(noop(), fuse_core::EndFn::once(|_| {}))
            .unwrap();
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let c = chan.clone();
                thread::spawn(move || {
                    c.send_background(noop(), fuse_core::EndFn::once(|_| {}))
                        .unwrap()
                })
            })
            .collect();
        chan.set_max_background(3);
        // No request completes: with the single wake-up one waiter stays
        // parked forever and loom reports the deadlock.
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(chan.stats().background, 3);
    });
}

#[test]
fn admission_raise_wakes_one_per_free_slot() {
    raise_admits_every_waiter(false);
}

#[test]
#[should_panic(expected = "deadlock")]
fn admission_model_catches_the_single_wake_bug() {
    raise_admits_every_waiter(true);
}

/// Completion frees a slot and hands it to the parked waiter, in any
/// interleaving of the completion and the waiter's arrival.
#[test]
fn completion_hands_slot_to_waiter() {
    model(|| {
        let chan = chan(1);
        let dev = chan.device().unwrap();
        chan.send_background(noop(), fuse_core::EndFn::once(|_| {}))
            .unwrap();
        let u = read_unique(&dev);
        let c = chan.clone();
        let waiter = thread::spawn(move || {
            c.send_background(noop(), fuse_core::EndFn::once(|_| {}))
                .unwrap()
        });
        dev.write(&abi::encode::reply(u, 0, &[])).unwrap();
        waiter.join().unwrap();
        assert_eq!(chan.stats().background, 1);
    });
}

/// A reply racing an abort: the request ends exactly once, with the reply
/// or with ENOTCONN, and nothing stays counted as waiting.
#[test]
fn abort_vs_completion_ends_exactly_once() {
    model(|| {
        let chan = chan(4);
        let dev = chan.device().unwrap();
        let ends = Arc::new(AtomicUsize::new(0));
        let e = ends.clone();
        chan.send_background(
            noop(),
            fuse_core::EndFn::once(move |r| {
                assert!(matches!(r, Ok(_) | Err(Errno::ENOTCONN)), "{r:?}");
                e.fetch_add(1, Ordering::SeqCst);
            }),
        )
        .unwrap();
        let u = read_unique(&dev);
        let d = dev.clone();
        let writer = thread::spawn(move || d.write(&abi::encode::reply(u, 0, &[])));
        let c = chan.clone();
        let aborter = thread::spawn(move || c.abort());
        let w = writer.join().unwrap();
        aborter.join().unwrap();
        assert!(matches!(w, Ok(_) | Err(Errno::ENOENT)), "{w:?}");
        assert_eq!(ends.load(Ordering::SeqCst), 1);
        assert_eq!(chan.stats().waiting, 0);
    });
}

/// A signal racing the reply: the requester gets the reply, and no
/// interrupt is left queued once the request has ended.
#[test]
fn interrupt_vs_reply_leaves_no_stale_interrupt() {
    model(|| {
        let chan = chan(4);
        let dev = chan.device().unwrap();
        let call = chan.call(noop());
        let sig = call.signal();
        let requester = thread::spawn(move || call.wait());
        // Wait (in the model) until the request is pending, then read it.
        let u = loop {
            let mut b = vec![0u8; dev.min_read_buffer()];
            match dev.try_read(&mut b) {
                Ok(n) => break InHeader::read_from_prefix(&b[..n]).unwrap().0.unique,
                Err(_) => thread::yield_now(),
            }
        };
        let signaller = thread::spawn(move || sig.interrupt());
        dev.write(&abi::encode::reply(u, 0, &[])).unwrap();
        signaller.join().unwrap();
        assert!(requester.join().unwrap().is_ok());
        assert!(dev.queued_interrupts().is_empty(), "stale interrupt");
    });
}

/// A batch admission racing a completion: the batch takes the slots free
/// at its instant (1 or 2 of 2 at max_background 2 with one in flight)
/// and leaves the rest untouched, and every request it took ends exactly
/// once.
#[test]
fn batch_admission_vs_completion() {
    model(|| {
        let chan = chan(2);
        let dev = chan.device().unwrap();
        chan.send_background(noop(), fuse_core::EndFn::once(|_| {}))
            .unwrap();
        let first = read_unique(&dev);
        let ends = Arc::new(AtomicUsize::new(0));
        let c = chan.clone();
        let e = ends.clone();
        let sender = thread::spawn(move || {
            let mut batch: Vec<(Args, fuse_core::EndFn)> = (0..2)
                .map(|_| {
                    let e = e.clone();
                    let end: fuse_core::EndFn = fuse_core::EndFn::once(move |r| {
                        assert!(r.is_ok(), "{r:?}");
                        e.fetch_add(1, Ordering::SeqCst);
                    });
                    (noop(), end)
                })
                .collect();
            let mut sent = Vec::new();
            let k = c.try_send_background_batch(&mut batch, &mut sent);
            assert_eq!(k + batch.len(), 2);
            assert!(sent.iter().all(Result::is_ok));
            k
        });
        dev.write(&abi::encode::reply(first, 0, &[])).unwrap();
        let k = sender.join().unwrap();
        assert!(k == 1 || k == 2, "{k}");
        assert_eq!(chan.stats().background, k as u32);
        for _ in 0..k {
            let u = read_unique(&dev);
            dev.write(&abi::encode::reply(u, 0, &[])).unwrap();
        }
        assert_eq!(ends.load(Ordering::SeqCst), k);
        assert_eq!(chan.stats().background, 0);
        assert_eq!(chan.stats().waiting, 0);
    });
}

/// A batch send racing an abort: each request of the batch is either
/// sent (then ended exactly once, by the abort) or refused as closed
/// (then its callback never runs), and nothing stays counted.
#[test]
fn batch_send_vs_abort() {
    model(|| {
        let chan = chan(4);
        let ends: Vec<Arc<AtomicUsize>> = (0..2).map(|_| Arc::new(AtomicUsize::new(0))).collect();
        let c = chan.clone();
        let counters = ends.clone();
        let sender = thread::spawn(move || {
            let mut batch: Vec<(Args, fuse_core::EndFn)> = counters
                .iter()
                .map(|n| {
                    let n = n.clone();
                    let end: fuse_core::EndFn = fuse_core::EndFn::once(move |r| {
                        assert_eq!(r.unwrap_err(), Errno::ENOTCONN);
                        n.fetch_add(1, Ordering::SeqCst);
                    });
                    (noop(), end)
                })
                .collect();
            let mut sent = Vec::new();
            assert_eq!(c.try_send_background_batch(&mut batch, &mut sent), 2);
            sent
        });
        let c = chan.clone();
        let aborter = thread::spawn(move || c.abort());
        let sent = sender.join().unwrap();
        aborter.join().unwrap();
        chan.wait_aborted();
        for (r, n) in sent.iter().zip(&ends) {
            let n = n.load(Ordering::SeqCst);
            match r {
                Ok(_) => assert_eq!(n, 1, "a sent request ended {n} times"),
                Err(e) => {
                    assert_eq!(*e, Errno::ENOTCONN);
                    assert_eq!(n, 0, "a refused request's callback ran");
                }
            }
        }
        assert_eq!(chan.stats().waiting, 0);
    });
}

/// A connection whose ring has one queue with one registered entry (so
/// admission is open and requests go over the ring).
fn ring_chan() -> (Chan, RingEnd, EntHandle) {
    let chan = Chan::new(ChanConfig {
        spawn_scanner: false,
        ring_queues: 1,
        ..Default::default()
    });
    chan.set_initialized(Negotiated {
        max_write: 4096,
        flags: init::OVER_IO_URING,
        ring_queues: 1,
        congestion_threshold: 4,
        ..Negotiated::with_max_background(4)
    });
    let end = chan.ring_end(false);
    end.add_queue(&cmd_area(0, 0, 0)).unwrap();
    let h = end
        .register(&cmd_area(0, 0, 0), EntryBufs::with_payload(8192), None)
        .unwrap();
    (chan, end, h)
}

/// A background request counted by `ends`, whose result may be the reply
/// or the abort's.
fn counted(ends: &Arc<AtomicUsize>) -> fuse_core::EndFn {
    let e = ends.clone();
    fuse_core::EndFn::once(move |r| {
        assert!(
            matches!(r, Ok(_) | Err(Errno::ECONNABORTED) | Err(Errno::ENOTCONN)),
            "{r:?}"
        );
        e.fetch_add(1, Ordering::SeqCst);
    })
}

/// Fetches entry `h`'s request (without waiting) and commits an empty
/// reply, as a server does; either step may find the ring torn down.
fn serve_once(end: &RingEnd, h: EntHandle, block: bool) {
    if let Ok(Some(mut f)) = end.fetch(h, block) {
        f.set_reply(0, 0);
        let area = f.commit_cmd();
        // Refused once the abort took the entry: dropping the Fetched the
        // error hands back gives its buffers back.
        let _ = end.commit(&area, f, None);
    }
}

/// The ring's fetch and commit racing an abort: the request ends exactly
/// once (with the reply or the abort's error), nothing stays counted as
/// waiting, and every entry and buffer is where its state says.
#[test]
fn ring_fetch_commit_vs_abort() {
    model(|| {
        let (chan, end, h) = ring_chan();
        let ends = Arc::new(AtomicUsize::new(0));
        chan.send_background(noop(), counted(&ends)).unwrap();
        let e = end.clone();
        let server = thread::spawn(move || serve_once(&e, h, false));
        let c = chan.clone();
        let aborter = thread::spawn(move || c.abort());
        server.join().unwrap();
        aborter.join().unwrap();
        chan.wait_aborted();
        assert_eq!(ends.load(Ordering::SeqCst), 1);
        assert_eq!(chan.stats().waiting, 0);
        end.check_invariants().unwrap();
    });
}

/// A server blocked in fetch while the request arrives and the connection
/// aborts: the fetch returns (with the request, or ENOTCONN), and the
/// request ends exactly once.
#[test]
fn ring_blocking_fetch_vs_send_and_abort() {
    model(|| {
        let (chan, end, h) = ring_chan();
        let ends = Arc::new(AtomicUsize::new(0));
        let e = end.clone();
        let server = thread::spawn(move || serve_once(&e, h, true));
        let c = chan.clone();
        let n = ends.clone();
        let sender = thread::spawn(move || {
            // Refused (and its callback dropped) once the abort got there
            // first.
            if c.send_background(noop(), counted(&n)).is_err() {
                n.fetch_add(1, Ordering::SeqCst);
            }
        });
        chan.abort();
        sender.join().unwrap();
        server.join().unwrap();
        chan.wait_aborted();
        assert_eq!(ends.load(Ordering::SeqCst), 1);
        assert_eq!(chan.stats().waiting, 0);
        end.check_invariants().unwrap();
    });
}

/// An INIT reply without limits of its own keeps those in force: a
/// `set_max_background` racing it is never lost, whichever goes first.
#[test]
fn init_keeping_limits_vs_set_max_background() {
    model(|| {
        let chan = Chan::new(ChanConfig {
            spawn_scanner: false,
            max_background: 12,
            ..Default::default()
        });
        let c = chan.clone();
        let t = thread::spawn(move || c.set_max_background(5));
        let out = abi::InitOut {
            major: abi::KERNEL_VERSION,
            minor: abi::KERNEL_MINOR_VERSION,
            max_write: 4096,
            ..Default::default()
        };
        let neg = chan.process_init_reply(&out).unwrap();
        t.join().unwrap();
        // Before INIT it was kept; after, it changed what INIT left.
        assert!(matches!(neg.max_background, 5 | 12), "{neg:?}");
        assert_eq!(chan.stats().max_background, 5);
    });
}
