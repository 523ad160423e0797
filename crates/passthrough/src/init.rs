//! What INIT offers, from the [`Config`](super::Config) and what the
//! client can do, and what it settles for later requests: POSIX ACLs,
//! submounts, kernel passthrough, the writeback cache, and the open flags
//! each OPEN answers with. A client that cannot do what the options
//! require (ACLs, security labels) fails INIT with EPROTO.

use super::{CachePolicy, Groups, PassthroughFs};
use fuse_core::abi::{fopen, init};
use fuse_core::Errno;

impl PassthroughFs {
    pub(super) fn init_flags(&self, capable: u64) -> Result<u64, Errno> {
        let mut f = init::DONT_MASK
            | init::ATOMIC_O_TRUNC
            | init::PARALLEL_DIROPS
            // Shared mmap of files opened with FOPEN_DIRECT_IO (cache
            // never/metadata); without it the client refuses with ENODEV.
            | init::DIRECT_IO_ALLOW_MMAP;
        if self.cfg.posix_locks {
            f |= init::POSIX_LOCKS;
        }
        if self.cfg.flock_locks {
            f |= init::FLOCK_LOCKS;
        }
        if self.cfg.readdirplus {
            f |= init::DO_READDIRPLUS | init::READDIRPLUS_AUTO;
        }
        if self.offers_passthrough() {
            f |= init::PASSTHROUGH;
        } else if self.writeback() {
            f |= init::WRITEBACK_CACHE;
        }
        if self.cfg.creds && self.cfg.killpriv_v2 {
            // Writes and truncates run as the caller, so the host kernel
            // clears setuid/setgid bits exactly as it would locally.
            f |= init::HANDLE_KILLPRIV_V2;
        }
        if self.cfg.announce_submounts {
            f |= init::SUBMOUNTS;
        }
        if self.cfg.creds && self.cfg.groups == Groups::None {
            // A guest's kernel tells which of its caller's groups a new
            // inode's parent has (FUSE_EXT_GROUPS), the one group the
            // host needs to give it the mode the guest already allowed.
            f |= init::CREATE_SUPP_GROUP;
        }
        let acl = init::POSIX_ACL | init::DONT_MASK | init::SETXATTR_EXT;
        if self.cfg.posix_acl && (capable & acl == acl || !self.cfg.posix_acl_optional) {
            if capable & acl != acl {
                // --posix-acl promises ACLs the client enforces; a
                // client that cannot gets no connection.
                return Err(Errno(libc::EPROTO));
            }
            f |= acl;
        }
        if self.cfg.security_label && self.cfg.xattr {
            if capable & init::SECURITY_CTX != 0 {
                f |= init::SECURITY_CTX;
            } else if !self.cfg.security_label_optional {
                // --security-label=always: a client that would create
                // inodes without telling their labels gets no connection
                // (virtiofsd answers EPROTO too).
                return Err(Errno(libc::EPROTO));
            }
        }
        self.posix_acl.store(
            f & init::POSIX_ACL != 0,
            std::sync::atomic::Ordering::Relaxed,
        );
        self.submounts.store(
            f & capable & init::SUBMOUNTS != 0,
            std::sync::atomic::Ordering::Relaxed,
        );
        self.backing
            .set_active(f & capable & init::PASSTHROUGH != 0);
        Ok(f & capable)
    }

    /// Kernel passthrough is configured and has its connection.
    pub(super) fn offers_passthrough(&self) -> bool {
        self.cfg.kernel_passthrough && self.backing.attached()
    }

    /// The writeback cache is asked for (never with kernel passthrough,
    /// which the kernel turns off when both are negotiated).
    pub(super) fn writeback(&self) -> bool {
        self.cfg.writeback && self.cfg.cache != CachePolicy::Never && !self.offers_passthrough()
    }

    /// FUSE_POSIX_ACL is in force.
    pub(super) fn posix_acl(&self) -> bool {
        self.posix_acl.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(super) fn open_flags(&self, direct: bool, dir: bool) -> u32 {
        let mut f = 0;
        match self.cfg.cache {
            CachePolicy::Never | CachePolicy::Metadata if !dir => f |= fopen::DIRECT_IO,
            CachePolicy::Always if dir => f |= fopen::CACHE_DIR,
            CachePolicy::Always => f |= fopen::KEEP_CACHE,
            _ => {}
        }
        if !dir && self.cfg.parallel_direct_writes && (direct || f & fopen::DIRECT_IO != 0) {
            f |= fopen::PARALLEL_DIRECT_WRITES;
        }
        f
    }
}
