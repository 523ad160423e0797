//! A guest request in flight, and who answers it (the lifecycle in
//! `device.rs`'s module docs and docs/DESIGN.md, "Ticket lifecycle").

use super::ids::RqId;
use super::Vring;
use crate::chain::Chain;
use crate::guest_mem::GuestSpans;
use fuse_core::locks::lock;
use fuse_core::{ClientMap, ClientMem, Errno, HostSpan, ReqResult, RequestEnd};
use std::sync::atomic::{AtomicU64, AtomicU8};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

/// `Ticket::orphan` states.
pub(super) const ORPHAN_NO: u8 = 0;
pub(super) const ORPHAN_YES: u8 = 1;
pub(super) const ORPHAN_ENDED: u8 = 2;

/// A guest request in flight. `state` (its own mutex) guards who answers
/// it; the timeout scanner takes the spans' `access` and the device's
/// `timeouts.deferred` under it (docs/DESIGN.md, lock order).
pub(super) struct Ticket {
    /// The guest's unique (its reply carries it).
    pub(super) unique: u64,
    /// The unique the server sees (0 until sent).
    pub(super) engine_unique: AtomicU64,
    /// The generation of its queue when popped: a reply for an older one
    /// (the vring was stopped or reset since) is dropped.
    pub(super) gen: u64,
    pub(super) opcode: u32,
    /// The request queue it was popped from.
    pub(super) queue: RqId,
    /// When it was popped (the timeout scanner and the latency counters
    /// measure from here).
    pub(super) started: Instant,
    /// The chain, which keeps the guest memory its answer goes to mapped.
    pub(super) chain: Chain,
    /// The device's memory generation (`Inner::mem_gen`) when the chain
    /// was translated.
    pub(super) mem_gen: u64,
    /// The vring its answer goes to.
    pub(super) vring: Vring,
    /// The device that answers it when the engine ends its request (the
    /// ticket is the request's end handler, `RequestEnd` below).
    pub(super) dev: Weak<dyn Finish>,
    /// A READ's or WRITE's guest data buffers, lent to the engine as the
    /// ticket itself (its `ClientMem`, below).
    pub(super) client: Option<GuestSpans>,
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

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("unique", &self.unique)
            .field("opcode", &self.opcode)
            .field("queue", &self.queue)
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

// SAFETY: a ticket is lent to the engine as memory only with its guest
// buffers (`client` is Some), and every call goes to them: `GuestSpans`'
// contract holds (its spans lie in the memory the ticket's chain keeps
// mapped while the ticket lives). Without them it has no spans and
// refuses I/O.
#[allow(unsafe_code)]
unsafe impl ClientMem for Ticket {
    fn spans(&self) -> &[HostSpan] {
        self.client.as_ref().map_or(&[], |c| c.spans())
    }

    fn map(&self) -> Option<Arc<ClientMap>> {
        self.client.as_ref()?.map()
    }

    fn begin_io(&self) -> bool {
        self.client.as_ref().is_some_and(|c| c.begin_io())
    }

    fn end_io(&self) {
        if let Some(c) = &self.client {
            c.end_io();
        }
    }

    fn read_at(&self, off: usize, buf: &mut [u8]) -> Result<(), Errno> {
        self.client
            .as_ref()
            .map_or(Err(Errno::EIO), |c| c.read_at(off, buf))
    }

    fn write_at(&self, off: usize, buf: &[u8]) -> Result<(), Errno> {
        self.client
            .as_ref()
            .map_or(Err(Errno::EIO), |c| c.write_at(off, buf))
    }
}

/// A device as its tickets see it: what answers a ticket's request when
/// the engine ends it (`FsDevice::finish`).
pub(super) trait Finish: Send + Sync {
    /// The engine ended `t`'s request with `r`.
    fn finish(self: Arc<Self>, t: &Arc<Ticket>, r: ReqResult);
}

/// The ticket ends its own request: no closure is boxed per request.
impl RequestEnd for Ticket {
    fn end(self: Arc<Self>, r: ReqResult) {
        if let Some(dev) = self.dev.upgrade() {
            dev.finish(&self, r);
        }
    }
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
