//! Ring-style worker: commit a reply, wait for the next request, on one
//! entry (more while requests are parked). It sees the ring only through
//! [`RingSlot`] and [`RingTransport`] (the kernel's ring
//! ABI: the 288-byte header, split arguments, a payload buffer), so the
//! same code serves the emulated ring ([`RingEnd`]) and the host kernel's
//! (host-mount's `KernelQueue`).

use super::{DeferFn, Deferred, Dispatcher, Filesystem, Handled, IoDone, Start};
use crate::abi::{self, InHeader, Opcode, UringReqHeader, URING_OP_IN_OUT_SZ};
use crate::chan::{runs_when_given_up, ClientMem, Errno, Fence};
use crate::dev_uring::{EntHandle, EntryBufs, Fetched, RingEnd};
use crate::sync::{lock, Arc, Mutex};
use std::collections::HashMap;

/// One ring entry holding a request, as a worker sees it.
pub trait RingSlot {
    /// The request's `fuse_in_header`.
    fn in_header(&self) -> InHeader;
    /// Bytes of request payload at the start of the payload buffer.
    fn request_payload_len(&self) -> usize;
    /// Whether the payload buffer is the client's own pages.
    fn is_zero_copy(&self) -> bool;
    /// The header and the payload buffer.
    fn parts_mut(&mut self) -> (&mut UringReqHeader, &mut [u8]);
    /// Records the reply (error, and payload bytes written; for a READ
    /// into client memory, the bytes written there).
    fn set_reply(&mut self, error: i32, len: usize);
    /// The client memory a READ or WRITE passes by reference, if any,
    /// taken for the time [`serve_slot`] serves the request: it lends it
    /// on and gives it back with [`RingSlot::restore_client_mem`] before
    /// it returns, so serving counts no reference of its own.
    fn take_client_mem(&mut self) -> Option<Arc<dyn ClientMem>> {
        None
    }
    /// Gives back what [`RingSlot::take_client_mem`] took.
    fn restore_client_mem(&mut self, _mem: Option<Arc<dyn ClientMem>>) {}
    /// Whether the request passes client memory by reference: what
    /// [`RingSlot::take_client_mem`] would take (the two must agree; a
    /// WRITE by reference gets its reply in the header's `op_in`).
    fn has_client_mem(&self) -> bool {
        false
    }
    /// A WRITE's data (the request payload) as client memory, for a WRITE
    /// not by reference started without waiting
    /// ([`Dispatcher::start_write`]); its reply still goes where any
    /// WRITE's does, set by the transport when the write completes. None:
    /// such WRITEs are served synchronously (a WRITE by reference is
    /// started from its client memory).
    fn write_mem(&self) -> Option<Arc<dyn ClientMem>> {
        None
    }
    /// Takes the fence the client may close to give the request up
    /// (`Args::fence`), if it has one.
    fn take_fence(&mut self) -> Option<Arc<Fence>> {
        None
    }
}

/// A ring a worker can serve.
pub trait RingTransport: Clone + Send + Sync + 'static {
    /// An entry holding a request.
    type Slot: RingSlot + Send + 'static;
    /// Names an entry between requests.
    type Handle: Copy + PartialEq + Send + 'static;
    /// Registers an entry on `qid` (pool mode when `payload` is 0).
    fn register(&self, qid: u16, payload: usize, fixed: Option<u16>)
        -> Result<Self::Handle, Errno>;
    /// Commits a slot's reply; the entry waits for its next request.
    fn commit(&self, slot: Self::Slot, fixed: Option<u16>) -> Result<Self::Handle, Errno>;
    /// Waits until one of `entries()` holds a request (Some) or `ready()`
    /// holds (None); `ready` is re-checked after every [`RingTransport::wake`].
    fn fetch_any(
        &self,
        qid: u16,
        entries: &dyn Fn() -> Vec<Self::Handle>,
        ready: &dyn Fn() -> bool,
    ) -> Result<Option<Self::Slot>, Errno>;
    /// Wakes the workers of `qid` waiting in `fetch_any`.
    fn wake(&self, qid: u16);
    /// The entry a slot belongs to.
    fn handle_of(slot: &Self::Slot) -> Self::Handle;
}

impl RingSlot for Fetched {
    fn in_header(&self) -> InHeader {
        Fetched::in_header(self)
    }
    fn request_payload_len(&self) -> usize {
        self.request_payload().len()
    }
    fn is_zero_copy(&self) -> bool {
        Fetched::is_zero_copy(self)
    }
    fn parts_mut(&mut self) -> (&mut UringReqHeader, &mut [u8]) {
        Fetched::parts_mut(self)
    }
    fn set_reply(&mut self, error: i32, len: usize) {
        Fetched::set_reply(self, error, len)
    }
    fn take_client_mem(&mut self) -> Option<Arc<dyn ClientMem>> {
        self.held.client.take()
    }
    fn restore_client_mem(&mut self, mem: Option<Arc<dyn ClientMem>>) {
        self.held.client = mem;
    }
    fn has_client_mem(&self) -> bool {
        self.held.client.is_some()
    }
    fn take_fence(&mut self) -> Option<Arc<Fence>> {
        self.held.fence.take()
    }
}

impl RingTransport for RingEnd {
    type Slot = Fetched;
    type Handle = EntHandle;
    fn register(&self, qid: u16, payload: usize, fixed: Option<u16>) -> Result<EntHandle, Errno> {
        let bufs = if payload == 0 {
            EntryBufs::pooled()
        } else {
            EntryBufs::with_payload(payload)
        };
        RingEnd::register(self, &crate::dev_uring::cmd_area(qid, 0, 0), bufs, fixed)
    }
    fn commit(&self, slot: Fetched, fixed: Option<u16>) -> Result<EntHandle, Errno> {
        let area = slot.commit_cmd();
        RingEnd::commit(self, &area, slot, fixed).map_err(|(e, _)| e)
    }
    fn fetch_any(
        &self,
        qid: u16,
        entries: &dyn Fn() -> Vec<EntHandle>,
        ready: &dyn Fn() -> bool,
    ) -> Result<Option<Fetched>, Errno> {
        RingEnd::fetch_any(self, qid, entries, ready)
    }
    fn wake(&self, qid: u16) {
        RingEnd::wake(self, qid)
    }
    fn handle_of(slot: &Fetched) -> EntHandle {
        slot.handle()
    }
}

/// Answers the request in `f` with `disp`, writing the reply into the
/// entry (payload buffer, or `op_in` for a zero-copy WRITE). A request
/// that waits is answered on this thread.
pub fn answer_slot<F: Filesystem, S: RingSlot + ?Sized>(
    disp: &Dispatcher<F>,
    f: &mut S,
    scratch: &mut [u8],
) {
    answer_with(disp, f, scratch, None);
}

/// [`answer_slot`], parking a request that waits when `defer` is given: then
/// nothing is written to the entry and it returns true.
pub fn answer_with<F: Filesystem, S: RingSlot + ?Sized>(
    disp: &Dispatcher<F>,
    f: &mut S,
    scratch: &mut [u8],
    defer: Option<DeferFn<'_>>,
) -> bool {
    serve_slot(disp, f, scratch, defer, None) == Served::Parked
}

/// What [`serve_slot`] did with the request of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Answered: the reply is in the entry, ready to commit.
    Answered,
    /// Parked (it waits for something outside the server): the
    /// [`Deferred`] answers it; nothing is in the entry.
    Parked,
    /// A READ into client memory, a WRITE from client memory or its
    /// [`RingSlot::write_mem`], or an FSYNC, FSYNCDIR or FALLOCATE, whose
    /// host I/O was started and runs on: the [`IoDone`] made for it
    /// says when, and how many bytes; then a READ's reply is `(0, bytes)`
    /// (or the error), a WRITE's a `fuse_write_out` of the bytes written,
    /// the others' empty, and the entry is committed.
    Started,
}

/// Sets the reply of a request [`serve_slot`] started
/// ([`Served::Started`]) once its I/O is over, with the result its
/// [`IoDone`] got: a READ's `(0, bytes)` (the data is in client memory
/// already), a WRITE's `fuse_write_out` where `serve_slot` puts any
/// WRITE's reply (the header's `op_in` for a WRITE by reference or
/// zero-copy, the payload buffer otherwise), an FSYNC's, FSYNCDIR's or
/// FALLOCATE's nothing; an error as it is.
pub fn complete_started<S: RingSlot + ?Sized>(f: &mut S, r: super::FsResult<usize>) {
    let n = match r {
        Ok(n) => n,
        Err(e) => return f.set_reply(e.to_wire(), 0),
    };
    let opcode = f.in_header().opcode;
    if no_data(opcode) {
        // Nothing but its success.
        return f.set_reply(0, 0);
    }
    if opcode != Opcode::Write as u32 {
        return f.set_reply(0, n);
    }
    let in_header = f.is_zero_copy() || f.has_client_mem();
    let (header, payload) = f.parts_mut();
    // Never more than the WRITE carried (its fuse_write_in is still in
    // op_in), as the synchronous path answers.
    let size = <abi::WriteIn as zerocopy::FromBytes>::read_from_prefix(&header.op_in[..])
        .map_or(0, |(w, _)| w.size);
    let out = abi::WriteOut {
        size: u32::try_from(n).unwrap_or(u32::MAX).min(size),
        padding: 0,
    };
    let bytes = zerocopy::IntoBytes::as_bytes(&out);
    if in_header {
        header.op_in[..bytes.len()].copy_from_slice(bytes);
        f.set_reply(0, 0);
    } else if payload.len() >= bytes.len() {
        payload[..bytes.len()].copy_from_slice(bytes);
        f.set_reply(0, bytes.len());
    } else {
        f.set_reply(Errno::EIO.to_wire(), 0);
    }
}

/// Whether `opcode` is an FSYNC, FSYNCDIR or FALLOCATE: a request that
/// carries no data and answers none, started without waiting where the
/// filesystem can.
fn no_data(opcode: u32) -> bool {
    opcode == Opcode::Fsync as u32
        || opcode == Opcode::Fsyncdir as u32
        || opcode == Opcode::Fallocate as u32
}

/// Serves the request in `f` with `disp`: as `answer_with`, and with
/// `start` (the serving loop's host I/O context and completions) a READ
/// into client memory, a WRITE from client memory or from what its slot
/// offers as [`RingSlot::write_mem`], or an FSYNC, FSYNCDIR or FALLOCATE,
/// is started without waiting where the filesystem can
/// ([`Dispatcher::start_read`], [`Dispatcher::start_write`],
/// [`Dispatcher::start_no_data`]): its [`IoDone`] comes back into
/// `start.done`.
pub fn serve_slot<F: Filesystem, S: RingSlot + ?Sized>(
    disp: &Dispatcher<F>,
    f: &mut S,
    scratch: &mut [u8],
    defer: Option<DeferFn<'_>>,
    start: Option<Start<'_, F::Io>>,
) -> Served {
    let client = f.take_client_mem();
    let served = serve_with(disp, f, client.as_ref(), scratch, defer, start);
    f.restore_client_mem(client);
    served
}

/// [`serve_slot`], the slot's client memory lent as `client`.
fn serve_with<F: Filesystem, S: RingSlot + ?Sized>(
    disp: &Dispatcher<F>,
    f: &mut S,
    client: Option<&Arc<dyn ClientMem>>,
    scratch: &mut [u8],
    defer: Option<DeferFn<'_>>,
    mut start: Option<Start<'_, F::Io>>,
) -> Served {
    let hdr = f.in_header();
    let fence = f.take_fence();
    if fence.as_ref().is_some_and(|x| x.is_closed())
        && !Opcode::from_u32(hdr.opcode).is_some_and(runs_when_given_up)
    {
        // Given up by its client: it must not run, and nobody reads the
        // answer.
        f.set_reply(Errno::EINTR.to_wire(), 0);
        return Served::Answered;
    }
    // Started host I/O that changes something stays counted under the
    // fence until its token is handed back (a READ's buffers have their own guard).
    let started = |unique: u64| -> Option<IoDone> {
        let guard = match &fence {
            Some(x) => Some(x.enter()?),
            None => None,
        };
        let mut done = IoDone::new(unique);
        if let Some(g) = guard {
            done.hold(g);
        }
        Some(done)
    };

    let sz = f.request_payload_len();
    let mut opts = disp.decode_options();
    // A WRITE whose data is the payload buffer itself (no client memory)
    // is offered to start before `parts_mut`: the transport may hand out
    // that buffer as a slice only once it has taken back the memory it
    // lent of it (a kernel ring slot's does), and the filesystem gets the
    // data as `write_mem` alone, so it is not decoded (only `op_in`).
    if let (Some(st), None, true) = (
        lend(&mut start),
        &client,
        hdr.opcode == Opcode::Write as u32,
    ) {
        // Copied before the memory is lent: `parts_mut` takes back what
        // was lent before it.
        let op_in = f.parts_mut().0.op_in;
        if let Some(mem) = f.write_mem() {
            let o = abi::DecodeOptions {
                write_data_elsewhere: true,
                ..opts
            };
            if let Ok(req) = abi::decode_split(hdr, &op_in, &[], o) {
                if let Some(done) = started(hdr.unique) {
                    if disp.start_write(st, &req, &mem, done).is_ok() {
                        return Served::Started;
                    }
                }
            }
        }
    }
    // Client memory (a device's guest buffers) is apart from the payload
    // buffer: a WRITE from it is started below, with the payload decoded.
    let write_mem = match &start {
        Some(_) if hdr.opcode == Opcode::Write as u32 => client,
        _ => None,
    };
    // A zero-copy WRITE's reply, and a WRITE's by reference, go in `op_in`.
    let zc_write = (f.is_zero_copy() || client.is_some()) && hdr.opcode == Opcode::Write as u32;
    opts.write_data_elsewhere = client.is_some() && hdr.opcode == Opcode::Write as u32;
    let (header, payload) = f.parts_mut();
    let (inp, outp) = payload.split_at_mut(sz.min(payload.len()));
    // The reply goes to the payload buffer after the request's own payload
    // (moved to the front afterwards), or to scratch when that is too small.
    let use_scratch = zc_write || (outp.len() < 4096 && !inp.is_empty());
    let outcome = match abi::decode_split(hdr, &header.op_in, inp, opts) {
        Ok(req) => {
            if let (Some(st), Some(mem), true) =
                (lend(&mut start), client, hdr.opcode == Opcode::Read as u32)
            {
                if disp
                    .start_read(st, &req, mem, IoDone::new(hdr.unique))
                    .is_ok()
                {
                    return Served::Started;
                }
            }
            if let (Some(st), Some(mem)) = (lend(&mut start), write_mem) {
                if let Some(done) = started(hdr.unique) {
                    if disp.start_write(st, &req, mem, done).is_ok() {
                        return Served::Started;
                    }
                }
            }
            if let (Some(st), true) = (lend(&mut start), no_data(hdr.opcode)) {
                let done = if hdr.opcode == Opcode::Fallocate as u32 {
                    started(hdr.unique)
                } else {
                    // An FSYNC changes nothing: not counted under the fence.
                    Some(IoDone::new(hdr.unique))
                };
                if let Some(done) = done {
                    if disp.start_no_data(st, &req, done).is_ok() {
                        return Served::Started;
                    }
                }
            }
            let out: &mut [u8] = if use_scratch {
                &mut *scratch
            } else {
                &mut *outp
            };
            if let Some(f) = start.as_mut().and_then(|s| s.before_sync.as_mut()) {
                f();
            }
            match disp.handle_client_with(&req, out, defer, client.map(|c| &**c), fence.as_ref()) {
                Handled::Reply(o) => Some(o),
                Handled::NoReply => None,
                Handled::Parked => return Served::Parked,
            }
        }
        Err(_) => None,
    };
    let (error, len) = match outcome {
        Some(o) => (o.error, o.len),
        None => (Errno::EIO.to_wire(), 0),
    };
    // A READ into client memory: its data is there, nothing to move here
    // (and `len` may exceed this entry's buffer).
    let in_client = client.is_some() && hdr.opcode == Opcode::Read as u32;
    if error == 0 && len > 0 && !in_client {
        if zc_write {
            let n = len.min(URING_OP_IN_OUT_SZ);
            header.op_in[..n].copy_from_slice(&scratch[..n]);
        } else if use_scratch {
            payload[..len].copy_from_slice(&scratch[..len]);
        } else if sz > 0 {
            payload.copy_within(sz..sz + len, 0);
        }
    }
    f.set_reply(error, if zc_write { 0 } else { len });
    Served::Answered
}

/// The loop's context of `start`, lent again (for one offer).
fn lend<'b, I>(start: &'b mut Option<Start<'_, I>>) -> Option<Start<'b, I>> {
    start.as_mut().map(|s| Start::new(&mut *s.io, &mut *s.done))
}

/// Answers of parked requests, waiting for their worker.
type Answered = Arc<Mutex<Vec<(u64, i32)>>>;

/// Serves queue `qid` until the ring is torn down (pool mode when
/// `payload` is 0, else a per-entry payload buffer of that size).
///
/// The worker owns one entry, and one more for each of its requests that
/// is parked (a SETLKW waiting for its lock): a parked request keeps its
/// entry (its reply must go there) while the worker goes on serving on
/// another. When the parked request is answered, from whichever thread,
/// the worker is woken, commits the reply and takes the entry back.
/// Entries are reused, so their number stays at one plus the most
/// requests this worker ever had parked at once.
pub fn run_ring_worker<R: RingTransport, F: Filesystem>(
    ring: &R,
    qid: u16,
    payload: usize,
    fixed: Option<u16>,
    disp: &Dispatcher<F>,
) -> Result<(), Errno> {
    // ENOTCONN at any point is the connection going away: a clean end.
    match serve_queue(ring, qid, payload, fixed, disp) {
        Err(Errno::ENOTCONN) => Ok(()),
        r => r,
    }
}

fn serve_queue<R: RingTransport, F: Filesystem>(
    ring: &R,
    qid: u16,
    payload: usize,
    fixed: Option<u16>,
    disp: &Dispatcher<F>,
) -> Result<(), Errno> {
    let mut scratch = vec![0u8; 64 * 1024];
    // Entries waiting for a request (guarded by their own lock, taken
    // inside the ring's queue lock by `fetch_any`; never the other way).
    let idle: Arc<Mutex<Vec<R::Handle>>> = Arc::new(Mutex::new(Vec::new()));
    let answered: Answered = Arc::new(Mutex::new(Vec::new()));
    let mut parked: HashMap<u64, R::Slot> = HashMap::new();
    let first = ring.register(qid, payload, fixed)?;
    lock(&idle).push(first);
    let defer = |unique: u64| {
        let (answered, ring) = (answered.clone(), ring.clone());
        Deferred::new(move |error| {
            lock(&answered).push((unique, error));
            ring.wake(qid);
        })
    };
    loop {
        let done: Vec<(u64, i32)> = std::mem::take(&mut *lock(&answered));
        for (unique, error) in done {
            if let Some(mut slot) = parked.remove(&unique) {
                slot.set_reply(error, 0);
                let h = ring.commit(slot, fixed)?;
                lock(&idle).push(h);
            }
        }
        let entries = || lock(&idle).clone();
        let ready = || !lock(&answered).is_empty();
        let Some(mut slot) = ring.fetch_any(qid, &entries, &ready)? else {
            continue;
        };
        let h = R::handle_of(&slot);
        lock(&idle).retain(|&x| x != h);
        let unique = slot.in_header().unique;
        if answer_with(disp, &mut slot, &mut scratch, Some(&defer)) {
            parked.insert(unique, slot);
            if lock(&idle).is_empty() {
                let fresh = ring.register(qid, payload, fixed)?;
                lock(&idle).push(fresh);
            }
        } else {
            let h = ring.commit(slot, fixed)?;
            lock(&idle).push(h);
        }
    }
}
