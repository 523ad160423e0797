//! The transport vtable between the connection engine and whatever carries
//! requests to a server: the in-process device (default), later the ring,
//! a virtqueue or a vhost-user frontend. The engine names none of them.

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
}
