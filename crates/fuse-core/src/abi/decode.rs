//! Bounds-checked decoding of untrusted FUSE messages. Nothing here panics on
//! any input: every read goes through [`Cursor`], which returns
//! [`DecodeError`] instead of indexing out of range.
//!
//! Requests are framed in `request.rs` (header, extensions, the split form
//! of the ring) and their per-opcode arguments decoded in `operation.rs`;
//! request extensions (the security label) in `extensions.rs`; replies and
//! directory listings in `reply.rs`.

mod extensions;
mod operation;
mod reply;
mod request;

pub(crate) use extensions::only_extension;
pub use extensions::{
    creation_security_context, security_context, validate_extensions, SecurityContext,
    FIRST_EXTENSION_MINOR,
};
pub use operation::{op_in_size, Operation};
pub use reply::{
    decode_direntplus, decode_dirents, decode_out_header, decode_reply, DecodedDirent,
    DecodedReply, ReplyBody,
};
pub use request::{decode_request, decode_split, DecodeOptions, Request};
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
