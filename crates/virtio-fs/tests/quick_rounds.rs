//! Rounds on the vring thread: after a round whose requests were all
//! answered at once with no synchronous host call (READs the page cache
//! held), the next pops up to sixteen chains before serving them; a round
//! with a request served synchronously keeps rounds of one chunk, so the
//! guest hears of its first answers before the rest of its queue is
//! popped. Either way every answer reaches the guest, each chunk's
//! together.

mod common;

use common::*;
use fuse_core::abi::{Attr, Opcode, ReadIn};
use fuse_core::server::{Completions, Ctx, Filesystem, FsResult, IoDone, ReadSink};
use fuse_core::{ClientMem, Errno};
use std::fs::File;
use std::io::Read;
use std::os::fd::FromRawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use vhost_user_backend::VringT;
use virtio_fs::{DeviceConfig, FsDevice};
use zerocopy::{FromZeros, IntoBytes};

/// Answers READs at once in `start_read` (as a page-cache hit) and
/// GETATTRs synchronously; records, for each request it serves, how many
/// chains the device had popped beyond it.
#[derive(Clone, Default)]
struct Cached {
    dev: Arc<Mutex<Option<FsDevice<Cached>>>>,
    /// Requests served so far.
    served: Arc<Mutex<u64>>,
    /// Chains popped beyond each request as it was served.
    ahead: Arc<Mutex<Vec<u64>>>,
}

impl Cached {
    fn note(&self) {
        let mut served = self.served.lock().unwrap();
        *served += 1;
        let dev = self.dev.lock().unwrap();
        let popped = dev.as_ref().unwrap().stats().queues()[1].submitted();
        self.ahead.lock().unwrap().push(popped - *served);
    }
}

fn data(off: u64, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (off as usize / 4096 * 7 + i) as u8)
        .collect()
}

impl Filesystem for Cached {
    type Inode = u64;
    type Handle = u64;
    type Io = ();

    fn new_io(&self, _: fuse_core::server::Wake) {}

    fn getattr(&self, _: &Ctx, ino: u64, _: Option<u64>) -> FsResult<(Attr, Duration)> {
        self.note();
        dir_attr(ino)
    }

    fn read(&self, _: &Ctx, _: u64, _: u64, _: u64, _: &mut dyn ReadSink) -> FsResult<usize> {
        // Every READ here is started.
        Err(Errno::EPROTO)
    }

    fn start_read(
        &self,
        _: &mut (),
        out: &mut Completions,
        _: &Ctx,
        _: u64,
        _: u64,
        off: u64,
        len: usize,
        mem: Arc<dyn ClientMem>,
        done: IoDone,
    ) -> Result<(), IoDone> {
        if !mem.begin_io() {
            return Err(done);
        }
        self.note();
        let r = mem.write_at(0, &data(off, len)).map(|()| len);
        mem.end_io();
        out.complete(done, r);
        Ok(())
    }
}

const N: usize = 32;
const LEN: usize = 512;

/// One kick of `N` requests (READs, or GETATTRs when `getattr`), served in
/// line in chunks of 4 (none taken for slow); checks every answer and
/// that the guest was signalled once per chunk; returns how many chains
/// were popped beyond each request as it was served.
fn kick(getattr: bool) -> Vec<u64> {
    let fs = Cached::default();
    let h = Harness::new(
        fs.clone(),
        DeviceConfig {
            inline_per_batch: usize::MAX,
            submit_batch: 4,
            // No request here is slow, however slow this build runs.
            chunk_time: Duration::from_secs(1),
            ..DeviceConfig::default()
        },
    );
    *fs.dev.lock().unwrap() = Some(h.dev.clone());
    let vring = h.vring();
    // SAFETY: eventfd makes a new fd, owned by `call` from here on.
    let call = unsafe { File::from_raw_fd(libc::eventfd(0, libc::EFD_NONBLOCK)) };
    vring.set_call(Some(call.try_clone().unwrap()));
    let (mut d, mut at) = (0u16, DATA);
    let (mut heads, mut replies) = (Vec::new(), Vec::new());
    for i in 0..N as u64 {
        let msg = if getattr {
            request(Opcode::Getattr, 100 + i, &[0u8; 16])
        } else {
            let body = ReadIn {
                offset: i * 4096,
                size: LEN as u32,
                ..ReadIn::new_zeroed()
            };
            request(Opcode::Read, 100 + i, body.as_bytes())
        };
        let (head, reply, next_d, next_at) = h.chain(d, at, &msg, 16 + 4096);
        heads.push(head);
        replies.push(reply);
        (d, at) = (next_d, (next_at + 63) & !63);
    }
    h.publish(&heads);
    h.kick(&vring, 1);
    assert_eq!(h.used_idx(), N as u16, "every request answered");
    for (i, reply) in replies.iter().enumerate() {
        let r = h.reply(*reply);
        assert_eq!((r.unique, r.error), (100 + i as u64, 0), "request {i}");
        if !getattr {
            assert_eq!(r.len, 16 + LEN as u32);
            let mut got = vec![0u8; LEN];
            vm_memory::Bytes::read_slice(&h.mem, &mut got, vm_memory::GuestAddress(reply + 16))
                .unwrap();
            assert_eq!(got, data(i as u64 * 4096, LEN), "READ {i}");
        }
    }
    // An eventfd reads as the number of signals since the last read.
    let mut signals = [0u8; 8];
    (&call).read_exact(&mut signals).unwrap();
    assert_eq!(
        u64::from_ne_bytes(signals),
        N as u64 / 4,
        "one signal per chunk"
    );
    // The device holds the filesystem: let it go.
    fs.dev.lock().unwrap().take();
    let ahead = fs.ahead.lock().unwrap().clone();
    assert_eq!(ahead.len(), N);
    ahead
}

#[test]
fn cached_reads_are_popped_sixteen_at_a_time_after_a_quick_round() {
    let ahead = kick(false);
    // The first round is one chunk; it was quick, so the next pops more.
    assert!(ahead[..4].iter().all(|&a| a <= 3), "{ahead:?}");
    assert!(
        ahead.iter().any(|&a| a >= 12),
        "no round popped more than one chunk: {ahead:?}"
    );
}

#[test]
fn requests_served_synchronously_keep_rounds_of_one_chunk() {
    let ahead = kick(true);
    assert!(ahead.iter().all(|&a| a <= 3), "{ahead:?}");
}
