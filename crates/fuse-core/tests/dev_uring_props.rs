//! Property test: random interleavings of register, fetch, commit, drop,
//! limit changes, requests and abort, single and batched (batch sends,
//! reserved entries fetched and committed in batches), keep the ring's
//! invariants: every
//! request ends exactly once; free + held + lent pool buffers equal the
//! pool size; no entry sits on two lists (or on the wrong one).

use fuse_core::abi::{encode::Body, GetattrIn, Opcode, ReleaseIn};
use fuse_core::abi::{init, AttrOut};
use fuse_core::dev_uring::{bufpool_area, cmd_area, EntHandle, EntryBufs, Fetched, RingEnd};
use fuse_core::EndFn;
use fuse_core::{Args, Chan, ChanConfig, Negotiated};
use proptest::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const MAX_WRITE: u32 = 16 * 1024;
const QUEUES: u16 = 2;
const BUFS: u32 = 3;

#[derive(Debug, Clone)]
enum Op {
    Send { qid: u16, payload: bool },
    Register { qid: u16 },
    Fetch { ent: usize },
    Commit { held: usize },
    Drop { held: usize },
    SetMax { max: u32 },
    Abort,
    SendBatch { qid: u16, n: usize, payload: bool },
    Reserve { ent: usize },
    Prefer { qid: u16, on: bool },
    FetchOwnBatch { qid: u16, max: usize },
    CommitBatch { n: usize, bad: Option<usize> },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..QUEUES, any::<bool>()).prop_map(|(qid, payload)| Op::Send { qid, payload }),
        1 => (0..QUEUES).prop_map(|qid| Op::Register { qid }),
        4 => (0usize..8).prop_map(|ent| Op::Fetch { ent }),
        3 => (0usize..8).prop_map(|held| Op::Commit { held }),
        1 => (0usize..8).prop_map(|held| Op::Drop { held }),
        1 => (1u32..4).prop_map(|max| Op::SetMax { max }),
        1 => Just(Op::Abort),
        3 => (0..QUEUES, 1usize..6, any::<bool>())
            .prop_map(|(qid, n, payload)| Op::SendBatch { qid, n, payload }),
        1 => (0usize..8).prop_map(|ent| Op::Reserve { ent }),
        1 => (0..QUEUES, any::<bool>()).prop_map(|(qid, on)| Op::Prefer { qid, on }),
        3 => (0..QUEUES, 0usize..5).prop_map(|(qid, max)| Op::FetchOwnBatch { qid, max }),
        3 => (1usize..6, prop::option::weighted(0.2, 0usize..6))
            .prop_map(|(n, bad)| Op::CommitBatch { n, bad }),
    ]
}

struct World {
    chan: Chan,
    end: RingEnd,
    ents: Vec<EntHandle>,
    held: Vec<Fetched>,
    ends: Vec<Arc<AtomicUsize>>,
}

impl World {
    fn new() -> World {
        let chan = Chan::new(ChanConfig {
            spawn_scanner: false,
            ring_queues: QUEUES,
            ..Default::default()
        });
        chan.set_initialized(Negotiated {
            max_write: MAX_WRITE,
            flags: init::OVER_IO_URING,
            ring_queues: QUEUES,
            ..Negotiated::with_max_background(2)
        });
        let end = chan.ring_end(false);
        let mut w = World {
            chan,
            end,
            ents: Vec::new(),
            held: Vec::new(),
            ends: Vec::new(),
        };
        for q in 0..QUEUES {
            w.end.add_queue(&cmd_area(q, 0, 0)).unwrap();
            let len = BUFS * MAX_WRITE;
            w.end
                .add_bufpool(&bufpool_area(q, len), vec![0; len as usize], None)
                .unwrap();
            w.apply(Op::Register { qid: q });
        }
        w
    }

    fn args(payload: bool) -> Args {
        if payload {
            Args::new(Opcode::Getattr, 1)
                .body(Body::new().push(&GetattrIn::default()).into_vec())
                .out(std::mem::size_of::<AttrOut>(), false)
        } else {
            Args::new(Opcode::Release, 1).body(Body::new().push(&ReleaseIn::default()).into_vec())
        }
    }

    fn reply(f: &mut Fetched) {
        let len = if f.in_header().opcode == Opcode::Getattr as u32 {
            std::mem::size_of::<AttrOut>()
        } else {
            0
        };
        f.set_reply(0, len);
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Send { qid, payload } => {
                let args = Self::args(payload);
                let n = Arc::new(AtomicUsize::new(0));
                let c = n.clone();
                // FORCE: never blocks in this single-threaded driver.
                let sent = self.chan.send_background(
                    args.qid(qid).force(),
                    fuse_core::EndFn::once(move |_| {
                        c.fetch_add(1, Ordering::SeqCst);
                    }),
                );
                if sent.is_ok() {
                    self.ends.push(n);
                }
            }
            Op::Register { qid } => {
                if let Ok(h) = self
                    .end
                    .register(&cmd_area(qid, 0, 0), EntryBufs::pooled(), None)
                {
                    self.ents.push(h);
                }
            }
            Op::Fetch { ent } => {
                if let Some(h) = self.ents.get(ent % self.ents.len().max(1)) {
                    if let Ok(Some(f)) = self.end.fetch(*h, false) {
                        self.held.push(f);
                    }
                }
            }
            Op::Commit { held } => {
                if !self.held.is_empty() {
                    let mut f = self.held.remove(held % self.held.len());
                    Self::reply(&mut f);
                    let area = f.commit_cmd();
                    let _ = self.end.commit(&area, f, None);
                }
            }
            Op::Drop { held } => {
                if !self.held.is_empty() {
                    drop(self.held.remove(held % self.held.len()));
                }
            }
            Op::SetMax { max } => self.chan.set_max_background(max),
            Op::Abort => self.chan.abort(),
            Op::SendBatch { qid, n, payload } => {
                let counters: Vec<Arc<AtomicUsize>> =
                    (0..n).map(|_| Arc::new(AtomicUsize::new(0))).collect();
                let mut batch: Vec<(Args, EndFn)> = counters
                    .iter()
                    .map(|c| {
                        let c = c.clone();
                        let end: EndFn = fuse_core::EndFn::once(move |_| {
                            c.fetch_add(1, Ordering::SeqCst);
                        });
                        (Self::args(payload).qid(qid), end)
                    })
                    .collect();
                let mut sent = Vec::new();
                let taken = self.chan.try_send_background_batch(&mut batch, &mut sent);
                assert_eq!(taken + batch.len(), n);
                assert_eq!(sent.len(), taken);
                for (c, r) in counters.into_iter().zip(&sent) {
                    if r.is_ok() {
                        self.ends.push(c);
                    }
                }
            }
            Op::Reserve { ent } => {
                if let Some(h) = self.ents.get(ent % self.ents.len().max(1)) {
                    let _ = self.end.reserve(*h);
                }
            }
            Op::Prefer { qid, on } => {
                let h = self.ents.iter().copied().find(|h| h.qid == qid);
                let _ = self.end.prefer(qid, if on { h } else { None });
            }
            Op::FetchOwnBatch { qid, max } => {
                let before = self.held.len();
                match self.end.fetch_own_batch(qid, max, &mut self.held) {
                    Ok(n) => assert_eq!(self.held.len(), before + n),
                    Err(_) => assert_eq!(self.held.len(), before),
                }
                assert!(self.held.len() - before <= max);
            }
            Op::CommitBatch { n, bad } => {
                let n = n.min(self.held.len());
                let mut batch: Vec<Fetched> = self.held.drain(..n).collect();
                batch.iter_mut().for_each(Self::reply);
                if let Some(f) = bad.and_then(|i| batch.get_mut(i)) {
                    f.header.ring_ent_in_out.commit_id ^= 2;
                }
                let committed = self.end.commit_batch(&mut batch, None);
                assert_eq!(committed + batch.len(), n);
                // Refused ones stay with the server.
                self.held.extend(batch);
            }
        }
    }

    fn check(&self) -> Result<(), TestCaseError> {
        self.end.check_invariants().map_err(TestCaseError::fail)?;
        for (i, n) in self.ends.iter().enumerate() {
            let n = n.load(Ordering::SeqCst);
            prop_assert!(n <= 1, "request {i} ended {n} times");
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
    #[test]
    fn ring_invariants_hold(ops in prop::collection::vec(op(), 1..60)) {
        let mut w = World::new();
        for op in ops {
            w.apply(op);
            w.check()?;
        }
        // Wind down: abort, servers give back what they hold.
        w.chan.abort();
        w.held.clear();
        w.check()?;
        for q in 0..QUEUES {
            prop_assert_eq!(w.end.pool_free(q), Some((BUFS as usize, BUFS as usize)));
        }
        for (i, n) in w.ends.iter().enumerate() {
            prop_assert_eq!(n.load(Ordering::SeqCst), 1, "request {} did not end exactly once", i);
        }
        prop_assert_eq!(w.chan.stats().waiting, 0);
    }
}
