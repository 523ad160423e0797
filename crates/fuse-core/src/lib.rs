//! fuse-core: the FUSE ABI and a userspace model of the Linux kernel's FUSE
//! connection ("fuse_chan"), so that FUSE servers can be driven, tested and
//! benchmarked with the kernel's admission, interrupt, abort and timeout
//! semantics — without a kernel, a mount or root.
//!
//! - [`abi`]: protocol 7.45 constants and structs, bounds-checked decoders.
//! - [`chan`]: the engine ([`Chan`]) and its in-process device ([`Device`]).
//!
//! This crate performs no host I/O and contains no `unsafe` code; its one
//! `unsafe` item is the declaration of the [`chan::ClientMem`] contract,
//! which transports that map a client's memory implement. Its real
//! synchronisation code is model-checked with loom (`tests/loom.rs`).

#![deny(unsafe_code)]

pub mod abi;
mod assemble;
pub mod chan;
pub mod client;
pub mod dev_uring;
pub mod embedded;
pub mod fasthash;
pub mod server;
mod sync;

pub use chan::{
    Args, Call, Chan, ChanConfig, ClientMap, ClientMem, Clock, Device, Errno, HostSpan, InFlight,
    IoGuard, ManualClock, MonotonicClock, Negotiated, Reply, ReqResult, Sent, Signal, Stats,
    Transport,
};
