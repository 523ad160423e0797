//! Host I/O started without waiting on a serving loop's own io_uring
//! ([`PassthroughIo`], made by `Filesystem::new_io` and owned by the
//! loop): queued by the `*_async` calls, submitted by `submit_started`
//! (several per system call, or each at once), answered by
//! `collect_started` when the ring's eventfd (`started_fd`) says so.
//!
//! READs go straight into the client's memory, held for I/O
//! (`ClientMem::begin_io`) until the completion, and only on files with
//! non-blocking I/O: what the page cache holds is read at once with
//! preadv2(RWF_NOWAIT); the rest, O_DIRECT, and reads of [`PARALLEL_READ`]
//! or more (copied by an io-wq worker) go on the ring; a short read before
//! EOF is continued. FSYNC, FSYNCDIR, FALLOCATE (`alloc.rs`) and WRITE
//! (`write.rs`) are started too, the last two as their caller through a
//! personality of the ring. Ops are cancelled by request unique (the
//! cancel registry: FUSE_INTERRUPT, the device's timeout).

use super::client_io::{aligned, iovecs, registered};
use super::file::HandleData;
use super::io::{self, IoStats};
use super::mapped::Mapped;
use super::PassthroughFs;
use fuse_core::server::{Completions, IoDone};
use fuse_core::{ClientMem, Errno};
use host_io::{OpId, Target};
use std::os::fd::AsRawFd;
use std::sync::Arc;

mod alloc;
mod write;

/// A READ or WRITE in flight on a serving loop's ring.
struct Pending {
    done: IoDone,
    /// Held for I/O since the start (`begin_io`).
    mem: Arc<dyn ClientMem>,
    /// Keeps the file open for a continuation.
    h: Arc<HandleData>,
    off: u64,
    len: usize,
    got: usize,
    key: u64,
    fixed: bool,
    /// Run on an io-wq worker (a large read: see [`PARALLEL_READ`]).
    punt: bool,
    /// A WRITE: as whom it runs, and its writer count.
    write: Option<write::WriteOp>,
}

/// READs at least this long are started on the ring even when the page
/// cache holds them, and run on its io-wq workers (IOSQE_ASYNC): the copy
/// of a large read would hold the serving thread, which meanwhile pops and
/// starts the next ones, and a guest with several large reads queued has
/// them copied on as many cores. Shorter ones cost less synchronously than a
/// hand-off to a worker thread (docs/BENCHMARKS.md, "vhost-user-fs
/// device").
const PARALLEL_READ: usize = 256 * 1024;

/// An FSYNC, FSYNCDIR or FALLOCATE in flight on a serving loop's ring: no
/// memory, only an answer.
struct NoData {
    done: IoDone,
    /// Keeps the file open until the op is over.
    h: Arc<HandleData>,
    /// A FALLOCATE's arguments and credentials.
    alloc: Option<alloc::Alloc>,
}

/// The passthrough's host I/O context of one serving loop
/// (`Filesystem::Io`): its io_uring, made on first use, the eventfd that
/// ring signals, the credentials registered with it for writes, and the
/// reads, writes and syncs started on it. The loop that owns it alone
/// starts I/O on it and takes its completions.
#[derive(Default)]
pub struct PassthroughIo {
    /// Its ring; None until first used, or when none can be set up.
    driver: Option<host_io::Driver>,
    /// The registry its ring is owned in (see `CancelRegistry::own`).
    cancels: Option<Arc<host_io::CancelRegistry>>,
    /// A ring could not be set up: nothing is started.
    no_ring: bool,
    pending: fuse_core::fasthash::IdMap<OpId, Pending>,
    no_data: fuse_core::fasthash::IdMap<OpId, NoData>,
    eventfd: Option<std::os::fd::OwnedFd>,
    personas: write::Personas,
    /// Completions taken from the ring, and the ops they end (kept for
    /// their room: taking completions allocates nothing once warm).
    reaped: Vec<(OpId, std::io::Result<usize>)>,
    finished: Vec<(Pending, Result<usize, Errno>, bool)>,
    synced: Vec<(NoData, Result<usize, Errno>)>,
}

impl std::fmt::Debug for PassthroughIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PassthroughIo")
            .field("driver", &self.driver)
            .field("pending", &self.pending.len())
            .field("no_data", &self.no_data.len())
            .finish_non_exhaustive()
    }
}

impl PassthroughIo {
    /// Its ring (made, with its eventfd, on first use) and the
    /// personalities registered with it; None when no ring can be had.
    fn ring(&mut self, stats: &IoStats) -> Option<(&mut host_io::Driver, &mut write::Personas)> {
        if self.no_ring {
            return None;
        }
        if self.driver.is_none() {
            let ev = host_io::sys::eventfd().ok()?;
            let Ok(mut d) = host_io::Driver::new(io::RING_ENTRIES) else {
                self.no_ring = true;
                return None;
            };
            d.register_eventfd(ev.as_raw_fd()).ok()?;
            d.set_cancel_registry(stats.cancels.clone());
            stats.cancels.own(d.ring_fd());
            self.cancels = Some(stats.cancels.clone());
            self.eventfd = Some(ev);
            self.driver = Some(d);
        }
        Some((self.driver.as_mut()?, &mut self.personas))
    }

    /// Nothing started on it is in flight.
    fn idle(&self) -> bool {
        self.pending.is_empty() && self.no_data.is_empty()
    }
}

impl Drop for PassthroughIo {
    fn drop(&mut self) {
        // The ring first: its Drop waits for every op in flight, so no
        // client memory is given back (`end_io`, below) while the kernel
        // may still use it. (Its personalities go with it.)
        if let (Some(d), Some(c)) = (&self.driver, &self.cancels) {
            c.disown(d.ring_fd());
        }
        self.driver.take();
        for (_, p) in self.pending.drain() {
            p.mem.end_io();
        }
    }
}

/// Queues the read or write of `p` from `p.got` on; a write with the
/// registered `personality`.
///
/// # Safety
///
/// `p.mem` must be held for I/O (`begin_io` succeeded and `end_io` is not
/// called) until the op's completion has been taken: the caller keeps `p`
/// in its [`PassthroughIo`]'s table under the returned id, or ends the
/// memory only after the op failed to start.
unsafe fn start(
    d: &mut host_io::Driver,
    p: &Pending,
    personality: Option<u16>,
    stats: &IoStats,
) -> Result<OpId, Errno> {
    let spans = p.mem.spans();
    let iovs = iovecs(spans, p.got, p.len).into_boxed_slice();
    let map = p.mem.map();
    // SAFETY: `ClientMem`'s contract: the map's regions are mapped while
    // the memory lives (this `Pending` holds it).
    let fixed = p.fixed && map.as_deref().is_some_and(|m| unsafe { registered(d, m) });
    let at = p.off + p.got as u64;
    let t = Target::Fd(p.h.fd.raw());
    let write = p.write.is_some();
    // SAFETY: `ClientMem`'s contract: while the memory is held for I/O
    // (begin_io, until `complete` ends it after this op's completion was
    // taken) every span is mapped, readable and writable memory that is no
    // Rust object and that the client does not reuse; the iovecs stay
    // inside the spans.
    let id = unsafe {
        if write {
            d.start_writev(t, iovs, at, p.key, fixed, p.punt, personality)
        } else {
            d.start_readv(t, iovs, at, p.key, fixed, p.punt)
        }
    }
    .map_err(driver_errno)?;
    stats.count(write, true);
    if fixed {
        stats.count_fixed(write);
    }
    Ok(id)
}

/// The errno of a driver's failure.
fn driver_errno(e: host_io::DriverError) -> Errno {
    match e {
        host_io::DriverError::Setup(e)
        | host_io::DriverError::Register(e)
        | host_io::DriverError::Submit(e) => io::errno(e),
        _ => Errno::EIO,
    }
}

impl PassthroughFs {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn op_start_read(
        &self,
        io: &mut PassthroughIo,
        out: &mut Completions,
        unique: u64,
        fh: u64,
        off: u64,
        len: usize,
        mem: &Arc<dyn ClientMem>,
        done: IoDone,
    ) -> Result<(), IoDone> {
        if !self.cfg.io_uring || off > i64::MAX as u64 || len == 0 {
            return Err(done);
        }
        let Ok(h) = self.handles.get(fh) else {
            return Err(done);
        };
        let large = len >= PARALLEL_READ;
        // A cached READ of a file the page cache holds whole may be copied
        // out of a mapping of it (a local file: decided at its open).
        let mapped = h.map.may_map() && !h.odirect && !large;
        // Files without non-blocking reads (io_uring would hand each read
        // to a worker) are read synchronously, large ones aside.
        let ring = !((!h.uring && !large) || (h.odirect && !aligned(&**mem)));
        if !mapped && !ring {
            return Err(done);
        }
        if !mem.begin_io() {
            // The client took its memory back: the usual path says EIO.
            return Err(done);
        }
        if mapped {
            let ask = || self.map_checker.ask(Arc::downgrade(&h));
            let iovs = iovecs(mem.spans(), 0, len);
            // All of the read in one go (iovecs stops at MAX_IOVECS: the
            // usual path goes on from there).
            let whole = iovs.iter().map(|v| v.iov_len).sum::<usize>() == len.min(mem.len());
            let read = if whole {
                // SAFETY: as for the preadv2 below: the memory is held for
                // I/O and the iovecs stay inside its spans.
                unsafe { h.map.read(off, &iovs, ask) }
            } else {
                Mapped::Usual
            };
            match read {
                Mapped::Read(n) => {
                    self.io_stats.count_mapped();
                    mem.end_io();
                    out.complete(done, Ok(n));
                    return Ok(());
                }
                Mapped::Faulted => self.io_stats.count_mapped_fault(),
                Mapped::Usual => {}
            }
            if !ring {
                mem.end_io();
                return Err(done);
            }
        }
        // What the page cache holds is read now, synchronously: a cached read
        // started on the ring costs more than it does (the ring's own
        // bookkeeping, an eventfd signal, a wake-up) and completes inside
        // the submit anyway. Only what would wait for the disk goes on;
        // a handle whose reads keep missing skips the try (`cold.rs`).
        let mut got = 0;
        let mut skipped = false;
        if !h.odirect && !large && !h.cold.try_cache() {
            skipped = true;
        } else if !h.odirect && !large {
            let fd = h.fd.raw();
            // SAFETY: `ClientMem`'s contract: while the memory is held for
            // I/O (begin_io above, until end_io below or the started read's
            // completion) every span is mapped, writable memory that is no
            // Rust object and that the client does not reuse; the iovecs
            // stay inside the spans.
            let nowait = |from: usize| unsafe {
                host_io::sys::preadv_nowait(fd, &iovecs(mem.spans(), from, len), off + from as u64)
            };
            let answered = match nowait(0) {
                // All of it, or the end of the file.
                Ok(n) if n == len || n == 0 => Some(n),
                // Short: the end of the file (most files' last page), or
                // only part of it cached. Once more from there.
                Ok(n) => match nowait(n) {
                    Ok(0) => Some(n),
                    Ok(m) if n + m == len => Some(len),
                    Ok(m) => {
                        got = n + m;
                        None
                    }
                    Err(_) => {
                        got = n;
                        None
                    }
                },
                // Not cached (EAGAIN; EOPNOTSUPP: this file cannot say, so
                // every try would fail), or an error the ring will report.
                Err(e) => {
                    if e == Errno::EAGAIN || e == Errno(libc::EOPNOTSUPP) {
                        h.cold.miss();
                    }
                    None
                }
            };
            if answered.is_some() || got > 0 {
                h.cold.hit();
            }
            if let Some(n) = answered {
                self.io_stats.count(false, false);
                mem.end_io();
                out.complete(done, Ok(n));
                return Ok(());
            }
        }
        let p = Pending {
            done,
            mem: mem.clone(),
            h,
            off,
            len,
            got,
            key: unique,
            fixed: true,
            punt: large,
            write: None,
        };
        let started = self.start_pending(io, p);
        if skipped && started.is_ok() {
            self.io_stats.count_cold_skip();
        }
        started
    }

    /// Starts `p` (memory held for I/O) on `io` and records it there, or
    /// gives its `done` back, the memory released, if it cannot be
    /// started.
    fn start_pending(&self, io: &mut PassthroughIo, p: Pending) -> Result<(), IoDone> {
        let id = io.ring(&self.io_stats).and_then(|(d, personas)| {
            let personality = personas.of(d, &p).ok()?;
            // SAFETY: `p`'s memory is held for I/O (start_pending's
            // contract with its callers, who called begin_io); it goes
            // into `io`'s table under this id below, and end_io comes
            // only when its completion was taken (or here, if none
            // started).
            unsafe { start(d, &p, personality, &self.io_stats) }.ok()
        });
        match id {
            Some(id) => {
                io.pending.insert(id, p);
                Ok(())
            }
            None => {
                p.mem.end_io();
                let Pending { done, .. } = p;
                Err(done)
            }
        }
    }

    /// Starts an fsync (fdatasync with `datasync`) of handle `fh` on `io`'s
    /// ring, or gives `done` back to have it served synchronously.
    /// Only files with non-blocking I/O are synced so: where a sync waits
    /// for a disk, the ring's io-wq worker waits instead of this thread;
    /// on the others (tmpfs, whose sync has nothing to write) the hand-off
    /// to a worker would cost more than the call. A sync covers what the
    /// file's writes gave the host before it was issued: the client sends
    /// FSYNC after the writes it covers were answered, and an answered
    /// write is on the host.
    pub(super) fn op_start_fsync(
        &self,
        io: &mut PassthroughIo,
        unique: u64,
        fh: u64,
        datasync: bool,
        done: IoDone,
    ) -> Result<(), IoDone> {
        if !self.cfg.io_uring {
            return Err(done);
        }
        let Ok(h) = self.handles.get(fh) else {
            return Err(done);
        };
        // A directory's handle is never probed: its device's files tell.
        let nowait = if h.inode.ftype == libc::S_IFDIR {
            self.nowait_known(h.inode.key.dev)
        } else {
            h.uring
        };
        if !nowait {
            return Err(done);
        }
        let t = Target::Fd(h.fd.raw());
        let id = io.ring(&self.io_stats).and_then(|(d, personas)| {
            // The daemon's own credentials, as on the synchronous path: without a
            // personality the kernel would take whatever the thread has
            // when something submits it (another request's, served in
            // line with its caller's credentials in force).
            let own = personas.get(d, &write::WriteCreds::Own).ok()?;
            d.start_fsync(t, datasync, unique, Some(own)).ok()
        });
        let Some(id) = id else {
            return Err(done);
        };
        self.io_stats.count_sync_started();
        let op = NoData {
            done,
            h,
            alloc: None,
        };
        io.no_data.insert(id, op);
        Ok(())
    }

    pub(super) fn op_submit_started(&self, io: &mut PassthroughIo) {
        if io.idle() {
            return;
        }
        if let Some(d) = io.driver.as_mut() {
            let _ = d.submit();
        }
    }

    pub(super) fn op_collect_started(
        &self,
        io: &mut PassthroughIo,
        out: &mut Completions,
    ) -> usize {
        if io.idle() {
            return 0;
        }
        let mut finished = std::mem::take(&mut io.finished);
        let mut no_data = std::mem::take(&mut io.synced);
        let PassthroughIo {
            driver: Some(d),
            pending,
            no_data: no_data_ops,
            personas,
            reaped,
            ..
        } = io
        else {
            return 0;
        };
        let _ = d.take_started(reaped);
        let mut continued = false;
        for (id, res) in reaped.drain(..) {
            if let Some(op) = no_data_ops.remove(&id) {
                no_data.push((op, res.map(|_| 0).map_err(io::errno)));
                continue;
            }
            let Some(mut p) = pending.remove(&id) else {
                continue;
            };
            let mut stalled = false;
            let r = match res {
                Ok(n) => {
                    p.got += n;
                    if n > 0 && p.got < p.len {
                        // Short, not at the end of the file (a read), or
                        // a write the host took only part of: go on.
                        let again = personas.of(d, &p).ok().and_then(|personality| {
                            // SAFETY: `p` came out of the table, so its
                            // memory is still held for I/O; it goes back
                            // in under the new id below.
                            unsafe { start(d, &p, personality, &self.io_stats) }.ok()
                        });
                        if let Some(id) = again {
                            pending.insert(id, p);
                            continued = true;
                            continue;
                        }
                        stalled = true;
                    }
                    Ok(p.got)
                }
                Err(e) if p.got > 0 => {
                    // Bytes before the error are the answer.
                    let _ = e;
                    Ok(p.got)
                }
                Err(e) => Err(io::errno(e)),
            };
            finished.push((p, r, stalled));
        }
        if continued {
            // The continuations go in now: the caller submits only before
            // taking completions, and may not call again before they end
            // (a READ across the end of the file hung so).
            let _ = d.submit();
        }
        let n = finished.len() + no_data.len();
        for (op, mut r) in no_data.drain(..) {
            if let Some(a) = &op.alloc {
                r = self.fallocate_finished(&op.h, a, r);
            }
            out.complete(op.done, r);
        }
        for (mut p, mut r, stalled) in finished.drain(..) {
            if let Some(w) = p.write.take() {
                // SAFETY: `p`'s memory is still held for I/O: end_io comes
                // below.
                r = unsafe { self.write_finished(&p, w, r, stalled) };
            }
            // The kernel is done with the memory: the client may have it.
            p.mem.end_io();
            out.complete(p.done, r);
        }
        io.finished = finished;
        io.synced = no_data;
        n
    }

    pub(super) fn op_started_in_flight(&self, io: &PassthroughIo) -> usize {
        io.pending.len() + io.no_data.len()
    }

    pub(super) fn op_started_fd(&self, io: &PassthroughIo) -> Option<i32> {
        io.eventfd.as_ref().map(AsRawFd::as_raw_fd)
    }
}
