//! A guest kernel's virtqueue driver, for load generation and tests: over a
//! vhost-user connection of its own (guest memory in a memfd), one thread
//! per request queue posts many chains, kicks once, sleeps until the
//! device signals, reaps the used ring and reposts, with
//! VIRTIO_RING_F_EVENT_IDX negotiated as Linux guests run it.
//!
//! Unlike [`crate::testing::frontend`] (the engine as the guest: a thread per
//! caller, each request alone), this is the shape a device sees from a
//! guest under `fio --iodepth=N`: N chains in flight from one thread, one
//! kick and one interrupt per batch. Requests are FUSE bytes built here;
//! chains are laid out as Linux's virtio-fs lays them out (the request,
//! then for a READ the out header and the data pages, page-aligned, as
//! separate descriptors; for a WRITE the data pages after the request).

use super::window::FrontendWindow;
use fuse_core::abi::{init, ForgetIn, InHeader, InitIn, InitOut, Opcode, OutHeader};
use std::fs::File;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{Frontend, FrontendReqHandler, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

const VIRTIO_F_VERSION_1: u64 = 1 << 32;
const VIRTIO_RING_F_EVENT_IDX: u64 = 1 << 29;
const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;
const PAGE: u64 = 4096;
/// Per slot: the request (header and arguments) and the reply (out header
/// and small reply payloads) get a page each.
const SLOT_HEAD: u64 = 2 * PAGE;
/// Descriptors per slot: request, data (WRITE) | out header, data (READ).
const DESCS: u16 = 4;

/// Errors of the guest driver.
#[derive(Debug, Error)]
pub enum GuestError {
    /// The vhost-user conversation failed.
    #[error("vhost-user: {0}")]
    Vhost(#[source] vhost::Error),
    /// The back-end channel could not be made.
    #[error("back-end channel: {0}")]
    BackendChannel(#[source] vhost::vhost_user::Error),
    /// Guest memory or an eventfd could not be made.
    #[error("setting up the guest")]
    Setup(#[source] std::io::Error),
    /// Guest memory could not be mapped or accessed.
    #[error("guest memory: {0}")]
    Memory(String),
    /// The device answered with an error.
    #[error("{0:?} failed: errno {1}")]
    Fuse(Opcode, i32),
    /// The device answered something that is no reply to the request.
    #[error("a reply that does not match its request ({0})")]
    BadReply(&'static str),
    /// Nothing came back in time.
    #[error("no reply within {0:?}")]
    Timeout(Duration),
    /// The configuration cannot work.
    #[error("{0}")]
    Config(&'static str),
}

/// How the guest sets itself up.
#[derive(Debug, Clone)]
pub struct GuestConfig {
    /// Request queues (the backend must offer them).
    pub request_queues: u16,
    /// Virtqueue size (a power of two, at most 1024).
    pub queue_size: u16,
    /// Chains each request queue may have in flight (at most a quarter of
    /// the queue size: a chain has up to four descriptors).
    pub slots: u16,
    /// Data bytes a slot can carry (the largest READ or WRITE).
    pub slot_data: u64,
    /// Negotiate VIRTIO_RING_F_EVENT_IDX when offered (Linux guests do).
    pub event_idx: bool,
}

impl Default for GuestConfig {
    fn default() -> Self {
        GuestConfig {
            request_queues: 1,
            queue_size: 128,
            slots: 32,
            slot_data: 1 << 20,
            event_idx: true,
        }
    }
}

/// One virtqueue as its driver sees it.
struct Vq {
    index: usize,
    size: u16,
    desc: u64,
    avail: u64,
    used: u64,
    /// Where this queue's slots begin.
    slots: u64,
    kick: EventFd,
    call: EventFd,
    /// Next free position of the avail ring (the driver's own index).
    avail_idx: u16,
    /// Used ring entries consumed so far.
    last_used: u16,
}

/// A request to place in a slot.
#[derive(Debug, Clone, Copy)]
pub struct Req<'a> {
    /// Opcode.
    pub opcode: Opcode,
    /// Target node.
    pub nodeid: u64,
    /// The arguments after `fuse_in_header`.
    pub args: &'a [u8],
    /// Data bytes sent from the slot's data pages after the arguments
    /// (a WRITE's data, as a descriptor of its own).
    pub data_out: u32,
    /// Reply payload room after the out header: up to a page in the reply
    /// page, more as the slot's data pages (a READ's data).
    pub reply: u32,
}

/// What came back for a slot.
#[derive(Debug, Clone, Copy)]
pub struct Done {
    /// The slot.
    pub slot: u16,
    /// The reply's out header.
    pub out: OutHeader,
    /// Bytes the device said it wrote.
    pub used_len: u32,
    /// How long the chain was out, from publication to reaping.
    pub latency: Duration,
}

/// The guest: memory, virtqueues, and the vhost-user connection.
pub struct GuestDriver {
    fe: Frontend,
    mem: GuestMemoryMmap,
    _memfd: File,
    /// 0: hiprio, then the request queues.
    vqs: Vec<Vq>,
    cfg: GuestConfig,
    event_idx: bool,
    unique: u64,
    peer_pid: Option<u32>,
    /// Per request queue and slot: when it was published and its unique.
    posted: Vec<Vec<(Instant, u64)>>,
    /// FORGETs out on the hiprio queue (at most [`HIPRIO_SLOTS`]).
    forgets_out: u16,
    /// The DAX window's frontend side ([`GuestDriver::connect_with_window`]).
    window: Option<Arc<FrontendWindow>>,
    /// The back-end channel, served while the driver lives.
    backend_channel: Option<BackendChannel>,
}

impl Drop for GuestDriver {
    fn drop(&mut self) {
        // The back-end channel stops first, while the connection is up.
        drop(self.backend_channel.take());
    }
}

/// The frontend's end of the back-end channel: its socket (a duplicate,
/// to shut it down) and the thread that serves it, stopped on drop.
struct BackendChannel {
    fd: OwnedFd,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for BackendChannel {
    fn drop(&mut self) {
        // SAFETY: shutdown of a socket this channel owns a descriptor of.
        unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Slots of the hiprio queue (FORGETs: a request page each, no reply).
const HIPRIO_SLOTS: u16 = 4;

impl std::fmt::Debug for GuestDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestDriver")
            .field("cfg", &self.cfg)
            .field("event_idx", &self.event_idx)
            .finish_non_exhaustive()
    }
}

/// The pid of the process at the other end of a Unix socket.
fn peer_pid(s: &UnixStream) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid out-pointers of the sizes given.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0 && cred.pid > 0).then_some(cred.pid as u32)
}

fn vhost(e: vhost::Error) -> GuestError {
    GuestError::Vhost(e)
}

impl GuestDriver {
    /// Connects to the backend at `socket` and sets up memory and queues
    /// (no FUSE yet: see [`GuestDriver::init`]).
    pub fn connect(socket: &std::path::Path, cfg: &GuestConfig) -> Result<Self, GuestError> {
        Self::connect_inner(socket, cfg, false)
    }

    /// [`GuestDriver::connect`], also taking the backend's DAX window: it
    /// negotiates vhost-user shared memory and the back-end channel, asks
    /// for the window's size (GET_SHMEM_CONFIG) and serves the backend's
    /// map requests with a [`FrontendWindow`] ([`GuestDriver::window`]).
    pub fn connect_with_window(
        socket: &std::path::Path,
        cfg: &GuestConfig,
    ) -> Result<Self, GuestError> {
        Self::connect_inner(socket, cfg, true)
    }

    fn connect_inner(
        socket: &std::path::Path,
        cfg: &GuestConfig,
        dax: bool,
    ) -> Result<Self, GuestError> {
        let size = cfg.queue_size;
        if !size.is_power_of_two() || size > 1024 || cfg.slots == 0 || cfg.slots > size / DESCS {
            return Err(GuestError::Config(
                "queue size must be a power of two up to 1024, and slots at most a quarter of it",
            ));
        }
        let nq = usize::from(cfg.request_queues.max(1)) + 1;
        let data = cfg.slot_data.next_multiple_of(PAGE);
        // Per queue: descriptors, avail and used rings (page-aligned), then
        // the slots (hiprio gets a few small ones).
        let vring_bytes = (16 * u64::from(size)).next_multiple_of(PAGE)
            + (6 + 2 * u64::from(size)).next_multiple_of(PAGE)
            + (6 + 8 * u64::from(size)).next_multiple_of(PAGE);
        let mut layout = Vec::new();
        let mut at = 0u64;
        for q in 0..nq {
            let slots = if q == 0 {
                u64::from(HIPRIO_SLOTS)
            } else {
                u64::from(cfg.slots)
            };
            layout.push(at);
            at += vring_bytes + slots * (SLOT_HEAD + if q == 0 { 0 } else { data });
        }
        let file = super::memfd(at).map_err(GuestError::Setup)?;
        let fo = FileOffset::new(file.try_clone().map_err(GuestError::Setup)?, 0);
        let mem =
            GuestMemoryMmap::from_ranges_with_files(&[(GuestAddress(0), at as usize, Some(fo))])
                .map_err(|e| GuestError::Memory(format!("{e:?}")))?;
        let host = mem
            .get_host_address(GuestAddress(0))
            .map_err(|e| GuestError::Memory(format!("{e}")))? as u64;

        let stream = UnixStream::connect(socket).map_err(GuestError::Setup)?;
        let peer = peer_pid(&stream);
        let mut fe = Frontend::from_stream(stream, nq as u64);
        fe.set_owner().map_err(vhost)?;
        let offered = fe.get_features().map_err(vhost)?;
        let mut want = VIRTIO_F_VERSION_1 | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        if cfg.event_idx {
            want |= VIRTIO_RING_F_EVENT_IDX;
        }
        let features = offered & want;
        fe.set_features(features).map_err(vhost)?;
        let (mut window, mut backend_channel) = (None, None);
        if features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0 {
            let pf = fe.get_protocol_features().map_err(vhost)?;
            let mut keep = VhostUserProtocolFeatures::MQ;
            if dax {
                keep |= VhostUserProtocolFeatures::SHMEM
                    | VhostUserProtocolFeatures::BACKEND_REQ
                    | VhostUserProtocolFeatures::REPLY_ACK
                    | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS;
            }
            fe.set_protocol_features(pf & keep).map_err(vhost)?;
            // As QEMU does: the back-end channel before anything else, so
            // the device has it before any request can come.
            if dax {
                let (w, c) = Self::take_window(&mut fe)?;
                window = Some(w);
                backend_channel = Some(c);
            }
            if fe.get_queue_num().map_err(vhost)? < nq as u64 {
                return Err(GuestError::Config(
                    "the backend has fewer queues than asked",
                ));
            }
        }
        fe.set_mem_table(&[VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: at,
            userspace_addr: host,
            mmap_offset: 0,
            mmap_handle: file.as_raw_fd(),
        }])
        .map_err(vhost)?;
        let mut vqs = Vec::new();
        for (q, &base) in layout.iter().enumerate() {
            let desc = base;
            let avail = desc + (16 * u64::from(size)).next_multiple_of(PAGE);
            let used = avail + (6 + 2 * u64::from(size)).next_multiple_of(PAGE);
            let kick = EventFd::new(0).map_err(GuestError::Setup)?;
            let call = EventFd::new(0).map_err(GuestError::Setup)?;
            fe.set_vring_num(q, size).map_err(vhost)?;
            fe.set_vring_addr(
                q,
                &VringConfigData {
                    queue_max_size: size,
                    queue_size: size,
                    flags: 0,
                    desc_table_addr: host + desc,
                    used_ring_addr: host + used,
                    avail_ring_addr: host + avail,
                    log_addr: None,
                },
            )
            .map_err(vhost)?;
            fe.set_vring_base(q, 0).map_err(vhost)?;
            fe.set_vring_call(q, &call).map_err(vhost)?;
            fe.set_vring_kick(q, &kick).map_err(vhost)?;
            vqs.push(Vq {
                index: q,
                size,
                desc,
                avail,
                used,
                slots: base + vring_bytes,
                kick,
                call,
                avail_idx: 0,
                last_used: 0,
            });
        }
        if features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0 {
            for q in 0..nq {
                fe.set_vring_enable(q, true).map_err(vhost)?;
            }
        }
        let posted = (0..nq)
            .map(|_| vec![(Instant::now(), 0); usize::from(cfg.slots)])
            .collect();
        Ok(GuestDriver {
            fe,
            mem,
            _memfd: file,
            vqs,
            event_idx: features & VIRTIO_RING_F_EVENT_IDX != 0,
            cfg: GuestConfig {
                slot_data: data,
                ..cfg.clone()
            },
            unique: 0,
            peer_pid: peer,
            posted,
            forgets_out: 0,
            window,
            backend_channel,
        })
    }

    /// The window's size from the backend, and a thread serving its map
    /// requests on a new back-end channel.
    fn take_window(fe: &mut Frontend) -> Result<(Arc<FrontendWindow>, BackendChannel), GuestError> {
        let c = fe.get_shmem_config().map_err(vhost)?;
        if c.nregions != 1 {
            return Err(GuestError::Config("the backend has no DAX window"));
        }
        let window = Arc::new(FrontendWindow::new(c.memory_sizes[0]).map_err(GuestError::Setup)?);
        let mut handler =
            FrontendReqHandler::new(window.clone()).map_err(GuestError::BackendChannel)?;
        handler.set_reply_ack_flag(true);
        let tx = handler.get_tx_raw_fd();
        // SAFETY: `tx` is open for as long as `handler` lives (below).
        let dup = unsafe { BorrowedFd::borrow_raw(tx) }
            .try_clone_to_owned()
            .map_err(GuestError::Setup)?;
        fe.set_backend_request_fd(&tx).map_err(vhost)?;
        // A refused request was answered (a nack): it keeps serving.
        let thread = std::thread::spawn(move || {
            while let Ok(_) | Err(vhost::vhost_user::Error::ReqHandlerError(_)) =
                handler.handle_request()
            {}
        });
        Ok((
            window,
            BackendChannel {
                fd: dup,
                thread: Some(thread),
            },
        ))
    }

    /// The vhost-user connection, to send more messages (ADD_MEM_REG of a
    /// window mapping, as QEMU does).
    pub fn frontend_mut(&mut self) -> &mut Frontend {
        &mut self.fe
    }

    /// The DAX window's frontend side, after
    /// [`GuestDriver::connect_with_window`].
    pub fn window(&self) -> Option<&Arc<FrontendWindow>> {
        self.window.as_ref()
    }

    /// Whether VIRTIO_RING_F_EVENT_IDX is in force.
    pub fn event_idx(&self) -> bool {
        self.event_idx
    }

    /// The backend's pid, from the socket (SO_PEERCRED).
    pub fn backend_pid(&self) -> Option<u32> {
        self.peer_pid
    }

    /// Slots per request queue.
    pub fn slots(&self) -> u16 {
        self.cfg.slots
    }

    fn slot_base(&self, q: usize, slot: u16) -> u64 {
        self.vqs[q].slots + u64::from(slot) * (SLOT_HEAD + self.cfg.slot_data)
    }

    /// The slot's data pages (page-aligned, `slot_data` bytes).
    pub fn slot_data(&self, q: usize, slot: u16) -> GuestAddress {
        GuestAddress(self.slot_base(q, slot) + SLOT_HEAD)
    }

    /// Where a small reply's payload is (after the out header, in the
    /// slot's reply page).
    pub fn reply_payload(&self, q: usize, slot: u16) -> GuestAddress {
        GuestAddress(self.slot_base(q, slot) + PAGE + 16)
    }

    /// Where request queue `q`'s used ring is (0: hiprio's).
    pub fn used_ring(&self, q: usize) -> GuestAddress {
        GuestAddress(self.vqs[q].used)
    }

    /// Guest memory (to fill a WRITE's data or check a READ's).
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    fn desc(&self, q: usize, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&addr.to_le_bytes());
        b[8..12].copy_from_slice(&len.to_le_bytes());
        b[12..14].copy_from_slice(&flags.to_le_bytes());
        b[14..].copy_from_slice(&next.to_le_bytes());
        let _ = self
            .mem
            .write_slice(&b, GuestAddress(self.vqs[q].desc + 16 * u64::from(i)));
    }

    /// Writes `r` into slot `slot` of request queue `q` and adds its head
    /// to the avail ring (not yet published: see [`GuestDriver::publish`]).
    /// Returns the unique it was given.
    pub fn post(&mut self, q: usize, slot: u16, r: &Req<'_>) -> Result<u64, GuestError> {
        if slot >= self.cfg.slots
            || u64::from(r.data_out) > self.cfg.slot_data
            || u64::from(r.reply.saturating_sub(PAGE as u32 - 16)) > self.cfg.slot_data
            || r.args.len() + 40 > PAGE as usize
        {
            return Err(GuestError::Config("a request larger than its slot"));
        }
        self.unique += 2;
        let unique = self.unique;
        let base = self.slot_base(q, slot);
        let (req_at, out_at, data_at) = (base, base + PAGE, base + SLOT_HEAD);
        let h = InHeader {
            len: (40 + r.args.len() + r.data_out as usize) as u32,
            opcode: r.opcode as u32,
            unique,
            nodeid: r.nodeid,
            uid: 0,
            gid: 0,
            pid: 1,
            total_extlen: 0,
            padding: 0,
        };
        let mut msg = [0u8; PAGE as usize];
        msg[..40].copy_from_slice(h.as_bytes());
        msg[40..40 + r.args.len()].copy_from_slice(r.args);
        let n = 40 + r.args.len();
        self.mem
            .write_slice(&msg[..n], GuestAddress(req_at))
            .map_err(|e| GuestError::Memory(e.to_string()))?;
        let head = slot * DESCS;
        let mut chain: [(u64, u32, u16); 4] = [(0, 0, 0); 4];
        let mut k = 0;
        chain[k] = (req_at, n as u32, 0);
        k += 1;
        if r.data_out > 0 {
            chain[k] = (data_at, r.data_out, 0);
            k += 1;
        }
        // The out header and small payloads in the reply page; a larger
        // payload (a READ's data) in the data pages.
        if r.reply <= PAGE as u32 - 16 {
            chain[k] = (out_at, 16 + r.reply, F_WRITE);
            k += 1;
        } else {
            chain[k] = (out_at, 16, F_WRITE);
            k += 1;
            chain[k] = (data_at, r.reply, F_WRITE);
            k += 1;
        }
        for (d, (i, &(addr, len, flags))) in (head..).zip(chain[..k].iter().enumerate()) {
            let last = i + 1 == k;
            let f = flags | if last { 0 } else { F_NEXT };
            self.desc(q, d, addr, len, f, d + 1);
        }
        let vq = &mut self.vqs[q];
        let pos = vq.avail + 4 + 2 * u64::from(vq.avail_idx % vq.size);
        let _ = self.mem.write_obj(head, GuestAddress(pos));
        vq.avail_idx = vq.avail_idx.wrapping_add(1);
        self.posted[q][usize::from(slot)] = (Instant::now(), unique);
        Ok(unique)
    }

    /// Sends a FORGET of `nlookup` lookups of `nodeid` on the hiprio queue,
    /// as a guest kernel does when it evicts an inode (after the UNLINK of
    /// a file it no longer holds open, at once): a readable chain, given
    /// back unused. Waits (up to `timeout`) while every hiprio slot is out.
    pub fn forget(
        &mut self,
        nodeid: u64,
        nlookup: u64,
        timeout: Duration,
    ) -> Result<(), GuestError> {
        if self.vqs[0].size < HIPRIO_SLOTS * DESCS {
            // The slots' heads would not fit the hiprio queue.
            return Err(GuestError::Config(
                "FORGET needs a queue size of at least 16 (the hiprio queue's four slots)",
            ));
        }
        let t0 = Instant::now();
        loop {
            // Take back what the device is done with (in order: the device
            // answers the hiprio queue in the order it pops).
            let vq = &mut self.vqs[0];
            let used: u16 = self
                .mem
                .read_obj(GuestAddress(vq.used + 2))
                .map_err(|e| GuestError::Memory(e.to_string()))?;
            let back = used.wrapping_sub(vq.last_used);
            vq.last_used = used;
            self.forgets_out = self.forgets_out.saturating_sub(back);
            if self.forgets_out < HIPRIO_SLOTS {
                break;
            }
            if t0.elapsed() >= timeout {
                return Err(GuestError::Timeout(timeout));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        self.unique += 2;
        let h = InHeader {
            len: (40 + std::mem::size_of::<ForgetIn>()) as u32,
            opcode: Opcode::Forget as u32,
            unique: self.unique,
            nodeid,
            uid: 0,
            gid: 0,
            pid: 1,
            total_extlen: 0,
            padding: 0,
        };
        let f = ForgetIn { nlookup };
        let vq = &self.vqs[0];
        // The slots go round with the avail index: at most HIPRIO_SLOTS
        // are out, so the one this index names is free.
        let slot = vq.avail_idx % HIPRIO_SLOTS;
        let at = vq.slots + u64::from(slot) * SLOT_HEAD;
        let mut msg = [0u8; 40 + 8];
        msg[..40].copy_from_slice(h.as_bytes());
        msg[40..].copy_from_slice(f.as_bytes());
        self.mem
            .write_slice(&msg, GuestAddress(at))
            .map_err(|e| GuestError::Memory(e.to_string()))?;
        let head = slot * DESCS;
        self.desc(0, head, at, msg.len() as u32, 0, 0);
        let vq = &mut self.vqs[0];
        let pos = vq.avail + 4 + 2 * u64::from(vq.avail_idx % vq.size);
        let _ = self.mem.write_obj(head, GuestAddress(pos));
        vq.avail_idx = vq.avail_idx.wrapping_add(1);
        self.forgets_out += 1;
        self.publish(0);
        Ok(())
    }

    /// Publishes what was posted since the last call and kicks the device
    /// if it asked to be kicked (EVENT_IDX), or always without it.
    /// Returns whether it kicked.
    pub fn publish(&mut self, q: usize) -> bool {
        let vq = &self.vqs[q];
        let old: u16 = self
            .mem
            .read_obj(GuestAddress(vq.avail + 2))
            .unwrap_or(vq.avail_idx);
        let new = vq.avail_idx;
        if old == new {
            return false;
        }
        // The avail ring entries before the index that publishes them.
        fence(Ordering::SeqCst);
        let _ = self.mem.write_obj(new, GuestAddress(vq.avail + 2));
        // The index before reading whether the device wants a kick.
        fence(Ordering::SeqCst);
        let kick = if self.event_idx {
            let event: u16 = self
                .mem
                .read_obj(GuestAddress(vq.used + 4 + 8 * u64::from(vq.size)))
                .unwrap_or(old);
            new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
        } else {
            true
        };
        if kick {
            let _ = vq.kick.write(1);
        }
        kick
    }

    /// Takes what the device has given back on request queue `q`, without
    /// waiting.
    pub fn reap(&mut self, q: usize, out: &mut Vec<Done>) -> Result<usize, GuestError> {
        let n0 = out.len();
        let now = Instant::now();
        let vq = &mut self.vqs[q];
        let used: u16 = self
            .mem
            .read_obj(GuestAddress(vq.used + 2))
            .map_err(|e| GuestError::Memory(e.to_string()))?;
        // The index before the entries it covers.
        fence(Ordering::SeqCst);
        while vq.last_used != used {
            let e = vq.used + 4 + 8 * u64::from(vq.last_used % vq.size);
            let id: u32 = self.mem.read_obj(GuestAddress(e)).unwrap_or(u32::MAX);
            let len: u32 = self.mem.read_obj(GuestAddress(e + 4)).unwrap_or(0);
            vq.last_used = vq.last_used.wrapping_add(1);
            if id % u32::from(DESCS) != 0 || id / u32::from(DESCS) >= u32::from(self.cfg.slots) {
                return Err(GuestError::BadReply("a used id that names no chain"));
            }
            let slot = (id / u32::from(DESCS)) as u16;
            let out_at = vq.slots + u64::from(slot) * (SLOT_HEAD + self.cfg.slot_data) + PAGE;
            let mut b = [0u8; 16];
            self.mem
                .read_slice(&mut b, GuestAddress(out_at))
                .map_err(|e| GuestError::Memory(e.to_string()))?;
            let oh = OutHeader::read_from_bytes(&b).unwrap_or_default();
            let (t, unique) = self.posted[q][usize::from(slot)];
            if oh.unique != unique {
                return Err(GuestError::BadReply("unique"));
            }
            out.push(Done {
                slot,
                out: oh,
                used_len: len,
                latency: now.duration_since(t),
            });
        }
        Ok(out.len() - n0)
    }

    /// Waits until the device signals request queue `q` (or `timeout`
    /// passes), as a guest sleeps until an interrupt: with EVENT_IDX it
    /// first asks for one at the next used entry, then looks once more.
    pub fn wait(&mut self, q: usize, timeout: Duration) -> Result<(), GuestError> {
        let vq = &self.vqs[q];
        if self.event_idx {
            let at = GuestAddress(vq.avail + 4 + 2 * u64::from(vq.size));
            let _ = self.mem.write_obj(vq.last_used, at);
            fence(Ordering::SeqCst);
        }
        let used: u16 = self
            .mem
            .read_obj(GuestAddress(vq.used + 2))
            .unwrap_or(vq.last_used);
        if used != vq.last_used {
            return Ok(());
        }
        let mut p = libc::pollfd {
            fd: vq.call.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n == 0 {
            return Err(GuestError::Timeout(timeout));
        }
        let _ = vq.call.read();
        Ok(())
    }

    /// Sends one request on queue `q` (slot 0) and waits for its reply:
    /// for setting up (INIT, lookups, opens). Returns the out header and
    /// the reply payload (at most `r.reply` bytes).
    pub fn call(&mut self, q: usize, r: &Req<'_>) -> Result<(OutHeader, Vec<u8>), GuestError> {
        self.post(q, 0, r)?;
        self.publish(q);
        let mut done = Vec::new();
        let t = Instant::now();
        while done.is_empty() {
            let left = Duration::from_secs(30).saturating_sub(t.elapsed());
            if left.is_zero() {
                return Err(GuestError::Timeout(Duration::from_secs(30)));
            }
            self.wait(q, left)?;
            self.reap(q, &mut done)?;
        }
        let d = done[0];
        let plen = (d.out.len as usize)
            .saturating_sub(16)
            .min(r.reply as usize);
        let mut payload = vec![0u8; plen];
        let at = if r.reply <= PAGE as u32 - 16 {
            GuestAddress(self.slot_base(q, 0) + PAGE + 16)
        } else {
            self.slot_data(q, 0)
        };
        self.mem
            .read_slice(&mut payload, at)
            .map_err(|e| GuestError::Memory(e.to_string()))?;
        if d.out.error != 0 {
            return Err(GuestError::Fuse(r.opcode, -d.out.error));
        }
        Ok((d.out, payload))
    }

    /// FUSE INIT on request queue 1, as a Linux guest asks it. Returns the
    /// device's answer.
    pub fn init(&mut self) -> Result<InitOut, GuestError> {
        self.init_offering(0)
    }

    /// [`GuestDriver::init`], offering `extra` INIT flags too.
    pub fn init_offering(&mut self, extra: u64) -> Result<InitOut, GuestError> {
        let flags = extra
            | init::ASYNC_READ
            | init::POSIX_LOCKS
            | init::ATOMIC_O_TRUNC
            | init::BIG_WRITES
            | init::DONT_MASK
            | init::FLOCK_LOCKS
            | init::DO_READDIRPLUS
            | init::READDIRPLUS_AUTO
            | init::ASYNC_DIO
            | init::PARALLEL_DIROPS
            | init::HANDLE_KILLPRIV_V2
            | init::MAX_PAGES
            | init::INIT_EXT
            | init::SETXATTR_EXT;
        let (f1, f2) = init::split(flags);
        let i = InitIn {
            major: 7,
            minor: 38,
            max_readahead: 128 * 1024,
            flags: f1,
            flags2: f2,
            ..InitIn::new_zeroed()
        };
        let (_, b) = self.call(
            1,
            &Req {
                opcode: Opcode::Init,
                nodeid: 0,
                args: i.as_bytes(),
                data_out: 0,
                reply: 64,
            },
        )?;
        InitOut::read_from_prefix(&b)
            .map(|(o, _)| o)
            .map_err(|_| GuestError::BadReply("INIT"))
    }

    /// The vhost-user connection (to send more messages).
    pub fn frontend(&self) -> &Frontend {
        &self.fe
    }

    /// The virtqueue index of request queue `q` (1-based) and of hiprio (0).
    pub fn queue_index(&self, q: usize) -> usize {
        self.vqs[q].index
    }
}
