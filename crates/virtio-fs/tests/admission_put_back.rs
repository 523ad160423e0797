//! A chain put back on the avail ring because admission was full is
//! popped again in the same drain, or the queue is told to resume, even
//! when the slot frees before the stall's second look (`send_round` then
//! finds room and does not stall): nobody kicks for it again. A stress
//! test of that window (the drain must not count such chains as popped).

mod common;

use common::*;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use vhost_user_backend::VringT;
use virtio_fs::DeviceConfig;

fn resume_pending(fd: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no timeout.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

fn wait(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(10), "timed out: {what}");
        std::hint::spin_loop();
    }
}

/// One slot of admission. A (uid 4242) holds it on a worker; B is
/// published and the queue kicked while A is let go, at varying delays,
/// so that A's slot sometimes frees between B's refusal and the stall's
/// second look. Whatever the timing, once A is answered, B must be popped
/// (answered or in flight) or the queue must have been told to resume: a
/// B left in the avail ring with neither is stranded (the guest already
/// kicked for it).
fn run(event_idx: bool, spread: u64) {
    let fs = HangFs {
        spin: true,
        ..HangFs::default()
    };
    let h = Harness::new(
        fs.clone(),
        DeviceConfig {
            max_background: 1,
            congestion_threshold: 1,
            workers_per_queue: 2,
            ..DeviceConfig::default()
        },
    );
    let vring = h.vring();
    if event_idx {
        vhost_user_backend::VhostUserBackend::set_event_idx(&h.dev, true);
        vring.set_queue_event_idx(true);
    }
    let resume = h.dev.resume_fd(0).unwrap();
    let (a, ra, next, at) = h.chain(0, DATA, &getattr(1, 4242), 4096);
    let (b, rb, _, _) = h.chain(next, at, &getattr(2, 0), 4096);
    let mut idx = 0u16;
    let mut used = 0u16;
    let mut stalls_seen = 0u64;
    let mut stranded = None;
    let deadline = Instant::now() + Duration::from_secs(15);
    for i in 0..200_000u64 {
        if Instant::now() > deadline {
            break;
        }
        fs.release.store(false, Ordering::SeqCst);
        let hung = fs.hung.load(Ordering::SeqCst);
        idx = h.publish_from(idx, &[a]);
        h.kick(&vring, 1);
        wait("A on a worker", || fs.hung.load(Ordering::SeqCst) > hung);
        idx = h.publish_from(idx, &[b]);
        // Let A go somewhere before B's pop and send.
        fs.release.store(true, Ordering::SeqCst);
        for _ in 0..(i * 37) % spread {
            std::hint::spin_loop();
        }
        h.kick(&vring, 1);
        used = used.wrapping_add(1);
        wait("A's answer", || h.used_idx().wrapping_sub(used) as i16 >= 0);
        if vring.queue_next_avail() != idx {
            // B is still in the avail ring.
            if resume_pending(resume) {
                stalls_seen += 1;
                h.resume(&vring, 1);
            } else {
                stranded = Some(i);
                break;
            }
        }
        used = used.wrapping_add(1);
        wait("B's answer", || h.used_idx() == used);
        assert_eq!(h.reply(rb).error, 0);
        assert_eq!(h.reply(ra).error, 0);
    }
    fs.release.store(true, Ordering::SeqCst);
    let s = &h.dev.stats().queues()[1];
    eprintln!(
        "stalls {} malformed {} (resumed {stalls_seen}), popped to {}, avail {idx}",
        s.stalls(),
        s.malformed(),
        vring.queue_next_avail()
    );
    if let Some(i) = stranded {
        panic!(
            "iteration {i}: B was put back on full admission, the slot \
             freed before the stall's second look, and the drain returned \
             without popping it again; no resume is pending and the guest \
             will not kick again: B is stranded (avail {idx}, popped to {})",
            vring.queue_next_avail()
        );
    }
}

#[test]
fn a_chain_put_back_when_the_slot_frees_at_once_is_popped_again_without_event_idx() {
    run(false, 4000);
}

#[test]
fn a_chain_put_back_when_the_slot_frees_at_once_is_popped_again_with_event_idx() {
    run(true, 4000);
}
