//! The transport vtable between the connection engine and whatever carries
//! requests to a server (the kernel's `fiq->ops`): the in-process device
//! queue, and the FUSE-over-io_uring ring, which takes the requests over once
//! INIT accepted it and every one of its queues registered. The engine names
//! neither: the connection is assembled in `crate::assemble`, the one place
//! that names them by type.

use super::config::Negotiated;
use super::errno::Errno;
use super::req::Request;
use crate::abi::ForgetOne;
use crate::sync::Arc;
use std::time::Duration;

/// A request handed to a transport. The transport owns this handle while
/// the request is on one of its lists and gives it back through
/// [`Transport::abort`] or by ending it via the engine.
#[derive(Debug, Clone)]
pub struct InFlight(pub(crate) Arc<Request>);

/// What a transport must do (the kernel's `fuse_iqueue_ops` plus the hooks
/// the abort and timeout paths need).
pub trait Transport: Send + Sync {
    /// Takes a new request (kernel `send_req`). A transport that has been
    /// aborted hands the request back; the engine then ends it with the
    /// abort error once it holds no lock.
    fn send_req(&self, req: InFlight) -> Result<(), InFlight>;
    /// Takes a forget (kernel `send_forget`). No reply is expected.
    fn send_forget(&self, forget: ForgetOne);
    /// Takes several forgets at once.
    fn send_forgets(&self, forgets: &[ForgetOne]) {
        for f in forgets {
            self.send_forget(*f);
        }
    }
    /// Queues FUSE_INTERRUPT for `req` if it is still SENT and not FINISHED;
    /// returns whether one was queued (kernel `queue_interrupt`).
    fn send_interrupt(&self, req: &InFlight) -> bool;
    /// Drops a queued interrupt of an ending request.
    fn drop_interrupt(&self, req: &InFlight);
    /// Removes `req` if the server has not seen it yet (a killed requester);
    /// returns whether it was removed.
    fn remove_pending(&self, req: &InFlight) -> bool;
    /// Stops accepting work and returns every held request the aborter may
    /// end. Requests whose data is being copied (LOCKED) are only marked
    /// ABORTED: their copier ends them.
    fn abort(&self, err: Errno) -> Vec<InFlight>;
    /// Whether the head of any of the transport's lists is older than
    /// `timeout` at time `now` (only heads are checked, as in the kernel).
    fn head_expired(&self, now: Duration, timeout: Duration) -> bool;
    /// Moves every request being processed back to pending (NOTIFY_RESEND).
    fn resend(&self) {}
    /// `(pending, processing)` counts for statistics.
    fn counts(&self) -> (usize, usize);
    /// Forgets queued and not yet read by the server (a client that sends
    /// forgets faster than the server takes them waits while this is
    /// high: nothing else bounds them).
    fn forgets_queued(&self) -> usize {
        0
    }
    /// Learns what INIT negotiated, before the connection is published as
    /// initialized; it takes no engine lock (the ring's is called under
    /// the connection lock, so that no registration slips in before the
    /// gate is set up). Returns how many of the transport's queues must
    /// each register (see the engine's admission gate) before it carries
    /// requests; 0: it takes over none (the device carries everything from
    /// INIT on).
    fn negotiated(&self, _neg: &Negotiated) -> u16 {
        0
    }
    /// Takes admitted background requests, in order, that it queues itself
    /// (per queue, under its own active limit: the ring's
    /// `fuse_req_bg_queue`) rather than through the engine's background
    /// queue; called with no engine lock held. Those it cannot take go on
    /// `refused` (the engine ends them).
    fn send_background(
        &self,
        reqs: &mut dyn Iterator<Item = InFlight>,
        refused: &mut Vec<InFlight>,
    ) {
        for r in reqs {
            if let Err(r) = self.send_req(r) {
                refused.push(r);
            }
        }
    }
    /// `n` background requests of queue `qid` that it had made active
    /// ended (the engine already gave their admission slots back): their
    /// active slots are free for the ones it holds back.
    fn background_done(&self, _qid: u16, _n: u32) {}
    /// max_background is now `max` (called under `bg_lock`, so the
    /// transport's copy changes in the engine's order).
    fn set_max_background(&self, _max: u32) {}
    /// Re-evaluates the background requests it holds back (the limit
    /// changed); called with no engine lock held.
    fn flush_background(&self) {}
}
