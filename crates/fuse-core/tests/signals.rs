//! Kills and interrupts, as the kernel does them. The letters in the test
//! names are the scenarios (the others: (a), (b) and (e) in
//! `admission.rs`, (f) in `abort_timeout.rs`):
//! - (c) a kill during a reply copy waits for the copy (and, for an
//!   abort-on-kill request, aborts the connection);
//! - (d) interrupt against NOTIFY_RESEND: a resent request is not SENT and
//!   queues no interrupt, a resend drops the interrupts queued for its
//!   request, and an ended request leaves none.

mod common;
use common::*;
use fuse_core::abi::{self, notify, InterruptIn, Opcode};
use fuse_core::{Args, Errno};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;
use zerocopy::FromBytes;

/// Starts a synchronous call on its own thread; returns its signal handle.
fn spawn_call(
    chan: &fuse_core::Chan,
    args: Args,
) -> (
    fuse_core::Signal,
    std::thread::JoinHandle<fuse_core::ReqResult>,
) {
    let call = chan.call(args);
    let sig = call.signal();
    (sig, std::thread::spawn(move || call.wait()))
}

fn read_args() -> Args {
    Args::new(Opcode::Read, 2).out(4096, true)
}

/// Kill during the reply copy of an abort-on-kill request: the connection
/// is aborted, but the requester returns only after the copier finished,
/// and the copier had the whole buffer for the whole copy.
#[test]
fn c_kill_during_reply_copy_waits_for_the_copy() {
    let (chan, dev) = chan(12);
    let call = chan.call(read_args().abort_on_kill());
    let sig = call.signal();
    let copy_done = Arc::new(AtomicBool::new(false));
    let cd = copy_done.clone();
    let requester = std::thread::spawn(move || {
        let r = call.wait();
        // The copy must be complete before the requester sees anything.
        (r, cd.load(Ordering::SeqCst))
    });
    let (h, _) = read(&dev);

    let (started_tx, started_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let cd = copy_done.clone();
    let d = dev.clone();
    let writer = std::thread::spawn(move || {
        d.write_with(h.unique, 0, 4096, |dst| {
            dst[..2048].fill(0xab);
            started_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            // Still ours after the abort: write the rest.
            dst[2048..].fill(0xcd);
            cd.store(true, Ordering::SeqCst);
        })
    });
    started_rx.recv().unwrap();
    sig.kill();
    until("abort on kill", || !chan.is_connected());
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !requester.is_finished(),
        "requester returned while its buffer was being copied"
    );
    assert!(!copy_done.load(Ordering::SeqCst));
    go_tx.send(()).unwrap();

    let (r, done_first) = requester.join().unwrap();
    assert!(done_first, "requester returned before the copy finished");
    assert_eq!(r, Err(Errno::ENOTCONN));
    assert_eq!(
        writer.join().unwrap(),
        Err(Errno::ENOENT),
        "the copier learns of the abort"
    );
    chan.wait_aborted();
    assert_eq!(chan.stats().waiting, 0);
}

/// Without abort_on_kill a kill during the copy still waits, and then the
/// requester gets the full reply.
#[test]
fn c_kill_without_abort_gets_the_reply_after_the_copy() {
    let (chan, dev) = chan(12);
    let call = chan.call(read_args());
    let sig = call.signal();
    let requester = std::thread::spawn(move || call.wait());
    let (h, _) = read(&dev);
    let (started_tx, started_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let d = dev.clone();
    let writer = std::thread::spawn(move || {
        d.write_with(h.unique, 0, 100, |dst| {
            started_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            dst.fill(7);
        })
    });
    started_rx.recv().unwrap();
    sig.kill();
    std::thread::sleep(Duration::from_millis(30));
    assert!(!requester.is_finished());
    go_tx.send(()).unwrap();
    assert_eq!(writer.join().unwrap(), Ok(116));
    assert_eq!(requester.join().unwrap().unwrap().data, vec![7u8; 100]);
    assert!(chan.is_connected());
}

#[test]
fn kill_before_the_server_reads_withdraws_the_request() {
    let (chan, dev) = chan(12);
    let (sig, t) = spawn_call(&chan, noop(1));
    until("pending", || chan.stats().pending == 1);
    sig.kill();
    assert_eq!(t.join().unwrap(), Err(Errno::EINTR));
    assert!(
        try_read(&dev).is_none(),
        "a withdrawn request must not reach the server"
    );
    assert_eq!(chan.stats().waiting, 0);
}

#[test]
fn interrupt_of_a_sent_request_queues_fuse_interrupt_first() {
    let (chan, dev) = chan(12);
    let (sig, t) = spawn_call(&chan, noop(1));
    let (h, _) = read(&dev);
    // Another request is pending; the interrupt must come before it.
    let c = chan.clone();
    let other = std::thread::spawn(move || c.send(noop(9)));
    until("other pending", || chan.stats().pending == 1);
    sig.interrupt();
    until("interrupt queued", || !dev.queued_interrupts().is_empty());
    let (ih, body) = read(&dev);
    assert_eq!(ih.opcode, Opcode::Interrupt as u32);
    assert_eq!(ih.unique, h.unique | abi::INT_REQ_BIT);
    assert_eq!(
        InterruptIn::read_from_bytes(&body).unwrap().unique,
        h.unique
    );
    // EAGAIN requeues the interrupt.
    reply(&dev, ih.unique, Errno::EAGAIN.to_wire(), &[]).unwrap();
    assert_eq!(dev.queued_interrupts(), vec![h.unique]);
    let (ih2, _) = read(&dev);
    assert_eq!(ih2.unique, h.unique | 1);
    reply(&dev, h.unique, Errno::EINTR.to_wire(), &[]).unwrap();
    assert_eq!(t.join().unwrap(), Err(Errno::EINTR));
    let (oh, _) = read(&dev);
    reply(&dev, oh.unique, 0, &[]).unwrap();
    assert!(other.join().unwrap().is_ok());
}

#[test]
fn enosys_interrupt_reply_sets_no_interrupt() {
    let (chan, dev) = chan(12);
    let (sig, t) = spawn_call(&chan, noop(1));
    let (h, _) = read(&dev);
    sig.interrupt();
    let (ih, _) = read(&dev);
    reply(&dev, ih.unique, Errno::ENOSYS.to_wire(), &[]).unwrap();
    assert!(chan.stats().no_interrupt);
    reply(&dev, h.unique, 0, &[]).unwrap();
    assert!(t.join().unwrap().is_ok());
    // Later signals queue nothing.
    let (sig, t) = spawn_call(&chan, noop(1));
    let (h, _) = read(&dev);
    sig.interrupt();
    std::thread::sleep(Duration::from_millis(20));
    assert!(dev.queued_interrupts().is_empty());
    reply(&dev, h.unique, 0, &[]).unwrap();
    assert!(t.join().unwrap().is_ok());
}

#[test]
fn force_requests_ignore_interruption() {
    let (chan, dev) = chan(12);
    let (sig, t) = spawn_call(&chan, noop(1).force());
    let (h, _) = read(&dev);
    sig.interrupt();
    sig.kill();
    std::thread::sleep(Duration::from_millis(20));
    assert!(dev.queued_interrupts().is_empty());
    assert!(!t.is_finished());
    reply(&dev, h.unique, 0, &[]).unwrap();
    assert!(t.join().unwrap().is_ok());
}

fn resend(dev: &fuse_core::Device) {
    reply(dev, 0, notify::RESEND, &[]).unwrap();
}

/// (d) A request moved back to pending by NOTIFY_RESEND is no longer SENT:
/// signalling it queues no interrupt until it is read again.
#[test]
fn d_no_interrupt_for_a_resent_request() {
    let (chan, dev) = chan(12);
    let (sig, t) = spawn_call(&chan, noop(1));
    let (h, _) = read(&dev);
    resend(&dev);
    sig.interrupt();
    std::thread::sleep(Duration::from_millis(20));
    assert!(
        dev.queued_interrupts().is_empty(),
        "interrupt queued for a request not SENT"
    );
    // Read again: it carries the RESEND bit and, being INTERRUPTED, gets
    // its interrupt now.
    let (h2, _) = read(&dev);
    assert_eq!(h2.unique, h.unique | abi::UNIQUE_RESEND);
    let (ih, _) = read(&dev);
    assert_eq!(ih.opcode, Opcode::Interrupt as u32);
    assert_eq!(ih.unique, h2.unique | 1);
    // The old unique is gone.
    assert_eq!(reply(&dev, h.unique, 0, &[]), Err(Errno::ENOENT));
    reply(&dev, h2.unique, 0, &[]).unwrap();
    assert!(t.join().unwrap().is_ok());
    assert!(dev.queued_interrupts().is_empty());
}

/// (d) An interrupt queued before a resend is dropped by it.
#[test]
fn d_resend_drops_queued_interrupts() {
    let (chan, dev) = chan(12);
    let (sig, t) = spawn_call(&chan, noop(1));
    read(&dev);
    sig.interrupt();
    until("interrupt queued", || dev.queued_interrupts().len() == 1);
    resend(&dev);
    assert!(dev.queued_interrupts().is_empty());
    let (h2, _) = read(&dev);
    assert_eq!(h2.opcode, Opcode::Getattr as u32);
    let (ih, _) = read(&dev);
    assert_eq!(ih.unique, h2.unique | 1);
    reply(&dev, h2.unique, 0, &[]).unwrap();
    t.join().unwrap().unwrap();
}

/// (d) No stale interrupt is left when a request ends.
#[test]
fn d_ending_a_request_removes_its_interrupt() {
    let (chan, dev) = chan(12);
    let (sig, t) = spawn_call(&chan, noop(1));
    let (h, _) = read(&dev);
    sig.interrupt();
    until("interrupt queued", || dev.queued_interrupts().len() == 1);
    reply(&dev, h.unique, 0, &[]).unwrap();
    t.join().unwrap().unwrap();
    assert!(dev.queued_interrupts().is_empty());
    assert!(try_read(&dev).is_none(), "stale interrupt delivered");
}

/// (d) Race resend against interrupt many times: whichever wins, no
/// interrupt may stay queued for the (now pending) request.
#[test]
fn d_resend_vs_interrupt_race() {
    let (chan, dev) = chan(12);
    for _ in 0..300 {
        let (sig, t) = spawn_call(&chan, noop(1));
        read(&dev);
        let d = dev.clone();
        let a = std::thread::spawn(move || resend(&d));
        let b = std::thread::spawn(move || sig.interrupt());
        a.join().unwrap();
        b.join().unwrap();
        // The request is pending again; the server has not seen it since.
        assert!(
            dev.queued_interrupts().is_empty(),
            "interrupt for a request that is not SENT"
        );
        let (h2, _) = read(&dev);
        assert_ne!(h2.opcode, Opcode::Interrupt as u32);
        // Interrupted before or after the re-read: at most one interrupt.
        until("signal seen", || dev.queued_interrupts().len() == 1);
        reply(&dev, h2.unique, 0, &[]).unwrap();
        t.join().unwrap().unwrap();
        assert!(dev.queued_interrupts().is_empty());
    }
}
