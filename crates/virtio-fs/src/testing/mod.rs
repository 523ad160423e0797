//! The other side of the device, for tests and load generation (nothing
//! here serves a guest): a vhost-user frontend with no VM, so the engine
//! acts as the guest ([`frontend`]), and a guest kernel's virtqueue driver
//! that keeps many chains in flight from one thread ([`guest`], what
//! `fusebox-load` drives).
//!
//! Compiled only with feature `test-utils`: this crate's and fusebox's
//! tests enable it through their dev-dependencies, and fusebox's
//! `fusebox-load` feature (the load generator's) through its dependency.
//! The daemon uses none of it.

pub mod frontend;
pub mod guest;
pub mod window;

/// A memfd of `size` bytes: the guest RAM both share with the backend.
fn memfd(size: u64) -> std::io::Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    // SAFETY: the name is NUL-terminated; memfd_create returns a new fd
    // or -1.
    let fd = unsafe { libc::memfd_create(c"fusebox-guest".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let f = unsafe { std::fs::File::from_raw_fd(fd) };
    f.set_len(size)?;
    Ok(f)
}
