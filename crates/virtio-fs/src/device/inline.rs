//! Serving in line: the vring thread answers one request of each batch it
//! pops itself, instead of handing every request to a ring worker thread.
//!
//! A hand-off costs a wake-up of another thread (tens of microseconds on a
//! small VM host), which at queue depth 1 is most of a request's latency.
//! Each request queue's vring thread owns one entry of its engine ring
//! queue. While it submits a batch that entry is the queue's preferred
//! one (`RingEnd::prefer`), so the engine hands it the batch's first
//! request (the rest go to the workers, who run in parallel); the thread
//! then fetches it without blocking, serves it through the same dispatcher
//! and commits it like any worker. Requests still pass through the whole
//! engine: admission, tickets, timeouts.
//!
//! A request that may wait (SETLKW) never goes to this entry. A host call
//! that hangs would hold up the vring thread, so the watchdog in
//! `device.rs` drains the queue in its place while it is stuck.

use super::{FsDevice, Inner};
use fuse_core::chan::Chan;
use fuse_core::ring::{cmd_area, EntHandle, EntryBufs, RingEnd};
use fuse_core::server::{answer_ring, Dispatcher, Filesystem};
use fuse_core::Errno;
use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::Duration;
use vhost_user_backend::VringT;

/// A vring thread's own engine ring entry.
pub(crate) struct InlineSlot {
    ring: RingEnd,
    h: EntHandle,
    qid: u16,
    scratch: Vec<u8>,
}

impl InlineSlot {
    /// Registers an entry on ring queue `qid` with `payload` bytes of
    /// payload buffer (as the workers' entries have).
    pub(crate) fn new(chan: &Chan, qid: u16, payload: usize) -> Result<InlineSlot, Errno> {
        let ring = chan.ring_end(false);
        let h = ring.register(&cmd_area(qid, 0, 0), EntryBufs::with_payload(payload), None)?;
        Ok(InlineSlot {
            ring,
            h,
            qid,
            scratch: vec![0u8; 64 * 1024],
        })
    }

    /// Makes the entry preferred (while a batch is submitted) or not.
    pub(crate) fn prefer(&self, on: bool) {
        let _ = self.ring.prefer(self.qid, on.then_some(self.h));
    }

    /// Serves what the entry holds, and what it is handed on commit, up to
    /// `budget` requests. Returns how many it served.
    pub(crate) fn serve<F: Filesystem>(&mut self, disp: &Dispatcher<F>, budget: usize) -> usize {
        let mut n = 0;
        while n < budget {
            let Ok(Some(mut f)) = self.ring.fetch(self.h, false) else {
                break;
            };
            answer_ring(disp, &mut f, &mut self.scratch);
            let area = f.commit_cmd();
            n += 1;
            if self.ring.commit(&area, f, None).is_err() {
                // Torn down (or refused, which drops the request with EIO):
                // the entry is gone or back to available either way.
                break;
            }
        }
        n
    }
}

/// A vring thread serving in line for longer than this is taken to be
/// stuck in a host call.
const STUCK: Duration = Duration::from_millis(20);

/// Keeps queues moving while their vring thread is stuck serving in line:
/// every few milliseconds it pops what the guest added to such a queue and
/// submits it to the engine, whose worker threads serve it. Ends with the
/// device.
pub(super) fn watchdog<F: Filesystem + 'static>(weak: Weak<Inner<F>>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        if inner.stop.load(Ordering::Relaxed) {
            return;
        }
        let now = inner.epoch.elapsed().as_millis() as u64;
        let stuck: Vec<usize> = inner
            .busy_since
            .iter()
            .enumerate()
            .filter(|(_, b)| {
                let b = b.load(Ordering::SeqCst);
                b != 0 && now.saturating_sub(b) >= STUCK.as_millis() as u64
            })
            .map(|(i, _)| i + 1)
            .collect();
        let vrings = lock(&inner.vrings).clone();
        let dev = FsDevice { inner };
        for q in &stuck {
            if let Some(Some(vring)) = vrings.get(*q) {
                if vring.get_ref().is_enabled() {
                    dev.inner.stats.queues[*q]
                        .takeovers
                        .fetch_add(1, Ordering::Relaxed);
                    dev.submit_requests(vring, *q, None);
                }
            }
        }
        drop(dev);
        std::thread::sleep(if stuck.is_empty() {
            Duration::from_millis(10)
        } else {
            Duration::from_millis(2)
        });
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
