//! The other side of the device, for tests and load generation (nothing
//! here serves a guest): a vhost-user frontend with no VM, so the engine
//! acts as the guest ([`frontend`]), and a guest kernel's virtqueue driver
//! that keeps many chains in flight from one thread ([`guest`], what
//! `fusebox-load` drives).

pub mod frontend;
pub mod guest;
