//! uring-ring: host I/O through io_uring. This crate is where fusebox
//! touches the host (fuse-core does no host I/O).
//!
//! - [`Driver`]: one io_uring per worker thread, whose operations own
//!   their buffers until the kernel is done with them.
//! - [`passthrough::PassthroughFs`]: a host directory served as a FUSE filesystem,
//!   confined beneath that directory, with data I/O through the driver.

mod cancel;
pub mod devfuse;
mod driver;
pub mod kernel_uring;
pub mod passthrough;
#[cfg(feature = "test-utils")]
pub mod testing;

pub use cancel::CancelRegistry;
pub use driver::{pread, pwrite, Completion, Driver, DriverError, OpId, Supported, Target};
