#![allow(missing_docs)]
//! Ring benchmarks (see docs/BENCHMARKS.md):
//! - ring vs device-style round trip (GETATTR, one server thread each);
//! - 1 MiB READ and WRITE, copy vs zero-copy;
//! - buffer pool vs per-entry payload buffers: 256 entries, 1 MiB max
//!   payload, 32 requests in flight.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fuse_core::abi::{encode::Body, fopen, init, uring, Attr, GetattrIn, Opcode, ReadIn, WriteIn};
use fuse_core::dev_uring::{bufpool_area, cmd_area, EntryBufs, RingEnd};
use fuse_core::server::{
    answer_slot, run_ring_worker, serve_device, Ctx, Dispatcher, Filesystem, FsResult, Opened,
    ReadSink, ServerConfig, WriteSource,
};
use fuse_core::{Args, Chan, ChanConfig, Negotiated};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

const MIB: usize = 1 << 20;

/// A filesystem that does no work of its own, so only transport costs show.
struct NullFs {
    zero_copy: bool,
}

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
                ..Default::default()
            },
            Duration::from_secs(1),
        ))
    }
    fn open(&self, _: &Ctx, _: u64, _: u32) -> FsResult<Opened<u64>> {
        let open_flags = if self.zero_copy {
            fopen::IO_URING_ZERO_COPY
        } else {
            0
        };
        Ok(Opened {
            handle: 9,
            open_flags,
            backing_id: 0,
        })
    }
    fn read(&self, _: &Ctx, _: u64, _: u64, _: u64, sink: &mut dyn ReadSink) -> FsResult<usize> {
        Ok(sink.buffer().len())
    }
    fn write(
        &self,
        _: &Ctx,
        _: u64,
        _: u64,
        _: u64,
        src: &dyn WriteSource,
        _: u32,
    ) -> FsResult<usize> {
        Ok(src.data().len())
    }
}

fn cfg(queues: u16) -> ChanConfig {
    ChanConfig {
        spawn_scanner: false,
        ring_queues: queues,
        ..Default::default()
    }
}

fn neg(queues: u16, max_write: u32) -> Negotiated {
    Negotiated {
        max_write,
        flags: if queues > 0 { init::OVER_IO_URING } else { 0 },
        ring_queues: queues,
        ..Negotiated::with_max_background(64)
    }
}

fn disp(zero_copy: bool) -> Arc<Dispatcher<NullFs>> {
    Arc::new(Dispatcher::new(
        NullFs { zero_copy },
        ServerConfig::default(),
    ))
}

fn getattr() -> Args {
    Args::new(Opcode::Getattr, 1)
        .body(Body::new().push(&GetattrIn::default()).into_vec())
        .out(104, false)
}

fn round_trip(c: &mut Criterion) {
    let mut g = c.benchmark_group("round_trip_getattr");
    g.throughput(Throughput::Elements(1));
    {
        let chan = Chan::new(cfg(0));
        chan.set_initialized(neg(0, 128 * 1024));
        let ws = serve_device(chan.device().unwrap(), disp(false), 1);
        g.bench_function("device", |b| b.iter(|| chan.send(getattr()).unwrap()));
        chan.abort();
        ws.into_iter().for_each(|w| w.join().unwrap());
    }
    {
        let chan = Chan::new(cfg(1));
        chan.set_initialized(neg(1, 128 * 1024));
        let (end, d) = (chan.ring_end(false), disp(false));
        let w = std::thread::spawn(move || run_ring_worker(&end, 0, 128 * 1024, None, &d));
        g.bench_function("ring", |b| b.iter(|| chan.send(getattr()).unwrap()));
        chan.abort();
        w.join().unwrap().unwrap();
    }
    g.finish();
}

fn open_file(chan: &Chan) -> u64 {
    let r = chan
        .send(Args::new(Opcode::Open, 2).body(vec![0; 8]).out(16, false))
        .unwrap();
    u64::from_le_bytes(r.data[..8].try_into().unwrap())
}

fn mib_io(c: &mut Criterion) {
    let mut g = c.benchmark_group("io_1mib");
    g.throughput(Throughput::Bytes(MIB as u64));
    for zero_copy in [false, true] {
        let name = if zero_copy { "zero_copy" } else { "copy" };
        let chan = Chan::new(cfg(1));
        chan.set_initialized(neg(1, MIB as u32));
        let end = chan.ring_end(true);
        let flags = if zero_copy { uring::QUEUE_ZERO_COPY } else { 0 };
        end.add_queue(&cmd_area(0, flags, 0)).unwrap();
        let d = disp(zero_copy);
        let e2 = end.clone();
        let w = std::thread::spawn(move || run_ring_worker(&e2, 0, MIB, None, &d));
        let fh = open_file(&chan);
        // The client's buffers are reused across calls, as user pages are.
        let mut out = vec![0u8; MIB];
        g.bench_function(BenchmarkId::new("read", name), |b| {
            b.iter(|| {
                let arg = ReadIn {
                    fh,
                    size: MIB as u32,
                    ..Default::default()
                };
                let args = Args::new(Opcode::Read, 2)
                    .body(Body::new().push(&arg).into_vec())
                    .out(MIB, true)
                    .out_buf(std::mem::take(&mut out));
                let r = chan.send(args).unwrap();
                assert_eq!(r.data.len(), MIB);
                out = r.data;
            })
        });
        let mut pages = vec![7u8; MIB];
        g.bench_function(BenchmarkId::new("write", name), |b| {
            b.iter(|| {
                let arg = WriteIn {
                    fh,
                    size: MIB as u32,
                    ..Default::default()
                };
                let args = Args::new(Opcode::Write, 2)
                    .body(Body::new().push(&arg).into_vec())
                    .data(std::mem::take(&mut pages))
                    .out(8, false);
                let r = chan.send(args).unwrap();
                pages = r.pages;
            })
        });
        assert_eq!(end.stats().unwrap().zero_copy > 0, zero_copy);
        chan.abort();
        w.join().unwrap().unwrap();
    }
    g.finish();
}

/// 256 entries on one queue served by one polling thread; 32 background
/// 64 KiB READs kept in flight. Per-entry mode registers 256 × 1 MiB of
/// payload; pool mode a pool of 32 × 1 MiB.
fn pool_vs_per_entry(c: &mut Criterion) {
    const ENTRIES: usize = 256;
    const DEPTH: usize = 32;
    const BATCH: usize = 2000;
    let mut g = c.benchmark_group("pool_vs_per_entry");
    g.throughput(Throughput::Elements(BATCH as u64));
    for pooled in [false, true] {
        let chan = Chan::new(cfg(1));
        chan.set_initialized(neg(1, MIB as u32));
        let end = chan.ring_end(false);
        end.add_queue(&cmd_area(0, 0, 0)).unwrap();
        let payload_bytes = if pooled {
            end.add_bufpool(
                &bufpool_area(0, (DEPTH * MIB) as u32),
                vec![0; DEPTH * MIB],
                None,
            )
            .unwrap();
            DEPTH * MIB
        } else {
            ENTRIES * MIB
        };
        let hs: Vec<_> = (0..ENTRIES)
            .map(|_| {
                let bufs = if pooled {
                    EntryBufs::pooled()
                } else {
                    EntryBufs::with_payload(MIB)
                };
                end.register(&cmd_area(0, 0, 0), bufs, None).unwrap()
            })
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let server = {
            let (end, d, stop) = (end.clone(), disp(false), stop.clone());
            std::thread::spawn(move || poll_server(&end, &hs, &d, &stop))
        };
        let name = if pooled {
            "pool_32MiB"
        } else {
            "per_entry_256MiB"
        };
        eprintln!("{name}: {} MiB of payload buffers", payload_bytes / MIB);
        g.bench_function(name, |b| b.iter(|| read_batch(&chan, BATCH, DEPTH)));
        stop.store(true, Ordering::SeqCst);
        chan.abort();
        server.join().unwrap();
    }
    g.finish();
}

fn poll_server(
    end: &RingEnd,
    hs: &[fuse_core::dev_uring::EntHandle],
    d: &Dispatcher<NullFs>,
    stop: &AtomicBool,
) {
    let mut scratch = vec![0u8; 64 * 1024];
    while !stop.load(Ordering::SeqCst) {
        let mut idle = true;
        for h in hs {
            match end.fetch(*h, false) {
                Ok(Some(mut f)) => {
                    idle = false;
                    answer_slot(d, &mut f, &mut scratch);
                    let area = f.commit_cmd();
                    if end.commit(&area, f, None).is_err() {
                        return;
                    }
                }
                Ok(None) => {}
                Err(_) => return,
            }
        }
        if idle {
            std::thread::yield_now();
        }
    }
}

fn read_batch(chan: &Chan, n: usize, depth: usize) {
    let (tx, rx) = mpsc::channel();
    let send = |tx: mpsc::Sender<()>| {
        let arg = ReadIn {
            fh: 9,
            size: 64 * 1024,
            ..Default::default()
        };
        let args = Args::new(Opcode::Read, 2)
            .body(Body::new().push(&arg).into_vec())
            .out(64 * 1024, true);
        chan.send_background(
            args,
            fuse_core::EndFn::once(move |r| {
                r.unwrap();
                let _ = tx.send(());
            }),
        )
        .unwrap();
    };
    for _ in 0..depth {
        send(tx.clone());
    }
    for i in 0..n {
        rx.recv().unwrap();
        if i + depth < n {
            send(tx.clone());
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = round_trip, mib_io, pool_vs_per_entry
}
criterion_main!(benches);
