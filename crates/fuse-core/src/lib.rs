//! fuse-core: the FUSE ABI and a userspace model of the Linux kernel's FUSE
//! connection ("fuse_chan"), so that FUSE servers can be driven, tested and
//! benchmarked with the kernel's admission, interrupt, abort and timeout
//! semantics — without a kernel, a mount or root.
//!
//! - [`abi`]: protocol 7.45 constants and structs, bounds-checked decoders;
//! - the engine ([`Chan`], [`Args`], [`ReqResult`], the [`Transport`]
//!   vtable) and its in-process [`Device`], at the crate root;
//! - [`dev_uring`]: the emulated kernel side of FUSE-over-io_uring;
//! - [`server`]: server workers, the dispatcher and the `Filesystem` trait;
//! - [`client`], [`embedded`]: a FUSE client over the engine, and a test
//!   harness; `testing` (feature `test-utils`): an in-memory filesystem, fsx.
//!
//! No host I/O; no `unsafe` code but the declaration of the [`ClientMem`]
//! contract; its synchronisation is model-checked with loom (`tests/loom.rs`).

#![deny(unsafe_code)]

pub mod abi;
mod assemble;
mod chan;
pub mod client;
pub mod dev_uring;
pub mod embedded;
pub mod fasthash;
pub mod locks;
pub mod ratelimit;
pub mod server;
mod sync;
#[cfg(feature = "test-utils")]
pub mod testing;

// The engine's module is private: its public items have this one path.
pub use chan::{
    ArgBody, Args, Call, Chan, ChanConfig, ClientMap, ClientMem, Clock, Device, EndFn, Errno,
    Fence, FenceGuard, HostSpan, InFlight, IoGuard, ManualClock, MonotonicClock, Negotiated,
    ReplyPayload, ReqResult, RequestEnd, Sent, Signal, Stats, Transport, TrySendError,
};
