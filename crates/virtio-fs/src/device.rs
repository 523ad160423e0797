//! The vhost-user-fs backend: virtqueues in, engine requests out.
//!
//! Queue 0 is the hiprio queue (FORGET, BATCH_FORGET, INTERRUPT); queues
//! 1..=N are request queues, each served by its own vring thread and
//! mapped to its own engine ring queue (request queue `i` is ring queue
//! `i - 1`). A guest request becomes a background request of the engine
//! (`Chan::try_send_background`): when admission is full the queue stops
//! popping, leaves the chain in the avail ring, and resumes when a request
//! ends (a per-queue eventfd wakes its vring thread).
//!
//! Request lifecycle (one [`Ticket`], state guarded by its `state` mutex):
//! `InFlight` → `Answered` by exactly one of: the engine's end callback,
//! the timeout scanner, or the submit path when the engine refuses it.

use crate::chain::{Chain, ChainError};
use crate::guest_mem::{GuestSpans, MapCache};
use inline::QueueServer;

mod backend;
mod exit_fds;
mod heads;
mod inline;
mod migration;
mod request;
mod stop;
mod timeouts;
use crate::dirty_log::LogBitmap;
use crate::stats::DeviceStats;
use crate::sync::{lock, read, write};
use fuse_core::abi::{
    BatchForgetIn, ForgetIn, ForgetOne, InHeader, InterruptIn, Opcode, OutHeader, WriteIn,
};
use fuse_core::chan::{Args, Errno, ReqResult, TrySendError};
use fuse_core::embedded::{Embedded, Options};
use fuse_core::server::{Filesystem, ServerConfig};
use fuse_core::Sent;
use std::collections::HashMap;
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};
use thiserror::Error;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringEpollHandler, VringRwLock, VringT};
use virtio_queue::{QueueOwnedT, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryLoadGuard, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use zerocopy::{FromBytes, IntoBytes};

/// Guest RAM as the device maps it: each region carries the frontend's
/// dirty-page log (`VHOST_USER_SET_LOG_BASE`) once one is set, and every
/// write through vm-memory's API marks it (see "Live migration" in
/// docs/DESIGN.md for the writes that bypass it).
pub type GuestMmap = GuestMemoryMmap<LogBitmap>;
/// Guest memory as the device sees it.
pub type GuestMem = GuestMemoryAtomic<GuestMmap>;
/// One vring of the device.
pub type Vring = VringRwLock<GuestMem>;

const VIRTIO_F_VERSION_1: u64 = 1 << 32;
const VIRTIO_RING_F_INDIRECT_DESC: u64 = 1 << 28;
const VIRTIO_RING_F_EVENT_IDX: u64 = 1 << 29;
/// Size of the tag field of the virtio-fs config space.
pub const TAG_LEN: usize = 36;
const OUT_HEADER: usize = std::mem::size_of::<OutHeader>();
const IN_HEADER: usize = std::mem::size_of::<InHeader>();

/// Errors starting or running the device.
#[derive(Debug, Error)]
pub enum DeviceError {
    /// The engine could not start (its INIT with the server failed).
    #[error("starting the engine: {0}")]
    Engine(Errno),
    /// An eventfd could not be made or registered.
    #[error("device event: {0}")]
    Event(#[source] io::Error),
    /// The tag does not fit the config space.
    #[error("tag is longer than {TAG_LEN} bytes")]
    TagTooLong,
    /// Request queues must number 1 to 63.
    #[error("{0} request queues: 1 to 63 are possible")]
    Queues(u16),
    /// A vring operation failed.
    #[error("vring: {0}")]
    Vring(#[source] virtio_queue::Error),
}

/// What the device offers and how it serves.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// Request queues (not counting hiprio); more than one needs the MQ
    /// protocol feature, which is always offered.
    pub request_queues: u16,
    /// Largest queue the frontend may set up.
    pub queue_size: u16,
    /// The tag for the config space; with `None` the CONFIG protocol
    /// feature is not offered (QEMU 7.1 to 8.0 crash on it) and the VMM
    /// supplies the tag.
    pub tag: Option<String>,
    /// A request unanswered this long is answered with EIO and counted
    /// (zero: never).
    pub request_timeout: Duration,
    /// Engine server threads per request queue.
    pub workers_per_queue: usize,
    /// Background requests the engine admits at once (all queues).
    pub max_background: u16,
    /// Where the engine reports congestion.
    pub congestion_threshold: u16,
    /// Largest WRITE (and READ) payload.
    pub max_write: u32,
    /// READ and WRITE data goes between guest RAM and the host file by
    /// reference (no copy in this process); off, it is copied through the
    /// engine's buffers.
    pub zero_copy: bool,
    /// Requests of each batch popped from a queue that its vring thread
    /// serves itself, with no hand-off to a worker thread (0: none;
    /// `usize::MAX`: all, as virtiofsd without a thread pool). A host call
    /// that hangs there does not stall the queue: a watchdog drains it to
    /// the workers meanwhile. See `device/inline.rs`.
    pub inline_per_batch: usize,
    /// READs a vring thread starts before it submits them and answers what
    /// already completed (at least 1); also how many answers given in line
    /// share one guest notification (fewer when serving them took longer
    /// than 50 µs: the guest hears of large answers at once). Small chunks let a guest that reaps
    /// while the device works refill its queue sooner (cached reads
    /// complete at submit: answered after every 4 of a kick of 16, a warm
    /// 4 KiB read at depth 16 went from 65-90k to 160-175k ops/s); one
    /// chunk for the whole kick (`usize::MAX`) makes one system call for
    /// it all.
    pub submit_batch: usize,
    /// With `zero_copy`: the guest's RAM regions are registered as io_uring
    /// fixed buffers of each serving thread's ring on first use (again when
    /// the memory table changes), so data I/O through the ring goes as
    /// READ_FIXED/WRITE_FIXED (or the vectored forms) at the guest address.
    /// Registration pins all of guest RAM in host memory for as long as
    /// the device runs, which defeats ballooning and overcommit: off by
    /// default.
    pub fixed_guest_memory: bool,
    /// Where the device tells the operator how a live migration's state
    /// transfer went (true: an error), since QEMU is told only that it
    /// failed. None: nowhere.
    pub report: Option<fn(bool, &str)>,
    /// How long a ring stop (GET_VRING_BASE: before a migration, or when
    /// the guest resets the device) waits for the requests popped from
    /// that ring to be answered, when no `request_timeout` bounds them
    /// (with one, it waits until they timed out). What is still
    /// unanswered then is given up (`DeviceStats::lost_on_stop`).
    pub ring_stop_drain: Duration,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            request_queues: 1,
            queue_size: 1024,
            tag: None,
            request_timeout: Duration::ZERO,
            workers_per_queue: 4,
            max_background: 256,
            congestion_threshold: 192,
            max_write: 1 << 20,
            zero_copy: true,
            inline_per_batch: 0,
            submit_batch: 4,
            fixed_guest_memory: false,
            report: None,
            ring_stop_drain: stop::RING_STOP_DRAIN,
        }
    }
}

/// Most forgets the engine holds for the server: past it the hiprio
/// thread takes no more chains until the server has taken half of them
/// (FORGET has no reply, so nothing else would slow a guest that sends
/// them faster than the server takes them). 64 Ki forgets, 1 MiB.
const FORGETS_HIGH: usize = 1 << 16;

/// `Ticket::orphan` states.
const ORPHAN_NO: u8 = 0;
const ORPHAN_YES: u8 = 1;
const ORPHAN_ENDED: u8 = 2;

/// A guest request in flight. `state` (its own mutex, a leaf lock)
/// guards who answers it.
struct Ticket {
    unique: u64,
    /// The unique the server sees (0 until sent).
    engine_unique: AtomicU64,
    /// The generation of its queue when popped: a reply for an older one
    /// (the ring was stopped or reset since) is dropped.
    gen: u64,
    opcode: u32,
    queue: usize,
    started: Instant,
    chain: Chain,
    vring: Vring,
    mem: GuestMemoryLoadGuard<GuestMmap>,
    /// A READ's or WRITE's guest data buffers, lent to the engine.
    client: Option<Arc<GuestSpans>>,
    /// `ORPHAN_NO` until the timeout scanner answers it while the engine
    /// still holds it (`ORPHAN_YES`, counted in `Inner::orphans`) or the
    /// engine ends it (`ORPHAN_ENDED`): whichever comes first decides.
    orphan: std::sync::atomic::AtomicU8,
    state: Mutex<TicketState>,
}

/// Who answers a request. InFlight → Answered (the engine's reply, an
/// error path, or the timeout scanner), or InFlight → Deferred (timed out
/// while a server was doing host I/O on its guest buffers) → Answered with
/// EIO by the last such I/O to end. Guarded by `Ticket::state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TicketState {
    InFlight,
    Deferred,
    Answered,
}

impl Ticket {
    /// Whether it was answered (or its answer deferred) already.
    fn is_answered(&self) -> bool {
        *lock(&self.state) != TicketState::InFlight
    }

    /// Moves InFlight → Answered; false if it was answered, or its answer
    /// deferred, already.
    fn claim(&self) -> bool {
        let mut s = lock(&self.state);
        let first = *s == TicketState::InFlight;
        if first {
            *s = TicketState::Answered;
        }
        first
    }
}

struct Inner<F: Filesystem + 'static> {
    engine: Embedded<F>,
    cfg: DeviceConfig,
    config_space: Vec<u8>,
    mem: RwLock<Option<GuestMem>>,
    /// Guest RAM as a client map (with `cfg.fixed_guest_memory`).
    maps: MapCache,
    event_idx: AtomicBool,
    acked: AtomicU64,
    /// Per request queue: set while it stopped popping for admission.
    stalled: Vec<AtomicBool>,
    /// Per request queue: the vring thread's own ring entries and the
    /// requests it has in flight on them (made on first use; only that
    /// thread locks it, and Drop).
    inline: Vec<Mutex<Option<QueueServer>>>,
    /// The daemon's vring threads' event loops (to add a queue's
    /// completion eventfd once its thread has one).
    handlers: Mutex<Vec<Weak<VringEpollHandler<FsDevice<F>>>>>,
    /// Per request queue: when its vring thread started serving in line
    /// (milliseconds on `epoch`, 0: not serving).
    busy_since: Vec<AtomicU64>,
    /// Per request queue: held from popping a chain until it is submitted
    /// or put back, so the vring thread and the watchdog never interleave
    /// a pop with another's rewind.
    pop_lock: Vec<Mutex<()>>,
    /// The vrings, as the vring threads last saw them (for the watchdog).
    vrings: Mutex<Vec<Option<Vring>>>,
    epoch: Instant,
    /// Per queue: requests whose guest buffers are lent to the engine
    /// (pruned as they go), so a ring stop or reset can take them back.
    lent: Vec<Mutex<Vec<Weak<Ticket>>>>,
    /// Timed-out tickets whose answer waits for I/O on their buffers.
    deferred: Mutex<Vec<Arc<Ticket>>>,
    /// Exit-event fds vhost-user-backend leaks (see `exit_event`), each
    /// with a duplicate that identifies it.
    exit_fds: Mutex<Vec<(usize, exit_fds::Leaked)>>,
    /// Per request queue: written to resume a stalled queue.
    resume: Vec<EventFd>,
    stats: DeviceStats,
    /// Tickets in submission order, for the timeout scanner (lock order:
    /// `timeouts` before any ticket's `state`).
    timeouts: Mutex<VecDeque<Arc<Ticket>>>,
    /// Per queue: requests the timeout scanner answered that the engine
    /// still holds (their heads are back with the guest, which may
    /// publish them again): at the queue's size the queue stops popping
    /// until the engine lets some go, so work in flight stays bounded
    /// when the server hangs.
    orphans: Vec<AtomicU64>,
    /// Per queue: the heads of its chains in flight (see `heads.rs`).
    heads: Vec<heads::Heads>,
    /// Lock calls in flight (they may wait without end), by the unique
    /// the guest gave them: a guest's FUSE_INTERRUPT names them so.
    waiters: Mutex<HashMap<u64, (Weak<Ticket>, Sent)>>,
    /// Per queue: bumped when the frontend stops or resets the ring.
    /// Replies are written under the read lock, so once `stop_vring` holds
    /// the write lock no reply of the old ring can reach guest memory.
    gens: Vec<RwLock<u64>>,
    /// Live migration: the guest's INIT and the state transfer.
    migration: migration::Migration,
    stop: AtomicBool,
}

/// The virtio-fs device around a [`Filesystem`]. Cheap to clone.
pub struct FsDevice<F: Filesystem + 'static> {
    inner: Arc<Inner<F>>,
}

impl<F: Filesystem + 'static> Clone for FsDevice<F> {
    fn clone(&self) -> Self {
        FsDevice {
            inner: self.inner.clone(),
        }
    }
}

impl<F: Filesystem + 'static> std::fmt::Debug for FsDevice<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsDevice")
            .field("cfg", &self.inner.cfg)
            .finish_non_exhaustive()
    }
}

impl<F: Filesystem + 'static> FsDevice<F> {
    /// Starts the engine around `fs` (INIT with the server, ring queues and
    /// their workers) and makes the device.
    pub fn new(fs: F, cfg: DeviceConfig) -> Result<Self, DeviceError> {
        let mut config_space = vec![0u8; TAG_LEN + 4];
        if let Some(tag) = &cfg.tag {
            if tag.len() > TAG_LEN {
                return Err(DeviceError::TagTooLong);
            }
            config_space[..tag.len()].copy_from_slice(tag.as_bytes());
        }
        config_space[TAG_LEN..].copy_from_slice(&u32::from(cfg.request_queues).to_le_bytes());
        // One vring thread per queue, named by a bit of a u64 mask.
        if cfg.request_queues == 0 || cfg.request_queues > 63 {
            return Err(DeviceError::Queues(cfg.request_queues));
        }
        let queues = usize::from(cfg.request_queues);
        let server = ServerConfig {
            max_write: cfg.max_write,
            ..ServerConfig::default()
        };
        let engine = Embedded::start(
            fs,
            Options {
                max_background: cfg.max_background,
                congestion_threshold: cfg.congestion_threshold,
                ring_queues: queues as u16,
                ring_workers: cfg.workers_per_queue.max(1),
                // Entries without payload buffers of their own (the vring
                // thread makes as many as it has requests in flight; READ
                // and WRITE by reference need none): a pool per queue for
                // what needs one, a buffer per thread that serves.
                ring_pool: cfg.workers_per_queue.max(1) + 2,
                // What a guest kernel offers beyond the engine's set: the
                // server may insist on them (--posix-acl and
                // --security-label do). The guest's own INIT, forwarded
                // later, decides what is in force.
                offer_flags: fuse_core::abi::init::WRITEBACK_CACHE
                    | fuse_core::abi::init::POSIX_ACL
                    | fuse_core::abi::init::SECURITY_CTX,
                // The engine's device carries FORGETs, INTERRUPTs and lock
                // calls: two, so one slow lock call holds up no forget.
                workers: 2,
                server,
                ..Options::default()
            },
        )
        .map_err(DeviceError::Engine)?;
        let resume = (0..queues)
            .map(|_| EventFd::new(EFD_NONBLOCK))
            .collect::<Result<Vec<_>, _>>()
            .map_err(DeviceError::Event)?;
        let inner = Arc::new(Inner {
            engine,
            stalled: (0..queues).map(|_| AtomicBool::new(false)).collect(),
            inline: (0..queues).map(|_| Mutex::new(None)).collect(),
            handlers: Mutex::new(Vec::new()),
            busy_since: (0..queues).map(|_| AtomicU64::new(0)).collect(),
            pop_lock: (0..queues).map(|_| Mutex::new(())).collect(),
            vrings: Mutex::new(vec![None; queues + 1]),
            epoch: Instant::now(),
            exit_fds: Mutex::new(Vec::new()),
            lent: (0..=queues).map(|_| Mutex::new(Vec::new())).collect(),
            deferred: Mutex::new(Vec::new()),
            resume,
            stats: DeviceStats::new(queues + 1),
            config_space,
            mem: RwLock::new(None),
            maps: MapCache::default(),
            event_idx: AtomicBool::new(false),
            acked: AtomicU64::new(0),
            timeouts: Mutex::new(VecDeque::new()),
            gens: (0..=queues).map(|_| RwLock::new(0)).collect(),
            heads: (0..=queues).map(|_| heads::Heads::default()).collect(),
            orphans: (0..=queues).map(|_| AtomicU64::new(0)).collect(),
            waiters: Mutex::new(HashMap::new()),
            migration: migration::Migration::default(),
            stop: AtomicBool::new(false),
            cfg,
        });
        if !inner.cfg.request_timeout.is_zero() {
            let weak = Arc::downgrade(&inner);
            std::thread::Builder::new()
                .name("fusebox-timeouts".into())
                .spawn(move || timeouts::scan_timeouts(weak))
                .map_err(DeviceError::Event)?;
        }
        if inner.cfg.inline_per_batch > 0 {
            let weak = Arc::downgrade(&inner);
            std::thread::Builder::new()
                .name("fusebox-watchdog".into())
                .spawn(move || inline::watchdog(weak))
                .map_err(DeviceError::Event)?;
        }
        Ok(FsDevice { inner })
    }

    /// The device's counters.
    pub fn stats(&self) -> &DeviceStats {
        &self.inner.stats
    }

    /// Chains of request queue `queue` (1-based; 0 is hiprio) the device
    /// holds now.
    pub fn heads_in_flight(&self, queue: usize) -> usize {
        self.inner.heads.get(queue).map_or(0, heads::Heads::count)
    }

    /// The engine (its connection counters, the filesystem).
    pub fn engine(&self) -> &Embedded<F> {
        &self.inner.engine
    }

    /// Counters of the device and of the engine, as text.
    pub fn report(&self) -> String {
        let s = self.inner.engine.chan().stats();
        format!(
            "{}engine: waiting {} background {} active {} queued {}\n",
            self.inner.stats.report(),
            s.waiting,
            s.background,
            s.active,
            s.bg_queued
        )
    }

    /// Registers the per-queue resume eventfds with the daemon's vring
    /// threads (call once, after the daemon is made, before serving).
    pub fn register_listeners(&self, handlers: &[Arc<VringEpollHandler<Self>>]) -> io::Result<()> {
        *lock(&self.inner.handlers) = handlers.iter().map(Arc::downgrade).collect();
        let base = self.num_queues() as u64;
        for (i, fd) in self.inner.resume.iter().enumerate() {
            // Request queue i (vring i + 1) runs on thread i + 1.
            let h = handlers
                .get(i + 1)
                .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
            h.register_listener(
                std::os::fd::AsRawFd::as_raw_fd(fd),
                EventSet::IN,
                base + 1 + i as u64,
            )?;
        }
        Ok(())
    }

    /// The eventfd that becomes readable when request queue `i` (0-based)
    /// stalled on admission and may go on; `register_listeners` hands it
    /// to the vring thread of that queue.
    pub fn resume_fd(&self, i: usize) -> Option<std::os::fd::RawFd> {
        self.inner
            .resume
            .get(i)
            .map(std::os::fd::AsRawFd::as_raw_fd)
    }

    /// The frontend took ring `q` back (stop or reset): its guests'
    /// buffers may be reused at once, so no host I/O may run on them any
    /// more. Every lent buffer is revoked, its request interrupted in the
    /// backend (cancelling an io_uring operation), and the I/O already
    /// running on it is waited for, as a device reset waits for DMA.
    fn take_back_buffers(&self, q: usize) {
        let Some(lent) = self.inner.lent.get(q) else {
            return;
        };
        let tickets: Vec<Arc<Ticket>> = std::mem::take(&mut *lock(lent))
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for t in &tickets {
            if let Some(c) = &t.client {
                if !c.revoke() {
                    let unique = t.engine_unique.load(Ordering::Relaxed);
                    if unique != 0 {
                        self.inner.engine.fs().interrupt(unique);
                    }
                }
            }
        }
        for t in &tickets {
            if let Some(c) = &t.client {
                c.wait_idle();
                // Never answered, but a READ may have filled some of it.
                self.mark_written(&t.mem, &t.chain.writable);
            }
        }
    }

    fn memory(&self) -> Option<GuestMemoryLoadGuard<GuestMmap>> {
        let m = read(&self.inner.mem);
        m.as_ref().map(GuestAddressSpace::memory)
    }

    /// Serves queue `q` (0: hiprio) until it is empty or stalls.
    fn serve_queue(&self, vring: &Vring, q: usize) -> Result<(), DeviceError> {
        let event_idx = self.inner.event_idx.load(Ordering::Relaxed);
        loop {
            if event_idx {
                vring.disable_notification().map_err(DeviceError::Vring)?;
            }
            let before = vring.queue_next_avail();
            let stalled = if q == 0 {
                self.drain_hiprio(vring);
                false
            } else {
                self.drain_requests(vring, q)
            };
            if stalled || !event_idx || !vring.enable_notification().map_err(DeviceError::Vring)? {
                break;
            }
            if vring.queue_next_avail() == before {
                // More is announced but nothing could be popped: an avail
                // index the queue refuses (more than a ring ahead) or an
                // unreadable head. Stop rather than spin; the next kick
                // retries.
                self.inner.stats.queues[q]
                    .malformed
                    .fetch_add(1, Ordering::Relaxed);
                break;
            }
        }
        Ok(())
    }

    fn pop(
        &self,
        vring: &Vring,
        mem: &GuestMemoryLoadGuard<GuestMmap>,
    ) -> Option<Result<Chain, (u16, ChainError)>> {
        let chain = vring
            .get_mut()
            .get_queue_mut()
            .pop_descriptor_chain(mem.clone())?;
        let head = chain.head_index();
        let max = u64::from(self.inner.cfg.max_write) + 64 * 1024;
        Some(Chain::parse(chain, max).map_err(|e| (head, e)))
    }

    /// Waits while the engine holds more than [`FORGETS_HIGH`] forgets
    /// for the server, until it holds half as many. False if the device is
    /// going away meanwhile (the hiprio thread's exit event was raised).
    fn wait_for_forget_room(&self) -> bool {
        let chan = self.inner.engine.chan();
        if chan.forgets_queued() <= FORGETS_HIGH {
            return true;
        }
        self.inner
            .stats
            .forget_waits
            .fetch_add(1, Ordering::Relaxed);
        while chan.forgets_queued() > FORGETS_HIGH / 2 {
            if self.inner.stop.load(Ordering::Relaxed) || !chan.is_connected() {
                return false;
            }
            let exit = lock(&self.inner.exit_fds)
                .iter()
                .rev()
                .find(|(t, _)| *t == 0)
                .map(|(_, l)| l.raised(1));
            match exit {
                Some(true) => return false,
                Some(false) => {}
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        true
    }

    fn drain_hiprio(&self, vring: &Vring) {
        let Some(mem) = self.memory() else { return };
        let qs = &self.inner.stats.queues[0];
        let mut used = false;
        while self.wait_for_forget_room() {
            let Some(popped) = self.pop(vring, &mem) else {
                break;
            };
            used = true;
            let chain = match popped {
                Ok(c) => c,
                Err((head, _)) => {
                    qs.malformed.fetch_add(1, Ordering::Relaxed);
                    self.publish(vring, &mem, head, &[], 0);
                    continue;
                }
            };
            qs.submitted.fetch_add(1, Ordering::Relaxed);
            self.forget(&mem, &chain);
            qs.completed.fetch_add(1, Ordering::Relaxed);
            self.publish(vring, &mem, chain.head, &chain.writable, 0);
        }
        if used {
            notify(vring);
        }
    }

    /// FORGET and BATCH_FORGET go to the engine; INTERRUPT (which Linux's
    /// virtio-fs does not send today) to the lock call it names; anything
    /// else is dropped and counted as malformed.
    fn forget(&self, mem: &GuestMmap, chain: &Chain) {
        let len = chain.readable_len().min(1 << 20);
        let mut buf = vec![0u8; len];
        if chain.read_at(mem, 0, &mut buf).is_err() {
            return;
        }
        let Ok((h, rest)) = InHeader::read_from_prefix(&buf) else {
            return;
        };
        let chan = self.inner.engine.chan();
        match Opcode::from_u32(h.opcode) {
            Some(Opcode::Forget) => {
                if let Ok((f, _)) = ForgetIn::read_from_prefix(rest) {
                    chan.send_forget(h.nodeid, f.nlookup);
                }
            }
            Some(Opcode::BatchForget) => {
                let Ok((b, rest)) = BatchForgetIn::read_from_prefix(rest) else {
                    return;
                };
                let n = (b.count as usize).min(rest.len() / std::mem::size_of::<ForgetOne>());
                if let Ok((list, _)) = <[ForgetOne]>::ref_from_prefix_with_elems(rest, n) {
                    chan.send_forgets(list);
                }
            }
            Some(Opcode::Interrupt) => {
                if let Ok((i, _)) = InterruptIn::read_from_prefix(rest) {
                    self.interrupt_waiter(i.unique);
                }
            }
            _ => {
                self.inner.stats.queues[0]
                    .malformed
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Pops and submits until the queue is empty (false) or admission is
    /// full (true: the chain went back to the avail ring), serving on this
    /// thread as it goes (`inline.rs`): READs started, the rest served in
    /// line; then submits the started I/O at once and answers what
    /// completed.
    fn drain_requests(&self, vring: &Vring, q: usize) -> bool {
        let k = self.inner.cfg.inline_per_batch;
        if k == 0 {
            return self.submit_requests(vring, q, None);
        }
        let mut slot = lock(&self.inner.inline[q - 1]);
        if slot.is_none() {
            let most = usize::from(self.inner.cfg.queue_size);
            *slot = QueueServer::new(self.inner.engine.chan(), (q - 1) as u16, most).ok();
        }
        let Some(s) = slot.as_mut() else {
            return self.submit_requests(vring, q, None);
        };
        // Each request goes to this thread's entries and is served right
        // away, up to `k`; then the rest go to the workers and this thread
        // serves what its entries got once the batch is in.
        s.prefer(true);
        let stalled = self.submit_requests(vring, q, Some((s, k)));
        s.prefer(false);
        self.serve_inline(s, q, usize::MAX);
        self.complete_inline(s, q);
        stalled
    }

    /// Submits the I/O this queue's thread started and answers what has
    /// completed, and what the entries took meanwhile; makes sure the
    /// thread's completion eventfd is in its epoll.
    fn complete_inline(&self, s: &mut QueueServer, q: usize) {
        let disp = self.inner.engine.dispatcher();
        // The answers of one reaped batch of completions signal the guest
        // once, when all are in its used ring (inside a chunk of requests
        // served in line, with that chunk's: see `Batch`).
        while {
            let _batch = Batch::begin();
            s.complete(disp)
        } > 0
            && self.serve_inline(s, q, usize::MAX) > 0
        {}
        if s.fd_registered.is_none() {
            if let Some(fd) = disp.fs().async_fd() {
                let h = lock(&self.inner.handlers).get(q).and_then(Weak::upgrade);
                let ev = self.completion_event(q - 1);
                if let Some(h) = h {
                    if h.register_listener(fd, EventSet::IN, ev).is_ok() {
                        s.fd_registered = Some(fd);
                    }
                }
            }
        }
    }

    /// The device event of request queue `i`'s (0-based) completions.
    fn completion_event(&self, i: usize) -> u64 {
        (self.num_queues() + usize::from(self.inner.cfg.request_queues) + 1 + i) as u64
    }

    /// Request queue `q`'s thread has completions to take.
    pub(super) fn on_completions(&self, q: usize) {
        let mut slot = lock(&self.inner.inline[q - 1]);
        let Some(s) = slot.as_mut() else { return };
        if let Some(fd) = s.fd_registered {
            let mut v = 0u64;
            // SAFETY: reads 8 bytes into a u64 from the filesystem's
            // eventfd (non-blocking): that resets it.
            unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
        }
        self.complete_inline(s, q);
    }

    /// Serves up to `budget` requests on this thread's entries, marking the
    /// queue busy for the watchdog meanwhile.
    fn serve_inline(&self, s: &mut QueueServer, q: usize, budget: usize) -> usize {
        let now = self.inner.epoch.elapsed().as_millis() as u64;
        self.inner.busy_since[q - 1].store(now.max(1), Ordering::SeqCst);
        let n = s.serve(self.inner.engine.dispatcher(), budget);
        self.inner.busy_since[q - 1].store(0, Ordering::SeqCst);
        self.inner.stats.queues[q]
            .inline
            .fetch_add(n as u64, Ordering::Relaxed);
        n
    }

    /// Pops and submits (see [`FsDevice::drain_requests`]); with `inline`,
    /// serves each submitted request on this thread until `k` were.
    fn submit_requests(
        &self,
        vring: &Vring,
        q: usize,
        mut inline: Option<(&mut QueueServer, usize)>,
    ) -> bool {
        let mut served = 0;
        // Answers given in line signal the guest once per chunk.
        let (mut batch, mut in_batch): (Option<Batch>, usize) = (None, 0);
        let mut chunk_start = std::time::Instant::now();
        let qs = &self.inner.stats.queues[q];
        loop {
            // Each round: serving in line may have taken long, and the
            // memory table may have changed meanwhile.
            let Some(mem) = self.memory() else {
                return false;
            };
            if self.too_many_orphans(q) {
                return true;
            }
            let pop_guard = lock(&self.inner.pop_lock[q - 1]);
            // Before the pop: a ring stopped after it leaves this chain
            // with the old generation, so its answer never reaches the
            // new ring.
            let gen = *read(&self.inner.gens[q]);
            let Some(popped) = self.pop(vring, &mem) else {
                return false;
            };
            let heads = &self.inner.heads[q];
            let chain = match popped {
                Ok(c) if heads.claim(c.head) => c,
                // A head republished while the device still serves it: the
                // guest broke the ring's rules; it gets nothing back.
                Ok(_) => {
                    qs.malformed.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Err((head, _)) => {
                    qs.malformed.fetch_add(1, Ordering::Relaxed);
                    if !heads.in_flight(head) {
                        // Refused before anything was written to it.
                        self.publish(vring, &mem, head, &[], 0);
                        notify(vring);
                    }
                    continue;
                }
            };
            let (args, ticket) = match self.prepare(vring, &mem, chain, q, gen) {
                Ok(v) => v,
                Err(t) => {
                    qs.malformed.fetch_add(1, Ordering::Relaxed);
                    if let Some(t) = t {
                        self.answer(&t, Errno::EIO.to_wire(), &[]);
                    }
                    continue;
                }
            };
            let weak = Arc::downgrade(&self.inner);
            if matches!(
                Opcode::from_u32(ticket.opcode),
                Some(Opcode::Getlk | Opcode::Setlk | Opcode::Setlkw)
            ) {
                // Lock calls are synchronous in the kernel, never background:
                // a parked SETLKW must not hold a background slot (enough of
                // them would keep out the unlock that frees them). They wait
                // on a thread of their own, which only the gate holds.
                qs.submitted.fetch_add(1, Ordering::Relaxed);
                if !self.inner.cfg.request_timeout.is_zero() {
                    lock(&self.inner.timeouts).push_back(ticket.clone());
                }
                drop(pop_guard);
                self.send_lock_call(args, &ticket);
                continue;
            }
            if let Some((s, k)) = inline.as_mut() {
                if served < *k {
                    // An entry of this thread free for it.
                    s.make_room();
                }
            }
            let t2 = ticket.clone();
            let end = Box::new(move |r: ReqResult| {
                if let Some(inner) = weak.upgrade() {
                    FsDevice { inner }.finish(&t2, r);
                }
            });
            match self.inner.engine.chan().try_send_background(args, end) {
                Ok(unique) => {
                    ticket.engine_unique.store(unique, Ordering::Relaxed);
                    qs.submitted.fetch_add(1, Ordering::Relaxed);
                    if !self.inner.cfg.request_timeout.is_zero() {
                        lock(&self.inner.timeouts).push_back(ticket);
                    }
                    drop(pop_guard);
                    if let Some((s, k)) = inline.as_mut() {
                        if served < *k {
                            if batch.is_none() {
                                batch = Some(Batch::begin());
                                chunk_start = std::time::Instant::now();
                            }
                            served += self.serve_inline(s, q, 1);
                            in_batch += 1;
                            if in_batch >= self.inner.cfg.submit_batch.max(1)
                                || chunk_start.elapsed() >= CHUNK_TIME
                            {
                                // Signal what this chunk answered.
                                (batch, in_batch) = (None, 0);
                            }
                            if s.unsubmitted() >= self.inner.cfg.submit_batch.max(1) {
                                self.complete_inline(s, q);
                            }
                        }
                    }
                }
                Err(TrySendError::Full(_)) => {
                    vring.get_mut().get_queue_mut().go_to_previous_position();
                    heads.release(ticket.chain.head);
                    let stalled = &self.inner.stalled[q - 1];
                    stalled.store(true, Ordering::SeqCst);
                    qs.stalls.fetch_add(1, Ordering::Relaxed);
                    // A slot freed between the refusal and the flag would
                    // not wake us: look once more.
                    let s = self.inner.engine.chan().stats();
                    if s.ready
                        && !s.blocked
                        && s.parked == 0
                        && stalled.swap(false, Ordering::SeqCst)
                    {
                        continue;
                    }
                    return true;
                }
                Err(TrySendError::Closed(e)) => {
                    qs.submitted.fetch_add(1, Ordering::Relaxed);
                    self.inner.stats.aborted.fetch_add(1, Ordering::Relaxed);
                    if ticket.claim() {
                        self.answer(&ticket, e.to_wire(), &[]);
                    }
                }
            }
        }
    }

    /// Whether queue `q` must stop popping while the engine still holds as
    /// many timed-out requests as the queue has room for (then it is
    /// marked stalled; an end of a request resumes it).
    fn too_many_orphans(&self, q: usize) -> bool {
        let max = u64::from(self.inner.cfg.queue_size);
        let orphans = &self.inner.orphans[q];
        if orphans.load(Ordering::SeqCst) < max {
            return false;
        }
        let stalled = &self.inner.stalled[q - 1];
        stalled.store(true, Ordering::SeqCst);
        self.inner.stats.queues[q]
            .stalls
            .fetch_add(1, Ordering::Relaxed);
        // One that ended between the look and the flag would not wake us.
        if orphans.load(Ordering::SeqCst) < max && stalled.swap(false, Ordering::SeqCst) {
            return false;
        }
        true
    }

    /// Sends a lock call (GETLK, SETLK, SETLKW). They are synchronous in
    /// the kernel, never background: a parked SETLKW must not hold a
    /// background slot (enough of them would keep out the unlock that
    /// frees them). They go without waiting (`Chan::send_async`: no thread
    /// per call) over the engine's device rather than the ring, so a
    /// parked SETLKW holds no ring entry or payload buffer; the guest's
    /// FUSE_INTERRUPT finds them by their guest unique.
    fn send_lock_call(&self, args: Args, ticket: &Arc<Ticket>) {
        let weak = Arc::downgrade(&self.inner);
        let mine = ticket.clone();
        let end = Box::new(move |r: ReqResult| {
            if let Some(inner) = weak.upgrade() {
                let dev = FsDevice { inner };
                dev.forget_waiter(&mine);
                dev.finish(&mine, r);
            }
        });
        // No device lock is held across the engine call: it may end the
        // request on this very thread (a transport that was aborted), and
        // its end takes `waiters`. An end that comes meanwhile on another
        // thread may leave an entry for an answered ticket, which is never
        // interrupted (`Sent` of a finished request does nothing) and is
        // pruned later.
        match self.inner.engine.chan().send_async(args.over_device(), end) {
            Ok(sent) => {
                ticket.engine_unique.store(sent.unique(), Ordering::Relaxed);
                if !ticket.is_answered() {
                    let mut waiters = lock(&self.inner.waiters);
                    if waiters.len() >= 64 && waiters.len().is_power_of_two() {
                        waiters.retain(|_, (t, _)| t.strong_count() > 0);
                    }
                    waiters.insert(ticket.unique, (Arc::downgrade(ticket), sent));
                }
            }
            Err(e) => {
                if ticket.claim() {
                    self.answer(ticket, e.to_wire(), &[]);
                }
            }
        }
    }

    /// A lock call ended: the guest's interrupts no longer reach it.
    fn forget_waiter(&self, t: &Arc<Ticket>) {
        let mut waiters = lock(&self.inner.waiters);
        if let Some((w, _)) = waiters.get(&t.unique) {
            if std::ptr::eq(w.as_ptr(), Arc::as_ptr(t)) {
                waiters.remove(&t.unique);
            }
        }
    }

    /// Interrupts the lock calls of queue `q` (every queue: None) still in
    /// flight: the frontend took their ring back (a stop or a reset, as
    /// when the guest reboots), so no answer can reach the guest, and a
    /// parked SETLKW must not hold its waiter thread for good.
    pub(super) fn interrupt_waiters(&self, q: Option<usize>) {
        let sent: Vec<Sent> = lock(&self.inner.waiters)
            .values()
            .filter(|(t, _)| t.upgrade().is_some_and(|t| q.is_none_or(|q| t.queue == q)))
            .map(|(_, s)| s.clone())
            .collect();
        for s in sent {
            s.interrupt();
        }
    }

    /// The guest's FUSE_INTERRUPT for its request `unique` (a lock call
    /// that waits; Linux guests do not send them today).
    fn interrupt_waiter(&self, unique: u64) {
        let sent = lock(&self.inner.waiters)
            .get(&unique)
            .filter(|(t, _)| t.strong_count() > 0)
            .map(|(_, s)| s.clone());
        if let Some(s) = sent {
            s.interrupt();
        }
    }

    /// The engine's answer to a request.
    fn finish(&self, t: &Arc<Ticket>, r: ReqResult) {
        if t.orphan.swap(ORPHAN_ENDED, Ordering::SeqCst) == ORPHAN_YES {
            self.inner.orphans[t.queue].fetch_sub(1, Ordering::SeqCst);
        }
        self.resume_stalled();
        if !t.claim() {
            return;
        }
        match r {
            Ok(reply) => self.answer_with(t, 0, &reply.data, reply.in_client),
            Err(e) => {
                if e == Errno::ENOTCONN {
                    self.inner.stats.aborted.fetch_add(1, Ordering::Relaxed);
                }
                self.answer(t, e.to_wire(), &[])
            }
        }
    }

    /// Wakes every stalled queue: a background slot may have freed.
    fn resume_stalled(&self) {
        for (i, s) in self.inner.stalled.iter().enumerate() {
            if s.swap(false, Ordering::SeqCst) {
                let _ = self.inner.resume[i].write(1);
            }
        }
    }

    /// Writes the reply into the chain and returns it to the guest, unless
    /// its ring was stopped or reset since the chain was popped.
    fn answer(&self, t: &Ticket, error: i32, payload: &[u8]) {
        self.answer_with(t, error, payload, 0);
    }

    /// Returns a chain that cannot carry a reply unused (length 0), unless
    /// its ring was stopped or reset since it was popped.
    fn give_back_unanswered(&self, t: &Ticket) {
        let gen = read(&self.inner.gens[t.queue]);
        if *gen != t.gen {
            return;
        }
        self.inner.heads[t.queue].release(t.chain.head);
        self.publish(&t.vring, &t.mem, t.chain.head, &t.chain.writable, 0);
        notify(&t.vring);
    }

    /// [`FsDevice::answer`] for a reply whose last `in_guest` payload bytes
    /// the server already put in the guest's buffers (a READ by reference).
    fn answer_with(&self, t: &Ticket, error: i32, payload: &[u8], in_guest: usize) {
        let gen = read(&self.inner.gens[t.queue]);
        if *gen != t.gen {
            self.inner.stats.aborted.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // Given back to the guest below, and free to come again.
        self.inner.heads[t.queue].release(t.chain.head);
        let reply_len = OUT_HEADER + payload.len() + in_guest;
        let (error, payload, reply_len) = if reply_len > t.chain.writable_len() {
            (Errno::ERANGE.to_wire(), &[][..], OUT_HEADER)
        } else {
            (error, payload, reply_len)
        };
        let h = OutHeader {
            len: reply_len as u32,
            error,
            unique: t.unique,
        };
        let written = match t.chain.write_all(&*t.mem, &[h.as_bytes(), payload]) {
            // The data the server put in the guest's buffers counts too.
            Ok(_) => reply_len as u32,
            Err(_) => 0,
        };
        self.inner
            .stats
            .record(t.opcode, error, t.started.elapsed());
        if t.opcode == Opcode::Init as u32 {
            // What a migration replays is the INIT the guest was granted.
            self.inner.migration.init_answered(t.unique, error == 0);
        }
        self.inner.stats.queues[t.queue]
            .completed
            .fetch_add(1, Ordering::Relaxed);
        // The server may have written the chain's pages by host address
        // (a READ by reference): logged here, before the guest has them.
        self.publish(&t.vring, &t.mem, t.chain.head, &t.chain.writable, written);
        notify_batched(t.queue, &t.vring);
    }
}

/// The longest a chunk of answers given in line waits for its
/// notification, whatever `submit_batch` says: a 1 MiB READ takes about
/// 100 µs to copy, so four of them in a chunk kept a guest at depth 4 from
/// hearing of any (and refilling its queue) for 400 µs; a notification
/// costs the device a few microseconds, so at 50 µs it stays a small part
/// of the work it announces.
const CHUNK_TIME: Duration = Duration::from_micros(50);

/// Signals the guest if it wants to hear about used buffers now.
fn notify(vring: &Vring) {
    if vring.needs_notification().unwrap_or(true) {
        let _ = vring.signal_used_queue();
    }
}

thread_local! {
    /// While a vring thread answers a chunk of requests or a reaped batch
    /// of completions ([`Batch`]): the queues it answered on, to signal
    /// once at the end instead of once per answer.
    static BATCH: std::cell::RefCell<Option<Vec<(usize, Vring)>>> =
        const { std::cell::RefCell::new(None) };
}

/// Signals the guest about queue `q` now, or at the end of this thread's
/// batch if it has one open ([`Batch`]).
fn notify_batched(q: usize, vring: &Vring) {
    let deferred = BATCH.with(|b| match b.borrow_mut().as_mut() {
        Some(list) => {
            if !list.iter().any(|(x, _)| *x == q) {
                list.push((q, vring.clone()));
            }
            true
        }
        None => false,
    });
    if !deferred {
        notify(vring);
    }
}

/// A vring thread's batch: answers given on this thread while it lives
/// signal the guest once per queue, when it ends (EVENT_IDX then decides
/// whether the guest wants it). Held around the answers of one reaped
/// batch of completions, and of each `submit_batch` requests served in
/// line: held across a whole kick (popping and serving every chain) the
/// guest heard of nothing until all were served, and it could not refill
/// its queue meanwhile (GETATTR at depth 16 ran at 0.4x); signalled per
/// answer, a guest that reaps as fast as the device answers is woken for
/// each (a wake-up costs the device tens of microseconds on a VM host).
/// A batch begun while one is open is part of the outer one.
struct Batch {
    owner: bool,
}

impl Batch {
    fn begin() -> Batch {
        let owner = BATCH.with(|b| {
            let mut b = b.borrow_mut();
            let open = b.is_some();
            if !open {
                *b = Some(Vec::new());
            }
            !open
        });
        Batch { owner }
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        if !self.owner {
            return;
        }
        let list = BATCH.with(|b| b.borrow_mut().take());
        for (_, v) in list.into_iter().flatten() {
            notify(&v);
        }
    }
}

impl<F: Filesystem + 'static> Drop for Inner<F> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // The device outlives the daemon's vring threads (each holds a
        // clone): their exit eventfds are unused now.
        for (_, leaked) in lock(&self.exit_fds).drain(..) {
            leaked.close();
        }
    }
}
