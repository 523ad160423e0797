//! The ring's commands (ADD_QUEUE, ADD_BUFPOOL, REGISTER, COMMIT_AND_FETCH)
//! and the server's handle, [`RingEnd`].

use super::ent::{Ent, EntState, EntryBufs};
use super::pool::Pool;
use super::{EntHandle, Fetched, Mode, Ring, RingLink, RingStats};
use crate::abi::{uring, UringCmdReq};
use crate::chan::{Chan, Core, Errno};
use crate::sync::{lock, Arc, Weak};
use zerocopy::IntoBytes;

impl Ring {
    fn add_queue(&self, area: &[u8], privileged: bool) -> Result<(), Errno> {
        let cmd = Self::cmd(area)?;
        let qi = self.qidx(cmd.qid)?;
        if cmd.flags & !uring::QUEUE_ZERO_COPY != 0 {
            return Err(Errno::EINVAL);
        }
        let zc = cmd.flags & uring::QUEUE_ZERO_COPY != 0;
        if zc && !privileged {
            return Err(Errno::EPERM);
        }
        let mut q = lock(&self.queues[qi]);
        if q.stopped {
            return Err(Errno::ENOTCONN);
        }
        if q.exists {
            return Err(Errno::EEXIST);
        }
        q.exists = true;
        q.zero_copy = zc;
        Ok(())
    }

    fn add_bufpool(&self, area: &[u8], mem: Vec<u8>, fixed: Option<u16>) -> Result<(), Errno> {
        let cmd = Self::cmd(area)?;
        let qi = self.qidx(cmd.qid)?;
        if cmd.flags != 0 || cmd.bufpool.reserved != 0 || cmd.bufpool.len as usize != mem.len() {
            return Err(Errno::EINVAL);
        }
        if mem.len() < self.max_payload {
            return Err(Errno::EINVAL);
        }
        let mut q = lock(&self.queues[qi]);
        if q.stopped {
            return Err(Errno::ENOTCONN);
        }
        if !q.exists || q.mode != Mode::Unset {
            return Err(Errno::EINVAL);
        }
        q.pool = Some(Pool::new(mem, self.max_payload));
        q.mode = Mode::Pool;
        q.fixed = fixed;
        Ok(())
    }

    fn register(
        &self,
        area: &[u8],
        bufs: EntryBufs,
        fixed: Option<u16>,
    ) -> Result<(EntHandle, bool), Errno> {
        let cmd = Self::cmd(area)?;
        let qi = self.qidx(cmd.qid)?;
        let mut q = lock(&self.queues[qi]);
        if q.stopped {
            return Err(Errno::ENOTCONN);
        }
        Self::check_fixed(&q, fixed)?;
        let own = if bufs.payload.is_empty() {
            if q.mode != Mode::Pool {
                return Err(Errno::EINVAL);
            }
            None
        } else {
            // A payload-carrying REGISTER selects per-entry mode.
            if q.mode == Mode::Pool || bufs.payload.len() < self.max_payload {
                return Err(Errno::EINVAL);
            }
            q.mode = Mode::PerEntry;
            Some(bufs.payload)
        };
        q.exists = true;
        let first = q.ents.iter().all(|e| e.state == EntState::Released);
        let id = q.ents.len() as u32;
        q.ents.push(Ent::new(bufs.header, own));
        q.mv(id, EntState::Available)?;
        self.dispatch(&mut q, qi);
        Ok((
            EntHandle {
                qid: cmd.qid,
                ent: id,
            },
            first,
        ))
    }

    #[cfg(feature = "test-utils")]
    fn pool_free(&self, qid: u16) -> Option<(usize, usize)> {
        let q = lock(self.queues.get(usize::from(qid))?);
        q.pool.as_ref().map(|p| (p.free_count(), p.len()))
    }

    #[cfg(feature = "test-utils")]
    fn entry_state(&self, h: EntHandle) -> Option<EntState> {
        let q = lock(self.queues.get(usize::from(h.qid))?);
        q.ents.get(h.ent as usize).map(|e| e.state)
    }

    #[cfg(feature = "test-utils")]
    fn check_invariants(&self) -> Result<(), String> {
        for (qi, m) in self.queues.iter().enumerate() {
            let mut q = lock(m);
            let q = &mut *q;
            for (id, e) in q.ents.iter().enumerate() {
                let id = id as u32;
                let mut lists = 0;
                for s in [
                    EntState::Available,
                    EntState::FuseReq,
                    EntState::Userspace,
                    EntState::Teardown,
                ] {
                    let n = q.lists.count(&q.ents, s, id);
                    if n > 1 || (n == 1 && e.state != s) {
                        return Err(format!(
                            "queue {qi} entry {id} ({:?}) on the {s:?} list",
                            e.state
                        ));
                    }
                    lists += n;
                }
                let listed = !matches!(
                    e.state,
                    EntState::Invalid | EntState::Commit | EntState::Released
                );
                if lists != usize::from(listed) {
                    return Err(format!(
                        "queue {qi} entry {id} ({:?}) on {lists} lists",
                        e.state
                    ));
                }
            }
            q.lists
                .check(&q.ents)
                .map_err(|e| format!("queue {qi}: {e}"))?;
            let held = q.ents.iter().filter(|e| e.pool_buf.is_some()).count();
            let lent = q.lent;
            if let Some(p) = q.pool.as_mut() {
                if p.free_count() + held + lent != p.len() {
                    return Err(format!(
                        "queue {qi}: {} free + {held} held + {lent} lent != {} buffers",
                        p.free_count(),
                        p.len()
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The server's end of a connection's ring: the in-process equivalent of
/// `IORING_OP_URING_CMD` on `/dev/fuse`. Cheap to clone; usable before INIT
/// (commands then fail with EAGAIN) and after abort (ENOTCONN).
#[derive(Clone)]
pub struct RingEnd {
    pub(crate) core: Weak<Core>,
    /// The caller may create zero-copy queues (the kernel's CAP_SYS_ADMIN).
    pub privileged: bool,
}

impl std::fmt::Debug for RingEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingEnd")
            .field("privileged", &self.privileged)
            .finish()
    }
}

impl Chan {
    /// The server's end of the ring (FUSE-over-io_uring). `privileged`
    /// plays CAP_SYS_ADMIN for zero-copy queues.
    pub fn ring_end(&self, privileged: bool) -> RingEnd {
        RingEnd {
            core: Arc::downgrade(self.core()),
            privileged,
        }
    }
}

/// The ring of `core`, once INIT created it.
fn ring_of(core: &Core) -> Option<&Arc<Ring>> {
    core.part_ref::<RingLink>().and_then(RingLink::ring)
}

impl RingEnd {
    fn ring(&self) -> Result<Arc<Ring>, Errno> {
        let core = self.core.upgrade().ok_or(Errno::ENOTCONN)?;
        if !core.is_connected() {
            return Err(Errno::ENOTCONN);
        }
        ring_of(&core).cloned().ok_or(Errno::EAGAIN)
    }

    /// ADD_QUEUE (`flags` may carry `uring::QUEUE_ZERO_COPY`).
    pub fn add_queue(&self, area: &[u8]) -> Result<(), Errno> {
        self.ring()?.add_queue(area, self.privileged)
    }

    /// ADD_BUFPOOL: `mem` is the pool memory (`bufpool.len` must match);
    /// `fixed` is the registered-buffer index when the SQE carries
    /// IORING_URING_CMD_FIXED.
    pub fn add_bufpool(&self, area: &[u8], mem: Vec<u8>, fixed: Option<u16>) -> Result<(), Errno> {
        self.ring()?.add_bufpool(area, mem, fixed)
    }

    /// REGISTER an entry (its command is then held until a request comes;
    /// see [`RingEnd::fetch`]). When every queue has an entry the ring is
    /// ready and admission opens.
    pub fn register(
        &self,
        area: &[u8],
        bufs: EntryBufs,
        fixed: Option<u16>,
    ) -> Result<EntHandle, Errno> {
        let ring = self.ring()?;
        let (h, first) = ring.register(area, bufs, fixed)?;
        if first {
            if let Some(core) = self.core.upgrade() {
                core.ring_queue_registered(h.qid);
            }
        }
        Ok(h)
    }

    /// Completes the held command of entry `h`: waits (when `block`) for a
    /// request and hands it over. ENOTCONN once the ring is torn down.
    pub fn fetch(&self, h: EntHandle, block: bool) -> Result<Option<Fetched>, Errno> {
        self.ring()?.fetch(h, block)
    }

    /// Hands over the request of one of queue `qid`'s reserved entries
    /// (see [`RingEnd::prefer`]) that holds one, without blocking: how a
    /// submitter that owns several entries finds what it was given.
    pub fn fetch_own(&self, qid: u16) -> Result<Option<Fetched>, Errno> {
        self.ring()?.fetch_own(qid)
    }

    /// [`RingEnd::fetch_own`] for up to `max` entries at once: appends to
    /// `out` the requests of queue `qid`'s reserved entries that hold one,
    /// oldest first, without blocking, and returns how many it appended
    /// (0: none holds a request). The queue's lock is taken once to take
    /// them and once to hand them over (the copies happen between, as for
    /// one). A request that does not fit its entry fails (EIO) as with
    /// [`RingEnd::fetch_own`]. ENOTCONN once the ring is torn down and
    /// nothing was appended.
    pub fn fetch_own_batch(
        &self,
        qid: u16,
        max: usize,
        out: &mut Vec<Fetched>,
    ) -> Result<usize, Errno> {
        let ring = self.ring()?;
        if max == 1 {
            // One entry: the single form costs less than the batch's
            // bookkeeping.
            return Ok(ring.fetch_own(qid)?.map_or(0, |f| {
                out.push(f);
                1
            }));
        }
        ring.fetch_own_batch(qid, max, out)
    }

    /// Reserves entry `h` for its owner without making its queue prefer
    /// reserved entries now (see [`RingEnd::prefer`]).
    pub fn reserve(&self, h: EntHandle) -> Result<(), Errno> {
        self.ring()?.reserve(h)
    }

    /// COMMIT without the fetch: returns the entry, now available or
    /// already holding its next request. On a validation error (EINVAL)
    /// the entry is given back unchanged.
    pub fn commit(
        &self,
        area: &[u8],
        f: Fetched,
        fixed: Option<u16>,
    ) -> Result<EntHandle, (Errno, Option<Fetched>)> {
        let ring = f.held.ring.clone();
        ring.commit(area, f, fixed)
    }

    /// Commits several entries, each with its own commit id (what
    /// [`Fetched::commit_cmd`] gives; the reply set with
    /// [`Fetched::set_reply`]), in order, taking each queue's lock twice
    /// per run of entries of that queue rather than per entry; their
    /// requests then end in the same order, each exactly once, their end
    /// callbacks run on this thread with no engine lock held. Empties
    /// `batch`, except for entries a single [`RingEnd::commit`] would
    /// refuse with EINVAL (a commit id that does not name the entry's
    /// request, a wrong `fixed`): those stay in `batch`, unchanged, in
    /// order (dropping one fails its request with EIO). Returns how many
    /// were committed (on a torn-down ring too: their requests end with
    /// ECONNABORTED and the entries are released).
    pub fn commit_batch(&self, batch: &mut Vec<Fetched>, fixed: Option<u16>) -> usize {
        if batch.len() == 1 {
            // One entry: the single form costs less than the batch's
            // bookkeeping.
            let Some(f) = batch.pop() else { return 0 };
            let area = f.commit_cmd();
            let ring = f.held.ring.clone();
            return match ring.commit(&area, f, fixed) {
                // Committed (on a torn-down ring too: its request ended).
                Ok(_) | Err((_, None)) => 1,
                Err((_, Some(f))) => {
                    batch.push(f);
                    0
                }
            };
        }
        let mut refused = Vec::new();
        let mut n = 0;
        while let Some(first) = batch.first() {
            // Runs of entries of one ring (one connection); normally one.
            let ring = first.held.ring.clone();
            let run = batch
                .iter()
                .position(|f| !Arc::ptr_eq(&f.held.ring, &ring))
                .unwrap_or(batch.len());
            if run == batch.len() {
                n += ring.commit_batch(batch, fixed, &mut refused);
            } else {
                let mut rest = batch.split_off(run);
                n += ring.commit_batch(batch, fixed, &mut refused);
                std::mem::swap(batch, &mut rest);
            }
        }
        // `batch` is empty and keeps its capacity for the caller's next.
        batch.append(&mut refused);
        n
    }

    /// Waits until one of `entries()` (entries of queue `qid` the caller
    /// owns) holds a request and hands it over, or until `ready()` holds
    /// (None). `ready` is re-checked after every [`RingEnd::wake`].
    pub fn fetch_any(
        &self,
        qid: u16,
        entries: &dyn Fn() -> Vec<EntHandle>,
        ready: &dyn Fn() -> bool,
    ) -> Result<Option<Fetched>, Errno> {
        self.ring()?.fetch_any(qid, entries, ready)
    }

    /// Wakes the threads waiting in [`RingEnd::fetch_any`] on queue `qid`.
    pub fn wake(&self, qid: u16) {
        if let Ok(r) = self.ring() {
            r.wake(qid);
        }
    }

    /// COMMIT_AND_FETCH: commits `f` and waits for the entry's next request.
    pub fn commit_and_fetch(&self, f: Fetched, fixed: Option<u16>) -> Result<Fetched, Errno> {
        // Commit and fetch on the ring the entry belongs to.
        let ring = f.held.ring.clone();
        let area = f.commit_cmd();
        let h = ring.commit(&area, f, fixed).map_err(|(e, _)| e)?;
        ring.fetch(h, true)?.ok_or(Errno::EAGAIN)
    }

    /// Reserves entry `h` for its owner and has queue `qid`'s reserved
    /// entries take requests first (None: stop): while available they take
    /// the next request before any other entry, except a SETLKW (which may
    /// wait). A reserved entry never takes a request while its queue is
    /// not preferring, except on its own commit. A submitter that owns
    /// entries marks them preferred while it submits, then serves what they
    /// got with [`RingEnd::fetch`] (not blocking) without waking a server
    /// thread.
    pub fn prefer(&self, qid: u16, h: Option<EntHandle>) -> Result<(), Errno> {
        self.ring()?.prefer(qid, h)
    }

    /// Stops queue `qid` preferring reserved entries (as `prefer(qid,
    /// None)`) and says whether one of them holds a request its owner has
    /// not fetched (from then on, only the owner's own commits give its
    /// entries requests: false means it has nothing to fetch).
    pub fn unprefer(&self, qid: u16) -> Result<bool, Errno> {
        self.ring()?.unprefer(qid)
    }

    /// Stops queue `qid` preferring reserved entries (as `prefer(qid,
    /// None)`) and hands the requests its reserved entries hold, but whose
    /// owner has not begun to fetch, to other entries: for a submitter
    /// that cannot serve them now (stuck in a host call). Returns how many
    /// it handed on.
    pub fn hand_back_own(&self, qid: u16) -> Result<usize, Errno> {
        self.ring()?.hand_back_own(qid)
    }

    /// Counters.
    pub fn stats(&self) -> Result<RingStats, Errno> {
        self.ring_any().map(|r| r.stats())
    }

    /// `(free, total)` buffers of queue `qid`'s pool. Inspection for
    /// tests (feature `test-utils`), like the two below.
    #[cfg(feature = "test-utils")]
    pub fn pool_free(&self, qid: u16) -> Option<(usize, usize)> {
        self.ring_any().ok()?.pool_free(qid)
    }

    /// The state of an entry.
    #[cfg(feature = "test-utils")]
    pub fn entry_state(&self, h: EntHandle) -> Option<EntState> {
        self.ring_any().ok()?.entry_state(h)
    }

    /// Checks the ring's invariants: every entry on exactly the list of its
    /// state, and free + held + lent pool buffers equal the pool size.
    #[cfg(feature = "test-utils")]
    pub fn check_invariants(&self) -> Result<(), String> {
        self.ring_any()
            .map_err(|e| e.to_string())?
            .check_invariants()
    }

    /// The ring even after abort (for inspection).
    fn ring_any(&self) -> Result<Arc<Ring>, Errno> {
        let core = self.core.upgrade().ok_or(Errno::ENOTCONN)?;
        ring_of(&core).cloned().ok_or(Errno::EAGAIN)
    }
}

/// Builds a command area for `qid` with `flags`, for tests and servers.
pub fn cmd_area(qid: u16, flags: u64, commit_id: u64) -> [u8; 80] {
    let c = UringCmdReq {
        flags,
        commit_id,
        qid,
        ..Default::default()
    };
    let mut area = [0u8; 80];
    area[..40].copy_from_slice(c.as_bytes());
    area
}

/// Builds an ADD_BUFPOOL command area.
pub fn bufpool_area(qid: u16, len: u32) -> [u8; 80] {
    let mut c = UringCmdReq {
        qid,
        ..Default::default()
    };
    c.bufpool.len = len;
    let mut area = [0u8; 80];
    area[..40].copy_from_slice(c.as_bytes());
    area
}
