//! The device's rounds: what a round's serve holds back while a request
//! served in line hangs.

mod common;

use common::*;
use fuse_core::abi::{InHeader, Opcode, ReadIn};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use virtio_fs::DeviceConfig;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

fn read(unique: u64, uid: u32) -> Vec<u8> {
    let r = ReadIn {
        size: 512,
        ..ReadIn::new_zeroed()
    };
    request_as(Opcode::Read, unique, uid, r.as_bytes())
}

fn inline() -> DeviceConfig {
    DeviceConfig {
        inline_per_batch: usize::MAX,
        workers_per_queue: 2,
        ..DeviceConfig::default()
    }
}

#[test]
fn a_read_answered_in_line_is_not_held_behind_the_next_read_that_hangs() {
    let fs = HangFs::default();
    let h = Arc::new(Harness::new(fs.clone(), inline()));
    let _release = ReleaseOnDrop(fs.release.clone());
    let vring = h.vring();
    let (a, ra, next, at) = h.chain(0, DATA, &read(1, 0), 4096);
    let (b, _, _, _) = h.chain(next, at, &read(2, 4242), 4096);
    h.publish(&[a, b]);
    let (h2, v2) = (h.clone(), vring.clone());
    let kicker = std::thread::spawn(move || h2.kick(&v2, 1));
    wait_for("B to hang in line", || fs.hung.load(Ordering::SeqCst) == 1);
    let answered = within(Duration::from_secs(2), || h.used_idx() >= 1);
    fs.release.store(true, Ordering::SeqCst);
    kicker.join().unwrap();
    wait_for("both, after the release", || h.used_idx() == 2);
    assert!(
        answered,
        "A (answered in line before B hung) was not in the used ring 2 s later"
    );
    assert_eq!(h.reply(ra).unique, 1);
}

#[test]
fn a_refused_chain_popped_with_one_that_hangs_in_line_is_answered_meanwhile() {
    let fs = HangFs::default();
    let h = Arc::new(Harness::new(fs.clone(), inline()));
    let _release = ReleaseOnDrop(fs.release.clone());
    let vring = h.vring();
    let (a, _, next, at) = h.chain(0, DATA, &getattr(1, 4242), 4096);
    // B's header says 8 bytes more than its chain has: prepare refuses it.
    let mut bad = getattr(2, 0);
    let mut hdr = InHeader::read_from_prefix(&bad).unwrap().0;
    hdr.len += 8;
    bad[..40].copy_from_slice(hdr.as_bytes());
    let (b, rb, _, _) = h.chain(next, at, &bad, 4096);
    h.publish(&[a, b]);
    let (h2, v2) = (h.clone(), vring.clone());
    let kicker = std::thread::spawn(move || h2.kick(&v2, 1));
    wait_for("A to hang in line", || fs.hung.load(Ordering::SeqCst) == 1);
    let answered = within(Duration::from_secs(2), || h.used_idx() >= 1);
    fs.release.store(true, Ordering::SeqCst);
    kicker.join().unwrap();
    wait_for("both, after the release", || h.used_idx() == 2);
    assert!(answered, "B (refused) was not answered while A hung");
    assert_eq!((h.reply(rb).unique, h.reply(rb).error), (2, -libc::EIO));
}

#[test]
fn a_malformed_chain_is_not_published_after_its_vring_was_stopped() {
    let fs = HangFs::default();
    let h = Arc::new(Harness::new(
        fs.clone(),
        DeviceConfig {
            vring_stop_drain: Duration::from_millis(50),
            ..inline()
        },
    ));
    let _release = ReleaseOnDrop(fs.release.clone());
    let vring = h.vring();
    let (a, _, next, _) = h.chain(0, DATA, &getattr(1, 4242), 4096);
    // B points outside guest memory: Chain::parse refuses it.
    h.desc(next, MEM + 0x1000, 64, 0, 0);
    h.publish(&[a, next]);
    let (h2, v2) = (h.clone(), vring.clone());
    let kicker = std::thread::spawn(move || h2.kick(&v2, 1));
    wait_for("A to hang in line", || fs.hung.load(Ordering::SeqCst) == 1);
    // Time for the watchdog to see the thread stuck.
    std::thread::sleep(Duration::from_millis(100));
    // GET_VRING_BASE: the frontend takes the vring back.
    vhost_user_backend::VhostUserBackend::stop_vring(&h.dev, 1).unwrap();
    let at_stop = h.used_idx();
    fs.release.store(true, Ordering::SeqCst);
    kicker.join().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        h.used_idx(),
        at_stop,
        "a used entry was added to the vring after its stop returned"
    );
}

#[test]
fn the_latency_of_a_request_served_in_line_counts_its_service_time() {
    let fs = HangFs::default();
    let h = Arc::new(Harness::new(fs.clone(), inline()));
    let _release = ReleaseOnDrop(fs.release.clone());
    let vring = h.vring();
    let (a, _, _, _) = h.chain(0, DATA, &getattr(1, 4242), 4096);
    h.publish(&[a]);
    let (h2, v2) = (h.clone(), vring.clone());
    let kicker = std::thread::spawn(move || h2.kick(&v2, 1));
    wait_for("A to hang in line", || fs.hung.load(Ordering::SeqCst) == 1);
    std::thread::sleep(Duration::from_millis(300));
    fs.release.store(true, Ordering::SeqCst);
    kicker.join().unwrap();
    wait_for("A", || h.used_idx() == 1);
    let report = h.dev.stats().report();
    let line = report
        .lines()
        .find(|l| l.starts_with("Getattr"))
        .unwrap_or_else(|| panic!("no Getattr line in {report}"));
    let max_us: u64 = line
        .split_whitespace()
        .skip_while(|w| *w != "max")
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        max_us >= 300_000,
        "a GETATTR that took 300+ ms in line counted {max_us} us: {line}"
    );
}
