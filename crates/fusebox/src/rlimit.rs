//! The fd limit, as virtiofsd sets it: at start the soft RLIMIT_NOFILE is
//! raised to `--rlimit-nofile` (by default the kernel's `nr_open`, at most
//! 1,000,000), lifting the hard limit too where the daemon may
//! (CAP_SYS_RESOURCE) and otherwise stopping at it. The passthrough then
//! gets what is in force minus a reserve for the daemon's own fds (the
//! vhost-user connection's memory regions and eventfds, epolls, io_urings,
//! logs), so a guest that opens without end is told EMFILE by the
//! passthrough while the connection can still receive fds.

use std::io;

/// Why the limit could not be set.
#[derive(Debug, thiserror::Error)]
pub enum RlimitError {
    /// getrlimit or setrlimit failed.
    #[error("RLIMIT_NOFILE: {0}")]
    Sys(&'static str, #[source] io::Error),
}

/// The most virtiofsd asks for by default.
const DEFAULT_MAX: u64 = 1_000_000;

/// What the kernel allows any process (`/proc/sys/fs/nr_open`).
fn nr_open() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1 << 20)
}

fn get() -> Result<libc::rlimit, RlimitError> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid out-pointer for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } < 0 {
        return Err(RlimitError::Sys("getrlimit", io::Error::last_os_error()));
    }
    Ok(r)
}

fn set(cur: u64, max: u64) -> io::Result<()> {
    let r = libc::rlimit {
        rlim_cur: cur,
        rlim_max: max,
    };
    // SAFETY: `r` is a valid rlimit read by the call.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The fd limit after [`raise`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoFile {
    /// The soft limit in force.
    pub soft: u64,
    /// What was asked for (after the default and `nr_open` applied).
    pub wanted: u64,
}

/// Raises the soft fd limit towards `wanted` (`None`: the default,
/// `Some(0)`: leave it as it is); never lowers it.
pub fn raise(wanted: Option<u64>) -> Result<NoFile, RlimitError> {
    let now = get()?;
    let wanted = match wanted {
        Some(0) => {
            return Ok(NoFile {
                soft: now.rlim_cur,
                wanted: now.rlim_cur,
            })
        }
        Some(n) => n.min(nr_open()),
        None => DEFAULT_MAX.min(nr_open()),
    };
    if now.rlim_cur >= wanted {
        return Ok(NoFile {
            soft: now.rlim_cur,
            wanted,
        });
    }
    let soft = if now.rlim_max >= wanted {
        set(wanted, now.rlim_max).map_err(|e| RlimitError::Sys("setrlimit", e))?;
        wanted
    } else {
        match set(wanted, wanted) {
            Ok(()) => wanted,
            // Without CAP_SYS_RESOURCE the hard limit is as far as it goes.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                set(now.rlim_max, now.rlim_max).map_err(|e| RlimitError::Sys("setrlimit", e))?;
                now.rlim_max
            }
            Err(e) => return Err(RlimitError::Sys("setrlimit", e)),
        }
    };
    Ok(NoFile { soft, wanted })
}

/// Fds kept back from the passthrough for the daemon itself, for a limit
/// of `soft` and `queues` request queues: vhost-user memory regions (up to
/// 509 slots, one fd each), per vring its kick, call and error eventfds,
/// per vring thread its epoll and exit events, per serving thread an
/// io_uring, and a margin. Never more than half the limit.
pub fn reserve(soft: u64, queues: u64) -> u64 {
    let want = 512 + 16 * (queues + 1) + 64;
    want.min(soft / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_bounded_by_half_the_limit() {
        assert_eq!(reserve(1024, 1), 512);
        assert_eq!(reserve(20_000, 1), 608);
        assert_eq!(reserve(20_000, 63), 512 + 16 * 64 + 64);
    }
}
