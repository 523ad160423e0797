//! Warnings a client can provoke again and again (a guest creating file
//! after file whose security label the host refuses, a guest racing its
//! own creations) must not let it flood the daemon's log or the host's
//! journal: [`warn_limited!`] lets through at most [`BURST`] a
//! [`WINDOW_SECS`]-second window per call site, and the first one let
//! through after others were dropped says how many.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// Messages a call site may log per window.
pub(crate) const BURST: u32 = 10;
/// The window, in seconds.
pub(crate) const WINDOW_SECS: u64 = 10;

/// One call site's count. A guess under races (Relaxed): two threads
/// crossing a window's start together may let a message or two more
/// through, never fewer than the burst.
#[derive(Debug)]
pub(crate) struct Limiter {
    window: AtomicU64,
    used: AtomicU32,
    dropped: AtomicU64,
}

impl Limiter {
    /// A call site that logged nothing yet.
    pub(crate) const fn new() -> Self {
        Limiter {
            window: AtomicU64::new(0),
            used: AtomicU32::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// Whether a message may be logged now: `Some(n)` with the messages
    /// dropped since the last one let through, or `None`.
    pub(crate) fn admit(&self) -> Option<u64> {
        static START: OnceLock<Instant> = OnceLock::new();
        let window = START.get_or_init(Instant::now).elapsed().as_secs() / WINDOW_SECS;
        self.admit_in(window)
    }

    fn admit_in(&self, window: u64) -> Option<u64> {
        let was = self.window.load(Ordering::Relaxed);
        if was != window
            && self
                .window
                .compare_exchange(was, window, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.used.store(0, Ordering::Relaxed);
        }
        if self.used.fetch_add(1, Ordering::Relaxed) < BURST {
            Some(self.dropped.swap(0, Ordering::Relaxed))
        } else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// `log::warn!`, at most [`BURST`] times a window from this call site.
macro_rules! warn_limited {
    ($($arg:tt)+) => {{
        static LIMIT: $crate::ratelimit::Limiter = $crate::ratelimit::Limiter::new();
        match LIMIT.admit() {
            Some(0) => log::warn!($($arg)+),
            Some(n) => log::warn!("{} ({n} more like it not logged)", format_args!($($arg)+)),
            None => {}
        }
    }};
}
pub(crate) use warn_limited;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_a_window_then_the_count_of_what_was_dropped() {
        let l = Limiter::new();
        for _ in 0..BURST {
            assert_eq!(l.admit_in(0), Some(0));
        }
        for _ in 0..25 {
            assert_eq!(l.admit_in(0), None, "more than the burst in one window");
        }
        // The next window: the first one through tells what was dropped.
        assert_eq!(l.admit_in(1), Some(25));
        for _ in 1..BURST {
            assert_eq!(l.admit_in(1), Some(0));
        }
        assert_eq!(l.admit_in(1), None);
        // A window later than the next one starts afresh too.
        assert_eq!(l.admit_in(7), Some(1));
    }

    #[test]
    fn threads_together_get_the_burst_in_a_window() {
        let l = std::sync::Arc::new(Limiter::new());
        // In the window already (its start may let a message more through).
        assert_eq!(l.admit_in(3), Some(0));
        let through: u32 = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || (0..1000).filter(|_| l.admit_in(3).is_some()).count() as u32)
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .sum();
        assert_eq!(through, BURST - 1);
        assert_eq!(l.admit_in(4), Some(4000 - u64::from(BURST - 1)));
    }
}
