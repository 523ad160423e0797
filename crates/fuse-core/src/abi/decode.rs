//! Bounds-checked decoding of untrusted FUSE messages. Nothing here panics on
//! any input: every read goes through [`Cursor`], which returns
//! [`DecodeError`] instead of indexing out of range.

use super::consts::{init, Opcode, COMPAT_SETXATTR_IN_SIZE, COMPAT_WRITE_IN_SIZE};
use super::structs::*;
use zerocopy::FromBytes;

/// Why a message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The buffer ended before a field did.
    #[error("message truncated: needed {needed} bytes for {what}, {left} left")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Bytes needed.
        needed: usize,
        /// Bytes that were left.
        left: usize,
    },
    /// `len` in the header disagrees with the buffer.
    #[error("header length {header} disagrees with message length {actual}")]
    BadLength {
        /// Length claimed by the header.
        header: usize,
        /// Length of the buffer.
        actual: usize,
    },
    /// A name was not NUL-terminated or contained a '/'.
    #[error("malformed name in {0}")]
    BadName(&'static str),
    /// The opcode is not part of the protocol.
    #[error("unknown opcode {0}")]
    UnknownOpcode(u32),
    /// An extension header is inconsistent.
    #[error("malformed request extension")]
    BadExtension,
    /// A creating request lacks the security label block every kernel
    /// sends once FUSE_SECURITY_CTX is negotiated.
    #[error("creating request without its security context block")]
    MissingSecurityContext,
    /// A count field asks for more elements than the message holds.
    #[error("count {count} of {what} exceeds the message")]
    BadCount {
        /// What was counted.
        what: &'static str,
        /// The count in the message.
        count: u32,
    },
}

/// A forward-only reader over untrusted bytes.
#[derive(Debug, Clone)]
pub struct Cursor<'a> {
    buf: &'a [u8],
}

impl<'a> Cursor<'a> {
    /// Starts reading `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Cursor { buf }
    }

    /// Bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        self.buf
    }

    /// Number of bytes not read yet.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether everything was read.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Reads a struct (copying, so the buffer needs no alignment).
    pub fn read<T: FromBytes>(&mut self, what: &'static str) -> Result<T, DecodeError> {
        match T::read_from_prefix(self.buf) {
            Ok((v, rest)) => {
                self.buf = rest;
                Ok(v)
            }
            Err(_) => Err(DecodeError::Truncated {
                what,
                needed: core::mem::size_of::<T>(),
                left: self.buf.len(),
            }),
        }
    }

    /// Reads a struct that older protocol versions sent shorter: missing
    /// trailing bytes read as zero, but at least `min` bytes must be there.
    pub fn read_compat<T: FromBytes + zerocopy::IntoBytes + Default>(
        &mut self,
        what: &'static str,
        min: usize,
    ) -> Result<T, DecodeError> {
        let full = core::mem::size_of::<T>();
        if self.buf.len() >= full {
            return self.read(what);
        }
        if self.buf.len() < min {
            return Err(DecodeError::Truncated {
                what,
                needed: min,
                left: self.buf.len(),
            });
        }
        let mut v = T::default();
        let n = self.buf.len();
        v.as_mut_bytes()[..n].copy_from_slice(self.buf);
        self.buf = &[];
        Ok(v)
    }

    /// Takes `n` raw bytes.
    pub fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if n > self.buf.len() {
            return Err(DecodeError::Truncated {
                what,
                needed: n,
                left: self.buf.len(),
            });
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }

    /// Takes a NUL-terminated string (without the NUL). No interior NUL can
    /// occur by construction.
    pub fn cstr(&mut self, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let pos = self
            .buf
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::BadName(what))?;
        let (s, rest) = self.buf.split_at(pos);
        self.buf = rest.get(1..).unwrap_or(&[]);
        Ok(s)
    }

    /// Takes a NUL-terminated path component: non-empty and without '/'.
    pub fn name(&mut self, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let s = self.cstr(what)?;
        if s.is_empty() || s.contains(&b'/') {
            return Err(DecodeError::BadName(what));
        }
        Ok(s)
    }

    /// Reads `count` structs of type T as a vector.
    pub fn array<T: FromBytes>(
        &mut self,
        count: u32,
        what: &'static str,
    ) -> Result<Vec<T>, DecodeError> {
        let size = core::mem::size_of::<T>();
        let total = (count as usize).checked_mul(size);
        match total {
            Some(t) if t <= self.buf.len() => {}
            _ => return Err(DecodeError::BadCount { what, count }),
        }
        (0..count).map(|_| self.read::<T>(what)).collect()
    }
}

/// One decoded request: its header and typed arguments, borrowing the buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct Request<'a> {
    /// The header as sent.
    pub header: InHeader,
    /// The decoded opcode-specific arguments.
    pub op: Operation<'a>,
    /// Raw request extensions (security contexts, supplementary groups).
    pub ext: &'a [u8],
    /// The bytes after the opcode's arguments and before the extensions:
    /// ignored by every opcode, except that before protocol 7.38 a
    /// creating request's security label travelled there (see
    /// [`creation_security_context`]).
    pub trailing: &'a [u8],
}

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

/// What the decoder needs to know about the negotiated connection.
#[derive(Debug, Clone, Copy)]
pub struct DecodeOptions {
    /// Negotiated minor version.
    pub minor: u32,
    /// Negotiated INIT flags (for SETXATTR_EXT).
    pub flags: u64,
    /// A WRITE's data travels elsewhere (the client's memory, by
    /// reference): decode it with empty `data`.
    pub write_data_elsewhere: bool,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions {
            minor: super::consts::KERNEL_MINOR_VERSION,
            flags: init::SETXATTR_EXT,
            write_data_elsewhere: false,
        }
    }
}

/// Decodes one complete request message (header included).
pub fn decode_request<'a>(buf: &'a [u8], opts: DecodeOptions) -> Result<Request<'a>, DecodeError> {
    let mut c = Cursor::new(buf);
    let header: InHeader = c.read("fuse_in_header")?;
    if header.len as usize != buf.len() {
        return Err(DecodeError::BadLength {
            header: header.len as usize,
            actual: buf.len(),
        });
    }
    let opcode =
        Opcode::from_u32(header.opcode).ok_or(DecodeError::UnknownOpcode(header.opcode))?;
    decode_parts(header, opcode, None, c.rest(), opts)
}

/// The part of decoding both forms share: the extensions split off the end
/// of `body` and checked, the arguments decoded (the op struct from
/// `fixed` if it travels apart), and what follows them kept as `trailing`.
fn decode_parts<'a>(
    header: InHeader,
    opcode: Opcode,
    fixed: Option<&'a [u8]>,
    body: &'a [u8],
    opts: DecodeOptions,
) -> Result<Request<'a>, DecodeError> {
    let ext_len = usize::from(header.total_extlen) * 8;
    if ext_len > body.len() {
        return Err(DecodeError::BadExtension);
    }
    let (body, ext) = body.split_at(body.len() - ext_len);
    validate_extensions(ext)?;
    let mut args = ArgBytes {
        fixed: fixed.map(Cursor::new),
        rest: Cursor::new(body),
    };
    let op = decode_op(opcode, &mut args, opts)?;
    let trailing = args.rest.rest();
    Ok(Request {
        header,
        op,
        ext,
        trailing,
    })
}

/// Decodes a request whose arguments arrive split, as over the ring: the
/// per-opcode struct in `op_in` (the header's 128-byte area) and every other
/// argument, then the extensions, in `payload`. `header.len` is not checked
/// against the pieces (the ring carries the payload size separately).
pub fn decode_split<'a>(
    header: InHeader,
    op_in: &'a [u8],
    payload: &'a [u8],
    opts: DecodeOptions,
) -> Result<Request<'a>, DecodeError> {
    let opcode =
        Opcode::from_u32(header.opcode).ok_or(DecodeError::UnknownOpcode(header.opcode))?;
    decode_parts(header, opcode, Some(op_in), payload, opts)
}

/// A request's argument bytes: contiguous (device), or split into the
/// per-opcode struct and the rest (ring). Structs come from `fixed` when
/// the arguments are split; names, data and arrays always from `rest`.
struct ArgBytes<'a> {
    fixed: Option<Cursor<'a>>,
    rest: Cursor<'a>,
}

impl<'a> ArgBytes<'a> {
    fn read<T: FromBytes>(&mut self, what: &'static str) -> Result<T, DecodeError> {
        self.fixed.as_mut().unwrap_or(&mut self.rest).read(what)
    }
    fn read_compat<T: FromBytes + zerocopy::IntoBytes + Default>(
        &mut self,
        what: &'static str,
        min: usize,
    ) -> Result<T, DecodeError> {
        self.fixed
            .as_mut()
            .unwrap_or(&mut self.rest)
            .read_compat(what, min)
    }
    fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        self.rest.bytes(n, what)
    }
    /// The raw bytes of a per-opcode struct (from `fixed` when split).
    fn struct_bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        self.fixed.as_mut().unwrap_or(&mut self.rest).bytes(n, what)
    }
    fn cstr(&mut self, what: &'static str) -> Result<&'a [u8], DecodeError> {
        self.rest.cstr(what)
    }
    fn name(&mut self, what: &'static str) -> Result<&'a [u8], DecodeError> {
        self.rest.name(what)
    }
    fn array<T: FromBytes>(
        &mut self,
        count: u32,
        what: &'static str,
    ) -> Result<Vec<T>, DecodeError> {
        self.rest.array(count, what)
    }
}

/// Checks that the extension area is a well-formed chain of `fuse_ext_header`s.
pub fn validate_extensions(ext: &[u8]) -> Result<(), DecodeError> {
    let mut c = Cursor::new(ext);
    while !c.is_empty() {
        let h: ExtHeader = c
            .read("fuse_ext_header")
            .map_err(|_| DecodeError::BadExtension)?;
        let size = h.size as usize;
        if size < core::mem::size_of::<ExtHeader>() || size % 8 != 0 {
            return Err(DecodeError::BadExtension);
        }
        c.bytes(size - core::mem::size_of::<ExtHeader>(), "extension")
            .map_err(|_| DecodeError::BadExtension)?;
    }
    Ok(())
}

/// A security label a client sends with a creating request (CREATE,
/// MKNOD, MKDIR, SYMLINK, TMPFILE) once FUSE_SECURITY_CTX is negotiated:
/// the xattr name it belongs under (e.g. `security.selinux`, without its
/// NUL) and the value, as the client's LSM made it (SELinux counts the
/// context's own trailing NUL in it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecurityContext<'a> {
    /// The xattr name.
    pub name: &'a [u8],
    /// The label.
    pub value: &'a [u8],
}

/// Longest xattr name (XATTR_NAME_MAX).
const XATTR_NAME_MAX: usize = 255;

/// The security label among a request's extensions (`Request::ext`,
/// already checked by [`validate_extensions`]).
///
/// Wire layout (Linux `fuse_get_security_ctx` / `fuse_secctx_header`):
/// the label travels as an extension whose `fuse_ext_header` is a
/// `fuse_secctx_header` — `size` is the extension's length header
/// included, and the type field, `nr_secctx`, counts the labels
/// (0..=[`MAX_NR_SECCTX`](super::consts::MAX_NR_SECCTX); types above are
/// other extensions, such as `FUSE_EXT_GROUPS`, which are skipped). Each
/// label is a `fuse_secctx` (`size`: the value's length), the name with
/// its NUL, the value, and the extension ends padded to 8 bytes.
///
/// Ok(None): no label (no such extension, or one with `nr_secctx` 0, as
/// the kernel sends when no LSM labels the new inode). A second label
/// extension, more than one label (the kernel sends one; virtiofsd
/// refuses more, so does this), an empty or overlong name, an empty value
/// or one that runs past the extension, or trailing bytes beyond the
/// padding: an error (the request gets EINVAL).
pub fn security_context(ext: &[u8]) -> Result<Option<SecurityContext<'_>>, DecodeError> {
    Ok(secctx_block(ext)?.flatten())
}

/// The label block among `ext`: None when there is none at all,
/// Some(None) for one with `nr_secctx` 0 (see [`security_context`]).
fn secctx_block(ext: &[u8]) -> Result<Option<Option<SecurityContext<'_>>>, DecodeError> {
    only_extension(
        ext,
        |typ| typ <= super::consts::MAX_NR_SECCTX,
        |typ, body| match typ {
            0 => Ok(None),
            1 => one_label(body).map(Some),
            _ => Err(DecodeError::BadExtension),
        },
    )
}

/// The one extension among `ext` whose type `pick` selects, made by
/// `read` of its type and body; the others are skipped. None when there
/// is none; a second one is an error.
pub(crate) fn only_extension<'a, T>(
    ext: &'a [u8],
    pick: impl Fn(u32) -> bool,
    read: impl Fn(u32, &'a [u8]) -> Result<T, DecodeError>,
) -> Result<Option<T>, DecodeError> {
    let mut c = Cursor::new(ext);
    let mut found = None;
    while !c.is_empty() {
        let h: ExtHeader = c.read("fuse_ext_header")?;
        let body_len = (h.size as usize)
            .checked_sub(core::mem::size_of::<ExtHeader>())
            .ok_or(DecodeError::BadExtension)?;
        let body = c.bytes(body_len, "extension")?;
        if !pick(h.typ) {
            continue;
        }
        if found.is_some() {
            return Err(DecodeError::BadExtension);
        }
        found = Some(read(h.typ, body)?);
    }
    Ok(found)
}

/// The first protocol minor whose requests carry extensions after
/// `total_extlen` (Linux 6.3).
pub const FIRST_EXTENSION_MINOR: u32 = 38;

/// The security label of a creating request `req` (CREATE, MKNOD, MKDIR,
/// SYMLINK, TMPFILE) on a connection that negotiated FUSE_SECURITY_CTX at
/// protocol minor `minor`.
///
/// Where the label block is depends on the kernel:
/// - protocol 7.38 on (Linux 6.3): a request extension, counted by the
///   header's `total_extlen` (`Request::ext`);
/// - 7.36 and 7.37 (Linux 5.17 to 6.2): the same `fuse_secctx_header`
///   block as one more plain argument after the request's last one (the
///   name, or a SYMLINK's target), with `total_extlen` still the zero
///   padding it was (`Request::trailing`). Stable 6.1 kernels from 6.1.110
///   carry the 6.3 extension code at minor 37, so there a non-zero
///   `total_extlen` means the extension layout.
///
/// Every such kernel sends the block with every creating request, an
/// empty one (`nr_secctx` 0) when no LSM labels the inode, so a request
/// without one is refused ([`DecodeError::MissingSecurityContext`]), as
/// virtiofsd refuses it, rather than served unlabelled. Malformed blocks
/// are errors as in [`security_context`].
pub fn creation_security_context<'a>(
    req: &Request<'a>,
    minor: u32,
) -> Result<Option<SecurityContext<'a>>, DecodeError> {
    let block = if minor < FIRST_EXTENSION_MINOR && req.header.total_extlen == 0 {
        validate_extensions(req.trailing)?;
        req.trailing
    } else {
        req.ext
    };
    secctx_block(block)?.ok_or(DecodeError::MissingSecurityContext)
}

/// The one `fuse_secctx` record of a label extension's body.
fn one_label(body: &[u8]) -> Result<SecurityContext<'_>, DecodeError> {
    let mut c = Cursor::new(body);
    let rec: Secctx = c.read("fuse_secctx")?;
    let name = c.cstr("security context name")?;
    if name.is_empty() || name.len() > XATTR_NAME_MAX {
        return Err(DecodeError::BadName("security context name"));
    }
    let value = c.bytes(rec.size as usize, "security context")?;
    // Only the padding to the next 8 bytes may follow.
    if value.is_empty() || c.len() >= 8 {
        return Err(DecodeError::BadExtension);
    }
    Ok(SecurityContext { name, value })
}

fn decode_op<'a>(
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
                c.read_compat("fuse_mknod_in", super::consts::COMPAT_MKNOD_IN_SIZE)?
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
