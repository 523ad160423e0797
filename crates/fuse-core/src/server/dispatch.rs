//! Decodes one request, calls the [`Filesystem`], encodes the reply payload
//! into a buffer the transport provides. No transport types appear here.

use super::{
    Ctx, Deferred, DirPlusSink, DirSink, Entry, Filesystem, IoDone, LockReq, Opened, Start, Xattr,
};
use crate::abi::{
    self, init, AttrOut, CopyFileRangeOut, DecodeOptions, EntryOut, ForgetOne, GetxattrOut,
    InHeader, InitIn, InitOut, LkIn, LkOut, LseekOut, OpenOut, Operation, Request, StatfsOut,
    StatxOut, WriteOut,
};
use crate::chan::{ClientMem, Errno, Fence};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use zerocopy::{Immutable, IntoBytes};

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

fn put<T: IntoBytes + Immutable>(out: &mut [u8], v: &T) -> Result<usize, Errno> {
    let b = v.as_bytes();
    out.get_mut(..b.len())
        .ok_or(Errno::ERANGE)?
        .copy_from_slice(b);
    Ok(b.len())
}

fn entry_out<I: Into<u64>>(e: Entry<I>) -> EntryOut {
    EntryOut {
        nodeid: e.inode.into(),
        generation: e.generation,
        entry_valid: e.entry_valid.as_secs(),
        attr_valid: e.attr_valid.as_secs(),
        entry_valid_nsec: e.entry_valid.subsec_nanos(),
        attr_valid_nsec: e.attr_valid.subsec_nanos(),
        attr: e.attr,
    }
}

fn attr_out(attr: abi::Attr, valid: Duration) -> AttrOut {
    AttrOut {
        attr_valid: valid.as_secs(),
        attr_valid_nsec: valid.subsec_nanos(),
        dummy: 0,
        attr,
    }
}

fn lock_req(arg: &LkIn) -> LockReq {
    LockReq {
        owner: arg.owner,
        lock: arg.lk,
        flock: arg.lk_flags & abi::flags::LK_FLOCK != 0,
    }
}

fn open_out<H: Into<u64>>(o: Opened<H>) -> OpenOut {
    OpenOut {
        fh: o.handle.into(),
        open_flags: o.open_flags,
        backing_id: i32::try_from(o.backing_id).unwrap_or(0),
    }
}

struct DirBuf<'a> {
    out: &'a mut [u8],
    len: usize,
}

impl DirSink for DirBuf<'_> {
    fn add(&mut self, ino: u64, offset: u64, typ: u32, name: &[u8]) -> bool {
        let size = abi::dirent_size(name.len());
        let Some(dst) = self.out.get_mut(self.len..self.len + size) else {
            return false;
        };
        let d = abi::Dirent {
            ino,
            off: offset,
            namelen: name.len() as u32,
            typ,
        };
        let h = std::mem::size_of::<abi::Dirent>();
        dst[..h].copy_from_slice(d.as_bytes());
        dst[h..h + name.len()].copy_from_slice(name);
        dst[h + name.len()..].fill(0);
        self.len += size;
        true
    }
}

struct DirPlusBuf<'a> {
    out: &'a mut [u8],
    len: usize,
}

impl DirPlusSink for DirPlusBuf<'_> {
    fn room(&self, namelen: usize) -> bool {
        self.len + abi::direntplus_size(namelen) <= self.out.len()
    }
    fn add(
        &mut self,
        entry: Option<Entry<u64>>,
        ino: u64,
        offset: u64,
        typ: u32,
        name: &[u8],
    ) -> bool {
        if !self.room(name.len()) {
            return false;
        }
        let size = abi::direntplus_size(name.len());
        let dst = &mut self.out[self.len..self.len + size];
        let entry_out = entry.map(entry_out).unwrap_or_default();
        let d = abi::DirentPlus {
            dirent: abi::Dirent {
                ino,
                off: offset,
                namelen: name.len() as u32,
                typ,
            },
            entry_out,
        };
        let h = std::mem::size_of::<abi::DirentPlus>();
        dst[..h].copy_from_slice(d.as_bytes());
        dst[h..h + name.len()].copy_from_slice(name);
        dst[h + name.len()..].fill(0);
        self.len += size;
        true
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

    /// Starts a READ into the client's memory `mem` without waiting, when
    /// the filesystem can ([`Filesystem::read_async`]): Ok once `done` will
    /// answer it (with the bytes read, which are in `mem`); Err(done) for
    /// any other request, or a READ the filesystem serves the usual way.
    pub fn start_read(
        &self,
        start: Start<'_, F::Io>,
        req: &Request<'_>,
        mem: &std::sync::Arc<dyn ClientMem>,
        done: IoDone,
    ) -> Result<(), IoDone> {
        let Operation::Read { arg } = &req.op else {
            return Err(done);
        };
        let h = &req.header;
        let ctx = ctx_of(h);
        let len = (arg.size as usize).min(mem.len());
        self.fs.read_async(
            start.io,
            start.done,
            &ctx,
            F::Inode::from(h.nodeid),
            F::Handle::from(arg.fh),
            arg.offset,
            len,
            mem.clone(),
            done,
        )
    }

    /// Offers a decoded WRITE to the filesystem to start without waiting
    /// ([`Filesystem::write_async`]), its data being all of `mem` (the
    /// request's `size` bytes; anything else is served the usual way).
    /// Err(done) (unused) when it is not a WRITE or the filesystem
    /// declines; then serve the request as usual.
    pub fn start_write(
        &self,
        start: Start<'_, F::Io>,
        req: &Request<'_>,
        mem: &std::sync::Arc<dyn ClientMem>,
        done: IoDone,
    ) -> Result<(), IoDone> {
        let Operation::Write { arg, .. } = &req.op else {
            return Err(done);
        };
        if arg.size as usize != mem.len() {
            return Err(done);
        }
        let h = &req.header;
        let ctx = ctx_of(h);
        self.fs.write_async(
            start.io,
            start.done,
            &ctx,
            F::Inode::from(h.nodeid),
            F::Handle::from(arg.fh),
            arg.offset,
            mem.clone(),
            arg.write_flags,
            done,
        )
    }

    /// Offers a decoded FSYNC, FSYNCDIR or FALLOCATE (a request that
    /// carries no data and answers none) to the filesystem to start
    /// without waiting ([`Filesystem::fsync_async`],
    /// [`Filesystem::fallocate_async`]): Ok once `done` will answer it;
    /// Err(done) (unused) for any other request, or when the filesystem
    /// declines: then serve it as usual.
    pub fn start_no_data(
        &self,
        start: Start<'_, F::Io>,
        req: &Request<'_>,
        done: IoDone,
    ) -> Result<(), IoDone> {
        let h = &req.header;
        let ctx = ctx_of(h);
        let ino = F::Inode::from(h.nodeid);
        let (arg, dir) = match &req.op {
            Operation::Fsync { arg } => (arg, false),
            Operation::Fsyncdir { arg } => (arg, true),
            Operation::Fallocate { arg } => {
                return self.fs.fallocate_async(
                    start.io,
                    start.done,
                    &ctx,
                    ino,
                    F::Handle::from(arg.fh),
                    arg.mode,
                    arg.offset,
                    arg.length,
                    done,
                )
            }
            _ => return Err(done),
        };
        let datasync = arg.fsync_flags & abi::flags::FSYNC_FDATASYNC != 0;
        self.fs.fsync_async(
            start.io,
            start.done,
            &ctx,
            ino,
            F::Handle::from(arg.fh),
            datasync,
            dir,
            done,
        )
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

    /// READ into client memory; `out` is the buffer offered to a
    /// filesystem that cannot use the client's memory itself.
    fn read_client(
        &self,
        ctx: &Ctx,
        nodeid: u64,
        arg: &abi::ReadIn,
        mem: &dyn ClientMem,
        out: &mut [u8],
    ) -> Result<usize, Errno> {
        let n = (arg.size as usize).min(mem.len());
        let mut sink = ClientSink {
            mem,
            out,
            n,
            spill: Vec::new(),
            buffered: false,
        };
        let got = self.fs.read(
            ctx,
            F::Inode::from(nodeid),
            F::Handle::from(arg.fh),
            arg.offset,
            &mut sink,
        )?;
        let got = got.min(n);
        if sink.buffered {
            let buf = if sink.spill.is_empty() {
                &sink.out[..got]
            } else {
                &sink.spill[..got]
            };
            mem.write_at(0, buf)?;
        }
        Ok(got)
    }

    /// WRITE from client memory (the decoded `data` is empty; the client's
    /// memory holds exactly `arg.size` bytes).
    fn write_client(
        &self,
        ctx: &Ctx,
        nodeid: u64,
        arg: &abi::WriteIn,
        data: &[u8],
        mem: &dyn ClientMem,
        out: &mut [u8],
    ) -> Result<usize, Errno> {
        if !data.is_empty() || arg.size as usize != mem.len() {
            return Err(Errno::EINVAL);
        }
        let src = ClientSource {
            mem,
            copy: std::cell::OnceCell::new(),
        };
        let n = self.fs.write(
            ctx,
            F::Inode::from(nodeid),
            F::Handle::from(arg.fh),
            arg.offset,
            &src,
            arg.write_flags,
        );
        // A filesystem that asked for the bytes and got none because the
        // client's memory could not be read must not report a short write.
        if let Some(Err(e)) = src.copy.get() {
            return Err(*e);
        }
        put(
            out,
            &WriteOut {
                size: n?.min(mem.len()) as u32,
                padding: 0,
            },
        )
    }

    fn setlkw(&self, ctx: &Ctx, nodeid: u64, arg: &LkIn, defer: Option<DeferFn<'_>>) -> Handled {
        let req = lock_req(arg);
        let (ino, fh) = (F::Inode::from(nodeid), F::Handle::from(arg.fh));
        if let Some(make) = defer {
            self.fs.setlkw(ctx, ino, fh, &req, make(ctx.unique));
            return Handled::Parked;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let done = Deferred::new(move |e| {
            let _ = tx.send(e);
        });
        self.fs.setlkw(ctx, ino, fh, &req, done);
        let error = rx.recv().unwrap_or(Errno::EIO.to_wire());
        Handled::Reply(Outcome {
            unique: ctx.unique,
            error,
            len: 0,
        })
    }

    fn init(&self, arg: &InitIn, out: &mut [u8]) -> Result<usize, Errno> {
        let mut reply = InitOut {
            major: abi::KERNEL_VERSION,
            minor: abi::KERNEL_MINOR_VERSION,
            ..Default::default()
        };
        if arg.major != abi::KERNEL_VERSION {
            // Tell the kernel our major; it retries or gives up.
            return put(out, &reply);
        }
        let mut offered = u64::from(arg.flags);
        if offered & init::INIT_EXT != 0 {
            offered |= u64::from(arg.flags2) << 32;
        }
        let wanted = self.fs.init(offered)? | self.cfg.flags;
        let mut flags = wanted & offered;
        if self.cfg.request_timeout != 0 {
            flags |= init::REQUEST_TIMEOUT & offered;
        }
        let minor = arg.minor.min(abi::KERNEL_MINOR_VERSION);
        self.minor.store(minor, Ordering::Relaxed);
        self.flags.store(flags, Ordering::Relaxed);
        let (f1, f2) = init::split(flags);
        reply.minor = minor;
        reply.flags = f1;
        reply.flags2 = f2;
        reply.max_readahead = arg.max_readahead;
        reply.max_write = self.cfg.max_write;
        reply.max_background = self.cfg.max_background;
        reply.congestion_threshold = self.cfg.congestion_threshold;
        reply.max_pages =
            ((self.cfg.max_write as usize).div_ceil(4096)).min(u16::MAX as usize) as u16;
        reply.time_gran = 1;
        reply.request_timeout = self.cfg.request_timeout;
        if flags & init::PASSTHROUGH != 0 {
            // Backing files may sit on a filesystem that stacks on nothing
            // (depth 0); the mount itself then counts as depth 1. A share
            // on overlayfs gets no passthrough (its backing opens fail
            // with ELOOP and the server falls back to serving the data).
            reply.max_stack_depth = 1;
        }
        let n = put(out, &reply)?;
        self.inited.store(true, Ordering::Release);
        Ok(n)
    }

    fn xattr(x: Xattr, size: u32, out: &mut [u8]) -> Result<usize, Errno> {
        match x {
            Xattr::Size(n) => put(
                out,
                &GetxattrOut {
                    size: n,
                    padding: 0,
                },
            ),
            Xattr::Data(d) if size == 0 => put(
                out,
                &GetxattrOut {
                    size: d.len() as u32,
                    padding: 0,
                },
            ),
            Xattr::Data(d) if d.len() > size as usize => Err(Errno::ERANGE),
            Xattr::Data(d) => {
                out.get_mut(..d.len())
                    .ok_or(Errno::ERANGE)?
                    .copy_from_slice(&d);
                Ok(d.len())
            }
        }
    }

    fn call(
        &self,
        ctx: &Ctx,
        nodeid: u64,
        op: &Operation<'_>,
        out: &mut [u8],
    ) -> Result<usize, Errno> {
        use Operation as O;
        let fs = &self.fs;
        let ino = F::Inode::from(nodeid);
        let fh = |fh: u64| F::Handle::from(fh);
        match op {
            O::Init { arg } => self.init(arg, out),
            O::Destroy => {
                fs.destroy();
                Ok(0)
            }
            O::Lookup { name } => put(out, &entry_out(fs.lookup(ctx, ino, name)?)),
            O::Getattr { arg } => {
                let handle = (arg.getattr_flags & abi::flags::GETATTR_FH != 0).then(|| fh(arg.fh));
                let (a, v) = fs.getattr(ctx, ino, handle)?;
                put(out, &attr_out(a, v))
            }
            O::Setattr { arg } => {
                let (a, v) = fs.setattr(ctx, ino, arg)?;
                put(out, &attr_out(a, v))
            }
            O::Readlink => {
                let t = fs.readlink(ctx, ino)?;
                out.get_mut(..t.len())
                    .ok_or(Errno::ENAMETOOLONG)?
                    .copy_from_slice(&t);
                Ok(t.len())
            }
            O::Symlink { name, target } => {
                put(out, &entry_out(fs.symlink(ctx, ino, name, target)?))
            }
            O::Mknod { arg, name } => put(
                out,
                &entry_out(fs.mknod(ctx, ino, name, arg.mode, arg.rdev, arg.umask)?),
            ),
            O::Mkdir { arg, name } => put(
                out,
                &entry_out(fs.mkdir(ctx, ino, name, arg.mode, arg.umask)?),
            ),
            O::Unlink { name } => fs.unlink(ctx, ino, name).map(|()| 0),
            O::Rmdir { name } => fs.rmdir(ctx, ino, name).map(|()| 0),
            O::Rename { arg, old, new } => fs
                .rename(ctx, ino, old, arg.newdir.into(), new, 0)
                .map(|()| 0),
            O::Rename2 { arg, old, new } => fs
                .rename(ctx, ino, old, arg.newdir.into(), new, arg.flags)
                .map(|()| 0),
            O::Link { arg, name } => put(
                out,
                &entry_out(fs.link(ctx, arg.oldnodeid.into(), ino, name)?),
            ),
            O::Open { arg } => put(out, &open_out(fs.open(ctx, ino, arg.flags)?)),
            O::Opendir { arg } => put(out, &open_out(fs.opendir(ctx, ino, arg.flags)?)),
            O::Read { arg } => {
                let n = (arg.size as usize).min(out.len());
                let mut sink = &mut out[..n];
                let got = fs.read(ctx, ino, fh(arg.fh), arg.offset, &mut sink)?;
                Ok(got.min(n))
            }
            O::Write { arg, data } => {
                let n = fs.write(ctx, ino, fh(arg.fh), arg.offset, data, arg.write_flags)?;
                put(
                    out,
                    &WriteOut {
                        size: n.min(data.len()) as u32,
                        padding: 0,
                    },
                )
            }
            O::Flush { arg } => fs.flush(ctx, ino, fh(arg.fh), arg.lock_owner).map(|()| 0),
            O::Release { arg } => fs.release(ctx, ino, fh(arg.fh), arg.flags).map(|()| 0),
            O::Releasedir { arg } => fs.releasedir(ctx, ino, fh(arg.fh)).map(|()| 0),
            O::Fsync { arg } => {
                let data = arg.fsync_flags & abi::flags::FSYNC_FDATASYNC != 0;
                fs.fsync(ctx, ino, fh(arg.fh), data).map(|()| 0)
            }
            O::Fsyncdir { arg } => {
                let data = arg.fsync_flags & abi::flags::FSYNC_FDATASYNC != 0;
                fs.fsyncdir(ctx, ino, fh(arg.fh), data).map(|()| 0)
            }
            O::Readdir { arg } => {
                let n = (arg.size as usize).min(out.len());
                let mut sink = DirBuf {
                    out: &mut out[..n],
                    len: 0,
                };
                fs.readdir(ctx, ino, fh(arg.fh), arg.offset, &mut sink)?;
                Ok(sink.len)
            }
            O::Statfs => put(
                out,
                &StatfsOut {
                    st: fs.statfs(ctx, ino)?,
                },
            ),
            O::Setxattr { arg, name, value } => fs
                .setxattr(ctx, ino, name, value, arg.flags, arg.setxattr_flags)
                .map(|()| 0),
            O::Getxattr { arg, name } => {
                Self::xattr(fs.getxattr(ctx, ino, name, arg.size)?, arg.size, out)
            }
            O::Listxattr { arg } => Self::xattr(fs.listxattr(ctx, ino, arg.size)?, arg.size, out),
            O::Removexattr { name } => fs.removexattr(ctx, ino, name).map(|()| 0),
            O::Access { arg } => fs.access(ctx, ino, arg.mask).map(|()| 0),
            O::Create { arg, name } => {
                let (e, o) = fs.create(ctx, ino, name, arg.mode, arg.flags, arg.umask)?;
                let n = put(out, &entry_out(e))?;
                Ok(n + put(&mut out[n..], &open_out(o))?)
            }
            O::Fallocate { arg } => fs
                .fallocate(ctx, ino, fh(arg.fh), arg.mode, arg.offset, arg.length)
                .map(|()| 0),
            O::Lseek { arg } => {
                let off = fs.lseek(ctx, ino, fh(arg.fh), arg.offset, arg.whence)?;
                put(out, &LseekOut { offset: off })
            }
            O::Syncfs { .. } => fs.syncfs(ctx, ino).map(|()| 0),
            O::Readdirplus { arg } => {
                let n = (arg.size as usize).min(out.len());
                let mut sink = DirPlusBuf {
                    out: &mut out[..n],
                    len: 0,
                };
                fs.readdirplus(ctx, ino, fh(arg.fh), arg.offset, &mut sink)?;
                Ok(sink.len)
            }
            O::Getlk { arg } => {
                let lk = fs.getlk(ctx, ino, fh(arg.fh), &lock_req(arg))?;
                put(out, &LkOut { lk })
            }
            O::Setlk { arg } => fs.setlk(ctx, ino, fh(arg.fh), &lock_req(arg)).map(|()| 0),
            O::Tmpfile { arg, .. } => {
                let (e, o) = fs.tmpfile(ctx, ino, arg.mode, arg.flags, arg.umask)?;
                let n = put(out, &entry_out(e))?;
                Ok(n + put(&mut out[n..], &open_out(o))?)
            }
            O::CopyFileRange { arg } | O::CopyFileRange64 { arg } => {
                let narrow = matches!(op, O::CopyFileRange { .. });
                // The 32-bit reply cannot report more: copy no more.
                let len = if narrow {
                    arg.len.min(u64::from(u32::MAX))
                } else {
                    arg.len
                };
                let n = fs.copy_file_range(
                    ctx,
                    ino,
                    fh(arg.fh_in),
                    arg.off_in,
                    arg.nodeid_out.into(),
                    fh(arg.fh_out),
                    arg.off_out,
                    len,
                    arg.flags,
                )?;
                if narrow {
                    put(
                        out,
                        &WriteOut {
                            size: n.min(u64::from(u32::MAX)) as u32,
                            padding: 0,
                        },
                    )
                } else {
                    put(out, &CopyFileRangeOut { bytes_copied: n })
                }
            }
            O::Statx { arg } => {
                let handle = (arg.getattr_flags & abi::flags::GETATTR_FH != 0).then(|| fh(arg.fh));
                let (stat, v) = fs.statx(ctx, ino, handle, arg.sx_flags, arg.sx_mask)?;
                put(
                    out,
                    &StatxOut {
                        attr_valid: v.as_secs(),
                        attr_valid_nsec: v.subsec_nanos(),
                        stat,
                        ..Default::default()
                    },
                )
            }
            _ => Err(Errno::ENOSYS),
        }
    }
}

/// READ sink over the client's memory, with a plain buffer for
/// filesystems that want one (then copied to the client).
struct ClientSink<'a> {
    mem: &'a dyn ClientMem,
    out: &'a mut [u8],
    n: usize,
    /// Used when `out` is smaller than the READ.
    spill: Vec<u8>,
    buffered: bool,
}

impl super::ReadSink for ClientSink<'_> {
    fn buffer(&mut self) -> &mut [u8] {
        self.buffered = true;
        if self.out.len() >= self.n {
            &mut self.out[..self.n]
        } else {
            self.spill.resize(self.n, 0);
            &mut self.spill
        }
    }
    fn client(&self) -> Option<(&dyn ClientMem, usize)> {
        Some((self.mem, self.n))
    }
}

/// WRITE source over the client's memory, copied out only if the
/// filesystem asks for the bytes.
struct ClientSource<'a> {
    mem: &'a dyn ClientMem,
    copy: std::cell::OnceCell<Result<Vec<u8>, Errno>>,
}

impl super::WriteSource for ClientSource<'_> {
    fn data(&self) -> &[u8] {
        let r = self.copy.get_or_init(|| {
            let mut v = vec![0u8; self.mem.len()];
            self.mem.read_at(0, &mut v).map(|()| v)
        });
        r.as_deref().unwrap_or(&[])
    }
    fn client(&self) -> Option<&dyn ClientMem> {
        Some(self.mem)
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
