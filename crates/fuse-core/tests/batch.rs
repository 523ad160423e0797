//! The batch forms: `Chan::try_send_background_batch`,
//! `RingEnd::fetch_own_batch` and `RingEnd::commit_batch` behave as the
//! single forms called one after the other (admission and its refusals,
//! each request answered exactly once and in order, abort in the middle
//! of a batch, refused commits), and the requests they recycle leave
//! nothing counted behind.

mod common;
use common::until;
use fuse_core::abi::{encode::Body, init, Attr, AttrOut, GetattrIn, Opcode};
use fuse_core::dev_uring::{bufpool_area, cmd_area, EntHandle, EntryBufs, Fetched, RingEnd};
use fuse_core::{Args, Chan, ChanConfig, Errno, Negotiated, ReqResult};
use fuse_core::{EndFn, TrySendError};
use std::sync::{Arc, Mutex};

const MAX_WRITE: u32 = 16 * 1024;

/// A ring connection with one queue, a pool of `bufs` buffers, and
/// `ents` reserved entries (a submitter's own).
fn ring(max_background: u32, bufs: u32, ents: usize) -> (Chan, RingEnd, Vec<EntHandle>) {
    let chan = Chan::new(ChanConfig {
        spawn_scanner: false,
        ring_queues: 1,
        ..Default::default()
    });
    chan.set_initialized(Negotiated {
        max_write: MAX_WRITE,
        flags: init::OVER_IO_URING,
        ring_queues: 1,
        ..Negotiated::with_max_background(max_background)
    });
    let end = chan.ring_end(false);
    end.add_queue(&cmd_area(0, 0, 0)).unwrap();
    let len = bufs * MAX_WRITE;
    end.add_bufpool(&bufpool_area(0, len), vec![0; len as usize], None)
        .unwrap();
    let hs = (0..ents)
        .map(|_| {
            let h = end
                .register(&cmd_area(0, 0, 0), EntryBufs::pooled(), None)
                .unwrap();
            end.reserve(h).unwrap();
            h
        })
        .collect();
    (chan, end, hs)
}

fn getattr(nodeid: u64) -> Args {
    Args::new(Opcode::Getattr, nodeid)
        .body(Body::new().push(&GetattrIn::default()).into_vec())
        .out(std::mem::size_of::<AttrOut>(), false)
}

/// What end callbacks saw: (tag, result), in the order they ran.
type Log = Arc<Mutex<Vec<(u64, Result<u64, Errno>)>>>;

/// An end callback recording the reply's inode (or the error) under `tag`.
fn logged(log: &Log, tag: u64) -> EndFn {
    let log = log.clone();
    fuse_core::EndFn::once(move |r: ReqResult| {
        let r = r.map(|reply| reply.read::<AttrOut>().map_or(0, |a| a.attr.ino));
        log.lock().unwrap().push((tag, r));
    })
}

fn batch_of(log: &Log, tags: impl IntoIterator<Item = u64>) -> Vec<(Args, EndFn)> {
    tags.into_iter()
        .map(|t| (getattr(t), logged(log, t)))
        .collect()
}

/// Answers a GETATTR with its own node id as the inode.
fn answer(f: &mut Fetched) {
    let out = AttrOut {
        attr: Attr {
            ino: f.in_header().nodeid,
            ..Default::default()
        },
        ..Default::default()
    };
    let b = zerocopy::IntoBytes::as_bytes(&out);
    f.payload_mut()[..b.len()].copy_from_slice(b);
    f.set_reply(0, b.len());
}

fn log_of(log: &Log) -> Vec<(u64, Result<u64, Errno>)> {
    log.lock().unwrap().clone()
}

#[test]
fn a_batch_is_admitted_as_single_sends_that_stop_at_the_first_refusal() {
    let (chan, end, hs) = ring(4, 8, 8);
    end.prefer(0, hs.first().copied()).unwrap();
    let log: Log = Arc::default();
    // Two in flight already: two of the five fit.
    for t in [1, 2] {
        chan.try_send_background(getattr(t), logged(&log, t))
            .unwrap();
    }
    let mut batch = batch_of(&log, 3..=7);
    // A FORCE request after the refusal is not tried either (a caller
    // sending one by one stops at the first Full).
    batch.insert(3, (getattr(99).force(), logged(&log, 99)));
    let mut sent = Vec::new();
    let taken = chan.try_send_background_batch(&mut batch, &mut sent);
    assert_eq!(taken, 2);
    assert_eq!(sent.len(), 2);
    assert!(sent.iter().all(Result::is_ok));
    let uniques: Vec<u64> = sent.iter().map(|r| *r.as_ref().unwrap()).collect();
    assert!(uniques[0] < uniques[1] && uniques.iter().all(|u| u % 2 == 0));
    let left: Vec<u64> = batch.iter().map(|(a, _)| a.nodeid).collect();
    assert_eq!(left, [5, 99, 6, 7], "the refused stay, untouched, in order");
    let s = chan.stats();
    assert_eq!((s.background, s.blocked, s.waiting), (4, true, 4));
    // The single form agrees: full.
    let (a, e) = batch.remove(0);
    assert!(matches!(
        chan.try_send_background(a, e),
        Err(TrySendError::Full(_))
    ));

    // Serve the four: one fetch, one commit, answered in order.
    let mut fs = Vec::new();
    assert_eq!(end.fetch_own_batch(0, 16, &mut fs), Ok(4));
    let order: Vec<u64> = fs.iter().map(|f| f.in_header().nodeid).collect();
    assert_eq!(order, [1, 2, 3, 4]);
    fs.iter_mut().for_each(answer);
    assert_eq!(end.commit_batch(&mut fs, None), 4);
    assert!(fs.is_empty());
    assert_eq!(
        log_of(&log),
        [(1, Ok(1)), (2, Ok(2)), (3, Ok(3)), (4, Ok(4))]
    );
    let s = chan.stats();
    assert_eq!((s.background, s.blocked, s.waiting), (0, false, 0));
    end.check_invariants().unwrap();
}

#[test]
fn a_batch_queues_behind_parked_waiters() {
    let (chan, end, hs) = ring(1, 4, 2);
    end.prefer(0, hs.first().copied()).unwrap();
    let log: Log = Arc::default();
    chan.try_send_background(getattr(1), logged(&log, 1))
        .unwrap();
    // A blocking sender parks behind the full limit.
    let c = chan.clone();
    let l = log.clone();
    let parked = std::thread::spawn(move || c.send_background(getattr(2), logged(&l, 2)));
    until("sender parked", || chan.stats().parked == 1);
    let mut batch = batch_of(&log, [3, 4]);
    let mut sent = Vec::new();
    assert_eq!(chan.try_send_background_batch(&mut batch, &mut sent), 0);
    assert_eq!((batch.len(), sent.len()), (2, 0));
    // The first answer hands the slot to the parked sender (FIFO), not
    // to a later batch.
    let mut fs = Vec::new();
    end.fetch_own_batch(0, 16, &mut fs).unwrap();
    fs.iter_mut().for_each(answer);
    end.commit_batch(&mut fs, None);
    parked.join().unwrap().unwrap();
    assert_eq!(chan.try_send_background_batch(&mut batch, &mut sent), 0);
    assert_eq!(chan.stats().background, 1);
    chan.abort();
}

#[test]
fn a_batch_after_abort_is_closed_and_runs_no_callback() {
    let (chan, _end, _hs) = ring(4, 4, 1);
    let log: Log = Arc::default();
    chan.abort();
    let mut batch = batch_of(&log, 1..=3);
    let mut sent = Vec::new();
    assert_eq!(chan.try_send_background_batch(&mut batch, &mut sent), 3);
    assert!(batch.is_empty());
    assert_eq!(sent, vec![Err(Errno::ENOTCONN); 3]);
    assert!(log_of(&log).is_empty());
    assert_eq!(chan.stats().waiting, 0);
    chan.wait_aborted();
}

#[test]
fn a_batch_without_the_ring_goes_through_the_background_queue() {
    let (chan, dev) = common::chan(2);
    let log: Log = Arc::default();
    let mut batch = batch_of(&log, 1..=3);
    let mut sent = Vec::new();
    assert_eq!(chan.try_send_background_batch(&mut batch, &mut sent), 2);
    assert_eq!(batch.len(), 1);
    let (h1, _) = common::read(&dev);
    let (h2, _) = common::read(&dev);
    assert_eq!(
        [Ok(h1.unique), Ok(h2.unique)],
        [sent[0], sent[1]],
        "admission order is queue order"
    );
    dev.write(&fuse_core::abi::encode::reply(h2.unique, -5, &[]))
        .unwrap();
    dev.write(&fuse_core::abi::encode::reply(h1.unique, -2, &[]))
        .unwrap();
    assert_eq!(
        log_of(&log),
        [(2, Err(Errno::EIO)), (1, Err(Errno::ENOENT))]
    );
    assert_eq!(chan.try_send_background_batch(&mut batch, &mut sent), 1);
    chan.abort();
    assert_eq!(log_of(&log).last(), Some(&(3, Err(Errno::ENOTCONN))));
    chan.wait_aborted();
}

#[test]
fn fetch_own_batch_takes_only_reserved_entries_and_up_to_max() {
    let (chan, end, hs) = ring(64, 8, 6);
    // Two entries of another server, registered before: not taken.
    let other: Vec<EntHandle> = (0..2)
        .map(|_| {
            end.register(&cmd_area(0, 0, 0), EntryBufs::pooled(), None)
                .unwrap()
        })
        .collect();
    end.prefer(0, hs.first().copied()).unwrap();
    let log: Log = Arc::default();
    let mut batch = batch_of(&log, 1..=8);
    let mut sent = Vec::new();
    assert_eq!(chan.try_send_background_batch(&mut batch, &mut sent), 8);
    // Six went to the reserved entries (preferred), two to the others.
    let mut fs = Vec::new();
    assert_eq!(end.fetch_own_batch(0, 4, &mut fs), Ok(4));
    assert_eq!(end.fetch_own_batch(0, 4, &mut fs), Ok(2));
    assert_eq!(end.fetch_own_batch(0, 4, &mut fs), Ok(0));
    let order: Vec<u64> = fs.iter().map(|f| f.in_header().nodeid).collect();
    assert_eq!(order, [1, 2, 3, 4, 5, 6]);
    assert!(fs.iter().all(|f| hs.contains(&f.handle())));
    for h in &other {
        let mut f = end.fetch(*h, false).unwrap().unwrap();
        answer(&mut f);
        fs.push(f);
    }
    // One commit for entries of either kind, in the order given.
    fs.reverse();
    assert_eq!(end.commit_batch(&mut fs, None), 8);
    let tags: Vec<u64> = log_of(&log).iter().map(|(t, _)| *t).collect();
    assert_eq!(tags, [8, 7, 6, 5, 4, 3, 2, 1]);
    end.check_invariants().unwrap();
    assert_eq!(end.pool_free(0), Some((8, 8)));
}

#[test]
fn commit_batch_answers_each_once_in_order_and_keeps_refused_entries() {
    let (chan, end, hs) = ring(64, 8, 6);
    end.prefer(0, hs.first().copied()).unwrap();
    let log: Log = Arc::default();
    let mut batch = batch_of(&log, 1..=6);
    let mut sent = Vec::new();
    chan.try_send_background_batch(&mut batch, &mut sent);
    let mut fs = Vec::new();
    assert_eq!(end.fetch_own_batch(0, 16, &mut fs), Ok(6));
    fs.iter_mut().for_each(answer);
    // The fourth has a commit id that names no request of its entry: a
    // single commit refuses it with EINVAL, so the batch leaves it.
    fs[3].header.ring_ent_in_out.commit_id ^= 2;
    assert_eq!(end.commit_batch(&mut fs, None), 5);
    assert_eq!(fs.len(), 1);
    assert_eq!(fs[0].commit_id() ^ 2, *sent[3].as_ref().unwrap());
    let tags: Vec<u64> = log_of(&log).iter().map(|(t, _)| *t).collect();
    assert_eq!(tags, [1, 2, 3, 5, 6]);
    // Given back unchanged: put right, it commits.
    fs[0].header.ring_ent_in_out.commit_id ^= 2;
    fs[0].set_reply(0, std::mem::size_of::<AttrOut>());
    assert_eq!(end.commit_batch(&mut fs, None), 1);
    assert_eq!(log_of(&log).last(), Some(&(4, Ok(4))));
    // A commit of an entry already committed: nothing runs twice.
    assert_eq!(log_of(&log).len(), 6);
    end.check_invariants().unwrap();
    assert_eq!(chan.stats().waiting, 0);
}

#[test]
fn abort_between_fetch_and_commit_ends_each_request_once() {
    let (chan, end, hs) = ring(64, 4, 6);
    end.prefer(0, hs.first().copied()).unwrap();
    let log: Log = Arc::default();
    let mut batch = batch_of(&log, 1..=6);
    let mut sent = Vec::new();
    chan.try_send_background_batch(&mut batch, &mut sent);
    let mut fs = Vec::new();
    // Four pool buffers: four go out now, two wait for a buffer.
    assert_eq!(end.fetch_own_batch(0, 16, &mut fs), Ok(4));
    fs.iter_mut().for_each(answer);
    chan.abort();
    // Every request ended with the abort (the server holds none of the
    // client's pages): the two still queued, and the four fetched.
    let ended = log_of(&log);
    assert_eq!(ended.len(), 6);
    // The late commits give the entries back and end nothing twice.
    assert_eq!(end.commit_batch(&mut fs, None), 4);
    let log = log_of(&log);
    assert_eq!(log, ended);
    for t in 1..=6 {
        let n = log.iter().filter(|(x, _)| *x == t).count();
        assert_eq!(n, 1, "request {t} ended {n} times");
    }
    assert!(log.iter().all(|(_, r)| *r == Err(Errno::ECONNABORTED)));
    assert_eq!(end.fetch_own_batch(0, 16, &mut fs), Err(Errno::ENOTCONN));
    end.check_invariants().unwrap();
    assert_eq!(end.pool_free(0), Some((4, 4)));
    chan.wait_aborted();
}

#[test]
fn abort_before_fetch_ends_the_batch_and_fetch_says_enotconn() {
    let (chan, end, hs) = ring(64, 8, 4);
    end.prefer(0, hs.first().copied()).unwrap();
    let log: Log = Arc::default();
    let mut batch = batch_of(&log, 1..=4);
    let mut sent = Vec::new();
    chan.try_send_background_batch(&mut batch, &mut sent);
    chan.abort();
    let mut fs = Vec::new();
    assert_eq!(end.fetch_own_batch(0, 16, &mut fs), Err(Errno::ENOTCONN));
    let log = log_of(&log);
    assert_eq!(log.len(), 4);
    assert!(log.iter().all(|(_, r)| *r == Err(Errno::ECONNABORTED)));
    chan.wait_aborted();
}

#[test]
fn dropped_fetched_fails_its_request_and_the_entry_serves_on() {
    let (chan, end, hs) = ring(64, 4, 2);
    end.prefer(0, hs.first().copied()).unwrap();
    let log: Log = Arc::default();
    let mut batch = batch_of(&log, 1..=2);
    let mut sent = Vec::new();
    chan.try_send_background_batch(&mut batch, &mut sent);
    let mut fs = Vec::new();
    end.fetch_own_batch(0, 16, &mut fs).unwrap();
    drop(fs.remove(0));
    assert_eq!(log_of(&log), [(1, Err(Errno::EIO))]);
    // The dropped entry lost its header with the Fetched; it takes the
    // next request all the same.
    let mut batch = batch_of(&log, [3]);
    chan.try_send_background_batch(&mut batch, &mut sent);
    end.fetch_own_batch(0, 16, &mut fs).unwrap();
    fs.iter_mut().for_each(answer);
    assert_eq!(end.commit_batch(&mut fs, None), 2);
    assert_eq!(log_of(&log)[1..], [(2, Ok(2)), (3, Ok(3))]);
    end.check_invariants().unwrap();
}

#[test]
fn many_batches_recycle_requests_and_leave_nothing_waiting() {
    let (chan, end, hs) = ring(16, 8, 16);
    let log: Log = Arc::default();
    let mut sent = Vec::new();
    let mut fs = Vec::new();
    for round in 0..50u64 {
        end.prefer(0, hs.first().copied()).unwrap();
        let n = 1 + round % 16;
        let mut batch = batch_of(&log, (0..n).map(|i| round * 100 + i + 1));
        assert_eq!(
            chan.try_send_background_batch(&mut batch, &mut sent) as u64,
            n
        );
        let mut got = 0;
        while end.fetch_own_batch(0, 16, &mut fs).unwrap() > 0 {
            fs.iter_mut().for_each(answer);
            got += end.commit_batch(&mut fs, None);
        }
        end.prefer(0, None).unwrap();
        assert_eq!(got as u64, n);
    }
    let log = log_of(&log);
    assert_eq!(log.len(), (0..50).map(|r| 1 + r % 16).sum::<usize>());
    assert!(
        log.iter().all(|(t, r)| *r == Ok(*t)),
        "each got its own reply"
    );
    // Uniques stay distinct although the requests were reused.
    let mut u: Vec<u64> = sent.iter().map(|r| *r.as_ref().unwrap()).collect();
    let n = u.len();
    u.dedup();
    assert_eq!(u.len(), n);
    assert_eq!(chan.stats().waiting, 0);
    chan.abort();
    chan.wait_aborted();
}

/// An abort that lands while `fetch_own_batch` copies 16 large WRITEs
/// (between its two queue locks): every request ends once, and none stays
/// counted as waiting (an aborted landing left its request on the
/// released entry, so `waiting` never came back to 0).
#[test]
fn an_abort_during_a_batch_fetch_leaves_nothing_waiting() {
    use fuse_core::abi::WriteIn;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};
    const MW: u32 = 1 << 20;
    for round in 0..40u64 {
        let chan = Chan::new(ChanConfig {
            spawn_scanner: false,
            ring_queues: 1,
            ..Default::default()
        });
        chan.set_initialized(Negotiated {
            max_write: MW,
            flags: init::OVER_IO_URING,
            ring_queues: 1,
            ..Negotiated::with_max_background(64)
        });
        let end = chan.ring_end(false);
        end.add_queue(&cmd_area(0, 0, 0)).unwrap();
        let hs: Vec<_> = (0..16)
            .map(|_| {
                let h = end
                    .register(
                        &cmd_area(0, 0, 0),
                        EntryBufs::with_payload(MW as usize + 4096),
                        None,
                    )
                    .unwrap();
                end.reserve(h).unwrap();
                h
            })
            .collect();
        end.prefer(0, hs.first().copied()).unwrap();
        let ended = Arc::new(AtomicUsize::new(0));
        let mut batch: Vec<(Args, EndFn)> = (0..16)
            .map(|_| {
                let e = ended.clone();
                let f: EndFn = fuse_core::EndFn::once(move |_| {
                    e.fetch_add(1, Ordering::SeqCst);
                });
                let args = Args::new(Opcode::Write, 1)
                    .body(
                        Body::new()
                            .push(&WriteIn {
                                size: MW,
                                ..Default::default()
                            })
                            .into_vec(),
                    )
                    .data(vec![7u8; MW as usize])
                    .out(std::mem::size_of::<fuse_core::abi::WriteOut>(), false);
                (args, f)
            })
            .collect();
        let mut sent = Vec::new();
        assert_eq!(chan.try_send_background_batch(&mut batch, &mut sent), 16);
        let c = chan.clone();
        let delay = Duration::from_micros((round % 20) * 150);
        let t = std::thread::spawn(move || {
            std::thread::sleep(delay);
            c.abort();
        });
        let mut fs = Vec::new();
        let _ = end.fetch_own_batch(0, 16, &mut fs);
        t.join().unwrap();
        drop(fs);
        let t0 = Instant::now();
        while (ended.load(Ordering::SeqCst) < 16 || chan.stats().waiting != 0)
            && t0.elapsed() < Duration::from_secs(2)
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(ended.load(Ordering::SeqCst), 16, "round {round}");
        assert_eq!(chan.stats().waiting, 0, "round {round}");
        end.check_invariants().unwrap();
    }
}

#[test]
fn unprefer_says_whether_reserved_entries_hold_requests_their_owner_has_not_fetched() {
    // Two reserved entries, no other: a third request waits in the queue.
    let (chan, end, hs) = ring(64, 8, 2);
    end.prefer(0, hs.first().copied()).unwrap();
    let log: Log = Arc::default();
    let mut batch = batch_of(&log, 1..=3);
    let mut sent = Vec::new();
    assert_eq!(chan.try_send_background_batch(&mut batch, &mut sent), 3);
    assert_eq!(end.unprefer(0), Ok(true), "two entries hold requests");
    let mut f = end.fetch_own(0).unwrap().unwrap();
    let g = end.fetch_own(0).unwrap().unwrap();
    assert_eq!(end.unprefer(0), Ok(false), "both fetched, the third waits");
    // The owner's own commit hands its entry the waiting request, even
    // while the queue does not prefer reserved entries.
    answer(&mut f);
    let area = f.commit_cmd();
    end.commit(&area, f, None).unwrap();
    assert_eq!(end.unprefer(0), Ok(true), "a commit took the next request");
    let h = end.fetch_own(0).unwrap().unwrap();
    assert_eq!(h.in_header().nodeid, 3);
    assert_eq!(end.unprefer(0), Ok(false));
    for mut x in [g, h] {
        answer(&mut x);
        let area = x.commit_cmd();
        end.commit(&area, x, None).unwrap();
    }
    assert!(end.fetch_own(0).unwrap().is_none());
    assert_eq!(end.unprefer(0), Ok(false));
    let tags: Vec<u64> = log_of(&log).iter().map(|(t, _)| *t).collect();
    assert_eq!(tags, [1, 2, 3]);
    end.check_invariants().unwrap();
}

#[test]
fn unprefer_stops_reserved_entries_taking_requests() {
    // One reserved entry and one other: after unprefer, a new request
    // goes to the other one.
    let (chan, end, hs) = ring(64, 8, 1);
    let other = end
        .register(&cmd_area(0, 0, 0), EntryBufs::pooled(), None)
        .unwrap();
    end.prefer(0, hs.first().copied()).unwrap();
    assert_eq!(end.unprefer(0), Ok(false));
    let log: Log = Arc::default();
    let mut batch = batch_of(&log, [1]);
    let mut sent = Vec::new();
    assert_eq!(chan.try_send_background_batch(&mut batch, &mut sent), 1);
    assert_eq!(end.unprefer(0), Ok(false), "no longer preferred");
    assert!(end.fetch_own(0).unwrap().is_none());
    let mut f = end.fetch(other, false).unwrap().unwrap();
    answer(&mut f);
    let area = f.commit_cmd();
    end.commit(&area, f, None).unwrap();
    assert_eq!(log_of(&log).len(), 1);
    end.check_invariants().unwrap();
}
