//! Engine benchmarks: synchronous round trip through the in-process device,
//! background throughput at the limit, the same with timeouts on and off,
//! and admission under contention. See docs/BENCHMARKS.md.

#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fuse_core::abi::Opcode;
use fuse_core::{Args, Chan, ChanConfig, Device, Negotiated};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn neg(max_background: u32, timeout: Duration) -> Negotiated {
    Negotiated {
        request_timeout: timeout,
        ..Negotiated::with_max_background(max_background)
    }
}

/// Server threads that answer every request with an empty reply.
fn serve(dev: &Device, threads: usize) -> Vec<std::thread::JoinHandle<()>> {
    (0..threads)
        .map(|_| {
            let dev = dev.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; dev.min_read_buffer()];
                let mut out = [0u8; 16];
                while let Ok(n) = dev.read(&mut buf) {
                    let unique = u64::from_le_bytes(buf[8..16].try_into().unwrap());
                    let opcode = u32::from_le_bytes(buf[4..8].try_into().unwrap());
                    if n == 0
                        || opcode == Opcode::Interrupt as u32
                        || opcode == Opcode::BatchForget as u32
                    {
                        continue;
                    }
                    out[..4].copy_from_slice(&16u32.to_le_bytes());
                    out[8..16].copy_from_slice(&unique.to_le_bytes());
                    let _ = dev.write(&out);
                }
            })
        })
        .collect()
}

fn setup(
    max_background: u32,
    timeout: Duration,
    servers: usize,
) -> (Chan, Vec<std::thread::JoinHandle<()>>) {
    let cfg = ChanConfig {
        scan_period: Duration::from_millis(100),
        ..Default::default()
    };
    let chan = Chan::new(cfg);
    chan.set_initialized(neg(max_background, timeout));
    let dev = chan.device().unwrap();
    let hs = serve(&dev, servers);
    (chan, hs)
}

fn teardown(chan: Chan, hs: Vec<std::thread::JoinHandle<()>>) {
    chan.abort();
    for h in hs {
        h.join().unwrap();
    }
}

fn sync_round_trip(c: &mut Criterion) {
    let mut g = c.benchmark_group("sync_round_trip");
    g.throughput(Throughput::Elements(1));
    for servers in [1, 2] {
        let (chan, hs) = setup(12, Duration::ZERO, servers);
        let args = Args::new(Opcode::Getattr, 1);
        g.bench_function(BenchmarkId::new("server_threads", servers), |b| {
            b.iter(|| chan.send(args.clone()).unwrap())
        });
        teardown(chan, hs);
    }
    g.finish();
}

/// Sends `n` background requests from one thread and waits for all ends.
fn background_batch(chan: &Chan, n: usize) {
    let (tx, rx) = mpsc::channel();
    for _ in 0..n {
        let tx = tx.clone();
        chan.send_background(
            Args::new(Opcode::Read, 1),
            fuse_core::EndFn::once(move |r| {
                r.unwrap();
                tx.send(()).unwrap();
            }),
        )
        .unwrap();
    }
    for _ in 0..n {
        rx.recv().unwrap();
    }
}

fn background_at_limit(c: &mut Criterion) {
    const N: usize = 1000;
    let mut g = c.benchmark_group("background_at_limit");
    g.throughput(Throughput::Elements(N as u64));
    // Timeouts off and on side by side: the scan runs every 100 ms here
    // (the kernel's 15 s would never fire inside a sample).
    for (name, timeout) in [
        ("timeouts_off", Duration::ZERO),
        ("timeouts_on", Duration::from_secs(60)),
    ] {
        let (chan, hs) = setup(12, timeout, 1);
        g.bench_function(name, |b| b.iter(|| background_batch(&chan, N)));
        teardown(chan, hs);
    }
    g.finish();
}

fn admission_contention(c: &mut Criterion) {
    const PER_THREAD: usize = 200;
    let mut g = c.benchmark_group("admission_contention");
    for threads in [1usize, 4, 16, 64] {
        g.throughput(Throughput::Elements((threads * PER_THREAD) as u64));
        let (chan, hs) = setup(12, Duration::ZERO, 1);
        g.bench_function(BenchmarkId::new("requesters", threads), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let done = Arc::new(AtomicUsize::new(0));
                    let start = Instant::now();
                    let ts: Vec<_> = (0..threads)
                        .map(|_| {
                            let (chan, done) = (chan.clone(), done.clone());
                            std::thread::spawn(move || {
                                let (tx, rx) = mpsc::channel();
                                for _ in 0..PER_THREAD {
                                    let tx = tx.clone();
                                    chan.send_background(
                                        Args::new(Opcode::Read, 1),
                                        fuse_core::EndFn::once(move |_| {
                                            tx.send(()).unwrap();
                                        }),
                                    )
                                    .unwrap();
                                }
                                for _ in 0..PER_THREAD {
                                    rx.recv().unwrap();
                                }
                                done.fetch_add(1, Ordering::SeqCst);
                            })
                        })
                        .collect();
                    for t in ts {
                        t.join().unwrap();
                    }
                    total += start.elapsed();
                }
                total
            })
        });
        teardown(chan, hs);
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = sync_round_trip, background_at_limit, admission_contention
}
criterion_main!(benches);
