//! `fusebox mount`: the passthrough served to the host kernel through
//! /dev/fuse, by the same dispatcher and device workers that serve the
//! in-process engine.

use crate::cli::{Cache, FaultArgs};
use crate::signals;
use fuse_core::abi::init;
use fuse_core::locks::lock;
use fuse_core::server::faults::{Faulty, PlanError};
use fuse_core::server::{serve_device, Dispatcher, ServerConfig};
use host_mount::devfuse::{self, DevFuse, MountError, MountOptions};
use host_mount::kernel_uring::{self, KernelQueue};
use passthrough::{Config, PassthroughError, PassthroughFs};
use passthrough::{Groups, IdMap, IdMapError, IdMapping};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Errors of the host mount.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The shared directory.
    #[error("serving the shared directory")]
    Share(#[source] PassthroughError),
    /// --inject-faults.
    #[error("--inject-faults")]
    Faults(#[source] PlanError),
    /// Mounting.
    #[error("mounting")]
    Mount(#[source] MountError),
    /// FUSE-over-io_uring.
    #[error("FUSE-over-io_uring")]
    Ring(#[source] host_mount::kernel_uring::KernelUringError),
    /// A /dev/fuse worker could not be made (its fd, its slots).
    #[error("starting a /dev/fuse worker")]
    Worker(#[source] fuse_core::Errno),
    /// The kernel did not take FUSE-over-io_uring.
    #[error("the kernel did not negotiate FUSE_OVER_IO_URING (is enable_uring set?)")]
    NoRing,
    /// The fd limit.
    #[error("--rlimit-nofile")]
    Rlimit(#[source] crate::rlimit::RlimitError),
    /// --translate-uid or --translate-gid mappings that cannot go
    /// together.
    #[error("{opt}")]
    Translate {
        /// The option.
        opt: &'static str,
        /// What is wrong.
        #[source]
        source: IdMapError,
    },
}

#[derive(Debug, clap::Args)]
pub struct MountArgs {
    /// Directory to share.
    #[arg(long)]
    shared_dir: PathBuf,
    /// Where to mount it.
    mountpoint: PathBuf,
    /// Cache policy.
    #[arg(long, value_enum, default_value = "auto")]
    cache: Cache,
    /// Worker threads.
    #[arg(long, default_value_t = 4)]
    thread_pool_size: usize,
    /// Serve extended attributes.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    xattr: bool,
    /// POSIX ACLs, negotiated with the kernel, which then checks them
    /// beside the mode bits (implies --xattr). Without it the kernel checks
    /// the mode bits alone and the ACL xattrs pass through as data: an ACL
    /// entry then only takes access away (the host checks it too), never
    /// grants it. Off by default: with ACLs on, the kernel asks for the
    /// root directory's ACL on every path walk (it never caches it).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    posix_acl: Option<bool>,
    /// Refuse every change.
    #[arg(long)]
    readonly: bool,
    /// Negotiate the writeback cache.
    #[arg(long, conflicts_with = "kernel_passthrough")]
    writeback: bool,
    /// Kernel FUSE passthrough (Linux 6.9+, CAP_SYS_ADMIN): the kernel
    /// reads, writes and maps open files on the host files itself, and
    /// those calls never reach the daemon. Opens, attributes and
    /// everything else are still served. Files the kernel cannot stack on
    /// (a share on overlayfs, say) are served as without it.
    #[arg(long)]
    kernel_passthrough: bool,
    /// Keep file handles instead of an fd per inode.
    #[arg(long)]
    inode_file_handles: bool,
    /// Cap on fds the daemon holds for its clients (the soft
    /// RLIMIT_NOFILE is raised to cover it and the daemon's own).
    #[arg(long, default_value_t = 65536)]
    rlimit_nofile: usize,
    /// max_background to negotiate (0: the kernel's default; with
    /// --io-uring or an --in-flight above 1, that times the serving
    /// threads: the ring's queues, or the /dev/fuse workers).
    #[arg(long, default_value_t = 0)]
    max_background: u16,
    /// congestion_threshold to negotiate (0: the kernel's default; 3/4 of
    /// max_background when --in-flight raised that).
    #[arg(long, default_value_t = 0)]
    congestion_threshold: u16,
    /// FUSE_REQUEST_TIMEOUT in seconds (0: none).
    #[arg(long, default_value_t = 0)]
    request_timeout: u16,
    /// Data I/O with pread/pwrite only.
    #[arg(long)]
    no_io_uring: bool,
    /// Read cached data with preadv2 or io_uring only: no copies out of a
    /// shared mapping of a host file the page cache holds whole (which
    /// take no system call per READ, but skip the host's access hooks:
    /// LSM rechecks, inotify/fanotify access events, atime; see
    /// docs/DESIGN.md, "Mapped reads"). Mapped reads need io_uring on
    /// and x86_64.
    #[arg(long)]
    no_mapped_reads: bool,
    /// Serve requests over the kernel's FUSE-over-io_uring ring (one queue
    /// per possible CPU); FORGET and INTERRUPT still come over /dev/fuse.
    /// Sets /sys/module/fuse/parameters/enable_uring.
    #[arg(long)]
    io_uring: bool,
    /// Requests each serving thread keeps in flight (READs, O_DIRECT
    /// WRITEs, FSYNCs and FALLOCATEs run on while it serves the others):
    /// with --io-uring, ring entries per queue (one per request a CPU's
    /// callers keep in flight, e.g. fio's iodepth); without, requests per
    /// /dev/fuse worker (1: each worker serves one request at a time).
    /// `--ring-depth` is its old name.
    #[arg(long, alias = "ring-depth", default_value_t = kernel_uring::serve::DEFAULT_DEPTH as u16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub(crate) in_flight: u16,
    /// Translate UIDs between the mount's users (the "guest" side) and
    /// the shared directory (the host side), as the vhost-user device's
    /// --translate-uid: `guest`, `host`, `map`, `squash-guest`,
    /// `squash-host` `:<source base>:<target base>:<count>`, or
    /// `forbid-guest:<base>:<count>`. Repeatable. Capabilities follow the
    /// shared directory's UID: a caller translated to one other than 0
    /// has none there.
    #[arg(long, value_name = "MAP")]
    translate_uid: Vec<IdMapping>,
    /// The same as --translate-uid, for GIDs (supplementary groups
    /// included).
    #[arg(long, value_name = "MAP")]
    translate_gid: Vec<IdMapping>,
    /// Fault injection (tests).
    #[command(flatten)]
    faults: FaultArgs,
}

/// How long the workers get to return once the connection is gone. Hung
/// calls are released then, but a worker blocked in a host call nothing
/// can interrupt (a `delay` of --inject-faults, a dead NFS server) may
/// never return: the daemon ends without it.
const WORKERS_GRACE: Duration = Duration::from_secs(5);

/// Waits for the stop signals (blocked by [`signals::block`] before any
/// thread was started, so none is lost). The first lazily unmounts our
/// mount, which ends the daemon once the mount is no longer used; but when
/// the mount point no longer holds our mount (it was detached from
/// outside, or another mount covers or replaced it) nothing would ever
/// unmount it, so the first aborts the connection instead, and never
/// unmounts what is there now. A second signal aborts.
fn on_signals(set: libc::sigset_t, mnt: PathBuf, dev: DevFuse) {
    std::thread::spawn(move || {
        for n in 0.. {
            let sig = signals::wait(&set);
            // Once the connection has ended (the daemon is on its way
            // out) there is nothing to stop, and its fusectl number and
            // device may already be another mount's.
            if dev.is_disconnected() {
                // Nothing left to unmount or abort; the daemon is on its
                // way out unless something holds it (a host call that
                // does not return): a second signal leaves at once.
                if n == 0 {
                    log::info!(
                        "signal {sig}: the connection has already ended; \
                         a second signal exits at once"
                    );
                    continue;
                }
                log::warn!("signal {sig} again, exiting");
                std::process::exit(1);
            }
            if n == 0 && !first_stop(sig, &mnt, &dev) {
                continue;
            }
            if n > 0 {
                log::warn!("signal {sig} again, aborting the connection");
            }
            if let Err(e) = dev.abort() {
                // Exiting closes /dev/fuse, which aborts the connection too.
                log::error!("aborting the connection through fusectl: {e}; exiting");
                std::process::exit(1);
            }
        }
    });
}

/// The first stop signal: lazily unmounts the mount on `mnt` if it is ours
/// (false: the daemon goes on until the mount is no longer used); true if
/// the connection must be aborted instead.
fn first_stop(sig: i32, mnt: &Path, dev: &DevFuse) -> bool {
    // Said first: once the mount goes the process may end at any moment.
    log::info!("signal {sig}, unmounting {}", mnt.display());
    match dev.detach_own_mount() {
        Ok(true) => false,
        Ok(false) => {
            log::warn!(
                "{} no longer holds this daemon's mount (detached, or \
                 another mount is there); aborting the connection",
                mnt.display()
            );
            true
        }
        Err(e) => {
            crate::report(&e);
            log::warn!("aborting the connection");
            true
        }
    }
}

/// A serving thread (`who`: a ring queue, a /dev/fuse worker) failed for a
/// reason other than the connection closing: the kernel would hold
/// requests for it forever, so the connection is aborted (callers get an
/// error, the daemon ends).
fn worker_failed(dev: &DevFuse, who: std::fmt::Arguments<'_>, e: impl std::fmt::Display) {
    log::error!("{who}: {e}; aborting the connection");
    if let Err(e) = dev.abort() {
        log::error!("aborting: {e}");
    }
}

/// The ring queues being served, for the daemon to stop them once the
/// connection is gone (a thread whose entries all hold READs that hang
/// has no command in flight that could tell it).
type Queues = Arc<std::sync::Mutex<Vec<KernelQueue>>>;

/// Starts one ring worker per kernel queue, once INIT is done.
fn start_ring(
    dev: &DevFuse,
    disp: &Arc<Dispatcher<Faulty<PassthroughFs>>>,
    max_payload: usize,
    depth: usize,
    queues: &Queues,
) -> Result<Vec<std::thread::JoinHandle<()>>, HostError> {
    // INIT is served over /dev/fuse by the device workers; the kernel then
    // holds every request until each queue has an entry, so nothing here
    // may touch the mount before the ring workers are up.
    let t = std::time::Instant::now();
    // INIT answered, and its reply written (so processed by the kernel: a
    // REGISTER before that is refused with EAGAIN, and with many entries
    // registered at once some could be refused and others not).
    while !disp.init_done() || dev.replies_written() == 0 {
        if dev.is_disconnected() {
            // Unmounted (or aborted) before INIT was done.
            return Err(HostError::NoRing);
        }
        if t.elapsed() > std::time::Duration::from_secs(30) {
            let _ = dev.abort();
            return Err(HostError::NoRing);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    if disp.decode_options().flags & init::OVER_IO_URING == 0 {
        let _ = dev.abort();
        return Err(HostError::NoRing);
    }
    let mut out = Vec::new();
    for qid in 0..kernel_uring::possible_cpus() as u16 {
        let (dev, d, queues) = (dev.clone(), disp.clone(), queues.clone());
        out.push(std::thread::spawn(move || {
            if !kernel_uring::pin_to_cpu(usize::from(qid)) {
                // Requests from that CPU still come to this queue, but the
                // nudge after a lock wait goes to the queue of the CPU the
                // thread runs on (see `KernelQueue::nudge`).
                log::warn!(
                    "ring queue {qid}: cannot run on CPU {qid} (outside this \
                     process's CPU set); lock waits on it may hold up its other requests"
                );
            }
            // INIT's reply was processed before this thread started, so a
            // REGISTER should not meet EAGAIN; should one all the same
            // (before this queue ever served), retry for a while.
            for _ in 0..2000 {
                let q = match KernelQueue::with_depth(&dev, qid, max_payload, depth) {
                    Ok(q) => q,
                    Err(e) => return worker_failed(&dev, format_args!("ring queue {qid}"), e),
                };
                lock(&queues).push(q.clone());
                match kernel_uring::serve::serve_queue(&q, &d, depth) {
                    Err(fuse_core::Errno::EAGAIN) => {
                        std::thread::sleep(std::time::Duration::from_millis(5))
                    }
                    Err(e) => return worker_failed(&dev, format_args!("ring queue {qid}"), e),
                    Ok(st) => {
                        if std::env::var_os("FUSEBOX_RING_STATS").is_some() {
                            log::info!(
                                "ring queue {qid}: {} requests, {} READs started, \
                                 at most {} in flight, {} parked, {} nudges committed, \
                                 {} refused, {} WRITEs started, {} syncs and FALLOCATEs started",
                                st.served,
                                st.started,
                                st.max_in_flight,
                                st.parked,
                                st.nudged,
                                st.nudge_failed,
                                st.writes_started,
                                st.no_data_started
                            );
                        }
                        return;
                    }
                }
            }
            worker_failed(
                &dev,
                format_args!("ring queue {qid}"),
                "REGISTER kept failing with EAGAIN",
            )
        }));
    }
    log::info!(
        "serving over FUSE-over-io_uring ({} queues of {depth} entries)",
        out.len()
    );
    Ok(out)
}

/// `threads` /dev/fuse workers, each keeping `depth` requests in flight
/// (`devfuse::serve_dev`); with FUSEBOX_RING_STATS each prints what it
/// served when the connection ends. Each worker's fd and slots are made
/// here first: if one cannot be, the connection is aborted and the start
/// fails, never a mount left with fewer workers or none. A worker that
/// fails later aborts the connection too.
fn serve_dev_at_depth(
    dev: &DevFuse,
    disp: &Arc<Dispatcher<Faulty<PassthroughFs>>>,
    threads: usize,
    depth: usize,
) -> Result<Vec<std::thread::JoinHandle<()>>, HostError> {
    let mut made = Vec::new();
    for _ in 0..threads.max(1) {
        match devfuse::DevWorker::new(dev, depth) {
            Ok(w) => made.push(w),
            Err(e) => {
                let _ = dev.abort();
                return Err(HostError::Worker(e));
            }
        }
    }
    Ok(made
        .into_iter()
        .enumerate()
        .map(|(n, w)| {
            let (dev, disp) = (dev.clone(), disp.clone());
            std::thread::spawn(move || match devfuse::serve_dev(w, &disp) {
                Ok(st) => {
                    if std::env::var_os("FUSEBOX_RING_STATS").is_some() {
                        log::info!(
                            "dev worker {n}: {} requests, {} started, at most {} \
                             in flight, {} WRITEs started, {} syncs and FALLOCATEs started",
                            st.served,
                            st.started,
                            st.max_in_flight,
                            st.writes_started,
                            st.no_data_started
                        );
                    }
                }
                Err(e) => worker_failed(&dev, format_args!("/dev/fuse worker {n}"), e),
            })
        })
        .collect())
}

/// Says whether the kernel took FUSE_PASSTHROUGH, once INIT is done.
fn report_passthrough(disp: &Arc<Dispatcher<Faulty<PassthroughFs>>>) {
    let disp = disp.clone();
    std::thread::spawn(move || {
        let t = std::time::Instant::now();
        while !disp.init_done() {
            if t.elapsed() > std::time::Duration::from_secs(30) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        if disp.fs().inner().kernel_passthrough() {
            log::info!("kernel passthrough on");
        } else {
            log::warn!(
                "the kernel did not negotiate FUSE_PASSTHROUGH \
                 (CONFIG_FUSE_PASSTHROUGH, Linux 6.9+); serving file data in the daemon"
            );
        }
    });
}

/// Runs `fusebox mount`.
pub fn run(a: MountArgs) -> Result<(), HostError> {
    crate::logging::init(crate::cli::LogLevel::Info, false);
    let translation = |opt, maps: &[IdMapping]| {
        IdMap::new(maps).map_err(|source| HostError::Translate { opt, source })
    };
    let translate_uid = translation("--translate-uid", &a.translate_uid)?;
    let translate_gid = translation("--translate-gid", &a.translate_gid)?;
    // Room for the cap and the daemon's own fds (never lowered); a lower
    // hard limit caps the cap.
    let cap = a.rlimit_nofile as u64;
    let nofile = crate::rlimit::raise(Some(
        cap.saturating_add(crate::rlimit::reserve(u64::MAX, 1)),
    ))
    .map_err(HostError::Rlimit)?;
    let room = nofile
        .soft
        .saturating_sub(crate::rlimit::reserve(nofile.soft, 1));
    let posix_acl = a.posix_acl.unwrap_or(false);
    let cfg = Config {
        cache: a.cache.policy(),
        writeback: a.writeback,
        readonly: a.readonly,
        xattr: a.xattr || posix_acl,
        posix_acl,
        // Calls run as the caller with its groups from /proc: the host
        // checks ACLs too (without --posix-acl they only take access
        // away: the kernel checks the mode bits first).
        pass_acl_xattrs: true,
        inode_file_handles: a.inode_file_handles,
        max_fds: usize::try_from(cap.min(room)).unwrap_or(usize::MAX),
        // Callers are host processes: their groups are in /proc.
        groups: Groups::Proc,
        io_uring: !a.no_io_uring,
        mapped_reads: !a.no_mapped_reads,
        kernel_passthrough: a.kernel_passthrough,
        translate_uid,
        translate_gid,
        ..Config::default()
    };
    let fs = PassthroughFs::new(&a.shared_dir, cfg).map_err(HostError::Share)?;
    let mut scfg = ServerConfig {
        max_background: a.max_background,
        congestion_threshold: a.congestion_threshold,
        request_timeout: a.request_timeout,
        ..ServerConfig::default()
    };
    // Requests each serving thread keeps in flight: a ring queue's, or a
    // /dev/fuse worker's (one at a time, `serve_device`, with --in-flight 1).
    let depth = usize::from(a.in_flight);
    let dev_depth = (!a.io_uring && depth > 1).then_some(depth);
    if a.io_uring {
        // Before the mount: the kernel offers the flag in INIT only then.
        kernel_uring::enable().map_err(HostError::Ring)?;
        scfg.flags |= init::OVER_IO_URING;
    }
    if a.io_uring || dev_depth.is_some() {
        // FUSE_ASYNC_DIO: an O_DIRECT read or write submitted without
        // waiting (io_uring, libaio) goes to the daemon as a background
        // request and the caller goes on; without it the kernel serves
        // each in the caller's context, one at a time, and no depth
        // reaches the daemon (libfuse offers it by default too).
        scfg.flags |= init::ASYNC_DIO;
        // Those requests count against max_background (the kernel's
        // default is 12): room for every request the serving threads
        // keep in flight, unless told.
        if a.max_background == 0 {
            let threads = if a.io_uring {
                kernel_uring::possible_cpus()
            } else {
                a.thread_pool_size.max(1)
            };
            let all = depth * threads;
            let bg = u16::try_from(all.max(12)).unwrap_or(u16::MAX);
            scfg.max_background = bg;
            if a.congestion_threshold == 0 {
                scfg.congestion_threshold = (u32::from(bg) * 3 / 4) as u16;
            }
        }
    }
    // The kernel's ring payload size: max(8 KiB, max_write, max_pages x
    // page size), where max_pages is what the dispatcher offers.
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let max_write = scfg.max_write as usize;
    let max_payload = (max_write.div_ceil(4096) * page).max(max_write).max(8192);
    let plan = a.faults.plan().map_err(HostError::Faults)?;
    // Where requests are kept in flight, READs are started without
    // waiting even under a plan: a hang then holds its entry (slot), not
    // the serving thread.
    let faulty = Faulty::new(fs, plan).with_started_reads(a.io_uring || dev_depth.is_some());
    let disp = Arc::new(Dispatcher::new(faulty, scfg));
    let signals = signals::block(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP]);
    // The kernel checks permissions itself (`default_permissions`), as a
    // guest's virtiofs mount always does. The daemon runs each call with
    // the caller's credentials, so the host checks too, but it never sees
    // what the kernel does without asking it: opening a FIFO or device
    // node (the kernel opens special files itself), a path walk through a
    // directory whose dentry is cached after it lost its search bit, or a
    // caller's lowered capabilities (the daemon serves root callers with
    // its own). See docs/SECURITY.md.
    let opts = MountOptions {
        readonly: a.readonly,
        allow_other: true,
        default_permissions: true,
        ..MountOptions::default()
    };
    let dev = DevFuse::mount(&a.mountpoint, &opts).map_err(HostError::Mount)?;
    // Before any worker reads INIT: the filesystem offers FUSE_PASSTHROUGH
    // only with a connection to register backing files on.
    disp.fs().inner().attach_device(dev.clone());
    on_signals(signals, a.mountpoint.clone(), dev.clone());
    log::info!(
        "serving {} on {}",
        a.shared_dir.display(),
        a.mountpoint.display()
    );
    let served = serve_until_gone(&a, &dev, &disp, dev_depth, max_payload);
    // The connection is gone (unmounted, or aborted: a second signal, a
    // worker that failed or could not start, the kernel timing a request
    // out, fusectl), or serving failed and the daemon is leaving. An
    // aborted connection's mount would stay behind,
    // failing every access with ENOTCONN until someone unmounts it:
    // detach it if the mount point still holds that very mount (never
    // another mount a symlink now leads to, nor, on Linux 6.8 and later,
    // one made there since: see `DevFuse::detach_own_mount`). libfuse
    // leaves it; this is on purpose.
    match dev.detach_own_mount() {
        Ok(true) => log::info!(
            "detached the mount on {}, whose connection had ended",
            a.mountpoint.display()
        ),
        Ok(false) => {}
        Err(e) => crate::report(&e),
    }
    served
}

/// Starts the serving threads and returns once the connection is gone
/// and they have returned (or the grace for them has passed).
fn serve_until_gone(
    a: &MountArgs,
    dev: &DevFuse,
    disp: &Arc<Dispatcher<Faulty<PassthroughFs>>>,
    dev_depth: Option<usize>,
    max_payload: usize,
) -> Result<(), HostError> {
    // The workers return when the connection goes (unmount, abort).
    let mut workers = match dev_depth {
        Some(depth) => serve_dev_at_depth(dev, disp, a.thread_pool_size, depth)?,
        None => serve_device(dev.clone(), disp.clone(), a.thread_pool_size),
    };
    let queues = Queues::default();
    if a.io_uring {
        workers.extend(start_ring(
            dev,
            disp,
            max_payload,
            usize::from(a.in_flight),
            &queues,
        )?);
    }
    if a.kernel_passthrough {
        report_passthrough(disp);
    }
    // The connection ends (unmounted, aborted, timed out): seen on the
    // device itself, since every worker may be blocked in a call.
    while !dev.wait_disconnected(Duration::from_millis(200)) {
        if workers.iter().all(|w| w.is_finished()) {
            break;
        }
    }
    // Calls hung by --inject-faults would keep their workers: release them.
    disp.fs().release_hangs();
    // Ring threads whose every entry holds a READ that has not completed
    // see no command fail: tell them. Their READs' payload slots stay
    // mapped until those READs complete (see kernel_uring's arena).
    for q in lock(&queues).iter() {
        q.shutdown();
    }
    let t = Instant::now();
    while !workers.iter().all(|w| w.is_finished()) && t.elapsed() < WORKERS_GRACE {
        std::thread::sleep(Duration::from_millis(20));
    }
    let stuck = workers.iter().filter(|w| !w.is_finished()).count();
    if stuck > 0 {
        log::warn!("{stuck} worker(s) still blocked in a host call; leaving without them");
    }
    log::info!("the connection to {} has ended", a.mountpoint.display());
    Ok(())
}
