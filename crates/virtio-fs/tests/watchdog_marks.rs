//! The watchdog against a vring thread serving in line requests that each
//! take well under its 20 ms "stuck" bound: the thread is not stuck,
//! whether it serves them in a kick's chunks (with any
//! `DeviceConfig::chunk_time`, CLI `--chunk-time-us` up to 1 s), after its
//! `inline_per_batch` was reached (the drain's last `serve_inline`, after
//! `submit_requests`), or as the rest of a chunk served by
//! `complete_inline` inside the chunk loop (once `submit_batch` READs were
//! started).

mod common;

use common::*;
use fuse_core::abi::{Attr, GetattrIn, Opcode, ReadIn};
use fuse_core::server::{Completions, Ctx, Filesystem, FsResult, IoDone, ReadSink};
use fuse_core::{ClientMem, Errno};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use virtio_fs::DeviceConfig;
use zerocopy::{FromZeros, IntoBytes};

/// How long each GETATTR takes: well under the watchdog's 20 ms.
const EACH: Duration = Duration::from_millis(3);
/// `submit_batch`, and `inline_per_batch` where it is not all.
const K: u16 = 16;

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
        dir_attr(ino)
    }
}

/// Serves `n` GETATTRs of `EACH` in one kick with `inline_per_batch` and
/// `chunk_time`; returns the watchdog's takeovers of the queue and the
/// requests served in line.
fn takeovers_with(inline_per_batch: usize, n: u16, chunk_time: Duration) -> (u64, u64) {
    let fs = Slowish::default();
    let h = Harness::new(
        fs.clone(),
        DeviceConfig {
            inline_per_batch,
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
    for i in 0..n {
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
    while h.used_idx() < n {
        assert!(t.elapsed() < Duration::from_secs(10), "answers");
        std::thread::sleep(Duration::from_millis(2));
    }
    for (i, r) in replies.iter().enumerate() {
        assert_eq!((h.reply(*r).unique, h.reply(*r).error), (i as u64 + 1, 0));
    }
    assert_eq!(fs.served.load(Ordering::SeqCst), usize::from(n));
    let q = &h.dev.stats().queues()[1];
    (q.takeovers(), q.inline())
}

/// One kick of `K` served in line, the default chunk time: no takeover
/// (each request is its own chunk once the first took over 50 µs).
#[test]
fn a_busy_vring_thread_is_not_taken_over_with_the_default_chunk_time() {
    let (takeovers, inline) = takeovers_with(usize::MAX, K, DeviceConfig::default().chunk_time);
    assert_eq!(takeovers, 0, "{inline} served in line");
}

/// The same with a long chunk time (the whole kick one chunk, as
/// `benches/callgrind-op.sh` runs it, or anything up to the CLI's 1 s).
#[test]
fn a_busy_vring_thread_is_not_taken_over_with_a_long_chunk_time() {
    let (takeovers, inline) = takeovers_with(usize::MAX, K, Duration::from_secs(1));
    assert_eq!(takeovers, 0, "{inline} served in line");
}

/// A kick of `2 K`: the `K` after the first `K` go to this thread's
/// entries (preferred while it submits) and are served after the submit.
/// No request ran 20 ms: nothing to take over.
#[test]
fn requests_served_in_line_after_the_submit_are_not_taken_for_stuck() {
    let chunk = DeviceConfig::default().chunk_time;
    let (takeovers, inline) = takeovers_with(usize::from(K), 2 * K, chunk);
    assert_eq!(takeovers, 0, "{inline} served in line");
}

/// The same with a long chunk time (the kick's first `K` in one chunk).
#[test]
fn requests_served_in_line_after_the_submit_are_not_taken_for_stuck_long_chunks() {
    let (takeovers, inline) = takeovers_with(usize::from(K), 2 * K, Duration::from_secs(1));
    assert_eq!(takeovers, 0, "{inline} served in line");
}

/// READs started (`start_read`) and completed at the next
/// `collect_started`; GETATTR of an inode from [`SLOW`] on takes [`EACH`].
#[derive(Clone, Default)]
struct QuickReads {
    held: Arc<Mutex<Vec<Held>>>,
    served: Arc<AtomicUsize>,
}

/// A started READ: the guest's buffers and its end.
type Held = (Arc<dyn ClientMem>, IoDone);

/// Inodes whose GETATTR takes [`EACH`].
const SLOW: u64 = 100;
/// Bytes each READ asks for.
const LEN: usize = 4096;

impl Filesystem for QuickReads {
    type Inode = u64;
    type Handle = u64;
    type Io = ();

    fn new_io(&self, _: fuse_core::server::Wake) {}
    fn getattr(&self, _ctx: &Ctx, ino: u64, _fh: Option<u64>) -> FsResult<(Attr, Duration)> {
        if ino >= SLOW {
            std::thread::sleep(EACH);
        }
        self.served.fetch_add(1, Ordering::SeqCst);
        Ok((
            Attr {
                ino,
                mode: libc::S_IFREG | 0o644,
                nlink: 1,
                ..Attr::new_zeroed()
            },
            Duration::ZERO,
        ))
    }
    fn read(&self, _: &Ctx, _: u64, _: u64, _: u64, _: &mut dyn ReadSink) -> FsResult<usize> {
        // Every READ here is started.
        Err(Errno::EPROTO)
    }
    fn start_read(
        &self,
        _: &mut (),
        _: &mut Completions,
        _: &Ctx,
        _: u64,
        _: u64,
        _: u64,
        len: usize,
        mem: &Arc<dyn ClientMem>,
        done: IoDone,
    ) -> Result<(), IoDone> {
        if len != LEN || !mem.begin_io() {
            return Err(done);
        }
        self.held.lock().unwrap().push((mem.clone(), done));
        Ok(())
    }
    fn collect_started(&self, _: &mut (), out: &mut Completions) -> usize {
        let ready: Vec<_> = std::mem::take(&mut *self.held.lock().unwrap());
        let n = ready.len();
        for (mem, done) in ready {
            mem.write_at(0, &[7u8; LEN]).unwrap();
            mem.end_io();
            out.complete(done, Ok(LEN));
            self.served.fetch_add(1, Ordering::SeqCst);
        }
        n
    }
}

/// One kick of two rounds of 16 (`submit_batch`): 10 READs and 6 quick
/// GETATTRs, then 6 READs (the 16th started READ: `complete_inline` in
/// the chunk loop, which serves the rest of the chunk) and 10 GETATTRs of
/// `EACH`. No request ran 20 ms: nothing to take over.
#[test]
fn the_rest_of_a_chunk_served_by_complete_inline_is_not_taken_for_stuck() {
    let fs = QuickReads::default();
    let h = Harness::new(
        fs.clone(),
        DeviceConfig {
            inline_per_batch: usize::MAX,
            workers_per_queue: 2,
            submit_batch: 16,
            chunk_time: Duration::from_secs(1),
            ..DeviceConfig::default()
        },
    );
    let vring = h.vring();
    let (mut first, mut at) = (0u16, DATA);
    let (mut heads, mut replies) = (Vec::new(), Vec::new());
    let kinds = [
        (10, true, 1),
        (6, false, 1),
        (6, true, 1),
        (10, false, SLOW),
    ];
    let mut unique = 0;
    for (count, read, ino) in kinds {
        for _ in 0..count {
            unique += 1;
            let msg = if read {
                let r = ReadIn {
                    fh: 1,
                    offset: 0,
                    size: LEN as u32,
                    ..ReadIn::new_zeroed()
                };
                request(Opcode::Read, unique, r.as_bytes())
            } else {
                request(Opcode::Getattr, unique, GetattrIn::new_zeroed().as_bytes())
            };
            let mut msg = msg;
            // The node id (after len, opcode, unique).
            msg[16..24].copy_from_slice(&ino.to_le_bytes());
            let (head, r, next, next_at) = h.chain(first, at, &msg, 16 + LEN as u32);
            heads.push(head);
            replies.push(r);
            (first, at) = (next, next_at);
        }
    }
    h.publish(&heads);
    h.kick(&vring, 1);
    let t = Instant::now();
    while h.used_idx() < 32 {
        assert!(t.elapsed() < Duration::from_secs(10), "answers");
        std::thread::sleep(Duration::from_millis(2));
    }
    for (i, r) in replies.iter().enumerate() {
        assert_eq!((h.reply(*r).unique, h.reply(*r).error), (i as u64 + 1, 0));
    }
    assert_eq!(fs.served.load(Ordering::SeqCst), 32);
    let q = &h.dev.stats().queues()[1];
    assert_eq!(q.takeovers(), 0, "{} served in line", q.inline());
}
