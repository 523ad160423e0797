//! The in-process equivalent of `/dev/fuse`: the input queue (pending,
//! interrupts, forgets), the processing queue, and the server-side
//! [`Device`] handle that reads requests and writes replies.
//!
//! Locks: `iq` (the kernel's `fiq->lock`) and `pq` (`fpq->lock`) are never
//! held together. A request's `data` lock may be taken under `pq`.

use super::errno::Errno;
use super::fence::Fence;
use super::req::{flag, Location, Request};
use super::transport::{InFlight, Transport};
use super::{Chan, Core, Negotiated};
use crate::abi::{
    self, BatchForgetIn, ForgetIn, ForgetOne, InHeader, InterruptIn, Opcode, OutHeader,
};
use crate::fasthash::IdMap;
use crate::sync::{lock, wait, Arc, AtomicU32, Condvar, Mutex, Ordering};
use std::collections::VecDeque;
use std::time::Duration;
use zerocopy::IntoBytes;

/// How many forgets may be read in a row while requests are pending.
const FORGET_BATCH: i32 = 16;

/// The input queue, guarded by `DevQueue::iq`.
#[derive(Debug)]
struct IQueue {
    connected: bool,
    pending: VecDeque<Arc<Request>>,
    interrupts: VecDeque<Arc<Request>>,
    forgets: VecDeque<ForgetOne>,
    forget_batch: i32,
}

impl IQueue {
    fn has_work(&self) -> bool {
        !self.pending.is_empty() || !self.interrupts.is_empty() || !self.forgets.is_empty()
    }
}

/// The processing queue, guarded by `DevQueue::pq`.
#[derive(Debug, Default)]
struct PQueue {
    connected: bool,
    /// Requests read by the server, by unique.
    processing: IdMap<u64, Arc<Request>>,
    /// Send order of `processing` (may hold stale uniques; compacted lazily).
    order: VecDeque<u64>,
    /// Requests whose data is being copied.
    io: Vec<Arc<Request>>,
}

impl PQueue {
    fn insert(&mut self, req: Arc<Request>) {
        let u = req.unique();
        self.order.push_back(u);
        self.processing.insert(u, req);
        if self.order.len() > 2 * self.processing.len() + 64 {
            let live = &self.processing;
            self.order.retain(|u| live.contains_key(u));
        }
    }

    fn head(&mut self) -> Option<&Arc<Request>> {
        while let Some(u) = self.order.front() {
            if self.processing.contains_key(u) {
                return self.processing.get(u);
            }
            self.order.pop_front();
        }
        None
    }

    fn take_io(&mut self, req: &Arc<Request>) {
        self.io.retain(|r| !Arc::ptr_eq(r, req));
    }

    fn drain_in_order(&mut self) -> Vec<Arc<Request>> {
        let mut out = Vec::with_capacity(self.processing.len());
        for u in self.order.drain(..) {
            if let Some(r) = self.processing.remove(&u) {
                out.push(r);
            }
        }
        out.extend(self.processing.drain().map(|(_, r)| r));
        out
    }
}

/// The device transport.
#[derive(Debug)]
pub(crate) struct DevQueue {
    iq: Mutex<IQueue>,
    /// Readers park here (the kernel's `fiq->waitq`).
    iq_cv: Condvar,
    pq: Mutex<PQueue>,
    /// Negotiated minor version (BATCH_FORGET needs 7.16).
    pub minor: AtomicU32,
    /// Negotiated max_write (sizes the minimum read buffer).
    pub max_write: AtomicU32,
}

impl DevQueue {
    pub(crate) fn new() -> Self {
        DevQueue {
            iq: Mutex::new(IQueue {
                connected: true,
                pending: VecDeque::new(),
                interrupts: VecDeque::new(),
                forgets: VecDeque::new(),
                forget_batch: FORGET_BATCH,
            }),
            iq_cv: Condvar::new(),
            pq: Mutex::new(PQueue {
                connected: true,
                ..Default::default()
            }),
            minor: AtomicU32::new(abi::KERNEL_MINOR_VERSION),
            max_write: AtomicU32::new(4096),
        }
    }

    fn min_read_buffer(&self) -> usize {
        let w = self.max_write.load(Ordering::Relaxed) as usize;
        abi::MIN_READ_BUFFER.max(2 * std::mem::size_of::<InHeader>() + w)
    }

    /// Reads the next message into `buf` (kernel `fuse_dev_do_read`); the
    /// request's fence, if it has one, goes to `fence`. A request whose
    /// fence is closed is ended (EINTR) instead of being read.
    pub(crate) fn read(
        &self,
        core: &Core,
        buf: &mut [u8],
        block: bool,
        fence: &mut Option<Arc<Fence>>,
    ) -> Result<usize, Errno> {
        if buf.len() < self.min_read_buffer() {
            return Err(Errno::EINVAL);
        }
        loop {
            let mut iq = lock(&self.iq);
            loop {
                if !iq.connected {
                    return Err(core.dev_abort_errno());
                }
                if iq.has_work() {
                    break;
                }
                if !block {
                    return Err(Errno::EAGAIN);
                }
                iq = wait(&self.iq_cv, iq);
            }
            if let Some(req) = iq.interrupts.pop_front() {
                req.intr_queued.store(false, Ordering::SeqCst);
                drop(iq);
                return Ok(write_interrupt(&req, buf));
            }
            if !iq.forgets.is_empty() {
                let take_forget = iq.pending.is_empty() || {
                    let b = iq.forget_batch;
                    iq.forget_batch -= 1;
                    b > 0
                };
                if take_forget {
                    return Ok(self.read_forgets(core, iq, buf));
                }
                if iq.forget_batch <= -8 {
                    iq.forget_batch = FORGET_BATCH;
                }
            }
            let Some(req) = iq.pending.pop_front() else {
                continue;
            };
            req.flags.clear(flag::PENDING);
            drop(iq);

            if req.args.fence.as_ref().is_some_and(|f| f.is_closed())
                && !super::runs_when_given_up(req.args.opcode)
            {
                // Given up by its client: it must not reach the server.
                req.set_error(Errno::EINTR.0);
                core.request_end(&req);
                continue;
            }
            let n = req.wire_len();
            if n > buf.len() {
                // Too large for the server's buffer: fail it and read again.
                let e = if req.args.opcode == Opcode::Setxattr {
                    Errno::E2BIG
                } else {
                    Errno::EIO
                };
                req.set_error(e.0);
                core.request_end(&req);
                continue;
            }
            let mut pq = lock(&self.pq);
            if !pq.connected {
                drop(pq);
                req.set_error(core.abort_errno().0);
                core.request_end(&req);
                return Err(core.dev_abort_errno());
            }
            let _ = req.move_to(Location::Io);
            req.flags.set(flag::LOCKED);
            pq.io.push(req.clone());
            drop(pq);

            // Copy with no lock held: the aborter leaves LOCKED requests alone.
            let h = req.in_header();
            let hl = std::mem::size_of::<InHeader>();
            buf[..hl].copy_from_slice(h.as_bytes());
            let bl = hl + req.args.body.len();
            buf[hl..bl].copy_from_slice(&req.args.body);
            {
                let d = lock(&req.data);
                let pl = d.pages.len().min(n - bl);
                buf[bl..bl + pl].copy_from_slice(&d.pages[..pl]);
            }
            // A WRITE whose data is the client's memory: this transport
            // has no way to pass it by reference, so it is copied here.
            let mut copy_err = None;
            if let (Some(c), Opcode::Write) = (&req.args.client, req.args.opcode) {
                if let Err(e) = c.read_at(0, &mut buf[bl..n]) {
                    copy_err = Some(e);
                }
            }

            let mut pq = lock(&self.pq);
            req.flags.clear(flag::LOCKED);
            pq.take_io(&req);
            if !pq.connected {
                drop(pq);
                core.request_end(&req);
                return Err(core.dev_abort_errno());
            }
            if let Some(e) = copy_err {
                drop(pq);
                req.set_error(e.0);
                core.request_end(&req);
                continue;
            }
            if !req.flags.test(flag::ISREPLY) {
                drop(pq);
                core.request_end(&req);
                return Ok(n);
            }
            let _ = req.move_to(Location::Processing);
            req.flags.set(flag::SENT);
            pq.insert(req.clone());
            drop(pq);
            if req.flags.test(flag::INTERRUPTED) {
                self.queue_interrupt(&req);
            }
            fence.clone_from(&req.args.fence);
            return Ok(n);
        }
    }

    fn read_forgets(
        &self,
        core: &Core,
        mut iq: crate::sync::MutexGuard<'_, IQueue>,
        buf: &mut [u8],
    ) -> usize {
        let hl = std::mem::size_of::<InHeader>();
        let minor = self.minor.load(Ordering::Relaxed);
        let batch_room = buf
            .len()
            .saturating_sub(hl + std::mem::size_of::<BatchForgetIn>())
            / std::mem::size_of::<ForgetOne>();
        let unique = core.next_unique();
        if minor < 16 || batch_room < 2 || iq.forgets.len() == 1 {
            let Some(f) = iq.forgets.pop_front() else {
                return 0;
            };
            drop(iq);
            let body = ForgetIn { nlookup: f.nlookup };
            let h = header(
                Opcode::Forget,
                unique,
                f.nodeid,
                std::mem::size_of::<ForgetIn>(),
            );
            return put(buf, &[h.as_bytes(), body.as_bytes()]);
        }
        let count = batch_room.min(iq.forgets.len());
        let list: Vec<ForgetOne> = iq.forgets.drain(..count).collect();
        drop(iq);
        let bf = BatchForgetIn {
            count: count as u32,
            dummy: 0,
        };
        let body_len = std::mem::size_of::<BatchForgetIn>() + count * 16;
        let h = header(Opcode::BatchForget, unique, 0, body_len);
        put(buf, &[h.as_bytes(), bf.as_bytes(), list.as_bytes()])
    }

    /// Handles one reply or notification (kernel `fuse_dev_do_write`).
    /// `fill` copies the payload into the request's output buffer.
    pub(crate) fn write_with(
        &self,
        core: &Core,
        oh: OutHeader,
        payload_len: usize,
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> Result<usize, Errno> {
        let total = std::mem::size_of::<OutHeader>() + payload_len;
        if oh.len as usize != total {
            return Err(Errno::EINVAL);
        }
        if oh.unique == 0 {
            // A notification: `error` carries the notification code.
            let mut body = vec![0u8; payload_len];
            fill(&mut body);
            return core.notify(oh.error, &body).map(|()| total);
        }
        if oh.error <= -512 || oh.error > 0 {
            return Err(Errno::EINVAL);
        }
        let mut pq = lock(&self.pq);
        let found = if pq.connected {
            pq.processing.get(&(oh.unique & !abi::INT_REQ_BIT)).cloned()
        } else {
            None
        };
        let Some(req) = found else {
            return Err(Errno::ENOENT);
        };

        if oh.unique & abi::INT_REQ_BIT != 0 {
            drop(pq);
            if payload_len != 0 {
                return Err(Errno::EINVAL);
            }
            if oh.error == Errno::ENOSYS.to_wire() {
                core.set_no_interrupt();
            } else if oh.error == Errno::EAGAIN.to_wire() {
                self.queue_interrupt(&req);
            }
            return Ok(total);
        }

        pq.processing.remove(&req.unique());
        req.flags.clear(flag::SENT);
        let _ = req.move_to(Location::Io);
        req.flags.set(flag::LOCKED);
        pq.io.push(req.clone());
        drop(pq);

        // Copy the payload straight into the request's buffer. The buffer is
        // moved out to this writer for the duration: nobody can free or
        // reuse it until it is put back below.
        let mut err = None;
        let mut out = std::mem::take(&mut lock(&req.data).out);
        if oh.error != 0 {
            if payload_len != 0 {
                err = Some(Errno::EINVAL);
            }
        } else if payload_len > req.args.out_size
            || (payload_len < req.args.out_size && !req.args.out_var)
        {
            err = Some(Errno::EINVAL);
        } else {
            out.clear();
            out.resize(payload_len, 0);
            let filled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fill(&mut out)));
            if let Err(payload) = filled {
                // The server's copy panicked: end the request with EIO so
                // its requester is not stranded, then let the panic go on.
                self.finish_write(core, &req, out, Some(Errno::EIO), &oh);
                std::panic::resume_unwind(payload);
            }
            // A READ into the client's memory: the reply lands there.
            if let (Some(c), Opcode::Read) = (&req.args.client, req.args.opcode) {
                if c.write_at(0, &out).is_err() {
                    err = Some(Errno::EIO);
                } else {
                    lock(&req.data).in_client = out.len();
                    out.clear();
                }
            }
        }

        let connected = self.finish_write(core, &req, out, err, &oh);
        if !connected {
            return Err(Errno::ENOENT);
        }
        match err {
            Some(e) => Err(e),
            None => Ok(total),
        }
    }

    /// Ends a reply copy: puts the buffer back, records the result and
    /// ends the request. Returns whether the connection was still up.
    fn finish_write(
        &self,
        core: &Core,
        req: &Arc<Request>,
        out: Vec<u8>,
        err: Option<Errno>,
        oh: &OutHeader,
    ) -> bool {
        let mut pq = lock(&self.pq);
        req.flags.clear(flag::LOCKED);
        pq.take_io(req);
        let connected = pq.connected;
        {
            let mut d = lock(&req.data);
            d.out = out;
            if !connected {
                // The aborter marked it ABORTED and set the error.
            } else if err.is_some() {
                d.error = Errno::EIO.0;
            } else {
                d.error = -oh.error;
            }
        }
        drop(pq);
        core.request_end(req);
        connected
    }

    /// Queues an interrupt (kernel `queue_interrupt`, with the resend fix:
    /// SENT is re-checked under the iq lock).
    fn queue_interrupt(&self, req: &Arc<Request>) -> bool {
        let mut iq = lock(&self.iq);
        if !req.flags.test(flag::INTERRUPTED) || !req.flags.test(flag::SENT) || !iq.connected {
            return false;
        }
        if !req.intr_queued.load(Ordering::SeqCst) {
            req.intr_queued.store(true, Ordering::SeqCst);
            iq.interrupts.push_back(req.clone());
            if req.flags.test(flag::FINISHED) {
                iq.interrupts.retain(|r| !Arc::ptr_eq(r, req));
                req.intr_queued.store(false, Ordering::SeqCst);
                return false;
            }
            self.iq_cv.notify_one();
        }
        true
    }

    /// Number of queued interrupts (for tests and stats).
    #[cfg(feature = "test-utils")]
    pub(crate) fn queued_interrupts(&self) -> Vec<u64> {
        lock(&self.iq)
            .interrupts
            .iter()
            .map(|r| r.unique())
            .collect()
    }

    /// Number of queued forgets.
    #[cfg(feature = "test-utils")]
    pub(crate) fn queued_forgets(&self) -> usize {
        lock(&self.iq).forgets.len()
    }
}

fn header(opcode: Opcode, unique: u64, nodeid: u64, body_len: usize) -> InHeader {
    InHeader {
        len: (std::mem::size_of::<InHeader>() + body_len) as u32,
        opcode: opcode as u32,
        unique,
        nodeid,
        ..Default::default()
    }
}

fn put(buf: &mut [u8], parts: &[&[u8]]) -> usize {
    let mut n = 0;
    for p in parts {
        buf[n..n + p.len()].copy_from_slice(p);
        n += p.len();
    }
    n
}

fn write_interrupt(req: &Request, buf: &mut [u8]) -> usize {
    let body = InterruptIn {
        unique: req.unique(),
    };
    let h = header(
        Opcode::Interrupt,
        req.unique() | abi::INT_REQ_BIT,
        0,
        std::mem::size_of::<InterruptIn>(),
    );
    put(buf, &[h.as_bytes(), body.as_bytes()])
}

impl Transport for DevQueue {
    fn send_req(&self, req: InFlight) -> Result<(), InFlight> {
        let mut iq = lock(&self.iq);
        if !iq.connected {
            return Err(req);
        }
        req.0.flags.set(flag::PENDING);
        let _ = req.0.move_to(Location::Pending);
        iq.pending.push_back(req.0);
        self.iq_cv.notify_one();
        Ok(())
    }

    fn send_forget(&self, forget: ForgetOne) {
        self.send_forgets(&[forget]);
    }

    fn send_forgets(&self, forgets: &[ForgetOne]) {
        let mut iq = lock(&self.iq);
        if iq.connected && !forgets.is_empty() {
            iq.forgets.extend(forgets.iter().copied());
            self.iq_cv.notify_one();
        }
    }

    fn send_interrupt(&self, req: &InFlight) -> bool {
        self.queue_interrupt(&req.0)
    }

    fn drop_interrupt(&self, req: &InFlight) {
        let mut iq = lock(&self.iq);
        if req.0.intr_queued.swap(false, Ordering::SeqCst) {
            iq.interrupts.retain(|r| !Arc::ptr_eq(r, &req.0));
        }
    }

    fn remove_pending(&self, req: &InFlight) -> bool {
        let mut iq = lock(&self.iq);
        if !req.0.flags.test(flag::PENDING) {
            return false;
        }
        iq.pending.retain(|r| !Arc::ptr_eq(r, &req.0));
        req.0.flags.clear(flag::PENDING);
        let _ = req.0.move_to(Location::Ended);
        true
    }

    fn abort(&self, err: Errno) -> Vec<InFlight> {
        let mut to_end = Vec::new();
        {
            let mut pq = lock(&self.pq);
            pq.connected = false;
            for req in &pq.io {
                req.flags.set(flag::ABORTED);
                req.set_error(err.0);
                if !req.flags.test(flag::LOCKED) {
                    req.flags.set(flag::PRIVATE);
                    to_end.push(req.clone());
                }
            }
            let io_keep: Vec<_> = pq
                .io
                .iter()
                .filter(|r| r.flags.test(flag::LOCKED))
                .cloned()
                .collect();
            pq.io = io_keep;
            for req in pq.drain_in_order() {
                req.flags.clear(flag::SENT);
                to_end.push(req);
            }
        }
        {
            let mut iq = lock(&self.iq);
            iq.connected = false;
            for req in iq.pending.drain(..) {
                req.flags.clear(flag::PENDING);
                to_end.push(req);
            }
            for req in iq.interrupts.drain(..) {
                req.intr_queued.store(false, Ordering::SeqCst);
            }
            iq.forgets.clear();
            self.iq_cv.notify_all();
        }
        to_end.into_iter().map(InFlight).collect()
    }

    fn head_expired(&self, now: Duration, timeout: Duration) -> bool {
        let expired = |r: &Arc<Request>| now.saturating_sub(r.create_time) > timeout;
        if lock(&self.iq).pending.front().is_some_and(expired) {
            return true;
        }
        let mut pq = lock(&self.pq);
        pq.io.first().is_some_and(expired) || pq.head().is_some_and(expired)
    }

    fn resend(&self) {
        let reqs = {
            let mut pq = lock(&self.pq);
            if !pq.connected {
                return;
            }
            let reqs = pq.drain_in_order();
            // SENT is cleared under the pq lock (the resend race fix).
            for r in &reqs {
                r.flags.clear(flag::SENT);
            }
            reqs
        };
        let mut iq = lock(&self.iq);
        if !iq.connected {
            drop(iq);
            for r in reqs {
                if let Some(core) = r.core.upgrade() {
                    r.set_error(core.abort_errno().0);
                    core.request_end(&r);
                }
            }
            return;
        }
        // PENDING is set under the iq lock; interrupts of resent requests are
        // dropped: they are queued again when the request is read again.
        for r in reqs.iter().rev() {
            r.flags.set(flag::PENDING);
            r.unique.fetch_or(abi::UNIQUE_RESEND, Ordering::SeqCst);
            let _ = r.move_to(Location::Pending);
            if r.intr_queued.swap(false, Ordering::SeqCst) {
                iq.interrupts.retain(|x| !Arc::ptr_eq(x, r));
            }
            iq.pending.push_front(r.clone());
        }
        self.iq_cv.notify_all();
    }

    fn forgets_queued(&self) -> usize {
        lock(&self.iq).forgets.len()
    }

    fn negotiated(&self, neg: &Negotiated) -> u16 {
        self.minor.store(neg.minor, Ordering::Relaxed);
        self.max_write.store(neg.max_write, Ordering::Relaxed);
        0
    }

    fn counts(&self) -> (usize, usize) {
        let pending = lock(&self.iq).pending.len();
        let pq = lock(&self.pq);
        (pending, pq.processing.len() + pq.io.len())
    }
}

impl Chan {
    /// The server's end, when the connection uses the in-process device.
    pub fn device(&self) -> Option<Device> {
        let core = self.core();
        core.part::<DevQueue>().map(|dev| Device {
            core: core.clone(),
            dev,
        })
    }
}

/// The server's end of an in-process connection: what `/dev/fuse` is to a
/// kernel mount. Cloneable; all clones share one processing queue.
#[derive(Clone)]
pub struct Device {
    pub(crate) core: Arc<Core>,
    pub(crate) dev: Arc<DevQueue>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").finish_non_exhaustive()
    }
}

impl Device {
    /// Reads the next message, blocking until one is available. Interrupts
    /// come before requests; forgets are batched into BATCH_FORGET when the
    /// protocol allows. Errors: EINVAL (buffer smaller than the minimum),
    /// ENODEV (connection aborted; ECONNABORTED if ABORT_ERROR was
    /// negotiated).
    pub fn read(&self, buf: &mut [u8]) -> Result<usize, Errno> {
        self.dev.read(&self.core, buf, true, &mut None)
    }

    /// [`Device::read`], with the fence of the request read (`Args::fence`)
    /// in `fence` (None for other messages): a server checks it before
    /// each host call that changes something (`Ctx::fence`).
    pub fn read_fenced(
        &self,
        buf: &mut [u8],
        fence: &mut Option<Arc<Fence>>,
    ) -> Result<usize, Errno> {
        *fence = None;
        self.dev.read(&self.core, buf, true, fence)
    }

    /// Like [`Device::read`] but returns EAGAIN instead of blocking.
    pub fn try_read(&self, buf: &mut [u8]) -> Result<usize, Errno> {
        self.dev.read(&self.core, buf, false, &mut None)
    }

    /// Writes one complete reply or notification. Errors as the kernel's:
    /// EINVAL for a malformed message or a payload of the wrong size,
    /// ENOENT for an unknown unique (or one aborted meanwhile).
    pub fn write(&self, msg: &[u8]) -> Result<usize, Errno> {
        let oh = abi::Cursor::new(msg).read::<OutHeader>("fuse_out_header");
        let Ok(oh) = oh else {
            return Err(Errno::EINVAL);
        };
        if oh.len as usize != msg.len() {
            return Err(Errno::EINVAL);
        }
        let payload = &msg[std::mem::size_of::<OutHeader>()..];
        self.dev
            .write_with(&self.core, oh, payload.len(), &mut |dst| {
                dst.copy_from_slice(payload)
            })
    }

    /// Writes a reply whose payload `fill` produces directly into the
    /// request's buffer (`dst.len() == payload_len`). The requester cannot
    /// see the result, and its buffer cannot be released, until `fill`
    /// returns.
    pub fn write_with(
        &self,
        unique: u64,
        error: i32,
        payload_len: usize,
        mut fill: impl FnMut(&mut [u8]),
    ) -> Result<usize, Errno> {
        let oh = OutHeader {
            len: (std::mem::size_of::<OutHeader>() + payload_len) as u32,
            error,
            unique,
        };
        self.dev.write_with(&self.core, oh, payload_len, &mut fill)
    }

    /// Smallest buffer [`Device::read`] accepts.
    pub fn min_read_buffer(&self) -> usize {
        self.dev.min_read_buffer()
    }

    /// Uniques of the interrupts currently queued (diagnostics and tests).
    #[cfg(feature = "test-utils")]
    pub fn queued_interrupts(&self) -> Vec<u64> {
        self.dev.queued_interrupts()
    }

    /// Number of forgets currently queued.
    #[cfg(feature = "test-utils")]
    pub fn queued_forgets(&self) -> usize {
        self.dev.queued_forgets()
    }
}
