//! Background admission: `num_background`, `active_background`, the
//! background queue and the FIFO of parked requesters (`blocked_waitq`).
//! Everything here is guarded by `bg_lock` (the `Mutex<BgState>` in Core),
//! which is separate from the connection lock.
//!
//! Waking is a hand-off: a freed slot is *granted* to the oldest parked
//! waiter under `bg_lock` (its `num_background` is reserved for it) before
//! it is woken, so a caller that arrives later can never overtake it, and
//! exactly one waiter is woken per free slot.

use super::req::{Location, Request};
use crate::sync::{Arc, AtomicU8, Condvar, Ordering};
use std::collections::VecDeque;

/// Default `max_background` (kernel FUSE_DEFAULT_MAX_BACKGROUND).
pub const DEFAULT_MAX_BACKGROUND: u32 = 12;
/// Default `congestion_threshold` (3/4 of the default maximum).
pub const DEFAULT_CONGESTION_THRESHOLD: u32 = DEFAULT_MAX_BACKGROUND * 3 / 4;

/// State of a parked requester.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum SlotState {
    /// On the wait queue.
    Waiting = 0,
    /// Admitted by a granter (for background: a slot was reserved for it).
    Granted = 1,
    /// The connection was aborted while it waited.
    Released = 2,
}

/// One parked requester (an exclusive entry on `blocked_waitq`).
#[derive(Debug)]
pub(crate) struct WaitSlot {
    pub for_background: bool,
    /// A [`SlotState`]; written only under `bg_lock`.
    state: AtomicU8,
    /// Woken by the granter, the aborter or a signal.
    pub cv: Condvar,
}

impl WaitSlot {
    pub(crate) fn new(for_background: bool) -> Arc<WaitSlot> {
        Arc::new(WaitSlot {
            for_background,
            state: AtomicU8::new(SlotState::Waiting as u8),
            cv: Condvar::new(),
        })
    }
    pub(crate) fn state(&self) -> SlotState {
        match self.state.load(Ordering::SeqCst) {
            0 => SlotState::Waiting,
            1 => SlotState::Granted,
            _ => SlotState::Released,
        }
    }
    fn set(&self, s: SlotState) {
        self.state.store(s as u8, Ordering::SeqCst);
        self.cv.notify_all();
    }
}

/// How many waiters a wake-up event may admit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WakeBudget {
    /// One per free slot (the fixed behaviour).
    PerFreeSlot,
    /// At most one, whatever was freed (the pre-fix kernel's `wake_up`).
    One,
}

/// Background and admission state, guarded by `bg_lock`.
#[derive(Debug)]
pub(crate) struct BgState {
    /// Cleared by abort (under `bg_lock`, as the kernel does).
    pub connected: bool,
    /// Admission gate: INIT processed.
    pub initialized: bool,
    /// Admission gate: every ring queue has an entry (true without a ring).
    pub ring_ready: bool,
    pub max_background: u32,
    pub congestion_threshold: u32,
    /// Background requests admitted and not yet ended (incl. reserved slots).
    pub num_background: u32,
    /// Background requests moved to the input queue and not yet ended.
    pub active_background: u32,
    /// Admitted background requests waiting for an active slot.
    pub queue: VecDeque<Arc<Request>>,
    /// Parked requesters, oldest first.
    pub waiters: VecDeque<Arc<WaitSlot>>,
}

impl BgState {
    pub(crate) fn new(max_background: u32, congestion_threshold: u32) -> Self {
        BgState {
            connected: true,
            initialized: false,
            ring_ready: true,
            max_background,
            congestion_threshold,
            num_background: 0,
            active_background: 0,
            queue: VecDeque::new(),
            waiters: VecDeque::new(),
        }
    }

    fn gate_open(&self) -> bool {
        self.initialized && self.ring_ready
    }

    /// The kernel's `blocked`: background admission is closed.
    pub(crate) fn blocked(&self) -> bool {
        self.num_background >= self.max_background
    }

    /// Whether a new caller may be admitted right now without parking. FIFO:
    /// a caller never overtakes a parked waiter of its own kind.
    pub(crate) fn try_admit(&mut self, for_background: bool) -> bool {
        if !self.gate_open() {
            return false;
        }
        if !for_background {
            return true;
        }
        if self.blocked() || self.waiters.iter().any(|w| w.for_background) {
            return false;
        }
        self.num_background += 1;
        true
    }

    /// Grants parked waiters in FIFO order: every synchronous waiter once the
    /// gate is open, and background waiters while slots are free (limited by
    /// `budget`). Returns how many were granted.
    pub(crate) fn grant(&mut self, budget: WakeBudget) -> usize {
        if !self.gate_open() {
            return 0;
        }
        let mut granted = 0;
        let mut bg_granted = 0;
        let mut i = 0;
        while i < self.waiters.len() {
            let w = &self.waiters[i];
            let admit = if !w.for_background {
                true
            } else if self.blocked() || (budget == WakeBudget::One && bg_granted == 1) {
                false
            } else {
                self.num_background += 1;
                bg_granted += 1;
                true
            };
            if admit {
                if let Some(w) = self.waiters.remove(i) {
                    w.set(SlotState::Granted);
                    granted += 1;
                }
            } else {
                i += 1;
            }
        }
        granted
    }

    /// Removes a waiter that gave up (killed while parked).
    pub(crate) fn remove_waiter(&mut self, slot: &Arc<WaitSlot>) {
        self.waiters.retain(|w| !Arc::ptr_eq(w, slot));
    }

    /// Releases every parked waiter (abort).
    pub(crate) fn release_all(&mut self) {
        for w in self.waiters.drain(..) {
            w.set(SlotState::Released);
        }
    }

    /// Returns a reserved slot that was not used (e.g. the connection died
    /// between admission and queueing) and hands it on.
    pub(crate) fn unreserve(&mut self, budget: WakeBudget) {
        self.unreserve_n(1, budget);
    }

    /// Returns `n` slots at once. With [`WakeBudget::PerFreeSlot`] this
    /// is `n` calls of [`BgState::unreserve`] (each free slot goes to a
    /// waiter either way); the single wake-up grants one per call.
    pub(crate) fn unreserve_n(&mut self, n: u32, budget: WakeBudget) {
        match budget {
            WakeBudget::PerFreeSlot => {
                self.num_background = self.num_background.saturating_sub(n);
                self.grant(budget);
            }
            WakeBudget::One => {
                for _ in 0..n {
                    self.num_background = self.num_background.saturating_sub(1);
                    self.grant(budget);
                }
            }
        }
    }

    /// Moves background requests to the active set while under the limit
    /// (the kernel's `flush_bg_queue`). The caller sends them, still holding
    /// `bg_lock`, so they reach the input queue in admission order.
    pub(crate) fn flush(&mut self) -> Vec<Arc<Request>> {
        let mut out = Vec::new();
        while self.active_background < self.max_background {
            let Some(req) = self.queue.pop_front() else {
                break;
            };
            self.active_background += 1;
            // Counted active from here: if the transport refuses it, ending
            // it must give the active slot back too (request_end decides by
            // location).
            let _ = req.move_to(Location::Transport);
            out.push(req);
        }
        out
    }

    /// Accounts for an ended background request.
    pub(crate) fn end_one(&mut self, budget: WakeBudget) {
        self.num_background = self.num_background.saturating_sub(1);
        self.active_background = self.active_background.saturating_sub(1);
        self.grant(budget);
    }

    /// Queues an admitted background request.
    pub(crate) fn enqueue(&mut self, req: Arc<Request>) {
        // New -> BgQueue is always valid.
        let _ = req.move_to(Location::BgQueue);
        self.queue.push_back(req);
    }
}
