//! The vhost-user-fs backend: virtqueues in, engine requests out.
//!
//! Queue 0 is the hiprio queue (FORGET, BATCH_FORGET, INTERRUPT); queues
//! 1..=N are request queues, each served by its own vring thread and mapped
//! to its own engine ring queue (an [`RqId`] names one, `ids.rs`; its
//! state is one [`RequestQueue`], `queue.rs`). Guest requests become background
//! requests of the engine a round at a time (`submit.rs`); when admission
//! is full the queue leaves the refused chains in the avail ring and
//! resumes when a request ends. Each request has one [`Ticket`], answered
//! exactly once ([`TicketState`]).
//!
//! The rest: `backend.rs` (`VhostUserBackend`), `hiprio.rs`, `request.rs`,
//! `inline.rs`, `lent.rs`, `lock_calls.rs`, `answer.rs`, `notify.rs`, `stop.rs`,
//! `session.rs`, `timeouts.rs`, `migration.rs`, `heads.rs`, `exit_fds.rs`
//! (docs/DESIGN.md, "The virtio-fs device").

use crate::chain::{Chain, ChainError};
use crate::guest_mem::{GuestSpans, MapCache};
use ids::{RqId, Vq, HIPRIO};
use inline::QueueServer;
use notify::{notify, Chunks};
use queue::RequestQueue;
use rings::Used;
use ticket::{Finish, Ticket, TicketState, ORPHAN_ENDED, ORPHAN_NO, ORPHAN_YES};

mod answer;
mod backend;
mod exit_fds;
mod heads;
mod hiprio;
mod ids;
mod inline;
mod lent;
mod lock_calls;
mod migration;
mod notify;
mod poll;
mod queue;
mod request;
mod rings;
mod session;
mod stop;
mod submit;
mod ticket;
mod timeouts;
mod window;
use crate::dirty_log::LogBitmap;
use crate::stats::DeviceStats;
use fuse_core::abi::{
    BatchForgetIn, ForgetIn, ForgetOne, InHeader, InterruptIn, Opcode, OutHeader, WriteIn,
};
use fuse_core::locks::{lock, read, write};
use fuse_core::server::{Engine, EngineConfig, Filesystem, ServerConfig};
use fuse_core::Sent;
use fuse_core::{Args, Errno, ReqResult, TrySendError};
use std::collections::HashMap;
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
    /// The DAX window's size is not a power of two from 2 MiB to 512 MiB.
    #[error("cache window of {0} bytes: a power of two from 2 MiB to 512 MiB is possible")]
    CacheSize(u64),
    /// The SIGBUS handler that guards guest memory backed by mapped files
    /// could not be installed (a DAX window needs it).
    #[error("the DAX window's SIGBUS guard")]
    DaxGuard(#[source] host_io::mapped::MapError),
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
    /// Requests in a chunk of a vring thread serving in line (at least 1):
    /// it pops that many at a time (up to 16 after a round of READs the
    /// page cache held, still served in chunks) and signals their in-line
    /// answers with one guest notification (a slow request at once, and
    /// after a slow or large one the next chunks are single: `chunk_time`); and started
    /// requests (READ, WRITE, FSYNC, FSYNCDIR, FALLOCATE) it lets gather
    /// before it submits them and answers what completed. Small chunks let
    /// a guest that reaps while the device works refill its queue sooner
    /// (cached reads complete at submit; docs/BENCHMARKS.md, the
    /// `--submit-batch` sweep); one chunk for the whole kick (`usize::MAX`)
    /// makes one system call for it all.
    pub submit_batch: usize,
    /// How long a vring thread serves in line before it signals the
    /// answers given so far (and cuts its next chunks to single requests):
    /// a guest waiting on a slow request hears of it without waiting for
    /// the rest of its chunk. A single request that takes a tenth of it is
    /// signalled as soon as it is done. Raise it only to profile the daemon
    /// under a tool that slows it many times over (callgrind), so chunks
    /// are cut as at full speed.
    pub chunk_time: Duration,
    /// The most time a vring thread that serves its queue in line
    /// (`inline_per_batch` all) with no host I/O in flight keeps looking
    /// at its request queue's avail ring after the queue emptied, before
    /// it sleeps until the guest's kick (zero: never). The time adapts to
    /// the guest between zero and this (`device/poll.rs`): a guest that
    /// keeps its queue busy is served without kicks, at the cost of up to
    /// a CPU per request queue meanwhile.
    pub poll_time: Duration,
    /// With `zero_copy`: the guest's RAM regions are registered as fixed
    /// buffers of each serving thread's io_uring on first use (again when
    /// the memory table changes), so data I/O through io_uring goes as
    /// READ_FIXED/WRITE_FIXED (or the vectored forms) at the guest address.
    /// Registration pins all of guest RAM in host memory for as long as
    /// the device runs, which defeats ballooning and overcommit, and I/O
    /// through io_uring then misses pages the VMM discards (a balloon,
    /// virtio-mem): off by default.
    pub fixed_guest_memory: bool,
    /// How long a vring stop (GET_VRING_BASE: before a migration, or when
    /// the guest resets the device) waits for the requests popped from
    /// that vring to be answered, when no `request_timeout` bounds them
    /// (with one, it waits until they timed out). What is still
    /// unanswered then is given up (`DeviceStats::lost_on_stop`); a stop
    /// or reset then waits this long again, at most, for host work of the
    /// given-up requests already under way (`DeviceStats::stuck_on_stop`).
    pub vring_stop_drain: Duration,
    /// The DAX window's size in bytes (zero: no window, the default): the
    /// device offers a shared memory region of this size, and maps host
    /// file ranges into it on the guest's FUSE_SETUPMAPPING
    /// (`device/window.rs`). Needs a frontend with vhost-user shared
    /// memory (QEMU 11.1 or later, docs/DAX.md).
    pub cache_size: u64,
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
            chunk_time: notify::CHUNK_TIME,
            poll_time: poll::POLL_TIME,
            fixed_guest_memory: false,
            vring_stop_drain: stop::VRING_STOP_DRAIN,
            cache_size: 0,
        }
    }
}

struct Inner<F: Filesystem + 'static> {
    engine: Engine<F>,
    cfg: DeviceConfig,
    config_space: Vec<u8>,
    mem: RwLock<Option<GuestMem>>,
    /// Bumped each time `mem` is replaced (after it is): an answer to a
    /// chain translated before goes to the used ring through the current
    /// memory, as vhost-user-backend's own `add_used` did.
    mem_gen: AtomicU64,
    /// Guest RAM as a client map (with `cfg.fixed_guest_memory`).
    maps: MapCache,
    event_idx: AtomicBool,
    acked: AtomicU64,
    /// Each request queue's own state, by [`RqId`] (the hiprio queue has
    /// none: see `ids.rs`).
    queues: Vec<RequestQueue>,
    /// The daemon's vring threads' event loops, by thread index
    /// (`RqId::thread`; to add a request queue's completion eventfd once its thread
    /// has one).
    handlers: Mutex<Vec<Weak<VringEpollHandler<FsDevice<F>>>>>,
    /// What `RequestQueue::busy_since` counts from.
    epoch: Instant,
    /// The hiprio queue's drains and vring (`hiprio.rs`).
    hiprio: hiprio::Hiprio,
    /// Exit-event fds vhost-user-backend leaks (see `exit_event`), closed
    /// when the device goes (`exit_fds.rs`).
    exit_fds: exit_fds::ExitFds,
    /// The counters; per queue by virtqueue index (hiprio first,
    /// `RqId::vq` for a request queue).
    stats: DeviceStats,
    /// The requests the timeout scanner watches (`timeouts.rs`).
    timeouts: timeouts::Timeouts,
    /// Lock calls in flight (`lock_calls.rs`).
    lock_calls: lock_calls::LockCalls,
    /// Live migration: the guest's INIT and the state transfer.
    migration: migration::Migration,
    /// The DAX window (`window.rs`), with `cfg.cache_size`.
    dax: Option<window::DaxWindow>,
}

impl<F: Filesystem + 'static> Inner<F> {
    /// Request queue `q`'s state.
    fn queue(&self, q: RqId) -> &RequestQueue {
        // An `RqId` is only made for a queue the device has.
        &self.queues[q.index()]
    }

    /// The request queue on virtqueue `vq`, if it is one.
    fn request_queue(&self, vq: usize) -> Option<RqId> {
        RqId::from_vq(vq, self.count())
    }

    /// How many request queues the device has (the `count` of `ids.rs`).
    fn count(&self) -> usize {
        self.queues.len()
    }

    /// The counters of virtqueue `vq` (hiprio, or a request queue).
    fn counters(&self, vq: impl Into<Vq>) -> &crate::stats::QueueStats {
        &self.stats.queues()[vq.into().index()]
    }
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
        let dax = match cfg.cache_size {
            0 => None,
            n => Some(window::DaxWindow::new(n).ok_or(DeviceError::CacheSize(n))?),
        };
        if dax.is_some() {
            // Now, before a seccomp filter may refuse rt_sigaction: the
            // window's mappings come back as guest memory (`window.rs`).
            host_io::mapped::install_fence().map_err(DeviceError::DaxGuard)?;
        }
        let mut server = ServerConfig {
            max_write: cfg.max_write,
            ..ServerConfig::default()
        };
        if dax.is_some() {
            // The guest learns the mappings' alignment in INIT, and which
            // files to map from their attributes (FUSE_ATTR_DAX, set by
            // the filesystem) when it mounts with `-o dax=inode`.
            server.flags |=
                fuse_core::abi::init::MAP_ALIGNMENT | fuse_core::abi::init::HAS_INODE_DAX;
        }
        let engine = Engine::start(
            fs,
            EngineConfig {
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
                ..EngineConfig::default()
            },
        )
        .map_err(DeviceError::Engine)?;
        let request_queues = (0..queues)
            .map(|_| RequestQueue::new())
            .collect::<Result<Vec<_>, _>>()
            .map_err(DeviceError::Event)?;
        let inner = Arc::new(Inner {
            engine,
            queues: request_queues,
            handlers: Mutex::new(Vec::new()),
            epoch: Instant::now(),
            hiprio: hiprio::Hiprio::default(),
            exit_fds: exit_fds::ExitFds::default(),
            // The hiprio queue's counters and the request queues'.
            stats: DeviceStats::new(1 + queues),
            config_space,
            mem: RwLock::new(None),
            mem_gen: AtomicU64::new(0),
            maps: MapCache::default(),
            event_idx: AtomicBool::new(false),
            acked: AtomicU64::new(0),
            timeouts: timeouts::Timeouts::new(!cfg.request_timeout.is_zero()),
            lock_calls: lock_calls::LockCalls::default(),
            migration: migration::Migration::default(),
            dax,
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

    /// How many host file ranges the DAX window maps now (0 without a
    /// window).
    pub fn dax_mappings(&self) -> usize {
        self.inner.dax.as_ref().map_or(0, |d| d.mappings())
    }

    /// How many regions of guest memory are files the DAX window mapped
    /// (guarded against a truncation: `DaxWindow::guard`).
    pub fn dax_guarded_regions(&self) -> usize {
        self.inner.dax.as_ref().map_or(0, |d| d.guarded())
    }

    /// Chains of request queue `queue` (1-based; 0 is hiprio) the device
    /// holds now.
    pub fn heads_in_flight(&self, queue: usize) -> usize {
        // The hiprio queue holds none: each chain goes back as it is taken.
        self.inner
            .request_queue(queue)
            .map_or(0, |q| self.inner.queue(q).heads.count())
    }

    /// The engine (its connection counters, the filesystem).
    pub fn engine(&self) -> &Engine<F> {
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
        for q in RqId::all(self.inner.count()) {
            // A request queue's vring runs on its thread (`RqId::thread`).
            let h = handlers
                .get(q.thread())
                .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
            h.register_listener(
                std::os::fd::AsRawFd::as_raw_fd(&self.inner.queue(q).resume),
                EventSet::IN,
                q.resume_event(self.inner.count()),
            )?;
        }
        Ok(())
    }

    /// The eventfd that becomes readable when request queue `i` (0-based)
    /// stalled on admission and may go on; `register_listeners` hands it
    /// to the vring thread of that queue.
    pub fn resume_fd(&self, i: usize) -> Option<std::os::fd::RawFd> {
        let q = RqId::from_index(i, self.inner.count())?;
        Some(std::os::fd::AsRawFd::as_raw_fd(&self.inner.queue(q).resume))
    }

    fn memory(&self) -> Option<GuestMemoryLoadGuard<GuestMmap>> {
        let m = read(&self.inner.mem);
        m.as_ref().map(GuestAddressSpace::memory)
    }

    /// Serves queue `q` until it is empty or stalls.
    fn serve_queue(&self, vring: &Vring, q: Vq) -> Result<(), DeviceError> {
        let event_idx = self.inner.event_idx.load(Ordering::Relaxed);
        let woke = Instant::now();
        if let Vq::Request(q) = q {
            self.woke(q, woke);
        }
        // Passes in a row that popped nothing although more was announced.
        let mut idle = 0;
        loop {
            if event_idx {
                vring.disable_notification().map_err(DeviceError::Vring)?;
            }
            let before = vring.queue_next_avail();
            let stalled = match q {
                Vq::Hiprio => {
                    self.drain_hiprio(vring, hiprio::ForgetsBy::Here);
                    false
                }
                Vq::Request(q) => self.drain_requests(vring, q),
            };
            // A pass that popped may poll for the next (one that popped
            // nothing goes on to the checks below).
            if !stalled && event_idx && vring.queue_next_avail() != before {
                if let Vq::Request(q) = q {
                    if self.poll_avail(vring, q, woke) {
                        idle = 0;
                        continue;
                    }
                }
            }
            if stalled {
                if let Vq::Request(q) = q {
                    self.stalled(q);
                }
            }
            if stalled || !event_idx || !vring.enable_notification().map_err(DeviceError::Vring)? {
                break;
            }
            if vring.queue_next_avail() != before {
                // A guest that keeps refilling the queue keeps this loop
                // going: past the span the thread goes back to its epoll
                // (exit and other events), its resume event bringing it
                // straight back here.
                if let Vq::Request(q) = q {
                    if woke.elapsed() >= self.wake_span() {
                        let _ = self.inner.queue(q).resume.write(1);
                        break;
                    }
                }
                idle = 0;
                continue;
            }
            // More is announced but nothing was popped. Once, that is a
            // chain published after the drain read the avail index: one
            // more pass pops it. Twice in a row, an avail index the queue
            // refuses (more than a vring's size ahead) or an unreadable head:
            // stop rather than spin; the next kick retries.
            idle += 1;
            if idle == 2 {
                self.inner.counters(q).add_malformed(1);
                break;
            }
        }
        Ok(())
    }
}

impl<F: Filesystem + 'static> Drop for Inner<F> {
    fn drop(&mut self) {
        // The device outlives the daemon's vring threads (each holds a
        // clone): their exit eventfds are unused now.
        // SAFETY: each vring thread holds a clone of the device, so the
        // last one is gone when its inner part is dropped.
        unsafe { self.exit_fds.close_all() };
    }
}
