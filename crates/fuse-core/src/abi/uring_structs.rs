//! FUSE-over-io_uring structs (protocol 7.42+, with the buffer-pool
//! extension of the 2026 patch series: a queue's payload buffers cut from
//! one registered pool). Sizes are asserted against the kernel ABI.

use super::consts::{URING_IN_OUT_HEADER_SZ, URING_OP_IN_OUT_SZ};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `struct fuse_uring_ent_in_out`: per-entry metadata shared with the server.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct UringEntInOut {
    /// `uring::ENT_ZERO_COPY` and future flags.
    pub flags: u64,
    /// The request's unique id; echoed back by COMMIT_AND_FETCH.
    pub commit_id: u64,
    /// Bytes of payload in the payload buffer.
    pub payload_sz: u32,
    /// Offset of the claimed pool buffer (pool mode), else 0.
    pub offset: u32,
    /// Reserved, zero.
    pub reserved: u64,
}
const _: () = assert!(core::mem::size_of::<UringEntInOut>() == 32);

/// `struct fuse_uring_req_header`: the 288-byte header buffer of a ring entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct UringReqHeader {
    /// `fuse_in_header` (to the server) or `fuse_out_header` (from it).
    pub in_out: [u8; URING_IN_OUT_HEADER_SZ],
    /// The per-opcode argument struct.
    pub op_in: [u8; URING_OP_IN_OUT_SZ],
    /// Entry metadata.
    pub ring_ent_in_out: UringEntInOut,
}
const _: () = assert!(core::mem::size_of::<UringReqHeader>() == 288);

impl Default for UringReqHeader {
    fn default() -> Self {
        zerocopy::FromZeros::new_zeroed()
    }
}

/// The `bufpool` member of the union in `fuse_uring_cmd_req`. The other
/// member, `ent_zero_copy_buf_index: u16`, overlays the low bytes of `uaddr`
/// (little-endian), see [`UringCmdReq::zero_copy_buf_index`].
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct UringBufpool {
    /// User address of the pool memory.
    pub uaddr: u64,
    /// Length of the pool in bytes.
    pub len: u32,
    /// Reserved, zero.
    pub reserved: u32,
}
const _: () = assert!(core::mem::size_of::<UringBufpool>() == 16);

/// `struct fuse_uring_cmd_req`: what a server places in the SQE128 command area.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct UringCmdReq {
    /// Command flags (ADD_QUEUE: `uring::QUEUE_ZERO_COPY`).
    pub flags: u64,
    /// For COMMIT_AND_FETCH: the unique of the request being committed.
    pub commit_id: u64,
    /// Queue index.
    pub qid: u16,
    /// Padding, zero.
    pub padding: [u8; 6],
    /// The union: buffer pool description, or the zero-copy buffer index.
    pub bufpool: UringBufpool,
}
const _: () = assert!(core::mem::size_of::<UringCmdReq>() == 40);
/// The SQE128 command area is 80 bytes; the command must fit in it.
pub const SQE128_CMD_AREA: usize = 80;
const _: () = assert!(core::mem::size_of::<UringCmdReq>() <= SQE128_CMD_AREA);

impl UringCmdReq {
    /// The `ent_zero_copy_buf_index` member of the union.
    pub fn zero_copy_buf_index(&self) -> u16 {
        (self.bufpool.uaddr & 0xffff) as u16
    }

    /// Sets the `ent_zero_copy_buf_index` member of the union.
    pub fn set_zero_copy_buf_index(&mut self, idx: u16) {
        self.bufpool.uaddr = (self.bufpool.uaddr & !0xffff) | u64::from(idx);
    }

    /// Reads the command from an SQE command area (at least 40 bytes).
    pub fn from_cmd_area(area: &[u8]) -> Option<Self> {
        Self::read_from_prefix(area).ok().map(|(c, _)| c)
    }
}
