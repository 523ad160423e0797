//! The host kernel's FUSE-over-io_uring ring as a
//! [`fuse_core::server::RingTransport`], so `run_ring_worker` (the code that
//! serves the emulated ring) serves the real one.
//!
//! One [`KernelQueue`] per queue (the kernel has one per possible CPU),
//! each with its own io_uring of 128-byte SQEs on `/dev/fuse`. An entry's
//! buffers (the 288-byte header and its payload buffer, plus the iovec pair
//! REGISTER points at) live in a `Box` that is owned by the in-flight table
//! from the moment its command is queued until its completion is reaped,
//! and by the worker's slot in between: the kernel never holds a pointer
//! into memory someone else owns.
//!
//! Waiting: `fetch_any` waits for completions of this queue's commands and
//! for a poll on an eventfd that [`KernelQueue::wake`] writes, so a parked
//! request answered on another thread wakes the worker.
//!
//! Lock: `State` (the ring, the in-flight table, completed entries) is
//! guarded by one mutex, held by the worker while it waits in
//! io_uring_enter; other threads only write the eventfd.

use crate::devfuse::DevFuse;
use fuse_core::abi::{uring, InHeader, OutHeader, UringCmdReq, UringReqHeader};
use fuse_core::server::{RingSlot, RingTransport};
use fuse_core::Errno;
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use zerocopy::{FromBytes, IntoBytes};

/// user_data of the eventfd poll.
const WAKE: u64 = u64::MAX;

/// Errors setting a queue up.
#[derive(Debug, thiserror::Error)]
pub enum KringError {
    /// io_uring or the eventfd could not be created.
    #[error("setting up the queue's io_uring")]
    Setup(#[source] std::io::Error),
    /// /sys/module/fuse/parameters/enable_uring could not be set.
    #[error("enabling FUSE-over-io_uring (/sys/module/fuse/parameters/enable_uring)")]
    Enable(#[source] std::io::Error),
}

/// One ring entry's memory.
struct Ent {
    id: u64,
    header: UringReqHeader,
    payload: PageBuf,
    iov: [libc::iovec; 2],
}

/// A payload buffer that starts on a page, so that a file opened O_DIRECT
/// (fio --direct=1 asks for one) reads and writes it in place instead of
/// through a bounce buffer. Never resized, so its address is stable.
struct PageBuf {
    mem: Vec<u8>,
    off: usize,
    len: usize,
}

impl PageBuf {
    const PAGE: usize = 4096;
    fn new(len: usize) -> PageBuf {
        let mem = vec![0u8; len + Self::PAGE];
        let off = mem.as_ptr().align_offset(Self::PAGE).min(Self::PAGE);
        PageBuf { mem, off, len }
    }
    fn get_mut(&mut self) -> &mut [u8] {
        &mut self.mem[self.off..self.off + self.len]
    }
}

// SAFETY: the raw pointers in `iov` point into the same Box (header and
// payload); the entry moves between threads only as a whole.
unsafe impl Send for Ent {}

/// An entry holding a request, between its completion and its commit.
pub struct KernelSlot {
    ent: Box<Ent>,
}

impl std::fmt::Debug for KernelSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelSlot")
            .field("id", &self.ent.id)
            .finish()
    }
}

struct State {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    inflight: HashMap<u64, Box<Ent>>,
    done: VecDeque<Box<Ent>>,
    next: u64,
    wake_armed: bool,
    /// The first error a command completed with (teardown: ENOTCONN).
    failed: Option<Errno>,
}

struct Shared {
    qid: u16,
    dev: DevFuse,
    max_payload: usize,
    state: Mutex<State>,
    wake: OwnedFd,
    wake_count: std::cell::UnsafeCell<u64>,
}

// SAFETY: `wake_count` is only the read target of the eventfd drain, done
// by the worker holding `state`'s lock; everything else is Sync.
unsafe impl Sync for Shared {}

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

/// Sets `/sys/module/fuse/parameters/enable_uring` (before the mount's
/// INIT, which offers FUSE_OVER_IO_URING only when it is on).
pub fn enable() -> Result<(), KringError> {
    const P: &str = "/sys/module/fuse/parameters/enable_uring";
    if std::fs::read_to_string(P).is_ok_and(|v| v.trim() == "Y") {
        return Ok(());
    }
    std::fs::write(P, "Y").map_err(KringError::Enable)
}

/// Pins the calling thread to `cpu` (the kernel queues a request on the
/// queue of the CPU that submitted it; serving it there avoids a
/// cross-CPU wake-up). Errors are ignored: pinning is an optimisation.
pub fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes inside it
    // (cpu is checked against its size) and sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu < 8 * std::mem::size_of::<libc::cpu_set_t>() {
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
}

/// The kernel's queue count: one per possible CPU.
pub fn possible_cpus() -> usize {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    let max = s
        .trim()
        .split(',')
        .filter_map(|r| r.rsplit('-').next()?.parse::<usize>().ok())
        .max();
    max.map_or(1, |m| m + 1)
}

fn errno_of(e: &std::io::Error) -> Errno {
    Errno(e.raw_os_error().unwrap_or(libc::EIO))
}

impl KernelQueue {
    /// A queue `qid` on the mounted connection `dev` (after INIT negotiated
    /// FUSE_OVER_IO_URING); payload buffers of `max_payload` bytes (at
    /// least the connection's max_write and max_pages × 4 KiB).
    pub fn new(dev: &DevFuse, qid: u16, max_payload: usize) -> Result<KernelQueue, KringError> {
        // Created on the worker thread that will be its only submitter:
        // completions (the kernel's task work) then run only when that
        // thread waits, instead of interrupting it.
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_coop_taskrun()
            .build(64)
            .map_err(KringError::Setup)?;
        // SAFETY: plain syscall; the result is a new fd or -1.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(KringError::Setup(std::io::Error::last_os_error()));
        }
        // SAFETY: `efd` was just created and is owned by nothing else.
        let wake = unsafe { OwnedFd::from_raw_fd(efd) };
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
                    wake_armed: false,
                    failed: None,
                }),
                wake,
                wake_count: std::cell::UnsafeCell::new(0),
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues the command `cmd_op` for `ent` and submits it; the entry is
    /// owned by the in-flight table until its completion.
    fn send(&self, mut ent: Box<Ent>, cmd_op: u32, commit_id: u64) -> Result<u64, Errno> {
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
                iov_base: ent.payload.get_mut().as_mut_ptr().cast(),
                iov_len: ent.payload.len,
            },
        ];
        let sqe = opcode::UringCmd80::new(types::Fd(self.shared.dev.raw_fd()), cmd_op)
            .cmd(cmd)
            .addr(Some(ent.iov.as_ptr() as u64))
            .build()
            .user_data(ent.id);
        let sqe = with_len(sqe, 2);
        let id = ent.id;
        let mut st = self.state();
        st.inflight.insert(id, ent);
        // SAFETY: the SQE points at `iov`, the header and the payload, all
        // inside the Box now owned by `inflight`, which keeps it (unmoved on
        // the heap) until this SQE's completion is reaped.
        let pushed = unsafe { st.ring.submission().push(&sqe) };
        if pushed.is_err() {
            st.ring.submit().map_err(|e| errno_of(&e))?;
            // SAFETY: as above.
            unsafe { st.ring.submission().push(&sqe) }.map_err(|_| Errno(libc::EBUSY))?;
        }
        // Not submitted here: the worker's next `fetch_any` submits it in
        // the same io_uring_enter that waits for the next request (one
        // syscall per request, as COMMIT_AND_FETCH intends).
        Ok(id)
    }

    fn reap(&self, st: &mut State) {
        let cqes: Vec<(u64, i32)> = st
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (ud, res) in cqes {
            if ud == WAKE {
                st.wake_armed = false;
                // SAFETY: reads 8 bytes into the counter, which only the
                // lock holder (us) touches.
                unsafe {
                    libc::read(
                        self.shared.wake.as_raw_fd(),
                        self.shared.wake_count.get().cast(),
                        8,
                    );
                }
                continue;
            }
            let Some(ent) = st.inflight.remove(&ud) else {
                continue;
            };
            if res == 0 {
                st.done.push_back(ent);
            } else {
                // The command ended without a request (teardown: ENOTCONN,
                // or a refused REGISTER). The memory is ours again.
                st.failed.get_or_insert(Errno(-res));
                drop(ent);
            }
        }
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

impl RingSlot for KernelSlot {
    fn in_header(&self) -> InHeader {
        InHeader::read_from_prefix(&self.ent.header.in_out)
            .map(|(h, _)| h)
            .unwrap_or_default()
    }
    fn request_payload_len(&self) -> usize {
        (self.ent.header.ring_ent_in_out.payload_sz as usize).min(self.ent.payload.len)
    }
    fn is_zero_copy(&self) -> bool {
        self.ent.header.ring_ent_in_out.flags & uring::ENT_ZERO_COPY != 0
    }
    fn parts_mut(&mut self) -> (&mut UringReqHeader, &mut [u8]) {
        let e = &mut *self.ent;
        (&mut e.header, e.payload.get_mut())
    }
    fn set_reply(&mut self, error: i32, len: usize) {
        let unique = self.in_header().unique;
        let len = if error == 0 { len } else { 0 };
        let out = OutHeader {
            len: (std::mem::size_of::<OutHeader>() + len) as u32,
            error,
            unique,
        };
        self.ent.header.in_out[..std::mem::size_of::<OutHeader>()].copy_from_slice(out.as_bytes());
        self.ent.header.ring_ent_in_out.payload_sz = len as u32;
    }
}

impl RingTransport for KernelQueue {
    type Slot = KernelSlot;
    type Handle = u64;

    fn register(&self, qid: u16, payload: usize, _fixed: Option<u16>) -> Result<u64, Errno> {
        if qid != self.shared.qid {
            return Err(Errno::EINVAL);
        }
        let id = {
            let mut st = self.state();
            st.next += 1;
            st.next
        };
        let ent = Box::new(Ent {
            id,
            header: UringReqHeader::default(),
            payload: PageBuf::new(payload.max(self.shared.max_payload)),
            iov: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; 2],
        });
        self.send(ent, uring::CMD_REGISTER, 0)
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
                    st.ring.submit().map_err(|e| errno_of(&e))?;
                }
                return match hit {
                    Some(i) if !ready() => {
                        let ent = st.done.remove(i).ok_or(Errno::EIO)?;
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
            match st.ring.submit_and_wait(1) {
                Ok(_) => {}
                // Transient: the queued commits are still in the SQ ring
                // and go with the next attempt.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY | libc::ENOMEM)
                    ) =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(e) => return Err(errno_of(&e)),
            }
            self.reap(&mut st);
        }
    }

    fn wake(&self, _qid: u16) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a local to the eventfd.
        unsafe {
            libc::write(self.shared.wake.as_raw_fd(), (&one as *const u64).cast(), 8);
        }
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
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for (_, ent) in st.inflight.drain() {
            Box::leak(ent);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PageBuf;

    #[test]
    fn payload_buffers_start_on_a_page() {
        for len in [1, 4096, 8192, 1 << 20, (1 << 20) + 4096] {
            let mut b = PageBuf::new(len);
            let p = b.get_mut();
            assert_eq!(p.len(), len);
            assert_eq!(p.as_ptr() as usize % PageBuf::PAGE, 0, "{len}");
        }
    }
}
