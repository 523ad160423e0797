//! host-io: fusebox's host I/O. The io_uring driver, the registry that
//! cancels a request's host I/O, and every raw system call the host-side
//! crates make (`sys`). fuse-core does no host I/O; the passthrough
//! filesystem and the host mount do theirs through this crate.
//!
//! - [`Driver`]: one io_uring per serving loop, whose operations own
//!   their buffers until the kernel is done with them.
//! - [`CancelRegistry`]: a request's started host I/O, by unique, for
//!   FUSE_INTERRUPT.
//! - [`mapped`]: reads out of a shared mapping of a host file, fenced
//!   against the SIGBUS of a host truncation.
//! - [`sys`]: thin wrappers over system calls, one flat list to audit.

mod cancel;
mod driver;
pub mod mapped;
pub mod sys;

pub use cancel::CancelRegistry;
pub use driver::{
    pread, preadv_raw, pwrite, pwritev_raw, Completion, Driver, DriverError, OpId, Supported,
    Target, MAX_IOVECS,
};

/// A FUSE connection that can register backing files for kernel
/// passthrough (FUSE_DEV_IOC_BACKING_OPEN/CLOSE on its `/dev/fuse` fd):
/// what the passthrough filesystem needs of the host mount's connection.
pub trait BackingDevice: Send + Sync + std::fmt::Debug {
    /// Registers `fd` as a backing file; returns its backing id.
    fn backing_open(&self, fd: i32) -> Result<u32, fuse_core::Errno>;
    /// Forgets backing id `id`.
    fn backing_close(&self, id: u32) -> Result<(), fuse_core::Errno>;
}
