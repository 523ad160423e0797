//! The vhost-user-fs device: a guest's FUSE traffic, taken from its
//! virtqueues, served through the fuse-core engine.
//!
//! [`FsDevice`] implements `vhost_user_backend::VhostUserBackend` around
//! any `fuse_core::server::Filesystem`. See `docs/DESIGN.md` ("The
//! virtio-fs device") for the queue layout, the request lifecycle and the
//! lock order.

pub mod chain;
pub mod dax;
mod device;
mod dirty_log;
mod guest_mem;
pub mod stats;
#[cfg(feature = "test-utils")]
pub mod testing;

pub use device::{DeviceConfig, DeviceError, FsDevice, GuestMem, GuestMmap, Vring, TAG_LEN};
pub use dirty_log::LogBitmap;
