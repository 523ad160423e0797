//! `repr(C)` message structs of FUSE 7.45. Each has a compile-time size
//! assert against the kernel's layout, and derives zerocopy's traits so it is
//! read from untrusted bytes without `unsafe` and without alignment demands.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

macro_rules! abi {
    ($( $(#[$m:meta])* $name:ident = $size:literal { $( $f:ident : $t:ty ),* $(,)? } )*) => {$(
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
        #[allow(missing_docs)]
        pub struct $name { $( pub $f: $t ),* }
        const _: () = assert!(core::mem::size_of::<$name>() == $size);
        impl Default for $name {
            fn default() -> Self { zerocopy::FromZeros::new_zeroed() }
        }
    )*};
}

abi! {
    /// `struct fuse_attr`.
    Attr = 88 { ino: u64, size: u64, blocks: u64, atime: u64, mtime: u64, ctime: u64,
        atimensec: u32, mtimensec: u32, ctimensec: u32, mode: u32, nlink: u32, uid: u32,
        gid: u32, rdev: u32, blksize: u32, flags: u32 }
    /// `struct fuse_sx_time`.
    SxTime = 16 { tv_sec: i64, tv_nsec: u32, reserved: i32 }
    /// `struct fuse_statx` (bit-compatible with statx(2)).
    Statx = 256 { mask: u32, blksize: u32, attributes: u64, nlink: u32, uid: u32, gid: u32,
        mode: u16, spare0: [u16; 1], ino: u64, size: u64, blocks: u64, attributes_mask: u64,
        atime: SxTime, btime: SxTime, ctime: SxTime, mtime: SxTime, rdev_major: u32,
        rdev_minor: u32, dev_major: u32, dev_minor: u32, spare2: [u64; 14] }
    /// `struct fuse_kstatfs`.
    Kstatfs = 80 { blocks: u64, bfree: u64, bavail: u64, files: u64, ffree: u64, bsize: u32,
        namelen: u32, frsize: u32, padding: u32, spare: [u32; 6] }
    /// `struct fuse_file_lock`.
    FileLock = 24 { start: u64, end: u64, typ: u32, pid: u32 }
    /// `struct fuse_entry_out`.
    EntryOut = 128 { nodeid: u64, generation: u64, entry_valid: u64, attr_valid: u64,
        entry_valid_nsec: u32, attr_valid_nsec: u32, attr: Attr }
    /// `struct fuse_forget_in`.
    ForgetIn = 8 { nlookup: u64 }
    /// `struct fuse_forget_one`.
    ForgetOne = 16 { nodeid: u64, nlookup: u64 }
    /// `struct fuse_batch_forget_in`.
    BatchForgetIn = 8 { count: u32, dummy: u32 }
    /// `struct fuse_getattr_in`.
    GetattrIn = 16 { getattr_flags: u32, dummy: u32, fh: u64 }
    /// `struct fuse_attr_out`.
    AttrOut = 104 { attr_valid: u64, attr_valid_nsec: u32, dummy: u32, attr: Attr }
    /// `struct fuse_statx_in`.
    StatxIn = 24 { getattr_flags: u32, reserved: u32, fh: u64, sx_flags: u32, sx_mask: u32 }
    /// `struct fuse_statx_out`.
    StatxOut = 288 { attr_valid: u64, attr_valid_nsec: u32, flags: u32, spare: [u64; 2],
        stat: Statx }
    /// `struct fuse_mknod_in`.
    MknodIn = 16 { mode: u32, rdev: u32, umask: u32, padding: u32 }
    /// `struct fuse_mkdir_in`.
    MkdirIn = 8 { mode: u32, umask: u32 }
    /// `struct fuse_rename_in`.
    RenameIn = 8 { newdir: u64 }
    /// `struct fuse_rename2_in`.
    Rename2In = 16 { newdir: u64, flags: u32, padding: u32 }
    /// `struct fuse_link_in`.
    LinkIn = 8 { oldnodeid: u64 }
    /// `struct fuse_setattr_in`.
    SetattrIn = 88 { valid: u32, padding: u32, fh: u64, size: u64, lock_owner: u64,
        atime: u64, mtime: u64, ctime: u64, atimensec: u32, mtimensec: u32, ctimensec: u32,
        mode: u32, unused4: u32, uid: u32, gid: u32, unused5: u32 }
    /// `struct fuse_open_in`.
    OpenIn = 8 { flags: u32, open_flags: u32 }
    /// `struct fuse_create_in`.
    CreateIn = 16 { flags: u32, mode: u32, umask: u32, open_flags: u32 }
    /// `struct fuse_open_out`.
    OpenOut = 16 { fh: u64, open_flags: u32, backing_id: i32 }
    /// `struct fuse_release_in`.
    ReleaseIn = 24 { fh: u64, flags: u32, release_flags: u32, lock_owner: u64 }
    /// `struct fuse_flush_in`.
    FlushIn = 24 { fh: u64, unused: u32, padding: u32, lock_owner: u64 }
    /// `struct fuse_read_in`.
    ReadIn = 40 { fh: u64, offset: u64, size: u32, read_flags: u32, lock_owner: u64,
        flags: u32, padding: u32 }
    /// `struct fuse_write_in`.
    WriteIn = 40 { fh: u64, offset: u64, size: u32, write_flags: u32, lock_owner: u64,
        flags: u32, padding: u32 }
    /// `struct fuse_write_out`.
    WriteOut = 8 { size: u32, padding: u32 }
    /// `struct fuse_statfs_out`.
    StatfsOut = 80 { st: Kstatfs }
    /// `struct fuse_fsync_in`.
    FsyncIn = 16 { fh: u64, fsync_flags: u32, padding: u32 }
    /// `struct fuse_setxattr_in` (with SETXATTR_EXT; the compat form is the first 8 bytes).
    SetxattrIn = 16 { size: u32, flags: u32, setxattr_flags: u32, padding: u32 }
    /// `struct fuse_getxattr_in`.
    GetxattrIn = 8 { size: u32, padding: u32 }
    /// `struct fuse_getxattr_out`.
    GetxattrOut = 8 { size: u32, padding: u32 }
    /// `struct fuse_lk_in`.
    LkIn = 48 { fh: u64, owner: u64, lk: FileLock, lk_flags: u32, padding: u32 }
    /// `struct fuse_lk_out`.
    LkOut = 24 { lk: FileLock }
    /// `struct fuse_access_in`.
    AccessIn = 8 { mask: u32, padding: u32 }
    /// `struct fuse_init_in`.
    InitIn = 64 { major: u32, minor: u32, max_readahead: u32, flags: u32, flags2: u32,
        unused: [u32; 11] }
    /// `struct fuse_init_out`.
    InitOut = 64 { major: u32, minor: u32, max_readahead: u32, flags: u32,
        max_background: u16, congestion_threshold: u16, max_write: u32, time_gran: u32,
        max_pages: u16, map_alignment: u16, flags2: u32, max_stack_depth: u32,
        request_timeout: u16, unused: [u16; 11] }
    /// `struct cuse_init_in`.
    CuseInitIn = 16 { major: u32, minor: u32, unused: u32, flags: u32 }
    /// `struct cuse_init_out`.
    CuseInitOut = 72 { major: u32, minor: u32, unused: u32, flags: u32, max_read: u32,
        max_write: u32, dev_major: u32, dev_minor: u32, spare: [u32; 10] }
    /// `struct fuse_interrupt_in`.
    InterruptIn = 8 { unique: u64 }
    /// `struct fuse_bmap_in`.
    BmapIn = 16 { block: u64, blocksize: u32, padding: u32 }
    /// `struct fuse_bmap_out`.
    BmapOut = 8 { block: u64 }
    /// `struct fuse_ioctl_in`.
    IoctlIn = 32 { fh: u64, flags: u32, cmd: u32, arg: u64, in_size: u32, out_size: u32 }
    /// `struct fuse_ioctl_iovec`.
    IoctlIovec = 16 { base: u64, len: u64 }
    /// `struct fuse_ioctl_out`.
    IoctlOut = 16 { result: i32, flags: u32, in_iovs: u32, out_iovs: u32 }
    /// `struct fuse_poll_in`.
    PollIn = 24 { fh: u64, kh: u64, flags: u32, events: u32 }
    /// `struct fuse_poll_out`.
    PollOut = 8 { revents: u32, padding: u32 }
    /// `struct fuse_notify_poll_wakeup_out`.
    NotifyPollWakeupOut = 8 { kh: u64 }
    /// `struct fuse_fallocate_in`.
    FallocateIn = 32 { fh: u64, offset: u64, length: u64, mode: u32, padding: u32 }
    /// `struct fuse_in_header`.
    InHeader = 40 { len: u32, opcode: u32, unique: u64, nodeid: u64, uid: u32, gid: u32,
        pid: u32, total_extlen: u16, padding: u16 }
    /// `struct fuse_out_header`.
    OutHeader = 16 { len: u32, error: i32, unique: u64 }
    /// `struct fuse_dirent` without its trailing name.
    Dirent = 24 { ino: u64, off: u64, namelen: u32, typ: u32 }
    /// `struct fuse_direntplus` without its trailing name.
    DirentPlus = 152 { entry_out: EntryOut, dirent: Dirent }
    /// `struct fuse_notify_inval_inode_out`.
    NotifyInvalInodeOut = 24 { ino: u64, off: i64, len: i64 }
    /// `struct fuse_notify_inval_entry_out`.
    NotifyInvalEntryOut = 16 { parent: u64, namelen: u32, flags: u32 }
    /// `struct fuse_notify_delete_out`.
    NotifyDeleteOut = 24 { parent: u64, child: u64, namelen: u32, padding: u32 }
    /// `struct fuse_notify_store_out`.
    NotifyStoreOut = 24 { nodeid: u64, offset: u64, size: u32, padding: u32 }
    /// `struct fuse_notify_retrieve_out`.
    NotifyRetrieveOut = 32 { notify_unique: u64, nodeid: u64, offset: u64, size: u32,
        padding: u32 }
    /// `struct fuse_notify_retrieve_in` (same size as fuse_write_in).
    NotifyRetrieveIn = 40 { dummy1: u64, offset: u64, size: u32, dummy2: u32, dummy3: u64,
        dummy4: u64 }
    /// `struct fuse_notify_prune_out`.
    NotifyPruneOut = 16 { count: u32, padding: u32, spare: u64 }
    /// `struct fuse_backing_map`.
    BackingMap = 16 { fd: i32, flags: u32, padding: u64 }
    /// `struct fuse_lseek_in`.
    LseekIn = 24 { fh: u64, offset: u64, whence: u32, padding: u32 }
    /// `struct fuse_lseek_out`.
    LseekOut = 8 { offset: u64 }
    /// `struct fuse_copy_file_range_in`.
    CopyFileRangeIn = 56 { fh_in: u64, off_in: u64, nodeid_out: u64, fh_out: u64,
        off_out: u64, len: u64, flags: u64 }
    /// `struct fuse_copy_file_range_out` (COPY_FILE_RANGE_64).
    CopyFileRangeOut = 8 { bytes_copied: u64 }
    /// `struct fuse_setupmapping_in`.
    SetupmappingIn = 40 { fh: u64, foffset: u64, len: u64, flags: u64, moffset: u64 }
    /// `struct fuse_removemapping_in`.
    RemovemappingIn = 4 { count: u32 }
    /// `struct fuse_removemapping_one`.
    RemovemappingOne = 16 { moffset: u64, len: u64 }
    /// `struct fuse_syncfs_in`.
    SyncfsIn = 8 { padding: u64 }
    /// `struct fuse_secctx`.
    Secctx = 8 { size: u32, padding: u32 }
    /// `struct fuse_secctx_header`.
    SecctxHeader = 8 { size: u32, nr_secctx: u32 }
    /// `struct fuse_ext_header`.
    ExtHeader = 8 { size: u32, typ: u32 }
    /// `struct fuse_supp_groups` without the trailing group array.
    SuppGroups = 4 { nr_groups: u32 }
}

/// Size of a directory record for a name of `namelen` bytes (8-byte aligned).
pub const fn dirent_size(namelen: usize) -> usize {
    (core::mem::size_of::<Dirent>() + namelen + 7) & !7
}

/// Size of a READDIRPLUS record for a name of `namelen` bytes.
pub const fn direntplus_size(namelen: usize) -> usize {
    (core::mem::size_of::<DirentPlus>() + namelen + 7) & !7
}
