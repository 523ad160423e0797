//! The kernel side of FUSE-over-io_uring, in process and byte-compatible
//! with the kernel's ring ABI: commands take the bytes a server puts in the
//! SQE128 command area (`fuse_uring_cmd_req`) and entries carry the 288-byte
//! `fuse_uring_req_header`.
//!
//! Buffers are owned, never shared: a server registers its buffers and the
//! ring moves them (and a claimed pool buffer, or the client's own pages on
//! a zero-copy queue) into the [`Fetched`] it hands out; committing or
//! dropping the `Fetched` moves them back. So a client's pages cannot be
//! freed or reused while a server may touch them, by construction.
//!
//! Lock order: a queue's lock is taken after `bg_lock` and never together
//! with another queue's lock, the iq or the pq. Requests are ended with no
//! queue lock held.

mod commands;
mod copy;
mod ent;
mod fetched;
mod pool;
mod wait;

pub use commands::{bufpool_area, cmd_area, RingEnd};
pub use ent::{EntState, EntryBufs};
pub use fetched::Fetched;
use fetched::Payload;

use crate::abi::{
    self, decode::op_in_size, fopen, uring, DecodeOptions, EntryOut, Opcode, OpenOut, OutHeader,
    UringCmdReq, UringEntInOut, UringReqHeader,
};
use crate::chan::req::{flag, Location, Request};
use crate::chan::{Core, Errno};
use ent::{Ent, Lists};
use pool::{Pool, PoolBuf};
use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;
use zerocopy::{FromBytes, IntoBytes};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Unset,
    PerEntry,
    Pool,
}

/// One ring queue, guarded by its own lock.
#[derive(Debug)]
struct Queue {
    exists: bool,
    zero_copy: bool,
    mode: Mode,
    /// Registered pool: every later command must carry this fixed index.
    fixed: Option<u16>,
    ents: Vec<Ent>,
    lists: Lists,
    /// Requests waiting for an entry (`fuse_req_queue`).
    reqs: VecDeque<Arc<Request>>,
    /// Background requests waiting for an active slot (`fuse_req_bg_queue`).
    bg: VecDeque<Arc<Request>>,
    active_bg: u32,
    pool: Option<Pool>,
    /// Pool buffers lent to a server inside a [`Fetched`].
    lent: usize,
    stopped: bool,
    enobufs: u64,
    /// Threads asleep in `fetch_any`, each on its own condvar, with the
    /// entries it waits for: a request handed to an entry wakes only its
    /// owner (the queue-wide condvar would wake every server thread).
    sleepers: Vec<(u32, Arc<Condvar>)>,
    /// While set, the reserved entries (a submitter's own, which it serves
    /// without a hand-off to another thread) take requests before any
    /// other ([`RingEnd::prefer`](commands::RingEnd::prefer)); while clear
    /// they take none (but on their own commit).
    preferring: bool,
    /// Threads asleep on the queue's condvar (blocking `fetch`).
    cv_waiters: usize,
}

impl Queue {
    /// Wakes the threads asleep on the queue's condvar `cv`, if any (a
    /// notify with none would still cost a syscall per request).
    fn notify_cv(&self, cv: &Condvar) {
        if self.cv_waiters > 0 {
            cv.notify_all();
        }
    }

    /// Wakes the thread waiting for entry `id`, if one is.
    fn wake_ent(&self, id: u32) {
        for (e, cv) in &self.sleepers {
            if *e == id {
                cv.notify_one();
            }
        }
    }

    /// Wakes every thread asleep in `fetch_any`.
    fn wake_sleepers(&self) {
        for (_, cv) in &self.sleepers {
            cv.notify_one();
        }
    }

    fn new() -> Queue {
        Queue {
            exists: false,
            zero_copy: false,
            mode: Mode::Unset,
            fixed: None,
            ents: Vec::new(),
            lists: Lists::default(),
            reqs: VecDeque::new(),
            bg: VecDeque::new(),
            active_bg: 0,
            pool: None,
            lent: 0,
            stopped: false,
            enobufs: 0,
            sleepers: Vec::new(),
            preferring: false,
            cv_waiters: 0,
        }
    }

    fn mv(&mut self, id: u32, to: EntState) -> Result<(), Errno> {
        self.lists
            .move_ent(&mut self.ents, id, to)
            .map_err(|_| Errno::EINVAL)
    }

    fn put_buf(&mut self, b: Option<PoolBuf>) {
        if let (Some(b), Some(p)) = (b, self.pool.as_mut()) {
            p.put(b);
        }
    }
}

/// Counters of a ring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingStats {
    /// Requests waiting for an entry, over all queues.
    pub queued: usize,
    /// Background requests waiting for an active slot.
    pub bg_queued: usize,
    /// Entries the server holds.
    pub in_userspace: usize,
    /// Entries waiting for a request.
    pub available: usize,
    /// Times a request waited because no pool buffer was free.
    pub enobufs: u64,
    /// Requests handed over zero-copy.
    pub zero_copy: u64,
}

/// The ring of one connection.
pub(crate) struct Ring {
    core: Weak<Core>,
    max_payload: usize,
    opts: DecodeOptions,
    queues: Vec<Mutex<Queue>>,
    cvs: Vec<Condvar>,
    active_bg: AtomicU32,
    zc_files: Mutex<HashSet<u64>>,
    zero_copies: AtomicU64,
}

fn lk(m: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A handle naming one registered entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntHandle {
    /// Queue id.
    pub qid: u16,
    /// Entry index within the queue.
    pub ent: u32,
}

fn needs_payload(req: &Request, opts: DecodeOptions) -> bool {
    let k = op_in_size(req.args.opcode, opts).min(req.args.body.len());
    if req.args.body.len() > k {
        return true;
    }
    // READ and WRITE by reference: the data is the client's memory, and a
    // WRITE's reply travels in `op_in`.
    if client_mem(req).is_some() {
        return false;
    }
    req.data_len > 0 || req.args.out_size > 0
}

/// The client memory a READ or WRITE carries (`Args::client`): its data
/// goes by reference, never through the entry's payload.
fn client_mem(req: &Request) -> Option<&std::sync::Arc<dyn crate::chan::ClientMem>> {
    req.args
        .client
        .as_ref()
        .filter(|_| matches!(req.args.opcode, Opcode::Read | Opcode::Write))
}

fn read_fh(req: &Request) -> u64 {
    req.args
        .body
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

impl Ring {
    pub(crate) fn new(
        core: Weak<Core>,
        nr_queues: u16,
        max_payload: usize,
        opts: DecodeOptions,
    ) -> Ring {
        let n = usize::from(nr_queues.max(1));
        Ring {
            core,
            max_payload,
            opts,
            queues: (0..n).map(|_| Mutex::new(Queue::new())).collect(),
            cvs: (0..n).map(|_| Condvar::new()).collect(),
            active_bg: AtomicU32::new(0),
            zc_files: Mutex::new(HashSet::new()),
            zero_copies: AtomicU64::new(0),
        }
    }

    fn qidx(&self, qid: u16) -> Result<usize, Errno> {
        let i = usize::from(qid);
        if i < self.queues.len() {
            Ok(i)
        } else {
            Err(Errno::EINVAL)
        }
    }

    fn cmd(area: &[u8]) -> Result<UringCmdReq, Errno> {
        UringCmdReq::from_cmd_area(area).ok_or(Errno::EINVAL)
    }

    fn check_fixed(q: &Queue, fixed: Option<u16>) -> Result<(), Errno> {
        if q.fixed.is_some() && q.fixed != fixed {
            Err(Errno::EINVAL)
        } else {
            Ok(())
        }
    }

    /// Assigns queued requests to available entries.
    fn dispatch(&self, q: &mut Queue, qi: usize) {
        let mut assigned = false;
        while let Some(req) = q.reqs.front() {
            // A reserved entry first while its owner submits, but never
            // with a request that may wait (its owner serves it in line
            // and must not block); other entries otherwise.
            let reserved = |a: &u32| q.ents.get(*a as usize).is_some_and(|e| e.reserved);
            let own = (q.preferring && req.args.opcode != Opcode::Setlkw)
                .then(|| q.lists.avail.iter().copied().find(reserved))
                .flatten();
            let Some(id) = own.or_else(|| q.lists.avail.iter().copied().find(|a| !reserved(a)))
            else {
                break;
            };
            let zc = self.goes_zero_copy(q.zero_copy, req);
            let buf = if q.mode == Mode::Pool && !zc && needs_payload(req, self.opts) {
                match q.pool.as_mut().and_then(Pool::claim) {
                    Some(b) => Some(b),
                    None => {
                        // ENOBUFS: the request stays queued until a buffer returns.
                        q.enobufs += 1;
                        break;
                    }
                }
            } else {
                None
            };
            let Some(req) = q.reqs.pop_front() else { break };
            if q.mv(id, EntState::FuseReq).is_err() {
                q.reqs.push_front(req);
                q.put_buf(buf);
                break;
            }
            if let Some(e) = q.ents.get_mut(id as usize) {
                e.req = Some(req);
                e.pool_buf = buf;
            }
            q.wake_ent(id);
            assigned = true;
        }
        if assigned {
            q.notify_cv(&self.cvs[qi]);
        }
    }

    pub(crate) fn prefer(&self, qid: u16, h: Option<EntHandle>) -> Result<(), Errno> {
        let qi = self.qidx(qid)?;
        let mut q = lk(&self.queues[qi]);
        if h.is_some_and(|h| h.qid != qid || h.ent as usize >= q.ents.len()) {
            return Err(Errno::EINVAL);
        }
        q.preferring = h.is_some();
        if let Some(e) = h.and_then(|h| q.ents.get_mut(h.ent as usize)) {
            e.reserved = true;
        }
        if q.preferring {
            // Requests already waiting may go to the owner's entries now.
            self.dispatch(&mut q, qi);
        }
        Ok(())
    }

    fn max_background(&self) -> u32 {
        self.core
            .upgrade()
            .map_or(u32::MAX, |c| c.max_background_now())
    }

    /// Moves background requests to the queue while under the limit; each
    /// queue may always run one (the ring's exception to max_background).
    fn flush_bg(&self, q: &mut Queue) {
        let max = self.max_background();
        while !q.bg.is_empty() && (self.active_bg.load(Ordering::SeqCst) < max || q.active_bg == 0)
        {
            let Some(req) = q.bg.pop_front() else { break };
            q.active_bg += 1;
            self.active_bg.fetch_add(1, Ordering::SeqCst);
            let _ = req.move_to(Location::Transport);
            req.flags.set(flag::PENDING);
            q.reqs.push_back(req);
        }
    }

    /// Whether `req` hands the client's pages over: READ or WRITE of a file
    /// opened with FOPEN_IO_URING_ZERO_COPY, on a zero-copy queue.
    fn goes_zero_copy(&self, zero_copy_queue: bool, req: &Request) -> bool {
        zero_copy_queue
            && client_mem(req).is_none()
            && matches!(req.args.opcode, Opcode::Read | Opcode::Write)
            && self
                .zc_files
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&read_fh(req))
    }

    pub(crate) fn queue_req(
        &self,
        req: Arc<Request>,
        background: bool,
    ) -> Result<(), Arc<Request>> {
        let qi = usize::from(req.args.qid) % self.queues.len();
        let mut q = lk(&self.queues[qi]);
        if q.stopped || !q.exists {
            return Err(req);
        }
        req.flags.set(flag::URING);
        if background {
            let _ = req.move_to(Location::BgQueue);
            q.bg.push_back(req);
            self.flush_bg(&mut q);
        } else {
            let _ = req.move_to(Location::Transport);
            req.flags.set(flag::PENDING);
            q.reqs.push_back(req);
        }
        self.dispatch(&mut q, qi);
        Ok(())
    }

    /// A flushed background request of queue `qid` ended.
    pub(crate) fn bg_done(&self, qid: u16) {
        let qi = usize::from(qid) % self.queues.len();
        let mut q = lk(&self.queues[qi]);
        q.active_bg = q.active_bg.saturating_sub(1);
        let _ = self
            .active_bg
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1));
        self.flush_bg(&mut q);
        self.dispatch(&mut q, qi);
    }

    /// Re-evaluates every queue's background queue (the limit changed).
    pub(crate) fn flush_all(&self) {
        for (qi, m) in self.queues.iter().enumerate() {
            let mut q = lk(m);
            self.flush_bg(&mut q);
            self.dispatch(&mut q, qi);
        }
    }

    /// Withdraws a request no entry has taken yet (killed requester).
    pub(crate) fn remove_pending(&self, req: &Arc<Request>) -> bool {
        let qi = usize::from(req.args.qid) % self.queues.len();
        let mut q = lk(&self.queues[qi]);
        let before = q.reqs.len();
        q.reqs.retain(|r| !Arc::ptr_eq(r, req));
        let removed = q.reqs.len() != before;
        if removed {
            req.flags.clear(flag::PENDING);
            let _ = req.move_to(Location::Ended);
        }
        removed
    }

    pub(crate) fn head_expired(&self, now: Duration, timeout: Duration) -> bool {
        let old = |r: &Arc<Request>| now.saturating_sub(r.create_time) > timeout;
        self.queues.iter().any(|m| {
            let q = lk(m);
            let ent_old = |l: &VecDeque<u32>| {
                l.front()
                    .and_then(|id| q.ents.get(*id as usize))
                    .and_then(|e| e.req.as_ref())
                    .is_some_and(old)
            };
            q.reqs.front().is_some_and(old)
                || q.bg.front().is_some_and(old)
                || ent_old(&q.lists.fuse_req)
                || ent_old(&q.lists.userspace)
        })
    }

    pub(crate) fn counts(&self) -> (usize, usize) {
        let s = self.stats();
        (s.queued + s.bg_queued, s.in_userspace)
    }

    pub(crate) fn stats(&self) -> RingStats {
        let mut s = RingStats {
            zero_copy: self.zero_copies.load(Ordering::Relaxed),
            ..Default::default()
        };
        for m in &self.queues {
            let q = lk(m);
            s.queued += q.reqs.len();
            s.bg_queued += q.bg.len();
            s.in_userspace += q.lists.userspace.len();
            s.available += q.lists.avail.len();
            s.enobufs += q.enobufs;
        }
        s
    }

    /// Teardown: stop every queue, end queued requests with ECONNABORTED,
    /// complete held commands with ENOTCONN. Requests whose client pages a
    /// server holds end when it gives them back.
    pub(crate) fn abort(&self) {
        let mut to_end = Vec::new();
        for (qi, m) in self.queues.iter().enumerate() {
            let mut q = lk(m);
            q.stopped = true;
            to_end.extend(q.reqs.drain(..));
            to_end.extend(q.bg.drain(..));
            for id in 0..q.ents.len() as u32 {
                let (state, copying) = match q.ents.get(id as usize) {
                    Some(e) => (e.state, e.copying),
                    None => continue,
                };
                match state {
                    EntState::Available | EntState::FuseReq if !copying => {
                        let e = &mut q.ents[id as usize];
                        if let Some(r) = e.req.take() {
                            to_end.push(r);
                        }
                        let b = e.pool_buf.take();
                        e.own_payload = None;
                        q.put_buf(b);
                        let _ = q.mv(id, EntState::Teardown);
                        let _ = q.mv(id, EntState::Released);
                    }
                    EntState::Userspace => {
                        let e = &q.ents[id as usize];
                        if let Some(r) = e.req.clone() {
                            r.flags.set(flag::ABORTED);
                            // A server holding the client's pages, or doing
                            // I/O on the client's memory, gives them back
                            // first (commit or drop); that request ends then.
                            if !e.client_pages && client_mem(&r).is_none() {
                                to_end.push(r);
                            }
                        }
                    }
                    _ => {}
                }
            }
            q.wake_sleepers();
            q.notify_cv(&self.cvs[qi]);
        }
        if let Some(core) = self.core.upgrade() {
            for r in to_end {
                r.set_error(Errno::ECONNABORTED.0);
                core.request_end(&r);
            }
        }
    }

    fn end(&self, req: &Arc<Request>, err: Option<Errno>) {
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

    /// Hands over the request of one of queue `qid`'s reserved entries
    /// that holds one, if any (without blocking).
    fn fetch_own(self: &Arc<Self>, qid: u16) -> Result<Option<Fetched>, Errno> {
        let qi = self.qidx(qid)?;
        let found = {
            let q = lk(&self.queues[qi]);
            if q.stopped {
                return Err(Errno::ENOTCONN);
            }
            q.lists.fuse_req.iter().copied().find(|id| {
                q.ents
                    .get(*id as usize)
                    .is_some_and(|e| e.reserved && !e.copying)
            })
        };
        match found {
            // Only the owner fetches its entries, so it is still there.
            Some(ent) => self.fetch(EntHandle { qid, ent }, false),
            None => Ok(None),
        }
    }

    /// Marks entry `h` reserved (see [`Queue::preferring`]).
    fn reserve(&self, h: EntHandle) -> Result<(), Errno> {
        let qi = self.qidx(h.qid)?;
        let mut q = lk(&self.queues[qi]);
        let e = q.ents.get_mut(h.ent as usize).ok_or(Errno::EINVAL)?;
        e.reserved = true;
        Ok(())
    }

    fn fetch(self: &Arc<Self>, h: EntHandle, block: bool) -> Result<Option<Fetched>, Errno> {
        let qi = self.qidx(h.qid)?;
        loop {
            let mut q = lk(&self.queues[qi]);
            loop {
                let e = q.ents.get(h.ent as usize).ok_or(Errno::EINVAL)?;
                match e.state {
                    EntState::FuseReq if !e.copying => break,
                    EntState::Available | EntState::FuseReq => {
                        if q.stopped && e.state == EntState::Available {
                            let _ = q.mv(h.ent, EntState::Teardown);
                            let _ = q.mv(h.ent, EntState::Released);
                            return Err(Errno::ENOTCONN);
                        }
                        if !block {
                            return Ok(None);
                        }
                        q.cv_waiters += 1;
                        q = self.cvs[qi].wait(q).unwrap_or_else(|e| e.into_inner());
                        q.cv_waiters -= 1;
                    }
                    EntState::Teardown | EntState::Released => return Err(Errno::ENOTCONN),
                    _ => return Err(Errno::EINVAL),
                }
            }
            let zq = q.zero_copy;
            let e = &mut q.ents[h.ent as usize];
            e.copying = true;
            let Some(req) = e.req.clone() else {
                return Err(Errno::EINVAL);
            };
            let mut header = e.header.take().unwrap_or_default();
            let pool_buf = e.pool_buf.take();
            let own = e.own_payload.take();
            let offset = match (&pool_buf, q.pool.as_ref()) {
                (Some(b), Some(p)) => p.offset(b.index),
                _ => 0,
            };
            if pool_buf.is_some() {
                // Lent from here until it is back on an entry or in the pool.
                q.lent += 1;
            }
            req.flags.set(flag::LOCKED);
            drop(q);

            let (payload, sz, zc, err, spare_own, spare_pool) =
                self.copy_in(&req, &mut header, pool_buf, own, zq);
            header.ring_ent_in_out = UringEntInOut {
                flags: if zc { uring::ENT_ZERO_COPY } else { 0 },
                commit_id: req.unique(),
                payload_sz: sz as u32,
                offset,
                reserved: 0,
            };

            let mut q = lk(&self.queues[qi]);
            req.flags.clear(flag::LOCKED);
            q.ents[h.ent as usize].copying = false;
            if spare_own.is_some() {
                q.ents[h.ent as usize].own_payload = spare_own;
            }
            if spare_pool.is_some() {
                q.lent = q.lent.saturating_sub(1);
                q.put_buf(spare_pool);
                // A request may be waiting for exactly this buffer.
                self.dispatch(&mut q, qi);
            }
            // Another thread may wait on this entry (copying is over).
            q.wake_ent(h.ent);
            q.notify_cv(&self.cvs[qi]);
            if q.stopped || req.flags.test(flag::ABORTED) {
                match payload {
                    Payload::Pool(b) => {
                        q.lent = q.lent.saturating_sub(1);
                        q.put_buf(Some(b));
                    }
                    p => self.give_back(&req, p),
                }
                let _ = q.mv(h.ent, EntState::Teardown);
                let _ = q.mv(h.ent, EntState::Released);
                drop(q);
                self.end(&req, Some(Errno::ECONNABORTED));
                return Err(Errno::ENOTCONN);
            }
            if let Some(e) = err {
                // The request does not fit this entry: fail it, keep serving.
                let ent = &mut q.ents[h.ent as usize];
                ent.req = None;
                ent.header = Some(header);
                match payload {
                    Payload::Own(v) => ent.own_payload = Some(v),
                    Payload::Pool(b) => {
                        q.lent = q.lent.saturating_sub(1);
                        q.put_buf(Some(b));
                    }
                    Payload::Client(_) | Payload::None => {}
                }
                let _ = q.mv(h.ent, EntState::Available);
                self.dispatch(&mut q, qi);
                drop(q);
                self.end(&req, Some(e));
                continue;
            }
            q.mv(h.ent, EntState::Userspace)?;
            q.ents[h.ent as usize].client_pages = zc;
            drop(q);
            req.flags.set(flag::SENT);
            if req.flags.test(flag::INTERRUPTED) {
                if let Some(core) = self.core.upgrade() {
                    core.interrupt(&req);
                }
            }
            if zc {
                self.zero_copies.fetch_add(1, Ordering::Relaxed);
            }
            return Ok(Some(Fetched {
                ring: self.clone(),
                handle: h,
                header,
                payload,
                client: client_mem(&req).cloned(),
                done: false,
            }));
        }
    }

    /// A server dropped a [`Fetched`] without committing it.
    /// A server dropped a [`Fetched`] without committing it: its request
    /// fails (EIO, or ECONNABORTED after an abort) and the entry goes back to
    /// Available with its buffers, so the queue keeps its capacity.
    pub(crate) fn abandon(&self, h: EntHandle, header: Box<UringReqHeader>, payload: Payload) {
        let Ok(qi) = self.qidx(h.qid) else { return };
        let mut q = lk(&self.queues[qi]);
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
            let _ = q.mv(h.ent, EntState::Teardown);
            let _ = q.mv(h.ent, EntState::Released);
        } else {
            q.ents[idx].header = Some(header);
            let _ = q.mv(h.ent, EntState::Available);
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

    fn commit(
        self: &Arc<Self>,
        area: &[u8],
        mut f: Fetched,
        fixed: Option<u16>,
    ) -> Result<EntHandle, (Errno, Option<Fetched>)> {
        let Ok(cmd) = Self::cmd(area) else {
            return Err((Errno::EINVAL, Some(f)));
        };
        let h = f.handle;
        if cmd.qid != h.qid {
            return Err((Errno::EINVAL, Some(f)));
        }
        let qi = usize::from(h.qid);
        let mut q = lk(&self.queues[qi]);
        if Self::check_fixed(&q, fixed).is_err() {
            drop(q);
            return Err((Errno::EINVAL, Some(f)));
        }
        let req = match q.ents.get(h.ent as usize) {
            Some(e) if e.state == EntState::Userspace => e.req.clone(),
            _ => None,
        };
        let Some(req) = req else {
            drop(q);
            return Err((Errno::EINVAL, Some(f)));
        };
        if cmd.commit_id != req.unique() {
            drop(q);
            return Err((Errno::EINVAL, Some(f)));
        }
        let _ = q.mv(h.ent, EntState::Commit);
        q.ents[h.ent as usize].client_pages = false;
        let was_pool = matches!(f.payload, Payload::Pool(_));
        let stopped = q.stopped;
        drop(q);
        f.done = true;
        let header = std::mem::take(&mut f.header);
        let payload = std::mem::replace(&mut f.payload, Payload::None);
        drop(f);

        // Copy the result back (no lock held).
        let payload = self.copy_out(&req, &header, payload, stopped);
        self.end(&req, None);

        let mut q = lk(&self.queues[qi]);
        if was_pool {
            q.lent = q.lent.saturating_sub(1);
        }
        let e = &mut q.ents[h.ent as usize];
        e.req = None;
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
            let _ = q.mv(h.ent, EntState::Teardown);
            let _ = q.mv(h.ent, EntState::Released);
            return Err((Errno::ENOTCONN, None));
        }
        q.ents[h.ent as usize].header = Some(header);
        // Fetch in the same call: the next request goes straight to this
        // entry, reusing its pool buffer when it needs one.
        // (A reserved entry never takes a SETLKW: its owner serves in line
        // and must not block; `dispatch` gives it to another entry.)
        let reserved = q.ents[h.ent as usize].reserved;
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
                    let _ = q.mv(h.ent, EntState::Available);
                } else if let Some(r) = q.reqs.pop_front() {
                    let _ = q.mv(h.ent, EntState::FuseReq);
                    let e = &mut q.ents[h.ent as usize];
                    e.req = Some(r);
                    e.pool_buf = buf;
                }
            }
            None => {
                q.put_buf(leftover);
                let _ = q.mv(h.ent, EntState::Available);
            }
        }
        self.dispatch(&mut q, qi);
        Ok(h)
    }

    fn apply(&self, req: &Arc<Request>, result: Result<(), Errno>, reply: &[u8]) {
        match result {
            Err(e) => req.set_error(e.0),
            Ok(()) => {
                req.set_error(0);
                let open_out = match req.args.opcode {
                    Opcode::Open => reply.get(..16),
                    Opcode::Create => reply.get(std::mem::size_of::<EntryOut>()..),
                    _ => None,
                };
                if open_out.is_none() && req.args.opcode != Opcode::Release {
                    // Only OPEN, CREATE and RELEASE change the set.
                    return;
                }
                let mut zc = self.zc_files.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(o) = open_out
                    .and_then(|b| OpenOut::read_from_prefix(b).ok())
                    .map(|(o, _)| o)
                {
                    if o.open_flags & fopen::IO_URING_ZERO_COPY != 0 {
                        zc.insert(o.fh);
                    }
                }
                if req.args.opcode == Opcode::Release {
                    zc.remove(&read_fh(req));
                }
            }
        }
    }
}
