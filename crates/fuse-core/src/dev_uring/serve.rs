//! The server's side of an entry: fetching the request an entry holds
//! (the copy into the entry's buffers), committing the reply (the copy
//! back and the end of the request), and abandoning a dropped entry; each
//! for one entry or for a batch of a queue's entries under one
//! acquisition of the queue's lock per step.
//!
//! ```text
//! fetch:  queue lock: take (FuseReq, copying) │ copy_in │ queue lock: land (Userspace)
//!         │ SENT, a pending interrupt queued; failed requests ended
//! commit: queue lock: check, Userspace → Commit │ copy_out │ queue lock: entry back
//!         (Available, or FuseReq with the next request) │ requests ended (callbacks)
//! ```
//!
//! Copies run with no queue lock held; requests end after every queue lock
//! is released. Batches keep their requests in a stack array of [`CHUNK`].

use super::copy::CopiedIn;
use super::fetched::Held;
use super::*;
use crate::sync::{wait, MutexGuard};

/// Most entries a batch fetches or commits per acquisition of their
/// queue's lock (the batch forms' working storage is this many slots on
/// the stack).
pub(super) const CHUNK: usize = 16;

/// A batch step's requests: up to [`CHUNK`], in slots `0..len` (the
/// slots past `len` are always empty, so dropping it looks at `0..len`
/// only: the drop of a whole array of options cost more than a batch of
/// one request's bookkeeping).
struct Slots {
    reqs: std::mem::ManuallyDrop<[Option<Arc<Request>>; CHUNK]>,
    len: usize,
}

impl Slots {
    fn new() -> Slots {
        Slots {
            reqs: std::mem::ManuallyDrop::new(Default::default()),
            len: 0,
        }
    }

    /// Puts `r` in slot `i`.
    fn put(&mut self, i: usize, r: Option<Arc<Request>>) {
        self.len = self.len.max(i + 1);
        self.reqs[i] = r;
    }

    /// Empties every slot.
    fn clear(&mut self) {
        for r in &mut self.reqs[..self.len] {
            r.take();
        }
        self.len = 0;
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        self.clear();
    }
}

/// How a fetch's copy ended (fetch step 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Landing {
    /// The entry is the server's now.
    Ready,
    /// The ring stopped meanwhile: the entry is released, the request
    /// ends with ECONNABORTED.
    Aborted,
    /// The request does not fit the entry: it fails, the entry serves on.
    Failed(Errno),
    /// The entry was not in the state a fetch leaves it in (never: only a
    /// fetch moves an entry that is being copied).
    Invalid,
}

impl Ring {
    pub(super) fn end(&self, req: &Arc<Request>, err: Option<Errno>) {
        if req.flags.test(flag::FINISHED) {
            return;
        }
        if let Some(e) = err {
            req.set_error(e.0);
        }
        if let Some(core) = self.core.upgrade() {
            core.request_end(req);
        }
    }

    /// Stops queue `qid` preferring its reserved entries and gives the
    /// requests they hold that their owner has not begun to fetch back to
    /// the queue, ahead of what waits and in their order, for other
    /// entries to take. Returns how many it gave back.
    pub(super) fn hand_back_own(&self, qid: u16) -> Result<usize, Errno> {
        let qi = self.qidx(qid)?;
        let mut q = lock(&self.queues[qi]);
        q.preferring = false;
        let ids: Vec<u32> = (q.lists.iter(&q.ents, ListId::FuseReqOwn))
            .filter(|&id| q.ents.get(id as usize).is_some_and(|e| !e.copying))
            .collect();
        let mut back = Vec::with_capacity(ids.len());
        for id in ids {
            let Some(e) = q.ents.get_mut(id as usize) else {
                continue;
            };
            let (req, buf) = (e.req.take(), e.pool_buf.take());
            q.put_buf(buf);
            // FuseReq -> Available: assigned, never copied.
            q.mv_known(id, EntState::Available);
            back.extend(req);
        }
        let n = back.len();
        for r in back.into_iter().rev() {
            q.reqs.push_front(r);
        }
        self.dispatch(&mut q, qi);
        Ok(n)
    }

    /// Marks entry `h` reserved (see [`Queue::preferring`]).
    pub(super) fn reserve(&self, h: EntHandle) -> Result<(), Errno> {
        let qi = self.qidx(h.qid)?;
        let mut q = lock(&self.queues[qi]);
        if q.ents.get(h.ent as usize).is_none() {
            return Err(Errno::EINVAL);
        }
        q.set_reserved(h.ent);
        Ok(())
    }

    /// Fetch step 1 (queue lock held): entry `h`, in FuseReq and not
    /// being copied, is copied from here on (its request LOCKED); its
    /// header and payload buffer move into a `Fetched` given to `put` (not
    /// the server's yet: dropping it abandons nothing).
    #[inline]
    fn take(
        self: &Arc<Self>,
        q: &mut Queue,
        h: EntHandle,
        put: impl FnOnce(Fetched),
    ) -> Option<Arc<Request>> {
        let e = q.ents.get_mut(h.ent as usize)?;
        let req = e.req.clone()?;
        e.copying = true;
        let mut header = e.header.take().unwrap_or_default();
        // Per-entry and pool modes are exclusive: an entry has one or the
        // other.
        let payload = match e.pool_buf.take() {
            Some(b) => Payload::Pool(b),
            None => e.own_payload.take().map_or(Payload::None, Payload::Own),
        };
        header.ring_ent_in_out.offset = match (&payload, q.pool.as_ref()) {
            (Payload::Pool(b), Some(p)) => p.offset(b.index),
            _ => 0,
        };
        if matches!(payload, Payload::Pool(_)) {
            // Lent from here until it is back on an entry or in the pool.
            q.lent += 1;
        }
        req.flags.set(flag::LOCKED);
        put(Fetched {
            header,
            held: Held {
                ring: self.clone(),
                handle: h,
                payload,
                client: None,
                fence: None,
                done: true,
            },
        });
        Some(req)
    }

    /// Fetch step 3 (queue lock held): the copy is over; says whether the
    /// entry goes to the server (it is in Userspace now), or back (its
    /// request failed: the caller calls [`Ring::unland`]), or is to be
    /// released (the ring stopped: [`Ring::unland`] too).
    #[inline]
    fn land(
        &self,
        q: &mut Queue,
        qi: usize,
        ent: u32,
        req: &Arc<Request>,
        c: CopiedIn,
        spare: Payload,
    ) -> Landing {
        let i = ent as usize;
        req.flags.clear(flag::LOCKED);
        q.ents[i].copying = false;
        match spare {
            Payload::Own(v) => q.ents[i].own_payload = Some(v),
            Payload::Pool(b) => {
                q.lent = q.lent.saturating_sub(1);
                q.put_buf(Some(b));
                // A request may be waiting for exactly this buffer.
                self.dispatch(q, qi);
            }
            Payload::Client(_) | Payload::None => {}
        }
        // Another thread may wait on this entry (copying is over).
        q.wake_ent(ent);
        q.notify_cv(&self.cvs[qi]);
        if q.stopped || req.flags.test(flag::ABORTED) {
            return Landing::Aborted;
        }
        if let Some(e) = c.err {
            return Landing::Failed(e);
        }
        if q.mv(ent, EntState::Userspace).is_err() {
            return Landing::Invalid;
        }
        q.ents[i].client_pages = c.zc;
        Landing::Ready
    }

    /// Fetch step 3 for an entry that does not go to the server (queue
    /// lock held): its header and buffers go back to it; it is released
    /// (`aborted`) or available again (its request failed).
    fn unland(&self, q: &mut Queue, qi: usize, f: Fetched, req: &Arc<Request>, aborted: bool) {
        let Fetched { header, mut held } = f;
        let ent = held.handle.ent;
        let payload = std::mem::replace(&mut held.payload, Payload::None);
        let e = &mut q.ents[ent as usize];
        e.header = Some(header);
        if aborted {
            // The entry lets go of its request: held by a released entry it
            // would stay counted as waiting for the life of the connection
            // (`wait_aborted` would never return). Not its last reference:
            // the caller holds `req`.
            e.req = None;
            match payload {
                Payload::Pool(b) => {
                    q.lent = q.lent.saturating_sub(1);
                    q.put_buf(Some(b));
                }
                p => self.give_back(req, p),
            }
            q.retire(ent);
        } else {
            // The request does not fit this entry: fail it, keep serving.
            e.req = None;
            match payload {
                Payload::Own(v) => e.own_payload = Some(v),
                Payload::Pool(b) => {
                    q.lent = q.lent.saturating_sub(1);
                    q.put_buf(Some(b));
                }
                Payload::Client(_) | Payload::None => {}
            }
            q.mv_known(ent, EntState::Available);
            self.dispatch(q, qi);
        }
    }

    /// Fetch step 4 (no lock): the landed entry is the server's (a
    /// pending interrupt is queued now that its request is SENT).
    #[inline]
    fn hand_over(&self, f: &mut Fetched, req: &Arc<Request>) {
        req.flags.set(flag::SENT);
        if req.flags.test(flag::INTERRUPTED) {
            if let Some(core) = self.core.upgrade() {
                core.interrupt(req);
            }
        }
        if f.is_zero_copy() {
            self.zero_copies.fetch_add(1, Ordering::Relaxed);
        }
        f.held.client = client_mem(req).cloned();
        f.held.fence = req.args.fence.clone();
        f.held.done = false;
    }

    pub(super) fn fetch(
        self: &Arc<Self>,
        h: EntHandle,
        block: bool,
    ) -> Result<Option<Fetched>, Errno> {
        let qi = self.qidx(h.qid)?;
        loop {
            let mut q = lock(&self.queues[qi]);
            loop {
                let e = q.ents.get(h.ent as usize).ok_or(Errno::EINVAL)?;
                match e.state {
                    EntState::FuseReq if !e.copying => break,
                    EntState::Available | EntState::FuseReq => {
                        if q.stopped && e.state == EntState::Available {
                            q.retire(h.ent);
                            return Err(Errno::ENOTCONN);
                        }
                        if !block {
                            return Ok(None);
                        }
                        q.cv_waiters += 1;
                        q = wait(&self.cvs[qi], q);
                        q.cv_waiters -= 1;
                    }
                    EntState::Teardown | EntState::Released => return Err(Errno::ENOTCONN),
                    _ => return Err(Errno::EINVAL),
                }
            }
            if let Some(f) = self.fetch_locked(q, qi, h)? {
                return Ok(Some(f));
            }
        }
    }

    /// Fetch steps 1 to 4 for entry `h`, which is in FuseReq and not being
    /// copied, from its queue's lock `q` on (released for the copy).
    /// Ok(None): its request did not fit the entry and ended (EIO); the
    /// entry is available again, or already holds the next request.
    fn fetch_locked(
        self: &Arc<Self>,
        mut q: MutexGuard<'_, Queue>,
        qi: usize,
        h: EntHandle,
    ) -> Result<Option<Fetched>, Errno> {
        let zq = q.zero_copy;
        let mut one = None;
        let req = self
            .take(&mut q, h, |f| one = Some(f))
            .ok_or(Errno::EINVAL)?;
        let mut f = one.ok_or(Errno::EINVAL)?;
        drop(q);
        let mut spare = Payload::None;
        let c = self.copy_in(&req, &mut f.header, &mut f.held.payload, zq, &mut spare);
        let landing = {
            let mut q = lock(&self.queues[qi]);
            let l = self.land(&mut q, qi, h.ent, &req, c, spare);
            match l {
                Landing::Aborted => self.unland(&mut q, qi, f, &req, true),
                Landing::Failed(_) => self.unland(&mut q, qi, f, &req, false),
                Landing::Ready => {
                    drop(q);
                    self.hand_over(&mut f, &req);
                    return Ok(Some(f));
                }
                Landing::Invalid => {}
            }
            l
        };
        match landing {
            Landing::Aborted => {
                self.end(&req, Some(Errno::ECONNABORTED));
                Err(Errno::ENOTCONN)
            }
            Landing::Failed(e) => {
                self.end(&req, Some(e));
                Ok(None)
            }
            Landing::Ready | Landing::Invalid => Err(Errno::EINVAL),
        }
    }

    /// Hands over the request of one of queue `qid`'s reserved entries
    /// that holds one, if any (without blocking): the entry is found and
    /// taken under one acquisition of the queue's lock.
    pub(super) fn fetch_own(self: &Arc<Self>, qid: u16) -> Result<Option<Fetched>, Errno> {
        let qi = self.qidx(qid)?;
        let q = lock(&self.queues[qi]);
        if q.stopped {
            return Err(Errno::ENOTCONN);
        }
        let Some(ent) = q.own_with_request() else {
            return Ok(None);
        };
        let h = EntHandle { qid, ent };
        match self.fetch_locked(q, qi, h)? {
            Some(f) => Ok(Some(f)),
            // Its request did not fit: what the entry holds now, if
            // anything (as a non-blocking fetch of it looks again).
            None => self.fetch(h, false),
        }
    }

    /// Hands over the requests of up to `max` of queue `qid`'s reserved
    /// entries that hold one (oldest first, without blocking), appending
    /// them to `out`: per chunk of up to [`CHUNK`] entries, one queue lock
    /// to take them, the copies, one queue lock to give them to the
    /// server. Returns how many it appended.
    pub(super) fn fetch_own_batch(
        self: &Arc<Self>,
        qid: u16,
        max: usize,
        out: &mut Vec<Fetched>,
    ) -> Result<usize, Errno> {
        let qi = self.qidx(qid)?;
        let start = out.len();
        let mut slots = Slots::new();
        let mut landings = [Landing::Invalid; CHUNK];
        let mut stopped = false;
        loop {
            let base = out.len();
            let want = (max - (base - start)).min(CHUNK);
            if want == 0 {
                break;
            }
            let (n, zq) = {
                let mut q = lock(&self.queues[qi]);
                if q.stopped {
                    stopped = true;
                    break;
                }
                let mut n = 0;
                let mut at = q.lists.front(ListId::FuseReqOwn);
                while let Some(ent) = at {
                    if n == want {
                        break;
                    }
                    // Taking an entry does not move it off its list.
                    at = q.lists.next(&q.ents, ent);
                    if q.ents[ent as usize].copying {
                        continue;
                    }
                    let h = EntHandle { qid, ent };
                    if let Some(req) = self.take(&mut q, h, |f| out.push(f)) {
                        slots.put(n, Some(req));
                        n += 1;
                    }
                }
                (n, q.zero_copy)
            };
            if n == 0 {
                break;
            }
            let mut copied = [CopiedIn::default(); CHUNK];
            // Buffers zero-copy did not need (a zero-copy queue's only).
            let mut spares: Vec<(usize, Payload)> = Vec::new();
            let reqs = &mut slots.reqs;
            for (i, f) in out[base..base + n].iter_mut().enumerate() {
                if let Some(req) = &reqs[i] {
                    let mut spare = Payload::None;
                    copied[i] =
                        self.copy_in(req, &mut f.header, &mut f.held.payload, zq, &mut spare);
                    if !matches!(spare, Payload::None) {
                        spares.push((i, spare));
                    }
                }
            }
            let mut failed = 0;
            {
                let mut q = lock(&self.queues[qi]);
                let mut spares = spares.into_iter().peekable();
                for i in 0..n {
                    let Some(req) = &reqs[i] else { continue };
                    let spare = spares
                        .next_if(|(j, _)| *j == i)
                        .map_or(Payload::None, |s| s.1);
                    let ent = out[base + i].held.handle.ent;
                    landings[i] = self.land(&mut q, qi, ent, req, copied[i], spare);
                }
                // Those that do not go to the server leave `out` (rare:
                // the ring stopped, or a request did not fit).
                for i in (0..n).rev() {
                    let aborted = match landings[i] {
                        Landing::Ready => continue,
                        // Never; the entry is left as it is.
                        Landing::Invalid => {
                            drop(out.remove(base + i));
                            continue;
                        }
                        Landing::Aborted => true,
                        Landing::Failed(_) => false,
                    };
                    let f = out.remove(base + i);
                    if let Some(req) = &reqs[i] {
                        self.unland(&mut q, qi, f, req, aborted);
                    }
                }
            }
            let mut at = base;
            for i in 0..n {
                let Some(req) = reqs[i].take() else { continue };
                match landings[i] {
                    Landing::Ready => {
                        self.hand_over(&mut out[at], &req);
                        at += 1;
                    }
                    Landing::Aborted => {
                        stopped = true;
                        self.end(&req, Some(Errno::ECONNABORTED));
                    }
                    Landing::Failed(e) => {
                        failed += 1;
                        self.end(&req, Some(e));
                    }
                    Landing::Invalid => self.end(&req, Some(Errno::EIO)),
                }
            }
            slots.clear();
            // Fewer than asked for: no more to take, unless some failed
            // (did not fit their entries), whose entries may have taken
            // the next requests: look again then.
            if stopped || (n < want && failed == 0) {
                break;
            }
        }
        match out.len() - start {
            0 if stopped => Err(Errno::ENOTCONN),
            n => Ok(n),
        }
    }

    /// A server dropped a [`Fetched`] without committing it: its request
    /// fails (EIO, or ECONNABORTED after an abort) and the entry goes back to
    /// Available with its buffers, so the queue keeps its capacity (its
    /// header went with the `Fetched`: the next fetch makes one).
    pub(crate) fn abandon(&self, h: EntHandle, payload: Payload) {
        let Ok(qi) = self.qidx(h.qid) else { return };
        let mut q = lock(&self.queues[qi]);
        let stopped = q.stopped;
        let idx = h.ent as usize;
        if q.ents.get(idx).map(|e| e.state) != Some(EntState::Userspace) {
            return;
        }
        let req = q.ents[idx].req.take();
        q.ents[idx].client_pages = false;
        match payload {
            Payload::Pool(b) => {
                q.lent = q.lent.saturating_sub(1);
                q.put_buf(Some(b));
            }
            Payload::Own(v) => q.ents[idx].own_payload = Some(v),
            p @ Payload::Client(_) => {
                if let Some(r) = &req {
                    self.give_back(r, p);
                }
            }
            Payload::None => {}
        }
        if stopped {
            q.retire(h.ent);
        } else {
            q.mv_known(h.ent, EntState::Available);
            self.dispatch(&mut q, qi);
        }
        q.notify_cv(&self.cvs[qi]);
        drop(q);
        if let Some(r) = req {
            self.end(
                &r,
                Some(if stopped {
                    Errno::ECONNABORTED
                } else {
                    Errno::EIO
                }),
            );
        }
    }

    /// Commit step 1 (queue lock held): checks that entry `h` is the
    /// server's and `commit_id` names its request, and moves it to Commit.
    #[inline]
    fn begin_commit(
        q: &mut Queue,
        h: EntHandle,
        commit_id: u64,
        fixed: Option<u16>,
    ) -> Result<Arc<Request>, Errno> {
        Self::check_fixed(q, fixed)?;
        let e = q.ents.get_mut(h.ent as usize).ok_or(Errno::EINVAL)?;
        match &e.req {
            Some(r) if e.state == EntState::Userspace && r.unique() == commit_id => {}
            _ => return Err(Errno::EINVAL),
        }
        e.client_pages = false;
        // The committer holds the request from here (an entry in Commit
        // is left alone by abort and the timeout scan).
        let req = e.req.take().ok_or(Errno::EINVAL)?;
        q.mv_known(h.ent, EntState::Commit);
        Ok(req)
    }

    /// Commit step 2 (no lock): the reply is copied back to `req`; the
    /// payload buffer the entry keeps is back in `f` (and what it held of
    /// the client is let go of here, not under a lock).
    #[inline]
    fn copy_back(&self, f: &mut Fetched, req: &Arc<Request>, stopped: bool) {
        let payload = f.held.take_for_commit();
        f.held.payload = self.copy_out(req, &f.header, payload, stopped);
        drop(f.held.client.take());
        drop(f.held.fence.take());
    }

    /// Commit step 3 (queue lock held): the entry gets its header and
    /// buffers back and, in the same call, the queue's next request when
    /// one waits (keeping its pool buffer for it when it needs one);
    /// ENOTCONN when the ring stopped (the entry is released). The caller
    /// dispatches.
    #[inline]
    fn finish_commit(&self, q: &mut Queue, f: Fetched) -> Result<(), Errno> {
        let Fetched { header, mut held } = f;
        let ent = held.handle.ent;
        let payload = std::mem::replace(&mut held.payload, Payload::None);
        if matches!(payload, Payload::Pool(_)) {
            q.lent = q.lent.saturating_sub(1);
        }
        let e = &mut q.ents[ent as usize];
        let leftover = match payload {
            Payload::Own(v) => {
                e.own_payload = Some(v);
                None
            }
            Payload::Pool(b) => Some(b),
            _ => None,
        };
        if q.stopped {
            q.put_buf(leftover);
            q.retire(ent);
            return Err(Errno::ENOTCONN);
        }
        e.header = Some(header);
        // Fetch in the same call: the next request goes straight to this
        // entry, reusing its pool buffer when it needs one.
        // (A reserved entry never takes a SETLKW: its owner serves in line
        // and must not block; `dispatch` gives it to another entry.)
        let reserved = e.reserved;
        let next_needs = q
            .reqs
            .front()
            .filter(|r| !(reserved && r.args.opcode == Opcode::Setlkw))
            .map(|r| q.mode == Mode::Pool && needs_payload(r, self.opts));
        match next_needs {
            Some(needs) => {
                let buf = match (needs, leftover) {
                    (true, Some(b)) => Some(b),
                    (true, None) => q.pool.as_mut().and_then(Pool::claim),
                    (false, b) => {
                        q.put_buf(b);
                        None
                    }
                };
                if needs && buf.is_none() {
                    q.enobufs += 1;
                    q.mv_known(ent, EntState::Available);
                } else if let Some(r) = q.reqs.pop_front() {
                    q.mv_known(ent, EntState::FuseReq);
                    let e = &mut q.ents[ent as usize];
                    e.req = Some(r);
                    e.pool_buf = buf;
                }
            }
            None => {
                q.put_buf(leftover);
                q.mv_known(ent, EntState::Available);
            }
        }
        Ok(())
    }

    pub(super) fn commit(
        self: &Arc<Self>,
        area: &[u8],
        mut f: Fetched,
        fixed: Option<u16>,
    ) -> Result<EntHandle, (Errno, Option<Fetched>)> {
        let Ok(cmd) = Self::cmd(area) else {
            return Err((Errno::EINVAL, Some(f)));
        };
        let h = f.held.handle;
        if cmd.qid != h.qid {
            return Err((Errno::EINVAL, Some(f)));
        }
        let qi = usize::from(h.qid);
        let (req, stopped) = {
            let mut q = lock(&self.queues[qi]);
            match Self::begin_commit(&mut q, h, cmd.commit_id, fixed) {
                Ok(req) => (req, q.stopped),
                Err(e) => {
                    drop(q);
                    return Err((e, Some(f)));
                }
            }
        };
        self.copy_back(&mut f, &req, stopped);
        let r = {
            let mut q = lock(&self.queues[qi]);
            let r = self.finish_commit(&mut q, f);
            if r.is_ok() {
                self.dispatch(&mut q, qi);
            }
            r
        };
        if let Some(core) = self.core.upgrade() {
            core.request_end(&req);
            // Its allocation serves a later send.
            core.recycle_one(req);
        }
        match r {
            Ok(()) => Ok(h),
            Err(e) => Err((e, None)),
        }
    }

    /// Commits every entry of `batch` (all of this ring), each with its
    /// own commit id (as [`Fetched::commit_cmd`] says), in order: per run
    /// of up to [`CHUNK`] entries of one queue, one queue lock to check
    /// them, the copies back, one queue lock to give the entries back,
    /// then their requests end, in order, with no lock held. An entry that
    /// fails the checks (EINVAL, as a single commit) goes to `refused`
    /// unchanged. Empties `batch`; returns how many were committed.
    pub(super) fn commit_batch(
        self: &Arc<Self>,
        batch: &mut Vec<Fetched>,
        fixed: Option<u16>,
        refused: &mut Vec<Fetched>,
    ) -> usize {
        let mut committed = 0;
        let mut slots = Slots::new();
        while let Some(first) = batch.first() {
            let qid = first.held.handle.qid;
            let Ok(qi) = self.qidx(qid) else {
                refused.extend(batch.drain(..1));
                continue;
            };
            let n = batch
                .iter()
                .take(CHUNK)
                .take_while(|f| f.held.handle.qid == qid)
                .count();
            let stopped = {
                let mut q = lock(&self.queues[qi]);
                for (i, f) in batch[..n].iter().enumerate() {
                    let r = Self::begin_commit(&mut q, f.held.handle, f.commit_id(), fixed);
                    slots.put(i, r.ok());
                }
                q.stopped
            };
            let reqs = &mut slots.reqs;
            for (f, r) in batch[..n].iter_mut().zip(reqs.iter()) {
                if let Some(req) = r {
                    self.copy_back(f, req, stopped);
                }
            }
            {
                let mut q = lock(&self.queues[qi]);
                for (f, r) in batch.drain(..n).zip(reqs.iter()) {
                    if r.is_some() {
                        let _ = self.finish_commit(&mut q, f);
                    } else {
                        // Not dropped here: that would abandon it, under
                        // this very lock.
                        refused.push(f);
                    }
                }
                if !q.stopped {
                    self.dispatch(&mut q, qi);
                }
            }
            committed += reqs[..n].iter().flatten().count();
            if let Some(core) = self.core.upgrade() {
                core.request_end_each(reqs[..n].iter().flatten());
                // Their allocations serve the next batch send.
                core.recycle(&mut reqs[..n]);
            }
            slots.clear();
        }
        committed
    }
}
