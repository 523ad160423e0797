//! Counters a running device keeps, readable while it runs. The device
//! adds to them through `add_*` (one relaxed atomic add each); everyone
//! else reads them.

use fuse_core::abi::Opcode;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Opcodes are below this (CUSE_INIT is counted as "other").
const OPCODES: usize = 64;

/// Per-queue counters.
#[derive(Debug, Default)]
pub struct QueueStats {
    /// Chains popped and sent into the engine.
    submitted: AtomicU64,
    /// Replies written back to the guest.
    completed: AtomicU64,
    /// Times the queue stopped popping because admission was full.
    stalls: AtomicU64,
    /// Chains refused as malformed.
    malformed: AtomicU64,
    /// Rounds in which the watchdog drained the queue because its vring
    /// thread was stuck serving a request in line.
    takeovers: AtomicU64,
    /// Requests the vring thread served itself (no hand-off).
    inline: AtomicU64,
    /// Polls of the avail ring that found chains (wake-ups the guest did
    /// not need to cause).
    polled: AtomicU64,
    /// Polls that ran out of their window: the thread then slept.
    poll_misses: AtomicU64,
    /// Answers by opcode: kept per queue, so the thread that answers a
    /// queue's requests (its vring thread, mostly) writes counters no
    /// other queue's thread shares; folded when read.
    ops: OpTable,
}

/// Per-opcode counters of one queue.
#[derive(Debug)]
struct OpTable(Vec<OpStats>);

impl Default for OpTable {
    fn default() -> Self {
        OpTable((0..OPCODES).map(|_| OpStats::default()).collect())
    }
}

/// Adds to a counter and reads it: the adds are what the request path
/// pays, one relaxed atomic add each (no lock, no allocation).
macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident, $add:ident;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(&self) -> u64 {
                self.$name.load(Ordering::Relaxed)
            }

            #[inline]
            pub(crate) fn $add(&self, n: u64) {
                self.$name.fetch_add(n, Ordering::Relaxed);
            }
        )*
    };
}

impl QueueStats {
    counters! {
        /// Chains popped and sent into the engine.
        submitted, add_submitted;
        /// Replies written back to the guest.
        completed, add_completed;
        /// Times the queue stopped popping because admission was full.
        stalls, add_stalls;
        /// Chains refused as malformed.
        malformed, add_malformed;
        /// Rounds in which the watchdog drained the queue because its
        /// vring thread was stuck serving a request in line.
        takeovers, add_takeovers;
        /// Requests the vring thread served itself (no hand-off).
        inline, add_inline;
        /// Polls of the avail ring that found chains (wake-ups the guest
        /// did not need to cause).
        polled, add_polled;
        /// Polls that ran out of their window: the thread then slept.
        poll_misses, add_poll_misses;
    }

    /// Requests popped and not yet answered.
    pub fn in_flight(&self) -> u64 {
        self.submitted().saturating_sub(self.completed())
    }
}

#[derive(Debug, Default)]
struct OpStats {
    count: AtomicU64,
    errors: AtomicU64,
    total_ns: AtomicU64,
    max_ns: AtomicU64,
}

/// [`OpStats`] read and summed.
#[derive(Debug, Default)]
struct OpTotals {
    count: u64,
    errors: u64,
    total_ns: u64,
    max_ns: u64,
}

/// The device's counters.
#[derive(Debug)]
pub struct DeviceStats {
    /// Index 0 is the hiprio queue, then the request queues.
    queues: Vec<QueueStats>,
    /// Requests answered with an error because they outlived the timeout.
    timeouts: AtomicU64,
    /// Requests that ended because the engine connection was aborted.
    aborted: AtomicU64,
    /// Requests a vring stop gave up on: still unanswered when its wait
    /// for them ended (`DeviceConfig::vring_stop_drain`).
    lost_on_stop: AtomicU64,
    /// Host work of given-up requests (host calls, I/O on guest buffers)
    /// still running when a vring stop or reset stopped waiting for it.
    stuck_on_stop: AtomicU64,
    /// Guest FUSE sessions ended by a reset or a new INIT (as DESTROY
    /// ends one).
    sessions_ended: AtomicU64,
}

impl DeviceStats {
    pub(crate) fn new(queues: usize) -> Self {
        DeviceStats {
            queues: (0..queues).map(|_| QueueStats::default()).collect(),
            timeouts: AtomicU64::new(0),
            aborted: AtomicU64::new(0),
            lost_on_stop: AtomicU64::new(0),
            stuck_on_stop: AtomicU64::new(0),
            sessions_ended: AtomicU64::new(0),
        }
    }

    counters! {
        /// Requests answered with an error because they outlived the
        /// timeout.
        timeouts, add_timeouts;
        /// Requests that ended because the engine connection was aborted.
        aborted, add_aborted;
        /// Requests a vring stop gave up on.
        lost_on_stop, add_lost_on_stop;
        /// Host work of given-up requests still running when a vring stop
        /// or reset stopped waiting for it.
        stuck_on_stop, add_stuck_on_stop;
        /// Guest FUSE sessions ended by a reset or a new INIT.
        sessions_ended, add_sessions_ended;
    }

    /// Each queue's counters: index 0 is the hiprio queue, then the
    /// request queues (virtqueue order).
    pub fn queues(&self) -> &[QueueStats] {
        &self.queues
    }

    /// Counts an answer to `opcode` on virtqueue `vq`.
    pub(crate) fn record(&self, vq: usize, opcode: u32, error: i32, took: Duration) {
        let Some(q) = self.queues.get(vq) else { return };
        let op = &q.ops.0[(opcode as usize).min(OPCODES - 1)];
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        op.count.fetch_add(1, Ordering::Relaxed);
        if error != 0 {
            op.errors.fetch_add(1, Ordering::Relaxed);
        }
        op.total_ns.fetch_add(ns, Ordering::Relaxed);
        op.max_ns.fetch_max(ns, Ordering::Relaxed);
    }

    /// Requests answered for `opcode` so far.
    pub fn op_count(&self, opcode: Opcode) -> u64 {
        self.op_totals((opcode as usize).min(OPCODES - 1)).count
    }

    /// The counters of opcode index `code`, summed over the queues.
    fn op_totals(&self, code: usize) -> OpTotals {
        let mut t = OpTotals::default();
        for q in &self.queues {
            let op = &q.ops.0[code];
            t.count += op.count.load(Ordering::Relaxed);
            t.errors += op.errors.load(Ordering::Relaxed);
            t.total_ns += op.total_ns.load(Ordering::Relaxed);
            t.max_ns = t.max_ns.max(op.max_ns.load(Ordering::Relaxed));
        }
        t
    }

    /// A human-readable snapshot: per-queue depths and counts, timeouts,
    /// aborts, and per-opcode count, errors, mean and max latency.
    pub fn report(&self) -> String {
        let mut s = String::new();
        for (i, q) in self.queues.iter().enumerate() {
            let name = if i == 0 {
                "hiprio".to_string()
            } else {
                format!("request{}", i - 1)
            };
            let _ = writeln!(
                s,
                "queue {name}: submitted {} completed {} in-flight {} stalls {} malformed {} inline {} takeovers {} polled {} poll-misses {}",
                q.submitted(),
                q.completed(),
                q.in_flight(),
                q.stalls(),
                q.malformed(),
                q.inline(),
                q.takeovers(),
                q.polled(),
                q.poll_misses(),
            );
        }
        let _ = writeln!(
            s,
            "timeouts {} aborted {} lost-on-stop {} stuck-on-stop {} sessions-ended {}",
            self.timeouts(),
            self.aborted(),
            self.lost_on_stop(),
            self.stuck_on_stop(),
            self.sessions_ended()
        );
        for code in 0..OPCODES {
            let op = self.op_totals(code);
            let n = op.count;
            if n == 0 {
                continue;
            }
            let name = u32::try_from(code)
                .ok()
                .and_then(Opcode::from_u32)
                .map_or_else(|| format!("op{code}"), |o| format!("{o:?}"));
            let _ = writeln!(
                s,
                "{name:<16} count {n:>9} errors {:>7} mean {:>8} us max {:>8} us",
                op.errors,
                op.total_ns / n / 1000,
                op.max_ns / 1000,
            );
        }
        s
    }
}
