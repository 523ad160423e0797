//! Fault injection: a [`Filesystem`] wrapper ([`Faulty`]) that makes chosen
//! operations slow, hang, fail, or come up short, from a seed, so that the
//! layers in front of a filesystem (the engine, the virtio-fs device, a
//! host mount) can be shown to survive a backend that misbehaves. What to
//! inject is a [`FaultPlan`].
//!
//! With [`Faulty::with_started_reads`], a READ that the transport offers to
//! start without waiting ([`Filesystem::start_read`]) gets its fault
//! without blocking the serving thread: a hung READ holds its answer (and
//! its request's place in the transport) until interrupted or released, a
//! gathered one is read at once and answered when its gather is complete.
//! An answer given on another thread (an interrupt, a release, a gather's
//! last call) goes to the serving loop that started the READ, through its
//! [`FaultyIo`], and wakes it. The plan is in `plan`, the forwarding
//! [`Filesystem`] impl in `forward`.

mod forward;
mod plan;
mod started_reads;

use super::{Ctx, Filesystem, FsResult};
use crate::abi::Opcode;
use crate::chan::Errno;
use crate::sync::{lock, wait, Arc, AtomicU64, Condvar, Mutex, Ordering};
use std::collections::HashSet;

pub use plan::{Fault, FaultPlan, PlanError, Rule};
use started_reads::Back;
pub use started_reads::FaultyIo;

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
    /// Calls held by `gather` (see [`started_reads::Gather`]).
    gather: Arc<Mutex<started_reads::Gather>>,
    gather_cv: Condvar,
    /// READs offered to start without waiting get their faults so.
    started_reads: bool,
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
            started_reads: false,
            counts: FaultCounts::default(),
        }
    }

    /// Applies the plan to READs the transport offers to start without
    /// waiting ([`Filesystem::start_read`]) without blocking its thread
    /// (see the module docs). Off by default: such READs then go the usual
    /// way whenever there is a plan.
    pub fn with_started_reads(mut self, on: bool) -> Self {
        self.started_reads = on;
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

/// A length in `1..=len` from draw `r` (len > 0).
fn cut(len: usize, r: u64) -> usize {
    1 + (r % len.max(1) as u64) as usize
}
