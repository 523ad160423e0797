//! Dropping a driver: every op in flight is cancelled and its completion
//! waited for before anything it points at is freed (the slot buffers,
//! timespecs and iovec arrays, the registered regions; a client's memory
//! the caller keeps mapped until then).
//!
//! Closing the ring is not enough: the kernel cancels a closed ring's
//! requests asynchronously (io_ring_exit_work), and an op running on an
//! io-wq worker or armed on a pipe may still write into its buffer after
//! the close returned.

use super::{cancel_entry, transient, Driver, Slot, MAX_FAILURES};
use std::time::Duration;

impl Drop for Driver {
    fn drop(&mut self) {
        let drained = self.drain();
        // Started ops leave the cancel registry before the ring's fd is
        // closed (the registry names rings by fd, and a closed fd's number
        // is soon another file's): their completions were taken above, or
        // never will be.
        if let Some(r) = self.cancels.take() {
            let ring_fd = self.ring_fd();
            for (id, key) in self.started.drain(..) {
                r.leave(key, ring_fd, id.idx as u64);
            }
        }
        if drained {
            return;
        }
        if !self.iov_store.is_empty() {
            // A started op on a client's memory may still be in flight,
            // and that memory is not ours to keep: its owner unmaps it once
            // this returns (the `start_readv` contract). Returning would
            // let the kernel write into whatever is mapped there next.
            log::error!("io_uring broken with ops on client memory in flight; aborting");
            std::process::abort();
        }
        // The ring is broken and ops may still be in flight: the kernel may
        // write into their buffers (or the regions) at any time until it
        // has cancelled them itself. Leak all of it rather than free memory
        // under the kernel; the ring itself is closed as usual.
        std::mem::forget(std::mem::take(&mut self.slots));
        std::mem::forget(std::mem::take(&mut self.regions));
    }
}

impl Driver {
    /// Cancels every op in flight (ASYNC_CANCEL, where the kernel has it)
    /// and waits until all have completed. False if the ring failed
    /// [`MAX_FAILURES`] times first: ops may still be in flight then.
    fn drain(&mut self) -> bool {
        let mut cancels: Vec<usize> = if self.supported.cancel {
            self.slots
                .iter()
                .enumerate()
                .filter(|(_, s)| matches!(s, Slot::InFlight { .. }))
                .map(|(i, _)| i)
                .collect()
        } else {
            // Without ASYNC_CANCEL (before Linux 5.5) the ops are only
            // waited for.
            Vec::new()
        };
        let mut failures = 0;
        while self.in_flight() > 0 {
            // As many cancels as the submission queue takes; the rest go
            // once a submit has made room.
            while let Some(&i) = cancels.last() {
                // SAFETY: a cancel names no memory, only the user_data of
                // the op it cancels.
                if unsafe { self.ring.submission().push(&cancel_entry(i)) }.is_err() {
                    break;
                }
                cancels.pop();
            }
            // Queued ops are submitted with the cancels that follow them,
            // then cancelled; a cancel that finds its op done does nothing.
            // No waiting while cancels remain to be pushed: the ops in
            // flight may be ones that only those complete.
            let want = usize::from(cancels.is_empty());
            match self.ring.submit_and_wait(want) {
                Ok(_) => failures = 0,
                Err(e) if transient(&e) => {}
                Err(_) => {
                    failures += 1;
                    if failures >= MAX_FAILURES {
                        return false;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            self.sync_queued();
            self.reap();
        }
        true
    }
}
