//! INIT processing: version and flag negotiation, limits, the request
//! timeout, the ring gate, and the publication of `initialized`.

use super::bg::WakeBudget;
use super::{Args, Chan, Errno, Negotiated, Phase};
use crate::abi::{self, init, InitIn, InitOut, Opcode};
use crate::sync::{lock, Ordering};
use std::time::Duration;

/// Largest max_write a server may negotiate (the kernel's 256 pages).
pub const MAX_WRITE_LIMIT: u32 = 1 << 20;

impl Chan {
    /// Sends INIT (FORCE: it bypasses the gate it opens) and processes the
    /// reply. A failed or malformed INIT aborts the connection.
    pub fn init(&self) -> Result<Negotiated, Errno> {
        let cfg = &self.core().cfg;
        let mut flags = cfg.init_flags;
        if cfg.ring_queues > 0 {
            flags |= init::OVER_IO_URING;
        }
        let (f1, f2) = init::split(flags);
        let arg = InitIn {
            major: abi::KERNEL_VERSION,
            minor: abi::KERNEL_MINOR_VERSION,
            max_readahead: cfg.max_readahead,
            flags: f1,
            flags2: f2,
            unused: [0; 11],
        };
        let args = Args::new(Opcode::Init, 0)
            .body(zerocopy::IntoBytes::as_bytes(&arg).to_vec())
            .out(std::mem::size_of::<InitOut>(), true)
            .force();
        let reply = match self.send(args) {
            Ok(r) => r,
            Err(e) => {
                self.abort();
                return Err(e);
            }
        };
        let out = abi::Cursor::new(&reply.data)
            .read_compat::<InitOut>("fuse_init_out", abi::COMPAT_INIT_OUT_SIZE);
        match out {
            Ok(out) => self.process_init_reply(&out),
            Err(_) => {
                self.abort();
                Err(Errno::EPROTO)
            }
        }
    }

    /// Applies a server's INIT reply: negotiates version, flags, limits and
    /// the request timeout, creates the ring gate, then publishes
    /// `initialized`.
    pub fn process_init_reply(&self, out: &InitOut) -> Result<Negotiated, Errno> {
        let cfg = &self.core().cfg;
        if out.major != abi::KERNEL_VERSION {
            self.abort();
            return Err(Errno::EPROTO);
        }
        let mut offered = cfg.init_flags;
        if cfg.ring_queues > 0 {
            offered |= init::OVER_IO_URING;
        }
        // What the server's minor version says it filled in, as the
        // kernel reads an INIT reply: flags from 6 on, max_write from 5
        // on, the background limits from 13 on; fields newer than the
        // server's version are unused in its protocol (whatever they hold
        // is ignored).
        let mut flags = if out.minor >= 6 {
            u64::from(out.flags)
        } else {
            0
        };
        if flags & init::INIT_EXT != 0 {
            flags |= u64::from(out.flags2) << 32;
        }
        flags &= offered;
        let max_write = if out.minor >= 5 { out.max_write } else { 4096 };
        let (max_background, congestion_threshold) = if out.minor >= 13 {
            (out.max_background, out.congestion_threshold)
        } else {
            (0, 0)
        };
        let server_timeout = if flags & init::REQUEST_TIMEOUT != 0 {
            Duration::from_secs(u64::from(out.request_timeout))
        } else {
            Duration::ZERO
        };
        let mut timeout = if server_timeout.is_zero() {
            cfg.default_request_timeout
        } else {
            server_timeout
        };
        if !cfg.max_request_timeout.is_zero() {
            timeout = if timeout.is_zero() {
                cfg.max_request_timeout
            } else {
                timeout.min(cfg.max_request_timeout)
            };
        }
        // A zero limit keeps the one in force (the configured value, or
        // one set since with `set_max_background`), as the kernel's INIT
        // processing does; it does not reset it to the configured one.
        // `initialize` puts them in under the lock it sets the limits
        // under, so a change made meanwhile is not lost; the configured
        // values stand in until then (the ring is made with them and set
        // again under that lock).
        let keep = KeepLimits {
            max_background: max_background == 0,
            congestion_threshold: congestion_threshold == 0,
        };
        let neg = Negotiated {
            minor: out.minor.min(abi::KERNEL_MINOR_VERSION),
            flags,
            // Clamped: a server may not make the minimum read buffer absurd.
            max_write: max_write.clamp(4096, MAX_WRITE_LIMIT),
            max_background: if max_background != 0 {
                u32::from(max_background)
            } else {
                cfg.max_background
            },
            congestion_threshold: if congestion_threshold != 0 {
                u32::from(congestion_threshold)
            } else {
                cfg.congestion_threshold
            },
            request_timeout: timeout,
            ring_queues: if flags & init::OVER_IO_URING != 0 {
                cfg.ring_queues
            } else {
                0
            },
        };
        self.initialize(neg, keep)
    }

    /// Marks the connection initialized with `neg` (what processing an INIT
    /// reply does). Everything is set before `initialized` is published.
    /// On a connection already aborted it does nothing.
    pub fn set_initialized(&self, neg: Negotiated) {
        let _ = self.initialize(neg, KeepLimits::default());
    }

    /// [`Chan::set_initialized`], with the limits `keep` names left as
    /// they are in force (read under `bg_lock`, where they are set) and
    /// returned in what was negotiated. ENOTCONN once the connection is
    /// aborted: no ring made, nothing recorded as negotiated, the limits
    /// and gates left as the abort set them (an abort that raced the INIT
    /// reply already ended every request and let every waiter go). One
    /// that lands between the first check and the `conn` lock may still
    /// find the transport told of the version and max_write, and the
    /// timeout recorded: nothing reads them on a dead connection.
    fn initialize(&self, mut neg: Negotiated, keep: KeepLimits) -> Result<Negotiated, Errno> {
        let core = self.core();
        if lock(&core.conn).phase != Phase::Connected {
            return Err(Errno::ENOTCONN);
        }
        core.transport.negotiated(&neg);
        core.abort_error
            .store(neg.flags & init::ABORT_ERROR != 0, Ordering::Relaxed);
        core.timeout_ns.store(
            u64::try_from(neg.request_timeout.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        {
            // conn -> bg: ring registrations and the gate change together.
            let mut c = lock(&core.conn);
            // Checked again where an abort would be seen for sure: one
            // after this lock finds the ring made here and tears it down.
            if c.phase != Phase::Connected {
                return Err(Errno::ENOTCONN);
            }
            // The ring takes over here (it creates its queues), before
            // `initialized`. Registrations take `conn` too, so none can
            // slip between this and the gate.
            let q = core
                .ring_offer
                .as_ref()
                .map_or(0, |ring| ring.negotiated(&neg));
            if q > 0 {
                if let Some(ring) = &core.ring_offer {
                    // A second INIT keeps the ring of the first.
                    let _ = core.ring.set(ring.clone());
                }
            }
            c.ring_registered = vec![false; usize::from(q)];
            let ready = q == 0;
            // Connected (checked above under `conn`, which an abort takes
            // first): `bg` holds the limits in force, not the abort's.
            let mut bg = lock(&core.bg);
            if keep.max_background {
                neg.max_background = bg.max_background;
            }
            if keep.congestion_threshold {
                neg.congestion_threshold = bg.congestion_threshold;
            }
            c.negotiated = Some(neg);
            bg.max_background = neg.max_background;
            // The ring was made with the negotiated value, but a
            // `set_max_background` between its making and this lock would
            // have reached it and not `bg` (overwritten just now): both
            // agree once this lock is let go.
            if let Some(ring) = core.ring.get() {
                ring.set_max_background(bg.max_background);
            }
            bg.congestion_threshold = neg.congestion_threshold;
            bg.ring_ready = ready;
            bg.initialized = true;
            core.initialized.store(true, Ordering::Release);
            if ready {
                core.gate_open.store(true, Ordering::Release);
            }
            bg.grant(WakeBudget::PerFreeSlot);
        }
        #[cfg(not(loom))]
        if !neg.request_timeout.is_zero() && core.cfg.spawn_scanner {
            super::timeout::spawn_scanner(core, core.cfg.scan_period);
        }
        Ok(neg)
    }
}

/// Limits an INIT reply left at zero: those in force stay.
#[derive(Debug, Default, Clone, Copy)]
struct KeepLimits {
    max_background: bool,
    congestion_threshold: bool,
}
