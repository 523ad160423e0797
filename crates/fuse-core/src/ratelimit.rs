//! Warnings a client can provoke again and again (a guest creating file
//! after file whose security label the host refuses, a guest racing its
//! own creations) must not let it flood the daemon's log or the host's
//! journal: [`warn_limited!`](crate::warn_limited!) lets through at most [`BURST`] a
//! [`WINDOW_SECS`]-second window per call site, and the first one let
//! through after others were dropped says how many.
//!
//! Here, beside the engine, so that every crate that logs what a client
//! provokes (the passthrough, the vhost-user device) uses the one limiter.
//! It reads a clock and takes a std mutex of its own (not one of the
//! engine's, which loom models): no host I/O.

use crate::locks::lock;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

#[doc(hidden)]
pub use log as __log;

/// Messages a call site may log per window.
pub const BURST: u32 = 10;
/// The window, in seconds.
pub const WINDOW_SECS: u64 = 10;

/// One call site's count (a warning path, so a mutex is cheap enough):
/// exactly [`BURST`] a window, under any race.
#[derive(Debug)]
pub struct Limiter(Mutex<Count>);

/// The window counted in, messages let through in it, and messages
/// dropped since the last one let through.
#[derive(Debug)]
struct Count {
    window: u32,
    used: u32,
    dropped: u64,
}

impl Limiter {
    /// A call site that logged nothing yet.
    #[allow(clippy::new_without_default)] // a const fn, for statics
    pub const fn new() -> Self {
        Limiter(Mutex::new(Count {
            window: 0,
            used: 0,
            dropped: 0,
        }))
    }

    /// Whether a message may be logged now: `Some(n)` with the messages
    /// dropped since the last one let through, or `None`.
    pub fn admit(&self) -> Option<u64> {
        static START: OnceLock<Instant> = OnceLock::new();
        let secs = START.get_or_init(Instant::now).elapsed().as_secs();
        // 2^32 windows of 10 s: longer than any daemon runs.
        self.admit_in(u32::try_from(secs / WINDOW_SECS).unwrap_or(u32::MAX))
    }

    fn admit_in(&self, window: u32) -> Option<u64> {
        let mut c = lock(&self.0);
        // A caller that read the clock before another moved the window on
        // counts in the newer window (never moves it back).
        if c.window < window {
            c.window = window;
            c.used = 0;
        }
        if c.used < BURST {
            c.used += 1;
            Some(std::mem::take(&mut c.dropped))
        } else {
            c.dropped += 1;
            None
        }
    }
}

/// `log::warn!`, at most [`ratelimit::BURST`](crate::ratelimit::BURST)
/// times a window from this call site.
#[macro_export]
macro_rules! warn_limited {
    ($($arg:tt)+) => {{
        static __WARN_LIMITED: $crate::ratelimit::Limiter = $crate::ratelimit::Limiter::new();
        match __WARN_LIMITED.admit() {
            Some(0) => $crate::ratelimit::__log::warn!($($arg)+),
            Some(n) => $crate::ratelimit::__log::warn!(
                "{} ({n} more like it not logged)",
                format_args!($($arg)+)
            ),
            None => {}
        }
    }};
}

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
        // Four threads, each crossing from window 3 to window 4 and a
        // late one still saying 3: exactly a burst in each window.
        let l = std::sync::Arc::new(Limiter::new());
        let go = std::sync::Arc::new(std::sync::Barrier::new(4));
        let through: Vec<(u32, u64)> = (0..4)
            .map(|i| {
                let (l, go) = (l.clone(), go.clone());
                std::thread::spawn(move || {
                    go.wait();
                    // Messages let through, and the drops they reported.
                    let mut n = (0u32, 0u64);
                    for k in 0..2000u32 {
                        // Some calls of every thread read a stale clock.
                        let w = if k < 1000 || (k + i) % 7 == 0 { 3 } else { 4 };
                        if let Some(dropped) = l.admit_in(w) {
                            n.0 += 1;
                            n.1 += dropped;
                        }
                    }
                    n
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        let total: u32 = through.iter().map(|n| n.0).sum();
        assert_eq!(total, 2 * BURST, "{through:?}");
        // Every drop is told of once: by a later message, or the next one.
        let told: u64 = through.iter().map(|n| n.1).sum();
        let rest = l.admit_in(5).unwrap();
        assert_eq!(told + rest, 8000 - u64::from(2 * BURST));
    }

    #[test]
    fn the_macro_logs_a_burst_from_one_call_site_within_a_window() {
        // One call site, called past its burst within one window (the
        // test takes far less than a window).
        struct Count(std::sync::Mutex<Vec<String>>);
        impl log::Log for Count {
            fn enabled(&self, _: &log::Metadata<'_>) -> bool {
                true
            }
            fn log(&self, r: &log::Record<'_>) {
                self.0.lock().unwrap().push(r.args().to_string());
            }
            fn flush(&self) {}
        }
        static LOGGER: Count = Count(std::sync::Mutex::new(Vec::new()));
        log::set_logger(&LOGGER).unwrap();
        log::set_max_level(log::LevelFilter::Warn);
        let name = "x";
        for _ in 0..3 * BURST {
            warn_limited!("{name:?} refused");
        }
        // Other tests of this binary may log meanwhile: only this site's
        // lines count.
        let got: Vec<String> = LOGGER.0.lock().unwrap().clone();
        let ours = got
            .iter()
            .filter(|m| m.starts_with("\"x\" refused"))
            .count();
        assert_eq!(ours, BURST as usize, "{got:?}");
    }
}
