#![allow(missing_docs)]
//! The vhost-user device's per-request engine bookkeeping, without the
//! virtqueue and without host I/O: what a request queue's thread does for
//! each request it pops when it serves in line (virtio-fs
//! `device/submit.rs` and `device/inline.rs::QueueServer`):
//!
//! - build the request's `Args` in place in the batch's vector (its body
//!   read into its inline `ArgBody`) and its ticket: one `Arc` per request that is
//!   both the request's end handler (`EndFn::Shared`, holding a `Weak` of
//!   the device) and, for a READ, its guest memory (`ClientMem`);
//! - `Chan::try_send_background` (admission, the ring queue, dispatch to
//!   one of the thread's reserved entries, preferred while it submits);
//! - `RingEnd::fetch_own`, `serve_slot` (a filesystem that answers at
//!   once), `RingEnd::commit`, whose `request_end` runs the end callback.
//!
//! The engine is started as `FsDevice::new` starts it (`Embedded` with the
//! device's default options: one ring queue, a pool of 6 payload buffers,
//! its ring workers idle). Batches of 16 (submit 16, then serve and commit
//! 16) and of 1; per-request times with `Throughput::Elements`.
//!
//! Two forms of the same work: one engine call per request
//! (`try_send_background`, `fetch_own`, `commit`: the rows `getattr`,
//! `read_4k`, …) and the batch forms (`try_send_background_batch`,
//! `fetch_own_batch`, `commit_batch`: the rows `…_batched`), where the
//! engine takes its locks once per batch rather than per request.
//!
//! GETATTR (no payload, a 104-byte reply through a pool buffer), and a
//! 4 KiB READ into "guest memory" by reference (`Args::client`, as the
//! device does with zero_copy on) copied from a static buffer by the
//! filesystem; also the copied form of that READ (zero_copy off: a pool
//! buffer and a reply copy).
//!
//! The row `copy_4k` is that READ's 4 KiB copy alone, into the same
//! pages: what the READ rows pay besides the engine's work.
//!
//! It runs on the allocator the `fusebox` binary runs on, mimalloc (its
//! default options; the binary commits arenas on demand): with glibc's
//! malloc a batch of 16 tickets overflows the per-thread cache and most
//! frees take the slow path, a cost the device does not pay.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fuse_core::abi::{init, Attr, GetattrIn, Opcode, ReadIn};
use fuse_core::dev_uring::{cmd_area, EntHandle, EntryBufs, Fetched, RingEnd};
use fuse_core::embedded::{Embedded, Options};
use fuse_core::server::{
    serve_slot, Completions, Ctx, Dispatcher, Filesystem, FsResult, ReadSink, ServerConfig, Start,
};
use fuse_core::{ArgBody, Args, Chan, Errno, ReqResult};
use fuse_core::{ClientMem, EndFn, HostSpan, RequestEnd};
use std::alloc::Layout;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use zerocopy::IntoBytes;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PAGE: usize = 4096;
/// Most requests in flight on the queue thread (its reserved entries).
const MAX_BATCH: usize = 16;
/// What the filesystem "reads".
static DATA: [u8; PAGE] = [0x5a; PAGE];

/// Answers GETATTR and READ at once.
struct NullFs;

impl Filesystem for NullFs {
    type Inode = u64;
    type Handle = u64;
    type Io = ();

    fn new_io(&self, _: fuse_core::server::Wake) {}
    fn getattr(&self, _: &Ctx, ino: u64, _: Option<u64>) -> FsResult<(Attr, Duration)> {
        Ok((
            Attr {
                ino,
                mode: 0o100644,
                size: 1 << 30,
                ..Default::default()
            },
            Duration::from_secs(1),
        ))
    }
    fn read(&self, _: &Ctx, _: u64, _: u64, _: u64, sink: &mut dyn ReadSink) -> FsResult<usize> {
        // Into the client's memory when the request carries it (where a
        // passthrough would preadv), else into the offered buffer.
        if let Some((mem, n)) = sink.client() {
            let n = n.min(PAGE);
            mem.write_at(0, &DATA[..n])?;
            return Ok(n);
        }
        let b = sink.buffer();
        let n = b.len().min(PAGE);
        b[..n].copy_from_slice(&DATA[..n]);
        Ok(n)
    }
}

/// "Guest RAM": one raw allocation, never a Rust object, alive for the
/// whole run (leaked), a page per request in flight.
struct GuestRam {
    base: usize,
}

impl GuestRam {
    fn new() -> GuestRam {
        let layout = Layout::from_size_align(MAX_BATCH * PAGE, PAGE).unwrap();
        // SAFETY: non-zero size; the block is leaked, so it stays mapped.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!p.is_null());
        GuestRam { base: p as usize }
    }
    fn page(&self, i: usize) -> HostSpan {
        HostSpan {
            addr: self.base + (i % MAX_BATCH) * PAGE,
            len: PAGE,
        }
    }
}

/// The device's per-request ticket (`device/ticket.rs`), reduced to what
/// its end path touches: its own end handler and, for a READ, the guest
/// memory the reply's data goes to (the device's `GuestSpans`, one span).
#[derive(Debug)]
struct Ticket {
    unique: u64,
    engine_unique: AtomicU64,
    /// 0 in flight, 1 answered (the device's `TicketState` / `claim`).
    state: AtomicU8,
    /// None unless the request lends guest memory (the device keeps its
    /// spans inline too).
    span: Option<HostSpan>,
    dev: Weak<Device>,
}

// SAFETY: the span lies in `GuestRam`'s leaked allocation, which is never
// freed, never reused and never turned into a Rust reference (the copies
// below use raw pointers).
unsafe impl ClientMem for Ticket {
    fn spans(&self) -> &[HostSpan] {
        self.span.as_slice()
    }
    fn begin_io(&self) -> bool {
        self.span.is_some()
    }
    fn end_io(&self) {}
    fn read_at(&self, off: usize, buf: &mut [u8]) -> Result<(), Errno> {
        let s = self.span.ok_or(Errno::EIO)?;
        if off.checked_add(buf.len()).is_none_or(|e| e > s.len) {
            return Err(Errno::EIO);
        }
        // SAFETY: in bounds of the span (checked above), see the impl.
        unsafe {
            std::ptr::copy_nonoverlapping((s.addr + off) as *const u8, buf.as_mut_ptr(), buf.len())
        };
        Ok(())
    }
    fn write_at(&self, off: usize, buf: &[u8]) -> Result<(), Errno> {
        let s = self.span.ok_or(Errno::EIO)?;
        if off.checked_add(buf.len()).is_none_or(|e| e > s.len) {
            return Err(Errno::EIO);
        }
        // SAFETY: in bounds of the span (checked above), see the impl.
        unsafe {
            std::ptr::copy_nonoverlapping(buf.as_ptr(), (s.addr + off) as *mut u8, buf.len())
        };
        Ok(())
    }
}

/// The ticket ends its own request (no closure boxed per request).
impl RequestEnd for Ticket {
    fn end(self: Arc<Self>, r: ReqResult) {
        if let Some(dev) = self.dev.upgrade() {
            dev.finish(&self, r);
        }
    }
}

/// The device's `Inner`, reduced to a completion count.
#[derive(Default)]
struct Device {
    answered: AtomicU64,
    errors: AtomicU64,
}

impl Device {
    /// `FsDevice::finish`, minus writing the reply to the guest.
    fn finish(&self, t: &Ticket, r: ReqResult) {
        if t.state
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        match r {
            Ok(reply) => {
                std::hint::black_box((t.unique, reply.data.len()));
            }
            Err(_) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.answered.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Getattr,
    /// READ into guest memory by reference (zero_copy on).
    Read,
    /// READ copied through a pool buffer (zero_copy off).
    ReadCopied,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Getattr => "getattr",
            Kind::Read => "read_4k",
            Kind::ReadCopied => "read_4k_copied",
        }
    }
}

/// The engine as `FsDevice::new` starts it, and a queue thread's server.
struct Bench {
    engine: Embedded<NullFs>,
    dev: Arc<Device>,
    ram: GuestRam,
    /// `QueueServer`'s state.
    ring: RingEnd,
    qid: u16,
    ents: Vec<EntHandle>,
    done: Completions,
    scratch: Vec<u8>,
    next_unique: u64,
    /// The batch forms' vectors, reused from batch to batch (as a queue
    /// thread would keep them).
    to_send: Vec<(Args, EndFn)>,
    tickets: Vec<Arc<Ticket>>,
    sent: Vec<Result<u64, Errno>>,
    fetched: Vec<Fetched>,
}

impl Bench {
    fn new() -> Bench {
        let workers_per_queue = 4;
        let engine = Embedded::start(
            NullFs,
            Options {
                max_background: 256,
                congestion_threshold: 192,
                ring_queues: 1,
                ring_workers: workers_per_queue,
                ring_pool: workers_per_queue + 2,
                offer_flags: init::WRITEBACK_CACHE | init::POSIX_ACL,
                workers: 2,
                server: ServerConfig {
                    max_write: 1 << 20,
                    ..ServerConfig::default()
                },
                ..Options::default()
            },
        )
        .expect("engine");
        // QueueServer::new / add_entry / make_room: pool-mode entries,
        // reserved, as many as requests in flight.
        let ring = engine.chan().ring_end(false);
        let qid = 0;
        let ents = (0..MAX_BATCH)
            .map(|_| {
                let h = ring
                    .register(&cmd_area(qid, 0, 0), EntryBufs::pooled(), None)
                    .unwrap();
                ring.reserve(h).unwrap();
                h
            })
            .collect();
        Bench {
            engine,
            dev: Arc::new(Device::default()),
            ram: GuestRam::new(),
            ring,
            qid,
            ents,
            done: Completions::default(),
            scratch: vec![0u8; 64 * 1024],
            next_unique: 2,
            to_send: Vec::with_capacity(MAX_BATCH),
            tickets: Vec::with_capacity(MAX_BATCH),
            sent: Vec::with_capacity(MAX_BATCH),
            fetched: Vec::with_capacity(MAX_BATCH),
        }
    }

    fn chan(&self) -> &Chan {
        self.engine.chan()
    }

    /// `FsDevice::prepare`: the request's ticket, and its arguments built
    /// in place at the end of `sends` (what the guest left for the reply
    /// as `out`; READ data by reference to the ticket's guest memory).
    fn prepare(&mut self, kind: Kind, i: usize, sends: &mut Vec<(Args, EndFn)>) -> Arc<Ticket> {
        let (opcode, nodeid, body, out) = match kind {
            Kind::Getattr => (
                Opcode::Getattr,
                1,
                ArgBody::from_slice(GetattrIn::default().as_bytes()),
                104,
            ),
            Kind::Read | Kind::ReadCopied => {
                let arg = ReadIn {
                    fh: 9,
                    offset: (i * PAGE) as u64,
                    size: PAGE as u32,
                    ..Default::default()
                };
                (Opcode::Read, 2, ArgBody::from_slice(arg.as_bytes()), PAGE)
            }
        };
        let lends = matches!(kind, Kind::Read);
        let ticket = Arc::new(Ticket {
            unique: self.next_unique,
            engine_unique: AtomicU64::new(0),
            state: AtomicU8::new(0),
            span: lends.then(|| self.ram.page(i)),
            dev: Arc::downgrade(&self.dev),
        });
        self.next_unique += 2;
        sends.push((Args::new(opcode, nodeid), EndFn::Shared(ticket.clone())));
        let (args, _) = sends.last_mut().expect("just pushed");
        (args.uid, args.gid, args.pid) = (0, 0, 1);
        args.body = body;
        (args.out_size, args.out_var) = (out, true);
        args.qid = self.qid;
        if lends {
            args.client = Some(ticket.clone() as Arc<dyn ClientMem>);
        }
        ticket
    }

    /// One kick of `n` requests: submitted while this thread's entries are
    /// preferred, then served and committed here.
    fn batch(&mut self, kind: Kind, n: usize) {
        let before = self.dev.answered.load(Ordering::Relaxed);
        // drain_requests: s.prefer()
        self.ring
            .prefer(self.qid, self.ents.first().copied())
            .unwrap();
        let mut sends = std::mem::take(&mut self.to_send);
        for i in 0..n {
            // submit_requests, per popped chain.
            let ticket = self.prepare(kind, i, &mut sends);
            let (args, end) = sends.pop().expect("prepared");
            match self.chan().try_send_background(args, end) {
                Ok(unique) => ticket.engine_unique.store(unique, Ordering::Relaxed),
                Err(e) => panic!("refused: {e:?}"),
            }
        }
        self.to_send = sends;
        // QueueServer::serve
        let mut served = 0;
        while let Ok(Some(mut f)) = self.ring.fetch_own(self.qid) {
            served += 1;
            let disp: &Dispatcher<NullFs> = self.engine.dispatcher();
            let mut io = ();
            let start = Start::new(&mut io, &mut self.done);
            serve_slot(disp, &mut f, &mut self.scratch, None, Some(start));
            // QueueServer::commit
            let area = f.commit_cmd();
            let _ = self.ring.commit(&area, f, None);
        }
        // drain_requests: s.unprefer(), nothing left on its entries
        assert!(!self.ring.unprefer(self.qid).unwrap());
        assert_eq!(served, n, "a request went elsewhere");
        assert_eq!(self.dev.answered.load(Ordering::Relaxed) - before, n as u64);
    }

    /// The same kick with the batch forms: the `n` requests admitted with
    /// one `try_send_background_batch`, fetched with one `fetch_own_batch`,
    /// served, and committed with one `commit_batch`.
    fn batch_batched(&mut self, kind: Kind, n: usize) {
        let before = self.dev.answered.load(Ordering::Relaxed);
        self.ring
            .prefer(self.qid, self.ents.first().copied())
            .unwrap();
        let mut to_send = std::mem::take(&mut self.to_send);
        for i in 0..n {
            let ticket = self.prepare(kind, i, &mut to_send);
            self.tickets.push(ticket);
        }
        let taken = self
            .engine
            .chan()
            .try_send_background_batch(&mut to_send, &mut self.sent);
        assert!(taken == n && to_send.is_empty(), "refused");
        self.to_send = to_send;
        for (t, r) in self.tickets.drain(..).zip(self.sent.drain(..)) {
            match r {
                Ok(unique) => t.engine_unique.store(unique, Ordering::Relaxed),
                Err(e) => panic!("closed: {e:?}"),
            }
        }
        let mut served = 0;
        loop {
            let got = self
                .ring
                .fetch_own_batch(self.qid, MAX_BATCH, &mut self.fetched)
                .unwrap_or(0);
            if got == 0 {
                break;
            }
            served += got;
            let disp: &Dispatcher<NullFs> = self.engine.dispatcher();
            for f in &mut self.fetched {
                let mut io = ();
                let start = Start::new(&mut io, &mut self.done);
                serve_slot(disp, f, &mut self.scratch, None, Some(start));
            }
            let committed = self.ring.commit_batch(&mut self.fetched, None);
            assert_eq!(committed, got);
        }
        assert!(!self.ring.unprefer(self.qid).unwrap());
        assert_eq!(served, n, "a request went elsewhere");
        assert_eq!(self.dev.answered.load(Ordering::Relaxed) - before, n as u64);
    }
}

fn device_path(c: &mut Criterion) {
    let mut b = Bench::new();
    let mut g = c.benchmark_group("device_path");
    for kind in [Kind::Getattr, Kind::Read, Kind::ReadCopied] {
        for n in [1, MAX_BATCH] {
            g.throughput(Throughput::Elements(n as u64));
            g.bench_function(BenchmarkId::new(kind.name(), n), |bn| {
                bn.iter(|| b.batch(kind, n))
            });
            let batched = format!("{}_batched", kind.name());
            g.bench_function(BenchmarkId::new(batched, n), |bn| {
                bn.iter(|| b.batch_batched(kind, n))
            });
        }
    }
    // The by-reference READ rows' filesystem copy alone: 4 KiB from `DATA`
    // into each of the 16 pages of guest RAM in turn, as `NullFs::read`
    // does through the ticket's `write_at`. A READ row less this is its
    // engine work. (`src` goes through `black_box`: with `DATA`'s bytes
    // known, the compiler would make the copy a memset.)
    g.throughput(Throughput::Elements(MAX_BATCH as u64));
    g.bench_function(BenchmarkId::new("copy_4k", MAX_BATCH), |bn| {
        bn.iter(|| {
            for i in 0..MAX_BATCH {
                let src = std::hint::black_box(DATA.as_ptr());
                let dst = std::hint::black_box(b.ram.page(i).addr) as *mut u8;
                // SAFETY: `dst` is page `i` of `GuestRam`'s leaked
                // allocation, `PAGE` bytes, never a Rust object and used
                // by no request now (each batch returns once all its
                // requests are answered); `src` is the static `DATA`, one
                // page, apart from it.
                unsafe { std::ptr::copy_nonoverlapping(src, dst, PAGE) };
            }
        })
    });
    g.finish();
    assert_eq!(b.dev.errors.load(Ordering::Relaxed), 0);
    let s = b.ring.stats().unwrap();
    eprintln!(
        "ring: enobufs {} queued {} in_userspace {}",
        s.enobufs, s.queued, s.in_userspace
    );
    b.ring.check_invariants().unwrap();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = device_path
}
criterion_main!(benches);
