//! --modcaps (virtiofsd's `--modcaps` / `-o modcaps=`): which capabilities
//! the serving process keeps.
//!
//! The list is virtiofsd's syntax, `+name:-name:...`, names as in
//! capabilities(7) without `CAP_`, in any case. It modifies virtiofsd's
//! default set — chown, dac_override, fowner, fsetid, setgid, setuid,
//! mknod, setfcap, plus dac_read_search with `--inode-file-handles` and,
//! fusebox's own, ipc_lock with `--fixed-guest-memory` (pinning guest RAM
//! counts against RLIMIT_MEMLOCK otherwise) — and the serving process keeps
//! exactly the result, in every set and on every thread, before the first
//! request. An unknown name, an item without `+`/`-`, an empty item: an
//! error at start. Without --modcaps fusebox keeps the capabilities it was
//! started with (virtiofsd drops to its default set): requests still run
//! with the caller's credentials (`passthrough/src/creds.rs`),
//! which take the file-system capabilities away from every caller but root.

use std::str::FromStr;

/// Capability names, by number (capabilities(7), Linux 6.x).
const NAMES: [&str; 41] = [
    "chown",
    "dac_override",
    "dac_read_search",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "linux_immutable",
    "net_bind_service",
    "net_broadcast",
    "net_admin",
    "net_raw",
    "ipc_lock",
    "ipc_owner",
    "sys_module",
    "sys_rawio",
    "sys_chroot",
    "sys_ptrace",
    "sys_pacct",
    "sys_admin",
    "sys_boot",
    "sys_nice",
    "sys_resource",
    "sys_time",
    "sys_tty_config",
    "mknod",
    "lease",
    "audit_write",
    "audit_control",
    "setfcap",
    "mac_override",
    "mac_admin",
    "syslog",
    "wake_alarm",
    "block_suspend",
    "audit_read",
    "perfmon",
    "bpf",
    "checkpoint_restore",
];

/// The bit of capability `name` (lower case, no `cap_`).
fn bit(name: &str) -> Option<u64> {
    NAMES.iter().position(|n| *n == name).map(|i| 1u64 << i)
}

/// virtiofsd's default set.
fn default_set() -> u64 {
    [
        "chown",
        "dac_override",
        "fowner",
        "fsetid",
        "setgid",
        "setuid",
        "mknod",
        "setfcap",
    ]
    .iter()
    .filter_map(|n| bit(n))
    .fold(0, |a, b| a | b)
}

/// CAP_DAC_READ_SEARCH.
pub const DAC_READ_SEARCH: u64 = 1 << 2;
/// CAP_IPC_LOCK.
pub const IPC_LOCK: u64 = 1 << 14;
/// CAP_SETGID.
pub const SETGID: u64 = 1 << 6;
/// CAP_SETUID.
pub const SETUID: u64 = 1 << 7;

/// A --modcaps list that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModCapsError {
    /// `::`, a leading or trailing `:`, or nothing at all.
    #[error("empty item: expected (+|-)capability[:(+|-)capability...]")]
    Empty,
    /// An item that starts with neither `+` nor `-`.
    #[error("{0:?}: an item starts with + (keep) or - (drop)")]
    Action(String),
    /// A name capabilities(7) does not know.
    #[error("unknown capability {0:?}")]
    Unknown(String),
}

/// A parsed --modcaps list: the capabilities it adds to and takes from
/// the default set (a later item overrides an earlier one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ModCaps {
    /// `+name`.
    pub add: u64,
    /// `-name`.
    pub drop: u64,
}

impl FromStr for ModCaps {
    type Err = ModCapsError;
    fn from_str(s: &str) -> Result<ModCaps, ModCapsError> {
        let mut m = ModCaps::default();
        for item in s.split(':') {
            let mut chars = item.chars();
            let keep = match chars.next().ok_or(ModCapsError::Empty)? {
                '+' => true,
                '-' => false,
                _ => return Err(ModCapsError::Action(item.into())),
            };
            let name = chars.as_str().to_ascii_lowercase();
            let b = bit(&name).ok_or(ModCapsError::Unknown(name))?;
            if keep {
                m.add |= b;
                m.drop &= !b;
            } else {
                m.drop |= b;
                m.add &= !b;
            }
        }
        Ok(m)
    }
}

/// Why the capabilities could not be set.
#[derive(Debug, thiserror::Error)]
pub enum CapsError {
    /// --modcaps takes away one that an option in force needs.
    #[error("--modcaps: {0} needs CAP_{1}")]
    Needed(&'static str, &'static str),
    /// A syscall failed.
    #[error("--modcaps: {0}")]
    Sys(&'static str, #[source] std::io::Error),
}

/// What else the serving process needs on top of virtiofsd's default set.
#[derive(Debug, Clone, Copy, Default)]
pub struct Needs {
    /// Inode file handles are in use (open_by_handle_at).
    pub file_handles: bool,
    /// --fixed-guest-memory (guest RAM pinned as io_uring buffers).
    pub fixed_memory: bool,
    /// Requests run as their callers (the serving threads switch their
    /// fsuid, fsgid and groups: CAP_SETUID and CAP_SETGID).
    pub creds: bool,
}

impl ModCaps {
    /// The capabilities kept: the default set, what `needs` adds, then
    /// this list. Err if the list drops one an option in force needs.
    pub fn kept(&self, needs: Needs) -> Result<u64, CapsError> {
        let mut base = default_set();
        if needs.file_handles {
            if self.drop & DAC_READ_SEARCH != 0 {
                return Err(CapsError::Needed(
                    "--inode-file-handles or --migration-mode file-handles (file handles are opened)",
                    "DAC_READ_SEARCH",
                ));
            }
            base |= DAC_READ_SEARCH;
        }
        if needs.fixed_memory {
            base |= IPC_LOCK;
        }
        if needs.creds {
            for (bit, name) in [(SETUID, "SETUID"), (SETGID, "SETGID")] {
                if self.drop & bit != 0 {
                    return Err(CapsError::Needed(
                        "running each request as its caller (every serving thread switches \
                         its fsuid, fsgid and groups)",
                        name,
                    ));
                }
            }
        }
        Ok((base | self.add) & !self.drop)
    }
}

fn last_os(what: &'static str) -> CapsError {
    CapsError::Sys(what, std::io::Error::last_os_error())
}

/// Leaves the calling thread only `kept`: out of the bounding set first
/// (that needs CAP_SETPCAP, which may be among those going), the ambient
/// set cleared, then effective and permitted set to what of `kept` the
/// thread has, inheritable emptied. Threads made afterwards inherit it;
/// threads that exist already keep theirs (call it on each).
pub fn keep_only(kept: u64) -> Result<(), CapsError> {
    // Without CAP_SETPCAP (started unprivileged, no user namespace) the
    // bounding set cannot shrink; such a process has no capabilities to
    // use and execs nothing that could regain them.
    let [effective, ..] = capget()?;
    let setpcap = effective & (1 << 8) != 0;
    // Every number a capability set can hold: the kernel answers EINVAL
    // past its last one. (Not /proc/sys/kernel/cap_last_cap: after the
    // sandbox, /proc is the shared directory's, which the guest writes.)
    for cap in 0..64u32 {
        if !setpcap || kept & (1u64 << cap) != 0 {
            continue;
        }
        // SAFETY: prctl with integer arguments.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        // EINVAL: a capability this kernel does not have.
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return Err(last_os("dropping from the bounding set"));
        }
    }
    // SAFETY: prctl with integer arguments.
    let r = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if r < 0 {
        return Err(last_os("clearing the ambient set"));
    }
    let [_, permitted, _] = capget()?;
    let now = permitted & kept;
    capset([now, now, 0])
}

/// The calling thread's capability sets: effective, permitted,
/// inheritable.
pub fn capget() -> Result<[u64; 3], CapsError> {
    let mut hdr = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: a v3 header and room for the two data words it fills.
    if unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) } < 0 {
        return Err(last_os("capget"));
    }
    let join = |f: fn(&CapData) -> u32| u64::from(f(&data[0])) | (u64::from(f(&data[1])) << 32);
    Ok([
        join(|d| d.effective),
        join(|d| d.permitted),
        join(|d| d.inheritable),
    ])
}

fn capset(sets: [u64; 3]) -> Result<(), CapsError> {
    let mut hdr = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    let word = |i: usize| CapData {
        effective: (sets[0] >> (32 * i)) as u32,
        permitted: (sets[1] >> (32 * i)) as u32,
        inheritable: (sets[2] >> (32 * i)) as u32,
    };
    let data = [word(0), word(1)];
    // SAFETY: a v3 header and the two data words it reads.
    if unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) } < 0 {
        return Err(last_os("capset"));
    }
    Ok(())
}

const CAP_V3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}
const _: () = assert!(std::mem::size_of::<CapHeader>() == 8);

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}
const _: () = assert!(std::mem::size_of::<CapData>() == 12);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_as_virtiofsd_reads_them() {
        let m: ModCaps = "+sys_admin:-chown".parse().unwrap();
        assert_eq!(m.add, 1 << 21);
        assert_eq!(m.drop, 1);
        // Any case; a later item wins.
        let m: ModCaps = "-MKNOD:+Mknod".parse().unwrap();
        assert_eq!((m.add, m.drop), (1 << 27, 0));
        let kept = "-chown:+sys_admin"
            .parse::<ModCaps>()
            .unwrap()
            .kept(Needs::default())
            .unwrap();
        assert_eq!(kept & 1, 0);
        assert_ne!(kept & (1 << 21), 0);
        assert_eq!(kept & !(1 << 21), default_set() & !1);
    }

    #[test]
    fn bad_lists_are_errors() {
        for (s, e) in [
            ("", ModCapsError::Empty),
            ("+chown:", ModCapsError::Empty),
            ("chown", ModCapsError::Action("chown".into())),
            ("+cap_chown", ModCapsError::Unknown("cap_chown".into())),
            ("-nosuch", ModCapsError::Unknown("nosuch".into())),
            ("+", ModCapsError::Unknown(String::new())),
        ] {
            assert_eq!(s.parse::<ModCaps>().unwrap_err(), e, "{s:?}");
        }
    }

    #[test]
    fn options_in_force_add_what_they_need() {
        let none = ModCaps::default();
        let fh = Needs {
            file_handles: true,
            ..Needs::default()
        };
        assert_ne!(none.kept(fh).unwrap() & DAC_READ_SEARCH, 0);
        let m: ModCaps = "-dac_read_search".parse().unwrap();
        assert!(m.kept(fh).is_err());
        assert_eq!(m.kept(Needs::default()).unwrap() & DAC_READ_SEARCH, 0);
        let pinned = Needs {
            fixed_memory: true,
            ..Needs::default()
        };
        assert_ne!(none.kept(pinned).unwrap() & IPC_LOCK, 0);
        // Requests run as their callers: setuid and setgid stay.
        let creds = Needs {
            creds: true,
            ..Needs::default()
        };
        for drop in ["-setuid", "-setgid", "-setgid:-mknod"] {
            let m: ModCaps = drop.parse().unwrap();
            assert!(m.kept(creds).is_err(), "{drop}");
            assert!(m.kept(Needs::default()).is_ok(), "{drop}");
        }
        assert_eq!(SETUID, bit("setuid").unwrap());
        assert_eq!(SETGID, bit("setgid").unwrap());
    }
}
