//! The seccomp allow-list of the vhost-user daemon: every syscall the
//! daemon, its passthrough filesystem (io_uring included) and the Rust
//! runtime make; anything else is killed, logged or trapped (--seccomp).
//! Installed on every thread at once (TSYNC) before the VMM connects.

use crate::cli::Seccomp;
use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};
use std::collections::BTreeMap;

/// Why the filter could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// Building the filter.
    #[error("building the seccomp filter")]
    Build(#[source] seccompiler::BackendError),
    /// Compiling it to BPF.
    #[error("compiling the seccomp filter")]
    Compile(#[source] seccompiler::BackendError),
    /// Installing it.
    #[error("installing the seccomp filter")]
    Install(#[source] seccompiler::Error),
    /// Not on x86_64 or aarch64.
    #[error("seccomp filters are only built for x86_64 and aarch64")]
    Arch,
}

/// Syscalls common to both architectures.
const ALLOWED: &[libc::c_long] = &[
    // Memory, threads, time, signals (the Rust runtime and glibc).
    libc::SYS_brk,
    libc::SYS_mmap,
    libc::SYS_mprotect,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_futex,
    libc::SYS_set_robust_list,
    libc::SYS_get_robust_list,
    libc::SYS_rseq,
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_tgkill,
    libc::SYS_tkill,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_sigaltstack,
    libc::SYS_restart_syscall,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    // mimalloc (the allocator): a new thread's heap asks for its NUMA node
    // when the host has more than one.
    libc::SYS_getcpu,
    libc::SYS_sched_setaffinity,
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_clock_gettime,
    libc::SYS_gettimeofday,
    libc::SYS_getrandom,
    libc::SYS_prlimit64,
    libc::SYS_uname,
    libc::SYS_prctl,
    // fds, events and the vhost-user socket.
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_close,
    // The device checks a leaked exit-event fd is still its own before
    // closing it (virtio-fs device/exit_fds.rs).
    libc::SYS_kcmp,
    libc::SYS_dup,
    libc::SYS_dup3,
    libc::SYS_fcntl,
    libc::SYS_ioctl,
    libc::SYS_pipe2,
    libc::SYS_eventfd2,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    libc::SYS_ppoll,
    libc::SYS_socket,
    libc::SYS_connect,
    libc::SYS_accept4,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_shutdown,
    libc::SYS_sendmsg,
    libc::SYS_recvmsg,
    libc::SYS_sendto,
    libc::SYS_recvfrom,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
    // The passthrough filesystem.
    libc::SYS_openat,
    libc::SYS_openat2,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_newfstatat,
    libc::SYS_fstat,
    libc::SYS_statx,
    // cachestat: the residency check of mapped reads (not in libc's
    // x86_64 list; the same number on both architectures).
    host_io::mapped::SYS_CACHESTAT,
    libc::SYS_statfs,
    libc::SYS_fstatfs,
    libc::SYS_lseek,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_preadv2,
    libc::SYS_pwritev2,
    libc::SYS_getdents64,
    libc::SYS_mkdirat,
    libc::SYS_mknodat,
    libc::SYS_unlinkat,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_linkat,
    libc::SYS_symlinkat,
    libc::SYS_readlinkat,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_fchmod,
    libc::SYS_fchmodat,
    libc::SYS_fchown,
    libc::SYS_fchownat,
    libc::SYS_utimensat,
    libc::SYS_ftruncate,
    libc::SYS_fallocate,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_sync_file_range,
    libc::SYS_syncfs,
    libc::SYS_copy_file_range,
    libc::SYS_flock,
    libc::SYS_fchdir,
    libc::SYS_getcwd,
    libc::SYS_umask,
    libc::SYS_unshare,
    libc::SYS_setxattr,
    libc::SYS_lsetxattr,
    libc::SYS_fsetxattr,
    libc::SYS_getxattr,
    libc::SYS_lgetxattr,
    libc::SYS_fgetxattr,
    libc::SYS_listxattr,
    libc::SYS_llistxattr,
    libc::SYS_flistxattr,
    libc::SYS_removexattr,
    libc::SYS_lremovexattr,
    libc::SYS_fremovexattr,
    // setxattrat, getxattrat, listxattrat, removexattrat (Linux 6.13;
    // one number on every architecture; libc does not name them yet).
    463,
    464,
    465,
    466,
    // Per-request credentials.
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_getgroups,
    libc::SYS_setgroups,
    libc::SYS_setfsuid,
    libc::SYS_setfsgid,
    libc::SYS_capget,
    libc::SYS_capset,
    // io_uring.
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
];

/// x86_64's legacy calls that glibc still makes in places.
#[cfg(target_arch = "x86_64")]
const LEGACY: &[libc::c_long] = &[
    libc::SYS_poll,
    libc::SYS_epoll_wait,
    libc::SYS_stat,
    libc::SYS_lstat,
    libc::SYS_access,
    libc::SYS_unlink,
    libc::SYS_arch_prctl,
];
#[cfg(not(target_arch = "x86_64"))]
const LEGACY: &[libc::c_long] = &[];

/// Installs the filter on every thread of the process.
pub fn install(mode: Seccomp) -> Result<(), SeccompError> {
    let mismatch = match mode {
        Seccomp::None => return Ok(()),
        Seccomp::Kill => SeccompAction::KillProcess,
        Seccomp::Log => SeccompAction::Log,
        Seccomp::Trap => SeccompAction::Trap,
    };
    let arch = if cfg!(target_arch = "x86_64") {
        TargetArch::x86_64
    } else if cfg!(target_arch = "aarch64") {
        TargetArch::aarch64
    } else {
        return Err(SeccompError::Arch);
    };
    let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> = ALLOWED
        .iter()
        .chain(LEGACY)
        .map(|&s| (s, Vec::new()))
        .collect();
    let filter = SeccompFilter::new(rules, mismatch, SeccompAction::Allow, arch)
        .map_err(SeccompError::Build)?;
    let prog: BpfProgram = filter.try_into().map_err(SeccompError::Compile)?;
    seccompiler::apply_filter_all_threads(&prog).map_err(SeccompError::Install)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    /// Runs only in the child the test below starts: installs the kill
    /// filter, shows that allowed work goes on, then makes a syscall that
    /// is not on the list.
    #[test]
    fn child() {
        if std::env::var_os("FUSEBOX_SECCOMP_CHILD").is_none() {
            return;
        }
        install(Seccomp::Kill).unwrap();
        let t = std::thread::spawn(|| std::fs::read_to_string("/proc/self/status").unwrap());
        assert!(t.join().unwrap().contains("Seccomp:\t2"));
        // The allocator's NUMA query on a multi-node host, made here on
        // any host.
        let (mut cpu, mut node) = (0u32, 0u32);
        // SAFETY: getcpu writes two u32s through valid pointers; the
        // cache argument is unused since Linux 2.6.24 (NULL).
        let r = unsafe {
            libc::syscall(
                libc::SYS_getcpu,
                &mut cpu as *mut u32,
                &mut node as *mut u32,
                std::ptr::null_mut::<libc::c_void>(),
            )
        };
        assert_eq!(r, 0);
        println!("FILTERED-AND-ALIVE");
        // SAFETY: ptrace(PTRACE_TRACEME) has no memory arguments; the
        // filter kills the process before it runs.
        unsafe { libc::syscall(libc::SYS_ptrace, libc::PTRACE_TRACEME, 0, 0, 0) };
        println!("NOT-KILLED");
    }

    #[test]
    fn a_call_outside_the_list_kills_the_daemon() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "seccomp::tests::child",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("FUSEBOX_SECCOMP_CHILD", "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("FILTERED-AND-ALIVE"), "{stdout}");
        assert!(!stdout.contains("NOT-KILLED"), "{stdout}");
        assert_eq!(out.status.signal(), Some(libc::SIGSYS), "{:?}", out.status);
    }
}
