//! Started I/O of one serving loop: the requests whose host I/O a
//! filesystem started without waiting ([`Served::Started`]), held by
//! unique, their completions, and the reply rule applied when a
//! completion is taken ([`complete_started`]).
//!
//! Every serving loop owns one [`StartedIo`] and the host I/O context made
//! for it ([`Filesystem::new_io`]), lent together to [`super::serve_slot`]
//! as a [`Start`]: the loop that owns the context alone completes what was
//! started on it. Each started request's [`IoDone`] comes back with its
//! result into the [`Completions`]; [`StartedIo::hold`] answers at once a
//! request already complete, [`StartedIo::take_completed`] sets the replies
//! of the rest. Nothing here is shared: no lock, no allocation per request.
//!
//! [`Served::Started`]: super::Served::Started
//! [`Filesystem::new_io`]: super::Filesystem::new_io

use super::uring_worker::complete_started;
use super::{FsResult, IoDone, RingSlot};
use crate::fasthash::IdMap;
use std::sync::Arc;

/// Wakes a serving loop waiting for its started I/O (given to
/// [`super::Filesystem::new_io`]).
pub type Wake = Arc<dyn Fn() + Send + Sync>;

/// The results of a serving loop's started requests, by unique, as the
/// filesystem hands their tokens back.
#[derive(Debug, Default)]
pub struct Completions {
    list: Vec<(u64, FsResult<usize>)>,
}

impl Completions {
    /// Hands `done` back with the request's result (the bytes read or
    /// written, or 0; or the error); its fence guard goes with it.
    pub fn complete(&mut self, done: IoDone, r: FsResult<usize>) {
        self.list.push((done.unique(), r));
    }

    /// Takes every result out, by unique (a filesystem that wraps
    /// another looks at its inner one's).
    pub fn drain(&mut self) -> std::vec::Drain<'_, (u64, FsResult<usize>)> {
        self.list.drain(..)
    }

    /// Results not taken yet.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The result of `unique`, if it is in.
    fn take(&mut self, unique: u64) -> Option<FsResult<usize>> {
        let i = self.list.iter().rposition(|(u, _)| *u == unique)?;
        Some(self.list.swap_remove(i).1)
    }
}

/// What a serving loop lends to start host I/O: its filesystem's I/O
/// context and where completions go.
pub struct Start<'a, I> {
    /// The loop's host I/O context.
    pub io: &'a mut I,
    /// The loop's completions.
    pub done: &'a mut Completions,
    /// Called by [`super::serve_slot`] before it serves the request
    /// synchronously (a host call that may block): a loop that holds
    /// answers back to give them together gives them here, so none waits
    /// behind a call that may hang.
    pub before_sync: Option<&'a mut dyn FnMut()>,
}

impl<'a, I> Start<'a, I> {
    /// A loop's context and completions, holding no answers back.
    pub fn new(io: &'a mut I, done: &'a mut Completions) -> Start<'a, I> {
        Start {
            io,
            done,
            before_sync: None,
        }
    }
}

impl<I> std::fmt::Debug for Start<'_, I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Start")
            .field("done", &self.done)
            .field("before_sync", &self.before_sync.is_some())
            .finish_non_exhaustive()
    }
}

/// The started requests of one serving loop (see the module docs).
pub struct StartedIo<S> {
    /// Requests whose host I/O runs, by unique.
    slots: IdMap<u64, S>,
    /// Their completions, as the filesystem hands them back.
    done: Completions,
    /// Room for the completions [`StartedIo::take_completed`] takes.
    taken: Vec<(u64, FsResult<usize>)>,
}

impl<S> std::fmt::Debug for StartedIo<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StartedIo")
            .field("held", &self.slots.len())
            .field("done", &self.done.len())
            .finish_non_exhaustive()
    }
}

impl<S> Default for StartedIo<S> {
    fn default() -> Self {
        StartedIo {
            slots: IdMap::default(),
            done: Completions::default(),
            taken: Vec::new(),
        }
    }
}

impl<S: RingSlot> StartedIo<S> {
    /// An empty one.
    pub fn new() -> Self {
        Self::default()
    }

    /// Where the filesystem hands completions back.
    pub fn completions(&mut self) -> &mut Completions {
        &mut self.done
    }

    /// Holds started request `unique` in `slot` until its completion is
    /// taken; or, if it completed already (before the filesystem returned:
    /// the page cache held it), gives the slot back with its reply set.
    pub fn hold(&mut self, unique: u64, mut slot: S) -> Option<S> {
        match self.done.take(unique) {
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
    /// the request to `answer` (to send). A completion of a request it
    /// does not hold is dropped. Returns how many it answered.
    pub fn take_completed(&mut self, mut answer: impl FnMut(S)) -> usize {
        std::mem::swap(&mut self.done.list, &mut self.taken);
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
