//! Configuration, negotiated values and the counters snapshot.

use super::bg;
use crate::abi::{self, init};
use std::time::Duration;

/// Engine configuration (the mount options and module parameters of a
/// kernel connection).
#[derive(Debug, Clone)]
pub struct ChanConfig {
    /// Initial `max_background` (the server's INIT reply may change it).
    pub max_background: u32,
    /// Initial `congestion_threshold`.
    pub congestion_threshold: u32,
    /// Timeout used when the server does not ask for one (0 = off).
    pub default_request_timeout: Duration,
    /// Upper bound on any timeout (0 = no bound).
    pub max_request_timeout: Duration,
    /// Period of the timeout scan (the kernel uses 15 s).
    pub scan_period: Duration,
    /// Run the scan on a background thread (tests may drive it by hand).
    pub spawn_scanner: bool,
    /// Number of ring queues offered with FUSE_OVER_IO_URING (0 = none).
    pub ring_queues: u16,
    /// INIT flags offered to the server.
    pub init_flags: u64,
    /// max_readahead offered in INIT.
    pub max_readahead: u32,
}

impl Default for ChanConfig {
    fn default() -> Self {
        ChanConfig {
            max_background: bg::DEFAULT_MAX_BACKGROUND,
            congestion_threshold: bg::DEFAULT_CONGESTION_THRESHOLD,
            default_request_timeout: Duration::ZERO,
            max_request_timeout: Duration::ZERO,
            scan_period: Duration::from_secs(15),
            spawn_scanner: true,
            ring_queues: 0,
            init_flags: init::ASYNC_READ
                | init::POSIX_LOCKS
                | init::ATOMIC_O_TRUNC
                | init::EXPORT_SUPPORT
                | init::BIG_WRITES
                | init::DONT_MASK
                | init::FLOCK_LOCKS
                | init::DO_READDIRPLUS
                | init::READDIRPLUS_AUTO
                | init::ASYNC_DIO
                | init::PARALLEL_DIROPS
                | init::HANDLE_KILLPRIV_V2
                | init::ABORT_ERROR
                | init::MAX_PAGES
                | init::SETXATTR_EXT
                | init::INIT_EXT
                | init::HAS_RESEND
                | init::REQUEST_TIMEOUT,
            max_readahead: 128 * 1024,
        }
    }
}

/// What INIT negotiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// Minor protocol version in use.
    pub minor: u32,
    /// INIT flags both sides agreed on.
    pub flags: u64,
    /// Largest WRITE payload.
    pub max_write: u32,
    /// max_background in force.
    pub max_background: u32,
    /// congestion_threshold in force.
    pub congestion_threshold: u32,
    /// Effective request timeout (zero = off).
    pub request_timeout: Duration,
    /// Ring queues to wait for (0 = no ring).
    pub ring_queues: u16,
}

impl Negotiated {
    /// What a current server with default options negotiates, with the
    /// given max_background (congestion threshold at 3/4 of it, as the
    /// kernel's defaults are).
    pub fn with_max_background(max_background: u32) -> Self {
        Negotiated {
            minor: abi::KERNEL_MINOR_VERSION,
            flags: 0,
            max_write: 128 * 1024,
            max_background,
            congestion_threshold: max_background * 3 / 4,
            request_timeout: Duration::ZERO,
            ring_queues: 0,
        }
    }
}

/// A snapshot of the connection's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Requesters waiting for admission plus requests in flight.
    pub waiting: usize,
    /// Admitted background requests (num_background).
    pub background: u32,
    /// Background requests handed to the transport (active_background).
    pub active: u32,
    /// Background requests queued behind max_background.
    pub bg_queued: usize,
    /// Requests not yet read by the server.
    pub pending: usize,
    /// Requests read by the server and not yet answered.
    pub processing: usize,
    /// Requesters parked in admission.
    pub parked: usize,
    /// Timeout scans that found an expired request.
    pub timeouts_fired: u64,
    /// Aborts performed.
    pub aborts: u64,
    /// Limit in force.
    pub max_background: u32,
    /// Threshold in force.
    pub congestion_threshold: u32,
    /// Background admission is closed.
    pub blocked: bool,
    /// num_background is at or above the congestion threshold.
    pub congested: bool,
    /// The server answered an interrupt with ENOSYS.
    pub no_interrupt: bool,
    /// The connection is up.
    pub connected: bool,
    /// INIT has been processed.
    pub initialized: bool,
    /// Admission is open: INIT is done and, with a ring, every queue has
    /// an entry.
    pub ready: bool,
}
