//! Reply payloads: the wire structs the dispatcher answers with, built
//! from the filesystem's values, and the READDIR/READDIRPLUS buffers that
//! pack directory entries. A write that does not fit the buffer is ERANGE
//! (or, for a directory entry, the end of the listing).

use crate::abi::{self, AttrOut, EntryOut, LkIn, OpenOut};
use crate::chan::Errno;
use crate::server::{DirPlusSink, DirSink, Entry, LockReq, Opened};
use std::time::Duration;
use zerocopy::{Immutable, IntoBytes};

pub(super) fn put<T: IntoBytes + Immutable>(out: &mut [u8], v: &T) -> Result<usize, Errno> {
    let b = v.as_bytes();
    out.get_mut(..b.len())
        .ok_or(Errno::ERANGE)?
        .copy_from_slice(b);
    Ok(b.len())
}

pub(super) fn entry_out<I: Into<u64>>(e: Entry<I>) -> EntryOut {
    EntryOut {
        nodeid: e.inode.into(),
        generation: e.generation,
        entry_valid: e.entry_valid.as_secs(),
        attr_valid: e.attr_valid.as_secs(),
        entry_valid_nsec: e.entry_valid.subsec_nanos(),
        attr_valid_nsec: e.attr_valid.subsec_nanos(),
        attr: e.attr,
    }
}

pub(super) fn attr_out(attr: abi::Attr, valid: Duration) -> AttrOut {
    AttrOut {
        attr_valid: valid.as_secs(),
        attr_valid_nsec: valid.subsec_nanos(),
        dummy: 0,
        attr,
    }
}

pub(super) fn lock_req(arg: &LkIn) -> LockReq {
    LockReq {
        owner: arg.owner,
        lock: arg.lk,
        flock: arg.lk_flags & abi::flags::LK_FLOCK != 0,
    }
}

pub(super) fn open_out<H: Into<u64>>(o: Opened<H>) -> OpenOut {
    OpenOut {
        fh: o.handle.into(),
        open_flags: o.open_flags,
        backing_id: i32::try_from(o.backing_id).unwrap_or(0),
    }
}

pub(super) struct DirBuf<'a> {
    pub(super) out: &'a mut [u8],
    pub(super) len: usize,
}

impl DirSink for DirBuf<'_> {
    fn add(&mut self, ino: u64, offset: u64, typ: u32, name: &[u8]) -> bool {
        let size = abi::dirent_size(name.len());
        let Some(dst) = self.out.get_mut(self.len..self.len + size) else {
            return false;
        };
        let d = abi::Dirent {
            ino,
            off: offset,
            namelen: name.len() as u32,
            typ,
        };
        let h = std::mem::size_of::<abi::Dirent>();
        dst[..h].copy_from_slice(d.as_bytes());
        dst[h..h + name.len()].copy_from_slice(name);
        dst[h + name.len()..].fill(0);
        self.len += size;
        true
    }
}

pub(super) struct DirPlusBuf<'a> {
    pub(super) out: &'a mut [u8],
    pub(super) len: usize,
}

impl DirPlusSink for DirPlusBuf<'_> {
    fn room(&self, namelen: usize) -> bool {
        self.len + abi::direntplus_size(namelen) <= self.out.len()
    }
    fn add(
        &mut self,
        entry: Option<Entry<u64>>,
        ino: u64,
        offset: u64,
        typ: u32,
        name: &[u8],
    ) -> bool {
        if !self.room(name.len()) {
            return false;
        }
        let size = abi::direntplus_size(name.len());
        let dst = &mut self.out[self.len..self.len + size];
        let entry_out = entry.map(entry_out).unwrap_or_default();
        let d = abi::DirentPlus {
            dirent: abi::Dirent {
                ino,
                off: offset,
                namelen: name.len() as u32,
                typ,
            },
            entry_out,
        };
        let h = std::mem::size_of::<abi::DirentPlus>();
        dst[..h].copy_from_slice(d.as_bytes());
        dst[h..h + name.len()].copy_from_slice(name);
        dst[h + name.len()..].fill(0);
        self.len += size;
        true
    }
}
