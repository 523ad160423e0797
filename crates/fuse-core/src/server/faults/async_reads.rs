//! Faults of READs started without waiting ([`Filesystem::read_async`]),
//! and the `gather` fault: none of them blocks the serving thread.

use super::{cut, Fault, Faulty};
use crate::abi::Opcode;
use crate::chan::{ClientMem, Errno};
use crate::server::{Ctx, Filesystem, FsResult, ReadDone, ReadSink};
use crate::sync::{lock, wait, Arc, Ordering};

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
    id: u64,
    round: u64,
    done: ReadDone,
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
    fn ready(&mut self) -> Vec<(ReadDone, FsResult<usize>)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.held.len() {
            let h = &self.held[i];
            if h.result.is_some() && !self.open(h.round) {
                let h = self.held.swap_remove(i);
                if let Some(r) = h.result {
                    out.push((h.done, r));
                }
            } else {
                i += 1;
            }
        }
        out
    }
}

/// A READ to start, as `read_async` got it.
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
        for (done, r) in ready {
            done.complete(r);
        }
    }

    /// A READ the transport offered to start, under the plan: always
    /// answered through `done`, never blocking (a `delay` aside).
    pub(super) fn read_started(&self, read: Read<'_, F>, done: ReadDone) {
        let unique = read.ctx.unique;
        match self.draw(Opcode::Read) {
            None => self.start(read, done),
            Some((Fault::Delay(d), _)) => {
                self.counts.delays.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(d);
                self.start(read, done)
            }
            Some((Fault::Error(e), _)) => {
                self.counts.errors.fetch_add(1, Ordering::Relaxed);
                done.complete(Err(e));
            }
            Some((Fault::Short, r)) => {
                self.counts.shorts.fetch_add(1, Ordering::Relaxed);
                let len = cut(read.len, r);
                self.start(Read { len, ..read }, done)
            }
            Some((Fault::Hang, _)) => {
                self.counts.hangs.fetch_add(1, Ordering::Relaxed);
                let mut h = lock(&self.hung);
                if h.released || h.interrupted.remove(&unique) {
                    drop(h);
                    done.complete(Err(Errno::EINTR));
                } else {
                    // The answer waits here; the READ's memory is not
                    // touched (nothing runs on it), so it is let go now.
                    h.parked.push((unique, done));
                }
            }
            Some((Fault::Gather(n), _)) => self.gathered(read, done, n),
        }
    }

    /// Reads now (started, or in line) and answers when the round of
    /// `gather=n` it joins is complete.
    fn gathered(&self, read: Read<'_, F>, done: ReadDone, n: u32) {
        self.counts.gathers.fetch_add(1, Ordering::Relaxed);
        // std's: a static needs a const constructor, which loom's atomics
        // lack; it only numbers the calls.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let closed = {
            let mut g = lock(&self.gather);
            let round = g.round;
            let closed = g.join(n);
            g.held.push(Held {
                id,
                round,
                done,
                result: None,
            });
            closed
        };
        if closed {
            self.gather_cv.notify_all();
        }
        // The READ's answer goes to its held place; whichever event comes
        // last (its data in, or its round closing) answers it.
        let gather = self.gather.clone();
        self.start(
            read,
            ReadDone::new(move |r| {
                let ready = {
                    let mut g = lock(&gather);
                    if let Some(h) = g.held.iter_mut().find(|h| h.id == id) {
                        h.result = Some(r);
                    }
                    g.ready()
                };
                for (done, r) in ready {
                    done.complete(r);
                }
            }),
        );
        self.answer_gathered();
    }

    /// Starts the READ on the filesystem, or reads it in line when the
    /// filesystem serves it the usual way; `done` answers it either way.
    fn start(&self, read: Read<'_, F>, done: ReadDone) {
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
            .read_async(ctx, inode, handle, offset, len, mem.clone(), done)
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
        done.complete(r);
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
