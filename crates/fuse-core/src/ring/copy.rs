//! Payload copies between a request and its ring entry: the request's
//! arguments and data into the entry's buffer at fetch, the reply out of
//! it at commit; buffers lent to the entry go back to the request.

use super::*;

impl Ring {
    /// Copies a request into an entry's buffers, or hands over the client's
    /// pages on a zero-copy queue. Returns the payload, the request payload
    /// size, whether it is zero-copy, an error for a request that does not
    /// fit, and the buffers zero-copy did not need (given back to the entry
    /// and the pool).
    #[allow(clippy::type_complexity)]
    pub(super) fn copy_in(
        &self,
        req: &Arc<Request>,
        header: &mut UringReqHeader,
        pool_buf: Option<PoolBuf>,
        own: Option<Vec<u8>>,
        zero_copy_queue: bool,
    ) -> (
        Payload,
        usize,
        bool,
        Option<Errno>,
        Option<Vec<u8>>,
        Option<PoolBuf>,
    ) {
        let h = req.in_header();
        header.in_out = [0; abi::URING_IN_OUT_HEADER_SZ];
        header.in_out[..40].copy_from_slice(h.as_bytes());
        let body = &req.args.body;
        let k = op_in_size(req.args.opcode, self.opts)
            .min(body.len())
            .min(abi::URING_OP_IN_OUT_SZ);
        header.op_in = [0; abi::URING_OP_IN_OUT_SZ];
        header.op_in[..k].copy_from_slice(&body[..k]);
        let rest = &body[k..];
        let op = req.args.opcode;
        let zc = zero_copy_queue
            && client_mem(req).is_none()
            && matches!(op, Opcode::Read | Opcode::Write)
            && self
                .zc_files
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&read_fh(req));
        let mut d = req.data.lock().unwrap_or_else(|e| e.into_inner());
        if zc {
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
            return (Payload::Client(pages), n, true, None, own, pool_buf);
        }
        let mut payload = match (pool_buf, own) {
            (Some(b), own) => {
                if own.is_some() {
                    // Per-entry and pool modes are exclusive; keep the buffer.
                    return (Payload::Pool(b), 0, false, Some(Errno::EIO), own, None);
                }
                Payload::Pool(b)
            }
            (None, Some(v)) => Payload::Own(v),
            (None, None) => Payload::None,
        };
        let n = rest.len() + d.pages.len();
        let dst = payload.slice_mut();
        // A READ into client memory needs no room for its reply here.
        let out_here = if client_mem(req).is_some() {
            0
        } else {
            req.args.out_size
        };
        if n > dst.len() || out_here > dst.len() {
            return (payload, 0, false, Some(Errno::EIO), None, None);
        }
        dst[..rest.len()].copy_from_slice(rest);
        dst[rest.len()..n].copy_from_slice(&d.pages);
        (payload, n, false, None, None, None)
    }

    /// Returns client pages taken for zero-copy to their request (other
    /// payloads need no lock-free return and are dropped by the caller).
    pub(super) fn give_back(&self, req: &Arc<Request>, payload: Payload) {
        if let Payload::Client(v) = payload {
            let mut d = req.data.lock().unwrap_or_else(|e| e.into_inner());
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
        if client_read {
            self.apply(req, result, &[]);
            let mut d = req.data.lock().unwrap_or_else(|e| e.into_inner());
            d.out.clear();
            d.in_client = if ok { sz } else { 0 };
            return payload;
        }
        self.apply(req, result, if ok { &src[..sz] } else { &[] });
        let mut d = req.data.lock().unwrap_or_else(|e| e.into_inner());
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
