//! A guest request in flight, and who answers it (the lifecycle in
//! `device.rs`'s module docs and docs/DESIGN.md, "Ticket lifecycle").

use super::queue::RqId;
use super::Vring;
use crate::chain::Chain;
use crate::guest_mem::GuestSpans;
use crate::sync::lock;
use std::sync::atomic::{AtomicU64, AtomicU8};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// `Ticket::orphan` states.
pub(super) const ORPHAN_NO: u8 = 0;
pub(super) const ORPHAN_YES: u8 = 1;
pub(super) const ORPHAN_ENDED: u8 = 2;

/// A guest request in flight. `state` (its own mutex) guards who answers
/// it; the timeout scanner takes the spans' `access` and the device's
/// `deferred` under it (docs/DESIGN.md, lock order).
pub(super) struct Ticket {
    /// The guest's unique (its reply carries it).
    pub(super) unique: u64,
    /// The unique the server sees (0 until sent).
    pub(super) engine_unique: AtomicU64,
    /// The generation of its queue when popped: a reply for an older one
    /// (the ring was stopped or reset since) is dropped.
    pub(super) gen: u64,
    pub(super) opcode: u32,
    /// The request queue it was popped from.
    pub(super) queue: RqId,
    /// When it was popped (the timeout scanner and the latency counters
    /// measure from here).
    pub(super) started: Instant,
    /// The chain, which keeps the guest memory its answer goes to mapped.
    pub(super) chain: Chain,
    /// The vring its answer goes to.
    pub(super) vring: Vring,
    /// A READ's or WRITE's guest data buffers, lent to the engine.
    pub(super) client: Option<Arc<GuestSpans>>,
    /// `ORPHAN_NO` until the timeout scanner answers it while the engine
    /// still holds it (`ORPHAN_YES`, counted in its queue's `orphans`) or the
    /// engine ends it (`ORPHAN_ENDED`): whichever comes first decides.
    pub(super) orphan: AtomicU8,
    pub(super) state: Mutex<TicketState>,
}

/// Who answers a request. InFlight → Answered (the engine's reply, an
/// error path, or the timeout scanner), or InFlight → Deferred (timed out
/// while a server was doing host I/O on its guest buffers) → Answered with
/// EIO by the last such I/O to end. Guarded by `Ticket::state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TicketState {
    /// Nobody answered it yet.
    InFlight,
    /// Timed out while host I/O ran on its buffers: the last I/O answers.
    Deferred,
    /// Answered (or given up): nobody else may.
    Answered,
}

impl Ticket {
    /// Whether it was answered (or its answer deferred) already.
    pub(super) fn is_answered(&self) -> bool {
        *lock(&self.state) != TicketState::InFlight
    }

    /// Moves InFlight → Answered; false if it was answered, or its answer
    /// deferred, already.
    pub(super) fn claim(&self) -> bool {
        let mut s = lock(&self.state);
        let first = *s == TicketState::InFlight;
        if first {
            *s = TicketState::Answered;
        }
        first
    }
}
