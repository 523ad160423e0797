//! The watchdog against a vring thread serving in line the requests its
//! entries got after its `inline_per_batch` was reached (the drain's last
//! `serve_inline`, after `submit_requests`): each request well under the
//! watchdog's 20 ms "stuck" bound, so the thread is not stuck.

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
/// Requests served in the kick's chunks (`inline_per_batch`).
const K: u16 = 16;
/// Requests in the one kick: the `K` after the first `K` go to this
/// thread's entries (preferred while it submits) and are served after the
/// submit.
const N: u16 = 2 * K;

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

/// Serves `N` GETATTRs of `EACH` in one kick with `chunk_time`; returns
/// the watchdog's takeovers of the queue and the requests served in line.
fn takeovers_with(chunk_time: Duration) -> (u64, u64) {
    let fs = Slowish::default();
    let h = Harness::new(
        fs.clone(),
        DeviceConfig {
            inline_per_batch: usize::from(K),
            workers_per_queue: 2,
            submit_batch: usize::from(K),
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
    let q = &h.dev.stats().queues[1];
    (
        q.takeovers.load(Ordering::SeqCst),
        q.inline.load(Ordering::SeqCst),
    )
}

/// No request ran 20 ms: nothing to take over, whether the requests were
/// served in the kick's chunks or after its submit.
#[test]
fn requests_served_in_line_after_the_submit_are_not_taken_for_stuck() {
    let (takeovers, inline) = takeovers_with(DeviceConfig::default().chunk_time);
    assert_eq!(takeovers, 0, "{inline} served in line");
}

/// The same with a long chunk time (the kick's first `K` in one chunk).
#[test]
fn requests_served_in_line_after_the_submit_are_not_taken_for_stuck_long_chunks() {
    let (takeovers, inline) = takeovers_with(Duration::from_secs(1));
    assert_eq!(takeovers, 0, "{inline} served in line");
}
