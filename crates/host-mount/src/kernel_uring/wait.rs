//! Waiting on a queue's io_uring: one io_uring_enter submits the queued
//! commands and sleeps until a command completes, the wake eventfd is
//! written or the filesystem's completion eventfd is readable. Reaping
//! moves completed entries to `State::done` (or records the error a
//! command ended with); only the serving thread waits or reaps.

use super::{EntState, KernelQueue, State, ASYNC, WAKE};
use fuse_core::Errno;
use host_io::sys;
use io_uring::{opcode, squeue, types};
use std::os::fd::AsRawFd;

impl KernelQueue {
    /// Submits the queued commits and waits, in one io_uring_enter, until
    /// something happens: an entry got a request or a command failed, the
    /// wake eventfd was written, or `started_fd` (the filesystem's completion
    /// eventfd, polled on this ring) became readable. Returns whether that
    /// poll fired (then read the eventfd before waiting again, or the
    /// poll, re-armed, fires at once).
    pub fn wait(&self, started_fd: Option<i32>) -> Result<bool, Errno> {
        let mut st = self.state();
        if !st.done.is_empty() || self.stopping() {
            return Ok(std::mem::take(&mut st.started_fired));
        }
        if !st.wake_armed {
            push_poll(&mut st, self.shared.wake.as_raw_fd(), WAKE)?;
            st.wake_armed = true;
        }
        if let (Some(fd), None, false) = (started_fd, st.started_armed, st.started_fired) {
            // The fd is the filesystem's per-thread eventfd, open while
            // this thread lives (a poll on a closed fd just completes).
            push_poll(&mut st, fd, ASYNC)?;
            st.started_armed = Some(fd);
        }
        if !st.started_fired {
            submit_and_wait(&mut st)?;
        } else if !st.ring.submission().is_empty() {
            st.ring.submit().map_err(|e| sys::errno_of(&e))?;
        }
        self.reap(&mut st);
        Ok(std::mem::take(&mut st.started_fired))
    }

    pub(super) fn reap(&self, st: &mut State) {
        let cqes: Vec<(u64, i32)> = st
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (ud, res) in cqes {
            if ud == ASYNC {
                st.started_armed = None;
                st.started_fired = true;
                continue;
            }
            if ud == WAKE {
                st.wake_armed = false;
                sys::eventfd_drain(self.shared.wake.as_raw_fd());
                continue;
            }
            let Some(ent) = st.inflight.remove(&ud) else {
                continue;
            };
            if res == 0 {
                let mut ent = ent;
                ent.step(EntState::Fetched);
                st.done.push_back(ent);
            } else {
                // The command ended without a request (teardown: ENOTCONN,
                // or a refused REGISTER). The memory is ours again.
                st.failed.get_or_insert(Errno(-res));
                drop(ent);
            }
        }
    }
}

/// Submits what is queued and waits for one completion. A transient
/// failure (a signal, EAGAIN, EBUSY, ENOMEM: the queued commits are still
/// in the SQ ring and go with the next attempt) returns Ok after a short
/// pause (none for a signal), for the caller to look again.
pub(super) fn submit_and_wait(st: &mut State) -> Result<(), Errno> {
    match st.ring.submit_and_wait(1) {
        Ok(_) => Ok(()),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EINTR | libc::EAGAIN | libc::EBUSY | libc::ENOMEM)
            ) =>
        {
            if e.raw_os_error() != Some(libc::EINTR) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Ok(())
        }
        Err(e) => Err(sys::errno_of(&e)),
    }
}

/// Queues a one-shot POLLIN poll of `fd` tagged `ud`, making room in the
/// SQ ring (submitting what is queued) if it is full: a wait without its
/// polls could sleep through the events they stand for.
fn push_poll(st: &mut State, fd: i32, ud: u64) -> Result<(), Errno> {
    let poll: squeue::Entry128 = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
        .build()
        .user_data(ud)
        .into();
    // SAFETY: a poll SQE points at no memory.
    if unsafe { st.ring.submission().push(&poll) }.is_ok() {
        return Ok(());
    }
    st.ring.submit().map_err(|e| sys::errno_of(&e))?;
    // SAFETY: as above.
    unsafe { st.ring.submission().push(&poll) }
        .map_err(|squeue::PushError { .. }| Errno(libc::EBUSY))
}
