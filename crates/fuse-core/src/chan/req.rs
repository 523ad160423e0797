//! Requests: the kernel's flag set, the list a request sits on (an explicit
//! state machine), its arguments and its reply.

use super::{client_mem::ClientMem, errno::Errno, fence::Fence, Core};
use crate::abi::{InHeader, Opcode};
use crate::sync::{
    get_mut, lock, Arc, AtomicBool, AtomicU32, AtomicU64, AtomicU8, Condvar, Mutex, Ordering, Weak,
};
use std::time::Duration;

/// One bit per kernel request flag (`enum fuse_req_flag`).
pub mod flag {
    /// The request expects a reply.
    pub const ISREPLY: u32 = 1 << 0;
    /// Sent regardless of admission and signals (e.g. INIT, RELEASE).
    pub const FORCE: u32 = 1 << 1;
    /// A background request: counted in num_background.
    pub const BACKGROUND: u32 = 1 << 2;
    /// Counted in num_waiting.
    pub const WAITING: u32 = 1 << 3;
    /// The connection was aborted while the request was being copied.
    pub const ABORTED: u32 = 1 << 4;
    /// The requester was signalled.
    pub const INTERRUPTED: u32 = 1 << 5;
    /// Data is being copied to or from the request: the aborter must not end it.
    pub const LOCKED: u32 = 1 << 6;
    /// On the input queue, not yet read by the server.
    pub const PENDING: u32 = 1 << 7;
    /// Read by the server, awaiting its reply.
    pub const SENT: u32 = 1 << 8;
    /// Ended; set exactly once (test-and-set guards a double end).
    pub const FINISHED: u32 = 1 << 9;
    /// Taken private by the aborter.
    pub const PRIVATE: u32 = 1 << 10;
    /// Has an end callback instead of a waiting requester.
    pub const ASYNC: u32 = 1 << 11;
    /// Travels over a ring queue.
    pub const URING: u32 = 1 << 12;
}

/// Atomic request flags (the kernel's `req->flags` bit operations).
#[derive(Debug, Default)]
pub(crate) struct Flags(AtomicU32);

impl Flags {
    pub(crate) fn new(bits: u32) -> Self {
        Flags(AtomicU32::new(bits))
    }
    pub(crate) fn test(&self, f: u32) -> bool {
        self.0.load(Ordering::SeqCst) & f != 0
    }
    pub(crate) fn set(&self, f: u32) {
        self.0.fetch_or(f, Ordering::SeqCst);
    }
    pub(crate) fn clear(&self, f: u32) {
        self.0.fetch_and(!f, Ordering::SeqCst);
    }
    /// Sets `f`; returns every flag as it was before.
    pub(crate) fn fetch_set(&self, f: u32) -> u32 {
        self.0.fetch_or(f, Ordering::SeqCst)
    }
    pub(crate) fn bits(&self) -> u32 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Where a request is: the request lifecycle as an explicit state machine.
/// Each state names the lock that guards the list the request is on, and a
/// transition is made only while holding that lock.
///
/// ```text
/// New ──admit──> BgQueue (bg_lock) ──flush──> Pending (iq lock)
/// New ──────────────────────────────────────> Pending (iq lock)
/// Pending ──read──> Io (pq lock, LOCKED while copying) ──> Processing (pq lock, SENT)
/// Processing ──reply──> Io (pq lock, LOCKED while copying) ──> Ended
/// Processing ──resend──> Pending (iq lock)
/// any ──abort──> Ended (unless LOCKED: the copier ends it)
/// Pending ──kill──> Ended (never reached the server)
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Location {
    /// Built, not yet on any list.
    New = 0,
    /// On the background queue (guarded by `bg_lock`).
    BgQueue = 1,
    /// On the input queue's pending list (guarded by the iq lock).
    Pending = 2,
    /// On the io list while being copied (guarded by the pq lock).
    Io = 3,
    /// On the processing list, awaiting a reply (guarded by the pq lock).
    Processing = 4,
    /// Owned by a transport other than the in-process device.
    Transport = 5,
    /// Ended.
    Ended = 6,
}

impl Location {
    fn from_u8(v: u8) -> Location {
        match v {
            0 => Location::New,
            1 => Location::BgQueue,
            2 => Location::Pending,
            3 => Location::Io,
            4 => Location::Processing,
            5 => Location::Transport,
            _ => Location::Ended,
        }
    }

    /// Whether `self -> to` is a transition of the lifecycle above.
    pub fn can_move_to(self, to: Location) -> bool {
        use Location::*;
        matches!(
            (self, to),
            (New, BgQueue)
                | (New, Pending)
                | (New, Transport)
                | (BgQueue, Pending)
                | (BgQueue, Transport)
                | (Pending, Io)
                | (Io, Processing)
                | (Processing, Io)
                | (Processing, Pending)
                | (Transport, Pending)
                | (_, Ended)
        )
    }
}

/// A request's arguments after `fuse_in_header`, kept inline up to 64
/// bytes (every fixed-size op struct but SETATTR's, and short names), so
/// most requests need no allocation for them.
pub type ArgBody = smallvec::SmallVec<[u8; 64]>;

/// Arguments of a request, as a client builds them.
#[derive(Debug, Clone)]
pub struct Args {
    /// Opcode.
    pub opcode: Opcode,
    /// Target node id.
    pub nodeid: u64,
    /// Caller credentials.
    pub uid: u32,
    /// Caller credentials.
    pub gid: u32,
    /// Caller pid.
    pub pid: u32,
    /// Everything after `fuse_in_header` (arguments and extensions), except
    /// `data`.
    pub body: ArgBody,
    /// The client's data pages (WRITE payload), sent after `body`. Kept
    /// apart so a zero-copy transport can hand them over by reference.
    pub data: Vec<u8>,
    /// Length of the extensions at the end of `body`, in 8-byte units.
    pub total_extlen: u16,
    /// Maximum size of the reply payload.
    pub out_size: usize,
    /// A buffer to receive the reply in (its capacity is reused; a
    /// zero-copy READ hands it to the server as the client's pages).
    pub out_buf: Vec<u8>,
    /// Whether a shorter reply payload is allowed (`out_argvar`).
    pub out_var: bool,
    /// Bypass admission and ignore signals (INIT, RELEASE, FORGET-like).
    pub force: bool,
    /// A fatal signal to the requester aborts the whole connection.
    pub abort_on_kill: bool,
    /// Transport queue hint (ring queue, virtqueue index).
    pub qid: u16,
    /// Goes to the connection's transport (the device) even when the ring
    /// carries requests: for a request that may wait for a long time
    /// without work to do (a SETLKW), which on the ring would hold an
    /// entry and its payload buffer the whole time. A fusebox extension;
    /// the kernel sends everything over the ring once it is up.
    pub over_device: bool,
    /// The client's own memory for a READ's data or a WRITE's data (then
    /// `data` is empty), handed to the server by reference on the ring.
    pub client: Option<std::sync::Arc<dyn ClientMem>>,
    /// The group the request belongs to, which the client closes when it
    /// gives them up ([`Fence`]): the server then never acts on it.
    pub fence: Option<std::sync::Arc<Fence>>,
}

impl Args {
    /// A request with no body and no reply payload.
    #[inline]
    pub fn new(opcode: Opcode, nodeid: u64) -> Self {
        Args {
            opcode,
            nodeid,
            uid: 0,
            gid: 0,
            pid: 0,
            body: ArgBody::new(),
            data: Vec::new(),
            total_extlen: 0,
            out_size: 0,
            out_buf: Vec::new(),
            out_var: false,
            force: false,
            abort_on_kill: false,
            qid: 0,
            over_device: false,
            client: None,
            fence: None,
        }
    }
    /// Sets the body.
    #[inline]
    pub fn body(mut self, body: impl Into<ArgBody>) -> Self {
        self.body = body.into();
        self
    }
    /// Sets the client's data pages (sent after the body).
    #[inline]
    pub fn data(mut self, data: Vec<u8>) -> Self {
        self.data = data;
        self
    }
    /// Sets the expected reply payload: exactly `size` bytes, or at most
    /// `size` when `var`.
    #[inline]
    pub fn out(mut self, size: usize, var: bool) -> Self {
        self.out_size = size;
        self.out_var = var;
        self
    }
    /// Gives a buffer to receive the reply in (see `Args::out_buf`).
    #[inline]
    pub fn out_buf(mut self, buf: Vec<u8>) -> Self {
        self.out_buf = buf;
        self
    }
    /// Marks the request FORCE.
    #[inline]
    pub fn force(mut self) -> Self {
        self.force = true;
        self
    }
    /// Marks the request abort-on-kill.
    #[inline]
    pub fn abort_on_kill(mut self) -> Self {
        self.abort_on_kill = true;
        self
    }
    /// Sets the caller's credentials.
    #[inline]
    pub fn creds(mut self, uid: u32, gid: u32, pid: u32) -> Self {
        self.uid = uid;
        self.gid = gid;
        self.pid = pid;
        self
    }
    /// Sends it over the device even when the ring is up (see
    /// `Args::over_device`).
    #[inline]
    pub fn over_device(mut self) -> Self {
        self.over_device = true;
        self
    }
    /// Sets the transport queue hint.
    #[inline]
    pub fn qid(mut self, qid: u16) -> Self {
        self.qid = qid;
        self
    }
    /// Attaches the client's memory: a READ's destination (its length is
    /// the most the READ returns) or a WRITE's data (its length must be the
    /// WRITE's size). Other requests ignore it.
    #[inline]
    pub fn client(mut self, mem: std::sync::Arc<dyn ClientMem>) -> Self {
        self.client = Some(mem);
        self
    }
    /// Puts the request under `fence` (see [`Args::fence`]).
    #[inline]
    pub fn fence(mut self, fence: std::sync::Arc<Fence>) -> Self {
        self.fence = Some(fence);
        self
    }
}

/// A successful reply: the payload after `fuse_out_header`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplyPayload {
    /// Reply payload.
    pub data: Vec<u8>,
    /// The client's data pages (`Args::data`), given back for reuse.
    pub pages: Vec<u8>,
    /// Bytes of the reply payload that the server put straight into the
    /// request's client memory (`Args::client`) instead of `data`.
    pub in_client: usize,
}

impl ReplyPayload {
    /// Reads a struct from the start of the payload.
    pub fn read<T: zerocopy::FromBytes>(&self) -> Option<T> {
        T::read_from_prefix(&self.data).ok().map(|(v, _)| v)
    }
}

/// Outcome of a request.
pub type ReqResult = Result<ReplyPayload, Errno>;

/// What runs when a background request ends, once, with its result: a
/// boxed closure, or a handler the caller holds anyway (no allocation per
/// request).
pub enum EndFn {
    /// A closure ([`EndFn::once`]).
    Once(Box<dyn FnOnce(ReqResult) + Send>),
    /// A shared handler, told the result ([`RequestEnd`]).
    Shared(std::sync::Arc<dyn RequestEnd>),
}

/// A request's end handler for [`EndFn::Shared`]: typically the caller's
/// own record of the request.
pub trait RequestEnd: Send + Sync {
    /// The request ended with `r`.
    fn end(self: std::sync::Arc<Self>, r: ReqResult);
}

impl EndFn {
    /// `f`, boxed.
    pub fn once(f: impl FnOnce(ReqResult) + Send + 'static) -> EndFn {
        EndFn::Once(Box::new(f))
    }

    /// Runs it with the request's result.
    pub fn call(self, r: ReqResult) {
        match self {
            EndFn::Once(f) => f(r),
            EndFn::Shared(h) => h.end(r),
        }
    }
}

impl std::fmt::Debug for EndFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EndFn::Once(_) => "EndFn::Once",
            EndFn::Shared(_) => "EndFn::Shared",
        })
    }
}

/// Mutable per-request data, guarded by `Request::data` (the kernel's
/// `req->waitq.lock`).
pub(crate) struct ReqData {
    /// Error to report (positive errno), 0 for success.
    pub error: i32,
    /// Reply payload buffer. Moved out to the writer while LOCKED, so nobody
    /// else can touch or free it during the copy.
    pub out: Vec<u8>,
    /// End callback (ASYNC requests).
    pub end: Option<EndFn>,
    /// The client's data pages (from `Args::data`). Moved to a zero-copy
    /// server while it works on them and moved back before the end.
    pub pages: Vec<u8>,
    /// Reply bytes written straight into `Args::client`.
    pub in_client: usize,
}

/// One request. Shared (`Arc`) between the requester and whichever list it
/// is on; `flags` are atomic, everything else is immutable or under `data`.
pub(crate) struct Request {
    /// Unique id (even); the RESEND bit may be set by a resend.
    pub unique: AtomicU64,
    pub flags: Flags,
    loc: AtomicU8,
    pub args: Args,
    /// Length of the client's data: its pages, or the client memory of a
    /// WRITE sent by reference.
    pub data_len: usize,
    /// When it was allocated, on the connection's clock.
    pub create_time: Duration,
    pub data: Mutex<ReqData>,
    /// Signalled when FINISHED is set (the requester's wait queue).
    pub waitq: Condvar,
    /// Whether the request is on the iq's interrupt list (guarded by iq lock;
    /// the kernel's `!list_empty(&req->intr_entry)`).
    pub intr_queued: AtomicBool,
    /// Back-reference for ending the request and for num_waiting.
    pub core: Weak<Core>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("unique", &self.unique())
            .field("opcode", &self.args.opcode)
            .field("flags", &format_args!("{:#x}", self.flags.bits()))
            .field("loc", &self.location())
            .finish()
    }
}

impl Request {
    pub(crate) fn new(
        core: &Arc<Core>,
        unique: u64,
        args: Args,
        flags: u32,
        create_time: Duration,
        end: Option<EndFn>,
    ) -> Arc<Request> {
        Arc::new(Request::build(
            Arc::downgrade(core),
            unique,
            args,
            flags,
            create_time,
            end,
        ))
    }

    /// [`Request::new`] into `slot`, reusing the request there (one
    /// recycled with [`Request::recycle`]: its allocation and its handle
    /// on the connection) when nobody else holds it, which is always
    /// unless a `Weak` was made of it since.
    #[inline]
    pub(crate) fn renew(
        slot: &mut Arc<Request>,
        unique: u64,
        args: Args,
        flags: u32,
        create_time: Duration,
        end: Option<EndFn>,
    ) {
        match Arc::get_mut(slot) {
            Some(r) => r.reset(unique, args, flags, create_time, end),
            None => {
                let core = slot.core.clone();
                *slot = Arc::new(Request::build(core, unique, args, flags, create_time, end));
            }
        }
    }

    /// [`Request::build`] in place, in a request nobody else holds: each
    /// field set anew (what it still held is dropped; its handle on the
    /// connection is kept).
    #[inline]
    fn reset(
        &mut self,
        unique: u64,
        args: Args,
        flags: u32,
        create_time: Duration,
        end: Option<EndFn>,
    ) {
        // Moved once, into place; its buffers are taken from there.
        self.args = args;
        if self.flags.test(flag::WAITING) {
            // What dropping it would do (a recycled request no longer is).
            if let Some(core) = self.core.upgrade() {
                core.drop_waiting();
            }
        }
        let (out, pages, data_len) = Request::take_bufs(&mut self.args);
        self.unique = AtomicU64::new(unique);
        self.flags = Flags::new(flags);
        self.loc = AtomicU8::new(Location::New as u8);
        self.data_len = data_len;
        self.create_time = create_time;
        *get_mut(&mut self.data) = ReqData {
            error: 0,
            out,
            end,
            pages,
            in_client: 0,
        };
        // `waitq` has no waiter: nobody else holds the request.
        self.intr_queued = AtomicBool::new(false);
    }

    /// Moves the reply buffer (with room for the reply reserved) and the
    /// data pages out of `args`; returns them and the data's length.
    #[inline]
    fn take_bufs(args: &mut Args) -> (Vec<u8>, Vec<u8>, usize) {
        let mut out = std::mem::take(&mut args.out_buf);
        // A READ into client memory replies there: nothing to reserve.
        let in_client = args.client.is_some() && args.opcode == Opcode::Read;
        if !in_client && out.capacity() < args.out_size {
            out.reserve(args.out_size.min(1 << 20));
        }
        let pages = std::mem::take(&mut args.data);
        let data_len = match &args.client {
            Some(c) if args.opcode == Opcode::Write => c.len(),
            _ => pages.len(),
        };
        (out, pages, data_len)
    }

    fn build(
        core: Weak<Core>,
        unique: u64,
        mut args: Args,
        flags: u32,
        create_time: Duration,
        end: Option<EndFn>,
    ) -> Request {
        let (out, pages, data_len) = Request::take_bufs(&mut args);
        Request {
            unique: AtomicU64::new(unique),
            flags: Flags::new(flags),
            loc: AtomicU8::new(Location::New as u8),
            data_len,
            args,
            create_time,
            data: Mutex::new(ReqData {
                error: 0,
                out,
                end,
                pages,
                in_client: 0,
            }),
            waitq: Condvar::new(),
            intr_queued: AtomicBool::new(false),
            core,
        }
    }

    /// Takes an ended request that nobody else holds for reuse by
    /// [`Request::renew`]: it stops counting as waiting (what dropping it
    /// would do; returns whether it was, for the caller to uncount) and
    /// lets go of the client's memory. None when someone else still holds
    /// it (then it is just dropped).
    pub(crate) fn recycle(mut req: Arc<Request>) -> Option<(Arc<Request>, bool)> {
        let r = Arc::get_mut(&mut req)?;
        let waiting = r.flags.test(flag::WAITING);
        r.flags = Flags::new(flag::FINISHED);
        // A spare keeps nothing of the client's.
        r.args.client = None;
        r.args.fence = None;
        r.args.body = ArgBody::new();
        Some((req, waiting))
    }

    pub(crate) fn unique(&self) -> u64 {
        self.unique.load(Ordering::SeqCst)
    }

    pub(crate) fn location(&self) -> Location {
        Location::from_u8(self.loc.load(Ordering::SeqCst))
    }

    /// Moves the request to `Ended` (from anywhere: always valid);
    /// returns where it was.
    pub(crate) fn end_location(&self) -> Location {
        Location::from_u8(self.loc.swap(Location::Ended as u8, Ordering::SeqCst))
    }

    /// Moves the request to `to`. The caller holds the lock guarding the
    /// destination list. An invalid transition is reported, never a panic.
    pub(crate) fn move_to(&self, to: Location) -> Result<(), (Location, Location)> {
        let from = self.location();
        if !from.can_move_to(to) {
            return Err((from, to));
        }
        self.loc.store(to as u8, Ordering::SeqCst);
        Ok(())
    }

    /// The `fuse_in_header` for this request.
    pub(crate) fn in_header(&self) -> InHeader {
        InHeader {
            len: self.wire_len() as u32,
            opcode: self.args.opcode as u32,
            unique: self.unique(),
            nodeid: self.args.nodeid,
            uid: self.args.uid,
            gid: self.args.gid,
            pid: self.args.pid,
            total_extlen: self.args.total_extlen,
            padding: 0,
        }
    }

    /// Total request size as the server sees it.
    pub(crate) fn wire_len(&self) -> usize {
        std::mem::size_of::<InHeader>() + self.args.body.len() + self.data_len
    }

    /// Records the result to report (positive errno or 0).
    pub(crate) fn set_error(&self, e: i32) {
        lock(&self.data).error = e;
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if self.flags.test(flag::WAITING) {
            if let Some(core) = self.core.upgrade() {
                core.drop_waiting();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{CreateIn, FlushIn, GetattrIn, ReadIn, ReleaseIn, SetattrIn, WriteIn};
    use zerocopy::{FromZeros, IntoBytes};

    fn body_of(parts: &[&[u8]]) -> ArgBody {
        let mut b = ArgBody::new();
        for p in parts {
            b.extend_from_slice(p);
        }
        b
    }

    #[test]
    fn the_bodies_of_frequent_requests_are_kept_inline() {
        let name = [b'n'; 47];
        let inline: [(&str, ArgBody); 7] = [
            ("READ", body_of(&[ReadIn::new_zeroed().as_bytes()])),
            ("WRITE", body_of(&[WriteIn::new_zeroed().as_bytes()])),
            ("GETATTR", body_of(&[GetattrIn::new_zeroed().as_bytes()])),
            ("FLUSH", body_of(&[FlushIn::new_zeroed().as_bytes()])),
            ("RELEASE", body_of(&[ReleaseIn::new_zeroed().as_bytes()])),
            (
                "CREATE with a 47-byte name",
                body_of(&[CreateIn::new_zeroed().as_bytes(), &name, b"\0"]),
            ),
            ("LOOKUP of a 63-byte name", body_of(&[&[b'n'; 63], b"\0"])),
        ];
        for (what, b) in inline {
            let a = Args::new(Opcode::Getattr, 1).body(b.clone());
            assert!(!a.body.spilled(), "{what}: {} bytes allocated", b.len());
            assert_eq!(&a.body[..], &b[..], "{what}");
        }
        // Longer bodies still work, on the heap.
        let setattr = body_of(&[SetattrIn::new_zeroed().as_bytes()]);
        let a = Args::new(Opcode::Setattr, 1).body(setattr.to_vec());
        assert!(a.body.spilled());
        assert_eq!(a.body.len(), std::mem::size_of::<SetattrIn>());
    }
}
