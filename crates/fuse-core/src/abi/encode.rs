//! Building FUSE messages: a small byte builder used by clients, servers and
//! tests so that nobody hand-assembles headers.

use super::structs::{
    Dirent, DirentPlus, EntryOut, ExtHeader, InHeader, OutHeader, Secctx, SecctxHeader, SuppGroups,
};
use zerocopy::{Immutable, IntoBytes};

/// Appends structs, bytes and C strings to a message body.
#[derive(Debug, Default, Clone)]
pub struct Body(pub Vec<u8>);

impl Body {
    /// An empty body.
    pub fn new() -> Self {
        Body(Vec::new())
    }
    /// Appends a struct's bytes.
    pub fn push<T: IntoBytes + Immutable>(mut self, v: &T) -> Self {
        self.0.extend_from_slice(v.as_bytes());
        self
    }
    /// Appends raw bytes.
    pub fn bytes(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    /// Appends a string and its terminating NUL.
    pub fn cstr(mut self, s: &[u8]) -> Self {
        self.0.extend_from_slice(s);
        self.0.push(0);
        self
    }
    /// The finished body.
    pub fn into_vec(self) -> Vec<u8> {
        self.0
    }
}

/// A request extension with one security label (FUSE_SECURITY_CTX) as
/// the kernel builds it: a `fuse_secctx_header` (total size, one label),
/// a `fuse_secctx` (the value's size), `name` with its NUL, `value`, zero
/// padding to 8 bytes. Append it after the request's arguments and add
/// its length / 8 to `total_extlen`.
pub fn secctx_ext(name: &[u8], value: &[u8]) -> Vec<u8> {
    let rec = core::mem::size_of::<Secctx>() + name.len() + 1 + value.len();
    let total = core::mem::size_of::<SecctxHeader>() + rec.next_multiple_of(8);
    let mut b = Body::new()
        .push(&SecctxHeader {
            size: total as u32,
            nr_secctx: 1,
        })
        .push(&Secctx {
            size: value.len() as u32,
            padding: 0,
        })
        .cstr(name)
        .bytes(value)
        .into_vec();
    b.resize(total, 0);
    b
}

/// A supplementary-groups request extension (FUSE_EXT_GROUPS) as the
/// kernel builds it: a `fuse_ext_header`, a `fuse_supp_groups` with
/// `gids.len()`, the gids, zero padding to 8 bytes. Append it after the
/// request's arguments (and any label extension) and add its length / 8
/// to `total_extlen`.
pub fn groups_ext(gids: &[u32]) -> Vec<u8> {
    let body = core::mem::size_of::<SuppGroups>() + 4 * gids.len();
    let total = (core::mem::size_of::<ExtHeader>() + body).next_multiple_of(8);
    let mut b = Body::new()
        .push(&ExtHeader {
            size: total as u32,
            typ: super::consts::EXT_GROUPS,
        })
        .push(&SuppGroups {
            nr_groups: gids.len() as u32,
        });
    for g in gids {
        b = b.push(g);
    }
    let mut b = b.into_vec();
    b.resize(total, 0);
    b
}

/// A complete request message: header followed by `body`.
pub fn request(mut header: InHeader, body: &[u8]) -> Vec<u8> {
    let len = core::mem::size_of::<InHeader>() + body.len();
    header.len = u32::try_from(len).unwrap_or(u32::MAX);
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(header.as_bytes());
    v.extend_from_slice(body);
    v
}

/// A complete reply message: `fuse_out_header` followed by `body`.
/// `error` is a negative errno or 0.
pub fn reply(unique: u64, error: i32, body: &[u8]) -> Vec<u8> {
    let len = core::mem::size_of::<OutHeader>() + body.len();
    let h = OutHeader {
        len: u32::try_from(len).unwrap_or(u32::MAX),
        error,
        unique,
    };
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(h.as_bytes());
    v.extend_from_slice(body);
    v
}

/// Appends one READDIR record if it fits in `max` bytes in total; returns
/// whether it was added.
pub fn push_dirent(
    buf: &mut Vec<u8>,
    max: usize,
    ino: u64,
    off: u64,
    typ: u32,
    name: &[u8],
) -> bool {
    let size = super::structs::dirent_size(name.len());
    if buf.len() + size > max {
        return false;
    }
    let d = Dirent {
        ino,
        off,
        namelen: name.len() as u32,
        typ,
    };
    let start = buf.len();
    buf.extend_from_slice(d.as_bytes());
    buf.extend_from_slice(name);
    buf.resize(start + size, 0);
    true
}

/// Appends one READDIRPLUS record if it fits in `max` bytes in total.
pub fn push_direntplus(
    buf: &mut Vec<u8>,
    max: usize,
    entry: &EntryOut,
    off: u64,
    typ: u32,
    name: &[u8],
) -> bool {
    let size = super::structs::direntplus_size(name.len());
    if buf.len() + size > max {
        return false;
    }
    let d = DirentPlus {
        entry_out: *entry,
        dirent: Dirent {
            ino: entry.attr.ino,
            off,
            namelen: name.len() as u32,
            typ,
        },
    };
    let start = buf.len();
    buf.extend_from_slice(d.as_bytes());
    buf.extend_from_slice(name);
    buf.resize(start + size, 0);
    true
}
