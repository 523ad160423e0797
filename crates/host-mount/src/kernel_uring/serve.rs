//! Serving one queue of the kernel's FUSE ring with many requests in
//! flight on one thread ([`serve_queue`]).
//!
//! The thread registers `depth` entries and serves what they fetched in
//! passes. A READ, WRITE, FSYNC, FSYNCDIR or FALLOCATE the filesystem can
//! start runs on the thread's host I/O context ([`Filesystem::new_io`]),
//! straight on the entry's payload buffer, and is submitted as soon as it
//! is started (once a pass, a pass's reads would reach the disk, and come
//! back, as one convoy); the rest is served synchronously. The COMMIT_AND_FETCHes
//! of what is answered go to the kernel in the one `io_uring_enter` that
//! also waits for new requests, the filesystem's completion eventfd and
//! [`KernelQueue::wake_queue`]. A parked SETLKW keeps its entry, another is
//! registered and the kernel nudged ([`KernelQueue::nudge`]). A hung
//! request holds only its own entry. See docs/DESIGN.md, "Host mounts".

use super::{EntState, KernelQueue, KernelSlot};
use fuse_core::abi::Opcode;
use fuse_core::locks::lock;
use fuse_core::server::RingSlot;
use fuse_core::server::{serve_slot, Deferred, Dispatcher, Filesystem, Served, Start, StartedIo};
use fuse_core::Errno;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Entries per queue when nothing else is said: fio at iodepth=16 on one
/// CPU keeps 16 requests in flight on that CPU's queue.
pub const DEFAULT_DEPTH: usize = 16;

/// Answers of parked requests by unique, pushed from whichever thread
/// answers them.
type Answers<T> = Arc<Mutex<Vec<(u64, T)>>>;

/// What a queue served (for the daemon's log).
#[derive(Debug, Default, Clone, Copy)]
pub struct QueueStats {
    /// Requests served.
    pub served: u64,
    /// READs, WRITEs and syncs the filesystem took to start without waiting
    /// (READs the page cache held were answered at once, in the same
    /// pass).
    pub started: u64,
    /// The most started requests unanswered at once (the one just started
    /// included).
    pub max_in_flight: usize,
    /// Requests parked (lock waits that did not end at once), each
    /// followed by a [`KernelQueue::nudge`].
    pub parked: u64,
    /// Nudges whose NOTIFY_REPLY came back to this queue and was committed.
    pub nudged: u64,
    /// Nudges the kernel refused (tried again after the next pass).
    pub nudge_failed: u64,
    /// WRITEs the filesystem took to start without waiting (counted in
    /// `started` too).
    pub writes_started: u64,
    /// FSYNCs, FSYNCDIRs and FALLOCATEs the filesystem took to start
    /// without waiting (counted in `started` too).
    pub no_data_started: u64,
}

/// Serves queue `q` with `disp` until the connection goes (or
/// [`KernelQueue::shutdown`]), keeping up to `depth` requests in flight.
/// A clean end (ENOTCONN) is Ok.
pub fn serve_queue<F: Filesystem>(
    q: &KernelQueue,
    disp: &Dispatcher<F>,
    depth: usize,
) -> Result<QueueStats, Errno> {
    let mut s = Server::new(q, disp);
    match s.run(depth.max(1)) {
        Err(Errno::ENOTCONN) => Ok(s.stats),
        Err(e) => Err(e),
        Ok(()) => Ok(s.stats),
    }
}

/// One serving thread's entries that hold requests, by unique: this
/// thread alone touches them (no lock).
struct Server<'a, F: Filesystem> {
    q: &'a KernelQueue,
    disp: &'a Dispatcher<F>,
    /// The filesystem's host I/O context of this thread: what it starts
    /// runs there, and only this thread completes it.
    io: F::Io,
    /// Requests whose host I/O runs (`Started` entries) and their
    /// completions.
    started: StartedIo<KernelSlot>,
    /// Requests waiting for something outside the server (`Parked`).
    parked: HashMap<u64, KernelSlot>,
    /// Answered parked requests (errno, as [`Deferred`] gives it).
    answered: Answers<i32>,
    /// Entries registered beyond the depth, for parked requests: as many
    /// as were ever parked at once, so `depth` entries always stay free for
    /// new requests (the unlock that ends the waits among them). No cap: a
    /// cap left a queue with every entry holding a lock wait, and the
    /// holder's unlock with nowhere to go.
    extra: usize,
    /// The files of the requests parked and not yet nudged for: one nudge
    /// each once the pass is over (kept until the kernel takes it).
    nudges: Vec<u64>,
    scratch: Vec<u8>,
    stats: QueueStats,
}

impl<'a, F: Filesystem> Server<'a, F> {
    fn new(q: &'a KernelQueue, disp: &'a Dispatcher<F>) -> Self {
        Server {
            q,
            disp,
            io: disp.fs().new_io({
                let q = q.clone();
                Arc::new(move || q.wake_queue())
            }),
            started: StartedIo::new(),
            parked: HashMap::new(),
            answered: Arc::new(Mutex::new(Vec::new())),
            extra: 0,
            nudges: Vec::new(),
            scratch: vec![0u8; 64 * 1024],
            stats: QueueStats::default(),
        }
    }

    fn run(&mut self, depth: usize) -> Result<(), Errno> {
        for _ in 0..depth {
            self.q.register_entry(0)?;
        }
        let mut fetched = Vec::new();
        loop {
            let failed = self.q.take_fetched(&mut fetched);
            for slot in fetched.drain(..) {
                let started = self.stats.started;
                self.serve(slot)?;
                // What was started goes to the host at once (see the
                // module's doc: submitted once a pass, the pass's reads
                // reached the disk together and came back together).
                if self.stats.started != started {
                    self.disp.fs().submit_started(&mut self.io);
                }
            }
            self.nudge();
            self.finish()?;
            if let Some(e) = failed {
                return Err(e);
            }
            if self.q.stopping() {
                return Err(Errno::ENOTCONN);
            }
            if self.q.wait(self.disp.fs().started_fd(&self.io))? {
                if let Some(fd) = self.disp.fs().started_fd(&self.io) {
                    // The filesystem's non-blocking eventfd: that resets it.
                    host_io::sys::eventfd_drain(fd);
                }
            }
        }
    }

    /// Serves one fetched request: starts it, parks it, or answers it and
    /// queues its commit.
    fn serve(&mut self, mut slot: KernelSlot) -> Result<(), Errno> {
        let hdr = slot.in_header();
        if KernelQueue::is_nudge(&hdr) {
            self.stats.nudged += 1;
            slot.set_reply(0, 0);
            self.q.commit_slot(slot)?;
            return Ok(());
        }
        self.stats.served += 1;
        let unique = hdr.unique;
        let defer = |unique: u64| {
            let (answered, q) = (self.answered.clone(), self.q.clone());
            Deferred::new(move |error| {
                lock(&answered).push((unique, error));
                q.wake_queue();
            })
        };
        match serve_slot(
            self.disp,
            &mut slot,
            &mut self.scratch,
            Some(&defer),
            Some(Start::new(&mut self.io, self.started.completions())),
        ) {
            Served::Started => {
                self.stats.started += 1;
                if slot.is_write() {
                    self.stats.writes_started += 1;
                }
                let op = slot.in_header().opcode;
                if [Opcode::Fsync, Opcode::Fsyncdir, Opcode::Fallocate]
                    .iter()
                    .any(|&o| op == o as u32)
                {
                    self.stats.no_data_started += 1;
                }
                self.stats.max_in_flight = self.stats.max_in_flight.max(self.started.len() + 1);
                slot.set_state(EntState::Started);
                // Answered before start_read returned (the page cache held
                // it): its commit goes with this pass.
                if let Some(slot) = self.started.hold(unique, slot) {
                    self.q.commit_slot(slot)?;
                }
            }
            Served::Parked => {
                slot.set_state(EntState::Parked);
                // Answered before the filesystem returned (the lock was
                // free, or an unlock): its commit goes with this pass.
                if let Some(error) = take(&self.answered, unique) {
                    slot.set_reply(error, 0);
                    self.q.commit_slot(slot)?;
                    return Ok(());
                }
                self.parked.insert(unique, slot);
                self.stats.parked += 1;
                // Its entry makes no commit, and a commit is what hands an
                // entry the requests that queued up while none was free
                // (see `KernelQueue::nudge`).
                self.nudges.push(hdr.nodeid);
                // The parked request keeps its entry: another one takes its
                // place (unless one freed by an earlier wait's end already
                // has), so the queue keeps its depth.
                if self.parked.len() > self.extra {
                    self.extra += 1;
                    self.q.register_entry(0)?;
                }
            }
            Served::Answered => {
                self.q.commit_slot(slot)?;
            }
        }
        Ok(())
    }

    /// Nudges the kernel once for each request parked since the last
    /// nudge (each restarts one chain of commits). A refused one (the
    /// connection going: its commands fail too; a transient error) stays
    /// for the next pass.
    fn nudge(&mut self) {
        while let Some(&nodeid) = self.nudges.last() {
            if self.q.nudge(nodeid).is_err() {
                self.stats.nudge_failed += 1;
                return;
            }
            self.nudges.pop();
        }
    }

    /// Takes the filesystem's completions and queues the commits of every
    /// READ and parked request answered since the last pass.
    fn finish(&mut self) -> Result<(), Errno> {
        if !self.started.is_empty() {
            self.disp
                .fs()
                .collect_started(&mut self.io, self.started.completions());
        }
        let mut failed = Ok(());
        self.started.take_completed(|slot| {
            if let Err(e) = self.q.commit_slot(slot) {
                failed = Err(e);
            }
        });
        failed?;
        let answered = std::mem::take(&mut *lock(&self.answered));
        for (unique, error) in answered {
            if let Some(mut slot) = self.parked.remove(&unique) {
                slot.set_reply(error, 0);
                self.q.commit_slot(slot)?;
            }
        }
        Ok(())
    }
}

/// The answer of `unique` if it is already in.
fn take<T>(list: &Answers<T>, unique: u64) -> Option<T> {
    let mut l = lock(list);
    let i = l.iter().rposition(|(u, _)| *u == unique)?;
    Some(l.swap_remove(i).1)
}
