//! The device in front of a misbehaving backend (fault injection with
//! `fuse_core::server::faults::Faulty`): a hung READ is answered EIO at the
//! device's timeout and given up on in the backend (the hang ends with the
//! interrupt), while other requests go on being served; an injected error
//! reaches the guest as such.

mod common;

use common::*;
use fuse_core::abi::{GetattrIn, Opcode, ReadIn};
use fuse_core::server::faults::{FaultPlan, Faulty};
use fuse_core::testing::memfs::MemFs;
use fuse_core::Errno;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use virtio_fs::DeviceConfig;
use zerocopy::{FromZeros, IntoBytes};

fn device(spec: &str, timeout: Duration) -> Arc<Harness<Faulty<MemFs>>> {
    let plan = FaultPlan::parse(spec, 3).unwrap();
    Arc::new(Harness::new(
        Faulty::new(MemFs::new(), plan),
        DeviceConfig {
            request_timeout: timeout,
            workers_per_queue: 2,
            ..DeviceConfig::default()
        },
    ))
}

fn read(unique: u64) -> Vec<u8> {
    request(
        Opcode::Read,
        unique,
        ReadIn {
            size: 100,
            ..ReadIn::new_zeroed()
        }
        .as_bytes(),
    )
}

fn getattr(unique: u64) -> Vec<u8> {
    request(Opcode::Getattr, unique, GetattrIn::new_zeroed().as_bytes())
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

/// Releases every hang when dropped (before the harness).
struct Release(Arc<Harness<Faulty<MemFs>>>);
impl Drop for Release {
    fn drop(&mut self) {
        self.0.dev.engine().fs().release_hangs();
    }
}

#[test]
fn a_hung_read_times_out_with_eio_and_the_queue_keeps_moving() {
    let h = device("read:hang", Duration::from_millis(500));
    let _r = Release(h.clone());
    let vring = h.vring();
    let (a, ra, next, at) = h.chain(0, DATA, &read(1), 4096);
    let (b, rb, _, _) = h.chain(next, at, &getattr(2), 4096);
    h.publish(&[a, b]);
    let t = Instant::now();
    h.kick(&vring, 1);
    wait_for("the GETATTR", || h.reply(rb).unique == 2);
    assert_eq!(h.reply(rb).error, 0);
    let fs = h.dev.engine().fs();
    wait_for("the READ to hang", || {
        fs.counts().hangs.load(Ordering::SeqCst) == 1
    });
    wait_for("the timeout", || h.used_idx() == 2);
    assert!(t.elapsed() >= Duration::from_millis(500));
    assert_eq!(
        (h.reply(ra).unique, h.reply(ra).error),
        (1, Errno::EIO.to_wire())
    );
    assert_eq!(h.dev.stats().timeouts(), 1);
    // The device gave up on it in the backend: the hang ended with the
    // interrupt, not with a release.
    wait_for("the interrupt", || {
        fs.counts().hangs_interrupted.load(Ordering::SeqCst) == 1
    });
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(h.used_idx(), 2, "a late answer reached the guest");
}

#[test]
fn an_injected_error_reaches_the_guest() {
    let h = device("getattr:error=ENOSPC:after=1", Duration::ZERO);
    let vring = h.vring();
    let (a, ra, next, at) = h.chain(0, DATA, &getattr(1), 4096);
    h.publish(&[a]);
    h.kick(&vring, 1);
    wait_for("the first GETATTR", || h.used_idx() == 1);
    assert_eq!(h.reply(ra).error, 0);
    let (b, rb, _, _) = h.chain(next, at, &getattr(2), 4096);
    h.publish(&[a, b]);
    h.kick(&vring, 1);
    wait_for("the second GETATTR", || h.used_idx() == 2);
    assert_eq!((h.reply(rb).unique, h.reply(rb).error), (2, -28));
    assert_eq!(
        h.dev.engine().fs().counts().errors.load(Ordering::SeqCst),
        1
    );
}
