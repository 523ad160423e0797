//! The end of requests (the kernel's `fuse_request_end`), one or many at
//! once: each ends exactly once (FINISHED is test-and-set), its
//! background slot goes back under `bg_lock` (for a batch: one
//! acquisition for all), and its end callback runs, or its waiting
//! requester wakes, with no engine lock held.

use super::req::{flag, Location, ReplyPayload, Request};
use super::{Core, Errno, InFlight};
use crate::sync::{lock, Arc};

impl Core {
    /// Ends a request exactly once (kernel `fuse_request_end`).
    pub(crate) fn request_end(&self, req: &Arc<Request>) {
        self.request_end_all(std::slice::from_ref(req));
    }

    /// Ends several requests, each exactly once, in order: what
    /// [`Core::request_end`] does for each, with the background accounting
    /// of up to 64 of them under one acquisition of `bg_lock` (and of each
    /// ring queue's lock), then their end callbacks (or waiting
    /// requesters), in order, with no engine lock held.
    pub(crate) fn request_end_all(&self, reqs: &[Arc<Request>]) {
        for chunk in reqs.chunks(64) {
            self.request_end_each(chunk.iter());
        }
    }

    /// [`Core::request_end_all`] for at most 64 requests.
    pub(crate) fn request_end_each<'a, I>(&self, reqs: I)
    where
        I: Iterator<Item = &'a Arc<Request>> + Clone,
    {
        let reqs = reqs.take(64);
        // Bit i of each mask: request i ended here (FINISHED was clear);
        // was never made active; is a background request of the ring; a
        // background request of the transport.
        let (mut mine, mut queued, mut ring_bg, mut dev_bg) = (0u64, 0u64, 0u64, 0u64);
        for (i, req) in reqs.clone().enumerate() {
            let was = req.flags.fetch_set(flag::FINISHED);
            if was & flag::FINISHED != 0 {
                continue;
            }
            let bit = 1 << i;
            mine |= bit;
            // Never made active: still queued, or refused before queueing.
            if matches!(req.end_location(), Location::BgQueue | Location::New) {
                queued |= bit;
            }
            if req.flags.test(flag::INTERRUPTED) {
                // No stale interrupt may outlive its request.
                self.transport.drop_interrupt(&InFlight(req.clone()));
            }
            if was & flag::BACKGROUND != 0 {
                if was & flag::URING != 0 {
                    ring_bg |= bit;
                } else {
                    dev_bg |= bit;
                }
            }
        }
        if ring_bg | dev_bg != 0 {
            let budget = self.budget();
            let refused = {
                let mut bg = lock(&self.bg);
                // Ring background requests are queued and made active per
                // ring queue; bg_lock only holds their admission slot.
                // Given back, each handed on (in one go when every free
                // slot may go to a waiter).
                if ring_bg != 0 {
                    bg.unreserve_n(ring_bg.count_ones(), budget);
                }
                let mut rest = dev_bg;
                while rest != 0 {
                    let bit = rest & rest.wrapping_neg();
                    rest &= !bit;
                    if queued & bit != 0 {
                        bg.unreserve(budget);
                    } else {
                        bg.end_one(budget);
                    }
                }
                if dev_bg != 0 {
                    let next = bg.flush();
                    self.send_to_transport(next)
                } else {
                    Vec::new()
                }
            };
            let active = ring_bg & !queued;
            if let (true, Some(ring)) = (active != 0, self.ring.get()) {
                // Active ring slots back, per run of requests of one queue.
                let mut run: Option<(u16, u32)> = None;
                for (i, req) in reqs.clone().enumerate() {
                    if active & (1 << i) == 0 {
                        continue;
                    }
                    let qid = req.args.qid;
                    run = match run {
                        Some((q, n)) if q == qid => Some((q, n + 1)),
                        other => {
                            if let Some((q, n)) = other {
                                ring.background_done(q, n);
                            }
                            Some((qid, 1))
                        }
                    };
                }
                if let Some((q, n)) = run {
                    ring.background_done(q, n);
                }
            }
            self.end_refused(refused);
        }
        let ours = |i: usize| mine & (1 << i) != 0;
        for (i, req) in reqs.enumerate() {
            if !ours(i) {
                continue;
            }
            if req.flags.test(flag::ASYNC) {
                let (end, result) = {
                    let mut d = lock(&req.data);
                    let result = if d.error != 0 {
                        Err(Errno(d.error))
                    } else {
                        Ok(ReplyPayload {
                            data: std::mem::take(&mut d.out),
                            pages: std::mem::take(&mut d.pages),
                            in_client: d.in_client,
                        })
                    };
                    (d.end.take(), result)
                };
                if let Some(end) = end {
                    end.call(result);
                }
            } else {
                let _d = lock(&req.data);
                req.waitq.notify_all();
            }
        }
    }
}
