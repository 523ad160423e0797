//! READs started without waiting (`Filesystem::start_read`): one kick of a
//! request queue puts every READ the guest posted in flight at once, from
//! the queue's one thread, before any of them completes; each is answered
//! when the filesystem reports it done, in the order it completes.

mod common;

use common::*;
use fuse_core::abi::{Opcode, ReadIn};
use fuse_core::server::{Ctx, Filesystem, FsResult, IoDone, ReadSink};
use fuse_core::{ClientMem, Errno};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use virtio_fs::DeviceConfig;
use zerocopy::{FromZeros, IntoBytes};

/// A READ the filesystem started and has not reported yet.
struct Held {
    off: u64,
    len: usize,
    mem: Arc<dyn ClientMem>,
    done: IoDone,
}

/// Starts every READ and completes none until `submit_started` saw them all
/// (`want` of them): then completes them in reverse order.
#[derive(Clone, Default)]
struct Gate {
    held: Arc<Mutex<Vec<Held>>>,
    /// The threads that started READs.
    threads: Arc<Mutex<Vec<ThreadId>>>,
    /// READs in flight at each `submit_started`.
    submits: Arc<Mutex<Vec<usize>>>,
    want: usize,
}

fn data(off: u64, n: usize) -> Vec<u8> {
    (0..n).map(|i| (off as usize * 31 + i) as u8).collect()
}

impl Filesystem for Gate {
    type Inode = u64;
    type Handle = u64;
    type Io = ();

    fn new_io(&self, _: fuse_core::server::Wake) {}

    fn read(&self, _: &Ctx, _: u64, _: u64, _: u64, _: &mut dyn ReadSink) -> FsResult<usize> {
        // Every READ here must have been started.
        Err(Errno::EPROTO)
    }

    fn start_read(
        &self,
        _: &mut (),
        _: &mut fuse_core::server::Completions,
        _: &Ctx,
        _: u64,
        _: u64,
        off: u64,
        len: usize,
        mem: &Arc<dyn ClientMem>,
        done: IoDone,
    ) -> Result<(), IoDone> {
        if !mem.begin_io() {
            return Err(done);
        }
        self.threads
            .lock()
            .unwrap()
            .push(std::thread::current().id());
        self.held.lock().unwrap().push(Held {
            off,
            len,
            mem: mem.clone(),
            done,
        });
        Ok(())
    }

    fn submit_started(&self, _: &mut ()) {
        let n = self.held.lock().unwrap().len();
        self.submits.lock().unwrap().push(n);
    }

    fn collect_started(&self, _: &mut (), out: &mut fuse_core::server::Completions) -> usize {
        let mut held = self.held.lock().unwrap();
        if held.len() < self.want {
            return 0;
        }
        let all: Vec<Held> = held.drain(..).rev().collect();
        drop(held);
        let n = all.len();
        for h in all {
            let r = h.mem.write_at(0, &data(h.off, h.len)).map(|()| h.len);
            h.mem.end_io();
            out.complete(h.done, r);
        }
        n
    }

    fn started_in_flight(&self, _: &()) -> usize {
        self.held.lock().unwrap().len()
    }
}

#[test]
fn one_kick_puts_sixteen_reads_in_flight_from_the_queue_thread() {
    let submits = sixteen_reads(usize::MAX);
    assert_eq!(
        submits.first(),
        Some(&16),
        "one submit for the batch: {submits:?}"
    );
}

#[test]
fn a_kick_is_submitted_in_chunks_of_submit_batch() {
    // Each chunk goes in as soon as it is started (what completed is
    // answered before the next chunk is popped); all sixteen are still in
    // flight together.
    let submits = sixteen_reads(4);
    assert_eq!(&submits[..4], &[4, 8, 12, 16], "{submits:?}");
}

/// Sixteen READs in one kick, on a filesystem that completes none before
/// all sixteen were started; returns how many were started at each submit.
fn sixteen_reads(submit_batch: usize) -> Vec<usize> {
    const N: usize = 16;
    const LEN: usize = 512;
    let fs = Gate {
        want: N,
        ..Gate::default()
    };
    let h = Harness::new(
        fs.clone(),
        DeviceConfig {
            inline_per_batch: usize::MAX,
            submit_batch,
            ..DeviceConfig::default()
        },
    );
    let vring = h.vring();
    let (mut d, mut at) = (0u16, DATA);
    let mut heads = Vec::new();
    let mut replies = Vec::new();
    for i in 0..N as u64 {
        let body = ReadIn {
            offset: i * 4096,
            size: LEN as u32,
            ..ReadIn::new_zeroed()
        };
        let msg = request(Opcode::Read, 100 + i, body.as_bytes());
        let (head, reply, next_d, next_at) = h.chain(d, at, &msg, 16 + LEN as u32);
        heads.push(head);
        replies.push(reply);
        (d, at) = (next_d, (next_at + 63) & !63);
    }
    h.publish(&heads);
    // One kick, served on this thread (the vring thread's role).
    h.kick(&vring, 1);

    // All sixteen were started before the first submit, from this thread
    // only, and none completed before all were in flight.
    let threads = fs.threads.lock().unwrap().clone();
    assert_eq!(threads.len(), N, "every READ was started");
    assert!(threads.iter().all(|t| *t == std::thread::current().id()));
    let submits = fs.submits.lock().unwrap().clone();
    // Completed in reverse order, each answered with its own data.
    assert_eq!(h.used_idx(), N as u16);
    for (i, reply) in replies.iter().enumerate() {
        let r = h.reply(*reply);
        assert_eq!(
            (r.unique, r.error, r.len),
            (100 + i as u64, 0, 16 + LEN as u32)
        );
        let mut got = vec![0u8; LEN];
        vm_memory::Bytes::read_slice(&h.mem, &mut got, vm_memory::GuestAddress(reply + 16))
            .unwrap();
        assert_eq!(got, data(i as u64 * 4096, LEN), "READ {i}");
    }
    let first_used: u32 =
        vm_memory::Bytes::read_obj(&h.mem, vm_memory::GuestAddress(USED + 4)).unwrap();
    assert_eq!(
        u16::try_from(first_used).unwrap(),
        heads[N - 1],
        "the last READ completed first and was answered first"
    );
    submits
}
