//! Rounds on the vring thread: after a round whose requests were all
//! answered at once with no synchronous host call (READs the page cache
//! held), the next pops up to sixteen chains before serving them; a round
//! with a request served synchronously keeps rounds of one chunk, so the
//! guest hears of its first answers before the rest of its queue is
//! popped. Either way every answer reaches the guest, each chunk's
//! together. The answers given at once are held only across start offers:
//! a request served synchronously finds those before it in the used ring,
//! and a start offer that blocks after all leaves them to the watchdog.

mod common;

use common::*;
use fuse_core::abi::{Attr, Opcode, ReadIn};
use fuse_core::server::{Completions, Ctx, Filesystem, FsResult, IoDone, ReadSink};
use fuse_core::ClientMem;
use std::fs::File;
use std::io::Read;
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use vhost_user_backend::VringT;
use virtio_fs::{DeviceConfig, FsDevice, GuestMmap};
use vm_memory::{Bytes, GuestAddress};
use zerocopy::{FromZeros, IntoBytes};

/// Answers READs at once in `start_read` (as a page-cache hit) and
/// GETATTRs synchronously; records, for each request it serves, how many
/// chains the device had popped beyond it, and for each GETATTR the used
/// ring's index. The READ at `block_at` blocks in `start_read` (a start
/// offer that should not, but does) until `open`.
#[derive(Clone, Default)]
struct Cached {
    dev: Arc<Mutex<Option<FsDevice<Cached>>>>,
    mem: Arc<Mutex<Option<GuestMmap>>>,
    /// Requests served so far.
    served: Arc<Mutex<u64>>,
    /// Chains popped beyond each request as it was served.
    ahead: Arc<Mutex<Vec<u64>>>,
    /// The used index each GETATTR saw.
    used_at_getattr: Arc<Mutex<Vec<u16>>>,
    block_at: Option<u64>,
    blocked: Arc<AtomicBool>,
    open: Arc<AtomicBool>,
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
        let mem = self.mem.lock().unwrap();
        let used: u16 = mem
            .as_ref()
            .unwrap()
            .read_obj(GuestAddress(USED + 2))
            .unwrap();
        self.used_at_getattr.lock().unwrap().push(used);
        dir_attr(ino)
    }

    fn read(&self, _: &Ctx, _: u64, _: u64, off: u64, sink: &mut dyn ReadSink) -> FsResult<usize> {
        // Only the workers read so (after the watchdog took a queue over):
        // the vring thread starts every READ.
        let buf = sink.buffer();
        let n = buf.len();
        buf.copy_from_slice(&data(off, n));
        Ok(n)
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
        mem: &Arc<dyn ClientMem>,
        done: IoDone,
    ) -> Result<(), IoDone> {
        if !mem.begin_io() {
            return Err(done);
        }
        self.note();
        if self.block_at == Some(off) {
            self.blocked.store(true, Ordering::SeqCst);
            while !self.open.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let r = mem.write_at(0, &data(off, len)).map(|()| len);
        mem.end_io();
        out.complete(done, r);
        Ok(())
    }
}

const N: usize = 32;
const LEN: usize = 512;

/// A harness serving `fs` in line in chunks of 4 (none taken for slow),
/// with `N` requests posted: a GETATTR where `getattr(i)`, else a READ of
/// offset `i * 4096`; and an eventfd for its signals. Returns the
/// harness, the reply addresses and the eventfd.
fn post(fs: &Cached, getattr: impl Fn(usize) -> bool) -> (Arc<Harness<Cached>>, Vec<u64>, File) {
    let h = Arc::new(Harness::new(
        fs.clone(),
        DeviceConfig {
            inline_per_batch: usize::MAX,
            submit_batch: 4,
            // No request here is slow, however slow this build runs.
            chunk_time: Duration::from_secs(1),
            ..DeviceConfig::default()
        },
    ));
    *fs.dev.lock().unwrap() = Some(h.dev.clone());
    *fs.mem.lock().unwrap() = Some(h.mem.clone());
    // SAFETY: eventfd has no preconditions; its result is checked before
    // `call` takes ownership of it.
    let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK) };
    assert!(efd >= 0, "eventfd: {}", std::io::Error::last_os_error());
    // SAFETY: `efd` is a new fd that nothing else owns.
    let call = unsafe { File::from_raw_fd(efd) };
    let (mut d, mut at) = (0u16, DATA);
    let (mut heads, mut replies) = (Vec::new(), Vec::new());
    for i in 0..N {
        let unique = 100 + i as u64;
        let msg = if getattr(i) {
            request(Opcode::Getattr, unique, &[0u8; 16])
        } else {
            let body = ReadIn {
                offset: i as u64 * 4096,
                size: LEN as u32,
                ..ReadIn::new_zeroed()
            };
            request(Opcode::Read, unique, body.as_bytes())
        };
        let (head, reply, next_d, next_at) = h.chain(d, at, &msg, 16 + 4096);
        heads.push(head);
        replies.push(reply);
        (d, at) = (next_d, (next_at + 63) & !63);
    }
    h.publish(&heads);
    (h, replies, call)
}

/// Checks every answer: each READ's data, each GETATTR's success.
fn check_answers(h: &Harness<Cached>, replies: &[u64], getattr: impl Fn(usize) -> bool) {
    assert_eq!(h.used_idx(), N as u16, "every request answered");
    for (i, reply) in replies.iter().enumerate() {
        let r = h.reply(*reply);
        assert_eq!((r.unique, r.error), (100 + i as u64, 0), "request {i}");
        if !getattr(i) {
            assert_eq!(r.len, 16 + LEN as u32);
            let mut got = vec![0u8; LEN];
            h.mem
                .read_slice(&mut got, GuestAddress(reply + 16))
                .unwrap();
            assert_eq!(got, data(i as u64 * 4096, LEN), "READ {i}");
        }
    }
}

/// Runs `f` until it returns Some, at most three times: None says the
/// watchdog took the queue over (the thread seemed stuck for 20 ms: a
/// preemption on a loaded machine), which changes the rounds.
fn unless_taken_over<T>(f: impl Fn() -> Option<T>) -> T {
    (0..3)
        .find_map(|_| f())
        .expect("the watchdog took the queue over in three runs")
}

fn taken_over(h: &Harness<Cached>) -> bool {
    h.dev.stats().queues()[1].takeovers() > 0
}

/// One kick of `N` requests (READs, or GETATTRs when `getattr`); checks
/// every answer and that the guest was signalled once per chunk; returns
/// how many chains were popped beyond each request as it was served.
fn kick(getattr: bool) -> Vec<u64> {
    unless_taken_over(|| {
        let fs = Cached::default();
        let (h, replies, call) = post(&fs, |_| getattr);
        let vring = h.vring();
        vring.set_call(Some(call.try_clone().unwrap()));
        h.kick(&vring, 1);
        check_answers(&h, &replies, |_| getattr);
        // The device holds the filesystem: let it go.
        fs.dev.lock().unwrap().take();
        if taken_over(&h) {
            return None;
        }
        // An eventfd reads as the number of signals since the last read.
        let mut signals = [0u8; 8];
        (&call).read_exact(&mut signals).unwrap();
        assert_eq!(
            u64::from_ne_bytes(signals),
            N as u64 / 4,
            "one signal per chunk"
        );
        let ahead = fs.ahead.lock().unwrap().clone();
        assert_eq!(ahead.len(), N);
        Some(ahead)
    })
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

#[test]
fn a_request_served_synchronously_finds_the_answers_before_it_given() {
    // Round 1: READs 0-3 (quick); round 2 pops 16: READs 4 and 5 answered
    // at once and held, then the GETATTR (6), served synchronously.
    const G: usize = 6;
    let (fs, ahead) = unless_taken_over(|| {
        let fs = Cached::default();
        let (h, replies, _call) = post(&fs, |i| i == G);
        let vring = h.vring();
        h.kick(&vring, 1);
        check_answers(&h, &replies, |i| i == G);
        fs.dev.lock().unwrap().take();
        let ahead = fs.ahead.lock().unwrap().clone();
        (!taken_over(&h)).then_some((fs, ahead))
    });
    assert_eq!(*fs.used_at_getattr.lock().unwrap(), [G as u16]);
    assert!(ahead[4] >= 12, "round 2 was not a quick one's: {ahead:?}");
    // Round 2 had a synchronous request: round 3 (from request 20) is one
    // chunk (and quick: round 4 pops more again).
    assert!(ahead[20..24].iter().all(|&a| a <= 3), "{ahead:?}");
    assert!(ahead[24] >= 4, "{ahead:?}");
}

#[test]
fn answers_held_when_a_start_offer_blocks_are_given_by_the_watchdog() {
    // READs 4 and 5 answered at once and held; READ 6 blocks in its start
    // offer: the watchdog commits 4 and 5 (READs 0-3 went with round 1).
    unless_taken_over(held_answers_given_by_the_watchdog);
}

/// [`answers_held_when_a_start_offer_blocks_are_given_by_the_watchdog`];
/// None if the watchdog took the queue over before READ 6 blocked (then
/// a worker read it).
fn held_answers_given_by_the_watchdog() -> Option<()> {
    let fs = Cached {
        block_at: Some(6 * 4096),
        ..Cached::default()
    };
    let (h, replies, _call) = post(&fs, |_| false);
    let vring = h.vring();
    let (h2, v2) = (h.clone(), vring.clone());
    let kicker = std::thread::spawn(move || h2.kick(&v2, 1));
    wait_for("READ 6 to block, or every answer", || {
        fs.blocked.load(Ordering::SeqCst) || h.used_idx() == N as u16
    });
    if !fs.blocked.load(Ordering::SeqCst) {
        kicker.join().unwrap();
        fs.dev.lock().unwrap().take();
        return None;
    }
    // (The workers answer what the watchdog hands them meanwhile: READs
    // 4 and 5 are looked for by their own replies.)
    let given = |i: usize| h.reply(replies[i]).unique == 100 + i as u64;
    let both = within(Duration::from_secs(2), || given(4) && given(5));
    fs.open.store(true, Ordering::SeqCst);
    kicker.join().unwrap();
    assert!(
        both,
        "READs 4 and 5, held when READ 6 blocked, were not given"
    );
    wait_for("every answer", || h.used_idx() == N as u16);
    check_answers(&h, &replies, |_| false);
    fs.dev.lock().unwrap().take();
    Some(())
}
