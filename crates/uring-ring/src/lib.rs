//! uring-ring: host I/O through io_uring. This crate is where fusebox
//! touches the host (fuse-core does no host I/O).
//!
//! So far: [`Driver`], one io_uring per worker thread, whose operations own
//! their buffers until the kernel is done with them. The passthrough
//! filesystem and the kernel FUSE ends come with issues 4 and 6.

mod driver;

pub use driver::{Completion, Driver, DriverError, OpId, Supported, Target};
