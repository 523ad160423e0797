//! The host's side of FUSE-over-io_uring: the fuse module's switch that
//! turns it on, the kernel's queue count (one per possible CPU), and
//! pinning a serving thread to its queue's CPU.

use super::KernelUringError;

/// Sets `/sys/module/fuse/parameters/enable_uring` (before the mount's
/// INIT, which offers FUSE_OVER_IO_URING only when it is on).
pub fn enable() -> Result<(), KernelUringError> {
    const P: &str = "/sys/module/fuse/parameters/enable_uring";
    if std::fs::read_to_string(P).is_ok_and(|v| v.trim() == "Y") {
        return Ok(());
    }
    std::fs::write(P, "Y").map_err(KernelUringError::Enable)
}

/// Pins the calling thread to `cpu` (the kernel queues a request on the
/// queue of the CPU that submitted it; serving it there avoids a
/// cross-CPU wake-up, and
/// [`KernelQueue::nudge`](super::KernelQueue::nudge) reaches only the
/// queue of the CPU it runs on). False when that is refused: a CPU
/// outside the daemon's cpuset (a container's, systemd's AllowedCPUs).
pub fn pin_to_cpu(cpu: usize) -> bool {
    if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return false;
    }
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes inside it
    // (cpu is checked against its size above) and sched_setaffinity reads
    // it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// The kernel's queue count: one per possible CPU.
pub fn possible_cpus() -> usize {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    let max = s
        .trim()
        .split(',')
        .filter_map(|r| r.rsplit('-').next()?.parse::<usize>().ok())
        .max();
    max.map_or(1, |m| m + 1)
}
