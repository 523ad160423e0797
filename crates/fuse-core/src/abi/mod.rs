//! The FUSE wire ABI: constants, `repr(C)` structs, ring structs and
//! bounds-checked decoders for requests and replies.

pub mod consts;
pub mod decode;
pub mod encode;
pub mod structs;
mod uring_structs;

pub use consts::*;
pub use decode::{
    creation_security_context, decode_reply, decode_request, decode_split, security_context,
    DecodeError, DecodeOptions, Operation, Reply, SecCtx, FIRST_EXTENSION_MINOR,
};
pub use structs::*;
pub use uring_structs::*;
