//! The engine stays sound at its edges: the ring gate when
//! queues register early, a panicking reply copy, an end callback that
//! re-enters abort, a server asking for an absurd max_write.

mod common;
use common::*;
use fuse_core::abi::{init, InitOut};
use fuse_core::{Chan, ChanConfig, Errno};
use std::sync::mpsc;

fn ring_init() -> InitOut {
    InitOut {
        major: 7,
        minor: 45,
        flags: init::INIT_EXT as u32,
        flags2: (init::OVER_IO_URING >> 32) as u32,
        ..Default::default()
    }
}

/// Queues registering while INIT is being processed are never lost: the
/// gate opens once every queue has an entry, whatever the interleaving.
#[test]
fn ring_registration_racing_init_is_not_lost() {
    use fuse_core::dev_uring::{cmd_area, EntryBufs};
    for _ in 0..50 {
        let chan = Chan::new(ChanConfig {
            spawn_scanner: false,
            ring_queues: 2,
            ..Default::default()
        });
        let registrars: Vec<_> = (0..2u16)
            .map(|q| {
                let end = chan.ring_end(false);
                std::thread::spawn(move || loop {
                    match end.register(&cmd_area(q, 0, 0), EntryBufs::with_payload(8192), None) {
                        Ok(h) => return (end, h),
                        Err(Errno::EAGAIN) => std::thread::yield_now(),
                        Err(e) => panic!("{e}"),
                    }
                })
            })
            .collect();
        chan.process_init_reply(&ring_init()).unwrap();
        let ends: Vec<_> = registrars.into_iter().map(|t| t.join().unwrap()).collect();
        let c = chan.clone();
        let t = std::thread::spawn(move || c.send(noop(1)));
        let (end, h) = &ends[0];
        let mut f = end.fetch(*h, true).unwrap().unwrap();
        f.set_reply(0, 0);
        let area = f.commit_cmd();
        end.commit(&area, f, None).unwrap();
        assert!(t.join().unwrap().is_ok());
        assert_eq!(chan.stats().parked, 0);
    }
}

#[test]
fn panicking_reply_copy_ends_the_request_with_eio() {
    let (chan, dev) = chan(12);
    let c = chan.clone();
    let t = std::thread::spawn(move || c.send(noop(1).out(8, false)));
    let (h, _) = read(&dev);
    let d = dev.clone();
    let r =
        std::thread::spawn(move || d.write_with(h.unique, 0, 8, |_| panic!("server bug"))).join();
    assert!(r.is_err(), "the server's panic propagates to the server");
    assert_eq!(t.join().unwrap(), Err(Errno::EIO));
    assert!(chan.is_connected());
    chan.abort();
    chan.wait_aborted();
}

#[test]
fn end_callback_that_aborts_does_not_deadlock() {
    let (chan, _dev) = chan(12);
    let (tx, rx) = mpsc::channel();
    let c = chan.clone();
    chan.send_background(
        noop(1),
        fuse_core::EndFn::once(move |r| {
            c.abort();
            drop(c);
            tx.send(r).unwrap();
        }),
    )
    .unwrap();
    chan.abort();
    assert_eq!(rx.recv().unwrap(), Err(Errno::ENOTCONN));
    chan.wait_aborted();
}

#[test]
fn absurd_max_write_is_clamped() {
    let chan = Chan::new(ChanConfig {
        spawn_scanner: false,
        ..Default::default()
    });
    let out = InitOut {
        major: 7,
        minor: 45,
        max_write: u32::MAX,
        ..Default::default()
    };
    let neg = chan.process_init_reply(&out).unwrap();
    assert_eq!(neg.max_write, 1 << 20);
    let dev = chan.device().unwrap();
    assert!(dev.min_read_buffer() <= (1 << 20) + 80);
}

#[test]
fn fields_newer_than_the_servers_minor_are_ignored() {
    let cfg = ChanConfig {
        spawn_scanner: false,
        max_background: 12,
        congestion_threshold: 9,
        init_flags: init::ASYNC_READ | init::POSIX_LOCKS,
        ..Default::default()
    };
    // Minor 12: no background limits yet (whatever those bytes hold).
    let chan = Chan::new(cfg.clone());
    let out = InitOut {
        major: 7,
        minor: 12,
        flags: init::ASYNC_READ as u32,
        max_background: 1,
        congestion_threshold: 1,
        max_write: 65536,
        ..Default::default()
    };
    let neg = chan.process_init_reply(&out).unwrap();
    assert_eq!((neg.max_background, neg.congestion_threshold), (12, 9));
    let s = chan.stats();
    assert_eq!((s.max_background, s.congestion_threshold), (12, 9));
    assert_eq!(neg.flags, init::ASYNC_READ);
    assert_eq!(neg.max_write, 65536);
    // From 13 on they count.
    let chan = Chan::new(cfg.clone());
    let neg = chan
        .process_init_reply(&InitOut { minor: 13, ..out })
        .unwrap();
    assert_eq!((neg.max_background, neg.congestion_threshold), (1, 1));
    // Minor 5: no flags; minor 4: no max_write either (the kernel's 4096).
    let chan = Chan::new(cfg.clone());
    let neg = chan
        .process_init_reply(&InitOut { minor: 5, ..out })
        .unwrap();
    assert_eq!((neg.flags, neg.max_write), (0, 65536));
    let chan = Chan::new(cfg);
    let neg = chan
        .process_init_reply(&InitOut { minor: 4, ..out })
        .unwrap();
    assert_eq!((neg.flags, neg.max_write), (0, 4096));
}

/// An INIT reply processed after the connection was aborted (the abort
/// raced the reply) is refused and sets up nothing: nothing negotiated,
/// no ring entry can register, requests still end with ENOTCONN.
#[test]
fn init_after_abort_opens_nothing() {
    use fuse_core::dev_uring::{cmd_area, EntryBufs};
    let chan = Chan::new(ChanConfig {
        spawn_scanner: false,
        ring_queues: 1,
        ..Default::default()
    });
    chan.abort();
    let r = chan.process_init_reply(&ring_init());
    assert_eq!(r.err(), Some(Errno::ENOTCONN));
    assert_eq!(chan.negotiated(), None);
    // The limits and the gate as the abort left them (wide open), not
    // put back by the INIT.
    let s = chan.stats();
    assert_eq!(s.max_background, u32::MAX);
    assert!(s.ready);
    let end = chan.ring_end(false);
    let reg = end.register(&cmd_area(0, 0, 0), EntryBufs::with_payload(8192), None);
    assert!(reg.is_err(), "an entry registered on an aborted connection");
    assert_eq!(chan.send(noop(1)).err(), Some(Errno::ENOTCONN));
    chan.wait_aborted();
}
