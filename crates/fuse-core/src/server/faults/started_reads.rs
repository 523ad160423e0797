//! Faults of READs started without waiting ([`Filesystem::start_read`]),
//! and the `gather` fault: none of them blocks the serving thread.

use super::{cut, Fault, Faulty};
use crate::abi::Opcode;
use crate::chan::{ClientMem, Errno};
use crate::server::{Completions, Ctx, Filesystem, FsResult, IoDone, ReadSink, Wake};
use crate::sync::{lock, wait, Arc, Mutex, Ordering};

/// [`Faulty`]'s host I/O context of a serving loop: the wrapped
/// filesystem's, and where answers given on other threads wait for the
/// loop.
#[derive(Debug)]
pub struct FaultyIo<I> {
    pub(super) inner: I,
    pub(super) back: Back,
}

/// A READ's token and its answer.
type Answer = (IoDone, FsResult<usize>);

/// Answers of a serving loop's READs given on another thread (an
/// interrupt, a release, a gather closed elsewhere), taken by its next
/// `collect_started`, and its wake-up.
#[derive(Clone)]
pub(super) struct Back {
    list: Arc<Mutex<Vec<Answer>>>,
    wake: Wake,
}

impl std::fmt::Debug for Back {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Back").finish_non_exhaustive()
    }
}

impl Back {
    pub(super) fn new(wake: Wake) -> Back {
        Back {
            list: Arc::new(Mutex::new(Vec::new())),
            wake,
        }
    }

    /// Answers `done` with `r` for its loop, and wakes it.
    pub(super) fn give(&self, done: IoDone, r: FsResult<usize>) {
        lock(&self.list).push((done, r));
        (self.wake)();
    }
}

/// Calls held by `gather` (guarded by `Faulty::gather`). Each call joins
/// the open round; the call that makes it `n` strong closes it, and every
/// call of a closed round goes on (a blocked one wakes, a started READ is
/// answered once its data is in).
#[derive(Debug, Default)]
pub(super) struct Gather {
    /// Calls in the open round.
    count: u32,
    /// Rounds closed so far (the open round's number).
    round: u64,
    /// Everything is let go, now and later.
    released: bool,
    /// Started READs held: their round, and their answer once read.
    held: Vec<Held>,
}

#[derive(Debug)]
struct Held {
    unique: u64,
    round: u64,
    done: IoDone,
    back: Back,
    result: Option<FsResult<usize>>,
}

impl Gather {
    /// Joins the open round; true if that closed it.
    fn join(&mut self, n: u32) -> bool {
        self.count += 1;
        if self.count >= n {
            self.count = 0;
            self.round += 1;
            return true;
        }
        false
    }

    fn open(&self, round: u64) -> bool {
        !self.released && round == self.round
    }

    /// Takes the held READs that may be answered now.
    fn ready(&mut self) -> Vec<(IoDone, Back, FsResult<usize>)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.held.len() {
            let h = &self.held[i];
            if h.result.is_some() && !self.open(h.round) {
                let h = self.held.swap_remove(i);
                if let Some(r) = h.result {
                    out.push((h.done, h.back, r));
                }
            } else {
                i += 1;
            }
        }
        out
    }
}

/// A READ to start, as `start_read` got it.
pub(super) struct Read<'a, F: Filesystem> {
    pub(super) ctx: &'a Ctx<'a>,
    pub(super) inode: F::Inode,
    pub(super) handle: F::Handle,
    pub(super) offset: u64,
    pub(super) len: usize,
    pub(super) mem: Arc<dyn ClientMem>,
}

impl<F: Filesystem> Faulty<F> {
    /// Blocks until the open round of `gather=n` is complete (or released).
    pub(super) fn gather_wait(&self, n: u32) {
        self.counts.gathers.fetch_add(1, Ordering::Relaxed);
        let mut g = lock(&self.gather);
        let round = g.round;
        if g.join(n) {
            drop(g);
            self.gather_cv.notify_all();
            self.answer_gathered();
            return;
        }
        while g.open(round) {
            g = wait(&self.gather_cv, g);
        }
    }

    /// Lets every gather go, now and later.
    pub(super) fn release_gathers(&self) {
        lock(&self.gather).released = true;
        self.gather_cv.notify_all();
        self.answer_gathered();
    }

    fn answer_gathered(&self) {
        let ready = lock(&self.gather).ready();
        for (done, back, r) in ready {
            back.give(done, r);
        }
    }

    /// A READ the transport offered to start, under the plan: always
    /// answered through `done`, never blocking (a `delay` aside).
    pub(super) fn read_started(
        &self,
        io: &mut FaultyIo<F::Io>,
        out: &mut Completions,
        read: Read<'_, F>,
        done: IoDone,
    ) {
        let unique = read.ctx.unique;
        match self.draw(Opcode::Read) {
            None => self.start(&mut io.inner, out, read, done),
            Some((Fault::Delay(d), _)) => {
                self.counts.delays.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(d);
                self.start(&mut io.inner, out, read, done)
            }
            Some((Fault::Error(e), _)) => {
                self.counts.errors.fetch_add(1, Ordering::Relaxed);
                out.complete(done, Err(e));
            }
            Some((Fault::Short, r)) => {
                self.counts.shorts.fetch_add(1, Ordering::Relaxed);
                let len = cut(read.len, r);
                self.start(&mut io.inner, out, Read { len, ..read }, done)
            }
            Some((Fault::Hang, _)) => {
                self.counts.hangs.fetch_add(1, Ordering::Relaxed);
                let mut h = lock(&self.hung);
                if h.released || h.interrupted.remove(&unique) {
                    drop(h);
                    out.complete(done, Err(Errno::EINTR));
                } else {
                    // The answer waits here; the READ's memory is not
                    // touched (nothing runs on it), so it is let go now.
                    h.parked.push((unique, done, io.back.clone()));
                }
            }
            Some((Fault::Gather(n), _)) => self.gathered(io, out, read, done, n),
        }
    }

    /// Takes the completions of `io` into `out`: the wrapped filesystem's
    /// (a gathered READ's is kept until its round closes) and the answers
    /// given for this loop on other threads. Returns how many.
    pub(super) fn completed(&self, io: &mut FaultyIo<F::Io>, out: &mut Completions) -> usize {
        let before = out.len();
        if self.plan.rules.is_empty() {
            self.inner.collect_started(&mut io.inner, out);
        } else {
            let mut inner = Completions::default();
            self.inner.collect_started(&mut io.inner, &mut inner);
            self.inner_done(&mut inner, out);
        }
        let given = std::mem::take(&mut *lock(&io.back.list));
        for (done, r) in given {
            out.complete(done, r);
        }
        out.len() - before
    }

    /// Sorts the wrapped filesystem's completions: a gathered READ's goes
    /// to its held place (answered once its round closes too), any other
    /// to `out`.
    fn inner_done(&self, inner: &mut Completions, out: &mut Completions) {
        let mut gathered = false;
        for (unique, r) in inner.drain() {
            let mut g = lock(&self.gather);
            match g
                .held
                .iter_mut()
                .find(|h| h.unique == unique && h.result.is_none())
            {
                Some(h) => {
                    h.result = Some(r);
                    gathered = true;
                }
                None => out.complete(IoDone::new(unique), r),
            }
        }
        if gathered {
            self.answer_gathered();
        }
    }

    /// Reads now (started, or synchronously) and answers when the round of
    /// `gather=n` it joins is complete.
    fn gathered(
        &self,
        io: &mut FaultyIo<F::Io>,
        out: &mut Completions,
        read: Read<'_, F>,
        done: IoDone,
        n: u32,
    ) {
        self.counts.gathers.fetch_add(1, Ordering::Relaxed);
        let unique = read.ctx.unique;
        let closed = {
            let mut g = lock(&self.gather);
            let round = g.round;
            let closed = g.join(n);
            g.held.push(Held {
                unique,
                round,
                done,
                back: io.back.clone(),
                result: None,
            });
            closed
        };
        if closed {
            self.gather_cv.notify_all();
        }
        // The READ's answer goes to its held place; whichever event comes
        // last (its data in, or its round closing) answers it.
        let mut inner = Completions::default();
        self.start(&mut io.inner, &mut inner, read, IoDone::new(unique));
        self.inner_done(&mut inner, out);
        self.answer_gathered();
    }

    /// Starts the READ on the filesystem, or reads it synchronously when the
    /// filesystem serves it the usual way; `done` answers it either way.
    fn start(&self, io: &mut F::Io, out: &mut Completions, read: Read<'_, F>, done: IoDone) {
        let Read {
            ctx,
            inode,
            handle,
            offset,
            len,
            mem,
        } = read;
        let done = match self
            .inner
            .start_read(io, out, ctx, inode, handle, offset, len, &mem, done)
        {
            Ok(()) => return,
            Err(done) => done,
        };
        let mut sink = MemSink {
            mem: &*mem,
            n: len.min(mem.len()),
            spill: Vec::new(),
        };
        let r = self.inner.read(ctx, inode, handle, offset, &mut sink);
        let r = r.and_then(|got| {
            let got = got.min(sink.n);
            if !sink.spill.is_empty() {
                mem.write_at(0, &sink.spill[..got])?;
            }
            Ok(got)
        });
        out.complete(done, r);
    }
}

/// A READ sink over client memory, with a buffer (copied there after) for
/// a filesystem that wants one.
struct MemSink<'a> {
    mem: &'a dyn ClientMem,
    n: usize,
    spill: Vec<u8>,
}

impl ReadSink for MemSink<'_> {
    fn buffer(&mut self) -> &mut [u8] {
        self.spill.resize(self.n, 0);
        &mut self.spill
    }
    fn client(&self) -> Option<(&dyn ClientMem, usize)> {
        Some((self.mem, self.n))
    }
}
