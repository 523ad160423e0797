//! Where a connection is assembled: the engine ([`Chan`]) over the
//! in-process device queue, with the FUSE-over-io_uring ring offered beside
//! it. This is the one place that names the engine's transports by type;
//! the engine knows them only as [`Transport`]s (the kernel's `fiq->ops`),
//! and each transport's server end (`Chan::device`, `Chan::ring_end`) finds
//! its own among the connection's parts.

use crate::chan::dev::DevQueue;
use crate::chan::{Chan, ChanConfig, Clock, MonotonicClock, Transport, Transports};
use crate::dev_uring::RingLink;
use crate::sync::Arc;

impl Chan {
    /// A connection served through the in-process [`crate::Device`].
    pub fn new(cfg: ChanConfig) -> Chan {
        Chan::with_clock(cfg, Arc::new(MonotonicClock::new()))
    }

    /// Like [`Chan::new`] with a chosen clock (tests use
    /// [`crate::ManualClock`]).
    pub fn with_clock(cfg: ChanConfig, clock: Arc<dyn Clock>) -> Chan {
        let dev = Arc::new(DevQueue::new());
        assemble(cfg, clock, dev.clone(), Some(dev))
    }

    /// A connection over another transport (it has no [`Chan::device`]).
    pub fn with_transport(
        cfg: ChanConfig,
        clock: Arc<dyn Clock>,
        transport: Arc<dyn Transport>,
    ) -> Chan {
        assemble(cfg, clock, transport, None)
    }
}

/// The engine over `device`, with a ring offered (it is created only if
/// INIT accepts FUSE_OVER_IO_URING); `dev` is `device` when it is the
/// in-process device queue, for [`Chan::device`] to find.
fn assemble(
    cfg: ChanConfig,
    clock: Arc<dyn Clock>,
    device: Arc<dyn Transport>,
    dev: Option<Arc<DevQueue>>,
) -> Chan {
    Chan::build(cfg, clock, |core| {
        let ring = Arc::new(RingLink::new(core.clone()));
        // The ring first: its end looks for it on every command.
        let mut parts: Vec<Arc<dyn std::any::Any + Send + Sync>> = vec![ring.clone()];
        if let Some(dev) = dev {
            parts.push(dev);
        }
        Transports {
            device,
            ring: Some(ring),
            parts,
        }
    })
}
