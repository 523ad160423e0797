//! Decodes one request, calls the [`Filesystem`], encodes the reply payload
//! into a buffer the transport provides. No transport types appear here.
//!
//! This module holds the dispatcher and its entry points (the public
//! `handle*` calls and the FORGET/INTERRUPT/SETLKW routing); `ops` calls
//! the filesystem for each other opcode, `reply` encodes reply payloads,
//! `client_mem` serves READ and WRITE over the client's memory, and `start`
//! offers requests to the filesystem to start without waiting.

mod client_mem;
mod ops;
mod reply;
mod start;

use super::{Ctx, Deferred, Filesystem};
use crate::abi::{self, init, DecodeOptions, ForgetOne, InHeader, Operation, Request};
use crate::chan::{ClientMem, Errno, Fence};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// What the server offers in its INIT reply.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Largest WRITE the server accepts.
    pub max_write: u32,
    /// max_background to ask for (0 = kernel default).
    pub max_background: u16,
    /// congestion_threshold to ask for (0 = kernel default).
    pub congestion_threshold: u16,
    /// Request timeout to ask for, in seconds (0 = none).
    pub request_timeout: u16,
    /// Flags the dispatcher supports on top of what the filesystem wants.
    pub flags: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_write: 1 << 20,
            max_background: 0,
            congestion_threshold: 0,
            request_timeout: 0,
            flags: init::ASYNC_READ
                | init::BIG_WRITES
                | init::MAX_PAGES
                | init::INIT_EXT
                | init::PARALLEL_DIROPS
                | init::ABORT_ERROR,
        }
    }
}

/// How a request was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Unique of the request.
    pub unique: u64,
    /// 0 or a negative errno for `fuse_out_header.error`.
    pub error: i32,
    /// Bytes of reply payload written to the output buffer.
    pub len: usize,
}

/// What became of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// Answer it now.
    Reply(Outcome),
    /// It gets no reply (FORGET, BATCH_FORGET, INTERRUPT, undecodable).
    NoReply,
    /// Parked: the [`Deferred`] the transport made will answer it.
    Parked,
}

/// Makes the [`Deferred`] that answers a parked request (given its unique);
/// transports that cannot answer later pass `None` and the dispatcher waits
/// for the answer on the calling thread.
pub type DeferFn<'a> = &'a dyn Fn(u64) -> Deferred;

/// The FUSE dispatcher.
pub struct Dispatcher<F: Filesystem> {
    fs: F,
    cfg: ServerConfig,
    minor: AtomicU32,
    flags: AtomicU64,
    inited: std::sync::atomic::AtomicBool,
}

impl<F: Filesystem> std::fmt::Debug for Dispatcher<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl<F: Filesystem> Dispatcher<F> {
    /// A dispatcher for `fs`.
    pub fn new(fs: F, cfg: ServerConfig) -> Self {
        Dispatcher {
            fs,
            cfg,
            minor: AtomicU32::new(abi::KERNEL_MINOR_VERSION),
            flags: AtomicU64::new(init::SETXATTR_EXT),
            inited: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The filesystem.
    pub fn fs(&self) -> &F {
        &self.fs
    }

    /// Whether INIT has been answered (successfully).
    pub fn init_done(&self) -> bool {
        self.inited.load(Ordering::Acquire)
    }

    /// Decode options negotiated by INIT.
    pub fn decode_options(&self) -> DecodeOptions {
        DecodeOptions {
            minor: self.minor.load(Ordering::Relaxed),
            flags: self.flags.load(Ordering::Relaxed),
            write_data_elsewhere: false,
        }
    }

    /// Drops the lookups `forgets` name (FORGET and BATCH_FORGET, which get
    /// no reply). A transport that carries forgets apart from requests (the
    /// virtio-fs hiprio queue) calls this on its own thread.
    pub fn forget(&self, forgets: &[ForgetOne]) {
        for f in forgets {
            self.fs.forget(f.nodeid.into(), f.nlookup);
        }
    }

    /// Handles one contiguous request message (device style). `out` is the
    /// reply payload buffer. Returns `None` for messages that get no reply.
    /// A message that cannot be decoded gets EIO if its unique can be read.
    pub fn handle_bytes(&self, msg: &[u8], out: &mut [u8]) -> Option<Outcome> {
        match self.handle_bytes_with(msg, out, None) {
            Handled::Reply(o) => Some(o),
            Handled::NoReply | Handled::Parked => None,
        }
    }

    /// [`Dispatcher::handle_bytes`] with parking (see [`Dispatcher::handle_with`]).
    pub fn handle_bytes_with(
        &self,
        msg: &[u8],
        out: &mut [u8],
        defer: Option<DeferFn<'_>>,
    ) -> Handled {
        self.handle_bytes_fenced(msg, out, defer, None)
    }

    /// [`Dispatcher::handle_bytes_with`] for a request under `fence`
    /// (`Args::fence`, handed over by the transport), which the filesystem
    /// sees in [`Ctx::fence`].
    pub fn handle_bytes_fenced(
        &self,
        msg: &[u8],
        out: &mut [u8],
        defer: Option<DeferFn<'_>>,
        fence: Option<&Arc<Fence>>,
    ) -> Handled {
        match abi::decode_request(msg, self.decode_options()) {
            Ok(req) => self.handle_client_with(&req, out, defer, None, fence),
            Err(_) => {
                let Ok(h) = abi::Cursor::new(msg).read::<InHeader>("fuse_in_header") else {
                    return Handled::NoReply;
                };
                if h.unique == 0 || h.opcode == abi::Opcode::Forget as u32 {
                    return Handled::NoReply;
                }
                Handled::Reply(Outcome {
                    unique: h.unique,
                    error: Errno::EIO.to_wire(),
                    len: 0,
                })
            }
        }
    }

    /// Handles one decoded request; a request that would wait (SETLKW) is
    /// answered on this thread.
    pub fn handle(&self, req: &Request<'_>, out: &mut [u8]) -> Option<Outcome> {
        match self.handle_with(req, out, None) {
            Handled::Reply(o) => Some(o),
            Handled::NoReply | Handled::Parked => None,
        }
    }

    /// Handles one decoded request; with `defer`, a request that would wait
    /// is parked and answered later through the [`Deferred`] it makes.
    pub fn handle_with(
        &self,
        req: &Request<'_>,
        out: &mut [u8],
        defer: Option<DeferFn<'_>>,
    ) -> Handled {
        self.handle_client_with(req, out, defer, None, None)
    }

    /// The label and supplementary groups of a creating request, into
    /// `ctx`, each only where it was negotiated: an error if one does
    /// not parse, or the label block is missing.
    fn creation_extensions<'a>(
        &self,
        req: &Request<'a>,
        ctx: &mut Ctx<'a>,
    ) -> Result<(), abi::DecodeError> {
        let flags = self.flags.load(Ordering::Relaxed);
        if flags & init::SECURITY_CTX != 0 {
            ctx.secctx = abi::creation_security_context(req, self.minor.load(Ordering::Relaxed))?;
        }
        if flags & init::CREATE_SUPP_GROUP != 0 {
            // Only a request extension (protocol 7.38 on) carries groups.
            ctx.groups = abi::supplementary_groups(req.ext)?.unwrap_or_default();
        }
        Ok(())
    }

    /// [`Dispatcher::handle_with`] for a request whose data is the client's
    /// memory `client`: a READ's destination, or a WRITE's data (decoded
    /// with [`DecodeOptions::write_data_elsewhere`]). A READ's reply
    /// payload (`Outcome::len` bytes) is then in `client`, not in `out`.
    /// With `fence`, the filesystem sees it in [`Ctx::fence`].
    pub fn handle_client_with(
        &self,
        req: &Request<'_>,
        out: &mut [u8],
        defer: Option<DeferFn<'_>>,
        client: Option<&dyn ClientMem>,
        fence: Option<&Arc<Fence>>,
    ) -> Handled {
        let h = &req.header;
        let mut ctx = ctx_of(h);
        ctx.fence = fence;
        if creates(&req.op) {
            if let Err(e) = self.creation_extensions(req, &mut ctx) {
                // A label or groups the filesystem cannot trust, or no
                // label where the kernel always sends one: nothing is
                // made.
                log::debug!("request {}: its extensions refused: {e}", h.unique);
                return Handled::Reply(Outcome {
                    unique: h.unique,
                    error: Errno::EINVAL.to_wire(),
                    len: 0,
                });
            }
        }
        let direct = match (client, &req.op) {
            (Some(mem), Operation::Read { arg }) => {
                Some(self.read_client(&ctx, h.nodeid, arg, mem, &mut *out))
            }
            (Some(mem), Operation::Write { arg, data }) => {
                Some(self.write_client(&ctx, h.nodeid, arg, data, mem, &mut *out))
            }
            _ => None,
        };
        let result = match &req.op {
            Operation::Forget { arg } => {
                self.forget(&[ForgetOne {
                    nodeid: h.nodeid,
                    nlookup: arg.nlookup,
                }]);
                return Handled::NoReply;
            }
            Operation::BatchForget { nodes, .. } => {
                self.forget(nodes);
                return Handled::NoReply;
            }
            // Interrupts are advisory: the filesystem may cancel the work;
            // the interrupted request itself carries the answer.
            Operation::Interrupt { arg } => {
                self.fs.interrupt(arg.unique);
                return Handled::NoReply;
            }
            Operation::Setlkw { arg } => return self.setlkw(&ctx, h.nodeid, arg, defer),
            _ if direct.is_some() => direct.unwrap_or(Err(Errno::EIO)),
            op => self.call(&ctx, h.nodeid, op, out),
        };
        Handled::Reply(match result {
            Ok(len) => Outcome {
                unique: h.unique,
                error: 0,
                len,
            },
            Err(e) => Outcome {
                unique: h.unique,
                error: e.to_wire(),
                len: 0,
            },
        })
    }
}

/// The caller of the request with header `h`.
fn ctx_of(h: &crate::abi::InHeader) -> Ctx<'static> {
    Ctx {
        unique: h.unique,
        uid: h.uid,
        gid: h.gid,
        pid: h.pid,
        secctx: None,
        groups: Default::default(),
        fence: None,
    }
}

/// Whether `op` makes an inode, and so may carry a security label.
fn creates(op: &Operation<'_>) -> bool {
    matches!(
        op,
        Operation::Create { .. }
            | Operation::Mknod { .. }
            | Operation::Mkdir { .. }
            | Operation::Symlink { .. }
            | Operation::Tmpfile { .. }
    )
}
