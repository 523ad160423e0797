//! The engine as a guest: a vhost-user-fs frontend with no VM.
//!
//! [`VhostFrontend::connect`] connects to any vhost-user-fs socket (fusebox
//! or virtiofsd), shares memfd "guest memory", sets up the hiprio queue and
//! N request queues as a driver would, and puts a fuse-core [`Chan`] on
//! top, its in-process device end pumped into the virtqueues: the guest's
//! FUSE client is the engine itself, and [`Client`] calls go through it.
//!
//! Threads: one submitter reads requests from the engine's device end and
//! places each in a free slot of a queue (FORGET and INTERRUPT on hiprio,
//! the others round-robin over the request queues); one completer per
//! queue waits on its call eventfd, reads the used ring and hands each
//! reply back to the engine. A slot (under its queue's `state` mutex) is
//! `Free` or `InFlight`: the submitter claims it, the completer frees it.

use fuse_core::abi::{InHeader, Opcode, OutHeader};
use fuse_core::client::Client;
use fuse_core::locks::{lock, wait};
use fuse_core::{Chan, ChanConfig, Device, Errno};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use thiserror::Error;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;
use zerocopy::FromBytes;

const VIRTIO_F_VERSION_1: u64 = 1 << 32;
const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;
/// Room for one queue's vring (descriptor table, avail and used rings).
const VRING_AREA: u64 = 64 * 1024;
/// Where a reply's out header goes in its slot: its data then starts on a
/// page, as a guest kernel's READ pages do (so a backend can do O_DIRECT
/// straight into them). Each slot has a page to spare for this.
const OUT_PAD: u64 = 4096 - std::mem::size_of::<OutHeader>() as u64;
/// The same for a WRITE's data after its two headers.
const WRITE_PAD: u64 = 4096 - 80;

/// Errors setting up or running the frontend.
#[derive(Debug, Error)]
pub enum FrontendError {
    /// The vhost-user conversation failed.
    #[error("vhost-user: {0}")]
    Vhost(#[source] vhost::Error),
    /// Guest memory could not be made.
    #[error("guest memory")]
    Memory(#[source] std::io::Error),
    /// Guest memory could not be mapped.
    #[error("mapping guest memory: {0}")]
    Map(String),
    /// An eventfd or a thread could not be made.
    #[error("event or thread")]
    Event(#[source] std::io::Error),
    /// The backend has fewer queues than asked for.
    #[error("the backend offers {offered} queues, {wanted} wanted")]
    Queues {
        /// Queues the backend has.
        offered: u64,
        /// Queues asked for (hiprio included).
        wanted: u64,
    },
    /// INIT through the device failed.
    #[error("FUSE INIT: {0}")]
    Init(Errno),
}

/// How the frontend sets itself up.
#[derive(Debug, Clone)]
pub struct FrontendConfig {
    /// Request queues to use (the backend must offer them).
    pub request_queues: u16,
    /// Descriptors per queue (two per request).
    pub queue_size: u16,
    /// Largest request or reply (max_write plus headers).
    pub max_msg: usize,
    /// max_background the engine starts with (the server's INIT may change
    /// it).
    pub max_background: u32,
    /// INIT flags offered on top of the engine's usual ones (e.g.
    /// FUSE_SECURITY_CTX, as a guest kernel with an LSM offers).
    pub offer_flags: u64,
    /// A guest that arrives with its session (a live migration's
    /// destination): no INIT is sent, the engine takes up what the session
    /// negotiated, as the guest kernel keeps it. (A new INIT would start a
    /// new session, ending the one the backend took up.)
    pub resume: Option<fuse_core::Negotiated>,
}

impl Default for FrontendConfig {
    fn default() -> Self {
        FrontendConfig {
            request_queues: 1,
            queue_size: 128,
            max_msg: (1 << 20) + 4096,
            max_background: 64,
            offer_flags: 0,
            resume: None,
        }
    }
}

/// A slot's state: free, or carrying the request with this unique.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Free,
    InFlight(u64),
}

/// Vring addresses and slot buffers of one queue, and its slot table.
struct Queue {
    size: u16,
    desc: u64,
    avail: u64,
    used: u64,
    bufs: u64,
    slots: u16,
    kick: EventFd,
    call: EventFd,
    /// Guarded by its own mutex (a leaf): slot states and the avail index.
    state: Mutex<QueueState>,
    freed: Condvar,
    requests: AtomicU64,
}

struct QueueState {
    slots: Vec<Slot>,
    avail_idx: u16,
}

struct Shared {
    mem: GuestMemoryMmap,
    queues: Vec<Queue>,
    max_msg: u64,
    stop: AtomicBool,
}

impl Queue {
    fn slot_in(&self, s: u16, max: u64) -> u64 {
        self.bufs + u64::from(s) * 2 * max
    }
    fn slot_out(&self, s: u16, max: u64) -> u64 {
        self.slot_in(s, max) + max
    }
}

/// The engine connected to a vhost-user-fs backend as its guest.
pub struct VhostFrontend {
    client: Client,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    frontend: Frontend,
    /// The guest memory's memfd.
    memfd: File,
}

impl std::fmt::Debug for VhostFrontend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VhostFrontend")
            .field("queues", &self.shared.queues.len())
            .finish_non_exhaustive()
    }
}

impl VhostFrontend {
    /// Connects to the backend at `socket`, sets up memory and queues, and
    /// performs FUSE INIT through them.
    pub fn connect(socket: &std::path::Path, cfg: &FrontendConfig) -> Result<Self, FrontendError> {
        let nq = usize::from(cfg.request_queues.max(1)) + 1;
        // A power of two (as the backend requires), room for hiprio's slots.
        let size = cfg.queue_size.clamp(16, 1024).next_power_of_two();
        // Each slot half has a page to spare: see OUT_PAD and WRITE_PAD.
        let max = (cfg.max_msg as u64 + 4096).next_multiple_of(4096);
        // Hiprio only carries FORGETs and INTERRUPTs; request queues get one
        // slot per two descriptors.
        let slots_of = |q: usize| if q == 0 { 8 } else { size / 2 };
        let mut layout = Vec::new();
        let mut at = 0u64;
        for q in 0..nq {
            let vring = at;
            at += VRING_AREA;
            layout.push((vring, at));
            at += u64::from(slots_of(q)) * 2 * max;
        }
        let mem_size = at;
        let file = super::memfd(mem_size).map_err(FrontendError::Memory)?;
        let fo = FileOffset::new(file.try_clone().map_err(FrontendError::Memory)?, 0);
        let mem = GuestMemoryMmap::from_ranges_with_files(&[(
            GuestAddress(0),
            mem_size as usize,
            Some(fo),
        )])
        .map_err(|e| FrontendError::Map(format!("{e:?}")))?;
        let host = mem
            .get_host_address(GuestAddress(0))
            .map_err(|e| FrontendError::Map(format!("{e}")))? as u64;

        let mut fe = Frontend::connect(socket, nq as u64).map_err(FrontendError::Vhost)?;
        fe.set_owner().map_err(FrontendError::Vhost)?;
        let offered = fe.get_features().map_err(FrontendError::Vhost)?;
        let features =
            offered & (VIRTIO_F_VERSION_1 | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits());
        fe.set_features(features).map_err(FrontendError::Vhost)?;
        if features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0 {
            let pf = fe.get_protocol_features().map_err(FrontendError::Vhost)?;
            fe.set_protocol_features(pf & VhostUserProtocolFeatures::MQ)
                .map_err(FrontendError::Vhost)?;
            let offered = fe.get_queue_num().map_err(FrontendError::Vhost)?;
            if offered < nq as u64 {
                return Err(FrontendError::Queues {
                    offered,
                    wanted: nq as u64,
                });
            }
        }
        fe.set_mem_table(&[VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: mem_size,
            userspace_addr: host,
            mmap_offset: 0,
            mmap_handle: file.as_raw_fd(),
        }])
        .map_err(FrontendError::Vhost)?;
        let mut queues = Vec::new();
        for (q, &(vring, bufs)) in layout.iter().enumerate() {
            let (desc, avail, used) = (vring, vring + 16 * u64::from(size), vring + 32 * 1024);
            let kick = EventFd::new(0).map_err(FrontendError::Event)?;
            let call = EventFd::new(0).map_err(FrontendError::Event)?;
            fe.set_vring_num(q, size).map_err(FrontendError::Vhost)?;
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
            .map_err(FrontendError::Vhost)?;
            fe.set_vring_base(q, 0).map_err(FrontendError::Vhost)?;
            fe.set_vring_call(q, &call).map_err(FrontendError::Vhost)?;
            fe.set_vring_kick(q, &kick).map_err(FrontendError::Vhost)?;
            queues.push(Queue {
                size,
                desc,
                avail,
                used,
                bufs,
                slots: slots_of(q),
                kick,
                call,
                state: Mutex::new(QueueState {
                    slots: vec![Slot::Free; usize::from(slots_of(q))],
                    avail_idx: 0,
                }),
                freed: Condvar::new(),
                requests: AtomicU64::new(0),
            });
        }
        if features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0 {
            for q in 0..nq {
                fe.set_vring_enable(q, true).map_err(FrontendError::Vhost)?;
            }
        }
        let shared = Arc::new(Shared {
            mem,
            queues,
            max_msg: max,
            stop: AtomicBool::new(false),
        });
        let dflt = ChanConfig::default();
        let chan = Chan::new(ChanConfig {
            max_background: cfg.max_background,
            congestion_threshold: cfg.max_background * 3 / 4,
            spawn_scanner: false,
            init_flags: dflt.init_flags | fuse_core::abi::init::WRITEBACK_CACHE | cfg.offer_flags,
            ..dflt
        });
        let dev = chan.device().ok_or(FrontendError::Init(Errno::ENODEV))?;
        let mut threads = Vec::new();
        for q in 0..nq {
            let (s, d) = (shared.clone(), dev.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("vq{q}-complete"))
                    .spawn(move || complete(&s, q, &d))
                    .map_err(FrontendError::Event)?,
            );
        }
        let (s, d) = (shared.clone(), dev);
        threads.push(
            std::thread::Builder::new()
                .name("vq-submit".into())
                .spawn(move || submit(&s, &d))
                .map_err(FrontendError::Event)?,
        );
        let me = VhostFrontend {
            client: Client::new(chan),
            shared,
            threads,
            frontend: fe,
            memfd: file,
        };
        match &cfg.resume {
            Some(neg) => me.client.chan().set_initialized(*neg),
            None => {
                me.client.chan().init().map_err(FrontendError::Init)?;
            }
        }
        Ok(me)
    }

    /// The client whose calls travel through the engine and the queues.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Discards the guest pages of every request buffer not in use (holes
    /// punched in the memory's memfd), as a balloon or free page reporting
    /// takes a guest's free pages: the next use of those buffers finds new,
    /// zeroed pages. Returns how many slots were discarded.
    pub fn discard_free_buffers(&self) -> std::io::Result<usize> {
        let max = self.shared.max_msg;
        let mut n = 0;
        for q in self.shared.queues.iter().skip(1) {
            // Held while punching: no free slot is taken meanwhile.
            let st = lock(&q.state);
            for (i, _) in st
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| **s == Slot::Free)
            {
                let off = q.slot_in(i as u16, max);
                // SAFETY: fallocate on the memfd this frontend owns; no
                // memory is passed. The range is a free slot's two
                // buffers, page-aligned (`max` and the layout are).
                let r = unsafe {
                    libc::fallocate(
                        self.memfd.as_raw_fd(),
                        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                        off as libc::off_t,
                        (2 * max) as libc::off_t,
                    )
                };
                if r != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                n += 1;
            }
        }
        Ok(n)
    }

    /// Sends every queue's call eventfd to the backend again
    /// (VHOST_USER_SET_VRING_CALL carries an fd, as a VMM sends when it
    /// rewires interrupts), then asks it something that needs an answer:
    /// Ok only if the backend received each fd and is still connected.
    pub fn resend_vring_calls(&self) -> Result<(), FrontendError> {
        for (q, queue) in self.shared.queues.iter().enumerate() {
            self.frontend
                .set_vring_call(q, &queue.call)
                .map_err(FrontendError::Vhost)?;
        }
        self.frontend
            .get_features()
            .map(drop)
            .map_err(FrontendError::Vhost)
    }

    /// Requests placed on each queue so far (0: hiprio).
    pub fn requests_per_queue(&self) -> Vec<u64> {
        self.shared
            .queues
            .iter()
            .map(|q| q.requests.load(Ordering::Relaxed))
            .collect()
    }
}

impl Drop for VhostFrontend {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.client.chan().abort();
        for q in &self.shared.queues {
            let _ = q.call.write(1);
            q.freed.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Moves requests from the engine's device end into the queues.
fn submit(s: &Shared, dev: &Device) {
    let mut buf = vec![0u8; (s.max_msg as usize).max(dev.min_read_buffer())];
    let nreq = s.queues.len() - 1;
    let mut rr = 0usize;
    while let Ok(n) = dev.read(&mut buf) {
        let msg = &buf[..n];
        let Ok((h, _)) = InHeader::read_from_prefix(msg) else {
            continue;
        };
        let noreply = matches!(
            Opcode::from_u32(h.opcode),
            Some(Opcode::Forget | Opcode::BatchForget | Opcode::Interrupt)
        );
        let qi = if noreply {
            0
        } else {
            rr = rr % nreq + 1;
            rr
        };
        let q = &s.queues[qi];
        if n as u64 > s.max_msg {
            // Larger than a slot (max_msg below max_write): it would spill
            // into the next one. Refused here, as a kernel would not build it.
            if !noreply {
                let _ = dev.write_with(h.unique, Errno::EIO.to_wire(), 0, |_| {});
            }
            continue;
        }
        let slot = {
            let mut st = lock(&q.state);
            loop {
                if s.stop.load(Ordering::SeqCst) {
                    return;
                }
                if let Some(i) = st.slots.iter().position(|&x| x == Slot::Free) {
                    st.slots[i] = Slot::InFlight(h.unique);
                    break i as u16;
                }
                st = wait(&q.freed, st);
            }
        };
        let write = Opcode::from_u32(h.opcode) == Some(Opcode::Write);
        let pad = if write && n as u64 + WRITE_PAD <= s.max_msg {
            WRITE_PAD
        } else {
            0
        };
        let din = q.slot_in(slot, s.max_msg) + pad;
        let dout = q.slot_out(slot, s.max_msg) + OUT_PAD;
        if s.mem.write_slice(msg, GuestAddress(din)).is_err() {
            continue;
        }
        let head = slot * 2;
        let flags = if noreply { 0 } else { F_NEXT };
        write_desc(s, q, head, din, n as u32, flags, head + 1);
        if !noreply {
            let room = reply_room(msg, s.max_msg - OUT_PAD);
            write_desc(s, q, head + 1, dout, room, F_WRITE, 0);
        }
        {
            let mut st = lock(&q.state);
            let idx = st.avail_idx;
            let avail_entry = GuestAddress(q.avail + 4 + 2 * u64::from(idx % q.size));
            let _ = s.mem.write_obj(head, avail_entry);
            // The entry before the index that publishes it.
            fence(Ordering::SeqCst);
            st.avail_idx = idx.wrapping_add(1);
            let _ = s.mem.write_obj(st.avail_idx, GuestAddress(q.avail + 2));
        }
        fence(Ordering::SeqCst);
        q.requests.fetch_add(1, Ordering::Relaxed);
        let _ = q.kick.write(1);
    }
}

fn write_desc(s: &Shared, q: &Queue, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&addr.to_le_bytes());
    b[8..12].copy_from_slice(&len.to_le_bytes());
    b[12..14].copy_from_slice(&flags.to_le_bytes());
    b[14..].copy_from_slice(&next.to_le_bytes());
    let _ = s
        .mem
        .write_slice(&b, GuestAddress(q.desc + 16 * u64::from(i)));
}

/// Hands the replies of queue `qi` back to the engine.
fn complete(s: &Shared, qi: usize, dev: &Device) {
    let q = &s.queues[qi];
    let mut last = 0u16;
    loop {
        if q.call.read().is_err() || s.stop.load(Ordering::SeqCst) {
            return;
        }
        loop {
            let used: u16 = s.mem.read_obj(GuestAddress(q.used + 2)).unwrap_or(last);
            fence(Ordering::SeqCst);
            if used == last {
                break;
            }
            while last != used {
                let e = GuestAddress(q.used + 4 + 8 * u64::from(last % q.size));
                let id: u32 = s.mem.read_obj(e).unwrap_or(u32::MAX);
                let len: u32 = s.mem.read_obj(GuestAddress(e.0 + 4)).unwrap_or(0);
                last = last.wrapping_add(1);
                let slot = (id / 2) as u16;
                if slot >= q.slots {
                    continue;
                }
                let unique = match lock(&q.state).slots[usize::from(slot)] {
                    Slot::InFlight(u) => u,
                    Slot::Free => continue,
                };
                if qi != 0 && !deliver(s, q, slot, len as usize, unique, dev) {
                    // A reply the backend garbled still ends the request.
                    let _ = dev.write_with(unique, Errno::EIO.to_wire(), 0, |_| {});
                }
                lock(&q.state).slots[usize::from(slot)] = Slot::Free;
                q.freed.notify_one();
            }
        }
    }
}

/// Hands one reply to the engine; false if it is not a reply to `unique`
/// that fits. A reply the engine refuses (the request was aborted or
/// interrupted away) counts as delivered: the kernel drops those too.
fn deliver(s: &Shared, q: &Queue, slot: u16, len: usize, unique: u64, dev: &Device) -> bool {
    let oh_len = std::mem::size_of::<OutHeader>();
    let out = q.slot_out(slot, s.max_msg) + OUT_PAD;
    let mut hb = [0u8; 16];
    if len < oh_len || s.mem.read_slice(&mut hb, GuestAddress(out)).is_err() {
        return false;
    }
    let Ok(oh) = OutHeader::read_from_bytes(&hb) else {
        return false;
    };
    if oh.unique != unique || (oh.len as usize) < oh_len || oh.len as usize > len {
        log::debug!(
            "bad reply: unique {} (want {unique}) len {} used {len}",
            oh.unique,
            oh.len
        );
        return false;
    }
    let plen = oh.len as usize - oh_len;
    if oh.error != 0 {
        log::debug!(
            "reply: unique {unique} error {} len {} used {len}",
            oh.error,
            oh.len
        );
    }
    let src = GuestAddress(out + oh_len as u64);
    let _ = dev.write_with(oh.unique, oh.error, plen, |dst| {
        let _ = s.mem.read_slice(dst, src);
    });
    true
}

/// The writable space a request gets, as a guest kernel gives it: exactly
/// the out header plus the size asked for by the requests that ask for a
/// size (READ, READDIR, READDIRPLUS, GETXATTR, LISTXATTR), the most any
/// reply can need for the rest. Backends may fill all they are given.
fn reply_room(msg: &[u8], max: u64) -> u32 {
    let oh = std::mem::size_of::<OutHeader>() as u64;
    let Ok((h, body)) = InHeader::read_from_prefix(msg) else {
        return max as u32;
    };
    // (offset of the size field, smallest reply payload)
    let (at, least) = match Opcode::from_u32(h.opcode) {
        // fuse_read_in: fh, offset, then size.
        Some(Opcode::Read | Opcode::Readdir | Opcode::Readdirplus) => (16, 0),
        // fuse_getxattr_in: size first (the name comes after the struct);
        // size 0 asks for the length, a fuse_getxattr_out.
        Some(Opcode::Getxattr | Opcode::Listxattr) => (0, 8),
        _ => return max as u32,
    };
    body.get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(max, |b: [u8; 4]| {
            (oh + u64::from(u32::from_le_bytes(b)).max(least)).min(max)
        }) as u32
}
