//! The typed arguments of every request opcode ([`Operation`]): how each
//! is decoded, and how much of it travels in a ring entry's `op_in`.

use super::request::{ArgBytes, DecodeOptions};
use super::DecodeError;
use crate::abi::consts::{init, Opcode, COMPAT_SETXATTR_IN_SIZE, COMPAT_WRITE_IN_SIZE};
use crate::abi::structs::*;

/// Typed arguments of every request opcode.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq)]
pub enum Operation<'a> {
    Lookup {
        name: &'a [u8],
    },
    Forget {
        arg: ForgetIn,
    },
    Getattr {
        arg: GetattrIn,
    },
    Setattr {
        arg: SetattrIn,
    },
    Readlink,
    Symlink {
        name: &'a [u8],
        target: &'a [u8],
    },
    Mknod {
        arg: MknodIn,
        name: &'a [u8],
    },
    Mkdir {
        arg: MkdirIn,
        name: &'a [u8],
    },
    Unlink {
        name: &'a [u8],
    },
    Rmdir {
        name: &'a [u8],
    },
    Rename {
        arg: RenameIn,
        old: &'a [u8],
        new: &'a [u8],
    },
    Link {
        arg: LinkIn,
        name: &'a [u8],
    },
    Open {
        arg: OpenIn,
    },
    Read {
        arg: ReadIn,
    },
    Write {
        arg: WriteIn,
        data: &'a [u8],
    },
    Statfs,
    Release {
        arg: ReleaseIn,
    },
    Fsync {
        arg: FsyncIn,
    },
    Setxattr {
        arg: SetxattrIn,
        name: &'a [u8],
        value: &'a [u8],
    },
    Getxattr {
        arg: GetxattrIn,
        name: &'a [u8],
    },
    Listxattr {
        arg: GetxattrIn,
    },
    Removexattr {
        name: &'a [u8],
    },
    Flush {
        arg: FlushIn,
    },
    Init {
        arg: InitIn,
    },
    Opendir {
        arg: OpenIn,
    },
    Readdir {
        arg: ReadIn,
    },
    Releasedir {
        arg: ReleaseIn,
    },
    Fsyncdir {
        arg: FsyncIn,
    },
    Getlk {
        arg: LkIn,
    },
    Setlk {
        arg: LkIn,
    },
    Setlkw {
        arg: LkIn,
    },
    Access {
        arg: AccessIn,
    },
    Create {
        arg: CreateIn,
        name: &'a [u8],
    },
    Interrupt {
        arg: InterruptIn,
    },
    Bmap {
        arg: BmapIn,
    },
    Destroy,
    Ioctl {
        arg: IoctlIn,
        data: &'a [u8],
    },
    Poll {
        arg: PollIn,
    },
    NotifyReply {
        arg: NotifyRetrieveIn,
        data: &'a [u8],
    },
    BatchForget {
        arg: BatchForgetIn,
        nodes: Vec<ForgetOne>,
    },
    Fallocate {
        arg: FallocateIn,
    },
    Readdirplus {
        arg: ReadIn,
    },
    Rename2 {
        arg: Rename2In,
        old: &'a [u8],
        new: &'a [u8],
    },
    Lseek {
        arg: LseekIn,
    },
    CopyFileRange {
        arg: CopyFileRangeIn,
    },
    Setupmapping {
        arg: SetupmappingIn,
    },
    Removemapping {
        arg: RemovemappingIn,
        ranges: Vec<RemovemappingOne>,
    },
    Syncfs {
        arg: SyncfsIn,
    },
    Tmpfile {
        arg: CreateIn,
        name: &'a [u8],
    },
    Statx {
        arg: StatxIn,
    },
    CopyFileRange64 {
        arg: CopyFileRangeIn,
    },
    CuseInit {
        arg: CuseInitIn,
    },
}

pub(super) fn decode_op<'a>(
    opcode: Opcode,
    c: &mut ArgBytes<'a>,
    opts: DecodeOptions,
) -> Result<Operation<'a>, DecodeError> {
    use Operation as O;
    Ok(match opcode {
        Opcode::Lookup => O::Lookup {
            name: c.name("LOOKUP name")?,
        },
        Opcode::Forget => O::Forget {
            arg: c.read("fuse_forget_in")?,
        },
        Opcode::Getattr => O::Getattr {
            arg: c.read("fuse_getattr_in")?,
        },
        Opcode::Setattr => O::Setattr {
            arg: c.read("fuse_setattr_in")?,
        },
        Opcode::Readlink => O::Readlink,
        Opcode::Symlink => O::Symlink {
            name: c.name("SYMLINK name")?,
            target: c.cstr("SYMLINK target")?,
        },
        Opcode::Mknod => {
            let arg = if opts.minor < 12 {
                c.read_compat("fuse_mknod_in", crate::abi::consts::COMPAT_MKNOD_IN_SIZE)?
            } else {
                c.read("fuse_mknod_in")?
            };
            O::Mknod {
                arg,
                name: c.name("MKNOD name")?,
            }
        }
        Opcode::Mkdir => O::Mkdir {
            arg: c.read("fuse_mkdir_in")?,
            name: c.name("MKDIR name")?,
        },
        Opcode::Unlink => O::Unlink {
            name: c.name("UNLINK name")?,
        },
        Opcode::Rmdir => O::Rmdir {
            name: c.name("RMDIR name")?,
        },
        Opcode::Rename => O::Rename {
            arg: c.read("fuse_rename_in")?,
            old: c.name("RENAME old")?,
            new: c.name("RENAME new")?,
        },
        Opcode::Link => O::Link {
            arg: c.read("fuse_link_in")?,
            name: c.name("LINK name")?,
        },
        Opcode::Open => O::Open {
            arg: c.read("fuse_open_in")?,
        },
        Opcode::Read => O::Read {
            arg: c.read("fuse_read_in")?,
        },
        Opcode::Write => {
            let arg: WriteIn = if opts.minor < 9 {
                c.read_compat("fuse_write_in", COMPAT_WRITE_IN_SIZE)?
            } else {
                c.read("fuse_write_in")?
            };
            let data = if opts.write_data_elsewhere {
                &[][..]
            } else {
                c.bytes(arg.size as usize, "WRITE data")?
            };
            O::Write { arg, data }
        }
        Opcode::Statfs => O::Statfs,
        Opcode::Release => O::Release {
            arg: c.read("fuse_release_in")?,
        },
        Opcode::Fsync => O::Fsync {
            arg: c.read("fuse_fsync_in")?,
        },
        Opcode::Setxattr => {
            let arg: SetxattrIn = if opts.flags & init::SETXATTR_EXT != 0 {
                c.read("fuse_setxattr_in")?
            } else {
                // The compat form is exactly 8 bytes (size, flags) and the
                // name follows at once: read_compat would take 16.
                let b = c.struct_bytes(COMPAT_SETXATTR_IN_SIZE, "fuse_setxattr_in")?;
                let word = |i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
                SetxattrIn {
                    size: word(0),
                    flags: word(4),
                    ..Default::default()
                }
            };
            let name = c.cstr("SETXATTR name")?;
            if name.is_empty() {
                return Err(DecodeError::BadName("SETXATTR name"));
            }
            let value = c.bytes(arg.size as usize, "SETXATTR value")?;
            O::Setxattr { arg, name, value }
        }
        Opcode::Getxattr => O::Getxattr {
            arg: c.read("fuse_getxattr_in")?,
            name: c.cstr("GETXATTR name")?,
        },
        Opcode::Listxattr => O::Listxattr {
            arg: c.read("fuse_getxattr_in")?,
        },
        Opcode::Removexattr => O::Removexattr {
            name: c.cstr("REMOVEXATTR name")?,
        },
        Opcode::Flush => O::Flush {
            arg: c.read("fuse_flush_in")?,
        },
        Opcode::Init => O::Init {
            arg: c.read_compat("fuse_init_in", 8)?,
        },
        Opcode::Opendir => O::Opendir {
            arg: c.read("fuse_open_in")?,
        },
        Opcode::Readdir => O::Readdir {
            arg: c.read("fuse_read_in")?,
        },
        Opcode::Releasedir => O::Releasedir {
            arg: c.read("fuse_release_in")?,
        },
        Opcode::Fsyncdir => O::Fsyncdir {
            arg: c.read("fuse_fsync_in")?,
        },
        Opcode::Getlk => O::Getlk {
            arg: c.read("fuse_lk_in")?,
        },
        Opcode::Setlk => O::Setlk {
            arg: c.read("fuse_lk_in")?,
        },
        Opcode::Setlkw => O::Setlkw {
            arg: c.read("fuse_lk_in")?,
        },
        Opcode::Access => O::Access {
            arg: c.read("fuse_access_in")?,
        },
        Opcode::Create => O::Create {
            arg: c.read("fuse_create_in")?,
            name: c.name("CREATE name")?,
        },
        Opcode::Interrupt => O::Interrupt {
            arg: c.read("fuse_interrupt_in")?,
        },
        Opcode::Bmap => O::Bmap {
            arg: c.read("fuse_bmap_in")?,
        },
        Opcode::Destroy => O::Destroy,
        Opcode::Ioctl => {
            let arg: IoctlIn = c.read("fuse_ioctl_in")?;
            let data = c.bytes(arg.in_size as usize, "IOCTL data")?;
            O::Ioctl { arg, data }
        }
        Opcode::Poll => O::Poll {
            arg: c.read("fuse_poll_in")?,
        },
        Opcode::NotifyReply => {
            let arg: NotifyRetrieveIn = c.read("fuse_notify_retrieve_in")?;
            let data = c.bytes(arg.size as usize, "NOTIFY_REPLY data")?;
            O::NotifyReply { arg, data }
        }
        Opcode::BatchForget => {
            let arg: BatchForgetIn = c.read("fuse_batch_forget_in")?;
            let nodes = c.array(arg.count, "fuse_forget_one")?;
            O::BatchForget { arg, nodes }
        }
        Opcode::Fallocate => O::Fallocate {
            arg: c.read("fuse_fallocate_in")?,
        },
        Opcode::Readdirplus => O::Readdirplus {
            arg: c.read("fuse_read_in")?,
        },
        Opcode::Rename2 => O::Rename2 {
            arg: c.read("fuse_rename2_in")?,
            old: c.name("RENAME2 old")?,
            new: c.name("RENAME2 new")?,
        },
        Opcode::Lseek => O::Lseek {
            arg: c.read("fuse_lseek_in")?,
        },
        Opcode::CopyFileRange => O::CopyFileRange {
            arg: c.read("fuse_copy_file_range_in")?,
        },
        Opcode::Setupmapping => O::Setupmapping {
            arg: c.read("fuse_setupmapping_in")?,
        },
        Opcode::Removemapping => {
            let arg: RemovemappingIn = c.read("fuse_removemapping_in")?;
            let ranges = c.array(arg.count, "fuse_removemapping_one")?;
            O::Removemapping { arg, ranges }
        }
        Opcode::Syncfs => O::Syncfs {
            arg: c.read("fuse_syncfs_in")?,
        },
        Opcode::Tmpfile => O::Tmpfile {
            arg: c.read("fuse_create_in")?,
            // The kernel sends the unnamed dentry's name, "/".
            name: c.cstr("TMPFILE name")?,
        },
        Opcode::Statx => O::Statx {
            arg: c.read("fuse_statx_in")?,
        },
        Opcode::CopyFileRange64 => O::CopyFileRange64 {
            arg: c.read("fuse_copy_file_range_in")?,
        },
        Opcode::CuseInit => O::CuseInit {
            arg: c.read("cuse_init_in")?,
        },
        Opcode::CuseInitBswapReserved | Opcode::FuseInitBswapReserved => {
            return Err(DecodeError::UnknownOpcode(opcode as u32))
        }
    })
}

/// Size of the per-opcode struct that travels in a ring entry's `op_in`
/// (the request's first argument); everything after it goes to the payload.
pub fn op_in_size(opcode: Opcode, opts: DecodeOptions) -> usize {
    use core::mem::size_of;
    match opcode {
        Opcode::Lookup
        | Opcode::Readlink
        | Opcode::Symlink
        | Opcode::Unlink
        | Opcode::Rmdir
        | Opcode::Statfs
        | Opcode::Removexattr
        | Opcode::Destroy => 0,
        Opcode::Forget => size_of::<ForgetIn>(),
        Opcode::Getattr => size_of::<GetattrIn>(),
        Opcode::Setattr => size_of::<SetattrIn>(),
        Opcode::Mknod => size_of::<MknodIn>(),
        Opcode::Mkdir => size_of::<MkdirIn>(),
        Opcode::Rename => size_of::<RenameIn>(),
        Opcode::Link => size_of::<LinkIn>(),
        Opcode::Open | Opcode::Opendir => size_of::<OpenIn>(),
        Opcode::Read | Opcode::Readdir | Opcode::Readdirplus => size_of::<ReadIn>(),
        Opcode::Write => size_of::<WriteIn>(),
        Opcode::Release | Opcode::Releasedir => size_of::<ReleaseIn>(),
        Opcode::Fsync | Opcode::Fsyncdir => size_of::<FsyncIn>(),
        Opcode::Setxattr if opts.flags & init::SETXATTR_EXT != 0 => size_of::<SetxattrIn>(),
        Opcode::Setxattr => COMPAT_SETXATTR_IN_SIZE,
        Opcode::Getxattr | Opcode::Listxattr => size_of::<GetxattrIn>(),
        Opcode::Flush => size_of::<FlushIn>(),
        Opcode::Init => size_of::<InitIn>(),
        Opcode::Getlk | Opcode::Setlk | Opcode::Setlkw => size_of::<LkIn>(),
        Opcode::Access => size_of::<AccessIn>(),
        Opcode::Create | Opcode::Tmpfile => size_of::<CreateIn>(),
        Opcode::Interrupt => size_of::<InterruptIn>(),
        Opcode::Bmap => size_of::<BmapIn>(),
        Opcode::Ioctl => size_of::<IoctlIn>(),
        Opcode::Poll => size_of::<PollIn>(),
        Opcode::NotifyReply => size_of::<NotifyRetrieveIn>(),
        Opcode::BatchForget => size_of::<BatchForgetIn>(),
        Opcode::Fallocate => size_of::<FallocateIn>(),
        Opcode::Rename2 => size_of::<Rename2In>(),
        Opcode::Lseek => size_of::<LseekIn>(),
        Opcode::CopyFileRange | Opcode::CopyFileRange64 => size_of::<CopyFileRangeIn>(),
        Opcode::Setupmapping => size_of::<SetupmappingIn>(),
        Opcode::Removemapping => size_of::<RemovemappingIn>(),
        Opcode::Syncfs => size_of::<SyncfsIn>(),
        Opcode::Statx => size_of::<StatxIn>(),
        Opcode::CuseInit => size_of::<CuseInitIn>(),
        Opcode::CuseInitBswapReserved | Opcode::FuseInitBswapReserved => 0,
    }
}
