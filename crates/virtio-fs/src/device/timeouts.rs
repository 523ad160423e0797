//! The timeout scanner: answers requests that outlived
//! `DeviceConfig::request_timeout` (see the ticket lifecycle in
//! `device.rs`).

use super::*;

/// Answers requests that outlived the timeout, oldest first.
pub(super) fn scan_timeouts<F: Filesystem + 'static>(weak: Weak<Inner<F>>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        if inner.stop.load(Ordering::Relaxed) {
            return;
        }
        let timeout = inner.cfg.request_timeout;
        let dev = FsDevice { inner };
        let mut expired = Vec::new();
        {
            let mut q = lock(&dev.inner.timeouts);
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
        }
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
                    lock(&dev.inner.deferred).push(t.clone());
                    TicketState::Deferred
                };
                now
            };
            dev.inner.stats.timeouts.fetch_add(1, Ordering::Relaxed);
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
            lock(&inner.deferred).retain(|d| !Arc::ptr_eq(d, &t));
            FsDevice { inner }.answer(&t, Errno::EIO.to_wire(), &[]);
        }
    })
}
