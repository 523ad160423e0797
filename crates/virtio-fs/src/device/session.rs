//! The guest's FUSE session: from its INIT to its DESTROY. A guest that
//! is reset or reboots sends no DESTROY, so a device reset and a new INIT
//! end the session the same way: its parked lock calls end, and the
//! filesystem lets go of everything the session held (locks, handles,
//! inodes: `Filesystem::destroy`), so the rebooted guest finds its files
//! unlocked and the daemon's fds back where they were.

use super::stop::wait_fences;
use super::*;

impl<F: Filesystem + 'static> FsDevice<F> {
    /// Ends the guest's session, if one is on (`why` goes to the log).
    /// Called by a reset, with every vring's requests given up already, or
    /// before a new INIT is sent: then what the old session still has in
    /// flight (a hostile guest's, on other queues: a Linux guest stops its
    /// vrings first) is given up too, its fences closed and waited for
    /// (bounded), so none of it acts, or takes a handle, once the old
    /// session's state is gone.
    pub(super) fn end_session(&self, why: &str) {
        if self.inner.migration.session_ended() {
            let old: Vec<_> = (self.inner.queues.iter())
                .map(|rq| write(&rq.gen).refence())
                .collect();
            self.interrupt_waiters(None);
            let deadline = Instant::now() + self.inner.cfg.vring_stop_drain;
            self.left_running(wait_fences(&old, deadline));
            self.inner.engine.fs().destroy();
            self.inner.stats.add_sessions_ended(1);
            log::info!("the guest's FUSE session ended ({why}); what it held is released");
        }
    }
}
