//! Registered personalities: credentials a ring keeps under a small id
//! (IORING_REGISTER_PERSONALITY), so an op started now runs as the thread
//! is now, whenever and wherever the kernel issues it later.
//!
//! Without one, an op takes the credentials of the task at the moment the
//! kernel issues it: inside the `io_uring_enter` that submits it (under
//! whatever credentials the submitting thread has then), or, punted to an
//! io-wq worker, those captured at the punt (io_prep_async_work). An op
//! queued now and submitted later, with other credentials in force, would
//! run as those.

use super::{Driver, DriverError};
use std::io;

impl Driver {
    /// Registers the calling thread's credentials as they are now (the
    /// kernel's current_cred(): fsuid, fsgid, supplementary groups,
    /// capabilities) as a personality of this ring; its id (never 0: the
    /// kernel allocates ids from 1, and 0 in an SQE means none).
    pub fn register_personality(&mut self) -> Result<u16, DriverError> {
        self.ring
            .submitter()
            .register_personality()
            .map_err(DriverError::Register)
    }

    /// Unregisters the personalities `ids`. What is queued is submitted
    /// first: the kernel looks an SQE's personality up when it takes the
    /// SQE from the ring (io_init_req: `xa_load` of the id, then
    /// `get_cred`), so an id must stay registered until every SQE naming
    /// it has been taken. From then on the request holds its own
    /// reference to the credentials (dropped when the request is freed),
    /// so ops in flight keep running as registered. EBUSY, with nothing
    /// unregistered, if an entry stays queued after the submit.
    pub fn unregister_personalities(&mut self, ids: &[u16]) -> Result<(), DriverError> {
        if self.queued > 0 {
            self.submit()?;
        }
        if !self.ring.submission().is_empty() {
            return Err(DriverError::Register(io::Error::from_raw_os_error(
                libc::EBUSY,
            )));
        }
        let mut first = None;
        for &id in ids {
            // Every id is tried, after a failure too.
            if let Err(e) = self.ring.submitter().unregister_personality(id) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), |e| Err(DriverError::Register(e)))
    }

    /// This driver's identity among all drivers the process made: a
    /// personality id means something only on the ring that made it (ids
    /// of two rings overlap), so a cache of them checks it.
    pub fn serial(&self) -> u64 {
        self.serial
    }
}
