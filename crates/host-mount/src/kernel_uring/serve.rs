//! Serving one queue of the kernel's FUSE ring with many requests in
//! flight on one thread.
//!
//! The thread registers `depth` entries. Whatever they fetched is served
//! in one pass: a READ the filesystem can start without waiting
//! ([`Filesystem::read_async`], on the io_uring of the passthrough's host
//! I/O context, which the thread owns: [`Filesystem::new_io`]) is
//! started straight into the entry's payload buffer and left running, so
//! the thread goes on to the next fetched request; so is a WRITE
//! ([`Filesystem::write_async`]) from the payload buffer its data came
//! in, its `fuse_write_out` put there once it is over; everything else is
//! served in line and its COMMIT_AND_FETCH queued. Started I/O is
//! submitted as soon as it is started (at most a system call each), not
//! once a pass: submitted together at the pass's end, 16 O_DIRECT reads
//! reached the disk together, came back together, and the queue's next
//! 16 waited on that convoy (cold 4 KiB reads at depth 16: about 1.1x the
//! once-a-pass build, 0.63x to 0.67x of raw fio in a 20-round run;
//! docs/BENCHMARKS.md, "Breaking the convoy"); what is started is what
//! waits for the disk or a worker, so the system call is small beside
//! what it starts. The /dev/fuse workers (`devfuse::serve`) do the same.
//! Then finished READs are taken and their entries' commits
//! queued, and the thread waits: the queued commits
//! go to the kernel in the same io_uring_enter that waits for what comes
//! next. A started READ's COMMIT_AND_FETCH is issued when its I/O
//! completes, in any order with the others (the kernel's entries are
//! independent).
//!
//! One wait point: the filesystem's completion eventfd is polled
//! (IORING_OP_POLL_ADD) on the queue's own ring, beside its FUSE commands
//! and the eventfd [`KernelQueue::wake_queue`] writes. That ring is the thread's
//! (SINGLE_ISSUER, DEFER_TASKRUN): the one `io_uring_enter` that submits
//! the pass's commits also waits for new requests, READ completions and
//! answers given on other threads, with no epoll set and no extra system
//! call to wait on a second ring. (The READs themselves run on the
//! filesystem's own io_uring, in the host I/O context the thread owns,
//! which this crate's passthrough makes and registers its fixed buffers
//! with; sharing one ring for both would tie the passthrough to this
//! transport.)
//!
//! Requests still go through the same dispatcher as every other transport
//! (the kernel did admission and times requests out; FUSE_INTERRUPT
//! arrives on /dev/fuse and cancels a started READ by its unique through
//! the filesystem). A request that waits (SETLKW) is parked on its entry
//! and another entry is registered in its place, as `run_ring_worker`
//! does; then the kernel is nudged ([`KernelQueue::nudge`]), since the
//! requests that queued up while no entry was free go only to an entry
//! that commits, and the parked one will not. FSYNC, FSYNCDIR and
//! FALLOCATE are started like READs where the filesystem can (their
//! waits run on its io_uring's io-wq workers); the rest, and what the
//! filesystem declines, are served in line (see docs/DESIGN.md).
//!
//! A READ that hangs holds only its own entry: the others keep serving.
//! When the connection goes, the thread's entries are dropped, but the
//! payload slot a READ still reads into stays mapped until its completion
//! is taken (see `kernel_uring::arena`); the thread itself ends only once
//! the ring of its host I/O context (dropped with its server, before the
//! entries it holds) has cancelled and drained its I/O, so a
//! READ stuck in the host (a hard NFS mount) holds the thread until the
//! daemon's grace period at exit.

use super::{EntState, KernelQueue, KernelSlot};
use fuse_core::abi::Opcode;
use fuse_core::locks::lock;
use fuse_core::server::RingSlot;
use fuse_core::server::{serve_slot, Deferred, Dispatcher, Filesystem, InFlight, Served, Start};
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
    started: InFlight<KernelSlot>,
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
            started: InFlight::new(),
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
                    self.disp.fs().submit_async(&mut self.io);
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
            if self.q.wait(self.disp.fs().async_fd(&self.io))? {
                if let Some(fd) = self.disp.fs().async_fd(&self.io) {
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
            Some(Start {
                io: &mut self.io,
                done: self.started.completions(),
            }),
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
                // Answered before read_async returned (the page cache held
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
                .complete_async(&mut self.io, self.started.completions());
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
