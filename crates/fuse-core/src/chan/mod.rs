//! The connection engine: a userspace model of the kernel's `fuse_conn`
//! ("fuse_chan") with admission, background queueing, interrupts, abort,
//! INIT gating and request timeouts.
//!
//! Lock order (outer to inner): `bg` (`bg_lock`) → transport locks (`iq`,
//! `pq`) → a request's `data`. The connection lock `conn` comes before
//! `bg` where ring registrations and the admission gate change together
//! (`set_initialized`, `ring_queue_registered`), and is otherwise taken
//! alone; the `waiting` lock is a leaf, and so is `spares`, the ended
//! requests kept for reuse (docs/DESIGN.md has the whole order).

mod bg;
mod call;
mod client_mem;
mod config;
pub(crate) mod dev;
mod end;
mod errno;
mod fence;
mod negotiate;
pub(crate) mod req;
mod send;
mod timeout;
mod transport;

// The module is private: these are re-exported once, at the crate root
// (`fuse_core::Chan`, …), which is their one public path.
pub use call::{Call, Signal};
pub use client_mem::{ClientMap, ClientMem, HostSpan, IoGuard};
pub use config::{ChanConfig, Negotiated, Stats};
pub use dev::Device;
pub use errno::Errno;
pub(crate) use fence::runs_when_given_up;
pub use fence::{Fence, FenceGuard};
pub(crate) use req::flag;
pub use req::{ArgBody, Args, EndFn, ReplyPayload, ReqResult, RequestEnd};
pub use send::TrySendError;
pub use timeout::{Clock, ManualClock, MonotonicClock};
pub use transport::{InFlight, Transport};

use crate::abi::{self, ForgetOne};
use crate::sync::{lock, wait, Arc, AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, Ordering};
use bg::{BgState, WaitSlot, WakeBudget};
use call::SigState;
use req::Request;
use std::any::Any;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Connected,
    Aborting,
    Aborted,
}

/// Guarded by `Core::conn` (the kernel's `fc->lock`).
#[derive(Debug)]
struct ConnState {
    phase: Phase,
    negotiated: Option<Negotiated>,
    /// Which queues of the ring (the transport offered beside the device)
    /// have an entry; sized while processing INIT.
    ring_registered: Vec<bool>,
}

/// The shared connection state.
pub(crate) struct Core {
    cfg: ChanConfig,
    clock: Arc<dyn Clock>,
    conn: Mutex<ConnState>,
    conn_cv: Condvar,
    /// Published with Release after everything INIT set; read with Acquire.
    initialized: AtomicBool,
    /// Admission gate (initialized and ring ready), same publication rules.
    gate_open: AtomicBool,
    connected: AtomicBool,
    /// `bg_lock`.
    bg: Mutex<BgState>,
    num_waiting: AtomicUsize,
    /// Threads asleep in `wait_aborted` (a notify with none costs a
    /// syscall per request at depth 1).
    waiting_mx: Mutex<usize>,
    waiting_cv: Condvar,
    reqctr: AtomicU64,
    no_interrupt: AtomicBool,
    abort_error: AtomicBool,
    /// Effective request timeout in nanoseconds (0 = off).
    timeout_ns: AtomicU64,
    timeouts_fired: AtomicU64,
    aborts: AtomicU64,
    notifications: AtomicU64,
    legacy_single_wake: AtomicBool,
    /// The transport that carries everything until the ring is up, and
    /// interrupts, forgets and `over_device` requests always (the device).
    transport: Arc<dyn Transport>,
    /// The transport offered beside it with FUSE_OVER_IO_URING (the ring).
    ring_offer: Option<Arc<dyn Transport>>,
    /// `ring_offer`, once INIT accepted it (set before `initialized` is
    /// published); it carries requests once the gate opens (`route`).
    ring: std::sync::OnceLock<Arc<dyn Transport>>,
    /// The transports' own objects, for the server ends to find again by
    /// type (`Chan::device`, `Chan::ring_end`, in the transports' modules):
    /// the engine itself knows them only as [`Transport`]s.
    parts: Vec<Arc<dyn Any + Send + Sync>>,
    scan: Arc<timeout::ScanCtl>,
    /// Ended requests nobody holds, kept for background sends to reuse
    /// (`Request::recycle`, `Request::renew`): the allocation per request
    /// a send would otherwise make and free. At most [`SPARES`]. With them
    /// the vector a batch send builds its requests in. A leaf lock.
    spares: Mutex<send::Spares>,
}

impl Core {
    fn budget(&self) -> WakeBudget {
        if self.legacy_single_wake.load(Ordering::Relaxed) {
            WakeBudget::One
        } else {
            WakeBudget::PerFreeSlot
        }
    }

    pub(crate) fn next_unique(&self) -> u64 {
        // Even ids; `unique | 1` names an interrupt.
        self.reqctr.fetch_add(2, Ordering::Relaxed) + 2
    }

    pub(crate) fn abort_errno(&self) -> Errno {
        Errno::ENOTCONN
    }

    pub(crate) fn dev_abort_errno(&self) -> Errno {
        if self.abort_error.load(Ordering::Relaxed) {
            Errno::ECONNABORTED
        } else {
            Errno::ENODEV
        }
    }

    pub(crate) fn is_connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst)
    }

    /// The object of type `T` the connection was assembled with, if any
    /// (a transport's module finding its own; see `Core::parts`).
    pub(crate) fn part<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.parts
            .iter()
            .find_map(|p| p.clone().downcast::<T>().ok())
    }

    /// [`Core::part`] without taking a reference (the per-command path).
    pub(crate) fn part_ref<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.parts.iter().find_map(|p| (**p).downcast_ref::<T>())
    }

    /// The ring, once it carries requests (INIT done, every queue ready).
    fn route(&self) -> Option<&Arc<dyn Transport>> {
        if self.gate_open.load(Ordering::Acquire) {
            self.ring.get()
        } else {
            None
        }
    }

    /// Queues FUSE_INTERRUPT for a SENT request (over the device, also for
    /// ring requests, as the kernel does).
    pub(crate) fn interrupt(&self, req: &Arc<Request>) {
        self.transport.send_interrupt(&InFlight(req.clone()));
    }

    /// Sends a synchronous request to the ring when it is up (unless it
    /// asks for the device), else to the transport; hands it back if
    /// refused.
    pub(crate) fn send_req(&self, req: Arc<Request>) -> Result<(), Arc<Request>> {
        match self.route().filter(|_| !req.args.over_device) {
            Some(ring) => ring.send_req(InFlight(req)).map_err(|f| f.0),
            None => self.transport.send_req(InFlight(req)).map_err(|f| f.0),
        }
    }

    /// Withdraws a request the server has not seen.
    pub(crate) fn remove_pending(&self, req: &Arc<Request>) -> bool {
        let t = if req.flags.test(flag::URING) {
            self.ring.get()
        } else {
            Some(&self.transport)
        };
        t.is_some_and(|t| t.remove_pending(&InFlight(req.clone())))
    }

    /// Records that ring queue `qid` has an entry; opens admission when
    /// every queue has one. Returns whether the ring is ready.
    pub(crate) fn ring_queue_registered(&self, qid: u16) -> bool {
        let mut c = lock(&self.conn);
        if let Some(slot) = c.ring_registered.get_mut(usize::from(qid)) {
            *slot = true;
        }
        let all = !c.ring_registered.is_empty() && c.ring_registered.iter().all(|r| *r);
        if all {
            let mut bg = lock(&self.bg);
            if !bg.ring_ready {
                bg.ring_ready = true;
                if bg.initialized {
                    self.gate_open.store(true, Ordering::Release);
                }
                bg.grant(WakeBudget::PerFreeSlot);
            }
        }
        all
    }

    pub(crate) fn set_no_interrupt(&self) {
        self.no_interrupt.store(true, Ordering::SeqCst);
    }

    fn add_waiting(&self) {
        self.num_waiting.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn drop_waiting(&self) {
        self.drop_waiting_n(1);
    }

    fn drop_waiting_n(&self, n: usize) {
        if n > 0 && self.num_waiting.fetch_sub(n, Ordering::SeqCst) == n {
            let g = lock(&self.waiting_mx);
            if *g > 0 {
                self.waiting_cv.notify_all();
            }
        }
    }

    /// Admission (kernel `fuse_get_req`): waits exclusively, in FIFO order,
    /// while not initialized, while the ring is not ready, or (background)
    /// while blocked. Only a kill ends the wait early (EINTR).
    fn get_req(&self, for_background: bool, sig: &Arc<SigState>) -> Result<(), Errno> {
        if !for_background && self.gate_open.load(Ordering::Acquire) {
            return if self.connected.load(Ordering::SeqCst) {
                Ok(())
            } else {
                Err(Errno::ENOTCONN)
            };
        }
        let slot = WaitSlot::new(for_background);
        sig.park_on_slot(slot.clone());
        let mut bg = lock(&self.bg);
        if !bg.connected {
            return Err(Errno::ENOTCONN);
        }
        if bg.try_admit(for_background) {
            return Ok(());
        }
        bg.waiters.push_back(slot.clone());
        loop {
            match slot.state() {
                bg::SlotState::Granted => return Ok(()),
                bg::SlotState::Released => return Err(Errno::ENOTCONN),
                bg::SlotState::Waiting => {}
            }
            if sig.killed() {
                bg.remove_waiter(&slot);
                return Err(Errno::EINTR);
            }
            bg = wait(&slot.cv, bg);
        }
    }

    fn send_to_transport(&self, reqs: Vec<Arc<Request>>) -> Vec<InFlight> {
        let mut refused = Vec::new();
        for r in reqs {
            if let Err(r) = self.transport.send_req(InFlight(r)) {
                refused.push(r);
            }
        }
        refused
    }

    /// Ends the requests a transport refused (none, mostly: checked
    /// before any call).
    #[inline]
    fn end_refused(&self, refused: Vec<InFlight>) {
        if !refused.is_empty() {
            self.end_refused_all(refused);
        }
    }

    fn end_refused_all(&self, refused: Vec<InFlight>) {
        for InFlight(r) in refused {
            r.set_error(self.abort_errno().0);
            self.request_end(&r);
        }
    }

    /// Handles a notification written to the device (unique 0).
    pub(crate) fn notify(&self, code: i32, body: &[u8]) -> Result<(), Errno> {
        use abi::notify as n;
        use std::mem::size_of;
        let need = match code {
            n::POLL => size_of::<abi::NotifyPollWakeupOut>(),
            n::INVAL_INODE => size_of::<abi::NotifyInvalInodeOut>(),
            n::INVAL_ENTRY => size_of::<abi::NotifyInvalEntryOut>(),
            n::STORE => size_of::<abi::NotifyStoreOut>(),
            n::RETRIEVE => size_of::<abi::NotifyRetrieveOut>(),
            n::DELETE => size_of::<abi::NotifyDeleteOut>(),
            n::PRUNE => size_of::<abi::NotifyPruneOut>(),
            n::RESEND | n::INC_EPOCH => 0,
            _ => return Err(Errno::EINVAL),
        };
        if body.len() < need {
            return Err(Errno::EINVAL);
        }
        self.notifications.fetch_add(1, Ordering::Relaxed);
        match code {
            n::RESEND => {
                self.transport.resend();
                Ok(())
            }
            // There is no page cache in the box: nothing to retrieve.
            n::RETRIEVE => Err(Errno::ENOENT),
            _ => Ok(()),
        }
    }

    fn abort(&self) {
        // An end callback run by this abort may abort again (or drop the
        // last Chan): that must not wait for the abort it is part of.
        if ABORTING.with(|a| a.get()) {
            return;
        }
        {
            let mut c = lock(&self.conn);
            match c.phase {
                Phase::Aborted => return,
                Phase::Aborting => {
                    while c.phase != Phase::Aborted {
                        c = wait(&self.conn_cv, c);
                    }
                    return;
                }
                Phase::Connected => c.phase = Phase::Aborting,
            }
        }
        ABORTING.with(|a| a.set(true));
        self.aborts.fetch_add(1, Ordering::Relaxed);
        self.connected.store(false, Ordering::SeqCst);
        // Background first, as the kernel does: stop admission under
        // bg_lock, release parked requesters and flush the queue to the
        // transport, so nothing can be left on the background queue.
        let refused = {
            let mut bg = lock(&self.bg);
            bg.connected = false;
            bg.max_background = u32::MAX;
            bg.initialized = true;
            bg.ring_ready = true;
            bg.release_all();
            let all = bg.flush();
            self.send_to_transport(all)
        };
        self.initialized.store(true, Ordering::Release);
        let mut to_end: Vec<Arc<Request>> = self
            .transport
            .abort(self.abort_errno())
            .into_iter()
            .map(|f| f.0)
            .collect();
        to_end.extend(refused.into_iter().map(|f| f.0));
        for r in &to_end {
            r.set_error(self.abort_errno().0);
        }
        for r in to_end {
            self.request_end(&r);
        }
        if let Some(ring) = self.ring.get() {
            // What the ring held ends with ECONNABORTED, as the kernel's
            // ring teardown (`fuse_uring_abort`) ends it.
            let err = Errno::ECONNABORTED;
            for InFlight(r) in ring.abort(err) {
                r.set_error(err.0);
                self.request_end(&r);
            }
        }
        self.scan.stop();
        ABORTING.with(|a| a.set(false));
        let mut c = lock(&self.conn);
        c.phase = Phase::Aborted;
        self.conn_cv.notify_all();
    }

    fn effective_timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_ns.load(Ordering::Relaxed))
    }

    fn scan_timeouts(&self) -> bool {
        let t = self.effective_timeout();
        if t.is_zero() || self.num_waiting.load(Ordering::SeqCst) == 0 {
            return false;
        }
        if !self.connected.load(Ordering::SeqCst) {
            return false;
        }
        let now = self.clock.now();
        let bg_expired = lock(&self.bg)
            .queue
            .front()
            .is_some_and(|r| now.saturating_sub(r.create_time) > t);
        let ring_expired = self.ring.get().is_some_and(|r| r.head_expired(now, t));
        if bg_expired || ring_expired || self.transport.head_expired(now, t) {
            self.timeouts_fired.fetch_add(1, Ordering::Relaxed);
            self.abort();
            return true;
        }
        false
    }
}

thread_local! {
    /// Set while this thread runs an abort (see `Core::abort`).
    static ABORTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Aborts the connection when the last [`Chan`] handle goes away, as
/// unmounting does.
struct Owner(Arc<Core>);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A request in flight from [`Chan::send_async`].
#[derive(Debug, Clone)]
pub struct Sent {
    req: crate::sync::Weak<Request>,
    unique: u64,
}

impl Sent {
    /// The unique the server sees.
    pub fn unique(&self) -> u64 {
        self.unique
    }

    /// What a signal to a waiting requester does: the request is marked
    /// INTERRUPTED and, once the server has it, FUSE_INTERRUPT is queued
    /// for it (unless the server said it does not take interrupts). A
    /// request that ended already is left alone.
    pub fn interrupt(&self) {
        let Some(req) = self.req.upgrade() else {
            return;
        };
        let Some(core) = req.core.upgrade() else {
            return;
        };
        if req.flags.test(flag::FINISHED) || core.no_interrupt.load(Ordering::SeqCst) {
            return;
        }
        req.flags.set(flag::INTERRUPTED);
        if req.flags.test(flag::SENT) {
            core.interrupt(&req);
        }
    }
}

/// A FUSE connection: the client side of the engine. Cheap to clone.
#[derive(Clone)]
pub struct Chan {
    owner: Arc<Owner>,
}

impl std::fmt::Debug for Chan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chan")
            .field("stats", &self.stats())
            .finish()
    }
}

/// What a connection is assembled from (`crate::assemble`), made once the
/// engine's `Weak` exists (the transports hold one).
pub(crate) struct Transports {
    /// The transport that carries requests from the start.
    pub(crate) device: Arc<dyn Transport>,
    /// A transport offered with FUSE_OVER_IO_URING (see `Core::ring_offer`).
    pub(crate) ring: Option<Arc<dyn Transport>>,
    /// See `Core::parts`.
    pub(crate) parts: Vec<Arc<dyn Any + Send + Sync>>,
}

impl Chan {
    /// Builds the engine over the transports `assemble` makes.
    pub(crate) fn build(
        cfg: ChanConfig,
        clock: Arc<dyn Clock>,
        assemble: impl FnOnce(&crate::sync::Weak<Core>) -> Transports,
    ) -> Chan {
        let bg = BgState::new(cfg.max_background, cfg.congestion_threshold);
        let core = Arc::new_cyclic(|weak| {
            let t = assemble(weak);
            Core {
                cfg,
                clock,
                conn: Mutex::new(ConnState {
                    phase: Phase::Connected,
                    negotiated: None,
                    ring_registered: Vec::new(),
                }),
                conn_cv: Condvar::new(),
                initialized: AtomicBool::new(false),
                gate_open: AtomicBool::new(false),
                connected: AtomicBool::new(true),
                bg: Mutex::new(bg),
                num_waiting: AtomicUsize::new(0),
                waiting_mx: Mutex::new(0),
                waiting_cv: Condvar::new(),
                reqctr: AtomicU64::new(0),
                no_interrupt: AtomicBool::new(false),
                abort_error: AtomicBool::new(false),
                timeout_ns: AtomicU64::new(0),
                timeouts_fired: AtomicU64::new(0),
                aborts: AtomicU64::new(0),
                notifications: AtomicU64::new(0),
                legacy_single_wake: AtomicBool::new(false),
                transport: t.device,
                ring_offer: t.ring,
                ring: std::sync::OnceLock::new(),
                parts: t.parts,
                scan: Arc::new(timeout::ScanCtl::default()),
                spares: Mutex::new(send::Spares::default()),
            }
        });
        Chan {
            owner: Arc::new(Owner(core)),
        }
    }

    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.owner.0
    }

    /// Prepares a synchronous request; [`Call::signal`] gives a handle to
    /// interrupt or kill it, [`Call::wait`] sends it and waits.
    pub fn call(&self, args: Args) -> Call {
        Call::new(self.core().clone(), args)
    }

    /// Sends a synchronous request and waits for its reply.
    pub fn send(&self, args: Args) -> ReqResult {
        self.call(args).wait()
    }

    /// Sends a synchronous request without waiting for it: `end` runs once
    /// with its result, on the thread that ends it. Like the kernel's
    /// synchronous requests it is not counted against max_background, and
    /// unlike [`Chan::call`] it never waits, not even for INIT: before the
    /// connection is ready it fails with EAGAIN (ENOTCONN once aborted)
    /// and `end` does not run. The [`Sent`] names it, to interrupt it.
    pub fn send_async(&self, args: Args, end: EndFn) -> Result<Sent, Errno> {
        let core = self.core();
        if !core.connected.load(Ordering::SeqCst) {
            return Err(Errno::ENOTCONN);
        }
        if !core.gate_open.load(Ordering::Acquire) {
            return Err(Errno::EAGAIN);
        }
        core.add_waiting();
        let mut flags = flag::ISREPLY | flag::WAITING | flag::ASYNC;
        if args.force {
            flags |= flag::FORCE;
        }
        let req = Request::new(
            core,
            core.next_unique(),
            args,
            flags,
            core.clock.now(),
            Some(end),
        );
        let sent = Sent {
            req: Arc::downgrade(&req),
            unique: req.unique(),
        };
        if let Err(r) = core.send_req(req) {
            r.set_error(core.abort_errno().0);
            core.request_end(&r);
        }
        Ok(sent)
    }

    /// Queues a FORGET for `nodeid` (no reply; dropped if disconnected).
    pub fn send_forget(&self, nodeid: u64, nlookup: u64) {
        self.send_forgets(&[ForgetOne { nodeid, nlookup }]);
    }

    /// Queues several forgets at once (a BATCH_FORGET's worth).
    pub fn send_forgets(&self, forgets: &[ForgetOne]) {
        if self.core().connected.load(Ordering::SeqCst) {
            self.core().transport.send_forgets(forgets);
        }
    }

    /// Forgets queued for the server and not yet read by it. FORGET has no
    /// reply, so nothing else tells a client that sends them faster than
    /// the server takes them to slow down.
    pub fn forgets_queued(&self) -> usize {
        self.core().transport.forgets_queued()
    }

    /// Whether INIT has been processed (Acquire: what INIT set is visible).
    pub fn is_initialized(&self) -> bool {
        self.core().initialized.load(Ordering::Acquire)
    }

    /// Whether the connection is up.
    pub fn is_connected(&self) -> bool {
        self.core().connected.load(Ordering::SeqCst)
    }

    /// What INIT negotiated, once it has.
    pub fn negotiated(&self) -> Option<Negotiated> {
        lock(&self.core().conn).negotiated
    }

    /// Changes max_background at run time. Raising it admits one parked
    /// waiter per newly free slot, oldest first.
    pub fn set_max_background(&self, max: u32) {
        let core = self.core();
        let refused = {
            let mut bg = lock(&core.bg);
            if !bg.connected {
                return;
            }
            bg.max_background = max.max(1);
            if let Some(ring) = core.ring.get() {
                ring.set_max_background(bg.max_background);
            }
            bg.grant(core.budget());
            let next = bg.flush();
            core.send_to_transport(next)
        };
        core.end_refused(refused);
        if let Some(ring) = core.ring.get() {
            ring.flush_background();
        }
    }

    /// Changes congestion_threshold at run time.
    pub fn set_congestion_threshold(&self, threshold: u32) {
        let mut bg = lock(&self.core().bg);
        if bg.connected {
            bg.congestion_threshold = threshold;
        }
    }

    /// Aborts the connection: every queued and in-flight request ends with
    /// ENOTCONN (requests whose data is being copied end when the copy
    /// does), parked requesters are released, later sends fail at once. A
    /// concurrent second abort returns only after the first finished.
    pub fn abort(&self) {
        self.core().abort();
    }

    /// Waits until the connection is aborted and no request is in flight
    /// (kernel `fuse_wait_aborted`).
    pub fn wait_aborted(&self) {
        let core = self.core();
        {
            let mut c = lock(&core.conn);
            while c.phase != Phase::Aborted {
                c = wait(&core.conn_cv, c);
            }
        }
        let mut g = lock(&core.waiting_mx);
        while core.num_waiting.load(Ordering::SeqCst) != 0 {
            *g += 1;
            g = wait(&core.waiting_cv, g);
            *g -= 1;
        }
    }

    /// Runs one timeout scan now (what the periodic scanner does); returns
    /// whether it aborted the connection.
    pub fn scan_timeouts(&self) -> bool {
        self.core().scan_timeouts()
    }

    /// The connection's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.core().clock
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        let core = self.core();
        let (mut pending, mut processing) = core.transport.counts();
        if let Some(ring) = core.ring.get() {
            let (p, u) = ring.counts();
            pending += p;
            processing += u;
        }
        let bg = lock(&core.bg);
        Stats {
            waiting: core.num_waiting.load(Ordering::SeqCst),
            background: bg.num_background,
            active: bg.active_background,
            bg_queued: bg.queue.len(),
            pending,
            processing,
            parked: bg.waiters.len(),
            timeouts_fired: core.timeouts_fired.load(Ordering::Relaxed),
            aborts: core.aborts.load(Ordering::Relaxed),
            max_background: bg.max_background,
            congestion_threshold: bg.congestion_threshold,
            blocked: bg.blocked(),
            congested: bg.num_background >= bg.congestion_threshold,
            no_interrupt: core.no_interrupt.load(Ordering::SeqCst),
            connected: core.connected.load(Ordering::SeqCst),
            initialized: core.initialized.load(Ordering::Acquire),
            ready: bg.initialized && bg.ring_ready,
        }
    }

    /// Notifications the server has written.
    pub fn notifications(&self) -> u64 {
        self.core().notifications.load(Ordering::Relaxed)
    }

    /// Test-only switch restoring the pre-fix kernel behaviour in which
    /// raising max_background (and each completion) wakes a single waiter.
    /// It exists so the tests and loom models can show they catch that bug.
    #[cfg(any(test, loom, feature = "test-utils"))]
    pub fn set_legacy_single_wake(&self, on: bool) {
        self.core().legacy_single_wake.store(on, Ordering::Relaxed);
    }
}
