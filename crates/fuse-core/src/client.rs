//! A POSIX-like client over a [`Chan`]: each call is one FUSE request that
//! travels through the engine (admission, interrupts, timeouts, abort) to
//! whatever server end is attached, exactly as the kernel would send it.
//!
//! Calls return the server's reply decoded, or its errno. No lookup counts
//! are kept for the caller: every call that returns an [`EntryOut`] hands
//! the caller one reference, to be dropped with [`Client::forget`].

use crate::abi::{self, encode::Body, *};
use crate::chan::{Args, Call, Chan, Errno, ReplyPayload};
use zerocopy::{FromBytes, Immutable, IntoBytes};

/// One entry of a READDIR reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Inode number.
    pub ino: u64,
    /// Offset of the next entry.
    pub off: u64,
    /// `DT_*` type.
    pub typ: u32,
    /// Name.
    pub name: Vec<u8>,
}

/// One entry of a READDIRPLUS reply (`entry.nodeid` 0 for "." and "..").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntryPlus {
    /// The lookup result (one reference unless `nodeid` is 0).
    pub entry: EntryOut,
    /// The directory record.
    pub dirent: DirEntry,
}

/// A client of one connection, with the credentials it sends.
#[derive(Clone)]
pub struct Client {
    chan: Chan,
    uid: u32,
    gid: u32,
    pid: u32,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("uid", &self.uid)
            .field("gid", &self.gid)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

fn sz<T>() -> usize {
    std::mem::size_of::<T>()
}

fn read<T: FromBytes>(r: ReplyPayload) -> Result<T, Errno> {
    r.read().ok_or(Errno::EPROTO)
}

fn own_dirent(d: &abi::DecodedDirent<'_>) -> DirEntry {
    DirEntry {
        ino: d.dirent.ino,
        off: d.dirent.off,
        typ: d.dirent.typ,
        name: d.name.to_vec(),
    }
}

fn name_body<T: IntoBytes + Immutable>(arg: &T, name: &[u8]) -> Body {
    Body::new().push(arg).cstr(name)
}

impl Client {
    /// A client sending as root (uid 0, gid 0) from pid 1.
    pub fn new(chan: Chan) -> Client {
        Client {
            chan,
            uid: 0,
            gid: 0,
            pid: 1,
        }
    }

    /// The same connection, sending as `uid`/`gid`.
    pub fn as_user(&self, uid: u32, gid: u32) -> Client {
        Client {
            uid,
            gid,
            ..self.clone()
        }
    }

    /// The same connection, sending with caller pid `pid`.
    pub fn with_pid(&self, pid: u32) -> Client {
        Client {
            pid,
            ..self.clone()
        }
    }

    /// The connection.
    pub fn chan(&self) -> &Chan {
        &self.chan
    }

    fn args(&self, op: Opcode, node: u64, body: Body) -> Args {
        Args::new(op, node)
            .body(body.into_vec())
            .creds(self.uid, self.gid, self.pid)
    }

    fn req(
        &self,
        op: Opcode,
        node: u64,
        body: Body,
        out: usize,
        var: bool,
    ) -> Result<ReplyPayload, Errno> {
        self.chan.send(self.args(op, node, body).out(out, var))
    }

    fn unit(&self, op: Opcode, node: u64, body: Body) -> Result<(), Errno> {
        self.req(op, node, body, 0, false).map(|_| ())
    }

    fn entry(&self, op: Opcode, node: u64, body: Body) -> Result<EntryOut, Errno> {
        read(self.req(op, node, body, sz::<EntryOut>(), false)?)
    }

    fn negotiated_flags(&self) -> u64 {
        self.chan.negotiated().map_or(0, |n| n.flags)
    }

    /// LOOKUP.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<EntryOut, Errno> {
        self.entry(Opcode::Lookup, parent, Body::new().cstr(name))
    }
    /// FORGET (no reply).
    pub fn forget(&self, node: u64, nlookup: u64) {
        self.chan.send_forget(node, nlookup);
    }
    /// GETATTR (with a handle when `fh` is given).
    pub fn getattr(&self, node: u64, fh: Option<u64>) -> Result<AttrOut, Errno> {
        let arg = GetattrIn {
            getattr_flags: if fh.is_some() { flags::GETATTR_FH } else { 0 },
            dummy: 0,
            fh: fh.unwrap_or(0),
        };
        read(self.req(
            Opcode::Getattr,
            node,
            Body::new().push(&arg),
            sz::<AttrOut>(),
            false,
        )?)
    }
    /// SETATTR.
    pub fn setattr(&self, node: u64, arg: &SetattrIn) -> Result<AttrOut, Errno> {
        read(self.req(
            Opcode::Setattr,
            node,
            Body::new().push(arg),
            sz::<AttrOut>(),
            false,
        )?)
    }
    /// READLINK.
    pub fn readlink(&self, node: u64) -> Result<Vec<u8>, Errno> {
        self.req(Opcode::Readlink, node, Body::new(), 4096, true)
            .map(|r| r.data)
    }
    /// SYMLINK `name` -> `target`.
    pub fn symlink(&self, parent: u64, name: &[u8], target: &[u8]) -> Result<EntryOut, Errno> {
        self.entry(Opcode::Symlink, parent, Body::new().cstr(name).cstr(target))
    }
    /// MKNOD.
    pub fn mknod(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u32,
        umask: u32,
    ) -> Result<EntryOut, Errno> {
        let arg = MknodIn {
            mode,
            rdev,
            umask,
            padding: 0,
        };
        self.entry(Opcode::Mknod, parent, name_body(&arg, name))
    }
    /// MKDIR.
    pub fn mkdir(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<EntryOut, Errno> {
        self.entry(
            Opcode::Mkdir,
            parent,
            name_body(&MkdirIn { mode, umask }, name),
        )
    }
    /// UNLINK.
    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<(), Errno> {
        self.unit(Opcode::Unlink, parent, Body::new().cstr(name))
    }
    /// RMDIR.
    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<(), Errno> {
        self.unit(Opcode::Rmdir, parent, Body::new().cstr(name))
    }
    /// RENAME (flags 0) or RENAME2.
    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
    ) -> Result<(), Errno> {
        if flags == 0 {
            let b = name_body(&RenameIn { newdir: newparent }, name).cstr(newname);
            return self.unit(Opcode::Rename, parent, b);
        }
        let arg = Rename2In {
            newdir: newparent,
            flags,
            padding: 0,
        };
        self.unit(Opcode::Rename2, parent, name_body(&arg, name).cstr(newname))
    }
    /// LINK `node` as `newname` in `newparent`.
    pub fn link(&self, node: u64, newparent: u64, newname: &[u8]) -> Result<EntryOut, Errno> {
        let b = name_body(&LinkIn { oldnodeid: node }, newname);
        self.entry(Opcode::Link, newparent, b)
    }
    /// OPEN.
    pub fn open(&self, node: u64, flags: u32) -> Result<OpenOut, Errno> {
        let arg = OpenIn {
            flags,
            open_flags: 0,
        };
        read(self.req(
            Opcode::Open,
            node,
            Body::new().push(&arg),
            sz::<OpenOut>(),
            false,
        )?)
    }
    /// OPENDIR.
    pub fn opendir(&self, node: u64) -> Result<OpenOut, Errno> {
        let arg = OpenIn {
            flags: libc_o_rdonly(),
            open_flags: 0,
        };
        read(self.req(
            Opcode::Opendir,
            node,
            Body::new().push(&arg),
            sz::<OpenOut>(),
            false,
        )?)
    }
    fn create_like(
        &self,
        op: Opcode,
        parent: u64,
        name: &[u8],
        arg: CreateIn,
    ) -> Result<(EntryOut, OpenOut), Errno> {
        let r = self.req(
            op,
            parent,
            name_body(&arg, name),
            sz::<EntryOut>() + sz::<OpenOut>(),
            false,
        )?;
        let (e, rest) = EntryOut::read_from_prefix(&r.data).map_err(|_| Errno::EPROTO)?;
        let (o, _) = OpenOut::read_from_prefix(rest).map_err(|_| Errno::EPROTO)?;
        Ok((e, o))
    }
    /// CREATE.
    pub fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> Result<(EntryOut, OpenOut), Errno> {
        let arg = CreateIn {
            flags,
            mode,
            umask,
            open_flags: 0,
        };
        self.create_like(Opcode::Create, parent, name, arg)
    }
    /// TMPFILE.
    pub fn tmpfile(
        &self,
        parent: u64,
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> Result<(EntryOut, OpenOut), Errno> {
        let arg = CreateIn {
            flags,
            mode,
            umask,
            open_flags: 0,
        };
        self.create_like(Opcode::Tmpfile, parent, b"/", arg)
    }
    /// READ up to `size` bytes at `offset`.
    pub fn read(&self, node: u64, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let arg = ReadIn {
            fh,
            offset,
            size,
            ..Default::default()
        };
        self.req(
            Opcode::Read,
            node,
            Body::new().push(&arg),
            size as usize,
            true,
        )
        .map(|r| r.data)
    }
    /// WRITE `data` at `offset`; returns the bytes written.
    pub fn write(
        &self,
        node: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
        write_flags: u32,
    ) -> Result<u32, Errno> {
        let arg = WriteIn {
            fh,
            offset,
            size: data.len() as u32,
            write_flags,
            ..Default::default()
        };
        let args = self
            .args(Opcode::Write, node, Body::new().push(&arg))
            .data(data.to_vec())
            .out(sz::<WriteOut>(), false);
        read::<WriteOut>(self.chan.send(args)?).map(|w| w.size)
    }
    /// FLUSH.
    pub fn flush(&self, node: u64, fh: u64, owner: u64) -> Result<(), Errno> {
        let arg = FlushIn {
            fh,
            lock_owner: owner,
            ..Default::default()
        };
        self.unit(Opcode::Flush, node, Body::new().push(&arg))
    }
    /// RELEASE.
    pub fn release(&self, node: u64, fh: u64, flags: u32) -> Result<(), Errno> {
        let arg = ReleaseIn {
            fh,
            flags,
            ..Default::default()
        };
        self.chan
            .send(
                self.args(Opcode::Release, node, Body::new().push(&arg))
                    .force(),
            )
            .map(|_| ())
    }
    /// RELEASEDIR.
    pub fn releasedir(&self, node: u64, fh: u64) -> Result<(), Errno> {
        let arg = ReleaseIn {
            fh,
            ..Default::default()
        };
        self.chan
            .send(
                self.args(Opcode::Releasedir, node, Body::new().push(&arg))
                    .force(),
            )
            .map(|_| ())
    }
    fn fsync_like(&self, op: Opcode, node: u64, fh: u64, datasync: bool) -> Result<(), Errno> {
        let arg = FsyncIn {
            fh,
            fsync_flags: if datasync { flags::FSYNC_FDATASYNC } else { 0 },
            padding: 0,
        };
        self.unit(op, node, Body::new().push(&arg))
    }
    /// FSYNC.
    pub fn fsync(&self, node: u64, fh: u64, datasync: bool) -> Result<(), Errno> {
        self.fsync_like(Opcode::Fsync, node, fh, datasync)
    }
    /// FSYNCDIR.
    pub fn fsyncdir(&self, node: u64, fh: u64, datasync: bool) -> Result<(), Errno> {
        self.fsync_like(Opcode::Fsyncdir, node, fh, datasync)
    }
    /// READDIR from `offset`, at most `size` bytes of records.
    pub fn readdir(
        &self,
        node: u64,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> Result<Vec<DirEntry>, Errno> {
        let arg = ReadIn {
            fh,
            offset,
            size,
            ..Default::default()
        };
        let r = self.req(
            Opcode::Readdir,
            node,
            Body::new().push(&arg),
            size as usize,
            true,
        )?;
        let ents = abi::decode_dirents(&r.data).map_err(|_| Errno::EPROTO)?;
        Ok(ents.iter().map(own_dirent).collect())
    }
    /// READDIRPLUS from `offset`.
    pub fn readdirplus(
        &self,
        node: u64,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> Result<Vec<DirEntryPlus>, Errno> {
        let arg = ReadIn {
            fh,
            offset,
            size,
            ..Default::default()
        };
        let r = self.req(
            Opcode::Readdirplus,
            node,
            Body::new().push(&arg),
            size as usize,
            true,
        )?;
        let ents = abi::decode_direntplus(&r.data).map_err(|_| Errno::EPROTO)?;
        Ok(ents
            .iter()
            .map(|(entry, d)| DirEntryPlus {
                entry: *entry,
                dirent: own_dirent(d),
            })
            .collect())
    }
    /// STATFS.
    pub fn statfs(&self, node: u64) -> Result<Kstatfs, Errno> {
        read::<StatfsOut>(self.req(Opcode::Statfs, node, Body::new(), sz::<StatfsOut>(), false)?)
            .map(|s| s.st)
    }
    /// SETXATTR.
    pub fn setxattr(&self, node: u64, name: &[u8], value: &[u8], flags: u32) -> Result<(), Errno> {
        self.setxattr_ext(node, name, value, flags, 0)
    }
    /// SETXATTR with FUSE_SETXATTR_* bits (`ext_flags`), which travel only
    /// when SETXATTR_EXT was negotiated.
    pub fn setxattr_ext(
        &self,
        node: u64,
        name: &[u8],
        value: &[u8],
        flags: u32,
        ext_flags: u32,
    ) -> Result<(), Errno> {
        let arg = SetxattrIn {
            size: value.len() as u32,
            flags,
            setxattr_flags: ext_flags,
            ..Default::default()
        };
        let body = if self.negotiated_flags() & init::SETXATTR_EXT != 0 {
            Body::new().push(&arg)
        } else {
            Body::new().bytes(&arg.as_bytes()[..abi::COMPAT_SETXATTR_IN_SIZE])
        };
        self.unit(Opcode::Setxattr, node, body.cstr(name).bytes(value))
    }
    fn xattr_reply(r: ReplyPayload, size: u32) -> Result<Xattr, Errno> {
        if size == 0 {
            read::<GetxattrOut>(r).map(|o| Xattr::Size(o.size))
        } else {
            Ok(Xattr::Data(r.data))
        }
    }
    /// GETXATTR (`size` 0 asks for the size).
    pub fn getxattr(&self, node: u64, name: &[u8], size: u32) -> Result<Xattr, Errno> {
        let arg = GetxattrIn { size, padding: 0 };
        let out = if size == 0 {
            sz::<GetxattrOut>()
        } else {
            size as usize
        };
        let r = self.req(
            Opcode::Getxattr,
            node,
            name_body(&arg, name),
            out,
            size != 0,
        )?;
        Self::xattr_reply(r, size)
    }
    /// LISTXATTR (`size` 0 asks for the size).
    pub fn listxattr(&self, node: u64, size: u32) -> Result<Xattr, Errno> {
        let arg = GetxattrIn { size, padding: 0 };
        let out = if size == 0 {
            sz::<GetxattrOut>()
        } else {
            size as usize
        };
        let r = self.req(
            Opcode::Listxattr,
            node,
            Body::new().push(&arg),
            out,
            size != 0,
        )?;
        Self::xattr_reply(r, size)
    }
    /// REMOVEXATTR.
    pub fn removexattr(&self, node: u64, name: &[u8]) -> Result<(), Errno> {
        self.unit(Opcode::Removexattr, node, Body::new().cstr(name))
    }
    /// ACCESS.
    pub fn access(&self, node: u64, mask: u32) -> Result<(), Errno> {
        self.unit(
            Opcode::Access,
            node,
            Body::new().push(&AccessIn { mask, padding: 0 }),
        )
    }
    fn lk_body(fh: u64, owner: u64, lk: FileLock, flock: bool) -> Body {
        Body::new().push(&LkIn {
            fh,
            owner,
            lk,
            lk_flags: if flock { flags::LK_FLOCK } else { 0 },
            padding: 0,
        })
    }
    /// GETLK.
    pub fn getlk(&self, node: u64, fh: u64, owner: u64, lk: FileLock) -> Result<FileLock, Errno> {
        let b = Self::lk_body(fh, owner, lk, false);
        read::<LkOut>(self.req(Opcode::Getlk, node, b, sz::<LkOut>(), false)?).map(|o| o.lk)
    }
    /// SETLK (non-blocking) or unlock; `flock` for BSD locks.
    pub fn setlk(
        &self,
        node: u64,
        fh: u64,
        owner: u64,
        lk: FileLock,
        flock: bool,
    ) -> Result<(), Errno> {
        self.unit(Opcode::Setlk, node, Self::lk_body(fh, owner, lk, flock))
    }
    /// SETLKW as a [`Call`], to be waited for, interrupted or killed.
    pub fn setlkw(&self, node: u64, fh: u64, owner: u64, lk: FileLock, flock: bool) -> Call {
        self.chan
            .call(self.args(Opcode::Setlkw, node, Self::lk_body(fh, owner, lk, flock)))
    }
    /// FALLOCATE.
    pub fn fallocate(
        &self,
        node: u64,
        fh: u64,
        mode: u32,
        offset: u64,
        length: u64,
    ) -> Result<(), Errno> {
        let arg = FallocateIn {
            fh,
            offset,
            length,
            mode,
            padding: 0,
        };
        self.unit(Opcode::Fallocate, node, Body::new().push(&arg))
    }
    /// LSEEK; returns the new offset.
    pub fn lseek(&self, node: u64, fh: u64, offset: u64, whence: u32) -> Result<u64, Errno> {
        let arg = LseekIn {
            fh,
            offset,
            whence,
            padding: 0,
        };
        read::<LseekOut>(self.req(
            Opcode::Lseek,
            node,
            Body::new().push(&arg),
            sz::<LseekOut>(),
            false,
        )?)
        .map(|o| o.offset)
    }
    /// COPY_FILE_RANGE; returns the bytes copied.
    #[allow(clippy::too_many_arguments)]
    pub fn copy_file_range(
        &self,
        node_in: u64,
        fh_in: u64,
        off_in: u64,
        node_out: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
    ) -> Result<u64, Errno> {
        let arg = CopyFileRangeIn {
            fh_in,
            off_in,
            nodeid_out: node_out,
            fh_out,
            off_out,
            len,
            flags: 0,
        };
        let r = self.req(
            Opcode::CopyFileRange,
            node_in,
            Body::new().push(&arg),
            sz::<WriteOut>(),
            false,
        )?;
        read::<WriteOut>(r).map(|w| u64::from(w.size))
    }
    /// STATX.
    pub fn statx(
        &self,
        node: u64,
        fh: Option<u64>,
        sx_flags: u32,
        sx_mask: u32,
    ) -> Result<StatxOut, Errno> {
        let arg = StatxIn {
            getattr_flags: if fh.is_some() { flags::GETATTR_FH } else { 0 },
            reserved: 0,
            fh: fh.unwrap_or(0),
            sx_flags,
            sx_mask,
        };
        read(self.req(
            Opcode::Statx,
            node,
            Body::new().push(&arg),
            sz::<StatxOut>(),
            false,
        )?)
    }
    /// SYNCFS.
    pub fn syncfs(&self, node: u64) -> Result<(), Errno> {
        self.unit(
            Opcode::Syncfs,
            node,
            Body::new().push(&SyncfsIn { padding: 0 }),
        )
    }
    /// DESTROY.
    pub fn destroy(&self) -> Result<(), Errno> {
        self.chan
            .send(self.args(Opcode::Destroy, 0, Body::new()).force())
            .map(|_| ())
    }
}

/// `O_RDONLY` (0 on every Linux architecture).
const fn libc_o_rdonly() -> u32 {
    0
}
