//! Protocol constants of FUSE 7.45 (`include/uapi/linux/fuse.h`) plus the
//! FUSE-over-io_uring buffer-pool extension (the 2026 patch series:
//! `FUSE_HAS_IO_URING_BUFPOOL`, the ADD_BUFPOOL command).

/// Major protocol version.
pub const KERNEL_VERSION: u32 = 7;
/// Minor protocol version this crate speaks.
pub const KERNEL_MINOR_VERSION: u32 = 45;
/// Node id of the root inode.
pub const ROOT_ID: u64 = 1;
/// Smallest read buffer a server may pass to the device.
pub const MIN_READ_BUFFER: usize = 8192;
/// Bit set in `unique` of an INTERRUPT request (and its reply).
pub const INT_REQ_BIT: u64 = 1;
/// Bit set in `unique` of a request that was re-sent after NOTIFY_RESEND.
pub const UNIQUE_RESEND: u64 = 1 << 63;
/// uid/gid value meaning "not available".
pub const INVALID_UIDGID: u32 = u32::MAX;
/// Size of the compat (7.8) fuse_entry_out.
pub const COMPAT_ENTRY_OUT_SIZE: usize = 120;
/// Size of the compat (7.8) fuse_attr_out.
pub const COMPAT_ATTR_OUT_SIZE: usize = 96;
/// Size of the compat (<7.12) fuse_mknod_in.
pub const COMPAT_MKNOD_IN_SIZE: usize = 8;
/// Size of the compat (<7.9) fuse_write_in.
pub const COMPAT_WRITE_IN_SIZE: usize = 24;
/// Size of the compat (<7.4) fuse_statfs_out.
pub const COMPAT_STATFS_SIZE: usize = 48;
/// Size of fuse_setxattr_in without SETXATTR_EXT.
pub const COMPAT_SETXATTR_IN_SIZE: usize = 8;
/// Size of the oldest fuse_init_out.
pub const COMPAT_INIT_OUT_SIZE: usize = 8;
/// Size of the 7.22 fuse_init_out.
pub const COMPAT_22_INIT_OUT_SIZE: usize = 24;
/// Maximum number of security contexts in the extension.
pub const MAX_NR_SECCTX: u32 = 31;
/// Extension type: supplementary groups.
pub const EXT_GROUPS: u32 = 32;
/// Size of the in/out header area of a ring entry.
pub const URING_IN_OUT_HEADER_SZ: usize = 128;
/// Size of the per-opcode header area of a ring entry.
pub const URING_OP_IN_OUT_SZ: usize = 128;

macro_rules! opcodes {
    ($( $(#[$m:meta])* $name:ident = $val:expr ),* $(,)?) => {
        /// Every FUSE opcode of protocol 7.45.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u32)]
        pub enum Opcode { $( $(#[$m])* $name = $val ),* }

        impl Opcode {
            /// All opcodes, in numeric order.
            pub const ALL: &'static [Opcode] = &[$(Opcode::$name),*];

            /// Decodes a raw opcode; `None` for unknown values.
            pub const fn from_u32(v: u32) -> Option<Self> {
                match v { $( $val => Some(Opcode::$name), )* _ => None }
            }

            /// The kernel's name for the opcode, e.g. `"LOOKUP"`.
            pub const fn name(self) -> &'static str {
                match self { $( Opcode::$name => stringify!($name), )* }
            }
        }
    };
}

opcodes! {
    /// Look up a directory entry by name.
    Lookup = 1,
    /// Drop lookup references (no reply).
    Forget = 2,
    /// Get attributes.
    Getattr = 3,
    /// Set attributes.
    Setattr = 4,
    /// Read a symbolic link.
    Readlink = 5,
    /// Create a symbolic link.
    Symlink = 6,
    /// Create a node.
    Mknod = 8,
    /// Create a directory.
    Mkdir = 9,
    /// Remove a file.
    Unlink = 10,
    /// Remove a directory.
    Rmdir = 11,
    /// Rename.
    Rename = 12,
    /// Create a hard link.
    Link = 13,
    /// Open a file.
    Open = 14,
    /// Read data.
    Read = 15,
    /// Write data.
    Write = 16,
    /// Filesystem statistics.
    Statfs = 17,
    /// Release an open file.
    Release = 18,
    /// Synchronise file contents.
    Fsync = 20,
    /// Set an extended attribute.
    Setxattr = 21,
    /// Get an extended attribute.
    Getxattr = 22,
    /// List extended attributes.
    Listxattr = 23,
    /// Remove an extended attribute.
    Removexattr = 24,
    /// Flush on close.
    Flush = 25,
    /// Initialise the connection.
    Init = 26,
    /// Open a directory.
    Opendir = 27,
    /// Read a directory.
    Readdir = 28,
    /// Release an open directory.
    Releasedir = 29,
    /// Synchronise directory contents.
    Fsyncdir = 30,
    /// Test for a POSIX lock.
    Getlk = 31,
    /// Acquire or release a POSIX lock.
    Setlk = 32,
    /// Acquire a POSIX lock, waiting.
    Setlkw = 33,
    /// Check access permissions.
    Access = 34,
    /// Create and open a file.
    Create = 35,
    /// Interrupt a request.
    Interrupt = 36,
    /// Map a block.
    Bmap = 37,
    /// Clean up the filesystem.
    Destroy = 38,
    /// ioctl.
    Ioctl = 39,
    /// poll.
    Poll = 40,
    /// Reply to NOTIFY_RETRIEVE.
    NotifyReply = 41,
    /// Drop lookup references of many inodes (no reply).
    BatchForget = 42,
    /// Allocate space.
    Fallocate = 43,
    /// Read a directory with attributes.
    Readdirplus = 44,
    /// Rename with flags.
    Rename2 = 45,
    /// Find data or holes.
    Lseek = 46,
    /// Copy a range between files (32-bit result).
    CopyFileRange = 47,
    /// DAX: set up a mapping.
    Setupmapping = 48,
    /// DAX: remove mappings.
    Removemapping = 49,
    /// Synchronise the filesystem.
    Syncfs = 50,
    /// Create an unnamed temporary file.
    Tmpfile = 51,
    /// Extended attributes.
    Statx = 52,
    /// Copy a range between files (64-bit result).
    CopyFileRange64 = 53,
    /// CUSE initialisation.
    CuseInit = 4096,
    /// Reserved: CUSE_INIT byte-swapped.
    CuseInitBswapReserved = 1048576,
    /// Reserved: INIT byte-swapped.
    FuseInitBswapReserved = 436207616,
}

impl Opcode {
    /// Whether the kernel expects no reply to this opcode.
    pub const fn is_noreply(self) -> bool {
        matches!(self, Opcode::Forget | Opcode::BatchForget)
    }
}

/// Notification codes (carried in `fuse_out_header.error` with unique 0).
pub mod notify {
    /// Poll wake-up.
    pub const POLL: i32 = 1;
    /// Invalidate an inode's cache.
    pub const INVAL_INODE: i32 = 2;
    /// Invalidate a directory entry.
    pub const INVAL_ENTRY: i32 = 3;
    /// Store data in the page cache.
    pub const STORE: i32 = 4;
    /// Retrieve data from the page cache.
    pub const RETRIEVE: i32 = 5;
    /// Delete a directory entry.
    pub const DELETE: i32 = 6;
    /// Re-send all requests being processed.
    pub const RESEND: i32 = 7;
    /// Increase the connection epoch.
    pub const INC_EPOCH: i32 = 8;
    /// Prune unreferenced inodes.
    pub const PRUNE: i32 = 9;
}

/// INIT flags. Bits 32..63 travel in `flags2`.
pub mod init {
    #![allow(missing_docs)]
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const POSIX_LOCKS: u64 = 1 << 1;
    pub const FILE_OPS: u64 = 1 << 2;
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    pub const EXPORT_SUPPORT: u64 = 1 << 4;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const DONT_MASK: u64 = 1 << 6;
    pub const SPLICE_WRITE: u64 = 1 << 7;
    pub const SPLICE_MOVE: u64 = 1 << 8;
    pub const SPLICE_READ: u64 = 1 << 9;
    pub const FLOCK_LOCKS: u64 = 1 << 10;
    pub const HAS_IOCTL_DIR: u64 = 1 << 11;
    pub const AUTO_INVAL_DATA: u64 = 1 << 12;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    pub const ASYNC_DIO: u64 = 1 << 15;
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    pub const NO_OPEN_SUPPORT: u64 = 1 << 17;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const HANDLE_KILLPRIV: u64 = 1 << 19;
    pub const POSIX_ACL: u64 = 1 << 20;
    pub const ABORT_ERROR: u64 = 1 << 21;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    pub const NO_OPENDIR_SUPPORT: u64 = 1 << 24;
    pub const EXPLICIT_INVAL_DATA: u64 = 1 << 25;
    pub const MAP_ALIGNMENT: u64 = 1 << 26;
    pub const SUBMOUNTS: u64 = 1 << 27;
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    pub const SETXATTR_EXT: u64 = 1 << 29;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const INIT_RESERVED: u64 = 1 << 31;
    pub const SECURITY_CTX: u64 = 1 << 32;
    pub const HAS_INODE_DAX: u64 = 1 << 33;
    pub const CREATE_SUPP_GROUP: u64 = 1 << 34;
    pub const HAS_EXPIRE_ONLY: u64 = 1 << 35;
    pub const DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
    pub const PASSTHROUGH: u64 = 1 << 37;
    pub const NO_EXPORT_SUPPORT: u64 = 1 << 38;
    pub const HAS_RESEND: u64 = 1 << 39;
    pub const ALLOW_IDMAP: u64 = 1 << 40;
    pub const OVER_IO_URING: u64 = 1 << 41;
    pub const REQUEST_TIMEOUT: u64 = 1 << 42;
    /// The kernel supports ADD_QUEUE/ADD_BUFPOOL ring payload pools.
    pub const HAS_IO_URING_BUFPOOL: u64 = 1 << 43;
    /// CUSE: unrestricted ioctl.
    pub const CUSE_UNRESTRICTED_IOCTL: u32 = 1 << 0;

    /// Joins `flags` and `flags2` of an INIT message.
    pub const fn join(flags: u32, flags2: u32) -> u64 {
        (flags as u64) | ((flags2 as u64) << 32)
    }
    /// Splits a 64-bit flag set into `(flags, flags2)`.
    pub const fn split(all: u64) -> (u32, u32) {
        (all as u32, (all >> 32) as u32)
    }
}

/// Flags in `fuse_open_out.open_flags`.
pub mod fopen {
    #![allow(missing_docs)]
    pub const DIRECT_IO: u32 = 1 << 0;
    pub const KEEP_CACHE: u32 = 1 << 1;
    pub const NONSEEKABLE: u32 = 1 << 2;
    pub const CACHE_DIR: u32 = 1 << 3;
    pub const STREAM: u32 = 1 << 4;
    pub const NOFLUSH: u32 = 1 << 5;
    pub const PARALLEL_DIRECT_WRITES: u32 = 1 << 6;
    pub const PASSTHROUGH: u32 = 1 << 7;
    /// READ/WRITE of this file may use the ring's zero-copy path.
    pub const IO_URING_ZERO_COPY: u32 = 1 << 8;
}

/// Bits of `fuse_setattr_in.valid`.
pub mod fattr {
    #![allow(missing_docs)]
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    pub const LOCKOWNER: u32 = 1 << 9;
    pub const CTIME: u32 = 1 << 10;
    pub const KILL_SUIDGID: u32 = 1 << 11;
}

/// Miscellaneous per-message flags.
pub mod flags {
    #![allow(missing_docs)]
    pub const RELEASE_FLUSH: u32 = 1 << 0;
    pub const RELEASE_FLOCK_UNLOCK: u32 = 1 << 1;
    pub const GETATTR_FH: u32 = 1 << 0;
    pub const LK_FLOCK: u32 = 1 << 0;
    pub const WRITE_CACHE: u32 = 1 << 0;
    pub const WRITE_LOCKOWNER: u32 = 1 << 1;
    pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;
    pub const READ_LOCKOWNER: u32 = 1 << 1;
    pub const IOCTL_COMPAT: u32 = 1 << 0;
    pub const IOCTL_UNRESTRICTED: u32 = 1 << 1;
    pub const IOCTL_RETRY: u32 = 1 << 2;
    pub const IOCTL_32BIT: u32 = 1 << 3;
    pub const IOCTL_DIR: u32 = 1 << 4;
    pub const IOCTL_COMPAT_X32: u32 = 1 << 5;
    pub const IOCTL_MAX_IOV: u32 = 256;
    pub const POLL_SCHEDULE_NOTIFY: u32 = 1 << 0;
    pub const FSYNC_FDATASYNC: u32 = 1 << 0;
    pub const ATTR_SUBMOUNT: u32 = 1 << 0;
    pub const ATTR_DAX: u32 = 1 << 1;
    pub const OPEN_KILL_SUIDGID: u32 = 1 << 0;
    pub const SETXATTR_ACL_KILL_SGID: u32 = 1 << 0;
    pub const EXPIRE_ONLY: u32 = 1 << 0;
    pub const SETUPMAPPING_FLAG_WRITE: u64 = 1 << 0;
    pub const SETUPMAPPING_FLAG_READ: u64 = 1 << 1;
}

/// FUSE-over-io_uring command numbers and flags.
pub mod uring {
    #![allow(missing_docs)]
    pub const CMD_INVALID: u32 = 0;
    pub const CMD_REGISTER: u32 = 1;
    pub const CMD_COMMIT_AND_FETCH: u32 = 2;
    pub const CMD_ADD_QUEUE: u32 = 3;
    pub const CMD_ADD_BUFPOOL: u32 = 4;
    /// ADD_QUEUE flag: the queue hands client pages over by reference.
    pub const QUEUE_ZERO_COPY: u64 = 1 << 0;
    /// `fuse_uring_ent_in_out.flags`: the payload lives in the client's pages.
    pub const ENT_ZERO_COPY: u64 = 1 << 0;
}
