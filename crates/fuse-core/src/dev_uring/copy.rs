//! Payload copies between a request and its ring entry: the request's
//! arguments and data into the entry's buffer at fetch, the reply out of
//! it at commit; buffers lent to the entry go back to the request.

use super::*;

/// What copying a request into an entry gave ([`Ring::copy_in`]); small
/// and `Copy`, returned in registers.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct CopiedIn {
    /// The client's pages went instead (ENT_ZERO_COPY).
    pub zc: bool,
    /// The request does not fit the entry (EIO).
    pub err: Option<Errno>,
}

impl Ring {
    /// Copies a request into an entry's header and payload buffer (its
    /// own or a pool buffer, in `payload`), or hands over the client's
    /// pages on a zero-copy queue (then `payload` becomes them and the
    /// buffer it held goes to `spare`, for the entry and the pool). Fills
    /// `ring_ent_in_out` but its offset (set by the caller).
    #[inline]
    pub(super) fn copy_in(
        &self,
        req: &Arc<Request>,
        header: &mut UringReqHeader,
        payload: &mut Payload,
        zero_copy_queue: bool,
        spare: &mut Payload,
    ) -> CopiedIn {
        let h = req.in_header();
        let hb = h.as_bytes();
        header.in_out[..hb.len()].copy_from_slice(hb);
        header.in_out[hb.len()..].fill(0);
        let body = &req.args.body;
        let op = req.args.opcode;
        let k = op_in_size(op, self.opts)
            .min(body.len())
            .min(abi::URING_OP_IN_OUT_SZ);
        header.op_in[..k].copy_from_slice(&body[..k]);
        header.op_in[k..].fill(0);
        let rest = &body[k..];
        let e = &mut header.ring_ent_in_out;
        e.flags = 0;
        e.commit_id = req.unique();
        e.payload_sz = 0;
        e.reserved = 0;
        let zc = zero_copy_queue && self.goes_zero_copy(true, req);
        if zc {
            let mut d = lock(&req.data);
            // The client's pages themselves: no payload copy at all.
            let (pages, n) = if op == Opcode::Write {
                let p = std::mem::take(&mut d.pages);
                let n = p.len();
                (p, n)
            } else {
                // The client's buffer as it is: no clearing, like user pages.
                let mut out = std::mem::take(&mut d.out);
                out.resize(req.args.out_size, 0);
                (out, 0)
            };
            header.ring_ent_in_out.flags = uring::ENT_ZERO_COPY;
            header.ring_ent_in_out.payload_sz = n as u32;
            *spare = std::mem::replace(payload, Payload::Client(pages));
            return CopiedIn {
                zc: true,
                err: None,
            };
        }
        let fail = CopiedIn {
            zc: false,
            err: Some(Errno::EIO),
        };
        // The client's data pages (none when its length says so: the
        // request's data lock is not needed then).
        let n = rest.len()
            + if client_mem(req).is_some() {
                0
            } else {
                req.data_len
            };
        let dst = payload.slice_mut();
        // A READ into client memory needs no room for its reply here.
        let out_here = if client_mem(req).is_some() {
            0
        } else {
            req.args.out_size
        };
        if n > dst.len() || out_here > dst.len() {
            return fail;
        }
        dst[..rest.len()].copy_from_slice(rest);
        if n > rest.len() {
            let d = lock(&req.data);
            let Some(to) = dst.get_mut(rest.len()..rest.len() + d.pages.len()) else {
                return fail;
            };
            to.copy_from_slice(&d.pages);
        }
        header.ring_ent_in_out.payload_sz = n as u32;
        CopiedIn::default()
    }

    /// Returns client pages taken for zero-copy to their request (other
    /// payloads need no lock-free return and are dropped by the caller).
    pub(super) fn give_back(&self, req: &Arc<Request>, payload: Payload) {
        if let Payload::Client(v) = payload {
            let mut d = lock(&req.data);
            if req.args.opcode == Opcode::Write {
                d.pages = v;
            } else {
                d.out = v;
            }
        }
    }

    /// Applies a committed result to its request; returns the payload
    /// buffer the entry keeps (its own or its pool buffer). The reply of a
    /// zero-copy WRITE or of a WRITE by reference (`fuse_write_out`)
    /// travels in `op_in`, since its payload buffer is the client's data
    /// or none.
    pub(super) fn copy_out(
        &self,
        req: &Arc<Request>,
        header: &UringReqHeader,
        payload: Payload,
        stopped: bool,
    ) -> Payload {
        let oh = OutHeader::read_from_prefix(&header.in_out)
            .map(|(h, _)| h)
            .unwrap_or_default();
        let sz = header.ring_ent_in_out.payload_sz as usize;
        let zc_write = matches!(payload, Payload::Client(_)) && req.args.opcode == Opcode::Write;
        // A WRITE whose data is the client's memory by reference answers
        // in `op_in` too: its entry needs no payload buffer at all.
        let in_op_in = zc_write || (req.args.opcode == Opcode::Write && client_mem(req).is_some());
        let src: &[u8] = if in_op_in {
            &header.op_in[..]
        } else {
            payload.slice()
        };
        let sz = if in_op_in {
            req.args.out_size.min(std::mem::size_of::<abi::WriteOut>())
        } else {
            sz
        };
        // A READ into client memory: its data is already there.
        let client_read = req.args.opcode == Opcode::Read && client_mem(req).is_some();
        let size_ok = (client_read || sz <= src.len())
            && sz <= req.args.out_size
            && (sz == req.args.out_size || req.args.out_var);
        let result = if stopped {
            Err(Errno::ECONNABORTED)
        } else if oh.unique != req.unique() || oh.error > 0 || oh.error <= -512 {
            Err(Errno::EIO)
        } else if oh.error != 0 {
            Err(Errno(-oh.error))
        } else if !size_ok {
            Err(Errno::EIO)
        } else {
            Ok(())
        };
        let ok = result.is_ok();
        if ok && !client_read {
            self.note_zero_copy(req, &src[..sz]);
        }
        // The result and the reply under one lock of the request's data.
        let mut d = lock(&req.data);
        d.error = match result {
            Ok(()) => 0,
            Err(e) => e.0,
        };
        if client_read {
            d.out.clear();
            d.in_client = if ok { sz } else { 0 };
            return payload;
        }
        match payload {
            Payload::Client(v) if zc_write => {
                d.pages = v;
                d.out = if ok {
                    header.op_in[..sz].to_vec()
                } else {
                    Vec::new()
                };
                Payload::None
            }
            Payload::Client(mut v) => {
                // A zero-copy READ's data is already in the client's buffer.
                v.truncate(if ok { sz } else { 0 });
                d.out = v;
                Payload::None
            }
            p => {
                if ok {
                    d.out.clear();
                    if in_op_in {
                        d.out.extend_from_slice(&header.op_in[..sz]);
                    } else {
                        d.out.extend_from_slice(&p.slice()[..sz]);
                    }
                }
                p
            }
        }
    }
}
