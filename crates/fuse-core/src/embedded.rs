//! "Kernel in a box": start the engine around any [`Filesystem`], in
//! process, perform INIT, and talk to it with a POSIX-like [`Client`] whose
//! calls travel as FUSE requests through the [`Chan`] with the kernel's
//! admission, interrupts, timeouts and abort. No root, no mount, no VM.
//!
//! ```
//! use fuse_core::embedded::{Embedded, Options};
//! use fuse_core::testing::memfs::MemFs;
//! let fs = Embedded::start(MemFs::new(), Options::default()).unwrap();
//! let c = fs.client();
//! let d = c.mkdir(1, b"dir", 0o755, 0).unwrap();
//! assert_eq!(c.lookup(1, b"dir").unwrap().nodeid, d.nodeid);
//! ```

use crate::abi::{InHeader, Opcode};
use crate::chan::{Chan, ChanConfig, Device, Errno};
use crate::client::Client;
use crate::server::{
    run_ring_worker, serve_device, DeviceEnd, Dispatcher, Filesystem, ServerConfig,
};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use zerocopy::FromBytes;

/// Knobs of an embedded connection.
#[derive(Debug, Clone)]
pub struct Options {
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
    /// Record every request and reply (see [`Embedded::trace`]).
    pub trace: bool,
    /// What the server offers in INIT.
    pub server: ServerConfig,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_background: 0,
            congestion_threshold: 0,
            request_timeout: Duration::ZERO,
            scan_period: Duration::from_millis(100),
            workers: 2,
            ring_queues: 0,
            ring_workers: 1,
            ring_pool: 0,
            offer_flags: 0,
            trace: false,
            server: ServerConfig::default(),
        }
    }
}

/// One traced message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceEvent {
    /// The server read a request.
    Request {
        /// Its unique.
        unique: u64,
        /// Its opcode (None if unknown).
        opcode: Option<Opcode>,
        /// Its node.
        nodeid: u64,
    },
    /// The server answered (or tried to: `accepted` false when the engine
    /// refused the reply, e.g. the request was gone).
    Reply {
        /// The unique answered.
        unique: u64,
        /// 0 or a negative errno.
        error: i32,
        /// Payload bytes.
        len: usize,
        /// Whether the engine took it.
        accepted: bool,
    },
}

type Log = Arc<Mutex<Vec<TraceEvent>>>;

/// The in-process device with an optional trace.
#[derive(Clone)]
struct TracedEnd {
    dev: Device,
    log: Option<Log>,
}

impl TracedEnd {
    fn record(&self, e: TraceEvent) {
        if let Some(l) = &self.log {
            l.lock().unwrap_or_else(|e| e.into_inner()).push(e);
        }
    }
}

impl DeviceEnd for TracedEnd {
    fn read_msg(&self, buf: &mut [u8]) -> Result<usize, Errno> {
        let n = self.dev.read(buf)?;
        if let Ok((h, _)) = InHeader::read_from_prefix(&buf[..n]) {
            self.record(TraceEvent::Request {
                unique: h.unique,
                opcode: Opcode::from_u32(h.opcode),
                nodeid: h.nodeid,
            });
        }
        Ok(n)
    }
    fn write_reply(&self, unique: u64, error: i32, payload: &[u8]) -> Result<(), Errno> {
        // Recorded before the reply is delivered, so a caller that has its
        // answer finds it in the trace.
        self.record(TraceEvent::Reply {
            unique,
            error,
            len: payload.len(),
            accepted: true,
        });
        let r = DeviceEnd::write_reply(&self.dev, unique, error, payload);
        if r.is_err() {
            if let Some(l) = &self.log {
                let mut l = l.lock().unwrap_or_else(|e| e.into_inner());
                let mine = |e: &&mut TraceEvent| matches!(e, TraceEvent::Reply { unique: u, .. } if *u == unique);
                if let Some(TraceEvent::Reply { accepted, .. }) = l.iter_mut().rev().find(mine) {
                    *accepted = false;
                }
            }
        }
        r
    }
    fn min_read_buffer(&self) -> usize {
        self.dev.min_read_buffer()
    }
}

/// A filesystem served in process, and its client.
pub struct Embedded<F: Filesystem + 'static> {
    client: Client,
    disp: Arc<Dispatcher<F>>,
    log: Option<Log>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

impl<F: Filesystem + 'static> std::fmt::Debug for Embedded<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedded")
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl<F: Filesystem + 'static> Embedded<F> {
    /// Starts server threads around `fs` and performs INIT.
    pub fn start(fs: F, opts: Options) -> Result<Self, Errno> {
        let mut scfg = opts.server.clone();
        if opts.max_background != 0 {
            scfg.max_background = opts.max_background;
        }
        if opts.congestion_threshold != 0 {
            scfg.congestion_threshold = opts.congestion_threshold;
        }
        if opts.ring_queues > 0 {
            scfg.flags |= crate::abi::init::OVER_IO_URING;
        }
        let payload = scfg.max_write as usize + 4096;
        let disp = Arc::new(Dispatcher::new(fs, scfg));
        let dflt = ChanConfig::default();
        let chan = Chan::new(ChanConfig {
            ring_queues: opts.ring_queues,
            init_flags: dflt.init_flags | opts.offer_flags,
            default_request_timeout: opts.request_timeout,
            max_request_timeout: opts.request_timeout,
            scan_period: opts.scan_period,
            // Always: the server may ask for a timeout in INIT.
            spawn_scanner: true,
            ..dflt
        });
        let log = opts.trace.then(Log::default);
        let end = TracedEnd {
            dev: chan.device().ok_or(Errno::ENODEV)?,
            log: log.clone(),
        };
        let mut workers = serve_device(end, disp.clone(), opts.workers);
        chan.init()?;
        let payload = if opts.ring_pool > 0 && opts.ring_queues > 0 {
            // The ring's payload size: what INIT settled.
            let max_payload = chan
                .negotiated()
                .map_or(payload, |n| (n.max_write as usize).max(8192));
            let ring = chan.ring_end(false);
            for qid in 0..opts.ring_queues {
                ring.add_queue(&crate::dev_uring::cmd_area(qid, 0, 0))?;
                let len = opts.ring_pool.saturating_mul(max_payload);
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
        for qid in 0..opts.ring_queues {
            for _ in 0..opts.ring_workers.max(1) {
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
        Ok(Embedded {
            client: Client::new(chan),
            disp,
            log,
            workers,
        })
    }

    /// The client (root, pid 1; see [`Client::as_user`]).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The connection.
    pub fn chan(&self) -> &Chan {
        self.client.chan()
    }

    /// The dispatcher (its INIT state and the filesystem).
    pub fn dispatcher(&self) -> &Arc<Dispatcher<F>> {
        &self.disp
    }

    /// The filesystem.
    pub fn fs(&self) -> &F {
        self.disp.fs()
    }

    /// Every request read and reply written so far (empty unless
    /// [`Options::trace`]).
    pub fn trace(&self) -> Vec<TraceEvent> {
        self.log
            .as_ref()
            .map(|l| l.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .unwrap_or_default()
    }

    /// Aborts the connection (as `echo 1 > /sys/fs/fuse/connections/N/abort`).
    pub fn abort(&self) {
        self.chan().abort();
    }
}

impl<F: Filesystem + 'static> Drop for Embedded<F> {
    /// Aborts the connection and joins the server threads: a filesystem
    /// operation that never returns (a deliberately hung backend) makes
    /// this wait forever; leak such an instance (`std::mem::forget`).
    fn drop(&mut self) {
        self.chan().abort();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}
