//! Closing the exit-event fds vhost-user-backend 0.24 leaks: it registers
//! each consumer with `into_raw_fd` and never closes it, so nothing else
//! can close that fd number before the device does (the workspace pins
//! vhost-user-backend to exactly 0.24.0 for this; a version that closes
//! them must drop this module). As a sanity check an fd is closed only if
//! it is still an eventfd with the `eventfd-id` recorded when it was made
//! (/proc/self/fdinfo); without /proc (a chroot sandbox) nothing is
//! closed.

/// The `eventfd-id` of `fd`, if it is an eventfd.
pub(super) fn eventfd_id(fd: i32) -> Option<u64> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("eventfd-id:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Closes `fd` if it is still the eventfd with id `id`.
pub(super) fn close_if(fd: i32, id: u64) {
    if eventfd_id(fd) == Some(id) {
        // SAFETY: `fd` is the exit-event consumer this device created and
        // vhost-user-backend registered with `into_raw_fd` and abandoned:
        // its eventfd id shows it is still that same open file, which
        // nothing else owns, and its vring thread (the only user) has
        // ended, since the device it held is being dropped.
        unsafe { libc::close(fd) };
    }
}
