//! The ring as the engine sees it: a [`Transport`] (the kernel's
//! `fuse_io_uring_ops`) that exists from the connection's assembly on and
//! holds the [`Ring`] once INIT accepted FUSE_OVER_IO_URING. The engine
//! swaps it in for the device when every queue has registered (its gate);
//! interrupts and forgets stay on the device, as in the kernel, whose ring
//! ops reuse the device's for them.

use super::Ring;
use crate::abi::{self, ForgetOne};
use crate::chan::{Core, Errno, InFlight, Negotiated, Transport};
use crate::sync::{Arc, Weak};
use std::sync::OnceLock;
use std::time::Duration;

/// See the module docs. Found again by the server's end ([`super::RingEnd`])
/// among the connection's parts.
pub(crate) struct RingLink {
    core: Weak<Core>,
    ring: OnceLock<Arc<Ring>>,
}

impl RingLink {
    pub(crate) fn new(core: Weak<Core>) -> RingLink {
        RingLink {
            core,
            ring: OnceLock::new(),
        }
    }

    /// The ring, once INIT created it.
    pub(crate) fn ring(&self) -> Option<&Arc<Ring>> {
        self.ring.get()
    }
}

impl Transport for RingLink {
    fn negotiated(&self, neg: &Negotiated) -> u16 {
        if neg.ring_queues == 0 {
            return 0;
        }
        let max_payload = (neg.max_write as usize).max(8192);
        let opts = abi::DecodeOptions {
            minor: neg.minor,
            flags: neg.flags,
            write_data_elsewhere: false,
        };
        // A second INIT keeps the ring of the first (its entries live on).
        self.ring.get_or_init(|| {
            Arc::new(Ring::new(
                self.core.clone(),
                neg.ring_queues,
                max_payload,
                opts,
                neg.max_background,
            ))
        });
        neg.ring_queues
    }

    fn send_req(&self, req: InFlight) -> Result<(), InFlight> {
        match self.ring.get() {
            Some(ring) => ring.queue_req(req.0, false).map_err(InFlight),
            None => Err(req),
        }
    }

    fn send_background(
        &self,
        reqs: &mut dyn Iterator<Item = InFlight>,
        refused: &mut Vec<InFlight>,
    ) {
        match self.ring.get() {
            Some(ring) => ring.queue_reqs(reqs.map(|f| f.0), true, refused),
            None => refused.extend(reqs),
        }
    }

    fn background_done(&self, qid: u16, n: u32) {
        if let Some(ring) = self.ring.get() {
            ring.bg_done(qid, n);
        }
    }

    fn set_max_background(&self, max: u32) {
        if let Some(ring) = self.ring.get() {
            ring.set_max_background(max);
        }
    }

    fn flush_background(&self) {
        if let Some(ring) = self.ring.get() {
            ring.flush_all();
        }
    }

    // Forgets and interrupts travel over the device, which the engine
    // always hands them to: none reach the ring.
    fn send_forget(&self, _forget: ForgetOne) {}

    fn send_interrupt(&self, _req: &InFlight) -> bool {
        false
    }

    fn drop_interrupt(&self, _req: &InFlight) {}

    fn remove_pending(&self, req: &InFlight) -> bool {
        self.ring.get().is_some_and(|r| r.remove_pending(&req.0))
    }

    fn abort(&self, _err: Errno) -> Vec<InFlight> {
        self.ring
            .get()
            .map(|r| r.abort().into_iter().map(InFlight).collect())
            .unwrap_or_default()
    }

    fn head_expired(&self, now: Duration, timeout: Duration) -> bool {
        self.ring
            .get()
            .is_some_and(|r| r.head_expired(now, timeout))
    }

    fn counts(&self) -> (usize, usize) {
        self.ring.get().map_or((0, 0), |r| r.counts())
    }
}
