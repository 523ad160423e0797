//! Abort, request timeouts, and the device's handling of malformed
//! replies. The letter in the test names is the scenario (the others: (a),
//! (b) and (e) in `admission.rs`, (c) and (d) in `signals.rs`):
//! - (f) a server that stops answering is aborted within the request
//!   timeout plus one scan period; one that keeps answering never is.

mod common;
use common::*;
use fuse_core::abi::{self, init, InitOut, Opcode};
use fuse_core::{Args, Chan, ChanConfig, Clock, Errno, ManualClock};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

#[test]
fn abort_ends_everything_and_releases_waiters() {
    let (chan, dev) = chan(2);
    // Two background requests in flight (one read by the server), one
    // parked waiter, one synchronous request pending.
    let (tx, rx) = mpsc::channel();
    for i in 0..2 {
        let tx = tx.clone();
        chan.send_background(
            noop(i),
            fuse_core::EndFn::once(move |r| tx.send(r).unwrap()),
        )
        .unwrap();
    }
    read(&dev);
    let c = chan.clone();
    let parked =
        std::thread::spawn(move || c.send_background(noop(5), fuse_core::EndFn::once(|_| {})));
    until("parked", || chan.stats().parked == 1);
    let c = chan.clone();
    let sync = std::thread::spawn(move || c.send(noop(6)));
    until("pending", || chan.stats().pending == 2);

    // A second concurrent abort returns only once the first has finished.
    let c1 = chan.clone();
    let c2 = chan.clone();
    let a1 = std::thread::spawn(move || c1.abort());
    let a2 = std::thread::spawn(move || {
        c2.abort();
        c2.stats()
    });
    a1.join().unwrap();
    let seen_by_second = a2.join().unwrap();
    assert_eq!((seen_by_second.pending, seen_by_second.processing), (0, 0));
    assert_eq!(seen_by_second.aborts, 1);

    assert_eq!(rx.recv().unwrap(), Err(Errno::ENOTCONN));
    assert_eq!(rx.recv().unwrap(), Err(Errno::ENOTCONN));
    assert_eq!(parked.join().unwrap(), Err(Errno::ENOTCONN));
    assert_eq!(sync.join().unwrap(), Err(Errno::ENOTCONN));
    // Later sends fail at once; the device reports the abort.
    assert_eq!(chan.send(noop(7)), Err(Errno::ENOTCONN));
    assert_eq!(
        chan.send_background(noop(8), fuse_core::EndFn::once(|_| {})),
        Err(Errno::ENOTCONN)
    );
    let mut b = buf(&dev);
    assert_eq!(dev.read(&mut b), Err(Errno::ENODEV));
    chan.wait_aborted();
    assert_eq!(chan.stats().waiting, 0);
}

#[test]
fn abort_error_flag_reports_econnaborted_to_readers() {
    let chan = Chan::new(ChanConfig {
        spawn_scanner: false,
        ..Default::default()
    });
    let mut n = negotiated(12);
    n.flags = init::ABORT_ERROR;
    chan.set_initialized(n);
    let dev = chan.device().unwrap();
    let d = dev.clone();
    let reader = std::thread::spawn(move || {
        let mut b = buf(&d);
        d.read(&mut b)
    });
    std::thread::sleep(Duration::from_millis(20));
    chan.abort();
    assert_eq!(reader.join().unwrap(), Err(Errno::ECONNABORTED));
}

#[test]
fn dropping_the_last_chan_handle_aborts() {
    let (chan, dev) = chan(12);
    drop(chan);
    let mut b = buf(&dev);
    assert_eq!(dev.try_read(&mut b), Err(Errno::ENODEV));
}

fn timeout_chan(clock: Arc<ManualClock>, default: u64, max: u64) -> Chan {
    let cfg = ChanConfig {
        spawn_scanner: false,
        default_request_timeout: Duration::from_secs(default),
        max_request_timeout: Duration::from_secs(max),
        scan_period: Duration::from_secs(5),
        ..Default::default()
    };
    Chan::with_clock(cfg, clock)
}

fn init_reply(timeout: u16) -> InitOut {
    InitOut {
        major: 7,
        minor: 45,
        flags: init::INIT_EXT as u32,
        flags2: (init::REQUEST_TIMEOUT >> 32) as u32,
        request_timeout: timeout,
        ..Default::default()
    }
}

#[test]
fn effective_timeout_rules() {
    let t = |default, max, server| {
        let chan = timeout_chan(Arc::new(ManualClock::new()), default, max);
        chan.process_init_reply(&init_reply(server))
            .unwrap()
            .request_timeout
            .as_secs()
    };
    assert_eq!(t(0, 0, 0), 0, "0 means off");
    assert_eq!(t(30, 0, 0), 30, "default when the server asks for none");
    assert_eq!(t(30, 0, 7), 7, "the server's value wins");
    assert_eq!(t(30, 20, 60), 20, "capped by the maximum");
    assert_eq!(
        t(0, 20, 0),
        20,
        "the maximum applies even when nothing was asked"
    );
    // Without the INIT flag the server's field is ignored.
    let chan = timeout_chan(Arc::new(ManualClock::new()), 9, 0);
    let mut out = init_reply(3);
    out.flags2 = 0;
    assert_eq!(
        chan.process_init_reply(&out)
            .unwrap()
            .request_timeout
            .as_secs(),
        9
    );
}

/// (f) A server that never answers: the connection is aborted by the
/// first scan after the timeout, i.e. within timeout + one scan period.
#[test]
fn f_hung_server_is_aborted_within_timeout_plus_one_period() {
    for list in ["pending", "processing", "background-queue"] {
        let clock = Arc::new(ManualClock::new());
        let chan = timeout_chan(clock.clone(), 10, 0);
        let mut out = init_reply(0);
        out.max_background = 1;
        chan.process_init_reply(&out).unwrap();
        let dev = chan.device().unwrap();
        chan.send_background(noop(1), fuse_core::EndFn::once(|_| {}))
            .unwrap();
        match list {
            "processing" => {
                read(&dev);
            }
            "background-queue" => {
                // FORCE bypasses admission, so this one waits on the queue.
                chan.send_background(noop(2).force(), fuse_core::EndFn::once(|_| {}))
                    .unwrap();
                assert_eq!(chan.stats().bg_queued, 1);
                read(&dev);
            }
            _ => {}
        }
        let mut aborted_at = None;
        for _ in 0..10 {
            clock.advance(Duration::from_secs(5));
            if chan.scan_timeouts() {
                aborted_at = Some(clock.now());
                break;
            }
        }
        let at = aborted_at.unwrap_or_else(|| panic!("{list}: never aborted"));
        assert!(
            at > Duration::from_secs(10) && at <= Duration::from_secs(15),
            "{list}: {at:?}"
        );
        assert!(!chan.is_connected());
        assert_eq!(chan.stats().timeouts_fired, 1);
    }
}

/// (f) A server that keeps answering (each request within 3 s of a 10 s
/// timeout) is never aborted, however long it runs.
#[test]
fn f_answering_server_is_never_aborted() {
    let clock = Arc::new(ManualClock::new());
    let chan = timeout_chan(clock.clone(), 10, 0);
    chan.process_init_reply(&init_reply(0)).unwrap();
    let dev = chan.device().unwrap();
    let (tx, rx) = mpsc::channel();
    for step in 0..200 {
        let tx = tx.clone();
        chan.send_background(
            noop(step),
            fuse_core::EndFn::once(move |r| tx.send(r).unwrap()),
        )
        .unwrap();
        clock.advance(Duration::from_secs(1));
        assert!(!chan.scan_timeouts());
        let (h, _) = read(&dev);
        clock.advance(Duration::from_secs(2));
        assert!(!chan.scan_timeouts());
        reply(&dev, h.unique, 0, &[]).unwrap();
        rx.recv().unwrap().unwrap();
        clock.advance(Duration::from_secs(5));
        assert!(!chan.scan_timeouts());
    }
    assert!(chan.is_connected());
    assert_eq!(chan.stats().timeouts_fired, 0);
}

/// The real scanner thread, on the real clock: a hung server is aborted.
#[test]
fn f_scanner_thread_aborts_a_hung_server() {
    let cfg = ChanConfig {
        scan_period: Duration::from_millis(100),
        ..Default::default()
    };
    let chan = Chan::new(cfg);
    chan.process_init_reply(&init_reply(1)).unwrap();
    let start = Instant::now();
    let r = chan.send(noop(1));
    let took = start.elapsed();
    assert_eq!(r, Err(Errno::ENOTCONN));
    assert!(took >= Duration::from_secs(1), "aborted early: {took:?}");
    assert_eq!(chan.stats().timeouts_fired, 1);
}

#[test]
fn malformed_replies_get_kernel_errors() {
    let (chan, dev) = chan(12);
    let c = chan.clone();
    let t = std::thread::spawn(move || c.send(Args::new(Opcode::Getattr, 1).out(104, false)));
    let (h, _) = read(&dev);
    // Shorter than a header.
    assert_eq!(dev.write(&[0u8; 8]), Err(Errno::EINVAL));
    // len disagrees with the message.
    let mut m = abi::encode::reply(h.unique, 0, &[0u8; 104]);
    m[0] = 17;
    assert_eq!(dev.write(&m), Err(Errno::EINVAL));
    // Positive error, or one out of range.
    assert_eq!(reply(&dev, h.unique, 5, &[]), Err(Errno::EINVAL));
    assert_eq!(reply(&dev, h.unique, -600, &[]), Err(Errno::EINVAL));
    // Unknown unique.
    assert_eq!(reply(&dev, h.unique + 1000, 0, &[]), Err(Errno::ENOENT));
    // Unknown notification code.
    assert_eq!(reply(&dev, 0, 99, &[]), Err(Errno::EINVAL));
    // Wrong payload size: the writer gets EINVAL, the requester EIO.
    assert_eq!(reply(&dev, h.unique, 0, &[0u8; 50]), Err(Errno::EINVAL));
    assert_eq!(t.join().unwrap(), Err(Errno::EIO));
    // The connection keeps serving.
    let c = chan.clone();
    let t = std::thread::spawn(move || c.send(Args::new(Opcode::Read, 1).out(10, true)));
    let (h, _) = read(&dev);
    // An error reply must not carry a payload.
    assert_eq!(reply(&dev, h.unique, -2, &[1]), Err(Errno::EINVAL));
    assert_eq!(t.join().unwrap(), Err(Errno::EIO));
    let c = chan.clone();
    let t = std::thread::spawn(move || c.send(Args::new(Opcode::Read, 1).out(10, true)));
    let (h, _) = read(&dev);
    reply(&dev, h.unique, 0, b"abc").unwrap();
    assert_eq!(t.join().unwrap().unwrap().data, b"abc");
}

#[test]
fn small_read_buffer_and_oversized_requests() {
    let (chan, dev) = chan(12);
    let mut small = vec![0u8; 100];
    assert_eq!(dev.try_read(&mut small), Err(Errno::EINVAL));
    // A request larger than the reader's buffer fails with EIO (E2BIG for
    // SETXATTR) and the read moves on.
    let min = dev.min_read_buffer();
    let c = chan.clone();
    let big =
        std::thread::spawn(move || c.send(Args::new(Opcode::Setxattr, 1).body(vec![0u8; min + 1])));
    until("pending", || chan.stats().pending == 1);
    let mut b = vec![0u8; min];
    assert_eq!(dev.try_read(&mut b), Err(Errno::EAGAIN));
    assert_eq!(big.join().unwrap(), Err(Errno::E2BIG));
}

#[test]
fn forgets_are_batched_and_fair() {
    let (chan, dev) = chan(12);
    for i in 0..40 {
        chan.send_forget(100 + i, 1);
    }
    let (h, body) = read(&dev);
    assert_eq!(h.opcode, Opcode::BatchForget as u32);
    let msg = abi::encode::request(h, &body);
    let req = abi::decode_request(&msg, abi::DecodeOptions::default()).unwrap();
    match req.op {
        abi::Operation::BatchForget { nodes, .. } => {
            assert_eq!(nodes.len(), 40);
            assert_eq!(nodes[0].nodeid, 100);
        }
        other => panic!("{other:?}"),
    }
    // Old protocol: one FORGET per read.
    let chan2 = Chan::new(ChanConfig {
        spawn_scanner: false,
        ..Default::default()
    });
    let mut n = negotiated(12);
    n.minor = 15;
    chan2.set_initialized(n);
    let dev2 = chan2.device().unwrap();
    chan2.send_forget(5, 2);
    chan2.send_forget(6, 2);
    let (h, _) = read(&dev2);
    assert_eq!((h.opcode, h.nodeid), (Opcode::Forget as u32, 5));
    // Requests are not starved by a stream of forgets.
    let c = chan.clone();
    let t = std::thread::spawn(move || c.send(noop(1)));
    until("pending", || chan.stats().pending == 1);
    for i in 0..100 {
        chan.send_forget(i + 1, 1);
    }
    let mut saw_request = false;
    for _ in 0..20 {
        let (h, _) = read(&dev);
        if h.opcode == Opcode::Getattr as u32 {
            reply(&dev, h.unique, 0, &[]).unwrap();
            saw_request = true;
            break;
        }
    }
    assert!(saw_request);
    t.join().unwrap().unwrap();
}
