#![allow(dead_code)]
//! Shared helpers for the engine tests: a chan with its device, and a
//! minimal hand-driven server.

use fuse_core::abi::{self, InHeader, Opcode};
use fuse_core::{Args, Chan, ChanConfig, Device, Negotiated};
use std::time::{Duration, Instant};
use zerocopy::FromBytes;

pub fn negotiated(max_background: u32) -> Negotiated {
    Negotiated::with_max_background(max_background)
}

/// A connection already initialized with `max_background`.
pub fn chan(max_background: u32) -> (Chan, Device) {
    let chan = Chan::new(ChanConfig {
        spawn_scanner: false,
        ..Default::default()
    });
    chan.set_initialized(negotiated(max_background));
    let dev = chan.device().unwrap();
    (chan, dev)
}

pub fn buf(dev: &Device) -> Vec<u8> {
    vec![0u8; dev.min_read_buffer().max(256 * 1024)]
}

/// Reads one message; returns its header and body.
pub fn read(dev: &Device) -> (InHeader, Vec<u8>) {
    let mut b = buf(dev);
    let n = dev.read(&mut b).unwrap();
    let (h, _) = InHeader::read_from_prefix(&b[..n]).unwrap();
    (h, b[std::mem::size_of::<InHeader>()..n].to_vec())
}

pub fn try_read(dev: &Device) -> Option<(InHeader, Vec<u8>)> {
    let mut b = buf(dev);
    let n = dev.try_read(&mut b).ok()?;
    let (h, _) = InHeader::read_from_prefix(&b[..n]).unwrap();
    Some((h, b[std::mem::size_of::<InHeader>()..n].to_vec()))
}

pub fn reply(
    dev: &Device,
    unique: u64,
    error: i32,
    payload: &[u8],
) -> Result<usize, fuse_core::Errno> {
    dev.write(&abi::encode::reply(unique, error, payload))
}

/// A background-style request with no reply payload.
pub fn noop(nodeid: u64) -> Args {
    Args::new(Opcode::Getattr, nodeid)
}

/// Polls `cond` until true (panics after 10 s: a hang is a failure).
pub fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out waiting for: {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}
