//! Directory listing: READDIR and READDIRPLUS from getdents64 on the
//! handle's fd, under the handle's lock (seek and read go together).
//! READDIRPLUS looks each name up, so its entries count as lookups.

use crate::{component, sys, PassthroughFs};
use fuse_core::locks::lock;
use fuse_core::server::{Ctx, DirPlusSink, DirSink, FsResult};
use fuse_core::Errno;

/// `struct linux_dirent64` header size (d_ino, d_off, d_reclen, d_type).
const DIRENT64_HDR: usize = 19;

/// One record of a getdents64 buffer.
struct Dent<'a> {
    ino: u64,
    off: u64,
    typ: u8,
    name: &'a [u8],
}

fn parse_dents(buf: &[u8]) -> Vec<Dent<'_>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + DIRENT64_HDR <= buf.len() {
        let r = &buf[at..];
        let ino = u64::from_ne_bytes(r[0..8].try_into().unwrap_or_default());
        let off = u64::from_ne_bytes(r[8..16].try_into().unwrap_or_default());
        let reclen = usize::from(u16::from_ne_bytes(r[16..18].try_into().unwrap_or_default()));
        if reclen < DIRENT64_HDR || reclen > r.len() {
            break;
        }
        let raw = &r[DIRENT64_HDR..reclen];
        let name = &raw[..raw.iter().position(|&b| b == 0).unwrap_or(raw.len())];
        out.push(Dent {
            ino,
            off,
            typ: r[18],
            name,
        });
        at += reclen;
    }
    out
}

impl PassthroughFs {
    fn dents(&self, fh: u64, offset: u64, mut each: impl FnMut(&Dent<'_>) -> bool) -> FsResult<()> {
        let h = self.handles.get(fh)?;
        let _pos = lock(&h.dir);
        let off = i64::try_from(offset).map_err(|_| Errno::EINVAL)?;
        sys::lseek(h.fd.raw(), off, libc::SEEK_SET)?;
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let n = sys::getdents64(h.fd.raw(), &mut buf)?;
            if n == 0 {
                return Ok(());
            }
            for d in parse_dents(&buf[..n]) {
                if !each(&d) {
                    return Ok(());
                }
            }
        }
    }

    pub(crate) fn op_readdir(&self, fh: u64, offset: u64, sink: &mut dyn DirSink) -> FsResult<()> {
        self.dents(fh, offset, |d| {
            sink.add(d.ino, d.off, u32::from(d.typ), d.name)
        })
    }

    pub(crate) fn op_readdirplus(
        &self,
        ctx: &Ctx,
        ino: u64,
        fh: u64,
        offset: u64,
        sink: &mut dyn DirPlusSink,
    ) -> FsResult<()> {
        let dir = self.inodes.get(ino)?;
        let _c = self.creds(ctx)?;
        let mut err = None;
        let mut added = 0usize;
        self.dents(fh, offset, |d| {
            if !sink.room(d.name.len()) {
                return false;
            }
            if d.name == b"." || d.name == b".." {
                return sink.add(None, d.ino, d.off, u32::from(d.typ), d.name);
            }
            let Ok(name) = component(d.name) else {
                return true;
            };
            match self.do_lookup(&dir, &name) {
                Ok(e) => {
                    let id = e.inode;
                    if !sink.add(Some(e), d.ino, d.off, u32::from(d.typ), d.name) {
                        self.inodes.forget(id, 1);
                        return false;
                    }
                    added += 1;
                    true
                }
                // Removed since getdents saw it.
                Err(Errno::ENOENT) => true,
                Err(e) => {
                    err = Some(e);
                    false
                }
            }
        })?;
        match err {
            // Entries already listed carry references the client must get:
            // they stand, and the error comes on the next call if it
            // persists.
            Some(e) if added == 0 => Err(e),
            _ => Ok(()),
        }
    }
}
