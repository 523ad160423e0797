//! The default mode: a vhost-user-fs device serving the shared directory
//! to one VMM connection, then exiting when the frontend disconnects.

use crate::caps;
use crate::cli::{AclMode, FileHandles, VhostArgs};
use crate::logging;
use crate::rlimit;
use crate::sandbox;
use crate::seccomp;
use crate::signals;
use fuse_core::server::faults::{Faulty, PlanError};
use passthrough::Groups;
use passthrough::{Config, PassthroughError, PassthroughFs};
use std::os::fd::FromRawFd;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use vhost::vhost_user::Listener;
use vhost_user_backend::VhostUserDaemon;
use virtio_fs::{DeviceConfig, DeviceError, FsDevice};
use vm_memory::GuestMemoryAtomic;

/// Errors of the device mode.
#[derive(Debug, thiserror::Error)]
pub enum VhostError {
    /// The shared directory.
    #[error("serving the shared directory")]
    Share(#[source] PassthroughError),
    /// --inject-faults.
    #[error("--inject-faults")]
    Faults(#[source] PlanError),
    /// The device.
    #[error("starting the device")]
    Device(#[source] DeviceError),
    /// The vhost-user daemon (its error type is not a std error, so its
    /// message is kept in this one's).
    #[error("vhost-user: {0}")]
    Daemon(vhost_user_backend::Error),
    /// The socket.
    #[error("vhost-user socket {0}")]
    Socket(String, #[source] std::io::Error),
    /// --inode-file-handles=mandatory on a filesystem without them.
    #[error("--inode-file-handles=mandatory: {0} gives no file handles")]
    NoFileHandles(String),
    /// The sandbox.
    #[error("sandbox")]
    Sandbox(#[source] crate::sandbox::SandboxError),
    /// The fd limit.
    #[error("--rlimit-nofile")]
    Rlimit(#[source] crate::rlimit::RlimitError),
    /// The seccomp filter.
    #[error("seccomp")]
    Seccomp(#[source] crate::seccomp::SeccompError),
    /// --modcaps.
    #[error("capabilities")]
    Caps(#[source] crate::caps::CapsError),
    /// An option this build does not implement.
    #[error("{0} is not supported yet (see issue 5); use {1}")]
    Unsupported(&'static str, &'static str),
    /// A missing option (clap enforces it; kept for a clean message).
    #[error("--{0} is required")]
    Missing(&'static str),
}

/// What `--print-capabilities` prints: the vhost-user backend JSON that
/// libvirt reads, virtiofsd 1.14's set, each of which works:
/// `posix-acl-negotiation-mode` and `security-label-negotiation-mode`
/// (--posix-acl and --security-label take never|auto|always),
/// `migrate-precopy` (dirty-page logging and the device state,
/// `--migration-mode`) and `separate-options` (--shared-dir, --cache and
/// the like; libvirt 9.0 does not know it and passes `-o source=...`,
/// which `crate::compat` takes, locks included). A libvirt that reads
/// `separate-options` refuses a domain with a `<lock>` element for a
/// daemon advertising it, as for virtiofsd: the lock settings (`-o
/// no_flock,no_posix_lock`) are then out of libvirt's reach (README).
const CAPABILITIES: &str = "{\n  \"type\": \"fs\",\n  \"features\": [\n    \
    \"migrate-precopy\",\n    \"posix-acl-negotiation-mode\",\n    \"security-label-negotiation-mode\",\n    \"separate-options\"\n  ]\n}";

/// Whether `fd` is a listening socket and not one of the standard
/// streams: `--fd` must name the socket the VMM (or libvirt) handed over,
/// not some other open file the daemon would then own and close.
fn listening_socket(fd: std::os::fd::RawFd) -> Result<(), std::io::Error> {
    if fd <= 2 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a socket fd (0-2 are the standard streams)",
        ));
    }
    let mut on: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `on` and `len` are valid for writes of the sizes given; the
    // kernel checks `fd` (EBADF, ENOTSOCK).
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&mut on as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if on == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a socket that is not listening",
        ));
    }
    Ok(())
}

fn socket_group(path: &std::path::Path, group: &str) -> Result<(), VhostError> {
    let err = |e| VhostError::Socket(path.display().to_string(), e);
    let name = std::ffi::CString::new(group)
        .map_err(|e| err(std::io::Error::new(std::io::ErrorKind::InvalidInput, e)))?;
    // SAFETY: `name` is NUL-terminated; getgrnam returns NULL or a pointer
    // to a static struct that is read at once, before any other call; the
    // socket is made before any thread is started (`run`), so no other
    // thread calls getgrnam meanwhile.
    let gid = unsafe {
        let g = libc::getgrnam(name.as_ptr());
        if g.is_null() {
            return Err(err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("no group {group}"),
            )));
        }
        (*g).gr_gid
    };
    std::os::unix::fs::chown(path, None, Some(gid)).map_err(err)?;
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o770);
    std::fs::set_permissions(path, mode).map_err(err)
}

/// The device's counters and how the passthrough did its data I/O.
fn report(dev: &FsDevice<Faulty<PassthroughFs>>) -> String {
    let n = dev.engine().fs().inner().io_counts();
    format!(
        "{}host I/O: reads {} through io_uring ({} into fixed guest memory; {} with no synchronous try \
         of the page cache), {} by syscall; \
         {} copied from a mapping of the file ({} stopped by a truncation); \
         writes {} through io_uring ({} from fixed guest memory), {} by syscall",
        dev.report(),
        n.read_uring,
        n.read_fixed,
        n.read_cold_skips,
        n.read_syscall,
        n.read_mapped,
        n.read_mapped_faults,
        n.write_uring,
        n.write_fixed,
        n.write_syscall
    )
}

/// How long a stop signal waits for the exit report before the daemon
/// exits without it (a report needs the engine's locks and the log's
/// sink; neither may keep the daemon from stopping).
const REPORT_GRACE: Duration = Duration::from_secs(1);

/// The signal thread: SIGUSR1 logs the counters; a stop signal exits at
/// once (the VMM sees the device go away, as with virtiofsd), whatever
/// the other threads are blocked in, after logging the counters if that
/// takes less than [`REPORT_GRACE`].
fn on_signals(
    sigs: libc::sigset_t,
    serving: Arc<OnceLock<FsDevice<Faulty<PassthroughFs>>>>,
    no_caps: bool,
) {
    let (dropped, wait) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if no_caps {
            if let Err(e) = caps::keep_only(0) {
                log::error!("the signal thread's capabilities: {e}");
            }
        }
        let _ = dropped.send(());
        loop {
            let sig = signals::wait(&sigs);
            let dev = serving.get().cloned();
            if sig == libc::SIGUSR1 {
                if let Some(d) = dev {
                    log::info!("{}", report(&d));
                }
                continue;
            }
            let (tx, rx) = std::sync::mpsc::channel();
            let logger = std::thread::Builder::new().spawn(move || {
                match dev {
                    Some(d) => log::info!("signal {sig}: exiting\n{}", report(&d)),
                    None => log::info!("signal {sig}: exiting"),
                }
                let _ = tx.send(());
            });
            if logger.is_ok() {
                let _ = rx.recv_timeout(REPORT_GRACE);
            }
            // SAFETY: _exit ends the process without running destructors or
            // atexit handlers, which could wait for threads that are stuck.
            unsafe { libc::_exit(0) };
        }
    });
    // Done before the seccomp filter, which need not allow it.
    let _ = wait.recv();
}

/// Runs the device until the frontend disconnects or a stop signal.
pub fn run(a: VhostArgs) -> Result<(), VhostError> {
    if a.print_capabilities {
        println!("{CAPABILITIES}");
        return Ok(());
    }
    logging::init(a.log_level, a.syslog);
    for n in &a.notices {
        log::warn!("{n}");
    }
    // Until the signal thread runs (right after the sandbox's fork), stop
    // signals keep their default action: they end the process.
    let nofile = rlimit::raise(a.rlimit_nofile).map_err(VhostError::Rlimit)?;
    if nofile.soft < nofile.wanted {
        log::warn!(
            "the fd limit is {} (the hard limit; {} asked for)",
            nofile.soft,
            nofile.wanted
        );
    }
    // An explicit --rlimit-nofile also caps what the daemon uses when the
    // limit in force is higher already (it is never lowered).
    let room = match a.rlimit_nofile {
        Some(n) if n > 0 => nofile.soft.min(n),
        _ => nofile.soft,
    };
    let max_fds = room.saturating_sub(rlimit::reserve(room, u64::from(a.queues)));
    let dir = a
        .shared_dir
        .clone()
        .ok_or(VhostError::Missing("shared-dir"))?;
    let dir = std::fs::canonicalize(&dir).map_err(|source| {
        VhostError::Share(PassthroughError::Open {
            path: dir.display().to_string(),
            source,
        })
    })?;
    // The socket first: a sandbox cannot reach its path later.
    let mut listener = match (a.fd, &a.socket_path) {
        (Some(fd), _) => {
            listening_socket(fd).map_err(|e| VhostError::Socket(format!("--fd {fd}"), e))?;
            // SAFETY: checked just above to be a listening socket other
            // than stdin, stdout or stderr, which the caller passed to be
            // used by this process alone; the Listener owns it from here.
            unsafe { Listener::from_raw_fd(fd) }
        }
        (None, Some(p)) => {
            let l = Listener::new(p, true)
                .map_err(|e| VhostError::Socket(p.display().to_string(), e.into()))?;
            if let Some(g) = &a.socket_group {
                socket_group(p, g)?;
            }
            l
        }
        (None, None) => return Err(VhostError::Missing("socket-path")),
    };
    // Namespaces while single-threaded; the root moves once the
    // passthrough holds its fds, before any thread serves.
    let ids = sandbox::enter(a.sandbox, &dir, &a.virtiofsd.uid_map, &a.virtiofsd.gid_map)
        .map_err(VhostError::Sandbox)?;
    // Before any other thread exists (the engine starts several), so that
    // every thread inherits the mask and only the signal thread takes
    // them; and before anything that could block (the passthrough, the
    // device, the VMM), so a stop signal always ends the daemon.
    let sigs = signals::block(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1]);
    let serving: Arc<OnceLock<FsDevice<Faulty<PassthroughFs>>>> = Arc::new(OnceLock::new());
    // --modcaps: the signal thread needs no capability at all (it waits,
    // logs and exits), so it gives them all up as it starts; every other
    // thread starts after the main thread kept only the list's (below).
    on_signals(sigs, serving.clone(), a.modcaps.is_some());
    let cfg = Config {
        cache: a.cache.policy(),
        writeback: a.writeback,
        readonly: a.readonly,
        // As virtiofsd: --posix-acl, --security-label and --xattrmap
        // imply --xattr.
        xattr: a.xattr
            || a.posix_acl != AclMode::Never
            || a.security_label != AclMode::Never
            || a.virtiofsd.xattrmap.is_some(),
        xattrmap: a.virtiofsd.xattrmap.clone(),
        posix_acl: a.posix_acl != AclMode::Never,
        posix_acl_optional: a.posix_acl == AclMode::Auto,
        security_label: a.security_label != AclMode::Never,
        security_label_optional: a.security_label == AclMode::Auto,
        inode_file_handles: a.inode_file_handles != FileHandles::Never,
        max_fds: usize::try_from(max_fds).unwrap_or(usize::MAX),
        // Guest pids mean nothing on the host: no /proc groups.
        groups: Groups::None,
        io_uring: !a.no_io_uring,
        mapped_reads: !a.no_mapped_reads,
        announce_submounts: a.announce_submounts,
        dax_inodes: a.cache_size > 0,
        flock_locks: !a.no_flock,
        posix_locks: !a.no_posix_lock,
        readdirplus: !a.virtiofsd.no_readdirplus,
        killpriv_v2: !a.virtiofsd.no_killpriv_v2,
        direct_io: !a.no_direct_io,
        translate_uid: a.uids.clone(),
        translate_gid: a.gids.clone(),
        migration: passthrough::MigrationConfig {
            mode: match a.virtiofsd.migration_mode {
                crate::cli::MigrationMode::FindPaths => passthrough::MigrationMode::FindPaths,
                crate::cli::MigrationMode::FileHandles => passthrough::MigrationMode::FileHandles,
            },
            on_error: match a.virtiofsd.migration_on_error {
                crate::cli::MigrationOnError::Abort => passthrough::MigrationOnError::Abort,
                crate::cli::MigrationOnError::GuestError => {
                    passthrough::MigrationOnError::GuestError
                }
            },
            verify_handles: a.virtiofsd.migration_verify_handles,
        },
        // Only the starting user is mapped: there is no other id to switch
        // to, so every request runs as that user.
        creds: ids != sandbox::Ids::OwnOnly && Config::default().creds,
        ..Config::default()
    };
    if a.sandbox != crate::cli::Sandbox::None && cfg.xattr && !host_io::sys::xattrat_supported() {
        // Before 6.13 the xattr calls name fds by absolute /proc paths,
        // which inside the sandbox would resolve in the shared directory.
        return Err(VhostError::Unsupported(
            "--xattr or --posix-acl inside a sandbox on a kernel without getxattrat (Linux 6.13)",
            "--sandbox none, or no --xattr",
        ));
    }
    let fs = PassthroughFs::new(&dir, cfg).map_err(VhostError::Share)?;
    if a.inode_file_handles == FileHandles::Mandatory && !fs.file_handles_supported() {
        return Err(VhostError::NoFileHandles(dir.display().to_string()));
    }
    if a.inode_file_handles == FileHandles::Prefer && !fs.config().inode_file_handles {
        log::warn!(
            "{} gives no file handles the daemon can open (a filesystem without them, or no \
             CAP_DAC_READ_SEARCH): holding an fd per inode",
            dir.display()
        );
    }
    let fs_handles = fs.config().inode_file_handles;
    let plan = a.faults.plan().map_err(VhostError::Faults)?;
    sandbox::load_lazy_files();
    sandbox::confine(a.sandbox, &dir).map_err(VhostError::Sandbox)?;
    // The capabilities the serving process keeps, once the sandbox no
    // longer needs any and before any serving thread starts (they inherit
    // the main thread's).
    if let Some(m) = &a.modcaps {
        let needs = caps::Needs {
            // A migration's destination opens file handles too.
            file_handles: fs_handles
                || a.virtiofsd.migration_mode == crate::cli::MigrationMode::FileHandles,
            fixed_memory: a.fixed_guest_memory,
            creds: fs.config().creds,
        };
        caps::keep_only(m.kept(needs).map_err(VhostError::Caps)?).map_err(VhostError::Caps)?;
    }
    let dev = FsDevice::new(
        Faulty::new(fs, plan),
        DeviceConfig {
            request_queues: a.queues,
            queue_size: a.queue_size,
            tag: a.tag.clone(),
            request_timeout: Duration::from_secs(a.request_timeout),
            workers_per_queue: a.thread_pool_size.max(1),
            inline_per_batch: if a.thread_pool_size == 0 {
                usize::MAX
            } else {
                1
            },
            max_background: a.max_background,
            congestion_threshold: a.congestion_threshold,
            fixed_guest_memory: a.fixed_guest_memory,
            submit_batch: a.submit_batch as usize,
            chunk_time: Duration::from_micros(a.chunk_time_us),
            poll_time: Duration::from_micros(a.poll_max_us),
            cache_size: a.cache_size,
            ..DeviceConfig::default()
        },
    )
    .map_err(VhostError::Device)?;
    let mut daemon = VhostUserDaemon::new(
        "fusebox".into(),
        dev.clone(),
        GuestMemoryAtomic::new(virtio_fs::GuestMmap::new()),
    )
    .map_err(VhostError::Daemon)?;
    dev.register_listeners(&daemon.get_epoll_handlers())
        .map_err(|e| VhostError::Device(DeviceError::Event(e)))?;
    if a.fixed_guest_memory {
        log::warn!(
            "--fixed-guest-memory pins guest RAM: if the VMM discards guest pages \
             (virtio-balloon, free page reporting or hinting, virtio-mem), reads into \
             reused pages leave them zeroed and writes from them store stale bytes"
        );
    }
    log::info!(
        "sharing {} ({} request queue(s)); waiting for the VMM",
        dir.display(),
        a.queues
    );
    let _ = serving.set(dev.clone());
    // Every thread exists or inherits from one that does: filter them all.
    seccomp::install(a.seccomp).map_err(VhostError::Seccomp)?;
    daemon.start(&mut listener).map_err(VhostError::Daemon)?;
    log::info!("frontend connected");
    let r = daemon.wait();
    log::info!("frontend disconnected\n{}", report(&dev));
    // Calls hung by --inject-faults would keep the engine's workers, and
    // the exit, waiting.
    dev.engine().fs().release_hangs();
    match r {
        // The VMM closing its end (guest shut down, QEMU exited) is the
        // normal way for a device to end.
        Ok(())
        | Err(vhost_user_backend::Error::HandleRequest(
            vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage,
        )) => Ok(()),
        Err(e) => {
            log::error!("{e}");
            Err(VhostError::Daemon(e))
        }
    }
}
