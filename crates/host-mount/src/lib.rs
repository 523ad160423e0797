//! host-mount: serving the host kernel's FUSE mount. `/dev/fuse` (mounting,
//! the device workers' end, kernel passthrough's backing files) and the
//! kernel's FUSE-over-io_uring ring (its queues, entries and payload
//! arena), for `fusebox mount`. The filesystem served is whatever
//! [`fuse_core::server::Filesystem`] the caller gives; host I/O goes
//! through `host-io`.

pub mod devfuse;
pub mod kernel_uring;
