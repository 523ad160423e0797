//! Guest notifications: one per chunk of answers its vring thread gives
//! in line rather than one per answer ([`Signals`]), and how the chunks
//! are cut ([`Chunks`]).

use super::rings::Used;
use super::{GuestMem, GuestMmap, Vring};
use fuse_core::locks::read;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::RwLock;
use vhost_user_backend::VringT;
use vm_memory::GuestAddressSpace;

/// Signals the guest if it wants to hear about the used buffers `used`
/// published on `vring` since the last look (always when no guest memory
/// is at hand to read its wish in: a spurious signal is harmless).
pub(super) fn notify(vring: &Vring, used: &Used, mem: Option<&GuestMmap>) {
    let wanted = match mem {
        Some(mem) => used.needs_notification(vring, mem),
        None => {
            used.forget_unsignalled(vring);
            true
        }
    };
    if wanted {
        let _ = vring.signal_used_queue();
    }
}

/// The calling thread, as a number no other live thread has.
fn this_thread() -> usize {
    // SAFETY: pthread_self has no preconditions and cannot fail.
    unsafe { libc::pthread_self() as usize }
}

/// A request queue's guest notifications. While its vring thread has a
/// batch open ([`Signals::open`]), the answers that thread gives are
/// signalled once, when the batch closes; answers given on other threads
/// (workers, lock calls) are signalled at once. Held around a chunk of
/// requests served in line and around a reaped batch of completions: held
/// across a whole kick, the guest heard of nothing until every chain was
/// served and could not refill its queue meanwhile; signalled per answer,
/// a guest that reaps as fast as the device answers is woken for each.
#[derive(Debug, Default)]
pub(super) struct Signals {
    /// The thread with a batch open ([`this_thread`]), or 0. Only that
    /// thread sets or clears it, so a thread that reads its own number
    /// has the batch open.
    owner: AtomicUsize,
    /// The owner answered since it opened the batch.
    owed: AtomicBool,
    /// The queue's used ring.
    pub(super) used: Used,
}

impl Signals {
    /// An answer was published on the queue's `vring` (in `mem`):
    /// signalled now, or when this thread's open batch closes.
    pub(super) fn answered(&self, vring: &Vring, mem: &GuestMmap) {
        if self.owner.load(Ordering::Relaxed) == this_thread() {
            self.owed.store(true, Ordering::Relaxed);
        } else {
            notify(vring, &self.used, Some(mem));
        }
    }

    /// Opens a batch on this thread (a batch opened inside an open one is
    /// part of it); when it closes owing a signal, the guest's wish is
    /// read in the device's memory then (`mem`).
    pub(super) fn open<'a>(
        &'a self,
        vring: &'a Vring,
        mem: &'a RwLock<Option<GuestMem>>,
    ) -> SignalBatch<'a> {
        let me = this_thread();
        let outer = self.owner.load(Ordering::Relaxed) != me;
        if outer {
            self.owner.store(me, Ordering::Relaxed);
        }
        SignalBatch {
            signals: self,
            vring,
            mem,
            outer,
        }
    }
}

/// An open batch of [`Signals`]; closing it (drop) signals what it owes.
pub(super) struct SignalBatch<'a> {
    signals: &'a Signals,
    vring: &'a Vring,
    mem: &'a RwLock<Option<GuestMem>>,
    outer: bool,
}

impl Drop for SignalBatch<'_> {
    fn drop(&mut self) {
        if self.outer {
            self.signals.owner.store(0, Ordering::Relaxed);
            if self.signals.owed.swap(false, Ordering::Relaxed) {
                let mem = read(self.mem).as_ref().map(GuestAddressSpace::memory);
                notify(self.vring, &self.signals.used, mem.as_deref());
            }
        }
    }
}

/// How long a chunk of answers given in line may wait for its
/// notification by default (`DeviceConfig::chunk_time`): once serving a
/// chunk took this long, what was answered is signalled, so a guest
/// waiting on an early answer does not wait for the rest of its chunk.
pub(super) const CHUNK_TIME: std::time::Duration = std::time::Duration::from_micros(50);

/// A request served in line that took this part of the chunk time (5 µs
/// by default) is signalled at once, with the answers before it: beside
/// a metadata call a notification of its own costs little, beside a
/// cached 4 KiB read it does not (docs/BENCHMARKS.md, "The short request
/// path, third steps").
pub(super) const SLOW_REQUEST_PART: u32 = 10;

/// How a vring thread cuts the requests it serves in line into chunks,
/// each answered with one guest notification: `submit_batch` requests,
/// or one at a time after a chunk that was slow (it took the chunk time,
/// or one of its requests took [`SLOW_REQUEST_PART`] of it) or moved a
/// large READ or WRITE (at least [`LARGE`] bytes), so a guest
/// hears of slow and large answers as each is done rather than after
/// several (a large copy takes as long as many small requests).
#[derive(Debug)]
pub(super) struct Chunks {
    size: usize,
    /// The next chunk is a single request (the last one was slow).
    single: bool,
    /// The last round's requests were all answered at once, with no
    /// synchronous host call (READs the page cache held).
    quick: bool,
}

/// A READ or WRITE at least this large makes the next chunks single.
pub(super) const LARGE: usize = 64 * 1024;

/// Requests popped in a round after a quick one ([`Chunks::round_len`]).
pub(super) const QUICK_ROUND: usize = 16;

impl Chunks {
    pub(super) fn new(size: usize) -> Chunks {
        Chunks {
            size: size.max(1),
            single: false,
            quick: false,
        }
    }

    /// Requests in the next chunk.
    pub(super) fn next_len(&self) -> usize {
        if self.single {
            1
        } else {
            self.size
        }
    }

    /// Requests to pop in the next round: one chunk, or up to
    /// [`QUICK_ROUND`] after a quick round (popping and sending cached
    /// READs together costs less per request; each chunk of them is still
    /// signalled on its own). A round with a request served synchronously
    /// keeps rounds of one chunk: the guest hears of its first answers
    /// before the rest of the queue is popped.
    pub(super) fn round_len(&self) -> usize {
        if self.quick && !self.single {
            QUICK_ROUND.max(self.size)
        } else {
            self.next_len()
        }
    }

    /// A round was served; `slow`: it took the chunk time or moved a
    /// large READ or WRITE; `quick`: its requests were all answered at
    /// once, none synchronously.
    pub(super) fn served(&mut self, slow: bool, quick: bool) {
        self.single = slow;
        self.quick = quick;
    }
}
