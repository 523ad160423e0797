//! POSIX ACLs in their xattr form, for the ACL tests of uring-ring
//! (`posix_acl.rs`) and of the fusebox binary (`host_acl.rs`, which
//! includes this file by path).
#![allow(dead_code)]

pub const USER_OBJ: u16 = 0x01;
pub const USER: u16 = 0x02;
pub const GROUP_OBJ: u16 = 0x04;
pub const MASK: u16 = 0x10;
pub const OTHER: u16 = 0x20;
/// The id of an entry that names nobody (owner, group, mask, other).
pub const NONE: u32 = u32::MAX;

/// The xattr form of an ACL (`posix_acl_xattr_header`, version 2, then
/// `{tag: u16, perm: u16, id: u32}` entries in tag order).
pub fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// u::rw- u:UID:r-- g::--- m::r-- o::---: the owner and `uid` may read.
pub fn reader_acl(uid: u32) -> Vec<u8> {
    acl(&[
        (USER_OBJ, 6, NONE),
        (USER, 4, uid),
        (GROUP_OBJ, 0, NONE),
        (MASK, 4, NONE),
        (OTHER, 0, NONE),
    ])
}
