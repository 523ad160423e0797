//! Lock calls (GETLK, SETLK, SETLKW): sent synchronously over the
//! engine's device, not the ring, and kept by the unique the engine gave
//! them (the guest's may repeat: a hostile guest can reuse one while it
//! is in flight), so each can be interrupted when the frontend takes its
//! ring back, and found by its guest unique when the guest interrupts it.

use super::*;

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
        // its end takes `waiters`. An end that comes meanwhile on another
        // thread may leave an entry for an answered ticket, which is never
        // interrupted (`Sent` of a finished request does nothing) and is
        // pruned later.
        match self.inner.engine.chan().send_async(args.over_device(), end) {
            Ok(sent) => {
                ticket.engine_unique.store(sent.unique(), Ordering::Relaxed);
                if !ticket.is_answered() {
                    let mut waiters = lock(&self.inner.waiters);
                    if waiters.len() >= 64 && waiters.len().is_power_of_two() {
                        waiters.retain(|_, (t, _)| t.strong_count() > 0);
                    }
                    waiters.insert(sent.unique(), (Arc::downgrade(ticket), sent));
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
        lock(&self.inner.waiters).remove(&unique);
    }

    /// Interrupts the lock calls of queue `q` (every queue: None) still in
    /// flight: the frontend took their ring back (a stop or a reset, as
    /// when the guest reboots), so no answer can reach the guest, and a
    /// parked SETLKW must not hold its waiter thread for good.
    pub(super) fn interrupt_waiters(&self, q: Option<RqId>) {
        let sent: Vec<Sent> = lock(&self.inner.waiters)
            .values()
            .filter(|(t, _)| t.upgrade().is_some_and(|t| q.is_none_or(|q| t.queue == q)))
            .map(|(_, s)| s.clone())
            .collect();
        for s in sent {
            s.interrupt();
        }
    }

    /// The guest's FUSE_INTERRUPT for its request `unique` (a lock call
    /// that waits; Linux guests do not send them today): every lock call in
    /// flight under that guest unique.
    pub(super) fn interrupt_waiter(&self, unique: u64) {
        let sent: Vec<Sent> = lock(&self.inner.waiters)
            .values()
            .filter(|(t, _)| t.upgrade().is_some_and(|t| t.unique == unique))
            .map(|(_, s)| s.clone())
            .collect();
        for s in sent {
            s.interrupt();
        }
    }
}
