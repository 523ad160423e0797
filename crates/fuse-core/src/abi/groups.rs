//! The supplementary-groups request extension (`FUSE_EXT_GROUPS`): what a
//! client that negotiated FUSE_CREATE_SUPP_GROUP sends with a creating
//! request, so the server knows the caller belongs to the parent
//! directory's group.
//!
//! Wire layout (Linux `get_create_supp_group` in `fs/fuse/dir.c`): a
//! `fuse_ext_header` of type [`EXT_GROUPS`](super::consts::EXT_GROUPS),
//! then a `fuse_supp_groups` (`nr_groups`) and that many `u32` gids, the
//! whole padded to 8 bytes. Linux sends one group (the parent's, when the
//! caller is a member of it and it is not the caller's fsgid), and only
//! with CREATE, MKNOD, MKDIR, SYMLINK and TMPFILE.

use super::decode::{Cursor, DecodeError};
use super::structs::SuppGroups;

/// The most groups one extension may carry. Linux sends one; the bound
/// keeps what a request costs (a setgroups of them) and what a handle it
/// opens keeps of its opener small, where NGROUPS_MAX (65536) would let a
/// client pin 256 KiB per open file.
pub const MAX_SUPP_GROUPS: u32 = 32;

/// The gids of a supplementary-groups extension, checked: a whole number
/// of native-endian `u32`s borrowed from the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SuppGids<'a> {
    /// `4 * n` bytes: the gids, unaligned.
    raw: &'a [u8],
}

impl<'a> SuppGids<'a> {
    /// How many gids there are.
    pub fn len(&self) -> usize {
        self.raw.len() / 4
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// The gids, in the order the client sent them.
    pub fn iter(&self) -> impl Iterator<Item = u32> + 'a {
        self.raw
            .chunks_exact(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
    }
}

/// The supplementary groups among a request's extensions
/// (`Request::ext`, already checked by
/// [`validate_extensions`](super::validate_extensions)); other extension
/// types are skipped.
///
/// Ok(None): no groups extension. A second one, a `nr_groups` above
/// [`MAX_SUPP_GROUPS`], or a body whose length is not exactly `nr_groups`
/// gids padded to 8 bytes (as virtiofsd checks it): an error (the request
/// gets EINVAL).
pub fn supplementary_groups(ext: &[u8]) -> Result<Option<SuppGids<'_>>, DecodeError> {
    super::decode::only_extension(
        ext,
        |typ| typ == super::consts::EXT_GROUPS,
        |_, body| gids(body),
    )
}

/// The gids of one groups extension's body.
fn gids(body: &[u8]) -> Result<SuppGids<'_>, DecodeError> {
    let mut c = Cursor::new(body);
    let sg: SuppGroups = c.read("fuse_supp_groups")?;
    if sg.nr_groups > MAX_SUPP_GROUPS {
        return Err(DecodeError::BadExtension);
    }
    // At most 4 + 4 * 65536: no overflow.
    let n = sg.nr_groups as usize * 4;
    if body.len() != (core::mem::size_of::<SuppGroups>() + n).next_multiple_of(8) {
        return Err(DecodeError::BadExtension);
    }
    Ok(SuppGids {
        raw: c.bytes(n, "supplementary groups")?,
    })
}
