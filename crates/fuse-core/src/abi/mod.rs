//! The FUSE wire ABI: constants, `repr(C)` structs, ring structs and
//! bounds-checked decoders for requests and replies.
//!
//! Every item has one path, `fuse_core::abi::X`: the files that define
//! them are private and re-export by name. Constants the kernel groups
//! by prefix stay in their groups (`abi::init::*`, `abi::flags::*`, …);
//! the encoders keep their module (`abi::encode::reply`), whose name their
//! own names need.

mod consts;
mod decode;
pub mod encode;
mod groups;
mod structs;
mod uring_structs;

pub use consts::{
    fattr, flags, fopen, init, notify, uring, Opcode, COMPAT_22_INIT_OUT_SIZE,
    COMPAT_ATTR_OUT_SIZE, COMPAT_ENTRY_OUT_SIZE, COMPAT_INIT_OUT_SIZE, COMPAT_MKNOD_IN_SIZE,
    COMPAT_SETXATTR_IN_SIZE, COMPAT_STATFS_SIZE, COMPAT_WRITE_IN_SIZE, EXT_GROUPS, INT_REQ_BIT,
    INVALID_UIDGID, KERNEL_MINOR_VERSION, KERNEL_VERSION, MAX_NR_SECCTX, MIN_READ_BUFFER, ROOT_ID,
    UNIQUE_RESEND, URING_IN_OUT_HEADER_SZ, URING_OP_IN_OUT_SZ,
};
pub use decode::{
    creation_security_context, decode_direntplus, decode_dirents, decode_out_header, decode_reply,
    decode_request, decode_split, op_in_size, security_context, validate_extensions, Cursor,
    DecodeError, DecodeOptions, DecodedDirent, DecodedReply, Operation, ReplyBody, Request,
    SecurityContext, FIRST_EXTENSION_MINOR,
};
pub use groups::{supplementary_groups, SuppGids, MAX_SUPP_GROUPS};
pub use structs::{
    dirent_size, direntplus_size, AccessIn, Attr, AttrOut, BackingMap, BatchForgetIn, BmapIn,
    BmapOut, CopyFileRangeIn, CopyFileRangeOut, CreateIn, CuseInitIn, CuseInitOut, Dirent,
    DirentPlus, EntryOut, ExtHeader, FallocateIn, FileLock, FlushIn, ForgetIn, ForgetOne, FsyncIn,
    GetattrIn, GetxattrIn, GetxattrOut, InHeader, InitIn, InitOut, InterruptIn, IoctlIn,
    IoctlIovec, IoctlOut, Kstatfs, LinkIn, LkIn, LkOut, LseekIn, LseekOut, MkdirIn, MknodIn,
    NotifyDeleteOut, NotifyInvalEntryOut, NotifyInvalInodeOut, NotifyPollWakeupOut, NotifyPruneOut,
    NotifyRetrieveIn, NotifyRetrieveOut, NotifyStoreOut, OpenIn, OpenOut, OutHeader, PollIn,
    PollOut, ReadIn, ReleaseIn, RemovemappingIn, RemovemappingOne, Rename2In, RenameIn, Secctx,
    SecctxHeader, SetattrIn, SetupmappingIn, SetxattrIn, StatfsOut, Statx, StatxIn, StatxOut,
    SuppGroups, SxTime, SyncfsIn, WriteIn, WriteOut,
};
pub use uring_structs::{
    UringBufpool, UringCmdReq, UringEntInOut, UringReqHeader, SQE128_CMD_AREA,
};

/// A GETXATTR or LISTXATTR answer: the value's size (asked with size 0)
/// or the value (the names, for LISTXATTR). What a filesystem returns and
/// what a client receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Xattr {
    /// The size of the value (the request asked with size 0).
    Size(u32),
    /// The value.
    Data(Vec<u8>),
}
