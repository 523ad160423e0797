//! Ring-style worker: one entry, COMMIT_AND_FETCH in a loop. It sees the
//! ring only through [`RingSlot`] and [`RingTransport`] (the kernel's ring
//! ABI: the 288-byte header, split arguments, a payload buffer), so the
//! same code serves the emulated ring and, later, the kernel's.

use super::{Dispatcher, Filesystem};
use crate::abi::{self, InHeader, Opcode, UringReqHeader, URING_OP_IN_OUT_SZ};
use crate::chan::Errno;
use crate::ring::{EntryBufs, Fetched, RingEnd};

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
    /// Records the reply (error, and payload bytes written).
    fn set_reply(&mut self, error: i32, len: usize);
}

/// A ring a worker can serve.
pub trait RingTransport {
    /// An entry holding a request.
    type Slot: RingSlot;
    /// Registers an entry on `qid` (pool mode when `payload` is 0) and waits
    /// for its first request.
    fn register_and_fetch(
        &self,
        qid: u16,
        payload: usize,
        fixed: Option<u16>,
    ) -> Result<Self::Slot, Errno>;
    /// Commits a slot and waits for its next request.
    fn commit_and_fetch(&self, slot: Self::Slot, fixed: Option<u16>) -> Result<Self::Slot, Errno>;
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
}

impl RingTransport for RingEnd {
    type Slot = Fetched;
    fn register_and_fetch(
        &self,
        qid: u16,
        payload: usize,
        fixed: Option<u16>,
    ) -> Result<Fetched, Errno> {
        let bufs = if payload == 0 {
            EntryBufs::pooled()
        } else {
            EntryBufs::with_payload(payload)
        };
        let h = self.register(&crate::ring::cmd_area(qid, 0, 0), bufs, fixed)?;
        self.fetch(h, true)?.ok_or(Errno::EAGAIN)
    }
    fn commit_and_fetch(&self, slot: Fetched, fixed: Option<u16>) -> Result<Fetched, Errno> {
        RingEnd::commit_and_fetch(self, slot, fixed)
    }
}

/// Answers the request in `f` with `disp`, writing the reply into the
/// entry (payload buffer, or `op_in` for a zero-copy WRITE).
pub fn answer<F: Filesystem, S: RingSlot + ?Sized>(
    disp: &Dispatcher<F>,
    f: &mut S,
    scratch: &mut [u8],
) {
    let hdr = f.in_header();
    let sz = f.request_payload_len();
    let zc_write = f.is_zero_copy() && hdr.opcode == Opcode::Write as u32;
    let opts = disp.decode_options();
    let (header, payload) = f.parts_mut();
    let (inp, outp) = payload.split_at_mut(sz.min(payload.len()));
    // The reply goes to the payload buffer after the request's own payload
    // (moved to the front afterwards), or to scratch when that is too small.
    let use_scratch = zc_write || (outp.len() < 4096 && !inp.is_empty());
    let outcome = match abi::decode_split(hdr, &header.op_in, inp, opts) {
        Ok(req) => {
            let out: &mut [u8] = if use_scratch {
                &mut *scratch
            } else {
                &mut *outp
            };
            disp.handle(&req, out)
        }
        Err(_) => None,
    };
    let (error, len) = match outcome {
        Some(o) => (o.error, o.len),
        None => (Errno::EIO.to_wire(), 0),
    };
    if error == 0 && len > 0 {
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
}

/// Serves one entry of queue `qid` until the ring is torn down (pool mode
/// when `payload` is 0, else a per-entry payload buffer of that size).
pub fn run_ring_worker<R: RingTransport, F: Filesystem>(
    ring: &R,
    qid: u16,
    payload: usize,
    fixed: Option<u16>,
    disp: &Dispatcher<F>,
) -> Result<(), Errno> {
    let mut scratch = vec![0u8; 64 * 1024];
    // ENOTCONN at any point is the connection going away: a clean end.
    let mut f = match ring.register_and_fetch(qid, payload, fixed) {
        Ok(f) => f,
        Err(Errno::ENOTCONN) => return Ok(()),
        Err(e) => return Err(e),
    };
    loop {
        answer(disp, &mut f, &mut scratch);
        f = match ring.commit_and_fetch(f, fixed) {
            Ok(f) => f,
            Err(Errno::ENOTCONN) => return Ok(()),
            Err(e) => return Err(e),
        };
    }
}
