//! Live migration and vring stops: the device's writes into guest memory are
//! logged in the frontend's dirty-page log, and a vring stop
//! (GET_VRING_BASE) answers every request popped from the vring before it
//! returns ([`FsDevice::drain_vring`]). A stop or a reset then gives up what
//! is left ([`FsDevice::give_up`]): none of it acts on the host afterwards,
//! and the host work already under way is waited for, with a bound.
//!
//! Dirty log: writes through vm-memory mark their pages themselves; a READ
//! by reference fills guest memory by host address, so every used entry is
//! published by [`FsDevice::publish`], which marks all of the chain's
//! device-writable descriptors dirty and only then adds the entry. Host
//! I/O into a chain's buffers has ended before it is answered, and chains
//! a stop gives up on are marked once their I/O was waited for, so nothing
//! lands after the mark. See docs/DESIGN.md, "Dirty log and vring stops".

use super::*;
use crate::chain::Seg;
use fuse_core::Fence;
use vm_memory::bitmap::Bitmap;
use vm_memory::GuestMemoryBackend;

/// How long a vring stop waits for its requests when no request timeout
/// bounds them (`DeviceConfig::vring_stop_drain` overrides it).
pub(super) const VRING_STOP_DRAIN: Duration = Duration::from_secs(5);

impl<F: Filesystem + 'static> FsDevice<F> {
    /// Returns chain `head` to the guest with `len` bytes written: marks
    /// `writable` (the chain's device-writable descriptors) dirty in the
    /// migration log, then adds the used entry to `vring`'s used ring
    /// (`rings.rs`, which logs its own writes). The one way a used entry is
    /// published.
    pub(super) fn publish(
        &self,
        vring: &Vring,
        used: &Used,
        mem: &GuestMmap,
        head: u16,
        writable: &[Seg],
        len: u32,
    ) {
        self.mark_written(mem, writable);
        used.add(vring, mem, head, len);
    }

    /// Marks `segs` dirty in the migration log, if one is set: one mark
    /// per piece of a descriptor in a memory region (a descriptor may
    /// straddle two). Without a log each mark is one atomic load
    /// (`LogBitmap`).
    pub(super) fn mark_written(&self, mem: &GuestMmap, segs: &[Seg]) {
        // No log on any region (no migration ever began): nothing to find
        // per descriptor, and the region lookups below are skipped
        // (docs/BENCHMARKS.md, "The dirty log's cost on the hot path").
        if !mem.iter().any(|r| r.bitmap().is_on()) {
            return;
        }
        for s in segs {
            for slice in GuestMemoryBackend::get_slices(mem, s.addr, s.len as usize) {
                // The chain was checked against this memory: an error
                // means a range that is not there, which nobody wrote.
                let Ok(slice) = slice else { break };
                slice.bitmap().mark_dirty(0, slice.len());
            }
        }
    }

    /// How long a stop of a vring waits for its requests: until the request
    /// timeout (and the scan that answers it) has passed for all of them,
    /// or `vring_stop_drain` without a timeout.
    fn drain_bound(&self) -> Duration {
        let timeout = self.inner.cfg.request_timeout;
        if timeout.is_zero() {
            self.inner.cfg.vring_stop_drain
        } else {
            timeout + timeouts::scan_period(timeout) + Duration::from_millis(100)
        }
    }

    /// Stops request queue `q` (GET_VRING_BASE, the queue already not
    /// ready): interrupts its lock calls, drains it ([`FsDevice::drain_vring`]),
    /// gives up what is left ([`FsDevice::give_up`]) and counts that in
    /// `lost_on_stop`.
    pub(super) fn stop_request_queue(&self, q: RqId) {
        self.interrupt_waiters(Some(q));
        self.drain_vring(q);
        let lost = self.give_up(&[q]);
        if lost > 0 {
            self.inner.stats.add_lost_on_stop(lost as u64);
            // A guest that resets its device again and again must not
            // flood the log (the count is in `lost_on_stop`).
            fuse_core::warn_limited!(
                "queue {} stopped with {lost} request(s) still unanswered; \
                 they are given up",
                q.vq()
            );
        }
    }

    /// Waits (bounded: [`FsDevice::drain_bound`]) until every chain popped
    /// from request queue `q`'s vring is back in its used ring, answered.
    /// Called by `stop_vring` on the vhost-user thread after the handler
    /// marked the queue not ready, so nothing more is popped; the answers
    /// come from the threads that answer anyway (ring workers, the vring
    /// thread's completions through its epoll, the engine's device workers
    /// for lock calls, the timeout scanner): this thread holds none of the
    /// locks they take (the queue's `gen`, `heads` and `inline`, the vring
    /// lock), only the vhost-user handler's, which none of them takes.
    /// Returns how many are still unanswered.
    pub(super) fn drain_vring(&self, q: RqId) -> usize {
        let rq = self.inner.queue(q);
        let heads = &rq.heads;
        // A pop that raced the queue going not ready has claimed its head
        // (or put the chain back) by the time its pop lock is free.
        drop(lock(&rq.pop_lock));
        let bound = self.drain_bound();
        let start = Instant::now();
        let mut nap = Duration::from_micros(50);
        let mut asked = Instant::now();
        loop {
            let n = heads.count();
            if n == 0 || start.elapsed() >= bound {
                return n;
            }
            // A lock call popped before the stop may reach the waiters'
            // table only after the caller's first interrupt: ask again.
            if asked.elapsed() >= Duration::from_millis(10) {
                self.interrupt_waiters(Some(q));
                asked = Instant::now();
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(2));
        }
    }

    /// Gives up what the vrings of `queues` still have in flight (after a
    /// stop's drain, or at a reset): ends each queue's generation under
    /// its `gen` write lock (taken after every answer under way wrote its
    /// used entry; from then on the old vring's answers are dropped, and the
    /// fence its requests went under is closed, so none of them acts on
    /// the host any more), takes back the guest buffers lent to the engine
    /// and ends parked lock calls. Then waits, until `vring_stop_drain` has
    /// passed, for the host work already under way (I/O on the taken-back
    /// buffers, host calls inside the closed fences); what still runs then
    /// is logged and counted in `stuck_on_stop`, and left to finish. Returns
    /// how many chains were given up.
    pub(super) fn give_up(&self, queues: &[RqId]) -> usize {
        let mut lost = 0;
        let mut fences = Vec::with_capacity(queues.len());
        for &q in queues {
            let rq = self.inner.queue(q);
            let mut g = write(&rq.gen);
            lost += rq.heads.count();
            fences.push(g.end());
            // Nothing of the old vring is in flight any more.
            rq.heads.clear();
        }
        let deadline = Instant::now() + self.inner.cfg.vring_stop_drain;
        let mut stuck = 0;
        for &q in queues {
            stuck += self.take_back_buffers(q, deadline);
            self.interrupt_waiters(Some(q));
        }
        stuck += wait_fences(&fences, deadline);
        self.left_running(stuck);
        lost
    }

    /// Counts and logs `stuck` pieces of host work of given-up requests
    /// still running when the wait for them ended.
    pub(super) fn left_running(&self, stuck: usize) {
        if stuck == 0 {
            return;
        }
        self.inner.stats.add_stuck_on_stop(stuck as u64);
        fuse_core::warn_limited!(
            "{stuck} host call(s) or I/O of given-up requests still running \
             {:?} after they were given up; left to finish",
            self.inner.cfg.vring_stop_drain
        );
    }
}

/// Waits, until `deadline`, for the host calls inside `fences` (closed) to
/// end, polling as `drain_vring` does; returns how many still run.
pub(super) fn wait_fences(fences: &[Arc<Fence>], deadline: Instant) -> usize {
    let mut nap = Duration::from_micros(50);
    while fences.iter().any(|f| f.inside() > 0) && Instant::now() < deadline {
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(2));
    }
    fences.iter().map(|f| f.inside() as usize).sum()
}
