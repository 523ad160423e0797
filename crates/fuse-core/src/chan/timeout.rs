//! Clocks and the per-connection timeout scanner.

use crate::locks::{lock, wait_for};
#[cfg(not(loom))]
use crate::sync::Arc;
use std::time::{Duration, Instant};

/// A monotonic clock for request ages.
pub trait Clock: Send + Sync {
    /// Time since an arbitrary fixed origin.
    fn now(&self) -> Duration;
}

/// The real monotonic clock.
#[derive(Debug)]
pub struct MonotonicClock(Instant);

impl MonotonicClock {
    /// A clock starting now.
    pub fn new() -> Self {
        MonotonicClock(Instant::now())
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

/// A clock that moves only when told to (deterministic tests).
#[derive(Debug, Default)]
pub struct ManualClock(std::sync::Mutex<Duration>);

impl ManualClock {
    /// A clock at zero.
    pub fn new() -> Self {
        Self::default()
    }
    /// Moves the clock forward.
    pub fn advance(&self, d: Duration) {
        let mut t = lock(&self.0);
        *t += d;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        *lock(&self.0)
    }
}

/// Stop flag of the scanner thread. Uses std primitives even under loom:
/// the scanner is not part of the models.
#[derive(Debug, Default)]
pub(crate) struct ScanCtl {
    stop: std::sync::Mutex<bool>,
    cv: std::sync::Condvar,
}

impl ScanCtl {
    pub(crate) fn stop(&self) {
        *lock(&self.stop) = true;
        self.cv.notify_all();
    }

    /// Sleeps one period; returns false once stopped.
    #[cfg_attr(loom, allow(dead_code))]
    fn sleep(&self, period: Duration) -> bool {
        let g = lock(&self.stop);
        if *g {
            return false;
        }
        !*wait_for(&self.cv, g, period)
    }
}

/// One scanner per connection (not a timer per request): every `period` it
/// checks the head of each list and aborts the connection if one expired.
#[cfg(not(loom))]
pub(crate) fn spawn_scanner(core: &Arc<super::Core>, period: Duration) {
    let ctl = core.scan.clone();
    let weak = Arc::downgrade(core);
    let spawned = std::thread::Builder::new()
        .name("fuse-timeout".into())
        .spawn(move || {
            while ctl.sleep(period) {
                let Some(core) = weak.upgrade() else { break };
                if core.scan_timeouts() {
                    break;
                }
            }
        });
    if spawned.is_err() {
        // Without a thread the scan can still be driven by `scan_timeouts`.
        core.timeouts_fired
            .fetch_add(0, crate::sync::Ordering::Relaxed);
    }
}
