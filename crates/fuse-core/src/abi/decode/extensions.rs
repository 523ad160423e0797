//! Request extensions: the chain of `fuse_ext_header`s checked, and the
//! security label a creating request carries (the supplementary groups
//! are `abi/groups.rs`'s, through [`only_extension`]).

use super::request::Request;
use super::{Cursor, DecodeError};
use crate::abi::structs::{ExtHeader, Secctx};

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
/// (0..=[`MAX_NR_SECCTX`](crate::abi::MAX_NR_SECCTX); types above are
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
        |typ| typ <= crate::abi::consts::MAX_NR_SECCTX,
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
