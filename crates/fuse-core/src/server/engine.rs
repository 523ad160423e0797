//! A connection and its server, assembled in process: the engine
//! ([`Chan`]) around a [`Filesystem`], INIT performed, device workers
//! serving its device end and ring workers serving each ring queue. This is
//! how a product (the virtio-fs device) builds its engine; the test harness
//! `embedded::Embedded` is this plus a client and a trace.

use super::{run_ring_worker, serve_device, DeviceEnd, Dispatcher, Filesystem, ServerConfig};
use crate::{Chan, ChanConfig, Device, Errno};
use std::sync::Arc;
use std::time::Duration;

/// How to assemble an [`Engine`].
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// max_background the server asks for in INIT (0: the kernel default, 12).
    pub max_background: u16,
    /// congestion_threshold the server asks for (0: 3/4 of max_background).
    pub congestion_threshold: u16,
    /// The connection's default request timeout (the kernel's
    /// `default_request_timeout`; zero: none). A request the server leaves
    /// unanswered longer aborts the connection.
    pub request_timeout: Duration,
    /// How often the timeout scan runs.
    pub scan_period: Duration,
    /// Server threads on the device end (all traffic without ring queues;
    /// FORGET, INTERRUPT and synchronous requests with them).
    pub workers: usize,
    /// Ring queues (FUSE_OVER_IO_URING, served in process): 0 for none.
    /// Requests go to the queue their `Args::qid` names.
    pub ring_queues: u16,
    /// Ring worker threads per ring queue.
    pub ring_workers: usize,
    /// With ring queues: give each a buffer pool of this many payload
    /// buffers (ADD_BUFPOOL) and register every entry without a payload
    /// buffer of its own, so entries cost a header only (0: per-entry
    /// payload buffers).
    pub ring_pool: usize,
    /// Extra INIT flags the connection offers on top of the engine's
    /// default set (for example WRITEBACK_CACHE, which the engine leaves
    /// out because it has no page cache of its own).
    pub offer_flags: u64,
    /// What the server offers in INIT.
    pub server: ServerConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_background: 0,
            congestion_threshold: 0,
            request_timeout: Duration::ZERO,
            scan_period: Duration::from_millis(100),
            workers: 2,
            ring_queues: 0,
            ring_workers: 1,
            ring_pool: 0,
            offer_flags: 0,
            server: ServerConfig::default(),
        }
    }
}

/// A connection with its server threads running; dropping it aborts the
/// connection and joins them.
pub struct Engine<F: Filesystem + 'static> {
    chan: Chan,
    disp: Arc<Dispatcher<F>>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

impl<F: Filesystem + 'static> std::fmt::Debug for Engine<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("chan", &self.chan)
            .finish_non_exhaustive()
    }
}

impl<F: Filesystem + 'static> Engine<F> {
    /// Starts server threads around `fs`, performs INIT and returns once
    /// the connection admits requests (every ring queue registered).
    pub fn start(fs: F, cfg: EngineConfig) -> Result<Self, Errno> {
        Self::start_with_end(fs, cfg, |dev| dev)
    }

    /// [`Engine::start`], with the device workers serving `end(device)`
    /// instead of the device itself (a wrapper that observes the traffic).
    pub fn start_with_end<E>(
        fs: F,
        cfg: EngineConfig,
        end: impl FnOnce(Device) -> E,
    ) -> Result<Self, Errno>
    where
        E: DeviceEnd + Clone + 'static,
    {
        let mut scfg = cfg.server.clone();
        if cfg.max_background != 0 {
            scfg.max_background = cfg.max_background;
        }
        if cfg.congestion_threshold != 0 {
            scfg.congestion_threshold = cfg.congestion_threshold;
        }
        if cfg.ring_queues > 0 {
            scfg.flags |= crate::abi::init::OVER_IO_URING;
        }
        let payload = scfg.max_write as usize + 4096;
        let disp = Arc::new(Dispatcher::new(fs, scfg));
        let dflt = ChanConfig::default();
        let chan = Chan::new(ChanConfig {
            ring_queues: cfg.ring_queues,
            init_flags: dflt.init_flags | cfg.offer_flags,
            default_request_timeout: cfg.request_timeout,
            max_request_timeout: cfg.request_timeout,
            scan_period: cfg.scan_period,
            // Always: the server may ask for a timeout in INIT.
            spawn_scanner: true,
            ..dflt
        });
        let end = end(chan.device().ok_or(Errno::ENODEV)?);
        let mut workers = serve_device(end, disp.clone(), cfg.workers);
        chan.init()?;
        let payload = if cfg.ring_pool > 0 && cfg.ring_queues > 0 {
            // The ring's payload size: what INIT settled.
            let max_payload = chan
                .negotiated()
                .map_or(payload, |n| (n.max_write as usize).max(8192));
            let ring = chan.ring_end(false);
            for qid in 0..cfg.ring_queues {
                ring.add_queue(&crate::dev_uring::cmd_area(qid, 0, 0))?;
                let len = cfg.ring_pool.saturating_mul(max_payload);
                let Ok(len32) = u32::try_from(len) else {
                    return Err(Errno::EINVAL);
                };
                ring.add_bufpool(
                    &crate::dev_uring::bufpool_area(qid, len32),
                    vec![0u8; len],
                    None,
                )?;
            }
            0
        } else {
            payload
        };
        for qid in 0..cfg.ring_queues {
            for _ in 0..cfg.ring_workers.max(1) {
                let (ring, d, c) = (chan.ring_end(false), disp.clone(), chan.clone());
                workers.push(std::thread::spawn(move || {
                    // The worker ends with the connection; any other error
                    // leaves its queue unserved, so the connection goes.
                    if run_ring_worker(&ring, qid, payload, None, &d).is_err() {
                        c.abort();
                    }
                }));
            }
        }
        // Requests wait at the gate until every ring queue has an entry:
        // return once it is open, so the first caller is admitted at once.
        let t = std::time::Instant::now();
        while !chan.stats().ready {
            if t.elapsed() > Duration::from_secs(10) || !chan.is_connected() {
                chan.abort();
                return Err(Errno::ETIMEDOUT);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(Engine {
            chan,
            disp,
            workers,
        })
    }

    /// The connection.
    pub fn chan(&self) -> &Chan {
        &self.chan
    }

    /// The dispatcher (its INIT state and the filesystem).
    pub fn dispatcher(&self) -> &Arc<Dispatcher<F>> {
        &self.disp
    }

    /// The filesystem.
    pub fn fs(&self) -> &F {
        self.disp.fs()
    }

    /// Aborts the connection (as `echo 1 > /sys/fs/fuse/connections/N/abort`).
    pub fn abort(&self) {
        self.chan.abort();
    }
}

impl<F: Filesystem + 'static> Drop for Engine<F> {
    /// Aborts the connection and joins the server threads: a filesystem
    /// operation that never returns (a deliberately hung backend) makes
    /// this wait forever; leak such an instance (`std::mem::forget`).
    /// Dropped on one of its own server threads (a request's end held the
    /// last owner), that thread is not joined: it ends once it returns to
    /// its loop and finds the connection gone.
    fn drop(&mut self) {
        self.chan.abort();
        let me = std::thread::current().id();
        for w in self.workers.drain(..) {
            if w.thread().id() != me {
                let _ = w.join();
            }
        }
    }
}
