//! The host kernel's FUSE-over-io_uring ring: a [`KernelQueue`] (one per
//! possible CPU) has its own io_uring of 128-byte SQEs on `/dev/fuse`,
//! served by [`serve::serve_queue`] (`fusebox mount --io-uring`) or, as a
//! [`fuse_core::server::RingTransport`], by `run_ring_worker`.
//!
//! An entry's header and iovec pair live in a `Box` owned by the in-flight
//! table while its command is in flight and by the serving thread in
//! between: the kernel never holds a pointer into memory someone else owns.
//! Its payload buffer is a slot of the queue's `arena`; every command first
//! takes the slot back from what the filesystem was lent of it. Entries
//! move through [`EntState`], only on the serving thread. That thread waits
//! in one io_uring_enter, holding `State`'s mutex; other threads only wake
//! it ([`KernelQueue::wake_queue`]: an eventfd its ring polls).
//!
//! Entries are in `entry`, waiting in `wait`, host and CPU helpers in `host`.

pub(crate) mod arena;
mod entry;
mod host;
pub mod serve;
mod wait;

pub use entry::{EntState, KernelSlot};
pub use host::{enable, pin_to_cpu, possible_cpus};

use crate::devfuse::DevFuse;
use entry::Ent;
use fuse_core::abi::{
    notify, uring, InHeader, NotifyRetrieveOut, Opcode, UringCmdReq, UringReqHeader,
};
use fuse_core::locks::{get_mut, lock};
use fuse_core::server::RingTransport;
use fuse_core::Errno;
use host_io::sys;
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use wait::submit_and_wait;
use zerocopy::IntoBytes;

/// user_data of the eventfd poll.
const WAKE: u64 = u64::MAX;
/// user_data of the poll on the filesystem's completion eventfd.
const ASYNC: u64 = u64::MAX - 1;
/// Set in the uniques of [`KernelQueue::nudge`]'s NOTIFY_REPLYs: the
/// kernel numbers its own requests from 0 in steps of 2 and never gets
/// there (bit 63 is FUSE_UNIQUE_RESEND's), so a commit of one cannot be
/// taken for a real request's.
const NUDGE_BIT: u64 = 1 << 62;

/// Errors setting a queue up.
#[derive(Debug, thiserror::Error)]
pub enum KernelUringError {
    /// io_uring or the eventfd could not be created.
    #[error("setting up the queue's io_uring")]
    Setup(#[source] std::io::Error),
    /// /sys/module/fuse/parameters/enable_uring could not be set.
    #[error("enabling FUSE-over-io_uring (/sys/module/fuse/parameters/enable_uring)")]
    Enable(#[source] std::io::Error),
}

struct State {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    inflight: HashMap<u64, Box<Ent>>,
    done: VecDeque<Box<Ent>>,
    next: u64,
    /// The queue's payload slots; entries past its size get their own.
    arena: Arc<arena::Arena>,
    next_slot: usize,
    wake_armed: bool,
    /// The fd a poll on the filesystem's completion eventfd is armed for.
    started_armed: Option<i32>,
    /// Set when that poll completed (the eventfd is to be read).
    started_fired: bool,
    /// The first error a command completed with (teardown: ENOTCONN).
    failed: Option<Errno>,
}

struct Shared {
    qid: u16,
    dev: DevFuse,
    max_payload: usize,
    state: Mutex<State>,
    wake: OwnedFd,
    /// Set by [`KernelQueue::shutdown`].
    stop: std::sync::atomic::AtomicBool,
    /// Nudges sent (numbers their uniques).
    nudges: std::sync::atomic::AtomicU64,
}

/// One queue of the kernel's ring, served by one worker thread.
#[derive(Clone)]
pub struct KernelQueue {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for KernelQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelQueue")
            .field("qid", &self.shared.qid)
            .finish_non_exhaustive()
    }
}

impl KernelQueue {
    /// A queue `qid` on the mounted connection `dev` (after INIT negotiated
    /// FUSE_OVER_IO_URING); payload buffers of `max_payload` bytes (at
    /// least the connection's max_write and max_pages × 4 KiB).
    pub fn new(
        dev: &DevFuse,
        qid: u16,
        max_payload: usize,
    ) -> Result<KernelQueue, KernelUringError> {
        Self::with_depth(dev, qid, max_payload, 1)
    }

    /// [`KernelQueue::new`] with room for `depth` entries: their payload
    /// slots in one mapping (offered to the filesystem as fixed buffers),
    /// and an SQ ring that takes all their commits and the two polls.
    pub fn with_depth(
        dev: &DevFuse,
        qid: u16,
        max_payload: usize,
        depth: usize,
    ) -> Result<KernelQueue, KernelUringError> {
        let depth = depth.max(1);
        let sq = u32::try_from((depth + 2).next_power_of_two().max(64)).unwrap_or(4096);
        // Created on the worker thread that will be its only submitter:
        // completions (the kernel's task work) then run only when that
        // thread waits, instead of interrupting it.
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_coop_taskrun()
            .build(sq)
            .map_err(KernelUringError::Setup)?;
        // Not offered as io_uring fixed buffers: registering pins the whole
        // arena (depth x max_payload, 16 MiB per queue at the defaults, and
        // a queue per possible CPU) where plain READV into it touches only
        // the pages a READ fills, and fixed buffers are no faster than plain
        // ones (docs/BENCHMARKS.md, "host-io driver (criterion)").
        let arena =
            arena::Arena::new(max_payload, depth, false).map_err(KernelUringError::Setup)?;
        let wake = sys::eventfd()
            .map_err(|e| KernelUringError::Setup(std::io::Error::from_raw_os_error(e.0)))?;
        Ok(KernelQueue {
            shared: Arc::new(Shared {
                qid,
                dev: dev.clone(),
                max_payload,
                state: Mutex::new(State {
                    ring,
                    inflight: HashMap::new(),
                    done: VecDeque::new(),
                    next: 0,
                    arena,
                    next_slot: 0,
                    wake_armed: false,
                    started_armed: None,
                    started_fired: false,
                    failed: None,
                }),
                wake,
                stop: std::sync::atomic::AtomicBool::new(false),
                nudges: std::sync::atomic::AtomicU64::new(0),
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.shared.state)
    }

    /// Queues the command `cmd_op` for `ent` and submits it; the entry is
    /// owned by the in-flight table until its completion. The payload slot
    /// is taken back first: whatever memory of it the filesystem still
    /// holds gets EIO from now on, and what it had running is over.
    fn send(&self, mut ent: Box<Ent>, cmd_op: u32, commit_id: u64) -> Result<u64, Errno> {
        ent.payload.take_back();
        let req = UringCmdReq {
            commit_id,
            qid: self.shared.qid,
            ..Default::default()
        };
        let mut cmd = [0u8; 80];
        cmd[..std::mem::size_of::<UringCmdReq>()].copy_from_slice(req.as_bytes());
        ent.iov = [
            libc::iovec {
                iov_base: (&mut ent.header as *mut UringReqHeader).cast(),
                iov_len: std::mem::size_of::<UringReqHeader>(),
            },
            libc::iovec {
                iov_base: ent.payload.as_mut_ptr().cast(),
                iov_len: ent.payload.len(),
            },
        ];
        ent.step(EntState::Fetching);
        let sqe = opcode::UringCmd80::new(types::Fd(self.shared.dev.raw_fd()), cmd_op)
            .cmd(cmd)
            .addr(Some(ent.iov.as_ptr() as u64))
            .build()
            .user_data(ent.id);
        let sqe = with_len(sqe, 2);
        let id = ent.id;
        let mut st = self.state();
        st.inflight.insert(id, ent);
        // SAFETY: the SQE points at `iov` and the header, inside the Box
        // now owned by `inflight`, which keeps it (unmoved on the heap) until
        // this SQE's completion is reaped, and at the payload slot, which the
        // Box's `Payload` keeps mapped. No I/O or copy of ours runs on that
        // slot while the kernel has it: it was taken back at the top of
        // this function (every `PayloadMem` of it refuses, and the ones
        // running have ended), and the Box (the only way to make a new one
        // or a slice) is the in-flight table's until the completion.
        let pushed = unsafe { st.ring.submission().push(&sqe) };
        if pushed.is_err() {
            st.ring.submit().map_err(|e| sys::errno_of(&e))?;
            // SAFETY: as above.
            unsafe { st.ring.submission().push(&sqe) }
                .map_err(|squeue::PushError { .. }| Errno(libc::EBUSY))?;
        }
        // Not submitted here: the worker's next `fetch_any` submits it in
        // the same io_uring_enter that waits for the next request (one
        // syscall per request, as COMMIT_AND_FETCH intends).
        Ok(id)
    }

    /// Registers one more entry (its REGISTER is queued, submitted with
    /// the next wait); its payload buffer is the next slot of the queue's
    /// arena, or a mapping of its own past the queue's depth.
    pub fn register_entry(&self, payload: usize) -> Result<u64, Errno> {
        let (id, slot) = {
            let mut st = self.state();
            st.next += 1;
            let want = payload.max(self.shared.max_payload);
            let slot = if st.next_slot < st.arena.slots() && st.arena.slot_len() >= want {
                st.next_slot += 1;
                arena::Payload::new(st.arena.clone(), st.next_slot - 1)
            } else {
                let own = arena::Arena::new(want, 1, false).map_err(|e| sys::errno_of(&e))?;
                arena::Payload::new(own, 0)
            };
            (st.next, slot)
        };
        let ent = Box::new(Ent {
            id,
            state: EntState::New,
            header: UringReqHeader::default(),
            payload: slot,
            iov: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; 2],
        });
        self.send(ent, uring::CMD_REGISTER, 0)
    }

    /// Queues the COMMIT_AND_FETCH of a served entry (its reply set with
    /// [`fuse_core::server::RingSlot::set_reply`]); submitted with the next
    /// wait. The memory its slot lent the filesystem is taken back first:
    /// kept past the answer, it gets EIO, and I/O still running on it (a
    /// started READ committed before its completion) is waited for, never
    /// raced.
    pub fn commit_slot(&self, slot: KernelSlot) -> Result<u64, Errno> {
        let commit_id = slot.ent.header.ring_ent_in_out.commit_id;
        self.send(slot.ent, uring::CMD_COMMIT_AND_FETCH, commit_id)
    }

    /// Every entry that holds a request now (they are `Serving` once
    /// returned), without waiting; and the error a command ended with, if
    /// one did (ENOTCONN and the like when the connection goes).
    pub fn take_fetched(&self, out: &mut Vec<KernelSlot>) -> Option<Errno> {
        let mut st = self.state();
        self.reap(&mut st);
        out.extend(st.done.drain(..).map(|mut ent| {
            ent.step(EntState::Serving);
            KernelSlot { ent }
        }));
        st.failed.map(|e| match e {
            Errno::ENOTCONN | Errno::ENODEV | Errno::ECONNABORTED => Errno::ENOTCONN,
            Errno(libc::ECANCELED) => Errno::ENOTCONN,
            e => e,
        })
    }

    /// Gets the kernel to hand the requests waiting in this queue to its
    /// free entries. The kernel gives a request that was queued while no
    /// entry was free to an entry that commits (COMMIT_AND_FETCH takes the
    /// first one waiting), or to a free entry when a background request
    /// arrives; a REGISTER makes an entry free for requests that come
    /// later, not for those already waiting, and a new foreground request
    /// takes a free entry ahead of them. An entry whose request parks
    /// (SETLKW) does not commit, so after a park the queue can sit with
    /// free entries and waiting requests, among them the unlock that would
    /// end the wait: nothing moves again.
    ///
    /// The nudge submits what is queued (a replacement's REGISTER), then
    /// writes a zero-byte FUSE_NOTIFY_RETRIEVE of `nodeid`, a regular file
    /// the kernel has in its inode cache (newer kernels refuse any other
    /// kind with EINVAL; a lock wait's own file is one, held open by the
    /// waiter: only regular files take FUSE locks). The kernel
    /// answers it with a NOTIFY_REPLY request on the queue of the CPU the
    /// writer runs on (the serving thread is pinned to its queue's CPU),
    /// given to a free entry at once; its commit ([`KernelQueue::is_nudge`]
    /// tells the serving thread to make one) fetches the first waiting
    /// request, and the queue moves again. With no entry free, the
    /// NOTIFY_REPLY waits its turn and the entries that are busy commit
    /// (and fetch) anyway. Call it on the serving thread; each nudge
    /// restarts one chain of commits, so make one per parked request.
    pub fn nudge(&self, nodeid: u64) -> Result<(), Errno> {
        {
            let mut st = self.state();
            if !st.ring.submission().is_empty() {
                st.ring.submit().map_err(|e| sys::errno_of(&e))?;
            }
        }
        let n = self
            .shared
            .nudges
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let out = NotifyRetrieveOut {
            notify_unique: NUDGE_BIT
                | (u64::from(self.shared.qid) << 40)
                | ((n << 1) & ((1 << 40) - 1)),
            nodeid,
            offset: 0,
            size: 0,
            padding: 0,
        };
        self.shared.dev.notify(notify::RETRIEVE, out.as_bytes())
    }

    /// Whether a fetched request is the NOTIFY_REPLY of a
    /// [`KernelQueue::nudge`]: commit it as it is (no reply is read).
    pub fn is_nudge(h: &InHeader) -> bool {
        h.opcode == Opcode::NotifyReply as u32 && h.unique & NUDGE_BIT != 0
    }

    /// Asks the serving thread to stop (the connection is gone but it may
    /// hold every entry, so no failed command would tell it).
    pub fn shutdown(&self) {
        self.shared
            .stop
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.wake_queue();
    }

    /// Whether [`KernelQueue::shutdown`] was called.
    pub fn stopping(&self) -> bool {
        self.shared.stop.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Wakes the serving thread (an answer given on another thread).
    pub fn wake_queue(&self) {
        RingTransport::wake(self, self.shared.qid);
    }

    /// This queue's id.
    pub fn qid(&self) -> u16 {
        self.shared.qid
    }
}

/// Sets `sqe->len` (REGISTER's iovec count), which `UringCmd80` leaves 0.
fn with_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);
    // SAFETY: Entry128 is a repr(C) 128-byte io_uring_sqe plus command
    // area with no padding or invalid bit patterns; `len` is the u32 at
    // byte 24 of struct io_uring_sqe.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[24..28].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: the same bytes back, with one plain integer field changed.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

impl RingTransport for KernelQueue {
    type Slot = KernelSlot;
    type Handle = u64;

    fn register(&self, qid: u16, payload: usize, _fixed: Option<u16>) -> Result<u64, Errno> {
        if qid != self.shared.qid {
            return Err(Errno::EINVAL);
        }
        self.register_entry(payload)
    }

    fn commit(&self, slot: KernelSlot, _fixed: Option<u16>) -> Result<u64, Errno> {
        let commit_id = slot.ent.header.ring_ent_in_out.commit_id;
        self.send(slot.ent, uring::CMD_COMMIT_AND_FETCH, commit_id)
    }

    fn fetch_any(
        &self,
        _qid: u16,
        entries: &dyn Fn() -> Vec<u64>,
        ready: &dyn Fn() -> bool,
    ) -> Result<Option<KernelSlot>, Errno> {
        let mut st = self.state();
        loop {
            let mine = entries();
            let hit = st.done.iter().position(|e| mine.contains(&e.id));
            if ready() || hit.is_some() {
                // Commits queued since the last wait carry replies: they go
                // now, without waiting.
                if !st.ring.submission().is_empty() {
                    st.ring.submit().map_err(|e| sys::errno_of(&e))?;
                }
                return match hit {
                    Some(i) if !ready() => {
                        let mut ent = st.done.remove(i).ok_or(Errno::EIO)?;
                        ent.step(EntState::Serving);
                        Ok(Some(KernelSlot { ent }))
                    }
                    _ => Ok(None),
                };
            }
            if let Some(e) = st.failed {
                return Err(match e {
                    Errno::ENOTCONN | Errno::ENODEV | Errno::ECONNABORTED => Errno::ENOTCONN,
                    Errno(libc::ECANCELED) => Errno::ENOTCONN,
                    e => e,
                });
            }
            if !st.wake_armed {
                let poll = opcode::PollAdd::new(
                    types::Fd(self.shared.wake.as_raw_fd()),
                    libc::POLLIN as u32,
                )
                .build()
                .user_data(WAKE);
                let poll: squeue::Entry128 = poll.into();
                // SAFETY: a poll SQE points at no memory.
                if unsafe { st.ring.submission().push(&poll) }.is_ok() {
                    st.wake_armed = true;
                }
            }
            submit_and_wait(&mut st)?;
            self.reap(&mut st);
        }
    }

    fn wake(&self, _qid: u16) {
        sys::eventfd_signal(self.shared.wake.as_raw_fd());
    }

    fn handle_of(slot: &KernelSlot) -> u64 {
        slot.ent.id
    }
}

impl Drop for Shared {
    /// Entries still in flight when the queue goes (the connection is
    /// being torn down) may yet be written by the kernel: their memory is
    /// leaked rather than freed under it.
    fn drop(&mut self) {
        let st = get_mut(&mut self.state);
        for (_, ent) in st.inflight.drain() {
            Box::leak(ent);
        }
    }
}
