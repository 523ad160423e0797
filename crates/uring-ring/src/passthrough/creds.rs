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

/// The caller's credentials in force on this thread until dropped.
#[derive(Debug)]
pub struct CredGuard {
    restore: Option<(u32, u32, Vec<u32>)>,
}

impl CredGuard {
    /// A guard that changes nothing (credential switching is off).
    pub fn none() -> CredGuard {
        CredGuard { restore: None }
    }

    /// Switches to `ctx`'s credentials.
    pub fn switch(ctx: &Ctx, groups: Groups) -> Result<CredGuard, Errno> {
        let supp = match groups {
            Groups::None => Vec::new(),
            Groups::Proc => proc_groups(ctx.pid).unwrap_or_default(),
        };
        let old_groups = thread::getgroups();
        thread::setgroups(&supp)?;
        let old_gid = thread::setfsgid(ctx.gid);
        let old_uid = thread::setfsuid(ctx.uid);
        // setfsuid reports no errors: read the value back.
        if thread::setfsuid(u32::MAX) != ctx.uid || thread::setfsgid(u32::MAX) != ctx.gid {
            let g = CredGuard {
                restore: Some((old_uid, old_gid, old_groups)),
            };
            drop(g);
            return Err(Errno::EPERM);
        }
        Ok(CredGuard {
            restore: Some((old_uid, old_gid, old_groups)),
        })
    }
}

impl Drop for CredGuard {
    fn drop(&mut self) {
        if let Some((uid, gid, groups)) = self.restore.take() {
            // fsuid back to the daemon's first: that restores its fs
            // capabilities, which setgroups below does not need anyway.
            thread::setfsuid(uid);
            thread::setfsgid(gid);
            let _ = thread::setgroups(&groups);
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
