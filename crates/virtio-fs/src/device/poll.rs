//! Polling a request queue's avail ring before sleeping. After a vring
//! thread has emptied its queue it keeps looking at the avail index for a
//! window, with the guest's notifications still off, so a guest that
//! refills the queue meanwhile neither kicks nor waits for the thread to
//! wake. Only a thread with no host I/O of its own in flight polls: that
//! I/O's completions come through its epoll; nor does a thread that hands
//! requests to workers (`inline_per_batch` other than all). One wake-up
//! goes on polling for at most [`WAKE_SPAN`] or four times the most,
//! whichever is longer, serving included; then the guest's next chain
//! kicks the thread. Nor does a wake-up serve past that span: a guest
//! that refills the queue before each re-check would keep it going, so
//! the thread then goes back to its epoll (exit and other events) with its
//! resume event written (`serve_queue`).
//!
//! The window adapts to the guest, between zero and
//! `DeviceConfig::poll_time` (*the most*), by the gap between the queue
//! emptying and the thread's next wake-up: a gap longer than the most
//! halves the window (below [`GROW_FROM`]: no polling), a gap within the
//! most that the window did not cover doubles it (from [`GROW_FROM`]). A
//! guest that pauses longer than the most soon costs no polling; one that
//! keeps its queue busy is served without kicks, its thread passing
//! through its epoll once per span. A poll that finds work leaves the
//! window as it is.

use super::*;
use vhost_user_backend::VringState;
use vm_memory::{Address, Bytes, GuestAddress};

/// `DeviceConfig::poll_time` by default (and fusebox's `--poll-max-us`).
pub(super) const POLL_TIME: Duration = Duration::from_micros(50);

/// The longest one wake-up of a vring thread goes on polling and serving
/// (counted from the wake-up), unless four times the most is longer.
const WAKE_SPAN: Duration = Duration::from_millis(2);

/// Avail-index reads between clock reads.
const SPINS: u32 = 32;

/// The smallest window polled: a window shrunk below it is zero, one that
/// grows from zero starts here.
const GROW_FROM: Duration = Duration::from_micros(4);

/// A request queue's poll window. Its vring thread's alone (under its own
/// mutex in `RequestQueue::poll`, a leaf).
#[derive(Debug)]
pub(super) struct PollWindow {
    /// The window, before the most (`poll_time`) bounds it.
    window: Duration,
    /// When the queue last emptied and the thread began to poll (or would
    /// have, with a zero window), if it then went to sleep.
    emptied_at: Option<Instant>,
}

impl Default for PollWindow {
    fn default() -> Self {
        PollWindow {
            window: Duration::MAX,
            emptied_at: None,
        }
    }
}

impl PollWindow {
    /// The window now, at most `most`.
    fn get(&self, most: Duration) -> Duration {
        self.window.min(most)
    }

    /// The thread woke at `now` for its queue: the gap since the queue
    /// emptied, if the thread slept through it, moves the window.
    fn woke(&mut self, now: Instant, most: Duration) {
        let Some(at) = self.emptied_at.take() else {
            return;
        };
        let gap = now.saturating_duration_since(at);
        let window = self.get(most);
        self.window = if gap > most {
            let half = window / 2;
            if half < GROW_FROM {
                Duration::ZERO
            } else {
                half
            }
        } else if gap > window {
            window.saturating_mul(2).max(GROW_FROM).min(most)
        } else {
            window
        };
    }

    /// The queue emptied at `at`; the thread polls, then sleeps unless
    /// [`PollWindow::busy`] says otherwise.
    fn emptied(&mut self, at: Instant) {
        self.emptied_at = Some(at);
    }

    /// The thread did not sleep after all (a poll found work, or the
    /// queue stalled): the next wake-up says nothing of the guest's gaps.
    fn busy(&mut self) {
        self.emptied_at = None;
    }
}

/// Where a vring's avail index is and how far the thread popped, read once
/// under the vring lock so the spin reads guest memory only.
struct Watch {
    avail_idx_at: GuestAddress,
    next_avail: u16,
    size: u16,
}

impl Watch {
    fn of(vring: &Vring) -> Option<Watch> {
        let v = vring.get_ref();
        if !is_live(&v) {
            return None;
        }
        let queue = v.get_queue();
        Some(Watch {
            avail_idx_at: GuestAddress(queue.avail_ring()).checked_add(2)?,
            next_avail: queue.next_avail(),
            size: queue.size(),
        })
    }

    /// The avail index, if the guest announced chains past those popped
    /// (as many as a pop can take: not an index more than a vring's size
    /// ahead).
    fn announced(&self, mem: &GuestMemoryLoadGuard<GuestMmap>) -> Option<u16> {
        let idx = u16::from_le(mem.load::<u16>(self.avail_idx_at, Ordering::Acquire).ok()?);
        let n = idx.wrapping_sub(self.next_avail);
        (n > 0 && n <= self.size).then_some(idx)
    }
}

/// Whether a vring may be served: enabled, and not stopped.
fn is_live(v: &VringState<GuestMem>) -> bool {
    v.is_enabled() && v.get_queue().ready()
}

impl<F: Filesystem + 'static> FsDevice<F> {
    /// How long one wake-up of a request queue's thread may go on.
    pub(super) fn wake_span(&self) -> Duration {
        WAKE_SPAN.max(self.inner.cfg.poll_time.saturating_mul(4))
    }

    /// Request queue `q`'s thread woke at `at` (a kick or a resume).
    pub(super) fn woke(&self, q: RqId, at: Instant) {
        let most = self.inner.cfg.poll_time;
        if !most.is_zero() {
            lock(&self.inner.queue(q).poll).woke(at, most);
        }
    }

    /// Request queue `q` stalled: its thread waits for a request to end,
    /// not for the guest.
    pub(super) fn stalled(&self, q: RqId) {
        lock(&self.inner.queue(q).poll).busy();
    }

    /// Polls request queue `q`'s avail ring for up to its window, and no
    /// longer than this wake-up (at `woke`) may go on; true once it shows
    /// a chain this thread has not popped. False: the thread may sleep.
    pub(super) fn poll_avail(&self, vring: &Vring, q: RqId, woke: Instant) -> bool {
        let most = self.inner.cfg.poll_time;
        // Polling is for a thread that serves its queue itself: one that
        // hands requests to workers would take a CPU they need.
        if most.is_zero() || self.inner.cfg.inline_per_batch != usize::MAX || self.io_in_flight(q) {
            return false;
        }
        let began = Instant::now();
        let left = self
            .wake_span()
            .saturating_sub(began.saturating_duration_since(woke));
        let (Some(mem), Some(watch)) = (self.memory(), Watch::of(vring)) else {
            lock(&self.inner.queue(q).poll).busy();
            return false;
        };
        let window = {
            let mut w = lock(&self.inner.queue(q).poll);
            if left.is_zero() {
                // Not a gap the window could have covered.
                w.busy();
                return false;
            }
            w.emptied(began);
            w.get(most).min(left)
        };
        // Thread 0 also serves the hiprio queue: FORGETs that come
        // meanwhile are served here, as their kick would have them served
        // (once per index announced: a head it cannot pop is left to the
        // next kick). They do not lengthen the poll.
        let hiprio = if q.thread() == 0 {
            self.inner.hiprio.vring()
        } else {
            None
        };
        let mut hiprio_served = None;
        while began.elapsed() < window {
            for _ in 0..SPINS {
                if watch.announced(&mem).is_some() {
                    lock(&self.inner.queue(q).poll).busy();
                    self.inner.counters(Vq::Request(q)).add_polled(1);
                    return true;
                }
                std::hint::spin_loop();
            }
            let end = hiprio.and_then(Watch::of).and_then(|hw| hw.announced(&mem));
            if end.is_some() && end != hiprio_served {
                if let Some(h) = hiprio {
                    hiprio_served = end;
                    if self.serve_queue(h, Vq::Hiprio).is_err() {
                        self.inner.counters(Vq::Hiprio).add_malformed(1);
                    }
                }
            }
            // A vring stopped or disabled meanwhile is left alone (and its
            // gaps say nothing of the guest).
            if !is_live(&vring.get_ref()) {
                lock(&self.inner.queue(q).poll).busy();
                return false;
            }
        }
        self.inner.counters(Vq::Request(q)).add_poll_misses(1);
        false
    }

    /// Whether queue `q`'s vring thread has host I/O of its own running.
    fn io_in_flight(&self, q: RqId) -> bool {
        lock(&self.inner.queue(q).inline)
            .as_ref()
            .is_some_and(QueueServer::io_in_flight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOST: Duration = Duration::from_micros(50);

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// The queue empties, the thread sleeps and wakes `gap` later; returns
    /// the window after.
    fn gap(w: &mut PollWindow, gap: Duration) -> Duration {
        let t = Instant::now();
        w.emptied(t);
        w.woke(t + gap, MOST);
        w.get(MOST)
    }

    #[test]
    fn starts_at_the_most() {
        assert_eq!(PollWindow::default().get(MOST), MOST);
        assert_eq!(PollWindow::default().get(us(10)), us(10));
    }

    #[test]
    fn gaps_longer_than_the_most_shrink_it_to_nothing() {
        let mut w = PollWindow::default();
        assert_eq!(gap(&mut w, us(51)), us(25));
        assert_eq!(gap(&mut w, us(1000)), us(12) + Duration::from_nanos(500));
        assert_eq!(gap(&mut w, us(1000)), Duration::from_nanos(6250));
        assert_eq!(gap(&mut w, us(1000)), Duration::ZERO);
        assert_eq!(gap(&mut w, us(1000)), Duration::ZERO);
    }

    #[test]
    fn gaps_within_the_most_grow_it_back() {
        let mut w = PollWindow::default();
        for _ in 0..4 {
            gap(&mut w, us(1000));
        }
        assert_eq!(w.get(MOST), Duration::ZERO);
        assert_eq!(gap(&mut w, us(30)), GROW_FROM);
        assert_eq!(gap(&mut w, us(30)), us(8));
        assert_eq!(gap(&mut w, us(30)), us(16));
        assert_eq!(gap(&mut w, us(30)), us(32));
        assert_eq!(gap(&mut w, us(30)), us(32), "a gap the window covers");
        assert_eq!(gap(&mut w, us(40)), MOST, "never past the most");
    }

    #[test]
    fn a_gap_between_the_most_and_twice_it_shrinks_it() {
        // The gap counts from the queue emptying, so the window polled is
        // part of it: a guest every 1.5 windows is not polled for.
        let mut w = PollWindow::default();
        for _ in 0..5 {
            gap(&mut w, us(75));
        }
        assert_eq!(w.get(MOST), Duration::ZERO);
    }

    #[test]
    fn a_wake_after_work_or_a_stall_changes_nothing() {
        let mut w = PollWindow::default();
        gap(&mut w, us(1000));
        let before = w.get(MOST);
        w.woke(Instant::now() + us(1000), MOST);
        assert_eq!(w.get(MOST), before);
        let t = Instant::now();
        w.emptied(t);
        w.busy();
        w.woke(t + us(1000), MOST);
        assert_eq!(w.get(MOST), before);
    }
}
