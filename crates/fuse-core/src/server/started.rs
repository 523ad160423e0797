//! Started I/O of one serving loop: the requests whose host I/O a
//! filesystem started without waiting ([`Served::Started`]), held by
//! unique, their completions, and the reply rule applied when a
//! completion is taken ([`complete_started`]).
//!
//! Every serving loop (the device's queue threads, the host kernel's FUSE
//! ring threads, the /dev/fuse workers) owns one [`InFlight`] and alone
//! touches it: it makes each started request's [`ReadDone`] with
//! [`InFlight::done_for`], holds the request with [`InFlight::hold`]
//! (answered at once if its completion is in already), and takes what
//! completed with [`InFlight::take_completed`], each request's reply set
//! and ready to send. A completion given on another thread wakes the loop
//! through the waker it gave [`InFlight::new`].

use super::uring_worker::complete_started;
use super::{FsResult, ReadDone, RingSlot};
use crate::fasthash::IdMap;
use crate::sync::{lock, Arc, Mutex};

/// Completions by unique, as the filesystem reports them.
type Done = Arc<Mutex<Vec<(u64, FsResult<usize>)>>>;

/// Wakes a serving loop waiting for its started I/O.
pub type Wake = Arc<dyn Fn() + Send + Sync>;

/// The started requests of one serving loop (see the module docs).
pub struct InFlight<S> {
    /// Requests whose host I/O runs, by unique.
    slots: IdMap<u64, S>,
    /// Their completions (pushed by their [`ReadDone`]s).
    done: Done,
    /// Called when a completion is pushed on another thread than the
    /// loop's.
    wake: Option<Wake>,
    /// The loop's thread.
    owner: std::thread::ThreadId,
    /// Completions taken by the last [`InFlight::take_completed`] (kept to
    /// reuse its room).
    taken: Vec<(u64, FsResult<usize>)>,
}

impl<S> std::fmt::Debug for InFlight<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("held", &self.slots.len())
            .finish_non_exhaustive()
    }
}

impl<S: RingSlot> InFlight<S> {
    /// An empty one for the loop on this thread; `wake` wakes it when a
    /// completion comes from another thread (None: the loop looks on its
    /// own schedule).
    pub fn new(wake: Option<Wake>) -> Self {
        InFlight {
            slots: IdMap::default(),
            done: Arc::new(Mutex::new(Vec::new())),
            wake,
            owner: std::thread::current().id(),
            taken: Vec::new(),
        }
    }

    /// The completion of started request `unique` (for
    /// [`super::serve_slot`]'s `start`).
    pub fn done_for(&self, unique: u64) -> ReadDone {
        let (done, wake, owner) = (self.done.clone(), self.wake.clone(), self.owner);
        ReadDone::new(move |r| {
            lock(&done).push((unique, r));
            // Given on the loop's own thread (its completions, a page-cache
            // hit): seen before it waits. Else wake it.
            if let Some(w) = wake.filter(|_| std::thread::current().id() != owner) {
                w();
            }
        })
    }

    /// Holds started request `unique` in `slot` until its completion is
    /// taken; or, if it completed already (before the filesystem returned:
    /// the page cache held it), gives the slot back with its reply set.
    pub fn hold(&mut self, unique: u64, mut slot: S) -> Option<S> {
        let r = {
            let mut d = lock(&self.done);
            let i = d.iter().rposition(|(u, _)| *u == unique);
            i.map(|i| d.swap_remove(i).1)
        };
        match r {
            Some(r) => {
                complete_started(&mut slot, r);
                Some(slot)
            }
            None => {
                self.slots.insert(unique, slot);
                None
            }
        }
    }

    /// Takes every completion in, setting each request's reply, and hands
    /// the request to `answer` (to send). Returns how many.
    pub fn take_completed(&mut self, mut answer: impl FnMut(S)) -> usize {
        std::mem::swap(&mut *lock(&self.done), &mut self.taken);
        let mut n = 0;
        for (unique, r) in self.taken.drain(..) {
            let Some(mut slot) = self.slots.remove(&unique) else {
                continue;
            };
            complete_started(&mut slot, r);
            answer(slot);
            n += 1;
        }
        n
    }

    /// Requests held (their I/O not taken as completed).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}
