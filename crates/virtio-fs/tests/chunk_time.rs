//! `DeviceConfig::chunk_time` (CLI `--chunk-time-us`, up to 1 s) against
//! the watchdog: a vring thread serving a chunk of requests in line, each
//! well under the watchdog's 20 ms "stuck" bound, is not stuck, whatever
//! the chunk time.

mod common;

use common::*;
use fuse_core::abi::{Attr, GetattrIn, Opcode};
use fuse_core::server::{Ctx, Filesystem, FsResult};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use virtio_fs::DeviceConfig;
use zerocopy::{FromZeros, IntoBytes};

/// How long each GETATTR takes: well under the watchdog's 20 ms.
const EACH: Duration = Duration::from_millis(3);
/// Requests in the one kick (one chunk: `submit_batch` is as large).
const N: u16 = 16;

/// GETATTR that takes [`EACH`].
#[derive(Clone, Default)]
struct Slowish {
    served: Arc<AtomicUsize>,
}

impl Filesystem for Slowish {
    type Inode = u64;
    type Handle = u64;
    type Io = ();

    fn new_io(&self, _: fuse_core::server::Wake) {}
    fn getattr(&self, _ctx: &Ctx, ino: u64, _fh: Option<u64>) -> FsResult<(Attr, Duration)> {
        std::thread::sleep(EACH);
        self.served.fetch_add(1, Ordering::SeqCst);
        Ok((
            Attr {
                ino,
                mode: libc::S_IFDIR | 0o755,
                nlink: 2,
                ..Attr::new_zeroed()
            },
            Duration::ZERO,
        ))
    }
}

/// Serves `N` GETATTRs of `EACH` in line in one kick with `chunk_time`;
/// returns the watchdog's takeovers of the queue.
fn takeovers_with(chunk_time: Duration) -> u64 {
    let fs = Slowish::default();
    let h = Harness::new(
        fs.clone(),
        DeviceConfig {
            inline_per_batch: usize::MAX,
            workers_per_queue: 2,
            submit_batch: usize::from(N),
            chunk_time,
            ..DeviceConfig::default()
        },
    );
    let vring = h.vring();
    let (mut first, mut at) = (0u16, DATA);
    let mut heads = Vec::new();
    let mut replies = Vec::new();
    for i in 0..N {
        let msg = request(
            Opcode::Getattr,
            u64::from(i) + 1,
            GetattrIn::new_zeroed().as_bytes(),
        );
        let (head, r, next, next_at) = h.chain(first, at, &msg, 4096);
        heads.push(head);
        replies.push(r);
        (first, at) = (next, next_at);
    }
    h.publish(&heads);
    h.kick(&vring, 1);
    let t = Instant::now();
    while h.used_idx() < N {
        assert!(t.elapsed() < Duration::from_secs(10), "answers");
        std::thread::sleep(Duration::from_millis(2));
    }
    for (i, r) in replies.iter().enumerate() {
        assert_eq!((h.reply(*r).unique, h.reply(*r).error), (i as u64 + 1, 0));
    }
    assert_eq!(fs.served.load(Ordering::SeqCst), usize::from(N));
    h.dev.stats().queues[1].takeovers.load(Ordering::SeqCst)
}

/// The default chunk time: no takeover (each request is its own chunk
/// once the first took longer than 50 µs).
#[test]
fn a_busy_vring_thread_is_not_taken_over_with_the_default_chunk_time() {
    assert_eq!(takeovers_with(DeviceConfig::default().chunk_time), 0);
}

/// A long chunk time (as `benches/callgrind-op.sh` sets, or anything up to
/// the CLI's 1 s): no request ran 20 ms, so the watchdog has nothing to
/// take over either.
#[test]
fn a_busy_vring_thread_is_not_taken_over_with_a_long_chunk_time() {
    assert_eq!(takeovers_with(Duration::from_secs(1)), 0);
}
