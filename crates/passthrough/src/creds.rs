//! Per-request credentials: the worker thread takes the caller's fsuid,
//! fsgid and supplementary groups for the duration of one operation, so the
//! host kernel makes every ownership and permission decision exactly as it
//! would for the caller on a local filesystem: a caller whose host uid
//! is not 0 keeps none of the daemon's capabilities (see [`Cred`]), and
//! what allocates or changes file data (WRITE, FALLOCATE, COPY_FILE_RANGE)
//! runs without CAP_SYS_RESOURCE, a root caller's too ([`Caps::Data`]).
//!
//! The raw syscalls change only the calling thread. io_uring takes the
//! submitter's credentials with each op (issued inline in io_uring_enter,
//! or captured when punted to io-wq), and every data op served synchronously is
//! waited for before the call returns, so ops submitted under a
//! [`CredGuard`] run as the caller. A started op, submitted later, carries
//! its credentials in a registered personality (`started/write.rs`).

use fuse_core::server::Ctx;
use fuse_core::Errno;
use host_io::sys::thread;
use std::cell::Cell;

/// Where a caller's supplementary groups come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Groups {
    /// None read from the host (a guest's pid means nothing there): the
    /// caller's gid counts, and the groups its request's extension names
    /// (FUSE_EXT_GROUPS, with a creating request), as with virtiofsd.
    #[default]
    None,
    /// `/proc/<pid>/status` of the caller (host mounts: the caller is a
    /// host process).
    Proc,
}

/// Set when this process may not change its supplementary groups: in an
/// unprivileged user namespace whose setgroups is "deny" (the kernel's
/// price for a gid_map written without privilege). Calls then keep the
/// thread's own groups, since setgroups would fail every one of them.
static GROUPS_LOCKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Reads whether setgroups is denied to this process (before any
/// sandbox hides /proc; see [`GROUPS_LOCKED`]).
pub(super) fn probe_groups_locked() {
    if std::fs::read("/proc/self/setgroups").is_ok_and(|v| v.starts_with(b"deny")) {
        GROUPS_LOCKED.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

thread_local! {
    static UNSHARED: Cell<bool> = const { Cell::new(false) };
    /// Capabilities this thread had before the innermost [`CredGuard`]
    /// lowered them.
    static LOWERED: Cell<Option<[u64; 3]>> = const { Cell::new(None) };
    /// This thread's own fsuid, fsgid and capability sets outside any
    /// guard, read by its first guard (None again after giving them back
    /// failed, so the next guard reads what the thread really has).
    static OWN: Cell<Option<Own>> = const { Cell::new(None) };
    /// This thread's own supplementary groups (read on first use).
    static OWN_GROUPS: std::cell::OnceCell<Vec<u32>> = const { std::cell::OnceCell::new() };
    /// Set when giving the thread its own groups back failed: until a
    /// setgroups succeeds, its groups are unknown and always set.
    static GROUPS_UNKNOWN: Cell<bool> = const { Cell::new(false) };
    /// [`CredGuard`]s alive on this thread (outside all of them the thread
    /// has exactly [`OWN`]).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// A thread's credentials outside any guard.
#[derive(Debug, Clone, Copy)]
struct Own {
    fsuid: u32,
    fsgid: u32,
    caps: [u64; 3],
}

/// This thread's [`Own`] (read with three syscalls the first time).
fn own() -> Result<Own, Errno> {
    if let Some(o) = OWN.with(Cell::get) {
        return Ok(o);
    }
    if DEPTH.with(Cell::get) > 0 {
        // Forgotten by a failed restore inside a guard: what the thread
        // has now is a caller's, not its own. Fail closed until the outer
        // guards are gone.
        return Err(Errno::EPERM);
    }
    // u32::MAX (-1) is no valid id: the calls only report the current one.
    let o = Own {
        fsuid: thread::setfsuid(u32::MAX),
        fsgid: thread::setfsgid(u32::MAX),
        caps: thread::capget()?,
    };
    OWN.with(|c| c.set(Some(o)));
    Ok(o)
}

/// CAP_FSETID: a write keeps setuid/setgid.
const CAP_FSETID: u64 = 1 << 4;
/// CAP_DAC_READ_SEARCH.
const CAP_DAC_READ_SEARCH: u64 = 1 << 2;
/// CAP_SYS_RESOURCE: past quota hard limits and ext4's reserved blocks.
const CAP_SYS_RESOURCE: u64 = 1 << 24;

/// A caller's credentials on the host, its supplementary groups read
/// once: what a handle keeps of its opener. Capabilities follow the host
/// uid: a request that runs as fsuid 0 keeps the daemon's (as [`Caps`]
/// allows), one that runs as any other uid none, as a host process of
/// that uid, whatever uid it had in the request (a guest's root
/// translated to host uid 100000 has no more power on the share than that
/// host user; a guest user translated to host uid 0 is root there).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Cred {
    /// fsuid.
    pub uid: u32,
    /// fsgid.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Cred {
    /// `ctx`'s credentials (untranslated), with its groups from `groups`:
    /// with [`Groups::None`] the ones the request's extension names
    /// (`Ctx::groups`, FUSE_EXT_GROUPS), if any.
    pub fn of(ctx: &Ctx, groups: Groups) -> Cred {
        Cred {
            uid: ctx.uid,
            gid: ctx.gid,
            groups: match groups {
                Groups::None => ctx.groups.iter().collect(),
                Groups::Proc => proc_groups(ctx.pid).unwrap_or_default(),
            },
        }
    }

    /// Whether the request runs as root on the host (fsuid 0), and so
    /// keeps the daemon's capabilities.
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }
}

/// The capabilities a [`CredGuard`] leaves effective, of the thread's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Caps {
    /// As a local process of the caller's host uid: fsuid 0
    /// ([`Cred::is_root`]) keeps all of them, any other none (setfsuid
    /// drops only the file-system ones; CAP_SYS_ADMIN would still let it
    /// set `trusted.*` xattrs, CAP_SYS_RESOURCE ignore quotas, CAP_MKNOD
    /// make device nodes).
    Caller,
    /// An operation that allocates or changes file data (WRITE, FALLOCATE,
    /// COPY_FILE_RANGE): as [`Caps::Caller`], but never CAP_SYS_RESOURCE,
    /// root included (a guest's root is not the host's), so quota hard
    /// limits bind. ext4 still grants its root-reserved blocks to fsuid 0
    /// by rule (resuid, or a member of resgid), without the capability.
    /// With `kill_suidgid` (FUSE_WRITE_KILL_SUIDGID: the writer lacks
    /// CAP_FSETID) also never CAP_FSETID, so the host write clears
    /// setuid/setgid for a root caller too.
    Data {
        /// Drop CAP_FSETID.
        kill_suidgid: bool,
    },
    /// Only these of the thread's own.
    Only(u64),
}

impl Caps {
    /// [`Caps::Data`] for an operation that only allocates (FALLOCATE,
    /// COPY_FILE_RANGE).
    pub const ALLOCATE: Caps = Caps::Data {
        kill_suidgid: false,
    };

    /// The effective set for a caller (`root`: [`Cred::is_root`]), of the
    /// thread's own `eff`.
    fn effective(self, root: bool, eff: u64) -> u64 {
        let caller = if root { eff } else { 0 };
        match self {
            Caps::Caller => caller,
            Caps::Data { kill_suidgid } => {
                let fsetid = if kill_suidgid { CAP_FSETID } else { 0 };
                caller & !CAP_SYS_RESOURCE & !fsetid
            }
            Caps::Only(mask) => eff & mask,
        }
    }
}

/// Runs `f` with CAP_DAC_READ_SEARCH raised if a [`CredGuard`] lowered it
/// on this thread (open_by_handle_at needs it; it opens O_PATH only, so no
/// permission the caller lacks is used on the file itself).
pub fn with_dac_read_search<T>(f: impl FnOnce() -> T) -> T {
    match LOWERED.with(Cell::get) {
        Some(saved) if saved[1] & CAP_DAC_READ_SEARCH != 0 => {
            let now = thread::capget().unwrap_or(saved);
            let raised = thread::capset([now[0] | CAP_DAC_READ_SEARCH, now[1], now[2]]).is_ok();
            let r = f();
            if raised {
                let _ = thread::capset(now);
            }
            r
        }
        _ => f(),
    }
}

/// The fsuid, fsgid of [`as_io_delegate`]: the overflow id, "nobody".
const DELEGATE_ID: u32 = 65534;
/// CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER, CAP_SYS_ADMIN.
const DELEGATE_CAPS: u64 = (1 << 1) | (1 << 2) | (1 << 3) | (1 << 21);

/// Runs `f` (the FUSE_DEV_IOC_BACKING_OPEN ioctl) with the credentials the
/// kernel should keep for passthrough I/O: fsuid and fsgid "nobody", no
/// supplementary groups, and of the daemon's capabilities only
/// CAP_SYS_ADMIN (the ioctl needs it), CAP_DAC_OVERRIDE and
/// CAP_DAC_READ_SEARCH (the kernel opens the backing file again, with the
/// client file's flags, after the daemon's open as the caller allowed it)
/// and CAP_FOWNER (that open may carry O_NOATIME). So no writer gets
/// CAP_FSETID (a write clears setuid), CAP_SYS_RESOURCE (quotas) or
/// fsuid 0 (ext4's and f2fs's root-reserved blocks). Err if the
/// credentials could not be set; `f` has not run then.
pub fn as_io_delegate<T>(f: impl FnOnce() -> T) -> Result<T, Errno> {
    let me = Cred {
        uid: DELEGATE_ID,
        gid: DELEGATE_ID,
        groups: Vec::new(),
    };
    let guard = CredGuard::enter(&me, Caps::Only(DELEGATE_CAPS))?;
    let r = f();
    drop(guard);
    Ok(r)
}

/// Gives the calling thread its own umask (once per thread).
pub fn private_umask(mask: u32) -> Result<UmaskGuard, Errno> {
    if !UNSHARED.with(Cell::get) {
        thread::unshare_fs()?;
        UNSHARED.with(|u| u.set(true));
    }
    Ok(UmaskGuard(thread::umask(mask & 0o777)))
}

/// Restores the thread's umask on drop.
#[derive(Debug)]
pub struct UmaskGuard(u32);

impl Drop for UmaskGuard {
    fn drop(&mut self) {
        thread::umask(self.0);
    }
}

/// A caller's credentials in force on this thread until dropped: fsuid,
/// fsgid, supplementary groups and the capabilities [`Caps`] leaves.
///
/// Only what differs from the thread's own is changed (a thread outside
/// every guard has its own credentials, read once): a root caller on a
/// root daemon's thread costs no setfsuid/setfsgid, and capabilities are
/// set only when the rule takes some away.
#[derive(Debug)]
pub struct CredGuard {
    /// fsuid, fsgid to set back, if they were changed.
    ids: Option<(u32, u32)>,
    /// Groups to set back, if they were changed.
    groups: Option<Vec<u32>>,
    /// Capability sets to set back, if they were changed: the ones before
    /// this guard, and the thread's own (which the restore starts from).
    caps: Option<([u64; 3], [u64; 3])>,
    /// [`LOWERED`] before this guard.
    lowered: Option<[u64; 3]>,
    /// Counted in [`DEPTH`] (every guard but [`CredGuard::none`]).
    counted: bool,
}

impl CredGuard {
    /// A guard that changes nothing (credential switching is off).
    pub fn none() -> CredGuard {
        CredGuard {
            ids: None,
            groups: None,
            caps: None,
            lowered: None,
            counted: false,
        }
    }

    /// Switches to `cred` with the capabilities `rule` leaves.
    pub fn enter(cred: &Cred, rule: Caps) -> Result<CredGuard, Errno> {
        // Outside every guard the thread has its own credentials, so only
        // the differences need syscalls. Inside another guard (nesting)
        // everything is set: the thread's own capabilities first (the
        // outer guard may have lowered CAP_SETUID and CAP_SETGID), and the
        // current values are what is restored.
        let nested = DEPTH.with(Cell::get) > 0;
        let own = own()?;
        let mut g = CredGuard {
            ids: None,
            groups: None,
            caps: None,
            lowered: LOWERED.with(Cell::get),
            counted: true,
        };
        DEPTH.with(|d| d.set(d.get() + 1));
        if nested {
            let before = thread::capget()?;
            thread::capset(own.caps)?;
            g.caps = Some((before, own.caps));
        }
        let locked = GROUPS_LOCKED.load(std::sync::atomic::Ordering::Relaxed);
        g.groups = OWN_GROUPS.with(|o| -> Result<_, Errno> {
            if locked {
                return Ok(None);
            }
            let mine = o.get_or_init(thread::getgroups);
            if !nested && same_groups(&cred.groups, mine) && !GROUPS_UNKNOWN.with(Cell::get) {
                return Ok(None);
            }
            let back = if nested {
                thread::getgroups()
            } else {
                mine.clone()
            };
            thread::setgroups(&cred.groups)?;
            GROUPS_UNKNOWN.with(|u| u.set(false));
            Ok(Some(back))
        })?;
        if nested || cred.uid != own.fsuid || cred.gid != own.fsgid {
            let old_gid = thread::setfsgid(cred.gid);
            let old_uid = thread::setfsuid(cred.uid);
            g.ids = Some((old_uid, old_gid));
            // setfsuid reports no errors (an id unmapped in the daemon's
            // user namespace is ignored): read the value back.
            if thread::setfsuid(u32::MAX) != cred.uid || thread::setfsgid(u32::MAX) != cred.gid {
                return Err(Errno::EPERM);
            }
        }
        let eff = rule.effective(cred.is_root(), own.caps[0]);
        // A root caller on a thread whose fsuid is root kept every
        // capability through setfsuid: nothing to set unless the rule
        // takes some away. Otherwise setfsuid changed the file-system ones.
        let unchanged = !nested && cred.uid == 0 && own.fsuid == 0 && eff == own.caps[0];
        if !unchanged {
            let before = g.caps.map_or(own.caps, |c| c.0);
            g.caps = Some((before, own.caps));
            thread::capset([eff, own.caps[1], own.caps[2]])?;
            LOWERED.with(|l| l.set(Some(own.caps)));
        }
        Ok(g)
    }
}

/// Whether two group lists are the same. Empty lists are compared by
/// length alone: `==` would call memcmp with a length of 0 on their
/// dangling pointers, and glibc's AVX-512 memcmp then makes a masked load
/// from an unmapped page, which the CPU resolves in a slow microcode
/// assist on every request.
fn same_groups(a: &[u32], b: &[u32]) -> bool {
    a.len() == b.len() && (a.is_empty() || a == b)
}

/// The capabilities setfsuid drops when the fsuid leaves 0 and raises
/// (from the permitted set) when it comes back (the kernel's CAP_FS_SET:
/// CHOWN, DAC_OVERRIDE, DAC_READ_SEARCH, FOWNER, FSETID, LINUX_IMMUTABLE,
/// MKNOD, MAC_OVERRIDE).
const CAP_FS_SET: u64 = 0x1f | (1 << 9) | (1 << 27) | (1 << 32);

impl Drop for CredGuard {
    fn drop(&mut self) {
        // The thread's own capabilities first: setfsuid back to an id not
        // the thread's own (nesting) needs CAP_SETUID, setgroups
        // CAP_SETGID. Outside a nested guard that is all that is needed.
        if let Some((_, own)) = self.caps {
            if let Err(e) = thread::capset(own) {
                // The thread keeps fewer capabilities than it had: later
                // calls may fail, none gains anything. The next guard
                // reads what it has.
                log::error!("restoring a worker's capabilities: {e}");
                OWN.with(|o| o.set(None));
            }
        }
        // What the effective set is after the fsuid is back: crossing 0
        // changes the file-system capabilities.
        let mut eff = self.caps.map(|(_, own)| own[0]);
        if let Some((uid, gid)) = self.ids.take() {
            let left = thread::setfsuid(uid);
            thread::setfsgid(gid);
            if let (Some(e), Some((_, own))) = (eff.as_mut(), self.caps) {
                if left != 0 && uid == 0 {
                    *e |= own[1] & CAP_FS_SET;
                } else if left == 0 && uid != 0 {
                    *e &= !CAP_FS_SET;
                }
            }
        }
        if let Some(groups) = self.groups.take() {
            if thread::setgroups(&groups).is_err() {
                // Fail closed: the next switch sets groups even when
                // the caller's look like the thread's own.
                GROUPS_UNKNOWN.with(|u| u.set(true));
            }
        }
        if let Some((before, own)) = self.caps.take() {
            if before != own || eff != Some(before[0]) {
                let _ = thread::capset(before);
            }
            LOWERED.with(|l| l.set(self.lowered));
        }
        if self.counted {
            DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
        }
    }
}

/// The supplementary groups of `pid` from `/proc/<pid>/status`.
fn proc_groups(pid: u32) -> Option<Vec<u32>> {
    if pid == 0 {
        return None;
    }
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("Groups:"))?;
    Some(
        line["Groups:".len()..]
            .split_whitespace()
            .filter_map(|g| g.parse().ok())
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// fsuid, fsgid, capability sets and groups of this thread now.
    fn now() -> (u32, u32, [u64; 3], Vec<u32>) {
        (
            thread::setfsuid(u32::MAX),
            thread::setfsgid(u32::MAX),
            thread::capget().unwrap(),
            thread::getgroups(),
        )
    }

    fn cred(uid: u32, groups: &[u32]) -> Cred {
        Cred {
            uid,
            gid: uid,
            groups: groups.to_vec(),
        }
    }

    /// Runs `f` on a new thread (guards keep per-thread state).
    fn on_thread(f: impl FnOnce() + Send + 'static) {
        std::thread::spawn(f).join().unwrap();
    }

    #[test]
    fn group_lists_compare_by_length_then_members() {
        assert!(same_groups(&[], &[]));
        assert!(same_groups(&[5, 7], &[5, 7]));
        assert!(!same_groups(&[], &[0]));
        assert!(!same_groups(&[5, 7], &[7, 5]));
    }

    #[test]
    fn guards_set_the_rule_and_give_everything_back() {
        on_thread(|| {
            let mine = now();
            assert_eq!(mine.0, 0, "tests run as root");
            {
                let _g = CredGuard::enter(&cred(1000, &[5]), Caps::Caller).unwrap();
                let (u, g, caps, groups) = now();
                assert_eq!((u, g, caps[0], groups), (1000, 1000, 0, vec![5]));
            }
            assert_eq!(now(), mine);
            {
                let _g =
                    CredGuard::enter(&cred(0, &[]), Caps::Data { kill_suidgid: true }).unwrap();
                let caps = now().2;
                assert_eq!(caps[0], mine.2[0] & !CAP_SYS_RESOURCE & !CAP_FSETID);
                assert_eq!(caps[1], mine.2[1], "the permitted set stays");
            }
            assert_eq!(now(), mine);
        });
    }

    #[test]
    fn capabilities_follow_the_host_uid_the_request_runs_as() {
        // Whatever uid the request had before translation: fsuid 0 keeps
        // the thread's capabilities, any other uid none, under every rule
        // but an explicit `Only`.
        on_thread(|| {
            let mine = now();
            assert_ne!(mine.2[0], 0, "tests run with capabilities");
            for rule in [
                Caps::Caller,
                Caps::ALLOCATE,
                Caps::Data { kill_suidgid: true },
            ] {
                {
                    let _g = CredGuard::enter(&cred(100000, &[]), rule).unwrap();
                    let (u, g, caps, _) = now();
                    assert_eq!((u, g, caps[0]), (100000, 100000, 0), "{rule:?}");
                    assert_eq!(caps[1], mine.2[1], "the permitted set stays");
                }
                assert_eq!(now(), mine);
            }
            {
                let _g = CredGuard::enter(&cred(0, &[]), Caps::Caller).unwrap();
                assert_eq!(now().2[0], mine.2[0]);
            }
            assert_eq!(now(), mine);
            {
                let _g = CredGuard::enter(&cred(100000, &[]), Caps::Only(CAP_FSETID)).unwrap();
                assert_eq!(now().2[0], mine.2[0] & CAP_FSETID);
            }
            assert_eq!(now(), mine);
        });
    }

    #[test]
    fn a_guests_groups_come_from_its_request_a_hosts_from_proc() {
        let gids = fuse_core::abi::encode::groups_ext(&[5, 7]);
        let groups = fuse_core::abi::supplementary_groups(&gids)
            .unwrap()
            .unwrap();
        let ctx = Ctx {
            uid: 1000,
            gid: 1000,
            pid: std::process::id(),
            groups,
            ..Default::default()
        };
        assert_eq!(Cred::of(&ctx, Groups::None).groups, [5, 7]);
        assert_eq!(
            Cred::of(&ctx, Groups::Proc).groups,
            proc_groups(std::process::id()).unwrap()
        );
    }

    #[test]
    fn a_nested_guard_gives_back_the_outer_ones_credentials() {
        on_thread(|| {
            let mine = now();
            {
                let _outer = CredGuard::enter(&cred(1000, &[5]), Caps::Caller).unwrap();
                let outer = now();
                {
                    let _inner = CredGuard::enter(&cred(0, &[]), Caps::Caller).unwrap();
                    let (u, _, caps, groups) = now();
                    assert_eq!((u, caps, groups), (0, mine.2, vec![]));
                }
                assert_eq!(now(), outer);
            }
            assert_eq!(now(), mine);
        });
    }
}
