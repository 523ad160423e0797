//! Polling a request queue's avail ring before sleeping. After a vring
//! thread has emptied its queue it keeps looking at the avail index for a
//! window, with the guest's notifications still off, so a guest that
//! refills the queue meanwhile neither kicks nor waits for the thread to
//! wake. Only a thread with no host I/O of its own in flight polls: that
//! I/O's completions come through its epoll.
//!
//! The window adapts to the guest, between zero and
//! `DeviceConfig::poll_time`: a sleep after which the next request came
//! within the most makes the window grow (doubling, from [`GROW_FROM`]),
//! one longer than the most halves it (below [`GROW_FROM`]: no polling).
//! A guest that pauses between requests for longer than the most soon
//! costs no polling; one that keeps its queue busy is served without
//! wake-ups. A poll that finds work leaves the window as it is.

use super::submit::{avail_index, left_before};
use super::*;

/// `DeviceConfig::poll_time` by default (and fusebox's `--poll-max-us`).
pub(super) const POLL_TIME: Duration = Duration::from_micros(50);

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
    /// When the thread last went to sleep with nothing in flight.
    slept_at: Option<Instant>,
}

impl Default for PollWindow {
    fn default() -> Self {
        PollWindow {
            window: Duration::MAX,
            slept_at: None,
        }
    }
}

impl PollWindow {
    /// The window now, at most `most`.
    fn get(&self, most: Duration) -> Duration {
        self.window.min(most)
    }

    /// The thread woke at `now`: a sleep it went into with nothing in
    /// flight moves the window.
    pub(super) fn woke(&mut self, now: Instant, most: Duration) {
        let Some(at) = self.slept_at.take() else {
            return;
        };
        let slept = now.saturating_duration_since(at);
        let window = self.get(most);
        self.window = if slept > most {
            let half = window / 2;
            if half < GROW_FROM {
                Duration::ZERO
            } else {
                half
            }
        } else if slept > window {
            (window * 2).max(GROW_FROM).min(most)
        } else {
            window
        };
    }

    /// The thread goes to sleep at `now` with nothing in flight.
    fn sleeps(&mut self, now: Instant) {
        self.slept_at = Some(now);
    }
}

impl<F: Filesystem + 'static> FsDevice<F> {
    /// Request queue `q`'s thread woke (a kick or a resume).
    pub(super) fn woke(&self, q: RqId) {
        let most = self.inner.cfg.poll_time;
        if !most.is_zero() {
            lock(&self.inner.queue(q).poll).woke(Instant::now(), most);
        }
    }

    /// Polls request queue `q`'s avail ring for up to its window; true
    /// once it shows a chain this thread has not popped. False: the
    /// thread may sleep.
    pub(super) fn poll_avail(&self, vring: &Vring, q: RqId) -> bool {
        let most = self.inner.cfg.poll_time;
        if most.is_zero() || self.io_in_flight(q) {
            return false;
        }
        let Some(mem) = self.memory() else {
            return false;
        };
        let window = lock(&self.inner.queue(q).poll).get(most);
        // Thread 0 also serves the hiprio queue: FORGETs that come
        // meanwhile are served here, as their kick would have them served.
        let hiprio = if q.thread() == 0 {
            self.inner.hiprio.vring()
        } else {
            None
        };
        let mut hiprio_served = None;
        let mut began = Instant::now();
        let mut now = began;
        while now.saturating_duration_since(began) < window {
            for _ in 0..SPINS {
                if left_before(vring, avail_index(vring, &mem)) > 0 {
                    return true;
                }
                std::hint::spin_loop();
            }
            if let Some(h) = hiprio {
                // Served once per index it announces: a head it cannot
                // pop is left to its next kick, not retried here.
                let end = avail_index(h, &mem);
                if hiprio_served != Some(end) && left_before(h, end) > 0 {
                    hiprio_served = Some(end);
                    if self.serve_queue(h, Vq::Hiprio).is_err() {
                        self.inner.counters(Vq::Hiprio).add_malformed(1);
                    }
                    began = Instant::now();
                }
            }
            // A stopped or disabled vring is served again after its kick.
            if !vring.get_ref().is_enabled() {
                break;
            }
            now = Instant::now();
        }
        lock(&self.inner.queue(q).poll).sleeps(now);
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

    /// Sleeps for `slept` and wakes, returning the window after.
    fn sleep_wake(w: &mut PollWindow, slept: Duration) -> Duration {
        let t = Instant::now();
        w.sleeps(t);
        w.woke(t + slept, MOST);
        w.get(MOST)
    }

    #[test]
    fn starts_at_the_most() {
        assert_eq!(PollWindow::default().get(MOST), MOST);
        assert_eq!(PollWindow::default().get(us(10)), us(10));
    }

    #[test]
    fn long_sleeps_shrink_it_to_nothing() {
        let mut w = PollWindow::default();
        assert_eq!(sleep_wake(&mut w, us(51)), us(25));
        assert_eq!(
            sleep_wake(&mut w, us(1000)),
            us(12) + Duration::from_nanos(500)
        );
        assert_eq!(sleep_wake(&mut w, us(1000)), Duration::from_nanos(6250));
        assert_eq!(sleep_wake(&mut w, us(1000)), Duration::ZERO);
        assert_eq!(sleep_wake(&mut w, us(1000)), Duration::ZERO);
    }

    #[test]
    fn a_sleep_within_the_most_grows_it_back() {
        let mut w = PollWindow::default();
        for _ in 0..4 {
            sleep_wake(&mut w, us(1000));
        }
        assert_eq!(w.get(MOST), Duration::ZERO);
        assert_eq!(sleep_wake(&mut w, us(30)), GROW_FROM);
        assert_eq!(sleep_wake(&mut w, us(30)), us(8));
        assert_eq!(sleep_wake(&mut w, us(30)), us(16));
        assert_eq!(sleep_wake(&mut w, us(30)), us(32));
        assert_eq!(
            sleep_wake(&mut w, us(30)),
            us(32),
            "a sleep within the window"
        );
        assert_eq!(sleep_wake(&mut w, us(40)), MOST, "never past the most");
    }

    #[test]
    fn a_wake_without_a_sleep_changes_nothing() {
        let mut w = PollWindow::default();
        sleep_wake(&mut w, us(1000));
        let before = w.get(MOST);
        w.woke(Instant::now() + us(1000), MOST);
        assert_eq!(w.get(MOST), before);
    }
}
