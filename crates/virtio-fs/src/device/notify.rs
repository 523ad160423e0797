//! Guest notifications: one per batch of answers rather than one per
//! answer, on the vring threads that answer in batches ([`Batch`]).

use super::queue::RqId;
use super::Vring;
use std::time::Duration;
use vhost_user_backend::VringT;

/// The longest a chunk of answers given in line waits for its
/// notification, whatever `submit_batch` says: a 1 MiB READ takes about
/// 100 µs to copy, so four of them in a chunk kept a guest at depth 4 from
/// hearing of any (and refilling its queue) for 400 µs; a notification
/// costs the device a few microseconds, so at 50 µs it stays a small part
/// of the work it announces.
pub(super) const CHUNK_TIME: Duration = Duration::from_micros(50);

/// Signals the guest if it wants to hear about used buffers now.
pub(super) fn notify(vring: &Vring) {
    if vring.needs_notification().unwrap_or(true) {
        let _ = vring.signal_used_queue();
    }
}

thread_local! {
    /// While a vring thread answers a chunk of requests or a reaped batch
    /// of completions ([`Batch`]): the queues it answered on, to signal
    /// once at the end instead of once per answer.
    static BATCH: std::cell::RefCell<Option<Vec<(RqId, Vring)>>> =
        const { std::cell::RefCell::new(None) };
}

/// Signals the guest about queue `q` now, or at the end of this thread's
/// batch if it has one open ([`Batch`]).
pub(super) fn notify_batched(q: RqId, vring: &Vring) {
    let deferred = BATCH.with(|b| match b.borrow_mut().as_mut() {
        Some(list) => {
            if !list.iter().any(|(x, _)| *x == q) {
                list.push((q, vring.clone()));
            }
            true
        }
        None => false,
    });
    if !deferred {
        notify(vring);
    }
}

/// A vring thread's batch: answers given on this thread while it lives
/// signal the guest once per queue, when it ends (EVENT_IDX then decides
/// whether the guest wants it). Held around the answers of one reaped
/// batch of completions, and of each `submit_batch` requests served in
/// line: held across a whole kick (popping and serving every chain) the
/// guest heard of nothing until all were served, and it could not refill
/// its queue meanwhile (GETATTR at depth 16 ran at 0.4x); signalled per
/// answer, a guest that reaps as fast as the device answers is woken for
/// each (a wake-up costs the device tens of microseconds on a VM host).
/// A batch begun while one is open is part of the outer one.
pub(super) struct Batch {
    owner: bool,
}

impl Batch {
    pub(super) fn begin() -> Batch {
        let owner = BATCH.with(|b| {
            let mut b = b.borrow_mut();
            let open = b.is_some();
            if !open {
                *b = Some(Vec::new());
            }
            !open
        });
        Batch { owner }
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        if !self.owner {
            return;
        }
        let list = BATCH.with(|b| b.borrow_mut().take());
        for (_, v) in list.into_iter().flatten() {
            notify(&v);
        }
    }
}
