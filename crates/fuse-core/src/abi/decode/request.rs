//! Framing a request: the header checked against the message, the
//! extensions split off its end and checked, and the arguments handed to
//! [`Operation`]'s decoder, whole (device) or split (ring).

use super::operation::{decode_op, Operation};
use super::{validate_extensions, Cursor, DecodeError};
use crate::abi::consts::{init, Opcode};
use crate::abi::structs::InHeader;
use zerocopy::FromBytes;

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
    /// [`creation_security_context`](super::creation_security_context)).
    pub trailing: &'a [u8],
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
            minor: crate::abi::consts::KERNEL_MINOR_VERSION,
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
pub(super) struct ArgBytes<'a> {
    fixed: Option<Cursor<'a>>,
    rest: Cursor<'a>,
}

impl<'a> ArgBytes<'a> {
    pub(super) fn read<T: FromBytes>(&mut self, what: &'static str) -> Result<T, DecodeError> {
        self.fixed.as_mut().unwrap_or(&mut self.rest).read(what)
    }
    pub(super) fn read_compat<T: FromBytes + zerocopy::IntoBytes + Default>(
        &mut self,
        what: &'static str,
        min: usize,
    ) -> Result<T, DecodeError> {
        self.fixed
            .as_mut()
            .unwrap_or(&mut self.rest)
            .read_compat(what, min)
    }
    pub(super) fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        self.rest.bytes(n, what)
    }
    /// The raw bytes of a per-opcode struct (from `fixed` when split).
    pub(super) fn struct_bytes(
        &mut self,
        n: usize,
        what: &'static str,
    ) -> Result<&'a [u8], DecodeError> {
        self.fixed.as_mut().unwrap_or(&mut self.rest).bytes(n, what)
    }
    pub(super) fn cstr(&mut self, what: &'static str) -> Result<&'a [u8], DecodeError> {
        self.rest.cstr(what)
    }
    pub(super) fn name(&mut self, what: &'static str) -> Result<&'a [u8], DecodeError> {
        self.rest.name(what)
    }
    pub(super) fn array<T: FromBytes>(
        &mut self,
        count: u32,
        what: &'static str,
    ) -> Result<Vec<T>, DecodeError> {
        self.rest.array(count, what)
    }
}
