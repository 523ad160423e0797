//! Fault injection: a [`Filesystem`] wrapper ([`Faulty`]) that makes chosen
//! operations slow, hang, fail, or come up short, from a seed, so that the
//! layers in front of a filesystem (the engine, the virtio-fs device, a
//! host mount) can be shown to survive a backend that misbehaves. What to
//! inject is a [`FaultPlan`].
//!
//! With [`Faulty::with_async_reads`], a READ that the transport offers to
//! start without waiting ([`Filesystem::read_async`]) gets its fault
//! without blocking the serving thread: a hung READ holds its answer (and
//! its request's place in the transport) until interrupted or released, a
//! gathered one is read at once and answered when its gather is complete.
//! An answer given on another thread (an interrupt, a release, a gather's
//! last call) goes to the serving loop that started the READ, through its
//! [`FaultyIo`], and wakes it.

use super::{
    Created, Ctx, Deferred, DirPlusSink, DirSink, Entry, FileLock, Filesystem, FsResult, LockReq,
    Opened, ReadSink, WriteSource, Xattr,
};
use crate::abi::{Attr, Kstatfs, Opcode, SetattrIn, Statx};
use crate::chan::{ClientMem, Errno};
use crate::sync::{lock, wait, Arc, AtomicU64, Condvar, Mutex, Ordering};
use std::collections::HashSet;
use std::time::Duration;
use thiserror::Error;

mod async_reads;

use async_reads::Back;
pub use async_reads::FaultyIo;
mod plan;

/// What a rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Sleep, then run the operation.
    Delay(Duration),
    /// Block until interrupted or released; then EINTR.
    Hang,
    /// Fail with this errno without running the operation.
    Error(Errno),
    /// READ/WRITE on part of the data only (other operations: no effect).
    Short,
    /// Held until this many calls are held at once.
    Gather(u32),
}

/// One rule of a [`FaultPlan`].
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Operations it applies to (None: all).
    pub op: Option<Opcode>,
    /// What it does.
    pub fault: Fault,
    /// Probability per matching call.
    pub p: f64,
    /// Matching calls to let through first.
    pub after: u64,
    /// Most times it applies (None: no limit).
    pub times: Option<u64>,
}

/// Why a plan does not parse.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PlanError {
    /// An operation name that is not a FUSE opcode.
    #[error("unknown operation {0:?} (a FUSE opcode name such as read, or *)")]
    Op(String),
    /// A field that is not understood.
    #[error("bad field {0:?} in fault rule")]
    Field(String),
    /// A count field whose value is not a number.
    #[error("bad count in field {field:?} of fault rule")]
    Count {
        /// The field.
        field: String,
        /// Why its value is not a count.
        #[source]
        source: std::num::ParseIntError,
    },
    /// A rule with no fault.
    #[error("rule {0:?} names no fault (delay=, hang, error=, short, gather=)")]
    NoFault(String),
}

/// Rules and a seed. A plan is a list of rules, each naming operations (by
/// FUSE opcode name, or `*` for all), what to do and how often:
///
/// ```text
/// read:error=EIO:p=0.1, write:short:p=0.5, getattr:hang:p=0.01, *:delay=5ms:p=0.2
/// ```
///
/// - `delay=DUR` sleeps (`5ms`, `2s`) and then runs the operation;
/// - `hang` blocks until the request is interrupted (FUSE_INTERRUPT, or the
///   virtio-fs device giving up on it after its timeout), or until
///   [`Faulty::release_hangs`]; then it fails with EINTR;
/// - `error=ERRNO` fails without running the operation (a name such as
///   `EIO`, or a number);
/// - `short` runs a READ or WRITE on part of its data (a random length,
///   never 0): a short read or write reaches the caller;
/// - `gather=N` holds a call until N calls are held at once (all rules'
///   gathers together), then lets them all go on: N requests in flight at
///   once, or a hang for a server that cannot have that many (released
///   like a hang);
/// - `p=P` is the probability (default 1), `after=N` skips the first N
///   matching calls, `times=N` applies the rule at most N times.
///
/// The first rule whose operation matches and whose draw succeeds applies.
/// Draws come from one seeded generator, so a single-threaded run repeats
/// exactly; counters of every fault injected are kept per kind.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FaultPlan {
    /// Rules, first match wins.
    pub rules: Vec<Rule>,
    /// Seed of the draws.
    pub seed: u64,
}

/// Faults injected so far, by kind.
#[derive(Debug, Default)]
pub struct FaultCounts {
    /// Delays.
    pub delays: AtomicU64,
    /// Hangs started.
    pub hangs: AtomicU64,
    /// Hangs ended by an interrupt.
    pub hangs_interrupted: AtomicU64,
    /// Errors.
    pub errors: AtomicU64,
    /// Short reads and writes.
    pub shorts: AtomicU64,
    /// Calls held by a gather.
    pub gathers: AtomicU64,
}

/// Hung calls (guarded by `Faulty::hung`): uniques interrupted, and
/// whether every hang is released; hung READs started without waiting,
/// whose answers are held here.
#[derive(Debug, Default)]
struct Hung {
    interrupted: HashSet<u64>,
    released: bool,
    parked: Vec<(u64, super::IoDone, Back)>,
}

/// `inner` with the faults of a plan (see [`FaultPlan`]).
#[derive(Debug)]
pub struct Faulty<F> {
    inner: F,
    plan: FaultPlan,
    /// Generator state (splitmix64), calls seen per rule and times each
    /// applied.
    draw: Mutex<(u64, Vec<u64>, Vec<u64>)>,
    hung: Mutex<Hung>,
    hung_cv: Condvar,
    /// Calls held by `gather` (see [`async_reads::Gather`]).
    gather: Arc<Mutex<async_reads::Gather>>,
    gather_cv: Condvar,
    /// READs offered to start without waiting get their faults so.
    async_reads: bool,
    counts: FaultCounts,
}

/// What the wrapper decided for one call.
enum Decision {
    Run,
    Short(u64),
    Fail(Errno),
}

impl<F: Filesystem> Faulty<F> {
    /// Wraps `inner`.
    pub fn new(inner: F, plan: FaultPlan) -> Self {
        let n = plan.rules.len();
        let seed = plan.seed;
        Faulty {
            inner,
            plan,
            draw: Mutex::new((seed, vec![0; n], vec![0; n])),
            hung: Mutex::new(Hung::default()),
            hung_cv: Condvar::new(),
            gather: Arc::default(),
            gather_cv: Condvar::new(),
            async_reads: false,
            counts: FaultCounts::default(),
        }
    }

    /// Applies the plan to READs the transport offers to start without
    /// waiting ([`Filesystem::read_async`]) without blocking its thread
    /// (see the module docs). Off by default: such READs then go the usual
    /// way whenever there is a plan.
    pub fn with_async_reads(mut self, on: bool) -> Self {
        self.async_reads = on;
        self
    }

    /// The wrapped filesystem.
    pub fn inner(&self) -> &F {
        &self.inner
    }

    /// Faults injected so far.
    pub fn counts(&self) -> &FaultCounts {
        &self.counts
    }

    /// Ends every hang, now and later (they fail with EINTR).
    pub fn release_hangs(&self) {
        let parked = {
            let mut h = lock(&self.hung);
            h.released = true;
            std::mem::take(&mut h.parked)
        };
        self.hung_cv.notify_all();
        for (_, done, back) in parked {
            back.give(done, Err(Errno::EINTR));
        }
        self.release_gathers();
    }

    fn next(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The fault the plan draws for a call of `op`, and a random word.
    fn draw(&self, op: Opcode) -> Option<(Fault, u64)> {
        let mut d = lock(&self.draw);
        let (state, seen, applied) = &mut *d;
        for (i, r) in self.plan.rules.iter().enumerate() {
            if r.op.is_some_and(|o| o != op) {
                continue;
            }
            seen[i] += 1;
            if seen[i] <= r.after || r.times.is_some_and(|t| applied[i] >= t) {
                continue;
            }
            let x = (Self::next(state) >> 11) as f64 / (1u64 << 53) as f64;
            if x < r.p {
                applied[i] += 1;
                return Some((r.fault, Self::next(state)));
            }
        }
        None
    }

    /// Applies the plan to a call of `op` by request `unique`.
    fn decide(&self, op: Opcode, unique: u64) -> Decision {
        if self.plan.rules.is_empty() {
            return Decision::Run;
        }
        let fault = self.draw(op);
        match fault {
            Some((Fault::Gather(n), _)) => {
                self.gather_wait(n);
                Decision::Run
            }
            None => Decision::Run,
            Some((Fault::Delay(d), _)) => {
                self.counts.delays.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(d);
                Decision::Run
            }
            Some((Fault::Error(e), _)) => {
                self.counts.errors.fetch_add(1, Ordering::Relaxed);
                Decision::Fail(e)
            }
            Some((Fault::Short, r)) => {
                if matches!(op, Opcode::Read | Opcode::Write) {
                    self.counts.shorts.fetch_add(1, Ordering::Relaxed);
                    Decision::Short(r)
                } else {
                    Decision::Run
                }
            }
            Some((Fault::Hang, _)) => {
                self.counts.hangs.fetch_add(1, Ordering::Relaxed);
                let mut h = lock(&self.hung);
                while !h.released && !h.interrupted.contains(&unique) {
                    h = wait(&self.hung_cv, h);
                }
                if h.interrupted.remove(&unique) {
                    self.counts
                        .hangs_interrupted
                        .fetch_add(1, Ordering::Relaxed);
                }
                Decision::Fail(Errno::EINTR)
            }
        }
    }

    /// Runs `f` unless the plan says otherwise (for operations with no
    /// data, where `short` does nothing).
    fn gate<T>(&self, op: Opcode, ctx: &Ctx, f: impl FnOnce() -> FsResult<T>) -> FsResult<T> {
        match self.decide(op, ctx.unique) {
            Decision::Fail(e) => Err(e),
            Decision::Run | Decision::Short(_) => f(),
        }
    }
}

/// A READ sink cut to `n` bytes.
struct ShortSink<'a> {
    inner: &'a mut dyn ReadSink,
    n: usize,
}

impl ReadSink for ShortSink<'_> {
    fn buffer(&mut self) -> &mut [u8] {
        let n = self.n;
        let b = self.inner.buffer();
        let n = n.min(b.len());
        &mut b[..n]
    }
    fn client(&self) -> Option<(&dyn ClientMem, usize)> {
        self.inner.client().map(|(m, len)| (m, len.min(self.n)))
    }
}

/// WRITE data cut to `n` bytes (by copy: client memory cannot be cut).
struct ShortSource {
    data: Vec<u8>,
}

impl WriteSource for ShortSource {
    fn data(&self) -> &[u8] {
        &self.data
    }
}

/// A length in `1..=len` from draw `r` (len > 0).
fn cut(len: usize, r: u64) -> usize {
    1 + (r % len.max(1) as u64) as usize
}

impl<F: Filesystem> Filesystem for Faulty<F> {
    type Inode = F::Inode;
    type Handle = F::Handle;
    type Io = FaultyIo<F::Io>;

    fn new_io(&self, wake: super::Wake) -> FaultyIo<F::Io> {
        FaultyIo {
            inner: self.inner.new_io(wake.clone()),
            back: Back::new(wake),
        }
    }

    fn init(&self, capable: u64) -> FsResult<u64> {
        self.inner.init(capable)
    }
    fn destroy(&self) {
        self.release_hangs();
        self.inner.destroy()
    }
    fn save_state(&self) -> Result<Vec<u8>, super::state::StateError> {
        self.inner.save_state()
    }
    fn load_state(&self, state: &[u8]) -> Result<(), super::state::StateError> {
        self.inner.load_state(state)
    }
    fn lookup(&self, ctx: &Ctx, parent: F::Inode, name: &[u8]) -> FsResult<Entry<F::Inode>> {
        self.gate(Opcode::Lookup, ctx, || self.inner.lookup(ctx, parent, name))
    }
    fn forget(&self, inode: F::Inode, nlookup: u64) {
        self.inner.forget(inode, nlookup)
    }
    fn getattr(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        handle: Option<F::Handle>,
    ) -> FsResult<(Attr, Duration)> {
        self.gate(Opcode::Getattr, ctx, || {
            self.inner.getattr(ctx, inode, handle)
        })
    }
    fn setattr(&self, ctx: &Ctx, inode: F::Inode, arg: &SetattrIn) -> FsResult<(Attr, Duration)> {
        self.gate(Opcode::Setattr, ctx, || self.inner.setattr(ctx, inode, arg))
    }
    fn readlink(&self, ctx: &Ctx, inode: F::Inode) -> FsResult<Vec<u8>> {
        self.gate(Opcode::Readlink, ctx, || self.inner.readlink(ctx, inode))
    }
    fn symlink(
        &self,
        ctx: &Ctx,
        parent: F::Inode,
        name: &[u8],
        target: &[u8],
    ) -> FsResult<Entry<F::Inode>> {
        self.gate(Opcode::Symlink, ctx, || {
            self.inner.symlink(ctx, parent, name, target)
        })
    }
    fn mknod(
        &self,
        ctx: &Ctx,
        parent: F::Inode,
        name: &[u8],
        mode: u32,
        rdev: u32,
        umask: u32,
    ) -> FsResult<Entry<F::Inode>> {
        self.gate(Opcode::Mknod, ctx, || {
            self.inner.mknod(ctx, parent, name, mode, rdev, umask)
        })
    }
    fn mkdir(
        &self,
        ctx: &Ctx,
        parent: F::Inode,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> FsResult<Entry<F::Inode>> {
        self.gate(Opcode::Mkdir, ctx, || {
            self.inner.mkdir(ctx, parent, name, mode, umask)
        })
    }
    fn unlink(&self, ctx: &Ctx, parent: F::Inode, name: &[u8]) -> FsResult<()> {
        self.gate(Opcode::Unlink, ctx, || self.inner.unlink(ctx, parent, name))
    }
    fn rmdir(&self, ctx: &Ctx, parent: F::Inode, name: &[u8]) -> FsResult<()> {
        self.gate(Opcode::Rmdir, ctx, || self.inner.rmdir(ctx, parent, name))
    }
    fn rename(
        &self,
        ctx: &Ctx,
        parent: F::Inode,
        name: &[u8],
        newparent: F::Inode,
        newname: &[u8],
        flags: u32,
    ) -> FsResult<()> {
        self.gate(Opcode::Rename, ctx, || {
            self.inner
                .rename(ctx, parent, name, newparent, newname, flags)
        })
    }
    fn link(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        newparent: F::Inode,
        newname: &[u8],
    ) -> FsResult<Entry<F::Inode>> {
        self.gate(Opcode::Link, ctx, || {
            self.inner.link(ctx, inode, newparent, newname)
        })
    }
    fn open(&self, ctx: &Ctx, inode: F::Inode, flags: u32) -> FsResult<Opened<F::Handle>> {
        self.gate(Opcode::Open, ctx, || self.inner.open(ctx, inode, flags))
    }
    fn read(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        handle: F::Handle,
        offset: u64,
        sink: &mut dyn ReadSink,
    ) -> FsResult<usize> {
        match self.decide(Opcode::Read, ctx.unique) {
            Decision::Fail(e) => Err(e),
            Decision::Run => self.inner.read(ctx, inode, handle, offset, sink),
            Decision::Short(r) => {
                let by_ref = sink.client().map(|(_, n)| n);
                let len = match by_ref {
                    Some(n) => n,
                    None => sink.buffer().len(),
                };
                let mut short = ShortSink {
                    inner: sink,
                    n: cut(len, r),
                };
                self.inner.read(ctx, inode, handle, offset, &mut short)
            }
        }
    }
    fn read_async(
        &self,
        io: &mut FaultyIo<F::Io>,
        out: &mut super::Completions,
        ctx: &Ctx,
        inode: F::Inode,
        handle: F::Handle,
        offset: u64,
        len: usize,
        mem: Arc<dyn crate::chan::ClientMem>,
        done: super::IoDone,
    ) -> Result<(), super::IoDone> {
        if self.plan.rules.is_empty() {
            return self.inner.read_async(
                &mut io.inner,
                out,
                ctx,
                inode,
                handle,
                offset,
                len,
                mem,
                done,
            );
        }
        // Without async faults, READs go the usual way, where the plan
        // applies.
        if !self.async_reads {
            return Err(done);
        }
        let read = async_reads::Read {
            ctx,
            inode,
            handle,
            offset,
            len,
            mem,
        };
        self.read_started(io, out, read, done);
        Ok(())
    }
    fn write_async(
        &self,
        io: &mut FaultyIo<F::Io>,
        out: &mut super::Completions,
        ctx: &Ctx,
        inode: F::Inode,
        handle: F::Handle,
        offset: u64,
        mem: Arc<dyn crate::chan::ClientMem>,
        flags: u32,
        done: super::IoDone,
    ) -> Result<(), super::IoDone> {
        // With a plan, WRITEs go the usual way, where it applies.
        if !self.plan.rules.is_empty() {
            return Err(done);
        }
        self.inner.write_async(
            &mut io.inner,
            out,
            ctx,
            inode,
            handle,
            offset,
            mem,
            flags,
            done,
        )
    }
    fn fsync_async(
        &self,
        io: &mut FaultyIo<F::Io>,
        out: &mut super::Completions,
        ctx: &Ctx,
        inode: F::Inode,
        handle: F::Handle,
        datasync: bool,
        dir: bool,
        done: super::IoDone,
    ) -> Result<(), super::IoDone> {
        // With a plan, syncs go the usual way, where it applies.
        if !self.plan.rules.is_empty() {
            return Err(done);
        }
        self.inner
            .fsync_async(&mut io.inner, out, ctx, inode, handle, datasync, dir, done)
    }
    fn fallocate_async(
        &self,
        io: &mut FaultyIo<F::Io>,
        out: &mut super::Completions,
        ctx: &Ctx,
        inode: F::Inode,
        handle: F::Handle,
        mode: u32,
        offset: u64,
        length: u64,
        done: super::IoDone,
    ) -> Result<(), super::IoDone> {
        // With a plan, FALLOCATEs go the usual way, where it applies.
        if !self.plan.rules.is_empty() {
            return Err(done);
        }
        self.inner.fallocate_async(
            &mut io.inner,
            out,
            ctx,
            inode,
            handle,
            mode,
            offset,
            length,
            done,
        )
    }
    fn submit_async(&self, io: &mut FaultyIo<F::Io>) {
        self.inner.submit_async(&mut io.inner)
    }
    fn complete_async(&self, io: &mut FaultyIo<F::Io>, out: &mut super::Completions) -> usize {
        self.completed(io, out)
    }
    fn async_in_flight(&self, io: &FaultyIo<F::Io>) -> usize {
        self.inner.async_in_flight(&io.inner)
    }
    fn async_fd(&self, io: &FaultyIo<F::Io>) -> Option<i32> {
        self.inner.async_fd(&io.inner)
    }
    fn write(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        handle: F::Handle,
        offset: u64,
        src: &dyn WriteSource,
        flags: u32,
    ) -> FsResult<usize> {
        match self.decide(Opcode::Write, ctx.unique) {
            Decision::Fail(e) => Err(e),
            Decision::Run => self.inner.write(ctx, inode, handle, offset, src, flags),
            Decision::Short(r) => {
                let data = src.data();
                if data.is_empty() {
                    return self.inner.write(ctx, inode, handle, offset, src, flags);
                }
                let short = ShortSource {
                    data: data[..cut(data.len(), r)].to_vec(),
                };
                self.inner.write(ctx, inode, handle, offset, &short, flags)
            }
        }
    }
    fn flush(&self, ctx: &Ctx, inode: F::Inode, handle: F::Handle, owner: u64) -> FsResult<()> {
        self.gate(Opcode::Flush, ctx, || {
            self.inner.flush(ctx, inode, handle, owner)
        })
    }
    fn release(&self, ctx: &Ctx, inode: F::Inode, handle: F::Handle, flags: u32) -> FsResult<()> {
        // Never faulted: a handle that is not released would leak.
        self.inner.release(ctx, inode, handle, flags)
    }
    fn fsync(&self, ctx: &Ctx, inode: F::Inode, handle: F::Handle, datasync: bool) -> FsResult<()> {
        self.gate(Opcode::Fsync, ctx, || {
            self.inner.fsync(ctx, inode, handle, datasync)
        })
    }
    fn opendir(&self, ctx: &Ctx, inode: F::Inode, flags: u32) -> FsResult<Opened<F::Handle>> {
        self.gate(Opcode::Opendir, ctx, || {
            self.inner.opendir(ctx, inode, flags)
        })
    }
    fn readdir(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        handle: F::Handle,
        offset: u64,
        sink: &mut dyn DirSink,
    ) -> FsResult<()> {
        self.gate(Opcode::Readdir, ctx, || {
            self.inner.readdir(ctx, inode, handle, offset, sink)
        })
    }
    fn releasedir(&self, ctx: &Ctx, inode: F::Inode, handle: F::Handle) -> FsResult<()> {
        self.inner.releasedir(ctx, inode, handle)
    }
    fn fsyncdir(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        handle: F::Handle,
        datasync: bool,
    ) -> FsResult<()> {
        self.gate(Opcode::Fsyncdir, ctx, || {
            self.inner.fsyncdir(ctx, inode, handle, datasync)
        })
    }
    fn statfs(&self, ctx: &Ctx, inode: F::Inode) -> FsResult<Kstatfs> {
        self.gate(Opcode::Statfs, ctx, || self.inner.statfs(ctx, inode))
    }
    fn setxattr(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        name: &[u8],
        value: &[u8],
        flags: u32,
        ext_flags: u32,
    ) -> FsResult<()> {
        self.gate(Opcode::Setxattr, ctx, || {
            self.inner
                .setxattr(ctx, inode, name, value, flags, ext_flags)
        })
    }
    fn getxattr(&self, ctx: &Ctx, inode: F::Inode, name: &[u8], size: u32) -> FsResult<Xattr> {
        self.gate(Opcode::Getxattr, ctx, || {
            self.inner.getxattr(ctx, inode, name, size)
        })
    }
    fn listxattr(&self, ctx: &Ctx, inode: F::Inode, size: u32) -> FsResult<Xattr> {
        self.gate(Opcode::Listxattr, ctx, || {
            self.inner.listxattr(ctx, inode, size)
        })
    }
    fn removexattr(&self, ctx: &Ctx, inode: F::Inode, name: &[u8]) -> FsResult<()> {
        self.gate(Opcode::Removexattr, ctx, || {
            self.inner.removexattr(ctx, inode, name)
        })
    }
    fn access(&self, ctx: &Ctx, inode: F::Inode, mask: u32) -> FsResult<()> {
        self.gate(Opcode::Access, ctx, || self.inner.access(ctx, inode, mask))
    }
    fn create(
        &self,
        ctx: &Ctx,
        parent: F::Inode,
        name: &[u8],
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> FsResult<Created<F::Inode, F::Handle>> {
        self.gate(Opcode::Create, ctx, || {
            self.inner.create(ctx, parent, name, mode, flags, umask)
        })
    }
    fn fallocate(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        handle: F::Handle,
        mode: u32,
        offset: u64,
        length: u64,
    ) -> FsResult<()> {
        self.gate(Opcode::Fallocate, ctx, || {
            self.inner
                .fallocate(ctx, inode, handle, mode, offset, length)
        })
    }
    fn lseek(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        handle: F::Handle,
        offset: u64,
        whence: u32,
    ) -> FsResult<u64> {
        self.gate(Opcode::Lseek, ctx, || {
            self.inner.lseek(ctx, inode, handle, offset, whence)
        })
    }
    fn syncfs(&self, ctx: &Ctx, inode: F::Inode) -> FsResult<()> {
        self.gate(Opcode::Syncfs, ctx, || self.inner.syncfs(ctx, inode))
    }
    fn readdirplus(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        handle: F::Handle,
        offset: u64,
        sink: &mut dyn DirPlusSink,
    ) -> FsResult<()> {
        self.gate(Opcode::Readdirplus, ctx, || {
            self.inner.readdirplus(ctx, inode, handle, offset, sink)
        })
    }
    fn getlk(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        handle: F::Handle,
        req: &LockReq,
    ) -> FsResult<FileLock> {
        self.gate(Opcode::Getlk, ctx, || {
            self.inner.getlk(ctx, inode, handle, req)
        })
    }
    fn setlk(&self, ctx: &Ctx, inode: F::Inode, handle: F::Handle, req: &LockReq) -> FsResult<()> {
        self.gate(Opcode::Setlk, ctx, || {
            self.inner.setlk(ctx, inode, handle, req)
        })
    }
    fn setlkw(&self, ctx: &Ctx, inode: F::Inode, handle: F::Handle, req: &LockReq, done: Deferred) {
        match self.decide(Opcode::Setlkw, ctx.unique) {
            Decision::Fail(e) => done.complete(Err(e)),
            Decision::Run | Decision::Short(_) => self.inner.setlkw(ctx, inode, handle, req, done),
        }
    }
    fn interrupt(&self, unique: u64) {
        if self.plan.rules.iter().any(|r| r.fault == Fault::Hang) {
            let mut h = lock(&self.hung);
            if let Some(i) = h.parked.iter().position(|(u, _, _)| *u == unique) {
                let (_, done, back) = h.parked.swap_remove(i);
                drop(h);
                self.counts
                    .hangs_interrupted
                    .fetch_add(1, Ordering::Relaxed);
                back.give(done, Err(Errno::EINTR));
                return self.inner.interrupt(unique);
            }
            // Interrupts of calls that never hung would pile up: keep a
            // bounded set (a hang checks it as soon as it starts).
            if h.interrupted.len() >= 4096 {
                h.interrupted.clear();
            }
            h.interrupted.insert(unique);
            self.hung_cv.notify_all();
        }
        self.inner.interrupt(unique)
    }
    fn tmpfile(
        &self,
        ctx: &Ctx,
        parent: F::Inode,
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> FsResult<Created<F::Inode, F::Handle>> {
        self.gate(Opcode::Tmpfile, ctx, || {
            self.inner.tmpfile(ctx, parent, mode, flags, umask)
        })
    }
    #[allow(clippy::too_many_arguments)]
    fn copy_file_range(
        &self,
        ctx: &Ctx,
        inode_in: F::Inode,
        handle_in: F::Handle,
        off_in: u64,
        inode_out: F::Inode,
        handle_out: F::Handle,
        off_out: u64,
        len: u64,
        flags: u64,
    ) -> FsResult<u64> {
        self.gate(Opcode::CopyFileRange, ctx, || {
            self.inner.copy_file_range(
                ctx, inode_in, handle_in, off_in, inode_out, handle_out, off_out, len, flags,
            )
        })
    }
    fn statx(
        &self,
        ctx: &Ctx,
        inode: F::Inode,
        handle: Option<F::Handle>,
        flags: u32,
        mask: u32,
    ) -> FsResult<(Statx, Duration)> {
        self.gate(Opcode::Statx, ctx, || {
            self.inner.statx(ctx, inode, handle, flags, mask)
        })
    }
}
