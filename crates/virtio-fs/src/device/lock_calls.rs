//! Lock calls (GETLK, SETLK, SETLKW): sent synchronously over the
//! engine's device, not the ring, and kept by the unique the engine gave
//! them (the guest's may repeat: a hostile guest can reuse one while it
//! is in flight), so each can be interrupted when the frontend takes its
//! vring back, and found by its guest unique when the guest interrupts it.

use super::*;

/// Lock calls in flight (they may wait without end), by the unique the
/// engine gave them. Its own mutex, a leaf.
#[derive(Default)]
pub(super) struct LockCalls(Mutex<HashMap<u64, (Weak<Ticket>, Sent)>>);

impl LockCalls {
    /// Keeps `sent`, the lock call of `t`.
    fn insert(&self, t: &Arc<Ticket>, sent: Sent) {
        let mut calls = lock(&self.0);
        // Entries of answered tickets are pruned now and then.
        if calls.len() >= 64 && calls.len().is_power_of_two() {
            calls.retain(|_, (t, _)| t.strong_count() > 0);
        }
        calls.insert(sent.unique(), (Arc::downgrade(t), sent));
    }

    /// Lets go of the lock call the engine knows as `unique`.
    fn remove(&self, unique: u64) {
        lock(&self.0).remove(&unique);
    }

    /// Interrupts every lock call in flight whose ticket `pick` chooses.
    fn interrupt(&self, pick: impl Fn(&Ticket) -> bool) {
        let sent: Vec<Sent> = lock(&self.0)
            .values()
            .filter(|(t, _)| t.upgrade().is_some_and(|t| pick(&t)))
            .map(|(_, s)| s.clone())
            .collect();
        // Outside the lock: an interrupt may end the call on this thread.
        for s in sent {
            s.interrupt();
        }
    }
}

impl<F: Filesystem + 'static> FsDevice<F> {
    /// Sends a lock call (GETLK, SETLK, SETLKW). They are synchronous in
    /// the kernel, never background: a parked SETLKW must not hold a
    /// background slot (enough of them would keep out the unlock that
    /// frees them). They go without waiting (`Chan::send_async`: no thread
    /// per call) over the engine's device rather than the ring, so a
    /// parked SETLKW holds no ring entry or payload buffer; the guest's
    /// FUSE_INTERRUPT finds them by their guest unique.
    pub(super) fn send_lock_call(&self, args: Args, ticket: &Arc<Ticket>) {
        let weak = Arc::downgrade(&self.inner);
        let mine = ticket.clone();
        let end = fuse_core::EndFn::once(move |r: ReqResult| {
            if let Some(inner) = weak.upgrade() {
                let dev = FsDevice { inner };
                dev.forget_waiter(&mine);
                dev.finish(&mine, r);
            }
        });
        // No device lock is held across the engine call: it may end the
        // request on this very thread (a transport that was aborted), and
        // its end takes `lock_calls`. An end that comes meanwhile on another
        // thread may leave an entry for an answered ticket, which is never
        // interrupted (`Sent` of a finished request does nothing) and is
        // pruned later.
        match self.inner.engine.chan().send_async(args.over_device(), end) {
            Ok(sent) => {
                ticket.engine_unique.store(sent.unique(), Ordering::Relaxed);
                if !ticket.is_answered() {
                    self.inner.lock_calls.insert(ticket, sent);
                }
            }
            Err(e) => {
                if ticket.claim() {
                    self.answer(ticket, e.to_wire(), &[]);
                }
            }
        }
    }

    /// A lock call ended: the guest's interrupts no longer reach it.
    fn forget_waiter(&self, t: &Arc<Ticket>) {
        let unique = t.engine_unique.load(Ordering::Relaxed);
        self.inner.lock_calls.remove(unique);
    }

    /// Interrupts the lock calls of queue `q` (every queue: None) still in
    /// flight: the frontend took their vring back (a stop or a reset, as
    /// when the guest reboots), so no answer can reach the guest, and a
    /// parked SETLKW must not hold its waiter thread for good.
    pub(super) fn interrupt_waiters(&self, q: Option<RqId>) {
        self.inner
            .lock_calls
            .interrupt(|t| q.is_none_or(|q| t.queue == q));
    }

    /// The guest's FUSE_INTERRUPT for its request `unique` (a lock call
    /// that waits; Linux guests do not send them today): every lock call in
    /// flight under that guest unique.
    pub(super) fn interrupt_waiter(&self, unique: u64) {
        self.inner.lock_calls.interrupt(|t| t.unique == unique);
    }
}
