//! Ring-style worker: one entry, COMMIT_AND_FETCH in a loop. It depends on
//! the ring ABI (header layout, split arguments), not on engine internals.

use super::{Dispatcher, Filesystem};
use crate::abi::{self, Opcode, URING_OP_IN_OUT_SZ};
use crate::chan::Errno;
use crate::ring::{EntryBufs, Fetched, RingEnd};

/// Answers the request in `f` with `disp`, writing the reply into the
/// entry (payload buffer, or `op_in` for a zero-copy WRITE).
pub fn answer<F: Filesystem>(disp: &Dispatcher<F>, f: &mut Fetched, scratch: &mut [u8]) {
    let hdr = f.in_header();
    let sz = f.request_payload().len();
    let zc_write = f.is_zero_copy() && hdr.opcode == Opcode::Write as u32;
    let opts = disp.decode_options();
    let (header, payload) = f.parts_mut();
    let (inp, outp) = payload.split_at_mut(sz.min(payload.len()));
    // The reply goes to the payload buffer after the request's own payload
    // (moved to the front afterwards), or to scratch when that is too small.
    let use_scratch = zc_write || outp.len() < 4096 && !inp.is_empty();
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

/// Registers one entry on queue `qid` (pool mode when `payload` is 0,
/// otherwise a per-entry payload buffer of that size) and serves it until
/// the ring is torn down.
pub fn run_ring_worker<F: Filesystem>(
    ring: &RingEnd,
    qid: u16,
    payload: usize,
    fixed: Option<u16>,
    disp: &Dispatcher<F>,
) -> Result<(), Errno> {
    let bufs = if payload == 0 {
        EntryBufs::pooled()
    } else {
        EntryBufs::with_payload(payload)
    };
    // ENOTCONN at any point is the connection going away: a clean end.
    let h = match ring.register(&crate::ring::cmd_area(qid, 0, 0), bufs, fixed) {
        Ok(h) => h,
        Err(Errno::ENOTCONN) => return Ok(()),
        Err(e) => return Err(e),
    };
    let mut scratch = vec![0u8; 64 * 1024];
    let mut f = match ring.fetch(h, true) {
        Ok(Some(f)) => f,
        Ok(None) => return Err(Errno::EAGAIN),
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
