//! The emulated FUSE-over-io_uring ring: commands and their errors, the
//! entry state machine, the buffer pool, zero-copy, per-queue background,
//! teardown, and round trips through the ring worker.

mod common;
use common::until;
use fuse_core::abi::{self, encode::Body, fopen, init, uring, *};
use fuse_core::dev_uring::{bufpool_area, cmd_area, EntState, EntryBufs, Fetched, RingEnd};
use fuse_core::server::{run_ring_worker, Dispatcher, ServerConfig};
use fuse_core::testing::memfs::MemFs;
use fuse_core::{Args, Chan, ChanConfig, Errno, Negotiated};
use std::sync::{mpsc, Arc};
use std::time::Duration;

const MAX_WRITE: u32 = 64 * 1024;

fn ring_chan(queues: u16, max_background: u32) -> (Chan, RingEnd) {
    let chan = Chan::new(ChanConfig {
        spawn_scanner: false,
        ring_queues: queues,
        ..Default::default()
    });
    chan.set_initialized(Negotiated {
        max_write: MAX_WRITE,
        flags: init::OVER_IO_URING,
        ring_queues: queues,
        ..Negotiated::with_max_background(max_background)
    });
    let end = chan.ring_end(true);
    (chan, end)
}

fn getattr(qid: u16) -> Args {
    Args::new(Opcode::Getattr, 1)
        .body(Body::new().push(&GetattrIn::default()).into_vec())
        .out(104, false)
        .qid(qid)
}

fn release(qid: u16) -> Args {
    Args::new(Opcode::Release, 1)
        .body(Body::new().push(&ReleaseIn::default()).into_vec())
        .qid(qid)
}

fn reply_empty(end: &RingEnd, mut f: Fetched) -> fuse_core::dev_uring::EntHandle {
    f.set_reply(0, 0);
    let area = f.commit_cmd();
    end.commit(&area, f, None).unwrap()
}

fn reply_attr(end: &RingEnd, mut f: Fetched) -> fuse_core::dev_uring::EntHandle {
    let out = AttrOut {
        attr: Attr {
            ino: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    f.payload_mut()[..104].copy_from_slice(zerocopy::IntoBytes::as_bytes(&out));
    f.set_reply(0, 104);
    let area = f.commit_cmd();
    end.commit(&area, f, None).unwrap()
}

#[test]
fn commands_fail_before_init_and_after_abort() {
    let chan = Chan::new(ChanConfig {
        spawn_scanner: false,
        ring_queues: 1,
        ..Default::default()
    });
    let end = chan.ring_end(true);
    assert_eq!(end.add_queue(&cmd_area(0, 0, 0)), Err(Errno::EAGAIN));
    assert_eq!(
        end.register(&cmd_area(0, 0, 0), EntryBufs::with_payload(1 << 20), None)
            .unwrap_err(),
        Errno::EAGAIN
    );
    chan.set_initialized(Negotiated {
        ring_queues: 1,
        ..Negotiated::with_max_background(12)
    });
    end.add_queue(&cmd_area(0, 0, 0)).unwrap();
    chan.abort();
    assert_eq!(end.add_queue(&cmd_area(0, 0, 0)), Err(Errno::ENOTCONN));
    assert_eq!(
        end.register(&cmd_area(0, 0, 0), EntryBufs::with_payload(1 << 20), None)
            .unwrap_err(),
        Errno::ENOTCONN
    );
}

#[test]
fn add_queue_and_add_bufpool_errors() {
    let (_chan, end) = ring_chan(2, 12);
    let unpriv = _chan.ring_end(false);
    assert_eq!(
        unpriv.add_queue(&cmd_area(0, uring::QUEUE_ZERO_COPY, 0)),
        Err(Errno::EPERM)
    );
    assert_eq!(
        end.add_queue(&cmd_area(0, 1 << 5, 0)),
        Err(Errno::EINVAL),
        "unknown flag"
    );
    assert_eq!(
        end.add_queue(&cmd_area(7, 0, 0)),
        Err(Errno::EINVAL),
        "no such queue"
    );
    assert_eq!(
        end.add_queue(&[0u8; 10]),
        Err(Errno::EINVAL),
        "short command area"
    );
    end.add_queue(&cmd_area(0, 0, 0)).unwrap();
    assert_eq!(end.add_queue(&cmd_area(0, 0, 0)), Err(Errno::EEXIST));
    let pool = 4 * MAX_WRITE;
    assert_eq!(
        end.add_bufpool(&bufpool_area(1, pool), vec![0; pool as usize], None),
        Err(Errno::EINVAL),
        "queue must exist"
    );
    assert_eq!(
        end.add_bufpool(&bufpool_area(0, pool), vec![0; 100], None),
        Err(Errno::EINVAL),
        "len must match"
    );
    assert_eq!(
        end.add_bufpool(&bufpool_area(0, 100), vec![0; 100], None),
        Err(Errno::EINVAL),
        "smaller than one buffer"
    );
    let mut bad = bufpool_area(0, pool);
    bad[36] = 1; // bufpool.reserved
    assert_eq!(
        end.add_bufpool(&bad, vec![0; pool as usize], None),
        Err(Errno::EINVAL)
    );
    let mut flagged = bufpool_area(0, pool);
    flagged[0] = 1;
    assert_eq!(
        end.add_bufpool(&flagged, vec![0; pool as usize], None),
        Err(Errno::EINVAL)
    );
    end.add_bufpool(&bufpool_area(0, pool), vec![0; pool as usize], Some(3))
        .unwrap();
    assert_eq!(end.pool_free(0), Some((4, 4)));
    assert_eq!(
        end.add_bufpool(&bufpool_area(0, pool), vec![0; pool as usize], Some(3)),
        Err(Errno::EINVAL),
        "mode already chosen"
    );
    // Pool mode: a payload-carrying REGISTER is refused; the registered
    // pool's index must be on every command.
    assert_eq!(
        end.register(
            &cmd_area(0, 0, 0),
            EntryBufs::with_payload(MAX_WRITE as usize),
            Some(3)
        )
        .unwrap_err(),
        Errno::EINVAL
    );
    assert_eq!(
        end.register(&cmd_area(0, 0, 0), EntryBufs::pooled(), None)
            .unwrap_err(),
        Errno::EINVAL
    );
    assert_eq!(
        end.register(&cmd_area(0, 0, 0), EntryBufs::pooled(), Some(4))
            .unwrap_err(),
        Errno::EINVAL
    );
    end.register(&cmd_area(0, 0, 0), EntryBufs::pooled(), Some(3))
        .unwrap();
    // Per-entry mode: the payload buffer must hold max_payload; a pool
    // cannot be added afterwards.
    assert_eq!(
        end.register(&cmd_area(1, 0, 0), EntryBufs::with_payload(100), None)
            .unwrap_err(),
        Errno::EINVAL
    );
    assert_eq!(
        end.register(&cmd_area(1, 0, 0), EntryBufs::pooled(), None)
            .unwrap_err(),
        Errno::EINVAL,
        "no payload at all"
    );
    end.register(
        &cmd_area(1, 0, 0),
        EntryBufs::with_payload(MAX_WRITE as usize),
        None,
    )
    .unwrap();
    assert_eq!(
        end.add_bufpool(&bufpool_area(1, pool), vec![0; pool as usize], None),
        Err(Errno::EINVAL)
    );
    end.check_invariants().unwrap();
}

#[test]
fn ring_gate_and_entry_lifecycle() {
    let (chan, end) = ring_chan(2, 12);
    let c = chan.clone();
    let t = std::thread::spawn(move || c.send(getattr(1)));
    until("parked until the ring is ready", || {
        chan.stats().parked == 1
    });
    let h0 = end
        .register(
            &cmd_area(0, 0, 0),
            EntryBufs::with_payload(MAX_WRITE as usize),
            None,
        )
        .unwrap();
    assert_eq!(chan.stats().parked, 1, "one queue of two is not enough");
    assert_eq!(end.entry_state(h0), Some(EntState::Available));
    let h1 = end
        .register(
            &cmd_area(1, 0, 0),
            EntryBufs::with_payload(MAX_WRITE as usize),
            None,
        )
        .unwrap();
    // The request names queue 1: it is assigned to h1.
    until("assigned", || {
        end.entry_state(h1) == Some(EntState::FuseReq)
    });
    assert_eq!(end.entry_state(h0), Some(EntState::Available));
    let f = end.fetch(h1, false).unwrap().unwrap();
    assert_eq!(end.entry_state(h1), Some(EntState::Userspace));
    assert_eq!(f.in_header().opcode, Opcode::Getattr as u32);
    assert_eq!(f.commit_id(), f.in_header().unique);
    assert_eq!(
        f.request_payload().len(),
        0,
        "GETATTR's argument travels in op_in"
    );
    // A wrong commit id is refused and the entry handed back unchanged.
    let mut bad = f.commit_cmd();
    bad[8] ^= 2;
    let (e, f) = end.commit(&bad, f, None).unwrap_err();
    assert_eq!(e, Errno::EINVAL);
    let f = f.unwrap();
    assert_eq!(end.entry_state(h1), Some(EntState::Userspace));
    // Commit while another request waits: fetched in the same call.
    let c = chan.clone();
    let t2 = std::thread::spawn(move || c.send(getattr(1)));
    until("queued", || end.stats().unwrap().queued == 1);
    let h = reply_attr(&end, f);
    assert_eq!(end.entry_state(h), Some(EntState::FuseReq));
    assert_eq!(t.join().unwrap().unwrap().data.len(), 104);
    let f = end.fetch(h, true).unwrap().unwrap();
    let h = reply_attr(&end, f);
    assert_eq!(end.entry_state(h), Some(EntState::Available));
    assert!(t2.join().unwrap().is_ok());
    // Fetching an available entry without blocking finds nothing.
    assert!(end.fetch(h, false).unwrap().is_none());
    end.check_invariants().unwrap();
}

fn pool_ring(
    buffers: u32,
    entries: usize,
) -> (Chan, RingEnd, Vec<fuse_core::dev_uring::EntHandle>) {
    let (chan, end) = ring_chan(1, 64);
    end.add_queue(&cmd_area(0, 0, 0)).unwrap();
    let len = buffers * MAX_WRITE;
    end.add_bufpool(&bufpool_area(0, len), vec![0; len as usize], None)
        .unwrap();
    let hs = (0..entries)
        .map(|_| {
            end.register(&cmd_area(0, 0, 0), EntryBufs::pooled(), None)
                .unwrap()
        })
        .collect();
    (chan, end, hs)
}

#[test]
fn pool_exhaustion_and_recovery() {
    let (chan, end, hs) = pool_ring(2, 3);
    let mut ts = Vec::new();
    for _ in 0..3 {
        let c = chan.clone();
        ts.push(std::thread::spawn(move || c.send(getattr(0))));
    }
    until("two assigned", || {
        hs.iter()
            .filter(|h| end.entry_state(**h) == Some(EntState::FuseReq))
            .count()
            == 2
    });
    let f0 = end.fetch(hs[0], false).unwrap().unwrap();
    let f1 = end.fetch(hs[1], false).unwrap().unwrap();
    let offs = [
        f0.header.ring_ent_in_out.offset,
        f1.header.ring_ent_in_out.offset,
    ];
    assert_eq!(offs, [0, MAX_WRITE], "first free buffer, offset reported");
    assert_eq!(end.pool_free(0), Some((0, 2)));
    // The third request waits for a buffer although an entry is free.
    assert_eq!(end.entry_state(hs[2]), Some(EntState::Available));
    until("third request queued", || end.stats().unwrap().queued == 1);
    assert_eq!(end.entry_state(hs[2]), Some(EntState::Available));
    assert!(end.stats().unwrap().enobufs >= 1);
    end.check_invariants().unwrap();
    // A commit returns a buffer; the waiting request takes it.
    let h = reply_attr(&end, f0);
    assert_eq!(
        end.entry_state(h),
        Some(EntState::FuseReq),
        "the committing entry takes the next request"
    );
    let f2 = end.fetch(h, false).unwrap().unwrap();
    assert_eq!(
        f2.header.ring_ent_in_out.offset, 0,
        "its buffer was reused directly"
    );
    reply_attr(&end, f1);
    reply_attr(&end, f2);
    for t in ts {
        assert!(t.join().unwrap().is_ok());
    }
    assert_eq!(end.pool_free(0), Some((2, 2)));
    // Requests without payload claim nothing.
    let c = chan.clone();
    let t = std::thread::spawn(move || c.send(release(0)));
    until("assigned", || {
        hs.iter()
            .any(|h| end.entry_state(*h) == Some(EntState::FuseReq))
    });
    let h = *hs
        .iter()
        .find(|h| end.entry_state(**h) == Some(EntState::FuseReq))
        .unwrap();
    let f = end.fetch(h, false).unwrap().unwrap();
    assert_eq!(end.pool_free(0), Some((2, 2)));
    reply_empty(&end, f);
    assert!(t.join().unwrap().is_ok());
    end.check_invariants().unwrap();
}

fn open_zc(chan: &Chan, end: &RingEnd, h: fuse_core::dev_uring::EntHandle) -> u64 {
    let c = chan.clone();
    let t = std::thread::spawn(move || {
        c.send(
            Args::new(Opcode::Open, 5)
                .body(Body::new().push(&OpenIn::default()).into_vec())
                .out(16, false),
        )
    });
    let mut f = end.fetch(h, true).unwrap().unwrap();
    let o = OpenOut {
        fh: 77,
        open_flags: fopen::IO_URING_ZERO_COPY,
        backing_id: 0,
    };
    f.payload_mut()[..16].copy_from_slice(zerocopy::IntoBytes::as_bytes(&o));
    f.set_reply(0, 16);
    let area = f.commit_cmd();
    end.commit(&area, f, None).unwrap();
    t.join().unwrap().unwrap();
    77
}

#[test]
fn zero_copy_read_and_write_hand_over_client_pages() {
    let (chan, end) = ring_chan(1, 12);
    end.add_queue(&cmd_area(0, uring::QUEUE_ZERO_COPY, 0))
        .unwrap();
    let h = end
        .register(
            &cmd_area(0, 0, 0),
            EntryBufs::with_payload(MAX_WRITE as usize),
            None,
        )
        .unwrap();
    let fh = open_zc(&chan, &end, h);

    // WRITE: the payload *is* the client's data; no copy into the entry.
    let c = chan.clone();
    let data: Vec<u8> = (0..MAX_WRITE).map(|i| i as u8).collect();
    let d2 = data.clone();
    let t = std::thread::spawn(move || {
        let arg = WriteIn {
            fh,
            size: d2.len() as u32,
            ..Default::default()
        };
        c.send(
            Args::new(Opcode::Write, 5)
                .body(Body::new().push(&arg).into_vec())
                .data(d2)
                .out(8, false),
        )
    });
    let mut f = end.fetch(h, true).unwrap().unwrap();
    assert!(f.is_zero_copy());
    assert_eq!(f.request_payload(), &data[..]);
    // The reply of a zero-copy WRITE travels in op_in.
    f.header.op_in[..8].copy_from_slice(zerocopy::IntoBytes::as_bytes(&WriteOut {
        size: MAX_WRITE,
        padding: 0,
    }));
    f.set_reply(0, 0);
    let area = f.commit_cmd();
    end.commit(&area, f, None).unwrap();
    let r = t.join().unwrap().unwrap();
    assert_eq!(r.read::<WriteOut>().unwrap().size, MAX_WRITE);

    // READ: the server writes straight into the client's buffer.
    let c = chan.clone();
    let t = std::thread::spawn(move || {
        let arg = ReadIn {
            fh,
            size: 4096,
            ..Default::default()
        };
        c.send(
            Args::new(Opcode::Read, 5)
                .body(Body::new().push(&arg).into_vec())
                .out(4096, true),
        )
    });
    let mut f = end.fetch(h, true).unwrap().unwrap();
    assert!(f.is_zero_copy());
    assert_eq!(f.payload_mut().len(), 4096, "exactly the client's buffer");
    f.payload_mut()[..3].copy_from_slice(b"abc");
    f.set_reply(0, 3);
    let area = f.commit_cmd();
    end.commit(&area, f, None).unwrap();
    assert_eq!(t.join().unwrap().unwrap().data, b"abc");
    assert_eq!(end.stats().unwrap().zero_copy, 2);

    // Other files, and non-zero-copy queues, copy as usual.
    let c = chan.clone();
    let t = std::thread::spawn(move || {
        let arg = ReadIn {
            fh: 1,
            size: 16,
            ..Default::default()
        };
        c.send(
            Args::new(Opcode::Read, 5)
                .body(Body::new().push(&arg).into_vec())
                .out(16, true),
        )
    });
    let mut f = end.fetch(h, true).unwrap().unwrap();
    assert!(!f.is_zero_copy());
    f.payload_mut()[..2].copy_from_slice(b"xy");
    f.set_reply(0, 2);
    let area = f.commit_cmd();
    end.commit(&area, f, None).unwrap();
    assert_eq!(t.join().unwrap().unwrap().data, b"xy");
}

/// On abort, a request whose client pages the server holds ends only when
/// the server gives them back.
#[test]
fn zero_copy_pages_released_on_abort_only_after_the_server() {
    let (chan, end) = ring_chan(1, 12);
    end.add_queue(&cmd_area(0, uring::QUEUE_ZERO_COPY, 0))
        .unwrap();
    let h = end
        .register(
            &cmd_area(0, 0, 0),
            EntryBufs::with_payload(MAX_WRITE as usize),
            None,
        )
        .unwrap();
    let fh = open_zc(&chan, &end, h);
    let c = chan.clone();
    let t = std::thread::spawn(move || {
        let arg = WriteIn {
            fh,
            size: 5,
            ..Default::default()
        };
        c.send(
            Args::new(Opcode::Write, 5)
                .body(Body::new().push(&arg).into_vec())
                .data(b"pages".to_vec())
                .out(8, false),
        )
    });
    let f = end.fetch(h, true).unwrap().unwrap();
    assert!(f.is_zero_copy());
    chan.abort();
    std::thread::sleep(Duration::from_millis(30));
    assert!(
        !t.is_finished(),
        "the client's pages are still with the server"
    );
    assert_eq!(f.request_payload(), b"pages");
    let area = f.commit_cmd();
    let (e, _) = end.commit(&area, f, None).unwrap_err();
    assert_eq!(e, Errno::ENOTCONN);
    assert_eq!(t.join().unwrap(), Err(Errno::ECONNABORTED));
}

#[test]
fn teardown_with_entries_in_every_state() {
    let (chan, end, hs) = pool_ring(4, 3);
    // hs[0]: userspace (fetched); hs[1]: fuse_req (assigned, not fetched);
    // hs[2]: available with a held command; plus queued requests.
    let mut ts = Vec::new();
    for _ in 0..2 {
        let c = chan.clone();
        ts.push(std::thread::spawn(move || c.send(getattr(0))));
    }
    until("two assigned", || {
        hs[..2]
            .iter()
            .all(|h| end.entry_state(*h) == Some(EntState::FuseReq))
    });
    let f = end.fetch(hs[0], false).unwrap().unwrap();
    let e = end.clone();
    let h2 = hs[2];
    let held = std::thread::spawn(move || {
        // Blocks until a request comes for this entry (or the abort).
        e.fetch(h2, true)
    });
    // Fill the third entry too, then queue more than there are entries.
    let c = chan.clone();
    ts.push(std::thread::spawn(move || c.send(getattr(0))));
    until("third assigned", || {
        end.stats().unwrap().queued == 0 && end.entry_state(hs[2]) != Some(EntState::Available)
    });
    for _ in 0..3 {
        let c = chan.clone();
        ts.push(std::thread::spawn(move || c.send(getattr(0))));
    }
    until("queued", || end.stats().unwrap().queued == 3);
    end.check_invariants().unwrap();

    chan.abort();
    // Queued and assigned requests end with ECONNABORTED; the one the
    // server holds (copy mode) too.
    let results: Vec<_> = ts.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(
        results.iter().all(|r| *r == Err(Errno::ECONNABORTED)),
        "{results:?}"
    );
    // The held command either got its request before the abort (and then
    // the entry was torn down on fetch) or completes with ENOTCONN.
    match held.join().unwrap() {
        Ok(Some(f)) => {
            let area = f.commit_cmd();
            assert_eq!(end.commit(&area, f, None).unwrap_err().0, Errno::ENOTCONN);
        }
        other => assert_eq!(other.map(|f| f.is_some()), Err(Errno::ENOTCONN)),
    }
    let area = f.commit_cmd();
    assert_eq!(end.commit(&area, f, None).unwrap_err().0, Errno::ENOTCONN);
    assert_eq!(end.pool_free(0), Some((4, 4)), "every pool buffer is back");
    end.check_invariants().unwrap();
    assert_eq!(end.fetch(hs[1], false).unwrap_err(), Errno::ENOTCONN);
}

#[test]
fn each_queue_runs_one_background_request_past_the_limit() {
    let (chan, end) = ring_chan(2, 1);
    let hs: Vec<_> = (0..2u16)
        .map(|q| {
            end.register(
                &cmd_area(q, 0, 0),
                EntryBufs::with_payload(MAX_WRITE as usize),
                None,
            )
            .unwrap()
        })
        .collect();
    let (tx, rx) = mpsc::channel();
    // FORCE: admission would otherwise hold the second one at the limit.
    for q in 0..2u16 {
        let tx = tx.clone();
        chan.send_background(
            getattr(q).force(),
            fuse_core::EndFn::once(move |r| tx.send(r.is_ok()).unwrap()),
        )
        .unwrap();
    }
    // A second request on queue 0 waits: that queue already runs one.
    let tx2 = tx.clone();
    chan.send_background(
        getattr(0).force(),
        fuse_core::EndFn::once(move |r| tx2.send(r.is_ok()).unwrap()),
    )
    .unwrap();
    until("both queues busy", || {
        hs.iter()
            .all(|h| end.entry_state(*h) == Some(EntState::FuseReq))
    });
    assert_eq!(end.stats().unwrap().bg_queued, 1);
    let f = end.fetch(hs[0], false).unwrap().unwrap();
    let h = reply_attr(&end, f);
    assert!(rx.recv().unwrap());
    until("queue 0 takes its next", || {
        end.entry_state(h) == Some(EntState::FuseReq)
    });
    let f = end.fetch(h, false).unwrap().unwrap();
    reply_attr(&end, f);
    let f = end.fetch(hs[1], false).unwrap().unwrap();
    reply_attr(&end, f);
    assert!(rx.recv().unwrap() && rx.recv().unwrap());
    assert_eq!(chan.stats().background, 0);
}

#[test]
fn memfs_through_the_ring_in_both_payload_modes() {
    for pooled in [false, true] {
        let (chan, end) = ring_chan(2, 12);
        let disp = Arc::new(Dispatcher::new(MemFs::new(), ServerConfig::default()));
        if pooled {
            for q in 0..2 {
                end.add_queue(&cmd_area(q, 0, 0)).unwrap();
                let len = 4 * MAX_WRITE;
                end.add_bufpool(&bufpool_area(q, len), vec![0; len as usize], None)
                    .unwrap();
            }
        }
        let workers: Vec<_> = (0..4u16)
            .map(|i| {
                let (end, disp) = (end.clone(), disp.clone());
                let payload = if pooled { 0 } else { MAX_WRITE as usize };
                std::thread::spawn(move || run_ring_worker(&end, i % 2, payload, None, &disp))
            })
            .collect();
        let create = Body::new()
            .push(&CreateIn {
                mode: 0o644,
                ..Default::default()
            })
            .cstr(b"f");
        let r = chan
            .send(
                Args::new(Opcode::Create, 1)
                    .body(create.into_vec())
                    .out(144, false)
                    .qid(1),
            )
            .unwrap();
        let e: EntryOut = r.read().unwrap();
        let data: Vec<u8> = (0..50_000u32).map(|i| (i * 7) as u8).collect();
        let w = WriteIn {
            fh: e.nodeid,
            size: data.len() as u32,
            ..Default::default()
        };
        let r = chan
            .send(
                Args::new(Opcode::Write, e.nodeid)
                    .body(Body::new().push(&w).into_vec())
                    .data(data.clone())
                    .out(8, false),
            )
            .unwrap();
        assert_eq!(r.read::<WriteOut>().unwrap().size, 50_000);
        let rd = ReadIn {
            fh: e.nodeid,
            size: 60_000,
            ..Default::default()
        };
        let r = chan
            .send(
                Args::new(Opcode::Read, e.nodeid)
                    .body(Body::new().push(&rd).into_vec())
                    .out(60_000, true)
                    .qid(1),
            )
            .unwrap();
        assert_eq!(r.data, data, "pooled={pooled}");
        let r = chan.send(
            Args::new(Opcode::Lookup, 1)
                .body(Body::new().cstr(b"f").into_vec())
                .out(128, false),
        );
        assert_eq!(r.unwrap().read::<EntryOut>().unwrap().nodeid, e.nodeid);
        let r = chan.send(
            Args::new(Opcode::Lookup, 1)
                .body(Body::new().cstr(b"nope").into_vec())
                .out(128, false),
        );
        assert_eq!(r, Err(Errno::ENOENT));
        end.check_invariants().unwrap();
        chan.abort();
        for w in workers {
            assert_eq!(w.join().unwrap(), Ok(()));
        }
        if pooled {
            assert_eq!(end.pool_free(0), Some((4, 4)));
        }
        let _ = abi::KERNEL_MINOR_VERSION;
    }
}

/// FuseReq -> Available: a request that does not fit the entry's payload
/// buffer fails with EIO and the entry serves the next one.
#[test]
fn oversized_request_fails_and_the_entry_goes_on() {
    let (chan, end) = ring_chan(1, 12);
    let h = end
        .register(
            &cmd_area(0, 0, 0),
            EntryBufs::with_payload(MAX_WRITE as usize),
            None,
        )
        .unwrap();
    let c = chan.clone();
    let big = std::thread::spawn(move || {
        let arg = WriteIn {
            size: 2 * MAX_WRITE,
            ..Default::default()
        };
        c.send(
            Args::new(Opcode::Write, 5)
                .body(Body::new().push(&arg).into_vec())
                .data(vec![1; 2 * MAX_WRITE as usize])
                .out(8, false),
        )
    });
    let c = chan.clone();
    let small = std::thread::spawn(move || {
        // Queued behind the big one.
        std::thread::sleep(Duration::from_millis(20));
        c.send(getattr(0))
    });
    // The fetch skips the failed request and returns the next.
    let f = end.fetch(h, true).unwrap().unwrap();
    assert_eq!(big.join().unwrap(), Err(Errno::EIO));
    assert_eq!(f.in_header().opcode, Opcode::Getattr as u32);
    reply_attr(&end, f);
    assert!(small.join().unwrap().is_ok());
    end.check_invariants().unwrap();
}

/// Userspace -> Available: a server that drops what it fetched gives the
/// entry and its buffer back; the request fails with EIO.
#[test]
fn dropped_fetch_gives_the_entry_back() {
    let (chan, end, hs) = pool_ring(2, 2);
    let c = chan.clone();
    let t = std::thread::spawn(move || c.send(getattr(0)));
    until("assigned", || {
        hs.iter()
            .any(|h| end.entry_state(*h) == Some(EntState::FuseReq))
    });
    let h = *hs
        .iter()
        .find(|h| end.entry_state(**h) == Some(EntState::FuseReq))
        .unwrap();
    let f = end.fetch(h, false).unwrap().unwrap();
    assert_eq!(end.pool_free(0), Some((1, 2)));
    drop(f);
    assert_eq!(t.join().unwrap(), Err(Errno::EIO));
    assert_eq!(end.entry_state(h), Some(EntState::Available));
    assert_eq!(end.pool_free(0), Some((2, 2)));
    end.check_invariants().unwrap();
    // The same entry serves the next request.
    let c = chan.clone();
    let t = std::thread::spawn(move || c.send(getattr(0)));
    until("assigned again", || {
        hs.iter()
            .any(|h| end.entry_state(*h) == Some(EntState::FuseReq))
    });
    let h = *hs
        .iter()
        .find(|h| end.entry_state(**h) == Some(EntState::FuseReq))
        .unwrap();
    let f = end.fetch(h, false).unwrap().unwrap();
    reply_attr(&end, f);
    assert!(t.join().unwrap().is_ok());
}

/// A zero-copy request's pool buffer is not claimed: a request waiting for
/// a buffer is not held up by one that needs none.
#[test]
fn zero_copy_requests_claim_no_pool_buffer() {
    let (chan, end) = ring_chan(1, 12);
    end.add_queue(&cmd_area(0, uring::QUEUE_ZERO_COPY, 0))
        .unwrap();
    end.add_bufpool(
        &bufpool_area(0, MAX_WRITE),
        vec![0; MAX_WRITE as usize],
        None,
    )
    .unwrap();
    let hs: Vec<_> = (0..2)
        .map(|_| {
            end.register(&cmd_area(0, 0, 0), EntryBufs::pooled(), None)
                .unwrap()
        })
        .collect();
    let fh = open_zc(&chan, &end, hs[0]);
    let c = chan.clone();
    let zc_read = std::thread::spawn(move || {
        let arg = ReadIn {
            fh,
            size: 4096,
            ..Default::default()
        };
        c.send(
            Args::new(Opcode::Read, 5)
                .body(Body::new().push(&arg).into_vec())
                .out(4096, true),
        )
    });
    until("zc read assigned", || {
        hs.iter()
            .any(|h| end.entry_state(*h) == Some(EntState::FuseReq))
    });
    assert_eq!(
        end.pool_free(0),
        Some((1, 1)),
        "no buffer claimed for a zero-copy READ"
    );
    let c = chan.clone();
    let other = std::thread::spawn(move || c.send(getattr(0)));
    until("both assigned", || {
        hs.iter()
            .all(|h| end.entry_state(*h) == Some(EntState::FuseReq))
    });
    for h in &hs {
        let mut f = end.fetch(*h, false).unwrap().unwrap();
        let n = if f.in_header().opcode == Opcode::Read as u32 {
            1
        } else {
            104
        };
        f.set_reply(0, n);
        let area = f.commit_cmd();
        end.commit(&area, f, None).unwrap();
    }
    assert!(zc_read.join().unwrap().is_ok());
    assert!(other.join().unwrap().is_ok());
    end.check_invariants().unwrap();
}

#[test]
fn a_preferred_entry_takes_requests_only_while_preferred_and_never_a_setlkw() {
    let (chan, end) = ring_chan(1, 12);
    let reg = || {
        end.register(
            &cmd_area(0, 0, 0),
            EntryBufs::with_payload(MAX_WRITE as usize),
            None,
        )
        .unwrap()
    };
    let worker = reg();
    let mine = reg();
    // Preferred: the request goes to `mine`, though `worker` came first.
    end.prefer(0, Some(mine)).unwrap();
    let c = chan.clone();
    let t = std::thread::spawn(move || c.send(getattr(0)));
    until("assigned", || {
        end.entry_state(mine) == Some(EntState::FuseReq)
    });
    assert_eq!(end.entry_state(worker), Some(EntState::Available));
    let f = end.fetch(mine, false).unwrap().unwrap();
    reply_attr(&end, f);
    assert!(t.join().unwrap().is_ok());
    // A SETLKW never goes to it, even while preferred.
    let lkw = Args::new(Opcode::Setlkw, 1)
        .body(Body::new().push(&LkIn::default()).into_vec())
        .qid(0);
    let c = chan.clone();
    let t = std::thread::spawn(move || c.send(lkw));
    until("SETLKW assigned", || {
        end.entry_state(worker) == Some(EntState::FuseReq)
    });
    assert_eq!(end.entry_state(mine), Some(EntState::Available));
    reply_empty(&end, end.fetch(worker, false).unwrap().unwrap());
    assert!(t.join().unwrap().is_ok());
    // Not preferred any more: reserved, it takes nothing (the request
    // waits for the worker's entry, busy here).
    end.prefer(0, None).unwrap();
    let held = end.fetch(worker, false).unwrap();
    assert!(held.is_none());
    let c = chan.clone();
    let t = std::thread::spawn(move || c.send(getattr(0)));
    until("assigned to the worker", || {
        end.entry_state(worker) == Some(EntState::FuseReq)
    });
    let f = end.fetch(worker, false).unwrap().unwrap();
    let c = chan.clone();
    let t2 = std::thread::spawn(move || c.send(getattr(0)));
    until("queued", || end.stats().unwrap().queued == 1);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(end.entry_state(mine), Some(EntState::Available));
    // The worker's commit takes the queued one.
    let h = reply_attr(&end, f);
    assert_eq!(end.entry_state(h), Some(EntState::FuseReq));
    reply_attr(&end, end.fetch(h, false).unwrap().unwrap());
    assert!(t.join().unwrap().is_ok() && t2.join().unwrap().is_ok());
    // Its own commit never hands it a SETLKW either: `mine` serves a
    // request while the worker is busy and a SETLKW queues behind.
    end.prefer(0, Some(mine)).unwrap();
    let c = chan.clone();
    let t = std::thread::spawn(move || c.send(getattr(0)));
    until("mine assigned", || {
        end.entry_state(mine) == Some(EntState::FuseReq)
    });
    let fm = end.fetch(mine, false).unwrap().unwrap();
    let c = chan.clone();
    let t2 = std::thread::spawn(move || c.send(getattr(0)));
    until("the worker assigned", || {
        end.entry_state(worker) == Some(EntState::FuseReq)
    });
    let fw = end.fetch(worker, false).unwrap().unwrap();
    let lkw = Args::new(Opcode::Setlkw, 1)
        .body(Body::new().push(&LkIn::default()).into_vec())
        .qid(0);
    let c = chan.clone();
    let t3 = std::thread::spawn(move || c.send(lkw));
    until("SETLKW queued", || end.stats().unwrap().queued == 1);
    let h = reply_attr(&end, fm);
    assert_eq!(
        end.entry_state(h),
        Some(EntState::Available),
        "mine took the SETLKW"
    );
    let h = reply_attr(&end, fw);
    assert_eq!(end.entry_state(h), Some(EntState::FuseReq));
    reply_empty(&end, end.fetch(h, false).unwrap().unwrap());
    assert!(t.join().unwrap().is_ok() && t2.join().unwrap().is_ok() && t3.join().unwrap().is_ok());
    end.check_invariants().unwrap();
}
