//! "Kernel in a box": start the engine around any [`Filesystem`], in
//! process, perform INIT, and talk to it with a POSIX-like [`Client`] whose
//! calls travel as FUSE requests through the [`Chan`] with the kernel's
//! admission, interrupts, timeouts and abort. No root, no mount, no VM.
//! A test harness: the engine and its workers are a
//! [`server::Engine`](crate::server::Engine), which products use directly;
//! this adds the client and a trace of what the server saw.
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
use crate::chan::{Chan, Device, Errno};
use crate::client::Client;
use crate::server::{DeviceEnd, Dispatcher, Engine, EngineConfig, Filesystem, ServerConfig};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use zerocopy::FromBytes;

/// Knobs of an embedded connection: an [`EngineConfig`]'s, and the trace.
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
    /// The engine's defaults, no trace.
    fn default() -> Self {
        let e = EngineConfig::default();
        Options {
            max_background: e.max_background,
            congestion_threshold: e.congestion_threshold,
            request_timeout: e.request_timeout,
            scan_period: e.scan_period,
            workers: e.workers,
            ring_queues: e.ring_queues,
            ring_workers: e.ring_workers,
            ring_pool: e.ring_pool,
            offer_flags: e.offer_flags,
            trace: false,
            server: e.server,
        }
    }
}

impl Options {
    /// The engine's part.
    fn engine(&self) -> EngineConfig {
        EngineConfig {
            max_background: self.max_background,
            congestion_threshold: self.congestion_threshold,
            request_timeout: self.request_timeout,
            scan_period: self.scan_period,
            workers: self.workers,
            ring_queues: self.ring_queues,
            ring_workers: self.ring_workers,
            ring_pool: self.ring_pool,
            offer_flags: self.offer_flags,
            server: self.server.clone(),
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
    log: Option<Log>,
    // Last: dropping it aborts the connection and joins the server threads
    // (a filesystem operation that never returns, a deliberately hung
    // backend, makes that wait forever; leak such an instance with
    // `std::mem::forget`).
    engine: Engine<F>,
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
        let log = opts.trace.then(Log::default);
        let engine = Engine::start_with_end(fs, opts.engine(), |dev| TracedEnd {
            dev,
            log: log.clone(),
        })?;
        Ok(Embedded {
            client: Client::new(engine.chan().clone()),
            log,
            engine,
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
        self.engine.dispatcher()
    }

    /// The filesystem.
    pub fn fs(&self) -> &F {
        self.engine.fs()
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
