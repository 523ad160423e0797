//! Closing the exit-event fds vhost-user-backend 0.24 leaks: it registers
//! each consumer with `into_raw_fd` and never closes it, so nothing else
//! can close that fd number before the device does (the workspace pins
//! vhost-user-backend to exactly 0.24.0 for this; a version that closes
//! them must drop this module).
//!
//! As a sanity check an fd is closed only if it is still the very open
//! file the device made: the device keeps a duplicate of each consumer
//! (its witness) and compares the two with kcmp(KCMP_FILE). No path is
//! resolved: this runs after the sandbox made the shared directory the
//! root, where `/proc/self/fdinfo/N` would name whatever the guest put
//! there (a FIFO would hang the daemon, a device node would be opened as
//! root). Without kcmp (a kernel built without it) nothing is closed.

use fuse_core::locks::lock;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

/// The exit-event fds vhost-user-backend leaks, each with a duplicate
/// that identifies it. Its own mutex, a leaf.
#[derive(Debug, Default)]
pub(super) struct ExitFds(Mutex<Vec<Leaked>>);

impl ExitFds {
    /// Remembers `fd` (the consumer about to be handed over), to close it
    /// when the device goes; nothing if no duplicate could be made (the fd
    /// is then left open).
    pub(super) fn record(&self, fd: &impl AsRawFd) {
        if let Some(leaked) = Leaked::record(fd) {
            lock(&self.0).push(leaked);
        }
    }

    /// Closes every recorded fd that is still the file it was.
    ///
    /// # Safety
    ///
    /// The vring threads that used them (their only users) must have ended.
    pub(super) unsafe fn close_all(&self) {
        for leaked in lock(&self.0).drain(..) {
            // SAFETY: this fn's contract.
            unsafe { leaked.close() };
        }
    }
}

/// A consumer fd handed to vhost-user-backend, with a duplicate of it
/// that proves, later, that the number still names the same open file.
#[derive(Debug)]
struct Leaked {
    fd: RawFd,
    witness: OwnedFd,
}

impl Leaked {
    /// Records `fd` (the consumer about to be handed over); None if no
    /// duplicate could be made (the fd is then left open, as before).
    fn record(fd: &impl AsRawFd) -> Option<Leaked> {
        // SAFETY: fcntl(F_DUPFD_CLOEXEC) on an fd the caller owns; the new
        // fd is owned by the OwnedFd below and nothing else.
        let dup = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return None;
        }
        // SAFETY: `dup` was just returned by fcntl and is owned by no one.
        let witness = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(dup) };
        Some(Leaked {
            fd: fd.as_raw_fd(),
            witness,
        })
    }

    /// Closes the leaked fd if it still is the same open file as the
    /// witness (which is closed either way).
    ///
    /// # Safety
    ///
    /// The vring thread that used the fd (its only user) must have ended.
    unsafe fn close(self) {
        if same_file(self.fd, self.witness.as_raw_fd()) {
            // SAFETY: `fd` is the exit-event consumer this device created
            // and vhost-user-backend registered with `into_raw_fd` and
            // abandoned: kcmp shows the number still refers to that same
            // open file (the witness keeps the file alive, so no other
            // file can have taken its identity), which nothing else owns;
            // its vring thread, the only user, has ended (this fn's
            // contract).
            unsafe { libc::close(self.fd) };
        }
    }
}

/// Whether two fds of this process refer to the same open file.
fn same_file(a: RawFd, b: RawFd) -> bool {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    const KCMP_FILE: libc::c_long = 0;
    // SAFETY: kcmp with integer arguments only; it reads no memory of ours.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            libc::c_long::from(pid),
            libc::c_long::from(pid),
            KCMP_FILE,
            libc::c_long::from(a),
            libc::c_long::from(b),
        )
    };
    r == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_sys_util::eventfd::EventFd;

    #[test]
    fn closes_the_leaked_fd_only_while_it_is_the_same_file() {
        let ev = EventFd::new(0).unwrap();
        let raw = std::os::fd::IntoRawFd::into_raw_fd(ev);
        let leaked = Leaked::record(&raw).unwrap();
        // SAFETY: no thread uses the fd.
        unsafe { leaked.close() };
        // SAFETY: probing a number with F_GETFD reads no memory.
        assert_eq!(unsafe { libc::fcntl(raw, libc::F_GETFD) }, -1, "closed");

        // The number now names another file: it must be left alone.
        let ev = EventFd::new(0).unwrap();
        let raw = std::os::fd::IntoRawFd::into_raw_fd(ev);
        let leaked = Leaked::record(&raw).unwrap();
        // SAFETY: closing our own fd, then reusing its number below.
        unsafe { libc::close(raw) };
        let other = EventFd::new(0).unwrap();
        assert_eq!(other.as_raw_fd(), raw, "the number was reused");
        // SAFETY: no thread uses the recorded fd.
        unsafe { leaked.close() };
        // SAFETY: as above.
        assert!(unsafe { libc::fcntl(raw, libc::F_GETFD) } >= 0, "left open");
    }
}
