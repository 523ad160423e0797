//! `fusebox-load`: a guest's FUSE traffic against any vhost-user-fs backend
//! (fusebox or virtiofsd) with no VM, reporting ops/s, MB/s, latency
//! percentiles and the CPU the backend and the load spent per operation.
//!
//! By default it drives the queue as a guest kernel does
//! (`virtio_fs::testing::guest`): one thread posts `--depth` chains, kicks once,
//! sleeps until the device signals, reaps and reposts, with EVENT_IDX.
//! `--engine-client` is the old mode (a thread per request in flight).

mod engine;
mod raw;

use clap::{Parser, ValueEnum};
use fuse_core::Errno;
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Workload {
    /// 4 KiB reads at random aligned offsets.
    Randread,
    /// 4 KiB writes at random aligned offsets.
    Randwrite,
    /// 1 MiB sequential reads.
    Seqread,
    /// 1 MiB sequential writes.
    Seqwrite,
    /// GETATTR of the data file.
    Getattr,
    /// create, close, stat and unlink of a new file (one op = all four).
    Meta,
    /// A 4 KiB write at a random offset of the first MiB, then FSYNC of
    /// the file (one op = both; a database's commit, `fio --fsync=1`):
    /// each request slot writes its own file, as `--depth` writers in a
    /// guest do (the guest's FUSE client sends one FSYNC per file at a
    /// time). With `--engine-client` every caller writes and syncs the one
    /// data file.
    Syncwrite,
}

/// Drive a vhost-user-fs backend with no VM.
#[derive(Debug, Parser)]
#[command(name = "fusebox-load", version)]
struct Args {
    /// The backend's vhost-user socket.
    #[arg(long)]
    socket_path: PathBuf,
    /// Request queues to use (the guest mode drives the first).
    #[arg(long, default_value_t = 1)]
    queues: u16,
    /// What to run.
    #[arg(long, value_enum)]
    workload: Workload,
    /// Requests in flight.
    #[arg(long, default_value_t = 1)]
    depth: usize,
    /// Descriptors per queue (a guest's queue-size; at most 1024).
    #[arg(long, default_value_t = 128)]
    queue_size: u16,
    /// How long to run.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// The data file, by name in the shared directory (made if missing or
    /// of another size).
    #[arg(long, default_value = "fusebox-load.dat")]
    file: String,
    /// Size of the data file, MiB.
    #[arg(long, default_value_t = 256)]
    file_mib: u64,
    /// Open the data file O_DIRECT (as `fio --direct=1` in a guest): the
    /// backend does the host I/O straight from and into the guest pages.
    #[arg(long)]
    direct: bool,
    /// Drop the data file's pages from the host's page cache before the
    /// run (fsync, then POSIX_FADV_DONTNEED), through `--host-dir`.
    #[arg(long, requires = "host_dir")]
    cold: bool,
    /// The shared directory as the host sees it (for `--cold`).
    #[arg(long)]
    host_dir: Option<PathBuf>,
    /// The backend process whose CPU time is reported (by default the
    /// socket's peer).
    #[arg(long)]
    daemon_pid: Option<u32>,
    /// The old mode: the engine as the guest, one caller thread per request
    /// in flight (squeezes ratios toward 1.0 on a small host).
    #[arg(long)]
    engine_client: bool,
    /// Print one machine-readable line: workload depth ops_per_s mb_per_s
    /// p50_us p99_us daemon_cpu_us_per_op load_cpu_us_per_op.
    #[arg(long)]
    terse: bool,
}

#[derive(Debug, thiserror::Error)]
enum LoadError {
    #[error("connecting")]
    Connect(#[source] virtio_fs::testing::frontend::FrontendError),
    #[error("the guest")]
    Guest(#[source] virtio_fs::testing::guest::GuestError),
    #[error("{0}: {1}")]
    Fs(&'static str, Errno),
    #[error("{0}: {1}")]
    Host(&'static str, #[source] std::io::Error),
}

fn fs(what: &'static str) -> impl Fn(Errno) -> LoadError {
    move |e| LoadError::Fs(what, e)
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// What a run measured.
#[derive(Debug, Default)]
struct Report {
    ops: u64,
    secs: f64,
    bytes: u64,
    p50_us: u64,
    p90_us: u64,
    p99_us: u64,
    /// Daemon user+system CPU over the run, µs (None: not readable).
    daemon_cpu_us: Option<u64>,
    /// This process's user+system CPU over the run, µs.
    load_cpu_us: u64,
}

impl Report {
    fn from_latencies(lat: &mut [u32], bytes: u64, secs: f64) -> Report {
        lat.sort_unstable();
        let pct = |p: f64| {
            lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
                .copied()
                .map_or(0, u64::from)
        };
        Report {
            ops: lat.len() as u64,
            secs,
            bytes,
            p50_us: pct(0.50),
            p90_us: pct(0.90),
            p99_us: pct(0.99),
            ..Report::default()
        }
    }
}

/// User+system CPU of process `pid` so far, µs.
fn cpu_us(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    // Fields 14 and 15 of stat(5), counted from the state (field 3).
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .ok()
        .filter(|&h| h > 0)?;
    Some(ticks * 1_000_000 / hz)
}

/// This process's user+system CPU so far, µs.
fn own_cpu_us() -> u64 {
    // SAFETY: a zeroed rusage is a valid out-value for getrusage.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `r` is a valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(r.ru_utime) + us(r.ru_stime)
}

fn print(a: &Args, r: &Report) {
    let ops_s = r.ops as f64 / r.secs.max(1e-9);
    let mbs = r.bytes as f64 / r.secs.max(1e-9) / 1e6;
    let per_op = |us: u64| us as f64 / (r.ops.max(1)) as f64;
    let daemon = r.daemon_cpu_us.map_or(-1.0, per_op);
    let load = per_op(r.load_cpu_us);
    if a.terse {
        println!(
            "{:?} {} {:.0} {:.1} {} {} {:.2} {:.2}",
            a.workload, a.depth, ops_s, mbs, r.p50_us, r.p99_us, daemon, load
        );
    } else {
        println!(
            "{:?} depth {}: {:.0} ops/s, {:.1} MB/s, latency p50 {} us, p90 {} us, p99 {} us; \
             CPU per op: daemon {:.2} us, load {:.2} us ({} ops in {:.1} s)",
            a.workload,
            a.depth,
            ops_s,
            mbs,
            r.p50_us,
            r.p90_us,
            r.p99_us,
            daemon,
            load,
            r.ops,
            r.secs
        );
    }
}

fn main() -> std::process::ExitCode {
    // RUST_LOG=debug shows the frontend's reply traces (`log::debug!`).
    let _ = env_logger::try_init();
    let a = Args::parse();
    let r = if a.engine_client {
        engine::run(&a)
    } else {
        raw::run(&a)
    };
    match r {
        Ok(r) => {
            print(&a, &r);
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fusebox-load: {e}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                eprintln!("  caused by: {s}");
                src = s.source();
            }
            std::process::ExitCode::FAILURE
        }
    }
}
