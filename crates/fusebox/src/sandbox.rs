//! --sandbox: confine the daemon to the shared directory.
//!
//! `namespace` (as virtiofsd's): new mount, pid and net namespaces; the
//! process started stays outside, forwards stop signals and exits with the
//! child's status. The child (pid 1 of its namespace) makes its mounts
//! slaves, binds the shared directory onto itself and mounts a fresh
//! /proc; once the passthrough holds its fds (the root, /proc/self/fd),
//! the shared directory becomes the root (pivot_root) and the old root is
//! detached. Started by a user other than root it also makes a user
//! namespace, mapped to that user alone (every request runs as it) or to
//! `--uid-map`/`--gid-map` (`userns.rs`: requests run as their own ids,
//! EPERM for ids left out). `chroot`: chroot(2) into the shared directory
//! at the same point. Everything the daemon does afterwards goes through those fds
//! (xattrs too, which needs the `*xattrat` calls of Linux 6.13: fusebox
//! refuses `--xattr` in a sandbox without them). See docs/DESIGN.md.

use crate::cli::Sandbox;
use crate::userns::{Maps, NsIdMap};
use std::ffi::CString;
use std::io;
use std::path::Path;

/// Why the sandbox could not be entered.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A syscall of the set-up failed.
    #[error("sandbox: {0}")]
    Sys(&'static str, #[source] io::Error),
    /// The shared directory's path cannot be a C string.
    #[error("sandbox: the shared directory's path contains NUL")]
    Path,
    /// The user namespace of an unprivileged start.
    #[error("sandbox: the user namespace")]
    UserNs(#[source] crate::userns::UserNsError),
    /// A fork asked of a process with other threads (or whose threads
    /// cannot be counted): its child could not safely run Rust code.
    #[error("sandbox: it forks and must start from one thread; this process has {0:?}")]
    Threads(Option<usize>),
    /// --uid-map or --gid-map where no user namespace is made.
    #[error(
        "--uid-map and --gid-map need --sandbox namespace started by a user other than root \
         (they say what its user namespace maps)"
    )]
    MapsWithoutUserNs,
}

fn check(what: &'static str, r: libc::c_int) -> Result<(), SandboxError> {
    if r < 0 {
        Err(SandboxError::Sys(what, io::Error::last_os_error()))
    } else {
        Ok(())
    }
}

fn cpath(p: &Path) -> Result<CString, SandboxError> {
    CString::new(p.as_os_str().as_encoded_bytes()).map_err(|_nul| SandboxError::Path)
}

/// Whose ids the daemon serves with, after [`enter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ids {
    /// The host's (no user namespace).
    Host,
    /// A user namespace where only the starting user is mapped (as root):
    /// no other id can be switched to, so every request runs as that
    /// user, whatever guest id made it.
    OwnOnly,
    /// A user namespace with the ranges of `--uid-map` / `--gid-map`:
    /// requests run as their guest ids, which those ranges map.
    Ranges,
}

/// First step, while the process has one thread: for `namespace`, enter
/// the namespaces (started by a user other than root, a user namespace
/// too). Returns only in the process that goes on serving; the original
/// process waits for it and exits with its status.
pub fn enter(
    mode: Sandbox,
    shared: &Path,
    uid_map: &[NsIdMap],
    gid_map: &[NsIdMap],
) -> Result<Ids, SandboxError> {
    // SAFETY: geteuid has no arguments and cannot fail.
    let user_ns = mode == Sandbox::Namespace && unsafe { libc::geteuid() } != 0;
    let given = !uid_map.is_empty() || !gid_map.is_empty();
    if given && !user_ns {
        return Err(SandboxError::MapsWithoutUserNs);
    }
    if mode != Sandbox::Namespace {
        return Ok(Ids::Host);
    }
    let ids = match (user_ns, given) {
        (false, _) => Ids::Host,
        (true, false) => Ids::OwnOnly,
        (true, true) => Ids::Ranges,
    };
    let maps = user_ns
        .then(|| Maps::new(uid_map, gid_map))
        .transpose()
        .map_err(SandboxError::UserNs)?;
    let dir = cpath(shared)?;
    // Blocked before the fork, so a child that dies at once is still seen
    // (the child inherits the mask; its own later block adds to it).
    let sigs = crate::signals::block(&[
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGUSR1,
        libc::SIGCHLD,
    ]);
    let flags = libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWNET;
    match &maps {
        // The user namespace owns the others made with it, so the daemon
        // may mount and pivot in them.
        Some(m) => m
            .unshare(flags | libc::CLONE_NEWUSER)
            .map_err(SandboxError::UserNs)?,
        // SAFETY: unshare has no memory arguments.
        None => check("unshare", unsafe { libc::unshare(flags) })?,
    }
    let threads = crate::userns::thread_count();
    if threads != Some(1) {
        return Err(SandboxError::Threads(threads));
    }
    // SAFETY: the process has one thread (counted just above; only this
    // thread could start another), so the child may go on running Rust
    // code.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(SandboxError::Sys("fork", io::Error::last_os_error()));
    }
    if pid > 0 {
        supervise(pid, &sigs);
    }
    // The child: pid 1 of the new pid namespace.
    // SAFETY: prctl with integer arguments: die with the supervisor.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    let none = std::ptr::null::<libc::c_char>();
    // SAFETY: every pointer is null or a NUL-terminated string that lives
    // across the call.
    unsafe {
        check(
            "making mounts private",
            libc::mount(
                none,
                c"/".as_ptr(),
                none,
                libc::MS_SLAVE | libc::MS_REC,
                std::ptr::null(),
            ),
        )?;
        check(
            "bind-mounting the shared directory",
            libc::mount(
                dir.as_ptr(),
                dir.as_ptr(),
                none,
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            ),
        )?;
        check(
            "mounting /proc",
            libc::mount(
                c"proc".as_ptr(),
                c"/proc".as_ptr(),
                c"proc".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            ),
        )?;
    }
    Ok(ids)
}

/// The original process of `namespace` mode: forwards stop signals to the
/// child and exits with its status. (After unshare(CLONE_NEWPID) this
/// process may not start threads, so one sigwait loop does both.)
fn supervise(child: libc::pid_t, sigs: &libc::sigset_t) -> ! {
    loop {
        let sig = crate::signals::wait(sigs);
        if sig != libc::SIGCHLD {
            // SAFETY: kill with integer arguments.
            unsafe { libc::kill(child, sig) };
            continue;
        }
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer.
        if unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) } == child {
            let code = if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            };
            std::process::exit(code)
        }
    }
}

extern "C" {
    /// glibc: reads the time zone (`/etc/localtime`) once.
    fn tzset();
}

/// Has glibc read, while the paths are still the host's, the files it
/// would otherwise open by absolute path the first time it needs them
/// (after confinement they name what the guest put in its share: a FIFO
/// there would hang the thread, a device node would be opened as root):
/// the time zone (`/etc/localtime`, for any libc call that formats local
/// time; the log itself stamps UTC or nothing), and whether a
/// thread's glibc malloc heap may shrink (`/proc/sys/vm/overcommit_memory`,
/// read on the first shrink of a heap other than the main one; a thread
/// that frees what it allocated with glibc's malloc makes one now: Rust's
/// allocations go to mimalloc, glibc's own to its malloc). The same
/// thread is the first besides the main one to allocate with mimalloc,
/// which counts the host's NUMA nodes then (`/sys/devices/system/node`).
pub fn load_lazy_files() {
    // SAFETY: tzset has no arguments; it only reads the environment and
    // the time zone file into glibc's own state.
    unsafe { tzset() };
    let shrink = std::thread::Builder::new().spawn(|| {
        let chunks: Vec<*mut libc::c_void> = (0..64)
            // SAFETY: malloc of a nonzero size; a null result is freed
            // below as well, which free allows.
            .map(|_| unsafe { libc::malloc(100 * 1024) })
            .collect();
        for c in chunks.into_iter().rev() {
            // SAFETY: each pointer came from glibc's malloc above and is
            // freed once.
            unsafe { libc::free(std::hint::black_box(c)) };
        }
    });
    if let Ok(t) = shrink {
        let _ = t.join();
    }
}

/// Second step, once the passthrough filesystem holds its fds and before
/// any thread serves: make the shared directory the root.
pub fn confine(mode: Sandbox, shared: &Path) -> Result<(), SandboxError> {
    if mode == Sandbox::None {
        return Ok(());
    }
    let dir = cpath(shared)?;
    // SAFETY: NUL-terminated strings that live across the calls.
    unsafe {
        check("chdir to the shared directory", libc::chdir(dir.as_ptr()))?;
        match mode {
            Sandbox::Namespace => {
                check(
                    "pivot_root",
                    libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr())
                        as libc::c_int,
                )?;
                check(
                    "detaching the old root",
                    libc::umount2(c".".as_ptr(), libc::MNT_DETACH),
                )?;
            }
            Sandbox::Chroot => check("chroot", libc::chroot(c".".as_ptr()))?,
            Sandbox::None => {}
        }
        check("chdir /", libc::chdir(c"/".as_ptr()))
    }
}
