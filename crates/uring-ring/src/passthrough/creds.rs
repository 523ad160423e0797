//! Per-request credentials: the worker thread takes the caller's fsuid,
//! fsgid and supplementary groups for the duration of one operation, so the
//! host kernel makes every ownership and permission decision exactly as it
//! would for the caller on a local filesystem (including the loss of
//! CAP_DAC_OVERRIDE, CAP_FOWNER and CAP_FSETID when the caller is not root).
//!
//! The raw syscalls change only the calling thread. io_uring captures the
//! submitter's credentials when it hands an op to a worker, so ops
//! submitted under a [`CredGuard`] run as the caller too.

use super::sys::thread;
use fuse_core::server::Ctx;
use fuse_core::Errno;
use std::cell::Cell;

/// Where a caller's supplementary groups come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Groups {
    /// None: only the caller's gid counts (a guest's pid means nothing on
    /// the host; this is virtiofsd's behaviour).
    #[default]
    None,
    /// `/proc/<pid>/status` of the caller (host mounts: the caller is a
    /// host process).
    Proc,
}

thread_local! {
    static UNSHARED: Cell<bool> = const { Cell::new(false) };
    /// Capabilities this thread had before a [`CredGuard`] lowered them.
    static LOWERED: Cell<Option<[u64; 3]>> = const { Cell::new(None) };
    /// This thread's own supplementary groups (read on first use).
    static OWN_GROUPS: std::cell::OnceCell<Vec<u32>> = const { std::cell::OnceCell::new() };
    /// Set when giving the thread its own groups back failed: until a
    /// setgroups succeeds, its groups are unknown and always set.
    static GROUPS_UNKNOWN: Cell<bool> = const { Cell::new(false) };
}

/// CAP_DAC_READ_SEARCH.
const CAP_DAC_READ_SEARCH: u64 = 1 << 2;

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
    let me = Ctx {
        unique: 0,
        uid: DELEGATE_ID,
        gid: DELEGATE_ID,
        pid: 0,
    };
    let guard = CredGuard::switch(&me, Groups::None)?;
    let Some(saved) = guard.caps else {
        return Err(Errno::EPERM);
    };
    thread::capset([saved[0] & DELEGATE_CAPS, saved[1], saved[2]])?;
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

/// The caller's credentials in force on this thread until dropped. A
/// caller other than root also loses every effective capability (setfsuid
/// drops only the file-system ones; CAP_SYS_ADMIN would still let it set
/// `trusted.*` xattrs, CAP_SYS_RESOURCE ignore quotas).
#[derive(Debug)]
pub struct CredGuard {
    /// fsuid, fsgid, and the groups to set back if they were changed.
    restore: Option<(u32, u32, Option<Vec<u32>>)>,
    caps: Option<[u64; 3]>,
}

impl CredGuard {
    /// A guard that changes nothing (credential switching is off).
    pub fn none() -> CredGuard {
        CredGuard {
            restore: None,
            caps: None,
        }
    }

    /// Switches to `ctx`'s credentials.
    pub fn switch(ctx: &Ctx, groups: Groups) -> Result<CredGuard, Errno> {
        let supp = match groups {
            Groups::None => Vec::new(),
            Groups::Proc => proc_groups(ctx.pid).unwrap_or_default(),
        };
        // Outside a guard a thread always has its own groups, so they are
        // read once per thread, and set only when the caller's differ.
        let own = OWN_GROUPS.with(|g| g.get_or_init(thread::getgroups).clone());
        let restore_groups = if supp == own && !GROUPS_UNKNOWN.with(Cell::get) {
            None
        } else {
            thread::setgroups(&supp)?;
            GROUPS_UNKNOWN.with(|u| u.set(false));
            Some(own)
        };
        let old_gid = thread::setfsgid(ctx.gid);
        let old_uid = thread::setfsuid(ctx.uid);
        let mut g = CredGuard {
            restore: Some((old_uid, old_gid, restore_groups)),
            caps: None,
        };
        // setfsuid reports no errors: read the value back.
        if thread::setfsuid(u32::MAX) != ctx.uid || thread::setfsgid(u32::MAX) != ctx.gid {
            return Err(Errno::EPERM);
        }
        if ctx.uid != 0 {
            let saved = thread::capget()?;
            thread::capset([0, saved[1], saved[2]])?;
            g.caps = Some(saved);
            LOWERED.with(|l| l.set(Some(saved)));
        }
        Ok(g)
    }
}

impl Drop for CredGuard {
    fn drop(&mut self) {
        if let Some(caps) = self.caps.take() {
            // Capabilities first: setgroups below needs CAP_SETGID.
            if let Err(e) = thread::capset(caps) {
                // The thread keeps fewer capabilities than it had: later
                // calls may fail, none gains anything.
                eprintln!("fusebox: restoring a worker's capabilities: {e}");
            }
            LOWERED.with(|l| l.set(None));
        }
        if let Some((uid, gid, groups)) = self.restore.take() {
            // fsuid back to the daemon's: that also restores its fs
            // capabilities.
            thread::setfsuid(uid);
            thread::setfsgid(gid);
            if let Some(groups) = groups {
                if thread::setgroups(&groups).is_err() {
                    // Fail closed: the next switch sets groups even when
                    // the caller's look like the thread's own.
                    GROUPS_UNKNOWN.with(|u| u.set(true));
                }
            }
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
