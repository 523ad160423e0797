//! Serving on the vring thread ("in line"): each request queue's vring
//! thread serves the requests it pops itself, through the whole engine (admission,
//! tickets, timeouts), instead of handing each to a ring worker thread
//! (a wake-up of another thread, most of a request's latency at depth 1),
//! and keeps many of them in flight.
//!
//! It owns entries of its engine ring queue, reserved for it (they take
//! requests only while it submits, or on their own commit), up to the
//! queue's size. Each round `submit.rs` sent to them is one chunk, or
//! several after a round of READs the page cache held ([`Chunks`]): every
//! request is started on the thread's host I/O context where the
//! filesystem can, or served synchronously. The answers given at once
//! with no call that may block are committed together; one served
//! synchronously is committed at once, after those before it. Every
//! `submit_batch` started requests, and at the end of the kick, the
//! started I/O is submitted and what completed committed; later
//! completions wake the thread through its epoll. A request that may wait
//! (SETLKW) never comes here; a thread stuck in line is drained by [`watchdog`].

use super::hiprio::ForgetsBy;
use super::ids::RqId;
use super::notify::{notify, Chunks, LARGE, SLOW_REQUEST_PART};
use super::submit::Round;
use super::{FsDevice, Inner, Vring};
use fuse_core::abi::{Opcode, ReadIn};
use fuse_core::dev_uring::{cmd_area, EntHandle, EntryBufs, Fetched, RingEnd};
use fuse_core::locks::lock;
use fuse_core::server::{serve_slot, Dispatcher, Filesystem, Served, Start, StartedIo};
use fuse_core::Chan;
use fuse_core::Errno;
use std::any::Any;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vmm_sys_util::epoll::EventSet;
use zerocopy::FromBytes;

/// A vring thread's own entries of its engine ring queue and the requests
/// it has in flight on them. Only that thread uses it (under its queue's
/// `RequestQueue::inline` lock).
pub(crate) struct QueueServer {
    ring: RingEnd,
    qid: u16,
    /// The entries this thread owns.
    ents: Vec<EntHandle>,
    /// Most entries it makes (the queue's size: no more can be in flight).
    max_ents: usize,
    /// The filesystem's host I/O context of this thread (its `F::Io`,
    /// made on first use): what the thread starts runs there, and only it
    /// completes that. It wakes nothing: the thread takes completions when
    /// the context's fd (in its epoll) or a kick says so. Dropped before
    /// `started`: its I/O ends before the entries go.
    io: Option<Box<dyn Any + Send>>,
    /// Requests whose host I/O runs, by unique: the entries they hold (one
    /// dropped with the server fails its request: the ring answers EIO),
    /// and their completions, as the filesystem hands them back (from
    /// `collect_started` on this thread).
    started: StartedIo<Fetched>,
    /// Requests started since the last submit and still running (READ,
    /// WRITE, FSYNC, FSYNCDIR, FALLOCATE).
    fresh: usize,
    /// The filesystem's completion fd is in this thread's epoll.
    pub(super) fd_registered: Option<i32>,
    scratch: Vec<u8>,
    /// Answered requests to commit together (kept for its room): never
    /// across a call that may block, empty between calls.
    commits: Vec<Fetched>,
    /// A READ or WRITE of at least [`LARGE`] bytes was served since the
    /// last [`QueueServer::take_large`].
    large: bool,
    /// The pop rounds' storage, kept from kick to kick.
    pub(super) round: Round,
}

impl QueueServer {
    /// Registers a first entry on ring queue `qid` (pool mode: no payload
    /// buffer of its own), reserved for this thread.
    pub(crate) fn new(chan: &Chan, qid: u16, max_ents: usize) -> Result<QueueServer, Errno> {
        let ring = chan.ring_end(false);
        let mut s = QueueServer {
            ring,
            qid,
            ents: Vec::new(),
            max_ents: max_ents.max(1),
            io: None,
            started: StartedIo::new(),
            fresh: 0,
            fd_registered: None,
            scratch: vec![0u8; 64 * 1024],
            commits: Vec::with_capacity(16),
            large: false,
            round: Round::default(),
        };
        s.add_entry()?;
        Ok(s)
    }

    fn add_entry(&mut self) -> Result<(), Errno> {
        let h = self
            .ring
            .register(&cmd_area(self.qid, 0, 0), EntryBufs::pooled(), None)?;
        self.ring.reserve(h)?;
        self.ents.push(h);
        Ok(())
    }

    /// Whether requests of this thread's own host I/O are running.
    pub(super) fn io_in_flight(&self) -> bool {
        !self.started.is_empty()
    }

    /// Makes this thread's entries the queue's preferred ones (while a
    /// batch is submitted).
    pub(crate) fn prefer(&self) {
        let _ = self.ring.prefer(self.qid, self.ents.first().copied());
    }

    /// Ends [`QueueServer::prefer`]; says whether this thread's entries
    /// hold requests it has not fetched (true if the ring cannot say).
    pub(crate) fn unprefer(&self) -> bool {
        self.ring.unprefer(self.qid).unwrap_or(true)
    }

    /// Makes sure `want` entries of this thread are free for the next
    /// requests (more are registered while too few are, up to the most).
    pub(crate) fn make_room(&mut self, want: usize) {
        while self.ents.len() < self.started.len() + want && self.ents.len() < self.max_ents {
            if self.add_entry().is_err() {
                break;
            }
        }
    }

    /// Serves what this thread's entries hold, up to `budget` requests:
    /// starts what the filesystem can (READ, WRITE, FSYNC, FSYNCDIR,
    /// FALLOCATE) and serves the rest synchronously. The answers given
    /// at once by a start offer (a READ the page cache held) wait in
    /// `held` to be committed together, when it returns or before it serves
    /// a request synchronously (a host call that may block); after a
    /// request served synchronously it returns, that answer committed
    /// after them. A start offer must not block; if one does, the watchdog
    /// commits what `held` holds (then, racing this thread, in no set
    /// order with its next answers; virtio does not ask for one) and hands
    /// to the workers what is not fetched yet.
    pub(crate) fn serve<F: Filesystem>(
        &mut self,
        disp: &Dispatcher<F>,
        held: &HeldAnswers,
        budget: usize,
    ) -> Serving {
        let QueueServer {
            ring,
            qid,
            io,
            started,
            fresh,
            scratch,
            commits,
            large,
            ..
        } = self;
        let mut out = Serving::default();
        // Answers this call put in `held` (the watchdog may have taken
        // them since: then giving finds none).
        let mut holding = false;
        while out.served < budget {
            let Ok(Some(mut f)) = ring.fetch_own(*qid) else {
                break;
            };
            out.served += 1;
            *large |= moves_much(&mut f);
            let unique = f.in_header().unique;
            // When the answers held before a synchronous call were given.
            let mut given_at = None;
            let served = {
                let mut give_held = || {
                    held.give(ring, commits);
                    given_at = Some(Instant::now());
                };
                let start = io_of(io, disp).map(|io| Start {
                    io,
                    done: started.completions(),
                    before_sync: if holding { Some(&mut give_held) } else { None },
                });
                serve_slot(disp, &mut f, scratch, None, start)
            };
            match served {
                Served::Started => match started.hold(unique, f) {
                    // Answered before start_read returned (the page cache
                    // held it).
                    Some(f) => {
                        held.push(f);
                        holding = true;
                    }
                    None => {
                        *fresh += 1;
                        out.pending += 1;
                    }
                },
                // Nothing parks here (no Deferred is offered), but a
                // request answered either way is committed, after the
                // answers before it (given already if it was served
                // synchronously).
                Served::Answered | Served::Parked => {
                    if holding && given_at.is_none() {
                        held.give(ring, commits);
                    }
                    commits.push(f);
                    commit_all(ring, commits);
                    out.sync_since = Some(given_at);
                    return out;
                }
            }
        }
        if holding {
            held.give(ring, commits);
        }
        out
    }

    /// Whether a large READ or WRITE was served since the last call.
    pub(crate) fn take_large(&mut self) -> bool {
        std::mem::take(&mut self.large)
    }

    /// The fd that is readable when this thread's started I/O has
    /// completions to take (None before it started any).
    fn started_fd<F: Filesystem>(&mut self, disp: &Dispatcher<F>) -> Option<i32> {
        let io = io_of(&mut self.io, disp)?;
        disp.fs().started_fd(io)
    }

    /// Requests started since the last submit and still running.
    pub(crate) fn unsubmitted(&self) -> usize {
        self.fresh
    }

    /// Submits the I/O started since the last call, then commits what has
    /// completed (the filesystem's `collect_started` reports it here).
    /// Returns how many requests it answered.
    pub(crate) fn complete<F: Filesystem>(&mut self, disp: &Dispatcher<F>) -> usize {
        if self.started.is_empty() {
            return 0;
        }
        self.fresh = 0;
        if let Some(io) = io_of(&mut self.io, disp) {
            disp.fs().submit_started(io);
            disp.fs().collect_started(io, self.started.completions());
        }
        let commits = &mut self.commits;
        let n = self.started.take_completed(|f| commits.push(f));
        commit_all(&self.ring, commits);
        n
    }
}

/// Commits the answered entries in `commits` on `ring` at once (no host
/// call runs between them) and empties it. One the ring refuses (torn
/// down, or refused: its request then ends with EIO) is dropped.
fn commit_all(ring: &RingEnd, commits: &mut Vec<Fetched>) {
    if !commits.is_empty() {
        ring.commit_batch(commits, None);
        commits.clear();
    }
}

/// The answers a request queue's vring thread gave at once (start offers
/// answered from the page cache), held to be committed together: its own
/// mutex, a leaf, taken for each push and each give, never held across a
/// commit. The watchdog takes them from a thread stuck meanwhile.
#[derive(Default)]
pub(crate) struct HeldAnswers(Mutex<Vec<Fetched>>);

impl HeldAnswers {
    fn push(&self, f: Fetched) {
        lock(&self.0).push(f);
    }

    /// Commits every answer held, in the order given, on `ring` (any end
    /// of the engine's ring: each entry knows its own), through `spare`
    /// (empty, kept for its room).
    pub(crate) fn give(&self, ring: &RingEnd, spare: &mut Vec<Fetched>) {
        std::mem::swap(&mut *lock(&self.0), spare);
        commit_all(ring, spare);
    }
}

/// What one [`QueueServer::serve`] call did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Serving {
    /// Requests served or started.
    pub(crate) served: usize,
    /// Of them, started and still running.
    pub(crate) pending: usize,
    /// The last was served synchronously, or answered without the
    /// filesystem (a request given up, one that does not decode): Some;
    /// then since when, if the answers before it were given first
    /// (Some(Some)), else since the call began (Some(None)).
    pub(crate) sync_since: Option<Option<Instant>>,
}

/// `disp`'s filesystem's host I/O context in `slot`, made there on first
/// use (a queue thread serves one device, so it is of that type once
/// made; None never comes in practice).
fn io_of<'a, F: Filesystem>(
    slot: &'a mut Option<Box<dyn Any + Send>>,
    disp: &Dispatcher<F>,
) -> Option<&'a mut F::Io> {
    if !slot.as_ref().is_some_and(|b| b.is::<F::Io>()) {
        *slot = Some(Box::new(disp.fs().new_io(Arc::new(|| {}))));
    }
    slot.as_mut()?.downcast_mut::<F::Io>()
}

impl<F: Filesystem + 'static> FsDevice<F> {
    /// Pops and submits until the queue is empty (false) or admission is
    /// full (true: the chain went back to the avail ring), serving on this
    /// thread as it goes: what the filesystem can start is started, the
    /// rest served synchronously; then submits the started I/O at once and
    /// answers what completed.
    pub(super) fn drain_requests(&self, vring: &Vring, q: RqId) -> bool {
        let k = self.inner.cfg.inline_per_batch;
        if k == 0 {
            return self.submit_requests(vring, q, None);
        }
        let mut slot = lock(&self.inner.queue(q).inline);
        if slot.is_none() {
            let most = usize::from(self.inner.cfg.queue_size);
            *slot = QueueServer::new(self.inner.engine.chan(), q.ring_queue(), most).ok();
        }
        let Some(s) = slot.as_mut() else {
            return self.submit_requests(vring, q, None);
        };
        // Each request goes to this thread's entries and is served in the
        // round it was sent in, up to `k`; then the rest go to the workers
        // and this thread serves what its entries got once all are in.
        s.prefer();
        let stalled = self.submit_requests(vring, q, Some((s, k)));
        if s.unprefer() {
            let _signals = self.inner.queue(q).signals.open(vring, &self.inner.mem);
            self.serve_inline(s, q, usize::MAX, self.busy_mark(Instant::now()));
        }
        self.complete_inline(s, q);
        stalled
    }

    /// Serves the `n` requests of a round just sent to this thread's
    /// entries in chunks ([`Chunks`]): one guest notification for each
    /// chunk's answers, or one more right after a slow request (it took a
    /// tenth of the chunk time: a metadata call, not a cached read) and
    /// each time serving took the chunk time, so the guest hears of a slow
    /// answer as it is done. Submits the I/O started once `submit_batch`
    /// requests are waiting. Returns how many it served.
    pub(super) fn serve_chunk(
        &self,
        vring: &Vring,
        s: &mut QueueServer,
        q: RqId,
        chunks: &mut Chunks,
        n: usize,
    ) -> usize {
        let signals = &self.inner.queue(q).signals;
        let per_submit = self.inner.cfg.submit_batch.max(1);
        // Requests per chunk: one after a slow or large one.
        let mut chunk = chunks.next_len();
        let mut batch = signals.open(vring, &self.inner.mem);
        let chunk_time = self.inner.cfg.chunk_time;
        let began = Instant::now();
        // (None: a chunk time too long to add is never reached.)
        let (mut mark, mut due) = (self.busy_mark(began), began.checked_add(chunk_time));
        let slow_request = chunk_time / SLOW_REQUEST_PART;
        let mut last = began;
        // The watchdog's mark moves on at least every MARK_AGE while
        // requests are done, however long the chunk may last.
        let mut mark_due = began + MARK_AGE;
        let (mut slow, mut quick) = (false, true);
        s.take_large();
        let (mut served, mut unsignalled) = (0, 0);
        while served < n {
            // Up to the end of the chunk (`unsignalled` < `chunk` here).
            let want = (n - served)
                .min(chunk.saturating_sub(unsignalled).max(1))
                .min(per_submit.saturating_sub(s.unsubmitted()).max(1));
            let r = self.serve_piece(s, q, want, mark);
            if r.served == 0 {
                break;
            }
            served += r.served;
            unsignalled += r.served;
            quick &= r.sync_since.is_none() && r.pending == 0;
            let now = Instant::now();
            // What a request took, not the submit of the batch of I/O it
            // completed (its own clock read, once per batch): the last
            // one's, from when the answers before it were given, when it
            // was served synchronously; else each one's share.
            let took = match r.sync_since {
                Some(since) => now.saturating_duration_since(since.unwrap_or(last)),
                None => now.saturating_duration_since(last) / r.served as u32,
            };
            last = now;
            if s.unsubmitted() >= per_submit {
                // (The rest of the round is served here, in its chunks.)
                self.complete_started(s, q);
                last = Instant::now();
            }
            let large = s.take_large();
            let slow_now = large || took >= slow_request || due.is_some_and(|d| now >= d);
            if slow_now || (unsignalled >= chunk && served < n) {
                // Signalled now; the rest of the round in chunks of its
                // own, single ones after a slow or large request.
                if slow_now {
                    slow = true;
                    chunk = 1;
                }
                unsignalled = 0;
                drop(batch);
                batch = signals.open(vring, &self.inner.mem);
                due = now.checked_add(chunk_time);
            }
            if now >= mark_due {
                (mark, mark_due) = (self.busy_mark(now), now + MARK_AGE);
            }
        }
        drop(batch);
        chunks.served(slow, quick && served == n);
        served
    }

    /// Submits the I/O this queue's thread started and answers what has
    /// completed, and what the entries took meanwhile; makes sure the
    /// thread's completion eventfd is in its epoll.
    pub(super) fn complete_inline(&self, s: &mut QueueServer, q: RqId) {
        while self.complete_once(s, q) > 0
            && self.serve_inline(s, q, usize::MAX, self.busy_mark(Instant::now())) > 0
        {}
        self.register_started_fd(s, q);
    }

    /// Inside a round ([`FsDevice::serve_chunk`], which serves what the
    /// entries hold in its chunks): submits the I/O this queue's thread
    /// started and answers what has completed.
    fn complete_started(&self, s: &mut QueueServer, q: RqId) {
        self.complete_once(s, q);
        self.register_started_fd(s, q);
    }

    /// Submits the started I/O and answers what completed; the answers of
    /// one reaped batch of completions signal the guest once, when all are
    /// in its used ring (inside a chunk of requests served in line, with
    /// that chunk's). Returns how many it answered.
    fn complete_once(&self, s: &mut QueueServer, q: RqId) -> usize {
        let rq = self.inner.queue(q);
        let _batch = rq.vring.get().map(|v| rq.signals.open(v, &self.inner.mem));
        s.complete(self.inner.engine.dispatcher())
    }

    /// Makes sure the thread's completion eventfd is in its epoll.
    fn register_started_fd(&self, s: &mut QueueServer, q: RqId) {
        let disp = self.inner.engine.dispatcher();
        if s.fd_registered.is_none() {
            if let Some(fd) = s.started_fd(disp) {
                let h = lock(&self.inner.handlers)
                    .get(q.thread())
                    .and_then(Weak::upgrade);
                let ev = q.completion_event(self.inner.count());
                if let Some(h) = h {
                    if h.register_listener(fd, EventSet::IN, ev).is_ok() {
                        s.fd_registered = Some(fd);
                    }
                }
            }
        }
    }

    /// Request queue `q`'s thread has completions to take.
    pub(super) fn on_completions(&self, q: RqId) {
        let mut slot = lock(&self.inner.queue(q).inline);
        let Some(s) = slot.as_mut() else { return };
        if let Some(fd) = s.fd_registered {
            let mut v = 0u64;
            // SAFETY: reads 8 bytes into a u64 from the filesystem's
            // eventfd (non-blocking): that resets it.
            unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
        }
        self.complete_inline(s, q);
    }

    /// `at` as the watchdog's busy mark: milliseconds since the device
    /// started, at least 1 (0 is "not busy").
    fn busy_mark(&self, at: Instant) -> u64 {
        (at.saturating_duration_since(self.inner.epoch).as_millis() as u64).max(1)
    }

    /// Serves up to `budget` requests on this thread's entries, marking the
    /// queue busy for the watchdog meanwhile (since `mark`, a
    /// [`FsDevice::busy_mark`], moved on while requests get done).
    pub(super) fn serve_inline(
        &self,
        s: &mut QueueServer,
        q: RqId,
        budget: usize,
        mark: u64,
    ) -> usize {
        let busy_since = &self.inner.queue(q).busy_since;
        busy_since.store(mark, Ordering::SeqCst);
        let disp = self.inner.engine.dispatcher();
        // The mark moves on every MARK_AGE while they get done, so only
        // one that takes STUCK looks stuck.
        let mut due = Instant::now() + MARK_AGE;
        let mut n = 0;
        let held = &self.inner.queue(q).held;
        while n < budget && s.serve(disp, held, 1).served == 1 {
            n += 1;
            let now = Instant::now();
            if now >= due {
                busy_since.store(self.busy_mark(now), Ordering::SeqCst);
                due = now + MARK_AGE;
            }
        }
        busy_since.store(0, Ordering::SeqCst);
        self.inner.counters(q).add_inline(n as u64);
        n
    }

    /// Serves one piece of a chunk, up to `budget` requests, in one
    /// [`QueueServer::serve`] call (their answers given together), marking
    /// the queue busy for the watchdog meanwhile (since `mark`).
    fn serve_piece(&self, s: &mut QueueServer, q: RqId, budget: usize, mark: u64) -> Serving {
        let busy_since = &self.inner.queue(q).busy_since;
        busy_since.store(mark, Ordering::SeqCst);
        let held = &self.inner.queue(q).held;
        let r = s.serve(self.inner.engine.dispatcher(), held, budget);
        busy_since.store(0, Ordering::SeqCst);
        self.inner.counters(q).add_inline(r.served as u64);
        r
    }
}

/// Whether the request `f` holds is a READ or WRITE of at least [`LARGE`]
/// bytes.
fn moves_much(f: &mut Fetched) -> bool {
    let hdr = f.in_header();
    if hdr.opcode == Opcode::Write as u32 {
        return hdr.len as usize >= LARGE;
    }
    if hdr.opcode != Opcode::Read as u32 {
        return false;
    }
    let op_in = &f.parts_mut().0.op_in;
    ReadIn::read_from_prefix(&op_in[..]).is_ok_and(|(r, _)| r.size as usize >= LARGE)
}

/// A vring thread serving in line for longer than this is taken to be
/// stuck in a host call.
const STUCK: Duration = Duration::from_millis(20);

/// How old the watchdog's busy mark of a thread that is serving a chunk
/// and getting requests done may grow (well under [`STUCK`]).
const MARK_AGE: Duration = Duration::from_millis(1);

/// Keeps queues moving while their vring thread is stuck serving in line:
/// every few milliseconds it commits the answers such a thread holds
/// ([`HeldAnswers`]), pops what the guest added to its queue and submits it to
/// the engine, whose worker threads serve it. Ends with the device.
pub(super) fn watchdog<F: Filesystem + 'static>(weak: Weak<Inner<F>>) {
    loop {
        // (Once the device is dropped no upgrade succeeds.)
        let Some(inner) = weak.upgrade() else { return };
        let now = inner.epoch.elapsed().as_millis() as u64;
        // (A queue is busy only after a kick, which gave it its vring.)
        let stuck: Vec<(RqId, Vring)> = RqId::all(inner.count())
            .filter(|&q| {
                let b = inner.queue(q).busy_since.load(Ordering::SeqCst);
                b != 0 && now.saturating_sub(b) >= STUCK.as_millis() as u64
            })
            .filter_map(|q| Some((q, inner.queue(q).vring.get()?.clone())))
            .collect();
        let dev = FsDevice { inner };
        for (q, vring) in &stuck {
            let ring = dev.inner.engine.chan().ring_end(false);
            // The answers the stuck thread gave at once and holds (a start
            // offer blocked after them): committed here, signalled at once
            // (each goes through its own vring's generation, so a disabled
            // vring does not keep them).
            dev.inner.queue(*q).held.give(&ring, &mut Vec::new());
            if vring.get_ref().is_enabled() {
                dev.inner.counters(*q).add_takeovers(1);
                // What the stuck thread's entries got and it has not
                // begun (the rest of its round) goes to the workers, and
                // so does what is sent from now on.
                let _ = ring.hand_back_own(q.ring_queue());
                dev.submit_requests(vring, *q, None);
                // The stuck thread may still owe the guest a signal for
                // answers it committed in line (its chunk's).
                notify(
                    vring,
                    &dev.inner.queue(*q).signals.used,
                    dev.memory().as_deref(),
                );
            }
            // Request queue 0's thread serves hiprio too (`Vq::threads`):
            // stuck, it takes no FORGET or INTERRUPT either.
            if q.thread() == 0 {
                if let Some(hv) = dev.inner.hiprio.vring() {
                    // (Not once stopped: nothing to pop, and each try
                    // would log a not-ready queue.)
                    let live = {
                        let v = hv.get_ref();
                        v.is_enabled() && v.get_queue().ready()
                    };
                    if live {
                        dev.drain_hiprio(hv, ForgetsBy::Engine);
                    }
                }
            }
        }
        drop(dev);
        std::thread::sleep(if stuck.is_empty() {
            Duration::from_millis(10)
        } else {
            Duration::from_millis(2)
        });
    }
}
