//! The passthrough's 4 KiB random read through the in-process engine, at
//! queue depth 1 and 16, against pread on the same file at the same depth
//! (the floor: what the host does with no FUSE in between).
//!
//! Depth d = d client threads with one read in flight each, served by d
//! ring entries (one worker thread each) on one ring queue, or by d device
//! workers. The file lives in FUSEBOX_BENCH_DIR (default /var/tmp, ext4
//! here), 64 MiB, read from the page cache.
//!
//! `cargo bench -p passthrough --bench passthrough`

#![allow(missing_docs)] // criterion_group! generates an undocumented fn

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fuse_core::abi::ROOT_ID;
use fuse_core::client::Client;
use fuse_core::server::{
    run_device_worker, run_ring_worker, serve_device, Dispatcher, ServerConfig,
};
use fuse_core::{Chan, ChanConfig};
use passthrough::{Config, PassthroughFs};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

const FILE: u64 = 64 << 20;
const BLOCK: u64 = 4096;

struct Served {
    client: Client,
    node: u64,
    fh: u64,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.client.chan().abort();
        self.threads.drain(..).for_each(|t| t.join().unwrap());
    }
}

fn serve(dir: &std::path::Path, ring: bool, depth: usize) -> Served {
    let fs = PassthroughFs::new(dir, Config::default()).unwrap();
    let mut scfg = ServerConfig::default();
    if ring {
        scfg.flags |= fuse_core::abi::init::OVER_IO_URING;
    }
    let disp = Arc::new(Dispatcher::new(fs, scfg));
    let chan = Chan::new(ChanConfig {
        spawn_scanner: false,
        ring_queues: u16::from(ring),
        max_background: 64,
        ..Default::default()
    });
    let mut threads = if ring {
        let (dev, d) = (chan.device().unwrap(), disp.clone());
        vec![std::thread::spawn(move || run_device_worker(&dev, &d))]
    } else {
        serve_device(chan.device().unwrap(), disp.clone(), depth)
    };
    chan.init().unwrap();
    if ring {
        for _ in 0..depth {
            let (end, d) = (chan.ring_end(false), disp.clone());
            threads.push(std::thread::spawn(move || {
                run_ring_worker(&end, 0, 1 << 20, None, &d).unwrap()
            }));
        }
    }
    let client = Client::new(chan);
    let node = client.lookup(ROOT_ID, b"bench-file").unwrap().nodeid;
    let fh = client.open(node, libc::O_RDONLY as u32).unwrap().fh;
    Served {
        client,
        node,
        fh,
        threads,
    }
}

fn offsets(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % (FILE / BLOCK)) * BLOCK
    }
}

/// Runs `iters` reads spread over `depth` threads; returns the wall time.
fn at_depth(depth: usize, iters: u64, read: Arc<dyn Fn(u64) + Send + Sync>) -> Duration {
    let start = Instant::now();
    let per = iters.div_ceil(depth as u64);
    let ts: Vec<_> = (0..depth)
        .map(|t| {
            let read = read.clone();
            std::thread::spawn(move || {
                let mut next = offsets(0x9e37_79b9 * (t as u64 + 1));
                for _ in 0..per {
                    read(next());
                }
            })
        })
        .collect();
    ts.into_iter().for_each(|t| t.join().unwrap());
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    let dir = std::env::var_os("FUSEBOX_BENCH_DIR").unwrap_or_else(|| "/var/tmp".into());
    let dir = std::path::Path::new(&dir).join(format!("fusebox-pt-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bench-file");
    let f = std::fs::File::create(&path).unwrap();
    f.write_all_at(&vec![0x5au8; FILE as usize], 0).unwrap();
    let file = Arc::new(std::fs::File::open(&path).unwrap());

    let mut g = c.benchmark_group("passthrough_randread_4k");
    g.throughput(Throughput::Elements(1));
    for depth in [1usize, 16] {
        let f = file.clone();
        g.bench_function(BenchmarkId::new("pread", depth), |b| {
            let f = f.clone();
            b.iter_custom(|iters| {
                let f = f.clone();
                at_depth(
                    depth,
                    iters,
                    Arc::new(move |off| {
                        let mut buf = [0u8; BLOCK as usize];
                        f.read_exact_at(&mut buf, off).unwrap();
                    }),
                )
            })
        });
        for (name, ring) in [("device", false), ("ring", true)] {
            let s = Arc::new(serve(&dir, ring, depth));
            g.bench_function(BenchmarkId::new(name, depth), |b| {
                b.iter_custom(|iters| {
                    let s = s.clone();
                    at_depth(
                        depth,
                        iters,
                        Arc::new(move |off| {
                            let d = s.client.read(s.node, s.fh, off, BLOCK as u32).unwrap();
                            assert_eq!(d.len(), BLOCK as usize);
                        }),
                    )
                })
            });
            drop(Arc::try_unwrap(s).ok());
        }
    }
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    targets = bench
}
criterion_main!(benches);
