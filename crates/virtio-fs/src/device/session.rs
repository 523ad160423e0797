//! The guest's FUSE session: from its INIT to its DESTROY. A guest that
//! is reset or reboots sends no DESTROY, so a device reset and a new INIT
//! end the session the same way: its parked lock calls end, and the
//! filesystem lets go of everything the session held (locks, handles,
//! inodes: `Filesystem::destroy`), so the rebooted guest finds its files
//! unlocked and the daemon's fds back where they were.

use super::*;

impl<F: Filesystem + 'static> FsDevice<F> {
    /// Ends the guest's session, if one is on (`why` goes to the log).
    /// Called with the old session's rings stopped or reset (their requests
    /// given up), or from the pop of the new session's INIT, before it is
    /// sent.
    pub(super) fn end_session(&self, why: &str) {
        if !self.inner.migration.session_ended() {
            return;
        }
        self.interrupt_waiters(None);
        self.inner.engine.fs().destroy();
        self.inner
            .stats
            .sessions_ended
            .fetch_add(1, Ordering::Relaxed);
        log::info!("the guest's FUSE session ended ({why}); what it held is released");
    }
}
