//! Decoding a server's replies and notifications (the client side, and
//! tests): the header checked, the body typed by the request's opcode,
//! READDIR and READDIRPLUS listings record by record.

use super::{Cursor, DecodeError};
use crate::abi::consts::Opcode;
use crate::abi::structs::*;

/// A decoded reply (or notification) from a server.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedReply<'a> {
    /// The reply header.
    pub header: OutHeader,
    /// The typed body (empty for error replies).
    pub body: ReplyBody<'a>,
}

/// One directory entry of a READDIR reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodedDirent<'a> {
    /// The entry's fixed fields.
    pub dirent: Dirent,
    /// The entry's name.
    pub name: &'a [u8],
}

/// Typed reply bodies.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq)]
pub enum ReplyBody<'a> {
    /// An error reply, or a success with no body.
    Empty,
    Entry(EntryOut),
    Attr(AttrOut),
    Open(OpenOut),
    Create {
        entry: EntryOut,
        open: OpenOut,
    },
    Write(WriteOut),
    Statfs(StatfsOut),
    Xattr(GetxattrOut),
    Lock(LkOut),
    Init(InitOut),
    CuseInit(CuseInitOut),
    Bmap(BmapOut),
    Ioctl {
        arg: IoctlOut,
        data: &'a [u8],
    },
    Poll(PollOut),
    Lseek(LseekOut),
    Statx(StatxOut),
    CopyFileRange64(CopyFileRangeOut),
    Dir(Vec<DecodedDirent<'a>>),
    DirPlus(Vec<(EntryOut, DecodedDirent<'a>)>),
    /// READ, READLINK, GETXATTR/LISTXATTR with a size: raw data.
    Data(&'a [u8]),
    /// A notification (unique 0): code and raw body.
    Notify {
        code: i32,
        body: &'a [u8],
    },
}

/// Checks a reply header the way the kernel's device write does.
pub fn decode_out_header(buf: &[u8]) -> Result<OutHeader, DecodeError> {
    let h: OutHeader = Cursor::new(buf).read("fuse_out_header")?;
    if h.len as usize != buf.len() {
        return Err(DecodeError::BadLength {
            header: h.len as usize,
            actual: buf.len(),
        });
    }
    Ok(h)
}

/// Decodes a reply to a request of `opcode`. `getxattr_size` is the `size`
/// the GETXATTR/LISTXATTR request asked for (0 selects `fuse_getxattr_out`).
pub fn decode_reply<'a>(
    opcode: Opcode,
    buf: &'a [u8],
    getxattr_size: u32,
) -> Result<DecodedReply<'a>, DecodeError> {
    let header = decode_out_header(buf)?;
    let mut c = Cursor::new(buf.get(core::mem::size_of::<OutHeader>()..).unwrap_or(&[]));
    if header.unique == 0 {
        return Ok(DecodedReply {
            header,
            body: ReplyBody::Notify {
                code: header.error,
                body: c.rest(),
            },
        });
    }
    if header.error != 0 {
        return Ok(DecodedReply {
            header,
            body: ReplyBody::Empty,
        });
    }
    use ReplyBody as B;
    let body = match opcode {
        Opcode::Lookup | Opcode::Mknod | Opcode::Mkdir | Opcode::Symlink | Opcode::Link => {
            B::Entry(c.read("fuse_entry_out")?)
        }
        Opcode::Getattr | Opcode::Setattr => B::Attr(c.read("fuse_attr_out")?),
        Opcode::Open | Opcode::Opendir => B::Open(c.read("fuse_open_out")?),
        Opcode::Create | Opcode::Tmpfile => B::Create {
            entry: c.read("fuse_entry_out")?,
            open: c.read("fuse_open_out")?,
        },
        Opcode::Write | Opcode::CopyFileRange => B::Write(c.read("fuse_write_out")?),
        Opcode::Statfs => B::Statfs(c.read_compat("fuse_statfs_out", 48)?),
        Opcode::Getxattr | Opcode::Listxattr if getxattr_size == 0 => {
            B::Xattr(c.read("fuse_getxattr_out")?)
        }
        Opcode::Getlk => B::Lock(c.read("fuse_lk_out")?),
        Opcode::Init => B::Init(c.read_compat("fuse_init_out", 8)?),
        Opcode::CuseInit => B::CuseInit(c.read("cuse_init_out")?),
        Opcode::Bmap => B::Bmap(c.read("fuse_bmap_out")?),
        Opcode::Ioctl => B::Ioctl {
            arg: c.read("fuse_ioctl_out")?,
            data: c.rest(),
        },
        Opcode::Poll => B::Poll(c.read("fuse_poll_out")?),
        Opcode::Lseek => B::Lseek(c.read("fuse_lseek_out")?),
        Opcode::Statx => B::Statx(c.read("fuse_statx_out")?),
        Opcode::CopyFileRange64 => B::CopyFileRange64(c.read("fuse_copy_file_range_out")?),
        Opcode::Readdir => B::Dir(decode_dirents(c.rest())?),
        Opcode::Readdirplus => B::DirPlus(decode_direntplus(c.rest())?),
        Opcode::Read | Opcode::Readlink | Opcode::Getxattr | Opcode::Listxattr => B::Data(c.rest()),
        _ => B::Empty,
    };
    Ok(DecodedReply { header, body })
}

fn dirent_name<'a>(c: &mut Cursor<'a>, d: &Dirent) -> Result<&'a [u8], DecodeError> {
    let name = c.bytes(d.namelen as usize, "dirent name")?;
    if name.is_empty() || name.contains(&0) || name.contains(&b'/') {
        return Err(DecodeError::BadName("dirent name"));
    }
    let pad = dirent_size(d.namelen as usize) - core::mem::size_of::<Dirent>() - name.len();
    // The last record may omit its padding.
    let pad = pad.min(c.len());
    c.bytes(pad, "dirent padding")?;
    Ok(name)
}

/// Decodes a READDIR reply body.
pub fn decode_dirents(buf: &[u8]) -> Result<Vec<DecodedDirent<'_>>, DecodeError> {
    let mut c = Cursor::new(buf);
    let mut out = Vec::new();
    while !c.is_empty() {
        let dirent: Dirent = c.read("fuse_dirent")?;
        let name = dirent_name(&mut c, &dirent)?;
        out.push(DecodedDirent { dirent, name });
    }
    Ok(out)
}

/// Decodes a READDIRPLUS reply body.
pub fn decode_direntplus(buf: &[u8]) -> Result<Vec<(EntryOut, DecodedDirent<'_>)>, DecodeError> {
    let mut c = Cursor::new(buf);
    let mut out = Vec::new();
    while !c.is_empty() {
        let plus: DirentPlus = c.read("fuse_direntplus")?;
        let name = {
            // direntplus padding is computed over the whole record.
            let n = c.bytes(plus.dirent.namelen as usize, "direntplus name")?;
            if n.is_empty() || n.contains(&0) || n.contains(&b'/') {
                return Err(DecodeError::BadName("direntplus name"));
            }
            let pad = direntplus_size(n.len()) - core::mem::size_of::<DirentPlus>() - n.len();
            c.bytes(pad.min(c.len()), "direntplus padding")?;
            n
        };
        out.push((
            plus.entry_out,
            DecodedDirent {
                dirent: plus.dirent,
                name,
            },
        ));
    }
    Ok(out)
}
