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
mod link;
mod pool;
mod serve;
mod wait;

pub use commands::{bufpool_area, cmd_area, RingEnd};
pub use ent::{EntState, EntryBufs};
pub use fetched::Fetched;
use fetched::Payload;
pub(crate) use link::RingLink;

use crate::abi::{
    self, fopen, op_in_size, uring, DecodeOptions, EntryOut, Opcode, OpenOut, OutHeader,
    UringCmdReq, UringReqHeader,
};
use crate::chan::req::{flag, Location, Request};
use crate::chan::{Core, Errno, InFlight};
use crate::sync::{lock, Arc, AtomicU32, AtomicU64, Condvar, Mutex, Ordering, Weak};
use ent::{Ent, ListId, Lists};
use pool::{Pool, PoolBuf};
use std::collections::{HashSet, VecDeque};
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
        if self.sleepers.is_empty() {
            return;
        }
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

    /// Moves entry `id` along a transition its caller knows is allowed
    /// (it checked the entry's state under this lock, or put it there).
    /// A refusal is a bug in the ring: loud in debug builds; a release
    /// build leaves the entry where it is, as it always did.
    fn mv_known(&mut self, id: u32, to: EntState) {
        let moved = self.lists.move_ent(&mut self.ents, id, to);
        debug_assert!(
            moved.is_ok(),
            "ring entry {id}: transition refused (from, to) = {moved:?}"
        );
    }

    /// Takes entry `id` out of service for good (through Teardown, as
    /// every retirement goes).
    fn retire(&mut self, id: u32) {
        self.mv_known(id, EntState::Teardown);
        self.mv_known(id, EntState::Released);
    }

    /// Marks entry `id` reserved (its lists follow).
    fn set_reserved(&mut self, id: u32) {
        self.lists.set_reserved(&mut self.ents, id, true);
    }

    /// A reserved entry of this queue holding a request that nobody is
    /// copying (the oldest).
    fn own_with_request(&self) -> Option<u32> {
        self.lists
            .iter(&self.ents, ListId::FuseReqOwn)
            .find(|id| self.ents.get(*id as usize).is_some_and(|e| !e.copying))
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
    /// max_background, the engine's (set under its `bg_lock`), readable
    /// without it.
    max_bg: AtomicU32,
    active_bg: AtomicU32,
    zc_files: Mutex<HashSet<u64>>,
    zero_copies: AtomicU64,
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
fn client_mem(req: &Request) -> Option<&Arc<dyn crate::chan::ClientMem>> {
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
        max_background: u32,
    ) -> Ring {
        let n = usize::from(nr_queues.max(1));
        Ring {
            core,
            max_payload,
            opts,
            queues: (0..n).map(|_| Mutex::new(Queue::new())).collect(),
            cvs: (0..n).map(|_| Condvar::new()).collect(),
            max_bg: AtomicU32::new(max_background),
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
            let own = (q.preferring && req.args.opcode != Opcode::Setlkw)
                .then(|| q.lists.front(ListId::AvailOwn))
                .flatten();
            let Some(id) = own.or_else(|| q.lists.front(ListId::Avail)) else {
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
        let mut q = lock(&self.queues[qi]);
        if h.is_some_and(|h| h.qid != qid || h.ent as usize >= q.ents.len()) {
            return Err(Errno::EINVAL);
        }
        q.preferring = h.is_some();
        if let Some(h) = h {
            q.set_reserved(h.ent);
        }
        if q.preferring {
            // Requests already waiting may go to the owner's entries now.
            self.dispatch(&mut q, qi);
        }
        Ok(())
    }

    /// Stops queue `qid` preferring its reserved entries (as
    /// `prefer(qid, None)`); says, under the same acquisition of its lock,
    /// whether one of them holds a request its owner has not fetched.
    pub(crate) fn unprefer(&self, qid: u16) -> Result<bool, Errno> {
        let qi = self.qidx(qid)?;
        let mut q = lock(&self.queues[qi]);
        q.preferring = false;
        Ok(q.own_with_request().is_some())
    }

    fn max_background(&self) -> u32 {
        self.max_bg.load(Ordering::SeqCst)
    }

    /// The engine's max_background changed (see [`Ring::flush_all`]).
    pub(crate) fn set_max_background(&self, max: u32) {
        self.max_bg.store(max, Ordering::SeqCst);
    }

    /// Moves background requests to the queue while under the limit
    /// (`max`, max_background); each queue may always run one (the ring's
    /// exception to max_background).
    fn flush_bg(&self, q: &mut Queue, max: u32) {
        while !q.bg.is_empty() && self.may_activate(q, max) {
            let Some(req) = q.bg.pop_front() else { break };
            self.activate(q, req, 0);
        }
    }

    /// Whether queue `q` may make one more background request active.
    fn may_activate(&self, q: &Queue, max: u32) -> bool {
        self.active_bg.load(Ordering::SeqCst) < max || q.active_bg == 0
    }

    /// Makes a background request active: it waits for an entry now (its
    /// flags get PENDING and `flags`, in one go).
    fn activate(&self, q: &mut Queue, req: Arc<Request>, flags: u32) {
        q.active_bg += 1;
        self.active_bg.fetch_add(1, Ordering::SeqCst);
        let _ = req.move_to(Location::Transport);
        req.flags.set(flag::PENDING | flags);
        q.reqs.push_back(req);
    }

    /// Whether `req` hands the client's pages over: READ or WRITE of a file
    /// opened with FOPEN_IO_URING_ZERO_COPY, on a zero-copy queue.
    fn goes_zero_copy(&self, zero_copy_queue: bool, req: &Request) -> bool {
        zero_copy_queue
            && client_mem(req).is_none()
            && matches!(req.args.opcode, Opcode::Read | Opcode::Write)
            && lock(&self.zc_files).contains(&read_fh(req))
    }

    /// Queues `reqs` (in order) on the ring queues they name, taking each
    /// queue's lock once per run of requests for it; a request whose
    /// queue is stopped or missing is put on `refused` (its caller ends
    /// it, with no queue lock held).
    pub(crate) fn queue_reqs(
        &self,
        reqs: impl IntoIterator<Item = Arc<Request>>,
        background: bool,
        refused: &mut Vec<InFlight>,
    ) {
        let max = if background {
            self.max_background()
        } else {
            u32::MAX
        };
        let nq = self.queues.len();
        let qi_of = |r: &Arc<Request>| usize::from(r.args.qid) % nq;
        let mut reqs = reqs.into_iter().peekable();
        while let Some(first) = reqs.next() {
            let qi = qi_of(&first);
            let mut q = lock(&self.queues[qi]);
            let open = !q.stopped && q.exists;
            let mut next = Some(first);
            while let Some(req) = next {
                if !open {
                    refused.push(InFlight(req));
                } else if background {
                    if q.bg.is_empty() && self.may_activate(&q, max) {
                        // What queueing and flushing at once would do.
                        self.activate(&mut q, req, flag::URING);
                    } else {
                        req.flags.set(flag::URING);
                        let _ = req.move_to(Location::BgQueue);
                        q.bg.push_back(req);
                    }
                } else {
                    req.flags.set(flag::URING | flag::PENDING);
                    let _ = req.move_to(Location::Transport);
                    q.reqs.push_back(req);
                }
                next = reqs.next_if(|r| qi_of(r) == qi);
            }
            if open {
                if background {
                    self.flush_bg(&mut q, max);
                }
                self.dispatch(&mut q, qi);
            }
        }
    }

    pub(crate) fn queue_req(
        &self,
        req: Arc<Request>,
        background: bool,
    ) -> Result<(), Arc<Request>> {
        let mut refused = Vec::new();
        self.queue_reqs(std::iter::once(req), background, &mut refused);
        match refused.pop() {
            Some(InFlight(r)) => Err(r),
            None => Ok(()),
        }
    }

    /// `n` flushed background requests of queue `qid` ended.
    pub(crate) fn bg_done(&self, qid: u16, n: u32) {
        let max = self.max_background();
        let qi = usize::from(qid) % self.queues.len();
        let mut q = lock(&self.queues[qi]);
        q.active_bg = q.active_bg.saturating_sub(n);
        let _ = self
            .active_bg
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                Some(v.saturating_sub(n))
            });
        self.flush_bg(&mut q, max);
        self.dispatch(&mut q, qi);
    }

    /// Re-evaluates every queue's background queue (the limit changed).
    pub(crate) fn flush_all(&self) {
        let max = self.max_background();
        for (qi, m) in self.queues.iter().enumerate() {
            let mut q = lock(m);
            self.flush_bg(&mut q, max);
            self.dispatch(&mut q, qi);
        }
    }

    /// Withdraws a request no entry has taken yet (killed requester).
    pub(crate) fn remove_pending(&self, req: &Arc<Request>) -> bool {
        let qi = usize::from(req.args.qid) % self.queues.len();
        let mut q = lock(&self.queues[qi]);
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
            let q = lock(m);
            let ent_old = |l: ListId| {
                q.lists
                    .front(l)
                    .and_then(|id| q.ents.get(id as usize))
                    .and_then(|e| e.req.as_ref())
                    .is_some_and(old)
            };
            q.reqs.front().is_some_and(old)
                || q.bg.front().is_some_and(old)
                || ent_old(ListId::FuseReq)
                || ent_old(ListId::FuseReqOwn)
                || ent_old(ListId::Userspace)
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
            let q = lock(m);
            s.queued += q.reqs.len();
            s.bg_queued += q.bg.len();
            s.in_userspace += q.lists.count_state(EntState::Userspace);
            s.available += q.lists.count_state(EntState::Available);
            s.enobufs += q.enobufs;
        }
        s
    }

    /// Teardown: stop every queue, complete held commands with ENOTCONN,
    /// and return the requests the aborter ends (the engine, with
    /// ECONNABORTED): those queued and those of entries a server holds.
    /// Requests whose client pages a server holds end when it gives them
    /// back.
    pub(crate) fn abort(&self) -> Vec<Arc<Request>> {
        let mut to_end = Vec::new();
        for (qi, m) in self.queues.iter().enumerate() {
            let mut q = lock(m);
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
                        q.retire(id);
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
        to_end
    }

    /// Records what a successful reply says about zero-copy files: OPEN
    /// and CREATE replies with FOPEN_IO_URING_ZERO_COPY add their handle,
    /// RELEASE removes it. (The result itself is stored by the caller.)
    fn note_zero_copy(&self, req: &Arc<Request>, reply: &[u8]) {
        let open_out = match req.args.opcode {
            Opcode::Open => reply.get(..16),
            Opcode::Create => reply.get(std::mem::size_of::<EntryOut>()..),
            _ => None,
        };
        if open_out.is_none() && req.args.opcode != Opcode::Release {
            // Only OPEN, CREATE and RELEASE change the set.
            return;
        }
        let mut zc = lock(&self.zc_files);
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
