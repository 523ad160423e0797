//! Guest buffers a request queue lent to the engine: a READ's or WRITE's
//! spans by reference (`Ticket::client`). When the frontend takes the
//! vring back (a stop or a reset) the guest may reuse them at once, so the
//! device takes them back first: each is revoked (no host I/O may start
//! on it), its request interrupted in the backend, and the I/O already
//! running on it waited for, as a device reset waits for DMA, bounded.

use super::*;

/// The requests whose guest buffers a request queue lent to the engine
/// (weak: pruned as they go). Its own mutex, a leaf: nothing else is taken
/// under it, and it is not held across a call into the engine or the
/// filesystem (docs/DESIGN.md, "Lock order").
#[derive(Default)]
pub(super) struct Lent(Mutex<Vec<Weak<Ticket>>>);

impl Lent {
    /// Records that `t` lent its guest buffers to the engine.
    pub(super) fn lend(&self, t: &Arc<Ticket>) {
        let mut lent = lock(&self.0);
        // Entries of ended requests are pruned now and then.
        if lent.len() >= 64 && lent.len().is_power_of_two() {
            lent.retain(|t| t.strong_count() > 0);
        }
        lent.push(Arc::downgrade(t));
    }

    /// Takes every request still alive that lent its buffers, leaving none.
    fn take_all(&self) -> Vec<Arc<Ticket>> {
        std::mem::take(&mut *lock(&self.0))
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }
}

impl<F: Filesystem + 'static> FsDevice<F> {
    /// Takes back the guest buffers request queue `q` lent to the engine
    /// (its vring was stopped or reset, so the guest may reuse them at
    /// once): every lent buffer is revoked (no host I/O may start on it),
    /// its request interrupted in the backend (cancelling an io_uring
    /// operation), and the I/O already running on it is waited for, as a
    /// device reset waits for DMA, but not past `deadline`. Returns how
    /// many buffers still had I/O running then.
    pub(super) fn take_back_buffers(&self, q: RqId, deadline: Instant) -> usize {
        let tickets = self.inner.queue(q).lent.take_all();
        for t in &tickets {
            if let Some(c) = &t.client {
                if !c.revoke() {
                    let unique = t.engine_unique.load(Ordering::Relaxed);
                    if unique != 0 {
                        self.inner.engine.fs().interrupt(unique);
                    }
                }
            }
        }
        let mut busy = 0;
        for t in &tickets {
            if let Some(c) = &t.client {
                if !c.wait_idle_until(deadline) {
                    busy += 1;
                }
                // Never answered, but a READ may have filled some of it.
                self.mark_written(t.chain.mem(), t.chain.writable());
            }
        }
        busy
    }
}
