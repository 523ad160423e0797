#![allow(missing_docs)]
//! Ways to serve a batch of 16 cached 4 KiB READs (what a vring thread
//! has after a guest's kick at depth 16), per READ:
//! - `preadv2_nowait`: one preadv2(RWF_NOWAIT) each (what the device does);
//! - `uring_batch`: 16 READs on an io_uring with the file registered, one
//!   io_uring_enter for the batch (submit and wait), 16 completions reaped;
//! - `mmap_copy`: a copy out of a shared mapping of the file (no system
//!   call; a daemon would also need a SIGBUS fence for a host truncation
//!   and a page-cache residency check, which are not counted here);
//! - `mincore_copy`, `cachestat_copy`: the same copy after a residency
//!   check of the READ's pages and the page after (mincore on the
//!   mapping, cachestat on the fd): a system call per READ again;
//! - `cachestat_whole_file`, `statx`: what the passthrough's mapped reads
//!   pay per check of a whole file instead (per batch here, not per READ).
//!
//! The file lives in FUSEBOX_BENCH_DIR (default /var/tmp: this machine's
//! disk, ext4) and is read once before measuring, so every READ hits the
//! page cache. Results: docs/BENCHMARKS.md, "Warm reads: three ways" and
//! "Mapped reads".

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use io_uring::{opcode, types, IoUring};
use std::fs::OpenOptions;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::time::Duration;

const FILE: u64 = 64 << 20;
const LEN: usize = 4096;
const BATCH: usize = 16;

/// Offsets of the next batch: a fixed pseudo-random walk over the file.
struct Walk(u64);

impl Walk {
    fn next(&mut self) -> u64 {
        let slots = FILE / LEN as u64;
        self.0 = (self.0 * 6364136223846793005 + 1442695040888963407) % slots;
        self.0 * LEN as u64
    }
}

fn bench(c: &mut Criterion) {
    let dir = std::env::var_os("FUSEBOX_BENCH_DIR").unwrap_or_else(|| "/var/tmp".into());
    let path = std::path::Path::new(&dir).join(format!("warm-read-bench-{}", std::process::id()));
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::io::Write::write_all(&mut f, &vec![7u8; FILE as usize]).unwrap();
    f.sync_all().unwrap();
    let mut all = Vec::new();
    OpenOptions::new()
        .read(true)
        .open(&path)
        .unwrap()
        .read_to_end(&mut all)
        .unwrap();
    drop(all);
    let fd = f.as_raw_fd();
    let mut bufs = vec![vec![0u8; LEN]; BATCH];
    let mut g = c.benchmark_group("warm_4k_batch16");
    g.throughput(Throughput::Elements(BATCH as u64));

    let mut walk = Walk(1);
    g.bench_function("preadv2_nowait", |b| {
        b.iter(|| {
            for buf in bufs.iter_mut() {
                let iov = libc::iovec {
                    iov_base: buf.as_mut_ptr().cast(),
                    iov_len: LEN,
                };
                // SAFETY: one iovec over a live buffer of LEN bytes.
                let n = unsafe { libc::preadv2(fd, &iov, 1, walk.next() as i64, libc::RWF_NOWAIT) };
                assert_eq!(n, LEN as isize);
            }
        })
    });

    let mut ring = IoUring::new(64).unwrap();
    ring.submitter().register_files(&[fd]).unwrap();
    let mut walk = Walk(1);
    g.bench_function("uring_batch", |b| {
        b.iter(|| {
            for (i, buf) in bufs.iter_mut().enumerate() {
                let sqe = opcode::Read::new(types::Fixed(0), buf.as_mut_ptr(), LEN as u32)
                    .offset(walk.next())
                    .build()
                    .user_data(i as u64);
                // SAFETY: the buffer outlives the op: its completion is
                // reaped below before the next iteration touches it.
                unsafe { ring.submission().push(&sqe).unwrap() };
            }
            ring.submit_and_wait(BATCH).unwrap();
            let mut n = 0;
            for cqe in ring.completion() {
                assert_eq!(cqe.result(), LEN as i32);
                n += 1;
            }
            assert_eq!(n, BATCH);
        })
    });

    // SAFETY: a shared read-only mapping of the whole file, unmapped
    // below; nothing truncates the file meanwhile.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            FILE as usize,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    let mut walk = Walk(1);
    g.bench_function("mmap_copy", |b| {
        b.iter(|| {
            for buf in bufs.iter_mut() {
                let off = walk.next() as usize;
                // SAFETY: `off + LEN` is inside the mapping, which stays
                // mapped (and the file its length) while this runs.
                let src = unsafe { std::slice::from_raw_parts(map.cast::<u8>().add(off), LEN) };
                buf.copy_from_slice(src);
            }
            std::hint::black_box(&bufs);
        })
    });
    // The residency checks a mapped copy would need per READ: the pages
    // the READ covers and the one after (cached => the file goes on past
    // the READ), by mincore on the mapping or by cachestat on the fd.
    let mut vec = [0u8; 2];
    let mut walk = Walk(1);
    g.bench_function("mincore_copy", |b| {
        b.iter(|| {
            for buf in bufs.iter_mut() {
                let off = walk.next() as usize;
                let pages = if off + 2 * LEN <= FILE as usize { 2 } else { 1 };
                // SAFETY: `off` is page-aligned inside the mapping; `vec`
                // has room for `pages` bytes.
                let r = unsafe {
                    libc::mincore(
                        map.cast::<u8>().add(off).cast(),
                        pages * LEN,
                        vec.as_mut_ptr(),
                    )
                };
                assert_eq!(r, 0);
                assert!(vec[..pages].iter().all(|v| v & 1 == 1));
                // SAFETY: as in mmap_copy.
                let src = unsafe { std::slice::from_raw_parts(map.cast::<u8>().add(off), LEN) };
                buf.copy_from_slice(src);
            }
            std::hint::black_box(&bufs);
        })
    });
    let mut walk = Walk(1);
    g.bench_function("cachestat_copy", |b| {
        b.iter(|| {
            for buf in bufs.iter_mut() {
                let off = walk.next() as usize;
                let st = host_io::mapped::cachestat(fd, off as u64, 2 * LEN as u64).unwrap();
                assert!(st.cache >= 1);
                // SAFETY: as in mmap_copy.
                let src = unsafe { std::slice::from_raw_parts(map.cast::<u8>().add(off), LEN) };
                buf.copy_from_slice(src);
            }
            std::hint::black_box(&bufs);
        })
    });
    g.bench_function("cachestat_whole_file", |b| {
        b.iter(|| {
            let st = host_io::mapped::cachestat(fd, 0, FILE).unwrap();
            assert_eq!(st.cache, FILE / LEN as u64);
        })
    });
    g.bench_function("statx", |b| {
        b.iter(|| {
            let st = host_io::sys::statx(
                fd,
                c"",
                libc::AT_EMPTY_PATH,
                libc::STATX_TYPE | libc::STATX_SIZE,
            );
            assert_eq!(st.unwrap().stx_size, FILE);
        })
    });
    g.finish();
    // SAFETY: the mapping made above, no longer used.
    unsafe { libc::munmap(map, FILE as usize) };
    drop(f);
    let _ = std::fs::remove_file(&path);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
