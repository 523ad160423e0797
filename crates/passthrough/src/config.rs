//! The passthrough's options ([`Config`]) and its cache policy. Options
//! are fixed once the filesystem is made; what INIT negotiates from them
//! is in `init`.

use super::sys;
use super::{Groups, IdMap, MigrationConfig, XattrMap};
use std::time::Duration;

/// What the client may cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CachePolicy {
    /// Nothing: zero timeouts, direct I/O.
    Never,
    /// Names and attributes for a day, data never (direct I/O).
    Metadata,
    /// Names and attributes for a second, data until it changes.
    #[default]
    Auto,
    /// Everything for a day; data and directory pages kept across opens.
    Always,
}

impl CachePolicy {
    pub(super) fn timeout(self) -> Duration {
        match self {
            CachePolicy::Never => Duration::ZERO,
            CachePolicy::Auto => Duration::from_secs(1),
            CachePolicy::Metadata | CachePolicy::Always => Duration::from_secs(86400),
        }
    }
}

/// Options of the passthrough.
#[derive(Debug, Clone)]
pub struct Config {
    /// Cache policy.
    pub cache: CachePolicy,
    /// Negotiate the writeback cache.
    pub writeback: bool,
    /// Refuse every change with EROFS.
    pub readonly: bool,
    /// Serve extended attributes (off: ENOSYS, and the client stops asking).
    pub xattr: bool,
    /// `--xattrmap`: how xattr names are renamed, hidden or refused
    /// between the client and the host (`xattrmap.rs`); None: unchanged.
    pub xattrmap: Option<XattrMap>,
    /// POSIX ACLs: INIT must agree on FUSE_POSIX_ACL (the client then
    /// enforces ACLs and default permissions itself), DONT_MASK and
    /// SETXATTR_EXT, or fails with EPROTO. Needs `xattr`.
    pub posix_acl: bool,
    /// With `posix_acl`: a client that cannot negotiate ACLs is served
    /// without them (as if `posix_acl` were off) instead of refused.
    pub posix_acl_optional: bool,
    /// Security labels (virtiofsd's `--security-label`): INIT offers
    /// FUSE_SECURITY_CTX, and the label a client sends with a creating
    /// request is set on the new host inode before the reply (`label.rs`),
    /// or the request fails and nothing is made. A client that cannot
    /// negotiate it fails INIT with EPROTO. Needs `xattr`.
    pub security_label: bool,
    /// With `security_label`: a client that cannot negotiate
    /// FUSE_SECURITY_CTX is served without labels instead of refused.
    pub security_label_optional: bool,
    /// Without `posix_acl`: pass the ACL xattrs (`system.posix_acl_access`,
    /// `system.posix_acl_default`) through as any other. Right for host
    /// mounts: every call runs as the caller with its real groups, so the
    /// host enforces the ACLs. Off (guests, whose groups the host does not
    /// know), they are refused with EOPNOTSUPP and left out of listxattr,
    /// as virtiofsd does.
    pub pass_acl_xattrs: bool,
    /// Direct-I/O opens get FOPEN_PARALLEL_DIRECT_WRITES; such writers hold
    /// the inode lock shared.
    pub parallel_direct_writes: bool,
    /// Keep file handles instead of an O_PATH fd per inode where the host
    /// filesystem supports them (needs CAP_DAC_READ_SEARCH).
    pub inode_file_handles: bool,
    /// Cap on fds the daemon holds (inodes, open files, lock fds); beyond
    /// it requests get EMFILE.
    pub max_fds: usize,
    /// Run operations under the caller's credentials.
    pub creds: bool,
    /// Where supplementary groups come from.
    pub groups: Groups,
    /// Data I/O through io_uring (off: pread/pwrite).
    pub io_uring: bool,
    /// With `io_uring`: cached READs of a file the page cache holds whole
    /// are copied out of a shared mapping of it, no system call each
    /// (`mapped.rs`).
    pub mapped_reads: bool,
    /// Mark directories on another mount than their parent with
    /// FUSE_ATTR_SUBMOUNT (when the client negotiates FUSE_SUBMOUNTS), so
    /// the client gives them their own superblock and st_dev.
    pub announce_submounts: bool,
    /// With a DAX window (the device's `cache_size`): mark the regular
    /// files a guest mounted with `-o dax=inode` reads and writes through
    /// its window with FUSE_ATTR_DAX, those whose size is a whole,
    /// non-zero number of 2 MiB ranges (the window maps whole ranges, and
    /// QEMU 11.1 maps nothing past a file's end: docs/DAX.md); none on a
    /// read-only share (QEMU 11.1 maps only files open for writing).
    pub dax_inodes: bool,
    /// Host mounts: negotiate FUSE_PASSTHROUGH and let the kernel do the
    /// reads, writes and mmaps of open files on the host files itself
    /// (see `backing.rs`). Needs
    /// [`PassthroughFs::attach_device`](crate::PassthroughFs::attach_device)
    /// before INIT and CAP_SYS_ADMIN; excludes the writeback cache.
    pub kernel_passthrough: bool,
    /// Offer FUSE_FLOCK_LOCKS: the client sends flock(2) locks to the
    /// daemon, which holds them on the host file. Off, the client keeps
    /// them to itself (virtiofsd's `-o no_flock`).
    pub flock_locks: bool,
    /// Offer FUSE_POSIX_LOCKS: the client sends fcntl(2) record locks to
    /// the daemon. Off, the client keeps them to itself (`-o
    /// no_posix_lock`).
    pub posix_locks: bool,
    /// Offer READDIRPLUS (FUSE_DO_READDIRPLUS and READDIRPLUS_AUTO). Off,
    /// the client lists directories with READDIR and looks each entry up
    /// (virtiofsd's `--no-readdirplus`).
    pub readdirplus: bool,
    /// Offer FUSE_HANDLE_KILLPRIV_V2 when `creds` is on (writes and
    /// truncates then run as the caller, so the host clears setuid/setgid
    /// itself). Off (virtiofsd's `--no-killpriv-v2`), the client clears
    /// them with a SETATTR of the mode, which runs as the caller too.
    pub killpriv_v2: bool,
    /// Open host files with the O_DIRECT the client asks for. Off
    /// (virtiofsd's `-o no_allow_direct_io`), O_DIRECT is dropped from the
    /// host open and the file is served through the host's page cache.
    pub direct_io: bool,
    /// How the client's uids become the host's and back (virtiofsd's
    /// `--translate-uid`); the default translates nothing.
    pub translate_uid: IdMap,
    /// The same for gids (`--translate-gid`).
    pub translate_gid: IdMap,
    /// Live migration (`--migration-mode` and the like; `migrate.rs`).
    pub migration: MigrationConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            cache: CachePolicy::Auto,
            writeback: false,
            readonly: false,
            xattr: true,
            xattrmap: None,
            posix_acl: false,
            posix_acl_optional: false,
            security_label: false,
            security_label_optional: false,
            pass_acl_xattrs: false,
            parallel_direct_writes: true,
            inode_file_handles: false,
            max_fds: 65536,
            creds: sys::geteuid() == 0,
            groups: Groups::None,
            io_uring: true,
            mapped_reads: true,
            announce_submounts: false,
            dax_inodes: false,
            kernel_passthrough: false,
            flock_locks: true,
            posix_locks: true,
            readdirplus: true,
            killpriv_v2: true,
            direct_io: true,
            translate_uid: IdMap::default(),
            translate_gid: IdMap::default(),
            migration: MigrationConfig::default(),
        }
    }
}
