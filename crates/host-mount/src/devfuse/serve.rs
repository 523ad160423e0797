//! Serving /dev/fuse with many requests in flight on one thread (`fusebox
//! mount` without `--io-uring`): the /dev/fuse counterpart of
//! `kernel_uring::serve`.
//!
//! Each worker reads from its own clone of the connection's fd into
//! `depth` page-aligned slots of one mapping (`kernel_uring::arena`), a
//! message at `MSG_AT` so a WRITE's data begins on a page and a READ's goes
//! to the next page. A READ, WRITE, FSYNC, FSYNCDIR or FALLOCATE the
//! filesystem can start ([`Dispatcher::start_read`],
//! [`Dispatcher::start_write`], [`Dispatcher::start_no_data`]) keeps its
//! slot and is submitted at once; the rest is served synchronously and answered,
//! its slot free. Once no request waits, completions are answered (one
//! `writev` each) and the thread waits in one `poll` (its fd while a slot is
//! free, the filesystem's eventfd, its wake eventfd). A parked SETLKW holds
//! no slot; a hung op holds only its own. See docs/DESIGN.md, "Host mounts".

use super::DevFuse;
use crate::kernel_uring::arena::{Arena, Payload, PAGE};
use fuse_core::abi::{self, InHeader, Opcode, Operation, UringReqHeader, WriteIn};
use fuse_core::server::{
    Deferred, DeviceEnd, Dispatcher, Filesystem, Handled, IoDone, RingSlot, Start, StartedIo,
};
use fuse_core::{ClientMem, Errno};
use host_io::sys;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

/// Where in its slot a message is read: a WRITE's data (after its 40-byte
/// in header and 40-byte `fuse_write_in`) then starts on a page.
const MSG_AT: usize = PAGE - 80;
const _: () = assert!(std::mem::size_of::<InHeader>() + std::mem::size_of::<WriteIn>() == 80);

/// The largest READ reply data and WRITE data a slot holds: 1 MiB (the
/// most the dispatcher lets the kernel send, `max_pages` 256) and a page.
const DATA: usize = (1 << 20) + PAGE;

/// What one worker served (for the daemon's log).
#[derive(Debug, Default, Clone, Copy)]
pub struct DevStats {
    /// Requests read.
    pub served: u64,
    /// READs, WRITEs, syncs and FALLOCATEs the filesystem took to start
    /// without waiting.
    pub started: u64,
    /// WRITEs among them.
    pub writes_started: u64,
    /// FSYNCs, FSYNCDIRs and FALLOCATEs among them.
    pub no_data_started: u64,
    /// The most started requests unanswered at once.
    pub max_in_flight: usize,
}

/// A started request: its slot, and its reply as the reply rule of
/// started I/O ([`fuse_core::server::complete_started`]) sets it once its
/// completion is taken.
struct Started {
    /// Its slot of the arena.
    slot: usize,
    hdr: InHeader,
    /// A READ's size (its data goes to the slot's second page).
    size: u32,
    /// `op_in` holds a WRITE's `fuse_write_in` (the reply rule reads its
    /// size); the rest is unused.
    header: UringReqHeader,
    /// A WRITE's `fuse_write_out`, as the reply rule writes it.
    out: [u8; 8],
    /// (error, bytes) of the reply.
    reply: (i32, usize),
}

impl Started {
    fn new(slot: usize, hdr: InHeader, size: u32, op_in: &[u8]) -> Started {
        let mut header = UringReqHeader::default();
        let n = op_in.len().min(header.op_in.len());
        header.op_in[..n].copy_from_slice(&op_in[..n]);
        Started {
            slot,
            hdr,
            size,
            header,
            out: [0; 8],
            reply: (Errno::EIO.to_wire(), 0),
        }
    }
}

impl RingSlot for Started {
    fn in_header(&self) -> InHeader {
        self.hdr
    }
    fn request_payload_len(&self) -> usize {
        0
    }
    fn is_zero_copy(&self) -> bool {
        false
    }
    fn parts_mut(&mut self) -> (&mut UringReqHeader, &mut [u8]) {
        (&mut self.header, &mut self.out)
    }
    fn set_reply(&mut self, error: i32, len: usize) {
        self.reply = (error, len);
    }
}

/// Serves the connection with worker `w` on this thread until it goes
/// (ENODEV, ECONNABORTED: a clean end, Ok).
pub fn serve_dev<F: Filesystem>(mut w: DevWorker, disp: &Dispatcher<F>) -> Result<DevStats, Errno> {
    // The filesystem's host I/O context of this thread: what the worker
    // starts runs there, and only this thread completes it.
    let signal = w.wake.clone();
    let mut io = disp
        .fs()
        .new_io(Arc::new(move || sys::eventfd_signal(signal.as_raw_fd())));
    match w.run(disp, &mut io) {
        Err(Errno::ENODEV) | Err(Errno(libc::ECONNABORTED)) => Ok(w.stats),
        Err(e) => Err(e),
        Ok(()) => Ok(w.stats),
    }
}

/// One worker's fd, slots and started requests: the thread that serves
/// with it alone touches them (no lock but the answers' own). Made before
/// its thread starts, so that what it needs (a clone of the fd, its
/// mapping) is known to be there before any request waits on it.
pub struct DevWorker {
    /// This worker's own fd of the connection.
    dev: DevFuse,
    arena: Arc<Arena>,
    /// Slots holding no request.
    free: Vec<usize>,
    /// Started requests and their completions.
    started: StartedIo<Started>,
    /// Room for the requests [`DevWorker::answer`] takes.
    answering: Vec<Started>,
    /// Written when a completion is given on another thread.
    wake: Arc<OwnedFd>,
    /// Synchronous replies.
    out: Vec<u8>,
    stats: DevStats,
}

impl std::fmt::Debug for DevWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevWorker")
            .field("slots", &self.arena.slots())
            .field("started", &self.started.len())
            .finish_non_exhaustive()
    }
}

impl DevWorker {
    /// A worker of `dev`'s connection keeping `depth` requests in flight.
    pub fn new(dev: &DevFuse, depth: usize) -> Result<DevWorker, Errno> {
        let depth = depth.max(1);
        // Not offered as a fixed-buffer map: registering it would pin all
        // of it (16 MiB per worker at depth 16) for the little a READ by
        // reference saves.
        let arena = Arena::new(MSG_AT + 80 + DATA, depth, false).map_err(|e| sys::errno_of(&e))?;
        let wake = Arc::new(sys::eventfd()?);
        Ok(DevWorker {
            dev: dev.clone_nonblocking()?,
            free: (0..arena.slots()).rev().collect(),
            arena,
            started: StartedIo::new(),
            answering: Vec::new(),
            wake,
            out: vec![0u8; DATA],
            stats: DevStats::default(),
        })
    }

    fn run<F: Filesystem>(&mut self, disp: &Dispatcher<F>, io: &mut F::Io) -> Result<(), Errno> {
        loop {
            let mut busy = false;
            // At most `depth` requests a pass: while others keep coming,
            // what completed is still answered after each `depth` of them.
            for _ in 0..self.arena.slots() {
                let Some(i) = self.free.pop() else { break };
                let started = self.started.len();
                if !self.take(disp, io, i)? {
                    self.free.push(i);
                    break;
                }
                busy = true;
                // What was started goes to the host at once, as on the
                // kernel ring (`kernel_uring::serve`): submitted together
                // at the pass's end, a pass's reads reach the disk together
                // and come back together.
                if self.started.len() != started {
                    disp.fs().submit_started(io);
                }
            }
            if !self.started.is_empty() {
                // Nothing left to submit (each was submitted as it
                // started; taking completions submits what is queued
                // anyway).
                disp.fs().collect_started(io, self.started.completions());
            }
            busy |= self.answer();
            if !busy {
                self.wait(disp, io)?;
            }
        }
    }

    /// Reads a request into slot `i` and serves or starts it. False when
    /// none waits (the slot stays free).
    fn take<F: Filesystem>(
        &mut self,
        disp: &Dispatcher<F>,
        io: &mut F::Io,
        i: usize,
    ) -> Result<bool, Errno> {
        let slot = Payload::new(self.arena.clone(), i);
        let at = slot.as_mut_ptr().wrapping_add(MSG_AT);
        let room = slot.len() - MSG_AT;
        let n = loop {
            // SAFETY: the slot is free: it was taken back from any memory
            // lent of it before it was freed, and this worker alone uses
            // its slots, so nothing else reads or writes it; `room` bytes
            // from `at` lie inside it.
            let n = unsafe { libc::read(self.dev.raw_fd(), at.cast(), room) };
            match usize::try_from(n) {
                Ok(n) => break n,
                Err(_) => match sys::errno() {
                    Errno::EINTR => continue,
                    Errno::EAGAIN => return Ok(false),
                    e => return Err(e),
                },
            }
        };
        self.stats.served += 1;
        if let Some(s) = self.start_by_ref(disp, io, &slot, i, n.min(room)) {
            self.hold(s);
            return Ok(true);
        }
        // A READ or WRITE the filesystem declined may have kept the memory
        // it was offered: no slice of the slot while that memory works.
        slot.take_back();
        // SAFETY: the kernel wrote `n` (at most `room`) bytes there, inside
        // the slot; nothing else touches the slot while this slice lives:
        // the memory lent of it so far was taken back just above, none is
        // lent while the slice lives, and it is no READ's destination.
        let msg = unsafe { std::slice::from_raw_parts(at.cast_const(), n.min(room)) };
        let req = match abi::decode_request(msg, disp.decode_options()) {
            Ok(req) => req,
            Err(_) => {
                // Malformed: the dispatcher answers it (EIO) if it can.
                let h = disp.handle_bytes_with(msg, &mut self.out, None);
                self.reply_in_line(h);
                self.free.push(i);
                return Ok(true);
            }
        };
        let unique = req.header.unique;
        if matches!(
            req.op,
            Operation::Fsync { .. } | Operation::Fsyncdir { .. } | Operation::Fallocate { .. }
        ) && disp
            .start_no_data(
                Start::new(io, self.started.completions()),
                &req,
                IoDone::new(unique),
            )
            .is_ok()
        {
            // No memory of the slot is lent: the slot is free for the next
            // request once it is answered (`answer`).
            self.hold(Started::new(i, req.header, 0, &[]));
            return Ok(true);
        }
        let dev = self.dev.clone();
        let defer = move |unique: u64| {
            let dev = dev.clone();
            Deferred::new(move |error| {
                // Refused (interrupted or aborted meanwhile): nothing to do.
                let _ = dev.write_reply(unique, error, &[]);
            })
        };
        let h = disp.handle_with(&req, &mut self.out, Some(&defer));
        self.reply_in_line(h);
        self.free.push(i);
        Ok(true)
    }

    /// Counts started request `s` and holds it until its completion is
    /// taken (answered at once if it is in already).
    fn hold(&mut self, s: Started) {
        self.stats.started += 1;
        let op = s.hdr.opcode;
        if op == Opcode::Write as u32 {
            self.stats.writes_started += 1;
        } else if op != Opcode::Read as u32 {
            self.stats.no_data_started += 1;
        }
        self.stats.max_in_flight = self.stats.max_in_flight.max(self.started.len() + 1);
        if let Some(s) = self.started.hold(s.hdr.unique, s) {
            self.reply_started(s);
        }
    }

    /// Offers the request of `n` bytes read into `slot` to the filesystem
    /// to start by reference, if it is a READ (its data to go to the
    /// slot's second page) or a WRITE (its data there already): the
    /// request, held in slot `i`, if started.
    ///
    /// Only the plain forms are offered: a READ of exactly its 80 bytes,
    /// a WRITE of its 80 bytes and data (no extensions, nothing trailing).
    /// Their header part, [`MSG_AT`, `PAGE`), is copied out and decoded
    /// from the copy, so no slice of the slot lives while the filesystem
    /// has the memory of [`PAGE`, end): the two never overlap.
    fn start_by_ref<F: Filesystem>(
        &mut self,
        disp: &Dispatcher<F>,
        io: &mut F::Io,
        slot: &Payload,
        i: usize,
        n: usize,
    ) -> Option<Started> {
        const HEAD: usize = PAGE - MSG_AT;
        let mut head = [0u8; HEAD];
        if n < HEAD {
            return None;
        }
        // SAFETY: the kernel wrote `n` ≥ HEAD bytes from MSG_AT, inside the
        // slot; no memory of the slot is lent (it is free until started),
        // so nothing else touches it; `head` is a local array.
        unsafe {
            std::ptr::copy_nonoverlapping(
                slot.as_mut_ptr().wrapping_add(MSG_AT).cast_const(),
                head.as_mut_ptr(),
                HEAD,
            )
        };
        let (hdr, op_in) = head.split_at(std::mem::size_of::<InHeader>());
        let hdr: InHeader = zerocopy::FromBytes::read_from_bytes(hdr).ok()?;
        // Only READs and WRITEs are started by reference: every other
        // request is decoded once, synchronously, not here first.
        let by_ref = [abi::Opcode::Read as u32, abi::Opcode::Write as u32];
        if hdr.len as usize != n || hdr.total_extlen != 0 || !by_ref.contains(&hdr.opcode) {
            return None;
        }
        let opts = abi::DecodeOptions {
            write_data_elsewhere: true,
            ..disp.decode_options()
        };
        let req = abi::decode_split(hdr, op_in, &[], opts).ok()?;
        let unique = hdr.unique;
        let (read, size) = match &req.op {
            Operation::Read { arg } if n == HEAD && arg.size as usize <= DATA => (true, arg.size),
            // Its data is all that follows the 80 bytes: the slot's second
            // page on.
            Operation::Write { arg, .. } if n == HEAD + arg.size as usize => (false, arg.size),
            _ => return None,
        };
        let m: Arc<dyn ClientMem> = Arc::new(slot.client_mem_at(PAGE, size as usize));
        let done = IoDone::new(unique);
        let start = Start::new(io, self.started.completions());
        let r = if read {
            disp.start_read(start, &req, &m, done)
        } else {
            disp.start_write(start, &req, &m, done)
        };
        r.ok().map(|()| Started::new(i, hdr, size, op_in))
    }

    fn reply_in_line(&self, h: Handled) {
        if let Handled::Reply(o) = h {
            // Refused (interrupted or aborted meanwhile): dropped.
            let _ = self
                .dev
                .write_reply(o.unique, o.error, &self.out[..o.len.min(self.out.len())]);
        }
    }

    /// Answers every started request that completed; true if any did.
    fn answer(&mut self) -> bool {
        let mut done = std::mem::take(&mut self.answering);
        self.started.take_completed(|s| done.push(s));
        let any = !done.is_empty();
        for s in done.drain(..) {
            self.reply_started(s);
        }
        self.answering = done;
        any
    }

    /// Sends the reply of started request `s` (set by the reply rule) and
    /// frees its slot.
    fn reply_started(&mut self, s: Started) {
        let slot = Payload::new(self.arena.clone(), s.slot);
        // The filesystem may keep the memory it was lent past its answer:
        // it gets EIO from now on, and the slot is ours (to read a READ's
        // data from, then to free).
        slot.take_back();
        let (error, len) = s.reply;
        let unique = s.hdr.unique;
        // Refused (interrupted or aborted meanwhile): dropped.
        let _ = if error != 0 {
            self.dev.write_reply(unique, error, &[])
        } else if s.hdr.opcode == Opcode::Read as u32 {
            let n = len.min(s.size as usize);
            // SAFETY: the slot was taken back above, so no memory lent of
            // it is used (the READ's I/O, and anything the filesystem
            // kept), and none is lent while the slice lives; its `n` bytes
            // from the second page lie inside it (n ≤ DATA).
            let data = unsafe { std::slice::from_raw_parts(slot.as_mut_ptr().add(PAGE), n) };
            self.dev.write_reply(unique, 0, data)
        } else {
            // A WRITE's `fuse_write_out`, or nothing.
            self.dev
                .write_reply(unique, 0, &s.out[..len.min(s.out.len())])
        };
        self.free.push(s.slot);
    }

    /// Waits for a request (if a slot is free), a completion of the
    /// filesystem's, or a wake-up.
    fn wait<F: Filesystem>(&mut self, disp: &Dispatcher<F>, io: &F::Io) -> Result<(), Errno> {
        let mut fds = Vec::with_capacity(3);
        let ev = |fd: i32| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // The device first: with every slot busy it is polled for its end
        // alone (poll reports an error whatever was asked).
        let mut dev = ev(self.dev.raw_fd());
        if self.free.is_empty() {
            dev.events = 0;
        }
        fds.push(dev);
        fds.push(ev(self.wake.as_raw_fd()));
        if let Some(fd) = disp.fs().started_fd(io) {
            fds.push(ev(fd));
        }
        // SAFETY: `fds` is a live array of that many pollfds.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if r < 0 {
            return match sys::errno() {
                Errno::EINTR => Ok(()),
                e => Err(e),
            };
        }
        if fds[0].revents & (libc::POLLERR | libc::POLLHUP) != 0 {
            // The connection is gone (aborted, unmounted).
            return Err(Errno::ENODEV);
        }
        for p in &fds[1..] {
            if p.revents & libc::POLLIN != 0 {
                sys::eventfd_drain(p.fd);
            }
        }
        Ok(())
    }
}
