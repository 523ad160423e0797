//! "Kernel in a box": start the engine around any [`Filesystem`], in
//! process, perform INIT, and talk to it with a POSIX-like [`Client`] whose
//! calls travel as FUSE requests through the [`Chan`] with the kernel's
//! admission, interrupts, timeouts and abort. No root, no mount, no VM. A
//! test harness: products use the engine ([`server::Engine`](crate::server::Engine))
//! directly; this adds the client and a trace of what the server saw.
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
use crate::locks::lock;
use crate::server::{DeviceEnd, Dispatcher, Engine, EngineConfig, Filesystem};
use std::sync::{Arc, Mutex};
use zerocopy::FromBytes;

/// Knobs of an embedded connection: the engine's ([`EngineConfig`]); the
/// trace is asked for with [`Embedded::start_traced`].
pub type Options = EngineConfig;

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
            lock(l).push(e);
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
                let mut l = lock(l);
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
        Self::start_with(fs, opts, None)
    }

    /// As [`Embedded::start`], recording every request the server reads
    /// and every reply it writes ([`Embedded::trace`]).
    pub fn start_traced(fs: F, opts: Options) -> Result<Self, Errno> {
        Self::start_with(fs, opts, Some(Log::default()))
    }

    fn start_with(fs: F, opts: Options, log: Option<Log>) -> Result<Self, Errno> {
        let engine = Engine::start_with_end(fs, opts, |dev| TracedEnd {
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

    /// Every request read and reply written so far (empty unless started
    /// with [`Embedded::start_traced`]).
    pub fn trace(&self) -> Vec<TraceEvent> {
        self.log
            .as_ref()
            .map(|l| lock(l).clone())
            .unwrap_or_default()
    }

    /// Aborts the connection (as `echo 1 > /sys/fs/fuse/connections/N/abort`).
    pub fn abort(&self) {
        self.chan().abort();
    }
}
