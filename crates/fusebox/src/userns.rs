//! The user namespace of an unprivileged `--sandbox namespace` start, and
//! virtiofsd's `--uid-map` / `--gid-map`, which say what it maps.
//!
//! Without maps, root in the namespace is the starting uid and gid and
//! nothing else: the one mapping a process may write for itself, which it
//! does right after unshare(2) (setgroups denied first, as the kernel
//! requires of an unprivileged gid_map). With maps (say the user's own id
//! as 0 and its subordinate range from /etc/subuid as 1..65536), the
//! privileged helpers newuidmap(1) and newgidmap(1) must write them, from
//! outside the namespace: a helper process forked before unshare(2) waits
//! on a pipe until the daemon is in its new namespace, runs them for the
//! daemon's pid, and reports back; the daemon goes on only once its maps
//! are written. A map that is only the process's own id is written
//! directly, as without maps.

use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::str::FromStr;

/// One line of a uid_map or gid_map: `count` ids from `inside` in the
/// namespace are `outside` on the host. Written `:inside:outside:count:`
/// (any non-alphanumeric delimiter, first and last), as virtiofsd's
/// `--uid-map`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NsIdMap {
    /// First id in the namespace.
    pub inside: u32,
    /// First id on the host.
    pub outside: u32,
    /// How many.
    pub count: u32,
}

/// A `--uid-map` / `--gid-map` value that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NsIdMapError {
    /// Not delimited as `:a:b:c:`.
    #[error("expected :inside:outside:count: (one non-alphanumeric delimiter, first and last)")]
    Form,
    /// A field that is not a u32.
    #[error("{0:?} is not an id or count")]
    Number(String),
    /// count 0, or a range past the last id.
    #[error("the range is empty or runs past 4294967294")]
    Range,
}

impl FromStr for NsIdMap {
    type Err = NsIdMapError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let d = s.chars().last().ok_or(NsIdMapError::Form)?;
        if d.is_alphanumeric() {
            return Err(NsIdMapError::Form);
        }
        let inner = s
            .strip_prefix(d)
            .and_then(|r| r.strip_suffix(d))
            .ok_or(NsIdMapError::Form)?;
        let f: Vec<&str> = inner.split(d).collect();
        let [inside, outside, count] = f[..] else {
            return Err(NsIdMapError::Form);
        };
        let num = |v: &str| {
            v.parse::<u32>()
                .map_err(|_e| NsIdMapError::Number(v.into()))
        };
        let m = NsIdMap {
            inside: num(inside)?,
            outside: num(outside)?,
            count: num(count)?,
        };
        // The kernel's limits: no empty line, no range reaching
        // 4294967295 (the invalid id) on either side.
        let fits = |base: u32| u64::from(base) + u64::from(m.count) <= u64::from(u32::MAX);
        if m.count == 0 || !fits(m.inside) || !fits(m.outside) {
            return Err(NsIdMapError::Range);
        }
        Ok(m)
    }
}

impl fmt::Display for NsIdMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, ":{}:{}:{}:", self.inside, self.outside, self.count)
    }
}

/// Why the namespace's ids could not be mapped.
#[derive(Debug, thiserror::Error)]
pub enum UserNsError {
    /// A system call of the set-up.
    #[error("{0}")]
    Sys(&'static str, #[source] io::Error),
    /// Maps that overlap inside or outside.
    #[error("{0}: ranges overlap")]
    Overlap(&'static str),
    /// newuidmap or newgidmap failed (its own message went to stderr).
    #[error("{0} failed (is it installed, and are the ranges in /etc/subuid or /etc/subgid?)")]
    Helper(&'static str),
    /// A fork asked of a process with other threads (or whose threads
    /// cannot be counted): its child could not safely run Rust code.
    #[error("the set-up forks and must start from one thread; this process has {0:?}")]
    Threads(Option<usize>),
}

/// The threads of this process (None if /proc cannot say).
pub(crate) fn thread_count() -> Option<usize> {
    std::fs::read_dir("/proc/self/task").ok().map(|d| d.count())
}

/// The maps for uids and gids: the given ones, or the process's own id as
/// root when none are given.
pub struct Maps {
    uid: Vec<NsIdMap>,
    gid: Vec<NsIdMap>,
}

impl Maps {
    /// Checks `uid` and `gid` (as given; empty: the process's own id as
    /// 0).
    pub fn new(uid: &[NsIdMap], gid: &[NsIdMap]) -> Result<Maps, UserNsError> {
        let own = |id| {
            vec![NsIdMap {
                inside: 0,
                outside: id,
                count: 1,
            }]
        };
        let pick = |given: &[NsIdMap], id, what| {
            if given.is_empty() {
                return Ok(own(id));
            }
            if overlaps(given) {
                return Err(UserNsError::Overlap(what));
            }
            Ok(given.to_vec())
        };
        // SAFETY: geteuid and getegid have no arguments and cannot fail.
        let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Ok(Maps {
            uid: pick(uid, euid, "--uid-map")?,
            gid: pick(gid, egid, "--gid-map")?,
        })
    }

    /// Whether a map is the process's own id alone, which it may write
    /// itself.
    fn own_only(maps: &[NsIdMap], id: u32) -> bool {
        matches!(maps, [m] if m.outside == id && m.count == 1)
    }

    /// unshare(2)s `flags` (CLONE_NEWUSER among them) and writes the new
    /// user namespace's maps. The process must be single-threaded.
    pub fn unshare(&self, flags: libc::c_int) -> Result<(), UserNsError> {
        // SAFETY: as in `new`.
        let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
        if Self::own_only(&self.uid, euid) && Self::own_only(&self.gid, egid) {
            // SAFETY: unshare has no memory arguments.
            if unsafe { libc::unshare(flags) } < 0 {
                return Err(UserNsError::Sys("unshare", io::Error::last_os_error()));
            }
            return write_own(euid, egid, "self");
        }
        self.unshare_with_helper(flags)
    }

    fn unshare_with_helper(&self, flags: libc::c_int) -> Result<(), UserNsError> {
        let (go_r, go_w) = pipe()?;
        let (done_r, done_w) = pipe()?;
        // SAFETY: getpid has no arguments.
        let me = unsafe { libc::getpid() };
        let threads = thread_count();
        if threads != Some(1) {
            return Err(UserNsError::Threads(threads));
        }
        // SAFETY: the process has one thread (counted just above; only this
        // thread could start another), so the child may run Rust code (it
        // allocates and spawns the helpers).
        let helper = unsafe { libc::fork() };
        if helper < 0 {
            return Err(UserNsError::Sys("fork", io::Error::last_os_error()));
        }
        if helper == 0 {
            drop((go_w, done_r));
            let code = if read_byte(&go_r) == Some(1) {
                self.write_maps_of(me)
            } else {
                // The daemon gave up before unsharing.
                0
            };
            let _ = write_byte(&done_w, code);
            // SAFETY: _exit ends this forked child at once, running nothing
            // of the parent's (no destructors, no atexit handlers).
            unsafe { libc::_exit(0) };
        }
        drop((go_r, done_w));
        let reap = || {
            let mut st = 0;
            // SAFETY: waits for our own child; `st` is a valid out-pointer.
            unsafe { libc::waitpid(helper, &mut st, 0) };
        };
        // SAFETY: unshare has no memory arguments.
        if unsafe { libc::unshare(flags) } < 0 {
            let e = io::Error::last_os_error();
            drop(go_w);
            reap();
            return Err(UserNsError::Sys("unshare", e));
        }
        let sent = write_byte(&go_w, 1);
        let code = read_byte(&done_r);
        reap();
        if !sent {
            return Err(UserNsError::Sys(
                "waking the id map helper",
                io::Error::last_os_error(),
            ));
        }
        match code {
            Some(1) => Ok(()),
            Some(2) => Err(UserNsError::Helper("newuidmap")),
            Some(3) => Err(UserNsError::Helper("newgidmap")),
            _ => Err(UserNsError::Sys(
                "writing the id maps",
                io::Error::from_raw_os_error(libc::EPERM),
            )),
        }
    }

    /// In the helper: writes the maps of `pid` (1: done; 2, 3: newuidmap,
    /// newgidmap failed; 4: a direct write failed).
    fn write_maps_of(&self, pid: libc::pid_t) -> u8 {
        // SAFETY: as in `new`.
        let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let run = |tool: &str, maps: &[NsIdMap]| {
            let mut c = Command::new(tool);
            c.arg(pid.to_string());
            for m in maps {
                c.args([m.inside, m.outside, m.count].map(|v| v.to_string()));
            }
            c.status().is_ok_and(|s| s.success())
        };
        let at = pid.to_string();
        if Self::own_only(&self.uid, euid) {
            if write_own_uid(euid, &at).is_err() {
                return 4;
            }
        } else if !run("newuidmap", &self.uid) {
            return 2;
        }
        if Self::own_only(&self.gid, egid) {
            if write_own_gid(egid, &at).is_err() {
                return 4;
            }
        } else if !run("newgidmap", &self.gid) {
            return 3;
        }
        1
    }
}

/// Whether any two ranges overlap, inside or outside.
fn overlaps(maps: &[NsIdMap]) -> bool {
    let clash = |a: u32, b: u32, n: u32, m: u32| {
        u64::from(a) < u64::from(b) + u64::from(m) && u64::from(b) < u64::from(a) + u64::from(n)
    };
    maps.iter().enumerate().any(|(i, x)| {
        maps[i + 1..].iter().any(|y| {
            clash(x.inside, y.inside, x.count, y.count)
                || clash(x.outside, y.outside, x.count, y.count)
        })
    })
}

fn write_own(uid: u32, gid: u32, pid: &str) -> Result<(), UserNsError> {
    write_own_uid(uid, pid)?;
    write_own_gid(gid, pid)
}

fn write_own_uid(uid: u32, pid: &str) -> Result<(), UserNsError> {
    std::fs::write(format!("/proc/{pid}/uid_map"), format!("0 {uid} 1"))
        .map_err(|e| UserNsError::Sys("writing uid_map", e))
}

/// setgroups denied first: the kernel takes no unprivileged gid_map
/// otherwise.
fn write_own_gid(gid: u32, pid: &str) -> Result<(), UserNsError> {
    std::fs::write(format!("/proc/{pid}/setgroups"), "deny")
        .map_err(|e| UserNsError::Sys("denying setgroups", e))?;
    std::fs::write(format!("/proc/{pid}/gid_map"), format!("0 {gid} 1"))
        .map_err(|e| UserNsError::Sys("writing gid_map", e))
}

fn pipe() -> Result<(OwnedFd, OwnedFd), UserNsError> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(UserNsError::Sys("pipe", io::Error::last_os_error()));
    }
    // SAFETY: both fds were just made and are owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// One byte from `fd`, or None at its end (the writer gone) or on error.
fn read_byte(fd: &OwnedFd) -> Option<u8> {
    let mut b = 0u8;
    loop {
        // SAFETY: reads at most one byte into `b`.
        let n = unsafe { libc::read(fd.as_raw_fd(), (&mut b as *mut u8).cast(), 1) };
        if n == 1 {
            return Some(b);
        }
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return None;
    }
}

fn write_byte(fd: &OwnedFd, b: u8) -> bool {
    // SAFETY: writes one byte from `b`.
    unsafe { libc::write(fd.as_raw_fd(), (&b as *const u8).cast(), 1) == 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_virtiofsds_form() {
        let m: NsIdMap = ":0:1000:1:".parse().unwrap();
        assert_eq!((m.inside, m.outside, m.count), (0, 1000, 1));
        let m: NsIdMap = "/1/100000/65536/".parse().unwrap();
        assert_eq!((m.inside, m.outside, m.count), (1, 100000, 65536));
        assert_eq!(m.to_string(), ":1:100000:65536:");
        for bad in [
            "",
            ":",
            "0:1:1",
            ":0:1:1",
            "0:1:1:",
            "x0x1x1x",
            ":0:1:",
            ":0:1:1:2:",
            ":a:1:1:",
        ] {
            assert!(bad.parse::<NsIdMap>().is_err(), "{bad:?}");
        }
        assert_eq!(":0:1:0:".parse::<NsIdMap>(), Err(NsIdMapError::Range));
        assert_eq!(
            ":4294967295:1:1:".parse::<NsIdMap>(),
            Err(NsIdMapError::Range)
        );
        assert_eq!(
            ":0:4294967290:6:".parse::<NsIdMap>(),
            Err(NsIdMapError::Range)
        );
        assert!(":0:4294967290:5:".parse::<NsIdMap>().is_ok());
    }

    #[test]
    fn overlapping_ranges_are_refused() {
        let m = |s: &str| s.parse::<NsIdMap>().unwrap();
        assert!(!overlaps(&[m(":0:1000:1:"), m(":1:100000:65536:")]));
        assert!(
            overlaps(&[m(":0:1000:2:"), m(":1:100000:65536:")]),
            "inside"
        );
        assert!(
            overlaps(&[m(":0:100000:1:"), m(":1:100000:65536:")]),
            "outside"
        );
        assert!(matches!(
            Maps::new(&[m(":0:1000:2:"), m(":1:5000:2:")], &[]),
            Err(UserNsError::Overlap("--uid-map"))
        ));
    }
}
