//! The timeout scanner: answers requests that outlived
//! `DeviceConfig::request_timeout` (see the ticket lifecycle in
//! `device.rs`).

use super::*;
use std::sync::MutexGuard;

/// The requests the timeout scanner watches, and the timed-out ones whose
/// answer waits for host I/O on their buffers. Lock order: `sent` before
/// any ticket's `state` (docs/DESIGN.md, "Lock order").
pub(super) struct Timeouts {
    /// Timeouts are on (`DeviceConfig::request_timeout` not zero):
    /// without, nothing is tracked.
    on: bool,
    /// Tickets in submission order.
    sent: Mutex<VecDeque<Arc<Ticket>>>,
    /// Timed out while a server did I/O on their buffers: kept alive until
    /// the last such I/O ends and answers them.
    deferred: Mutex<Vec<Arc<Ticket>>>,
}

/// A round's tracking: the tickets of one round go in under one lock.
pub(super) struct Tracker<'a>(Option<MutexGuard<'a, VecDeque<Arc<Ticket>>>>);

impl Tracker<'_> {
    /// Tracks `t` (nothing when timeouts are off).
    pub(super) fn track(&mut self, t: Arc<Ticket>) {
        if let Some(q) = &mut self.0 {
            q.push_back(t);
        }
    }
}

impl Timeouts {
    pub(super) fn new(on: bool) -> Timeouts {
        Timeouts {
            on,
            sent: Mutex::new(VecDeque::new()),
            deferred: Mutex::new(Vec::new()),
        }
    }

    /// Tracks `t` (nothing when timeouts are off).
    pub(super) fn track(&self, t: Arc<Ticket>) {
        self.round().track(t);
    }

    /// A tracker for a round of tickets (one lock for all of them).
    pub(super) fn round(&self) -> Tracker<'_> {
        Tracker(self.on.then(|| lock(&self.sent)))
    }

    /// Takes the tickets older than `timeout` that nobody answered, oldest
    /// first, and lets go of the answered ones.
    fn take_expired(&self, timeout: Duration) -> Vec<Arc<Ticket>> {
        let mut expired = Vec::new();
        let mut q = lock(&self.sent);
        while let Some(t) = q.front() {
            let done = *lock(&t.state) != TicketState::InFlight;
            if done {
                q.pop_front();
            } else if t.started.elapsed() >= timeout {
                if let Some(t) = q.pop_front() {
                    expired.push(t);
                }
            } else {
                break;
            }
        }
        // A long-lived request at the front must not keep every answered
        // one behind it alive.
        q.retain(|t| *lock(&t.state) == TicketState::InFlight);
        expired
    }

    /// Keeps `t` alive until the I/O on its buffers ends.
    fn defer(&self, t: Arc<Ticket>) {
        lock(&self.deferred).push(t);
    }

    /// Lets go of `t`, deferred before.
    fn undefer(&self, t: &Arc<Ticket>) {
        lock(&self.deferred).retain(|d| !Arc::ptr_eq(d, t));
    }
}

/// Answers requests that outlived the timeout, oldest first.
pub(super) fn scan_timeouts<F: Filesystem + 'static>(weak: Weak<Inner<F>>) {
    loop {
        // (Once the device is dropped no upgrade succeeds.)
        let Some(inner) = weak.upgrade() else { return };
        let timeout = inner.cfg.request_timeout;
        let dev = FsDevice { inner };
        let expired = dev.inner.timeouts.take_expired(timeout);
        for t in expired {
            let now = {
                let mut s = lock(&t.state);
                if *s != TicketState::InFlight {
                    continue;
                }
                // Guest buffers a server is doing I/O on cannot go back to
                // the guest yet: the answer waits for that I/O to end.
                let now = t
                    .client
                    .as_ref()
                    .is_none_or(|c| c.revoke_or_when_idle(answer_when_idle(&t, &dev.inner)));
                *s = if now {
                    TicketState::Answered
                } else {
                    // Kept alive until the I/O ends and answers it.
                    dev.inner.timeouts.defer(t.clone());
                    TicketState::Deferred
                };
                now
            };
            dev.inner.stats.add_timeouts(1);
            // The engine still holds it (unless it ended meanwhile): an
            // orphan until it ends.
            if t.orphan
                .compare_exchange(ORPHAN_NO, ORPHAN_YES, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                dev.inner
                    .queue(t.queue)
                    .orphans
                    .fetch_add(1, Ordering::SeqCst);
            }
            if now {
                dev.answer(&t, Errno::EIO.to_wire(), &[]);
            }
            // Ask the backend to give up on it (the passthrough cancels its
            // io_uring operation or lock wait); its late answer, if any, is
            // dropped.
            let unique = t.engine_unique.load(Ordering::Relaxed);
            if unique != 0 {
                dev.inner.engine.fs().interrupt(unique);
            }
        }
        drop(dev);
        std::thread::sleep(scan_period(timeout));
    }
}

/// How often the scanner looks, for a request timeout of `timeout`.
pub(super) fn scan_period(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(5), Duration::from_secs(1))
}

/// What the last host I/O on a timed-out request's buffers does when it
/// ends (the scanner found it running): answers the request with EIO, if
/// it is still deferred. It runs on that I/O's thread once the scanner let
/// go of the ticket's state, so it sees `Deferred`.
fn answer_when_idle<F: Filesystem + 'static>(
    t: &Arc<Ticket>,
    inner: &Arc<Inner<F>>,
) -> Box<dyn FnOnce() + Send> {
    let (t, dev) = (Arc::downgrade(t), Arc::downgrade(inner));
    Box::new(move || {
        let (Some(t), Some(inner)) = (t.upgrade(), dev.upgrade()) else {
            return;
        };
        let mut s = lock(&t.state);
        if *s == TicketState::Deferred {
            *s = TicketState::Answered;
            drop(s);
            inner.timeouts.undefer(&t);
            FsDevice { inner }.answer(&t, Errno::EIO.to_wire(), &[]);
        }
    })
}
