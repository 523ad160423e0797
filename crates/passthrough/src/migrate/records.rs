//! The passthrough state's records as bytes (`fuse_core::server::state`'s
//! encoding): written by [`put_inode`], [`put_handle`] and [`put_owner`],
//! read back by the `get_` functions. A count in the stream is checked
//! against the bytes left at the size of the smallest record it could
//! name ([`INODE_MIN`], [`HANDLE_MIN`], [`OWNER_MIN`]: what these writers
//! make of a record with every string and list empty, which the tests
//! check), and no reader allocates for a count: a record's strings and
//! lists only, once the stream has shown it holds them.

use super::super::creds::Cred;
use super::super::locks::SavedOwner;
use fuse_core::server::state::{StateError, StateReader, StateWriter};

/// The format this build writes and reads.
pub(super) const VERSION: u32 = 1;
/// Longest path or reason carried (PATH_MAX).
const MAX_NAME: usize = 4096;
/// Longest file handle carried (MAX_HANDLE_SZ).
const MAX_HANDLE: usize = 128;
/// Most supplementary groups of an opener (NGROUPS_MAX).
const MAX_GROUPS: usize = 65536;

const LOC_PATH: u8 = 1;
const LOC_HANDLE: u8 = 2;
const LOC_LOST: u8 = 3;

/// Encoded size of the smallest inode record: node id, references, file
/// type, a path locator with an empty path, no verify handle.
pub(super) const INODE_MIN: usize = 8 + 8 + 4 + (1 + 4) + 1;
/// Encoded size of the smallest handle record: handle, node id, flags,
/// the opener's uid, gid, root flag and an empty group list.
pub(super) const HANDLE_MIN: usize = 8 + 8 + 4 + 4 + 4 + 1 + 4;
/// Encoded size of the smallest lock owner record: node id, owner, access
/// mode, pid and an empty list of locks.
pub(super) const OWNER_MIN: usize = 8 + 8 + 4 + 4 + 4;
/// Encoded size of one of an opener's groups.
const GROUP_LEN: usize = 4;
/// Encoded size of one of an owner's locks: type, start, end.
const SPAN_LEN: usize = 4 + 8 + 8;

/// How the destination finds an inode.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Locator {
    Path(Vec<u8>),
    /// A file handle, and the path the file had below the shared
    /// directory (empty: it had none, unlinked while open), by which the
    /// destination checks the handle names a file of the share.
    Handle {
        typ: i32,
        handle: Vec<u8>,
        path: Vec<u8>,
    },
    /// The source could not name it; the text says why.
    Lost(Vec<u8>),
}

/// A file handle: its type and bytes.
pub(super) type FileHandle = (i32, Vec<u8>);

/// An inode the client holds, and how to find it.
#[derive(Debug)]
pub(super) struct InodeRec {
    pub(super) nodeid: u64,
    pub(super) refs: u64,
    pub(super) ftype: u32,
    pub(super) loc: Locator,
    /// With `verify_handles`: the source's file handle of the inode.
    pub(super) verify: Option<FileHandle>,
}

/// A handle the client holds.
#[derive(Debug)]
pub(super) struct HandleRec {
    pub(super) fh: u64,
    pub(super) nodeid: u64,
    /// Host open flags; -1: the handle was lost.
    pub(super) flags: i32,
    pub(super) opener: Cred,
}

pub(super) fn put_inode(w: &mut StateWriter, r: &InodeRec) {
    w.u64(r.nodeid).u64(r.refs).u32(r.ftype);
    match &r.loc {
        Locator::Path(p) => w.u8(LOC_PATH).bytes(p),
        Locator::Handle { typ, handle, path } => {
            w.u8(LOC_HANDLE).u32(*typ as u32).bytes(handle).bytes(path)
        }
        Locator::Lost(why) => w.u8(LOC_LOST).bytes(why),
    };
    match &r.verify {
        Some((typ, h)) => w.u8(1).u32(*typ as u32).bytes(h),
        None => w.u8(0),
    };
}

pub(super) fn get_inode(r: &mut StateReader) -> Result<InodeRec, StateError> {
    let nodeid = r.u64("node id")?;
    let refs = r.u64("lookup references")?;
    let ftype = r.u32("file type")?;
    let loc = match r.u8("locator")? {
        LOC_PATH => Locator::Path(r.bytes(MAX_NAME, "path")?.to_vec()),
        LOC_HANDLE => {
            let typ = r.u32("handle type")? as i32;
            let handle = r.bytes(MAX_HANDLE, "file handle")?.to_vec();
            Locator::Handle {
                typ,
                handle,
                path: r.bytes(MAX_NAME, "path")?.to_vec(),
            }
        }
        LOC_LOST => Locator::Lost(r.bytes(MAX_NAME, "reason")?.to_vec()),
        t => return Err(StateError::Corrupt(format!("locator tag {t}"))),
    };
    let verify = match r.u8("verify flag")? {
        0 => None,
        1 => {
            let typ = r.u32("handle type")? as i32;
            Some((typ, r.bytes(MAX_HANDLE, "file handle")?.to_vec()))
        }
        t => return Err(StateError::Corrupt(format!("verify flag {t}"))),
    };
    Ok(InodeRec {
        nodeid,
        refs,
        ftype,
        loc,
        verify,
    })
}

pub(super) fn put_handle(w: &mut StateWriter, fh: u64, nodeid: u64, flags: i32, o: &Cred) {
    w.u64(fh).u64(nodeid).u32(flags as u32);
    // The byte after the gid: the opener runs as host root.
    w.u32(o.uid).u32(o.gid).u8(u8::from(o.is_root()));
    w.u32(o.groups.len() as u32);
    for g in &o.groups {
        w.u32(*g);
    }
}

pub(super) fn get_handle(r: &mut StateReader) -> Result<HandleRec, StateError> {
    let fh = r.u64("handle")?;
    let nodeid = r.u64("handle's node id")?;
    let flags = r.u32("open flags")? as i32;
    let uid = r.u32("opener uid")?;
    let gid = r.u32("opener gid")?;
    // Read and ignored: capabilities follow the host uid (`Cred`), which
    // the record carries.
    r.u8("opener is root")?;
    let ng = r.count(GROUP_LEN, "opener groups")?;
    if ng > MAX_GROUPS {
        return Err(StateError::Corrupt(format!("{ng} groups")));
    }
    let groups = (0..ng)
        .map(|_| r.u32("group"))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(HandleRec {
        fh,
        nodeid,
        flags,
        opener: Cred { uid, gid, groups },
    })
}

pub(super) fn put_owner(w: &mut StateWriter, o: &SavedOwner) {
    w.u64(o.nodeid).u64(o.owner).u32(o.acc as u32).u32(o.pid);
    w.u32(o.spans.len() as u32);
    for &(typ, start, end) in &o.spans {
        w.u32(typ as u32).u64(start).u64(end);
    }
}

pub(super) fn get_owner(r: &mut StateReader) -> Result<SavedOwner, StateError> {
    let nodeid = r.u64("lock's node id")?;
    let owner = r.u64("lock owner")?;
    let acc = r.u32("lock description's mode")? as i32;
    let pid = r.u32("lock's pid")?;
    let ns = r.count(SPAN_LEN, "locks")?;
    let spans = (0..ns)
        .map(|_| {
            Ok((
                r.u32("lock type")? as i32,
                r.u64("lock start")?,
                r.u64("lock end")?,
            ))
        })
        .collect::<Result<Vec<_>, StateError>>()?;
    Ok(SavedOwner {
        nodeid,
        owner,
        acc,
        pid,
        spans,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn len(put: impl FnOnce(&mut StateWriter)) -> usize {
        let mut w = StateWriter::new();
        put(&mut w);
        w.finish().len()
    }

    fn inode(loc: Locator, verify: Option<FileHandle>) -> InodeRec {
        InodeRec {
            nodeid: 2,
            refs: 1,
            ftype: libc::S_IFREG,
            loc,
            verify,
        }
    }

    #[test]
    fn counts_are_checked_at_the_size_the_writers_give_the_smallest_records() {
        let locs = || {
            [
                Locator::Path(Vec::new()),
                Locator::Handle {
                    typ: 1,
                    handle: Vec::new(),
                    path: Vec::new(),
                },
                Locator::Lost(Vec::new()),
            ]
        };
        let inodes: Vec<usize> = locs()
            .into_iter()
            .map(|l| inode(l, None))
            .chain(locs().into_iter().map(|l| inode(l, Some((1, Vec::new())))))
            .map(|rec| len(|w| put_inode(w, &rec)))
            .collect();
        assert_eq!(inodes.iter().min(), Some(&INODE_MIN), "{inodes:?}");
        let cred = Cred::default();
        assert_eq!(len(|w| put_handle(w, 7, 2, 0, &cred)), HANDLE_MIN);
        let cred = Cred {
            groups: vec![5],
            ..Cred::default()
        };
        assert_eq!(
            len(|w| put_handle(w, 7, 2, 0, &cred)),
            HANDLE_MIN + GROUP_LEN
        );
        let mut owner = SavedOwner {
            nodeid: 2,
            owner: 9,
            acc: libc::O_RDWR,
            pid: 1,
            spans: Vec::new(),
        };
        assert_eq!(len(|w| put_owner(w, &owner)), OWNER_MIN);
        owner.spans.push((libc::F_WRLCK, 0, 9));
        assert_eq!(len(|w| put_owner(w, &owner)), OWNER_MIN + SPAN_LEN);
    }

    #[test]
    fn every_record_reads_back_as_written() {
        let rec = inode(
            Locator::Handle {
                typ: 3,
                handle: vec![1, 2, 3],
                path: b"a/b".to_vec(),
            },
            Some((4, vec![9; 8])),
        );
        let opener = Cred {
            uid: 1000,
            gid: 100,
            groups: vec![4, 27],
        };
        let owner = SavedOwner {
            nodeid: 2,
            owner: 0xfeed,
            acc: libc::O_RDWR,
            pid: 77,
            spans: vec![(libc::F_RDLCK, 0, 9), (libc::F_WRLCK, 100, u64::MAX >> 1)],
        };
        let mut w = StateWriter::new();
        put_inode(&mut w, &rec);
        put_handle(&mut w, 5, 2, libc::O_RDWR, &opener);
        put_owner(&mut w, &owner);
        let buf = w.finish();
        let mut r = StateReader::new(&buf);
        let back = get_inode(&mut r).unwrap();
        assert_eq!((back.nodeid, back.refs, back.ftype), (2, 1, libc::S_IFREG));
        assert_eq!((back.loc, back.verify), (rec.loc, rec.verify));
        let h = get_handle(&mut r).unwrap();
        assert_eq!((h.fh, h.nodeid, h.flags), (5, 2, libc::O_RDWR));
        assert_eq!(h.opener, opener);
        assert_eq!(get_owner(&mut r).unwrap(), owner);
        r.end("records").unwrap();
    }
}
