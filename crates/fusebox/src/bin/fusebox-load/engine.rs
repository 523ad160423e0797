//! The old mode (`--engine-client`): the engine as the guest through
//! `virtio_fs::testing::frontend`, one caller thread per request in flight. Kept
//! for comparison only: on a small host its threads eat the cores and
//! send every request alone, which squeezes every ratio toward 1.0.

use crate::{fs, Args, LoadError, Report, Rng, Workload};
use fuse_core::abi::ROOT_ID;
use fuse_core::client::Client;
use fuse_core::Errno;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use virtio_fs::testing::frontend::{FrontendConfig, VhostFrontend};

/// The data file, filled once (1 MiB writes, or what the server allows).
fn data_file(c: &Client, name: &str, mib: u64, max_write: u32) -> Result<(u64, u64), LoadError> {
    let name = name.as_bytes();
    let size = mib << 20;
    let rw = libc::O_RDWR as u32;
    if let Ok(e) = c.lookup(ROOT_ID, name) {
        if e.attr.size == size {
            let o = c.open(e.nodeid, rw).map_err(fs("open"))?;
            return Ok((e.nodeid, o.fh));
        }
        c.unlink(ROOT_ID, name).map_err(fs("unlink"))?;
    }
    let (e, o) = c
        .create(ROOT_ID, name, 0o644, rw, 0)
        .map_err(fs("create"))?;
    let chunk = (1u64 << 20).min(u64::from(max_write));
    let buf = vec![0x5au8; chunk as usize];
    let mut off = 0;
    while off < size {
        c.write(e.nodeid, o.fh, off, &buf, 0).map_err(fs("write"))?;
        off += chunk;
    }
    Ok((e.nodeid, o.fh))
}

/// What every caller runs.
#[derive(Debug, Clone, Copy)]
struct Job {
    w: Workload,
    depth: usize,
    /// (node, fh) of the data file.
    file: (u64, u64),
    size: u64,
    /// Sequential I/O size.
    chunk: u32,
}

/// Caller `t`: runs until `stop`, returns per-op latencies in µs and bytes.
fn caller(c: &Client, job: Job, t: usize, stop: &AtomicBool) -> Result<(Vec<u32>, u64), LoadError> {
    let Job {
        w,
        depth,
        file,
        size,
        chunk,
    } = job;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((t as u64 + 1) << 32));
    let mut lat = Vec::new();
    let mut bytes = 0u64;
    let (node, fh) = file;
    let big = vec![0xa5u8; chunk as usize];
    let small = vec![0x3cu8; 4096];
    // Sequential callers each stream their own share of the file.
    let share = (size / depth as u64).max(u64::from(chunk));
    let mut seq = share * t as u64 % size;
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        match w {
            Workload::Randread => {
                let off = rng.next() % (size / 4096) * 4096;
                bytes += c.read(node, fh, off, 4096).map_err(fs("read"))?.len() as u64;
            }
            Workload::Randwrite => {
                let off = rng.next() % (size / 4096) * 4096;
                bytes += u64::from(c.write(node, fh, off, &small, 0).map_err(fs("write"))?);
            }
            Workload::Seqread => {
                bytes += c.read(node, fh, seq, chunk).map_err(fs("read"))?.len() as u64;
                seq = (seq + u64::from(chunk)) % size;
            }
            Workload::Seqwrite => {
                bytes += u64::from(c.write(node, fh, seq, &big, 0).map_err(fs("write"))?);
                seq = (seq + u64::from(chunk)) % size;
            }
            Workload::Getattr => {
                c.getattr(node, None).map_err(fs("getattr"))?;
            }
            Workload::Syncwrite => {
                let off = rng.next() % 256 * 4096;
                bytes += u64::from(c.write(node, fh, off, &small, 0).map_err(fs("write"))?);
                c.fsync(node, fh, false).map_err(fs("fsync"))?;
            }
            Workload::Meta => {
                let name = format!("m-{t}-{i}");
                let (e, o) = c
                    .create(ROOT_ID, name.as_bytes(), 0o644, libc::O_WRONLY as u32, 0)
                    .map_err(fs("create"))?;
                c.release(e.nodeid, o.fh, 0).map_err(fs("release"))?;
                c.getattr(e.nodeid, None).map_err(fs("getattr"))?;
                c.unlink(ROOT_ID, name.as_bytes()).map_err(fs("unlink"))?;
                c.forget(e.nodeid, 1);
                i += 1;
            }
        }
        lat.push(u32::try_from(t0.elapsed().as_micros()).unwrap_or(u32::MAX));
    }
    Ok((lat, bytes))
}

/// The old mode (`--engine-client`): the engine as the guest, one caller
/// thread per request in flight.
pub fn run(a: &Args) -> Result<Report, LoadError> {
    let fe = VhostFrontend::connect(
        &a.socket_path,
        &FrontendConfig {
            request_queues: a.queues,
            queue_size: a.queue_size,
            // Never the limit: what stays in flight is up to the backend.
            max_background: (u32::from(a.queues) * u32::from(a.queue_size)).max(256),
            ..FrontendConfig::default()
        },
    )
    .map_err(LoadError::Connect)?;
    let c = fe.client().clone();
    let max_write = c
        .chan()
        .negotiated()
        .map_or(128 * 1024, |n| n.max_write)
        .max(4096);
    let chunk = (1u32 << 20).min(max_write);
    let size = a.file_mib.max(1) << 20;
    let file = if a.workload == Workload::Meta {
        (0, 0)
    } else {
        let (node, fh) = data_file(&c, &a.file, a.file_mib.max(1), max_write)?;
        if a.direct {
            let flags = (libc::O_RDWR | libc::O_DIRECT) as u32;
            (node, c.open(node, flags).map_err(fs("open O_DIRECT"))?.fh)
        } else {
            (node, fh)
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (d0, l0) = (a.daemon_pid.and_then(crate::cpu_us), crate::own_cpu_us());
    let t0 = Instant::now();
    let job = Job {
        w: a.workload,
        depth: a.depth.max(1),
        file,
        size,
        chunk,
    };
    let handles: Vec<_> = (0..job.depth)
        .map(|t| {
            let (c, stop) = (c.clone(), stop.clone());
            std::thread::spawn(move || caller(&c, job, t, &stop))
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(a.seconds));
    stop.store(true, Ordering::Relaxed);
    let mut lat = Vec::new();
    let mut bytes = 0;
    for h in handles {
        match h.join() {
            Ok(Ok((l, b))) => {
                lat.extend(l);
                bytes += b;
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(LoadError::Fs("caller thread", Errno::EIO)),
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let mut report = Report::from_latencies(&mut lat, bytes, secs);
    report.load_cpu_us = crate::own_cpu_us().saturating_sub(l0);
    report.daemon_cpu_us = d0
        .zip(a.daemon_pid.and_then(crate::cpu_us))
        .map(|(b, e)| e.saturating_sub(b));
    if file.0 != 0 {
        let _ = c.release(file.0, file.1, 0);
    }
    Ok(report)
}
