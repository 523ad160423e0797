//! What a server holds while it works on a request: [`Fetched`].

use super::pool::PoolBuf;
use super::{EntHandle, Ring};
use crate::abi::{self, uring, InHeader, OutHeader, UringCmdReq, UringReqHeader};
use crate::sync::Arc;
use zerocopy::{FromBytes, IntoBytes};

pub(crate) enum Payload {
    None,
    Own(Vec<u8>),
    Pool(PoolBuf),
    Client(Vec<u8>),
}

impl Payload {
    pub(crate) fn slice(&self) -> &[u8] {
        match self {
            Payload::None => &[],
            Payload::Own(v) | Payload::Client(v) => v,
            Payload::Pool(b) => &b.mem,
        }
    }
    pub(crate) fn slice_mut(&mut self) -> &mut [u8] {
        match self {
            Payload::None => &mut [],
            Payload::Own(v) | Payload::Client(v) => v,
            Payload::Pool(b) => &mut b.mem,
        }
    }
}

/// An entry handed to the server with its request: the header, and the
/// payload buffer (its own, a pool buffer, or the client's pages). Commit
/// it with [`RingEnd::commit`](super::RingEnd::commit); dropping it without committing gives the
/// buffers back and fails the request with EIO.
pub struct Fetched {
    /// The 288-byte header: `in_out` holds `fuse_in_header` on fetch and
    /// must hold `fuse_out_header` on commit; `op_in` the op struct.
    pub header: Box<UringReqHeader>,
    /// Everything else. The drop guard lives here rather than on
    /// `Fetched`, so a commit moves the header back to its entry (no new
    /// header per request); a dropped `Fetched` loses its header, and the
    /// entry's next fetch makes one.
    pub(crate) held: Held,
}

/// What a [`Fetched`] holds besides its header; dropping it uncommitted
/// abandons the entry.
pub(crate) struct Held {
    pub(crate) ring: Arc<Ring>,
    pub(crate) handle: EntHandle,
    pub(crate) payload: Payload,
    /// The client memory of a READ or WRITE sent by reference.
    pub(crate) client: Option<Arc<dyn crate::chan::ClientMem>>,
    /// The request's [`crate::Fence`] (`Args::fence`), if it has one.
    pub(crate) fence: Option<Arc<crate::chan::Fence>>,
    pub(crate) done: bool,
}

impl Held {
    /// Takes the payload for a commit (the entry is no longer abandoned
    /// when this is dropped).
    pub(crate) fn take_for_commit(&mut self) -> Payload {
        self.done = true;
        std::mem::replace(&mut self.payload, Payload::None)
    }
}

impl std::fmt::Debug for Fetched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetched")
            .field("handle", &self.held.handle)
            .finish_non_exhaustive()
    }
}

impl Fetched {
    /// The entry.
    pub fn handle(&self) -> EntHandle {
        self.held.handle
    }
    /// The request's `fuse_in_header`.
    pub fn in_header(&self) -> InHeader {
        InHeader::read_from_prefix(&self.header.in_out)
            .map(|(h, _)| h)
            .unwrap_or_default()
    }
    /// The id to commit with (the request's unique).
    pub fn commit_id(&self) -> u64 {
        self.header.ring_ent_in_out.commit_id
    }
    /// The request's payload (arguments after the op struct).
    pub fn request_payload(&self) -> &[u8] {
        let n = self.header.ring_ent_in_out.payload_sz as usize;
        let p = self.held.payload.slice();
        &p[..n.min(p.len())]
    }
    /// The header and the whole payload buffer, together (the request's
    /// arguments are read from them while the reply is written).
    pub fn parts_mut(&mut self) -> (&mut UringReqHeader, &mut [u8]) {
        (&mut self.header, self.held.payload.slice_mut())
    }
    /// The whole payload buffer, for writing the reply.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        self.held.payload.slice_mut()
    }
    /// The client memory a READ's data goes to, or a WRITE's data comes
    /// from (then the payload holds no data and the WRITE's size is this
    /// memory's length).
    pub fn client_mem(&self) -> Option<&Arc<dyn crate::chan::ClientMem>> {
        self.held.client.as_ref()
    }
    /// Whether the payload is the client's own pages (ENT_ZERO_COPY).
    pub fn is_zero_copy(&self) -> bool {
        self.header.ring_ent_in_out.flags & uring::ENT_ZERO_COPY != 0
    }
    /// Records the reply: `error` (0 or negative errno) and `len` bytes of
    /// reply payload already written to [`Fetched::payload_mut`].
    pub fn set_reply(&mut self, error: i32, len: usize) {
        let oh = OutHeader {
            len: (std::mem::size_of::<OutHeader>() + len) as u32,
            error,
            unique: self.commit_id(),
        };
        self.header.in_out = [0; abi::URING_IN_OUT_HEADER_SZ];
        self.header.in_out[..16].copy_from_slice(oh.as_bytes());
        self.header.ring_ent_in_out.payload_sz = len as u32;
    }
    /// The command-area bytes that commit this entry.
    pub fn commit_cmd(&self) -> [u8; 80] {
        let c = UringCmdReq {
            commit_id: self.commit_id(),
            qid: self.held.handle.qid,
            ..Default::default()
        };
        let mut area = [0u8; 80];
        area[..40].copy_from_slice(c.as_bytes());
        area
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.done {
            let payload = std::mem::replace(&mut self.payload, Payload::None);
            self.ring.abandon(self.handle, payload);
        }
    }
}
