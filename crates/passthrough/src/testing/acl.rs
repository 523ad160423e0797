//! POSIX ACLs in their xattr form (`system.posix_acl_access` and
//! `_default` values), built by hand for tests of ACL handling: the ACL
//! tests of the passthrough and of the fusebox binary.

/// The owner entry (`ACL_USER_OBJ`).
pub const USER_OBJ: u16 = 0x01;
/// A named user (`ACL_USER`).
pub const USER: u16 = 0x02;
/// The owning group (`ACL_GROUP_OBJ`).
pub const GROUP_OBJ: u16 = 0x04;
/// The mask entry (`ACL_MASK`).
pub const MASK: u16 = 0x10;
/// Everyone else (`ACL_OTHER`).
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

/// The host file's xattr `name` (the host's own view), if it has one.
pub fn host_xattr(path: &std::path::Path, name: &[u8]) -> Option<Vec<u8>> {
    let p = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: both names are NUL-terminated; buf is writable for its length.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (r >= 0).then(|| {
        buf.truncate(r as usize);
        buf
    })
}

/// Sets the host file's xattr `name` directly on the host.
pub fn host_setxattr(path: &std::path::Path, name: &[u8], value: &[u8]) {
    let p = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: both names are NUL-terminated; value is readable for its length.
    let r = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
}
