//! The hiprio queue (virtqueue 0): FORGET and BATCH_FORGET are served on
//! this queue's thread (the dispatcher drops the lookups), the guest's
//! INTERRUPT goes to the lock call it names. Nothing on it gets a reply,
//! so each chain is given back once served: a guest that forgets faster
//! than the filesystem does waits for free slots. While that thread is
//! stuck in request queue 0 (a host call that hangs in line), the
//! watchdog drains this queue in its place and hands the forgets to the
//! engine's workers (it makes no host call itself).

use super::*;

/// How long a stop of the hiprio queue waits for the forgets being served.
const HIPRIO_STOP_WAIT: Duration = Duration::from_secs(1);

/// Most forgets the watchdog leaves queued in the engine for its workers:
/// past it, it takes no more hiprio chains until they are served (FORGET
/// has no reply, so nothing else would bound them). 64 Ki forgets, 1 MiB.
const FORGETS_HIGH: usize = 1 << 16;

/// Who serves the forgets a drain of the hiprio queue takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ForgetsBy {
    /// The draining thread (the hiprio queue's vring thread).
    Here,
    /// The engine's workers: the watchdog, draining for a stuck vring
    /// thread, queues them there (a host call that hangs must not hold
    /// it).
    Engine,
}

/// What the device keeps of the hiprio queue besides its counters: who
/// is draining it and its vring. Atomics and a set-once cell, no lock.
#[derive(Default)]
pub(super) struct Hiprio {
    /// How many threads are draining it (its vring thread, the watchdog
    /// standing in for it; counted before they pop): a stop of the hiprio
    /// queue waits for them, bounded.
    busy: AtomicUsize,
    /// Its vring as vring thread 0 first saw it (that thread's first
    /// vring), for the watchdog: that thread serves request queue 0 too,
    /// and while it is stuck there the watchdog drains hiprio in its place.
    vring: std::sync::OnceLock<Vring>,
    /// Its used ring.
    pub(super) used: Used,
}

impl Hiprio {
    /// Counts a drain until the returned guard drops, however it ends.
    fn draining(&self) -> Busy<'_> {
        self.busy.fetch_add(1, Ordering::SeqCst);
        Busy(&self.busy)
    }

    /// Whether a drain is under way.
    fn is_busy(&self) -> bool {
        self.busy.load(Ordering::SeqCst) > 0
    }

    /// Keeps `vring` as the hiprio vring, unless one was kept before.
    pub(super) fn keep_vring(&self, vring: &Vring) {
        let _ = self.vring.get_or_init(|| vring.clone());
    }

    /// The hiprio vring, once vring thread 0 has seen it.
    pub(super) fn vring(&self) -> Option<&Vring> {
        self.vring.get()
    }
}

/// Counts a drain in `Hiprio::busy` until it ends, however it ends.
struct Busy<'a>(&'a AtomicUsize);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<F: Filesystem + 'static> FsDevice<F> {
    /// GET_VRING_BASE of the hiprio queue (it is no longer ready, so no
    /// chain is popped after this): waits, at most [`HIPRIO_STOP_WAIT`],
    /// for the forgets already taken to reach the filesystem (those the
    /// watchdog queued in the engine too), so that a device state saved
    /// next carries no lookup the guest let go of.
    pub(super) fn stop_hiprio(&self) {
        let t = Instant::now();
        let chan = self.inner.engine.chan();
        while self.inner.hiprio.is_busy() || chan.forgets_queued() > 0 {
            if t.elapsed() > HIPRIO_STOP_WAIT {
                fuse_core::warn_limited!(
                    "the hiprio queue stopped while forgets were still served"
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Pops and serves the hiprio queue until it is empty (with
    /// [`ForgetsBy::Engine`]: at most a vring's worth, and only while the
    /// engine holds fewer than [`FORGETS_HIGH`] forgets).
    pub(super) fn drain_hiprio(&self, vring: &Vring, by: ForgetsBy) {
        let Some(mem) = self.memory() else { return };
        // Counted before the first pop: a stop that made the queue not
        // ready after that pop sees it (the vring lock orders the two).
        let _busy = self.inner.hiprio.draining();
        let qs = &self.inner.counters(Vq::Hiprio);
        let used = &self.inner.hiprio.used;
        let chan = self.inner.engine.chan();
        // The watchdog takes one vring's worth at a time: a guest that
        // refills hiprio as fast must not keep it from other queues.
        let most = match by {
            ForgetsBy::Here => usize::MAX,
            ForgetsBy::Engine => usize::from(self.inner.cfg.queue_size),
        };
        let mut popped_n = 0;
        loop {
            if popped_n >= most
                || (by == ForgetsBy::Engine && chan.forgets_queued() >= FORGETS_HIGH)
            {
                break;
            }
            let Some(popped) = self.pop(vring, &mem) else {
                break;
            };
            popped_n += 1;
            let chain = match popped {
                Ok(c) => c,
                Err((head, _)) => {
                    qs.add_malformed(1);
                    self.publish(vring, used, &mem, head, &[], 0);
                    continue;
                }
            };
            qs.add_submitted(1);
            self.forget(&chain, by);
            qs.add_completed(1);
            self.publish(vring, used, &mem, chain.head, chain.writable(), 0);
        }
        if popped_n > 0 {
            notify(vring, used, Some(&mem));
        }
    }

    /// FORGET and BATCH_FORGET are served here (or queued for the engine's
    /// workers: `by`), unless the connection was aborted (then dropped, as
    /// the engine drops queued ones); INTERRUPT
    /// (which Linux's virtio-fs does not send today) goes to the lock call
    /// it names; anything else is dropped and counted as malformed.
    fn forget(&self, chain: &Chain, by: ForgetsBy) {
        let len = chain.readable_len().min(1 << 20);
        let mut buf = vec![0u8; len];
        if chain.read_at(0, &mut buf).is_err() {
            return;
        }
        let Ok((h, rest)) = InHeader::read_from_prefix(&buf) else {
            return;
        };
        let engine = &self.inner.engine;
        let serve = |list: &[ForgetOne]| match by {
            ForgetsBy::Here if engine.chan().is_connected() => engine.dispatcher().forget(list),
            ForgetsBy::Here => {}
            // (Dropped by the engine once aborted.)
            ForgetsBy::Engine => engine.chan().send_forgets(list),
        };
        match Opcode::from_u32(h.opcode) {
            Some(Opcode::Forget) => {
                if let Ok((f, _)) = ForgetIn::read_from_prefix(rest) {
                    serve(&[ForgetOne {
                        nodeid: h.nodeid,
                        nlookup: f.nlookup,
                    }]);
                }
            }
            Some(Opcode::BatchForget) => {
                let Ok((b, rest)) = BatchForgetIn::read_from_prefix(rest) else {
                    return;
                };
                let n = (b.count as usize).min(rest.len() / std::mem::size_of::<ForgetOne>());
                if let Ok((list, _)) = <[ForgetOne]>::ref_from_prefix_with_elems(rest, n) {
                    serve(list);
                }
            }
            Some(Opcode::Interrupt) => {
                if let Ok((i, _)) = InterruptIn::read_from_prefix(rest) {
                    self.interrupt_waiter(i.unique);
                }
            }
            _ => {
                self.inner.counters(Vq::Hiprio).add_malformed(1);
            }
        }
    }
}
