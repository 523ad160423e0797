//! Ops started and left running: a thread that serves many requests at
//! once queues their reads, writes, syncs and fallocates (reads and
//! writes into or from memory the driver does not own: a client's, such
//! as guest RAM), submits them (together with one `io_uring_enter`, or
//! each as soon as it is queued: the caller chooses), goes
//! on with other work, and takes their completions later, when the ring's
//! eventfd says there are some. Unlike `read_into`/`readv_raw` nothing
//! waits here: the caller promises the memory stays mapped until the
//! completion is taken.

use super::{result, Driver, DriverError, OpId, Slot, Target, MAX_IOVECS};
use io_uring::{opcode, squeue, types};
use std::io;
use std::os::fd::RawFd;

/// The SQE of an fsync (fdatasync with `datasync`) of `t`.
pub(super) fn fsync_entry(t: Target, datasync: bool) -> squeue::Entry {
    let flags = if datasync {
        types::FsyncFlags::DATASYNC
    } else {
        types::FsyncFlags::empty()
    };
    match t {
        Target::Fd(fd) => opcode::Fsync::new(types::Fd(fd)).flags(flags).build(),
        Target::Fixed(i) => opcode::Fsync::new(types::Fixed(i)).flags(flags).build(),
    }
}

impl Driver {
    /// Queues a vectored read at `offset` into the memory `iovs` names,
    /// through the registered client map (READ_FIXED/READV_FIXED) when
    /// `fixed` and the iovecs lie in one of its pieces, else READV; not
    /// submitted until [`Driver::submit`] (or a wait). `key` names it for
    /// cancelling. With `punt` the kernel runs it on one of the ring's
    /// io-wq worker threads (IOSQE_ASYNC) instead of trying it inside the
    /// submit: a long copy from the page cache then runs beside the
    /// submitting thread. The iovec array moves into the driver until the
    /// completion.
    ///
    /// # Safety
    ///
    /// Every iovec must describe mapped, writable memory that no Rust
    /// reference points into, and stay so until this op's completion has
    /// been taken with [`Driver::take_started`] (or the driver dropped:
    /// its Drop cancels and waits for every op, and aborts the process if
    /// the ring is too broken to).
    pub unsafe fn start_readv(
        &mut self,
        t: Target,
        iovs: Box<[libc::iovec]>,
        offset: u64,
        key: u64,
        fixed: bool,
        punt: bool,
    ) -> Result<OpId, DriverError> {
        // SAFETY: the caller's contract, which is `start_rw`'s for a read.
        unsafe { self.start_rw(false, t, iovs, offset, key, fixed, punt, None) }
    }

    /// Queues a vectored write at `offset` from the memory `iovs` names,
    /// as [`Driver::start_readv`] queues a read (WRITE_FIXED/WRITEV_FIXED
    /// through the registered client map when `fixed` and the iovecs lie
    /// in one of its pieces, else WRITEV; IOSQE_ASYNC with `punt`). With
    /// `personality` (from [`Driver::register_personality`] on this ring)
    /// the op runs with the credentials registered under it, wherever and
    /// whenever the kernel issues it: inside the submit, on an io-wq
    /// worker, or again from task work.
    ///
    /// # Safety
    ///
    /// Every iovec must describe mapped, readable memory, and stay so
    /// until this op's completion has been taken with
    /// [`Driver::take_started`] (or the driver dropped, as for
    /// [`Driver::start_readv`]).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn start_writev(
        &mut self,
        t: Target,
        iovs: Box<[libc::iovec]>,
        offset: u64,
        key: u64,
        fixed: bool,
        punt: bool,
        personality: Option<u16>,
    ) -> Result<OpId, DriverError> {
        // SAFETY: the caller's contract, which is `start_rw`'s for a write.
        unsafe { self.start_rw(true, t, iovs, offset, key, fixed, punt, personality) }
    }

    /// [`Driver::start_readv`] or [`Driver::start_writev`].
    ///
    /// # Safety
    ///
    /// As for the one called: the memory `iovs` names is mapped (writable
    /// for a read, readable for a write) until the completion is taken.
    #[allow(clippy::too_many_arguments)]
    unsafe fn start_rw(
        &mut self,
        write: bool,
        t: Target,
        iovs: Box<[libc::iovec]>,
        offset: u64,
        key: u64,
        fixed: bool,
        punt: bool,
        personality: Option<u16>,
    ) -> Result<OpId, DriverError> {
        let supported = if write {
            self.supported.write
        } else {
            self.supported.read
        };
        if !supported {
            return Err(DriverError::Submit(io::Error::from_raw_os_error(
                libc::EOPNOTSUPP,
            )));
        }
        let n = iovs.len().min(MAX_IOVECS);
        let entry = match fixed.then(|| self.client_fixed_entry(t, &iovs[..n], write)) {
            Some(Some(e)) => e.offset(offset).build(),
            _ => {
                let (v, n) = (iovs.as_ptr(), n as u32);
                macro_rules! on {
                    ($fd:expr) => {
                        if write {
                            opcode::Writev::new($fd, v, n).offset(offset).build()
                        } else {
                            opcode::Readv::new($fd, v, n).offset(offset).build()
                        }
                    };
                }
                match t {
                    Target::Fd(fd) => on!(types::Fd(fd)),
                    Target::Fixed(i) => on!(types::Fixed(i)),
                }
            }
        };
        let entry = if punt {
            entry.flags(squeue::Flags::ASYNC)
        } else {
            entry
        };
        let entry = match personality {
            Some(p) => entry.personality(p),
            None => entry,
        };
        let id = self.alloc(Slot::in_flight(None, key));
        // The array stays here, unmoved on the heap (a boxed slice), until
        // `reap` sees the op's completion.
        self.iov_store.insert(id.idx, iovs);
        // SAFETY: the iovec array is in `iov_store` until `reap` takes the
        // op's completion; the memory it describes is the caller's
        // contract.
        if let Err(e) = unsafe { self.push(&entry.user_data(id.idx as u64)) } {
            // Not queued: the kernel never saw the pointers.
            self.iov_store.remove(&id.idx);
            self.release(id.idx);
            return Err(e);
        }
        self.track(id, key);
        Ok(id)
    }

    /// Queues an fsync (fdatasync with `datasync`) of `t`, as
    /// [`Driver::start_readv`] queues a read: not submitted until
    /// [`Driver::submit`], its completion taken with
    /// [`Driver::take_started`]. The kernel always runs it on an io-wq
    /// worker (a sync may wait for the disk), so the submitting thread
    /// goes on at once. It names no memory. With `personality` (from
    /// [`Driver::register_personality`]) it runs with those credentials.
    pub fn start_fsync(
        &mut self,
        t: Target,
        datasync: bool,
        key: u64,
        personality: Option<u16>,
    ) -> Result<OpId, DriverError> {
        let entry = fsync_entry(t, datasync);
        let entry = match personality {
            Some(p) => entry.personality(p),
            None => entry,
        };
        // SAFETY: an fsync names no memory.
        unsafe { self.start_entry(entry, key) }
    }

    /// Queues a fallocate(2) of `t` (`mode`, `len` bytes at `offset`), as
    /// [`Driver::start_fsync`] queues a sync (the kernel runs it on an
    /// io-wq worker too), with the credentials of `personality` (from
    /// [`Driver::register_personality`]) where given.
    pub fn start_fallocate(
        &mut self,
        t: Target,
        mode: i32,
        offset: u64,
        len: u64,
        key: u64,
        personality: Option<u16>,
    ) -> Result<OpId, DriverError> {
        macro_rules! on {
            ($fd:expr) => {
                opcode::Fallocate::new($fd, len)
                    .offset(offset)
                    .mode(mode)
                    .build()
            };
        }
        let entry = match t {
            Target::Fd(fd) => on!(types::Fd(fd)),
            Target::Fixed(i) => on!(types::Fixed(i)),
        };
        let entry = match personality {
            Some(p) => entry.personality(p),
            None => entry,
        };
        // SAFETY: a fallocate names no memory.
        unsafe { self.start_entry(entry, key) }
    }

    /// Queues `entry` as started.
    ///
    /// # Safety
    ///
    /// `entry` names no memory (or, as for [`Driver::push_all`], only
    /// memory valid until its completion is taken).
    unsafe fn start_entry(&mut self, entry: squeue::Entry, key: u64) -> Result<OpId, DriverError> {
        // SAFETY: the caller's contract.
        let id = unsafe { self.queue_entry(entry, key) }?;
        self.track(id, key);
        Ok(id)
    }

    /// Queues `entry` in a new in-flight slot named by `key`; its slot
    /// freed again if the ring did not take it.
    ///
    /// # Safety
    ///
    /// As for [`Driver::push_all`]: the memory `entry` names stays valid
    /// for the kernel until the op's completion has been reaped.
    pub(super) unsafe fn queue_entry(
        &mut self,
        entry: squeue::Entry,
        key: u64,
    ) -> Result<OpId, DriverError> {
        let id = self.alloc(Slot::in_flight(None, key));
        // SAFETY: the caller's contract.
        if let Err(e) = unsafe { self.push(&entry.user_data(id.idx as u64)) } {
            self.release(id.idx);
            return Err(e);
        }
        Ok(id)
    }

    /// Forgets the started op in slot `idx`, if one is (a forgotten op
    /// that ended, with nobody to tell): out of the started list and the
    /// cancel registry, before its slot can hold another op.
    pub(super) fn drop_started(&mut self, idx: usize) {
        if let Some(i) = self.started.iter().position(|(id, _)| id.idx == idx) {
            let (id, key) = self.started.swap_remove(i);
            if let Some(r) = &self.cancels {
                r.leave(key, self.ring_fd(), id.idx as u64);
            }
        }
    }

    /// Records the queued op `id` as started: cancellable by `key`, and
    /// among those [`Driver::take_started`] looks at.
    fn track(&mut self, id: OpId, key: u64) {
        if let Some(r) = &self.cancels {
            r.enter(key, self.ring_fd(), id.idx as u64);
        }
        self.started.push((id, key));
    }

    /// The io-wq worker limits of this thread, [file ops, unbounded
    /// ops]: a driver raises the first to its ring's entries (see
    /// [`Driver::new`]), so that many syncs, fallocates and handed-off
    /// reads can wait at once.
    pub fn iowq_max_workers(&self) -> Result<[u32; 2], DriverError> {
        // Zeros change nothing; the call gives the limits back.
        let mut m = [0u32; 2];
        self.ring
            .submitter()
            .register_iowq_max_workers(&mut m)
            .map_err(DriverError::Register)?;
        Ok(m)
    }

    /// The ring's fd (how [`crate::CancelRegistry`] names it).
    pub fn ring_fd(&self) -> RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.ring)
    }

    /// Started ops not yet taken.
    pub fn started(&self) -> usize {
        self.started.len()
    }

    /// Submits what is queued, then moves every started op that has
    /// completed into `out` (without waiting). Returns how many.
    pub fn take_started(
        &mut self,
        out: &mut Vec<(OpId, io::Result<usize>)>,
    ) -> Result<usize, DriverError> {
        self.submit()?;
        let n0 = out.len();
        let ring_fd = self.ring_fd();
        let mut i = 0;
        while i < self.started.len() {
            let (id, key) = self.started[i];
            if let Slot::Done { res, .. } = self.slots[id.idx] {
                self.slots[id.idx] = Slot::Free;
                self.free.push(id.idx);
                if let Some(r) = &self.cancels {
                    r.leave(key, ring_fd, id.idx as u64);
                }
                self.started.swap_remove(i);
                out.push((id, result(res)));
            } else {
                i += 1;
            }
        }
        Ok(out.len() - n0)
    }

    /// Has the kernel signal `fd` (an eventfd) whenever it posts a
    /// completion on this ring, so a thread can wait for them together with
    /// its other events. Every completion, not only those posted from
    /// io-wq (`register_eventfd_async`): a buffered read retried when its
    /// page arrives completes from task work queued in interrupt context,
    /// which the async variant never signals (a READ from ext4 hung so).
    pub fn register_eventfd(&mut self, fd: RawFd) -> Result<(), DriverError> {
        self.ring
            .submitter()
            .register_eventfd(fd)
            .map_err(DriverError::Register)
    }
}
