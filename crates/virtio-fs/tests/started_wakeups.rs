//! What wakes a request queue's vring thread while READs it started are in
//! flight, with the device served over a real vhost-user socket (its vring
//! thread blocked in epoll) and a guest driver on the other end:
//!
//! - a completion that arrives while the thread waits for a kick is
//!   answered at once: the filesystem's completion eventfd (`started_fd`) is
//!   in the thread's epoll, so no kick is needed;
//! - a kick that arrives while READs are in flight is served at once,
//!   without waiting for those completions;
//! - a READ whose host I/O hangs ends in the request timeout when the
//!   backend can cancel it (`Filesystem::interrupt`), with the queue
//!   serving other requests meanwhile; one the backend cannot cancel keeps
//!   its answer (and the guest's buffers) until the I/O ends, the queue
//!   still serving the others;
//! - a vring stop (GET_VRING_BASE) with such a READ in flight returns once
//!   the READ was answered (a migration must not lose it); past the
//!   stop's wait, once the backend gave the READ up, or, if it cannot,
//!   once its I/O ended.
//!
//! The filesystem here holds each READ it starts (`start_read`) until the
//! test releases it from its own thread, or (if it is interruptible) until
//! `interrupt` names it; either then signals its eventfd, and the vring
//! thread's next `collect_started` writes the data into guest memory as the
//! kernel would and calls the READ's `IoDone`.

mod common;

use fuse_core::abi::{AttrOut, GetattrIn, Opcode, ReadIn};
use fuse_core::server::{Completions, Ctx, Filesystem, FsResult, IoDone, ReadSink};
use fuse_core::{ClientMem, Errno};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vhost::VhostBackend;
use virtio_fs::testing::guest::{Done, GuestDriver, Req};
use virtio_fs::{DeviceConfig, FsDevice};
use vm_memory::Bytes;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

/// Request queue 1.
const Q: usize = 1;
/// READs at this offset or beyond complete at the next `collect_started`
/// (a cached read); the others are held.
const QUICK: u64 = 1 << 40;
/// A READ at this offset is answered inside `start_read` (the page cache
/// held it).
const IN_LINE: u64 = 1 << 41;
/// A GETATTR of this inode blocks until the test opens the gate (a host
/// call that hangs in line).
const BLOCKING_INO: u64 = 666;
/// Bytes each READ asks for.
const LEN: usize = 4096;
/// How long the guest waits for anything that must come.
const PATIENCE: Duration = Duration::from_secs(10);
/// `DeviceConfig::request_timeout` of the timeout tests.
const TIMEOUT: Duration = Duration::from_secs(1);

fn pattern(off: u64) -> Vec<u8> {
    (0..LEN)
        .map(|i| (off as usize / 512 * 7 + i) as u8)
        .collect()
}

/// A READ the filesystem started and has not completed.
struct Started {
    unique: u64,
    off: u64,
    mem: Arc<dyn ClientMem>,
    done: IoDone,
    /// Set when it is to complete (at the next `collect_started`).
    result: Option<FsResult<usize>>,
}

#[derive(Default)]
struct Log {
    /// (unique, offset) of every READ started, in order.
    started: Vec<(u64, u64)>,
    /// The kernel thread id `start_read` ran on (the vring thread).
    starter: Option<i32>,
    /// Thread ids of the `collect_started` calls that completed READs.
    completers: Vec<i32>,
    /// Uniques `interrupt` was called with.
    interrupts: Vec<u64>,
}

struct State {
    efd: EventFd,
    /// Whether `interrupt` ends a held READ (with EINTR).
    interruptible: bool,
    reads: Mutex<Vec<Started>>,
    log: Mutex<Log>,
    /// Open: GETATTRs of `BLOCKING_INO` return.
    gate: Mutex<bool>,
    gate_cv: std::sync::Condvar,
}

/// Holds READs until released or interrupted (see the module docs).
#[derive(Clone)]
struct Hold(Arc<State>);

fn tid() -> i32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::gettid() }
}

/// Writes `data` into `mem` as the kernel writes a READ's data into the
/// guest's buffers (the memory must be held for I/O).
fn kernel_write(mem: &dyn ClientMem, data: &[u8]) {
    let mut at = 0;
    for s in mem.spans() {
        let n = s.len.min(data.len() - at);
        for i in 0..n {
            // SAFETY: the READ holds `mem` for I/O (`begin_io` in
            // `start_read`; `end_io` only after this), so by `ClientMem`'s
            // contract every span is mapped, writable memory of this
            // process that is no Rust object and that the guest does not
            // reuse meanwhile; `i < s.len`. Volatile: the guest shares it.
            unsafe { std::ptr::write_volatile((s.addr + i) as *mut u8, data[at + i]) };
        }
        at += n;
        if at == data.len() {
            break;
        }
    }
}

impl Hold {
    fn new(interruptible: bool) -> Hold {
        Hold(Arc::new(State {
            efd: EventFd::new(EFD_NONBLOCK).unwrap(),
            interruptible,
            reads: Mutex::new(Vec::new()),
            log: Mutex::new(Log::default()),
            gate: Mutex::new(false),
            gate_cv: std::sync::Condvar::new(),
        }))
    }

    fn signal(&self) {
        self.0.efd.write(1).unwrap();
    }

    /// Completes the held READ at `off` (from the test's thread: the
    /// vring thread takes it when the eventfd wakes it).
    fn release(&self, off: u64) {
        let mut reads = self.0.reads.lock().unwrap();
        let r = reads
            .iter_mut()
            .find(|r| r.off == off)
            .expect("no such READ held");
        r.result = Some(Ok(LEN));
        drop(reads);
        self.signal();
    }

    fn open_gate(&self) {
        *self.0.gate.lock().unwrap() = true;
        self.0.gate_cv.notify_all();
    }

    /// READs started and not completed.
    fn held(&self) -> usize {
        self.0.reads.lock().unwrap().len()
    }

    fn started(&self) -> Vec<(u64, u64)> {
        self.0.log.lock().unwrap().started.clone()
    }

    fn starter(&self) -> Option<i32> {
        self.0.log.lock().unwrap().starter
    }

    fn completers(&self) -> Vec<i32> {
        self.0.log.lock().unwrap().completers.clone()
    }

    fn interrupts(&self) -> Vec<u64> {
        self.0.log.lock().unwrap().interrupts.clone()
    }
}

impl Filesystem for Hold {
    type Inode = u64;
    type Handle = u64;
    type Io = ();

    fn new_io(&self, _: fuse_core::server::Wake) {}

    fn getattr(
        &self,
        _: &Ctx,
        inode: u64,
        _: Option<u64>,
    ) -> FsResult<(fuse_core::abi::Attr, Duration)> {
        if inode == BLOCKING_INO {
            let mut open = self.0.gate.lock().unwrap();
            while !*open {
                open = self.0.gate_cv.wait(open).unwrap();
            }
        }
        let attr = fuse_core::abi::Attr {
            ino: inode,
            mode: libc::S_IFREG | 0o644,
            nlink: 1,
            size: 1 << 20,
            ..Default::default()
        };
        Ok((attr, Duration::from_secs(1)))
    }

    fn read(&self, _: &Ctx, _: u64, _: u64, _: u64, _: &mut dyn ReadSink) -> FsResult<usize> {
        // Every READ here must be started (start_read).
        Err(Errno::EPROTO)
    }

    fn start_read(
        &self,
        _: &mut (),
        out: &mut Completions,
        ctx: &Ctx,
        _: u64,
        _: u64,
        off: u64,
        len: usize,
        mem: &Arc<dyn ClientMem>,
        done: IoDone,
    ) -> Result<(), IoDone> {
        if len != LEN || !mem.begin_io() {
            return Err(done);
        }
        {
            let mut log = self.0.log.lock().unwrap();
            log.started.push((ctx.unique, off));
            log.starter = Some(tid());
        }
        if off == IN_LINE {
            kernel_write(&**mem, &pattern(off));
            mem.end_io();
            out.complete(done, Ok(LEN));
            return Ok(());
        }
        self.0.reads.lock().unwrap().push(Started {
            unique: ctx.unique,
            off,
            mem: mem.clone(),
            done,
            result: (off >= QUICK).then_some(Ok(LEN)),
        });
        Ok(())
    }

    fn collect_started(&self, _: &mut (), out: &mut Completions) -> usize {
        let ready: Vec<Started> = {
            let mut reads = self.0.reads.lock().unwrap();
            let (ready, held) = reads.drain(..).partition(|r| r.result.is_some());
            *reads = held;
            ready
        };
        let n = ready.len();
        if n > 0 {
            self.0.log.lock().unwrap().completers.push(tid());
        }
        for r in ready {
            let result = r.result.unwrap_or(Err(Errno::EIO));
            if result.is_ok() {
                kernel_write(&*r.mem, &pattern(r.off));
            }
            // The "kernel" is done with the guest's buffers.
            r.mem.end_io();
            out.complete(r.done, result);
        }
        n
    }

    fn started_in_flight(&self, _: &()) -> usize {
        self.held()
    }

    fn started_fd(&self, _: &()) -> Option<i32> {
        Some(self.0.efd.as_raw_fd())
    }

    fn interrupt(&self, unique: u64) {
        self.0.log.lock().unwrap().interrupts.push(unique);
        if !self.0.interruptible {
            return;
        }
        let mut reads = self.0.reads.lock().unwrap();
        if let Some(r) = reads.iter_mut().find(|r| r.unique == unique) {
            r.result = Some(Err(Errno::EINTR));
            drop(reads);
            self.signal();
        }
    }
}

/// The device on a real vhost-user socket, and the guest connected to it.
struct Served {
    base: PathBuf,
    fs: Hold,
    dev: FsDevice<Hold>,
    guest: Option<GuestDriver>,
    daemon: Option<JoinHandle<()>>,
}

fn serve(name: &str, fs: Hold, request_timeout: Duration) -> Served {
    serve_with(
        name,
        fs,
        request_timeout,
        virtio_fs::DeviceConfig::default().vring_stop_drain,
    )
}

/// `serve` with a vring stop that waits `vring_stop_drain` for the vring's
/// requests.
fn serve_with(
    name: &str,
    fs: Hold,
    request_timeout: Duration,
    vring_stop_drain: Duration,
) -> Served {
    let base = std::env::temp_dir().join(format!("fusebox-wakeups-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let sock = base.join("vfs.sock");
    let dev = FsDevice::new(
        fs.clone(),
        DeviceConfig {
            queue_size: 128,
            request_timeout,
            vring_stop_drain,
            workers_per_queue: 1,
            // As fusebox runs by default: the vring thread serves in line.
            inline_per_batch: usize::MAX,
            ..DeviceConfig::default()
        },
    )
    .unwrap();
    let daemon = common::serve_device(&dev, &sock);
    let guest = common::connect_guest(&sock, 8, LEN as u64);
    Served {
        base,
        fs,
        dev,
        guest: Some(guest),
        daemon: Some(daemon),
    }
}

impl Served {
    fn g(&mut self) -> &mut GuestDriver {
        self.guest.as_mut().unwrap()
    }

    /// Posts a READ of `LEN` bytes at `off` in `slot`; returns its unique.
    fn post_read(&mut self, slot: u16, off: u64) -> u64 {
        let body = ReadIn {
            fh: 9,
            offset: off,
            size: LEN as u32,
            ..ReadIn::new_zeroed()
        };
        self.g()
            .post(
                Q,
                slot,
                &Req {
                    opcode: Opcode::Read,
                    nodeid: 2,
                    args: body.as_bytes(),
                    data_out: 0,
                    reply: LEN as u32,
                },
            )
            .unwrap()
    }

    /// Posts a GETATTR of node `nodeid` in `slot`; returns its unique.
    fn post_getattr(&mut self, slot: u16, nodeid: u64) -> u64 {
        let body = GetattrIn::new_zeroed();
        self.g()
            .post(
                Q,
                slot,
                &Req {
                    opcode: Opcode::Getattr,
                    nodeid,
                    args: body.as_bytes(),
                    data_out: 0,
                    reply: std::mem::size_of::<AttrOut>() as u32,
                },
            )
            .unwrap()
    }

    /// Whatever the device has answered, without waiting.
    fn reap(&mut self) -> Vec<Done> {
        let mut out = Vec::new();
        self.g().reap(Q, &mut out).unwrap();
        out
    }

    /// Waits (sleeping until the device signals, as a guest does) until
    /// every slot of `slots` was answered, or `PATIENCE` passes; returns
    /// the answers in the order they came, and when each was reaped.
    fn await_slots(&mut self, slots: &[u16], got: &mut Vec<(Done, Instant)>) {
        let t = Instant::now();
        loop {
            let now = Instant::now();
            got.extend(self.reap().into_iter().map(|d| (d, now)));
            if slots.iter().all(|s| got.iter().any(|(d, _)| d.slot == *s)) {
                return;
            }
            let left = PATIENCE.saturating_sub(t.elapsed());
            assert!(
                !left.is_zero(),
                "slots {slots:?} not answered within {PATIENCE:?} (got {:?})",
                got.iter().map(|(d, _)| d.slot).collect::<Vec<_>>()
            );
            // A timeout here is judged by the loop.
            let _ = self.g().wait(Q, left);
        }
    }

    /// The data a READ in `slot` left in the guest's buffer.
    fn read_data(&mut self, slot: u16) -> Vec<u8> {
        let at = self.g().slot_data(Q, slot);
        let mut b = vec![0u8; LEN];
        self.g().memory().read_slice(&mut b, at).unwrap();
        b
    }

    /// The attributes a GETATTR in `slot` got.
    fn attr(&mut self, slot: u16) -> AttrOut {
        let at = self.g().reply_payload(Q, slot);
        let mut b = [0u8; std::mem::size_of::<AttrOut>()];
        self.g().memory().read_slice(&mut b, at).unwrap();
        AttrOut::read_from_bytes(&b).unwrap()
    }

    /// Releases every held READ, lets the guest go and waits for the
    /// daemon to end the connection.
    fn finish(mut self) {
        self.fs.open_gate();
        for (_, off) in self.fs.started() {
            if self.fs.0.reads.lock().unwrap().iter().any(|r| r.off == off) {
                self.fs.release(off);
            }
        }
        wait_for("the held READs to complete", || self.fs.held() == 0);
        drop(self.guest.take());
        let daemon = self.daemon.take().unwrap();
        wait_for("the daemon to end", || daemon.is_finished());
        daemon.join().unwrap();
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < PATIENCE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Whether thread `tid` of this process is blocked in epoll (the vring
/// thread's event loop waiting for a kick or another event).
fn in_epoll(tid: i32) -> bool {
    let Ok(s) = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")) else {
        return false;
    };
    let Some(Ok(nr)) = s.split_whitespace().next().map(str::parse::<i64>) else {
        return false;
    };
    #[cfg(target_arch = "x86_64")]
    if nr == libc::SYS_epoll_wait {
        return true;
    }
    nr == libc::SYS_epoll_pwait || nr == 441 // epoll_pwait2 (every architecture)
}

/// Posts READ `off` in slot 1, kicks, and waits until the filesystem has
/// started it and the vring thread is back in epoll; returns the READ's
/// unique as the filesystem saw it (the engine's).
fn start_held_read(s: &mut Served, off: u64) -> u64 {
    s.post_read(1, off);
    s.g().publish(Q);
    wait_for("the READ to start", || !s.fs.started().is_empty());
    let tid = s.fs.starter().unwrap();
    wait_for("the vring thread to wait in epoll", || in_epoll(tid));
    assert_eq!(s.fs.held(), 1);
    assert!(s.reap().is_empty(), "a held READ was answered");
    s.fs.started()[0].0
}

#[test]
fn a_completion_is_answered_while_the_queue_thread_waits_for_a_kick() {
    let mut s = serve("completion", Hold::new(false), Duration::ZERO);
    start_held_read(&mut s, 0);
    let vring_thread = s.fs.starter().unwrap();
    assert_ne!(
        vring_thread,
        tid(),
        "the READ was started on the vring thread"
    );

    // The I/O completes on its own; nothing is posted and nothing kicks.
    s.fs.release(0);
    let mut got = Vec::new();
    s.await_slots(&[1], &mut got);
    let d = got[0].0;
    assert_eq!(
        (d.out.error, d.out.len, d.used_len),
        (0, 16 + LEN as u32, 16 + LEN as u32)
    );
    assert_eq!(
        s.read_data(1),
        pattern(0),
        "the READ's data is in its buffers"
    );
    // It was taken by the vring thread, woken by the eventfd.
    assert_eq!(s.fs.completers(), vec![vring_thread]);
    assert_eq!(s.dev.heads_in_flight(Q), 0);
    s.finish();
}

#[test]
fn a_kick_is_served_while_reads_are_in_flight() {
    let mut s = serve("kick", Hold::new(false), Duration::ZERO);
    start_held_read(&mut s, 0);

    // READ 0 stays in flight; a GETATTR and a READ the host has cached come
    // with a new kick.
    s.post_getattr(2, 5);
    s.post_read(3, QUICK);
    assert!(
        s.g().publish(Q),
        "the device asked for a kick while a READ was in flight"
    );
    let mut got = Vec::new();
    s.await_slots(&[2, 3], &mut got);
    for (d, _) in &got {
        assert_ne!(d.slot, 1, "the held READ was answered");
        assert_eq!(d.out.error, 0, "slot {}", d.slot);
    }
    assert_eq!(s.attr(2).attr.ino, 5, "GETATTR answered by the filesystem");
    assert_eq!(s.read_data(3), pattern(QUICK));
    // READ 0 was never completed meanwhile: both were served while it was
    // outstanding.
    assert_eq!(s.fs.held(), 1);
    assert_eq!(s.fs.started().len(), 2);
    assert_eq!(s.dev.heads_in_flight(Q), 1);

    // And it still completes, without a kick.
    s.fs.release(0);
    got.clear();
    s.await_slots(&[1], &mut got);
    assert_eq!(got[0].0.out.error, 0);
    assert_eq!(s.read_data(1), pattern(0));
    s.finish();
}

#[test]
fn a_hung_read_ends_in_the_timeout_while_the_queue_serves_others() {
    let mut s = serve("timeout", Hold::new(true), TIMEOUT);
    let posted = Instant::now();
    let unique = start_held_read(&mut s, 0);

    // Requests posted meanwhile are answered while the READ hangs.
    s.post_getattr(2, 5);
    s.g().publish(Q);
    let mut got = Vec::new();
    s.await_slots(&[2], &mut got);
    assert!(
        got.iter().all(|(d, _)| d.slot != 1),
        "the GETATTR was answered only after the hung READ timed out \
         (more than {TIMEOUT:?} late)"
    );
    assert_eq!(got[0].0.out.error, 0);
    assert_eq!(s.attr(2).attr.ino, 5);

    // The READ ends in the timeout: the backend is asked to give it up,
    // it does, and the guest gets an error with no data.
    s.await_slots(&[1], &mut got);
    let (d, at) = got.iter().find(|(d, _)| d.slot == 1).copied().unwrap();
    assert!(
        at.duration_since(posted) >= TIMEOUT,
        "answered after {:?}, before the timeout",
        at.duration_since(posted)
    );
    assert_eq!((d.out.error, d.out.len, d.used_len), (-libc::EIO, 16, 16));
    assert_eq!(s.fs.interrupts(), vec![unique]);
    assert_eq!(s.fs.held(), 0);
    assert_eq!(s.dev.stats().timeouts(), 1);
    assert_eq!(s.dev.heads_in_flight(Q), 0);

    // The queue goes on serving, READs included (the slot of the timed-out
    // READ too).
    s.post_read(1, QUICK);
    s.post_getattr(2, 6);
    s.g().publish(Q);
    got.clear();
    s.await_slots(&[1, 2], &mut got);
    assert!(got.iter().all(|(d, _)| d.out.error == 0));
    assert_eq!(s.read_data(1), pattern(QUICK));
    assert_eq!(s.attr(2).attr.ino, 6);
    s.finish();
}

/// A READ whose host I/O the backend cannot cancel (it ignores
/// `interrupt`): the timeout fires and the backend is asked to give up,
/// but the guest's buffers are still the kernel's, so the answer waits for
/// the I/O to end (DESIGN.md, "Guest buffers and timeouts"); the queue
/// serves everything else meanwhile.
#[test]
fn a_read_the_backend_cannot_cancel_is_answered_when_its_io_ends() {
    let mut s = serve("uncancellable", Hold::new(false), TIMEOUT);
    let unique = start_held_read(&mut s, 0);
    wait_for("the timeout", || {
        s.dev.stats().timeouts() == 1 && !s.fs.interrupts().is_empty()
    });
    assert_eq!(s.fs.interrupts(), vec![unique]);
    assert!(s.reap().is_empty(), "answered while its I/O runs");

    // Everything else is served.
    s.post_getattr(2, 5);
    s.post_read(3, QUICK);
    s.g().publish(Q);
    let mut got = Vec::new();
    s.await_slots(&[2, 3], &mut got);
    assert!(got.iter().all(|(d, _)| d.slot != 1 && d.out.error == 0));
    assert_eq!(s.read_data(3), pattern(QUICK));

    // Still no answer while the I/O runs, however long.
    std::thread::sleep(TIMEOUT);
    assert!(s.reap().is_empty(), "answered while its I/O runs");
    assert_eq!(s.dev.heads_in_flight(Q), 1);

    // The I/O ends (writing the guest's buffers): only now is the READ
    // answered, with the timeout's error.
    s.fs.release(0);
    got.clear();
    s.await_slots(&[1], &mut got);
    let d = got[0].0;
    assert_eq!((d.out.error, d.out.len, d.used_len), (-libc::EIO, 16, 16));
    assert_eq!(s.dev.heads_in_flight(Q), 0);
    s.finish();
}

/// Asks the device to stop request queue 1 (GET_VRING_BASE, as a VMM does
/// when the guest resets the device), on a thread of its own.
fn stop_vring(s: &mut Served) -> JoinHandle<u32> {
    let fe = s.g().frontend().clone();
    let index = s.g().queue_index(Q);
    std::thread::spawn(move || fe.get_vring_base(index).unwrap())
}

/// How long the stop tests below let a vring stop wait for its requests.
const SHORT_DRAIN: Duration = Duration::from_millis(100);

/// Before a migration the vring's base index goes to the destination, which
/// never sees the chains popped before it: GET_VRING_BASE returns only
/// once the READ in flight was answered into the used ring (with its data,
/// not given up), and the base counts it.
#[test]
fn a_vring_stop_answers_a_read_in_flight_before_it_returns() {
    let mut s = serve("stop-drains", Hold::new(true), Duration::ZERO);
    start_held_read(&mut s, 0);
    let stop = stop_vring(&mut s);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !stop.is_finished(),
        "the vring went back with a READ unanswered"
    );
    assert!(s.fs.interrupts().is_empty(), "the READ was given up");
    s.fs.release(0);
    wait_for("GET_VRING_BASE", || stop.is_finished());
    // INIT and the READ were taken from the vring, and both answered.
    assert_eq!(stop.join().unwrap(), 2);
    let done = s.reap();
    assert_eq!(done.len(), 1, "the READ is in the used ring");
    assert_eq!((done[0].slot, done[0].out.error), (1, 0));
    assert_eq!(done[0].used_len, 16 + LEN as u32);
    assert_eq!(s.read_data(1), pattern(0));
    assert_eq!(s.dev.stats().lost_on_stop(), 0);
    assert_eq!(s.dev.heads_in_flight(Q), 0);
    s.finish();
}

/// A READ still in flight when the stop's wait ends is given up.
#[test]
fn a_vring_stop_gives_up_a_read_in_flight() {
    let mut s = serve_with("stop", Hold::new(true), Duration::ZERO, SHORT_DRAIN);
    let unique = start_held_read(&mut s, 0);
    let stop = stop_vring(&mut s);
    wait_for("GET_VRING_BASE", || stop.is_finished());
    // INIT and the READ were taken from the vring.
    assert_eq!(stop.join().unwrap(), 2);
    // The backend was asked to give the READ up, and did (on the vring
    // thread, woken by its eventfd) before the vring went back.
    assert_eq!(s.fs.interrupts(), vec![unique]);
    assert_eq!(s.fs.held(), 0);
    assert!(s.reap().is_empty(), "an answer on a stopped vring");
    assert_eq!(s.dev.stats().lost_on_stop(), 1);
    s.finish();
}

/// As a device reset waits for DMA: the frontend's GET_VRING_BASE is not
/// answered while host I/O that cannot be cancelled may still write the
/// vring's buffers, up to its bound (`vring_stop_drain` again, after the
/// drain's): then it is answered, and the I/O still running is counted.
#[test]
fn a_vring_stop_waits_for_a_read_the_backend_cannot_cancel_up_to_its_bound() {
    let bound = Duration::from_secs(1);
    let mut s = serve_with(
        "stop-uncancellable",
        Hold::new(false),
        Duration::ZERO,
        bound,
    );
    let unique = start_held_read(&mut s, 0);
    let stop = stop_vring(&mut s);
    wait_for("the backend to be asked to give up", || {
        !s.fs.interrupts().is_empty()
    });
    assert_eq!(s.fs.interrupts(), vec![unique]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !stop.is_finished(),
        "the vring went back while its I/O runs"
    );
    wait_for("GET_VRING_BASE", || stop.is_finished());
    assert_eq!(stop.join().unwrap(), 2);
    let stats = s.dev.stats();
    assert_eq!(stats.stuck_on_stop(), 1);
    s.fs.release(0);
    assert!(s.reap().is_empty(), "an answer on a stopped vring");
    s.finish();
}

/// Answers given in line are not held behind a host call that then hangs
/// in line: a GETATTR served, and a READ answered inside `start_read`,
/// reach the guest while the next request of the same kick blocks the
/// vring thread (the watchdog, which takes the queue over, signals them).
#[test]
fn answers_are_not_held_behind_a_call_that_hangs_in_line() {
    let mut s = serve("held-behind", Hold::new(false), Duration::ZERO);
    s.post_getattr(1, 5);
    s.post_read(2, IN_LINE);
    s.post_getattr(3, BLOCKING_INO);
    s.g().publish(Q);
    let mut got = Vec::new();
    s.await_slots(&[1, 2], &mut got);
    assert!(got.iter().all(|(d, _)| d.slot != 3), "the blocked GETATTR");
    assert!(got.iter().all(|(d, _)| d.out.error == 0));
    assert_eq!(s.attr(1).attr.ino, 5);
    assert_eq!(s.read_data(2), pattern(IN_LINE));
    s.fs.open_gate();
    got.clear();
    s.await_slots(&[3], &mut got);
    assert_eq!(s.attr(3).attr.ino, BLOCKING_INO);
    s.finish();
}
