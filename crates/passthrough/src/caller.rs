//! Who a request runs as on the host: the caller's IDs translated by the
//! [`Config`](crate::Config)'s `translate_uid` and `translate_gid`, the
//! credentials an operation takes on (with `creds` on), and the attributes
//! the client sees, translated back. A forbidden ID is EPERM whether creds
//! are on or off.

use super::creds::{Caps, Cred, CredGuard};
use super::{attr_of, sys, Groups, PassthroughFs};
use fuse_core::abi::Attr;
use fuse_core::server::Ctx;
use fuse_core::Errno;

impl PassthroughFs {
    /// `ctx`'s credentials on the host (its groups read only with creds
    /// on): its uid, gid and groups translated by
    /// [`Config::translate_uid`](crate::Config::translate_uid) and
    /// [`Config::translate_gid`](crate::Config::translate_gid). EPERM if
    /// one is forbidden (then no host ID may act for it), with creds on or
    /// off.
    pub(super) fn caller(&self, ctx: &Ctx) -> Result<Cred, Errno> {
        let groups = if self.cfg.creds {
            self.cfg.groups
        } else {
            Groups::None
        };
        let mut c = Cred::of(ctx, groups);
        c.uid = self.cfg.translate_uid.to_host(c.uid)?;
        c.gid = self.cfg.translate_gid.to_host(c.gid)?;
        if !self.cfg.translate_gid.is_identity() {
            c.groups = (c.groups.iter())
                .map(|&g| self.cfg.translate_gid.to_host(g))
                .collect::<Result<_, _>>()?;
        }
        Ok(c)
    }

    /// Whether a client could act as host gid `gid` itself: some client
    /// gid translates to it (it is not forbidden, and not a host gid no
    /// client gid reaches).
    pub(super) fn claimable_gid(&self, gid: u32) -> bool {
        let t = &self.cfg.translate_gid;
        t.to_host(t.to_guest(gid)).ok() == Some(gid)
    }

    /// The host uid an inode `cred` makes is owned by: its own when
    /// operations run as the caller, else the daemon's.
    pub(super) fn owner_of(&self, cred: &Cred) -> u32 {
        if self.cfg.creds {
            cred.uid
        } else {
            sys::geteuid()
        }
    }

    /// Whether `ctx` acts on the host as `cred` does, groups aside: the
    /// same translated uid and gid, so the same capabilities too (EPERM
    /// if forbidden).
    pub(super) fn acts_as(&self, ctx: &Ctx, cred: &Cred) -> Result<bool, Errno> {
        Ok(self.cfg.translate_uid.to_host(ctx.uid)? == cred.uid
            && self.cfg.translate_gid.to_host(ctx.gid)? == cred.gid)
    }

    /// The attributes the client gets for `st`: owner and group translated
    /// to the client's IDs; FUSE_ATTR_DAX on a file its DAX window can map
    /// whole (`Config::dax_inodes`).
    pub(super) fn attr(&self, st: &libc::statx) -> Attr {
        /// The guest's DAX mapping unit.
        const DAX_RANGE: u64 = 2 << 20;
        let mut a = attr_of(st);
        a.uid = self.cfg.translate_uid.to_guest(a.uid);
        a.gid = self.cfg.translate_gid.to_guest(a.gid);
        // Not on a read-only share: a mapping needs the file writable.
        if self.cfg.dax_inodes
            && !self.cfg.readonly
            && u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFREG
            && st.stx_size > 0
            && st.stx_size % DAX_RANGE == 0
        {
            a.flags |= fuse_core::abi::flags::ATTR_DAX;
        }
        a
    }

    /// The caller's credentials in force until the guard drops.
    pub(super) fn creds(&self, ctx: &Ctx) -> Result<CredGuard, Errno> {
        self.creds_as(&self.caller(ctx)?, Caps::Caller)
    }

    /// [`PassthroughFs::creds`] for an operation that may allocate space
    /// (new inodes, directory entries, xattr values): never with
    /// CAP_SYS_RESOURCE, root callers included, so quotas and reserved
    /// blocks bind them as they bind data writes.
    pub(super) fn creds_allocating(&self, ctx: &Ctx) -> Result<CredGuard, Errno> {
        self.creds_as(&self.caller(ctx)?, Caps::ALLOCATE)
    }

    /// `cred` in force, with the capabilities `caps` leaves, until the
    /// guard drops.
    pub(super) fn creds_as(&self, cred: &Cred, caps: Caps) -> Result<CredGuard, Errno> {
        if self.cfg.creds {
            CredGuard::enter(cred, caps)
        } else {
            Ok(CredGuard::none())
        }
    }
}
