//! Each request queue's own state: its vring generation and fence, the
//! heads of its chains in flight, its vring thread's own entries, what it
//! lent the engine, and its stall and notification state (numbering is in
//! `ids.rs`). The hiprio queue keeps no state here: each of its chains is
//! given back once served, so it has nothing in flight, no generation to
//! bump, nothing lent; its counters and busy count are the device's.

use super::heads::Heads;
use super::inline::{HeldAnswers, QueueServer};
use super::lent::Lent;
use super::notify::Signals;
use super::poll::PollWindow;
use super::Vring;
use fuse_core::Fence;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, RwLock};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// A request queue's vring generation: which chains may still be answered,
/// and the fence every request popped in it goes under.
pub(super) struct Generation {
    /// Bumped by each vring stop or reset; a ticket records it at its pop.
    pub(super) n: u64,
    /// Closed when the generation ends: its requests are given up, and
    /// none may act on the host any more (`Ctx::enter_host`).
    pub(super) fence: Arc<Fence>,
}

impl Generation {
    /// Ends this generation: the next one starts with a new fence, and the
    /// old one, closed, is returned (to wait for the host calls still
    /// inside it).
    pub(super) fn end(&mut self) -> Arc<Fence> {
        self.n += 1;
        self.refence()
    }

    /// Closes the fence and starts a new one, keeping the number (answers
    /// of the requests under the old fence still reach the vring); returns
    /// the old fence.
    pub(super) fn refence(&mut self) -> Arc<Fence> {
        let old = std::mem::replace(&mut self.fence, Fence::new());
        old.close();
        old
    }
}

/// A request queue's own state. Each field says what guards it; the lock
/// order is in docs/DESIGN.md ("Lock order").
pub(super) struct RequestQueue {
    /// Bumped when the frontend stops or resets the vring. Replies are
    /// written under the read lock, so once `stop_vring` holds the write
    /// lock no reply of the old vring can reach guest memory.
    pub(super) gen: RwLock<Generation>,
    /// The heads of its chains in flight (`heads.rs`: its own mutex, a
    /// leaf; taken under `gen`'s read lock when answering).
    pub(super) heads: Heads,
    /// HeldAnswers from popping a chain until it is submitted or put back, so the
    /// vring thread and the watchdog never interleave a pop with another's
    /// rewind.
    pub(super) pop_lock: Mutex<()>,
    /// Set while it stopped popping (admission full, or too many orphans);
    /// atomic: the end of any request swaps it off and writes `resume`.
    pub(super) stalled: AtomicBool,
    /// Written to resume it once stalled (its vring thread polls it:
    /// [`RqId::resume_event`]).
    pub(super) resume: EventFd,
    /// The vring thread's own ring entries and the requests it has in
    /// flight on them (made on first use; only that thread locks it).
    pub(super) inline: Mutex<Option<QueueServer>>,
    /// When its vring thread started serving in line (milliseconds on
    /// `Inner::epoch`, 0: not serving); atomic, read by the watchdog.
    pub(super) busy_since: AtomicU64,
    /// Its vring as its thread first saw it, for the watchdog (set once,
    /// on the first kick).
    pub(super) vring: std::sync::OnceLock<Vring>,
    /// The guest buffers it lent to the engine, so a vring stop or reset
    /// can take them back (`lent.rs`: its own mutex, a leaf).
    pub(super) lent: Lent,
    /// Requests the timeout scanner answered that the engine still holds
    /// (their heads are back with the guest, which may publish them again):
    /// at the queue's size it stops popping until the engine lets some go,
    /// so work in flight stays bounded when the server hangs. Atomic.
    pub(super) orphans: AtomicU64,
    /// Its guest notifications, one per chunk its vring thread answers
    /// (atomic: `notify.rs`).
    pub(super) signals: Signals,
    /// The answers its vring thread gave at once and has not committed
    /// yet (`inline.rs`: its own mutex, a leaf; the watchdog takes them
    /// from a stuck thread).
    pub(super) held: HeldAnswers,
    /// Its vring thread's poll window (`poll.rs`: its own mutex, a leaf).
    pub(super) poll: Mutex<PollWindow>,
}

impl RequestQueue {
    pub(super) fn new() -> std::io::Result<RequestQueue> {
        Ok(RequestQueue {
            gen: RwLock::new(Generation {
                n: 0,
                fence: Fence::new(),
            }),
            heads: Heads::default(),
            pop_lock: Mutex::new(()),
            stalled: AtomicBool::new(false),
            resume: EventFd::new(EFD_NONBLOCK)?,
            inline: Mutex::new(None),
            busy_since: AtomicU64::new(0),
            vring: std::sync::OnceLock::new(),
            lent: Lent::default(),
            orphans: AtomicU64::new(0),
            signals: Signals::default(),
            held: HeldAnswers::default(),
            poll: Mutex::new(PollWindow::default()),
        })
    }
}
