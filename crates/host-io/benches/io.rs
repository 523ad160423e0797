#![allow(missing_docs)]
//! io_uring READ/WRITE with fixed buffers vs without vs pread/pwrite, at
//! 4 KiB and 1 MiB, one op at a time, on a tmpfs file (/dev/shm).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use host_io::{Driver, Target};
use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::time::Duration;

const FILE: u64 = 64 << 20;

fn bench(c: &mut Criterion) {
    // FUSEBOX_BENCH_DIR picks the filesystem (default: tmpfs at /dev/shm).
    let dir = std::env::var_os("FUSEBOX_BENCH_DIR").unwrap_or_else(|| "/dev/shm".into());
    let path = std::path::Path::new(&dir).join(format!("host-io-bench-{}", std::process::id()));
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    f.set_len(FILE).unwrap();
    f.write_all_at(&vec![1u8; FILE as usize], 0).unwrap();
    let fd = f.as_raw_fd();
    let mut d = Driver::new(64).unwrap();
    d.register_regions(&[1 << 20]).unwrap();
    for (dir, write) in [("read", false), ("write", true)] {
        let mut g = c.benchmark_group(format!("{dir}_depth1"));
        for size in [4096usize, 1 << 20] {
            g.throughput(Throughput::Bytes(size as u64));
            let slots = FILE / size as u64;
            let mut i = 0u64;
            let mut next = move || {
                i = (i * 7 + 13) % slots;
                i * size as u64
            };
            let mut buf = vec![0u8; size];
            g.bench_function(BenchmarkId::new("pread_pwrite", size), |b| {
                b.iter(|| {
                    let off = next();
                    if write {
                        f.write_at(&buf, off).unwrap()
                    } else {
                        f.read_at(&mut buf, off).unwrap()
                    }
                })
            });
            let mut owned = Some(vec![0u8; size]);
            g.bench_function(BenchmarkId::new("uring", size), |b| {
                b.iter(|| {
                    let off = next();
                    let v = owned.take().unwrap();
                    let id = if write {
                        d.write(Target::Fd(fd), v, off, 0, None).unwrap()
                    } else {
                        d.read(Target::Fd(fd), v, off, 0, None).unwrap()
                    };
                    let c = d.wait(id).unwrap();
                    assert_eq!(c.result.unwrap(), size);
                    owned = c.buf;
                })
            });
            g.bench_function(BenchmarkId::new("uring_fixed", size), |b| {
                b.iter(|| {
                    let off = next();
                    let id = if write {
                        d.write_fixed(Target::Fd(fd), 0, 0, size, off, 0).unwrap()
                    } else {
                        d.read_fixed(Target::Fd(fd), 0, 0, size, off, 0).unwrap()
                    };
                    assert_eq!(d.wait(id).unwrap().result.unwrap(), size);
                })
            });
        }
        g.finish();
    }
    drop(d);
    let _ = std::fs::remove_file(&path);
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(500));
    targets = bench
}
criterion_main!(benches);
