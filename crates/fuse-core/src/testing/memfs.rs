//! An in-memory filesystem for tests. Node ids are
//! inode numbers; a node is freed when it has no links and no lookups.

use crate::abi::{fattr, Attr, Kstatfs, SetattrIn, Xattr};
use crate::locks::lock;
use crate::server::{
    Created, Ctx, DirSink, Entry, Filesystem, FsResult, Opened, ReadSink, WriteSource,
};
use crate::Errno;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

const S_IFMT: u32 = 0o170000;
const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const RENAME_NOREPLACE: u32 = 1;
const RENAME_EXCHANGE: u32 = 2;
const TTL: Duration = Duration::from_secs(1);
const NAME_MAX: usize = 255;

#[derive(Debug)]
enum Kind {
    File(Vec<u8>),
    Dir(BTreeMap<Vec<u8>, u64>),
    Symlink(Vec<u8>),
}

#[derive(Debug)]
struct Node {
    attr: Attr,
    kind: Kind,
    lookups: u64,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

#[derive(Debug)]
struct State {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
}

/// The in-memory filesystem.
#[derive(Debug)]
pub struct MemFs {
    state: Mutex<State>,
}

impl Default for MemFs {
    fn default() -> Self {
        Self::new()
    }
}

fn dtype(mode: u32) -> u32 {
    (mode & S_IFMT) >> 12
}

impl MemFs {
    /// An empty filesystem with a root directory (mode 0755, owned by root).
    pub fn new() -> Self {
        let mut nodes = HashMap::new();
        let attr = Attr {
            ino: 1,
            mode: S_IFDIR | 0o755,
            nlink: 2,
            blksize: 4096,
            ..Default::default()
        };
        nodes.insert(
            1,
            Node {
                attr,
                kind: Kind::Dir(BTreeMap::new()),
                lookups: 1,
                xattrs: BTreeMap::new(),
            },
        );
        MemFs {
            state: Mutex::new(State { nodes, next_ino: 2 }),
        }
    }

    fn st(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Number of live inodes (root included): shows that forgets free nodes.
    pub fn live_inodes(&self) -> usize {
        self.st().nodes.len()
    }
}

impl State {
    fn node(&mut self, ino: u64) -> FsResult<&mut Node> {
        self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    fn dir(&mut self, ino: u64) -> FsResult<&mut BTreeMap<Vec<u8>, u64>> {
        match &mut self.node(ino)?.kind {
            Kind::Dir(d) => Ok(d),
            _ => Err(Errno::ENOTDIR),
        }
    }

    fn entry(&mut self, ino: u64) -> FsResult<Entry<u64>> {
        let n = self.node(ino)?;
        n.lookups += 1;
        Ok(Entry {
            inode: ino,
            generation: 0,
            attr: n.attr,
            entry_valid: TTL,
            attr_valid: TTL,
        })
    }

    fn maybe_free(&mut self, ino: u64) {
        if let Some(n) = self.nodes.get(&ino) {
            if n.lookups == 0 && n.attr.nlink == 0 && ino != 1 {
                self.nodes.remove(&ino);
            }
        }
    }

    fn create(
        &mut self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        kind: Kind,
    ) -> FsResult<Entry<u64>> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        if self.dir(parent)?.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        let is_dir = matches!(kind, Kind::Dir(_));
        let size = match &kind {
            Kind::Symlink(t) => t.len() as u64,
            _ => 0,
        };
        let attr = Attr {
            ino,
            mode,
            nlink: if is_dir { 2 } else { 1 },
            uid: ctx.uid,
            gid: ctx.gid,
            size,
            blksize: 4096,
            ..Default::default()
        };
        self.nodes.insert(
            ino,
            Node {
                attr,
                kind,
                lookups: 0,
                xattrs: BTreeMap::new(),
            },
        );
        self.dir(parent)?.insert(name.to_vec(), ino);
        if is_dir {
            self.node(parent)?.attr.nlink += 1;
        }
        self.entry(ino)
    }

    fn remove(&mut self, parent: u64, name: &[u8], want_dir: bool) -> FsResult<()> {
        let ino = *self.dir(parent)?.get(name).ok_or(Errno::ENOENT)?;
        let node = self.node(ino)?;
        match (&node.kind, want_dir) {
            (Kind::Dir(d), true) if !d.is_empty() => return Err(Errno::ENOTEMPTY),
            (Kind::Dir(_), true) => node.attr.nlink = 0,
            (Kind::Dir(_), false) => return Err(Errno::EISDIR),
            (_, true) => return Err(Errno::ENOTDIR),
            (_, false) => node.attr.nlink = node.attr.nlink.saturating_sub(1),
        }
        self.dir(parent)?.remove(name);
        if want_dir {
            let p = self.node(parent)?;
            p.attr.nlink = p.attr.nlink.saturating_sub(1);
        }
        self.maybe_free(ino);
        Ok(())
    }
}

impl Filesystem for MemFs {
    type Inode = u64;
    type Handle = u64;
    type Io = ();

    fn new_io(&self, _: crate::server::Wake) {}

    fn lookup(&self, _ctx: &Ctx, parent: u64, name: &[u8]) -> FsResult<Entry<u64>> {
        let mut st = self.st();
        let ino = *st.dir(parent)?.get(name).ok_or(Errno::ENOENT)?;
        st.entry(ino)
    }

    fn forget(&self, ino: u64, nlookup: u64) {
        let mut st = self.st();
        if let Some(n) = st.nodes.get_mut(&ino) {
            n.lookups = n.lookups.saturating_sub(nlookup);
        }
        st.maybe_free(ino);
    }

    fn getattr(&self, _ctx: &Ctx, ino: u64, _fh: Option<u64>) -> FsResult<(Attr, Duration)> {
        Ok((self.st().node(ino)?.attr, TTL))
    }

    fn setattr(&self, _ctx: &Ctx, ino: u64, a: &SetattrIn) -> FsResult<(Attr, Duration)> {
        let mut st = self.st();
        let n = st.node(ino)?;
        if a.valid & fattr::MODE != 0 {
            n.attr.mode = (n.attr.mode & S_IFMT) | (a.mode & !S_IFMT);
        }
        if a.valid & fattr::UID != 0 {
            n.attr.uid = a.uid;
        }
        if a.valid & fattr::GID != 0 {
            n.attr.gid = a.gid;
        }
        if a.valid & fattr::SIZE != 0 {
            match &mut n.kind {
                Kind::File(d) => d.resize(usize::try_from(a.size).map_err(|_| Errno::EFBIG)?, 0),
                Kind::Dir(_) => return Err(Errno::EISDIR),
                Kind::Symlink(_) => return Err(Errno::EINVAL),
            }
            n.attr.size = a.size;
        }
        if a.valid & fattr::ATIME != 0 {
            (n.attr.atime, n.attr.atimensec) = (a.atime, a.atimensec);
        }
        if a.valid & fattr::MTIME != 0 {
            (n.attr.mtime, n.attr.mtimensec) = (a.mtime, a.mtimensec);
        }
        Ok((n.attr, TTL))
    }

    fn readlink(&self, _ctx: &Ctx, ino: u64) -> FsResult<Vec<u8>> {
        match &self.st().node(ino)?.kind {
            Kind::Symlink(t) => Ok(t.clone()),
            _ => Err(Errno::EINVAL),
        }
    }

    fn symlink(&self, ctx: &Ctx, parent: u64, name: &[u8], target: &[u8]) -> FsResult<Entry<u64>> {
        self.st().create(
            ctx,
            parent,
            name,
            S_IFLNK | 0o777,
            Kind::Symlink(target.to_vec()),
        )
    }

    fn mknod(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        _rdev: u32,
        umask: u32,
    ) -> FsResult<Entry<u64>> {
        if mode & S_IFMT != S_IFREG && mode & S_IFMT != 0 {
            return Err(Errno::EPERM);
        }
        self.st().create(
            ctx,
            parent,
            name,
            S_IFREG | (mode & 0o7777 & !umask),
            Kind::File(Vec::new()),
        )
    }

    fn mkdir(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> FsResult<Entry<u64>> {
        self.st().create(
            ctx,
            parent,
            name,
            S_IFDIR | (mode & 0o7777 & !umask),
            Kind::Dir(BTreeMap::new()),
        )
    }

    fn unlink(&self, _ctx: &Ctx, parent: u64, name: &[u8]) -> FsResult<()> {
        self.st().remove(parent, name, false)
    }

    fn rmdir(&self, _ctx: &Ctx, parent: u64, name: &[u8]) -> FsResult<()> {
        self.st().remove(parent, name, true)
    }

    fn rename(
        &self,
        _ctx: &Ctx,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
    ) -> FsResult<()> {
        let mut st = self.st();
        let ino = *st.dir(parent)?.get(name).ok_or(Errno::ENOENT)?;
        let existing = st.dir(newparent)?.get(newname).copied();
        if flags & RENAME_EXCHANGE != 0 {
            let other = existing.ok_or(Errno::ENOENT)?;
            st.dir(parent)?.insert(name.to_vec(), other);
            st.dir(newparent)?.insert(newname.to_vec(), ino);
            return Ok(());
        }
        if let Some(victim) = existing {
            if flags & RENAME_NOREPLACE != 0 {
                return Err(Errno::EEXIST);
            }
            if victim == ino {
                return Ok(());
            }
            let src_dir = matches!(st.node(ino)?.kind, Kind::Dir(_));
            let dst_dir = matches!(st.node(victim)?.kind, Kind::Dir(_));
            match (src_dir, dst_dir) {
                (true, false) => return Err(Errno::ENOTDIR),
                (false, true) => return Err(Errno::EISDIR),
                _ => {}
            }
            st.remove(newparent, newname, dst_dir)?;
        }
        st.dir(parent)?.remove(name);
        st.dir(newparent)?.insert(newname.to_vec(), ino);
        if matches!(st.node(ino)?.kind, Kind::Dir(_)) && parent != newparent {
            st.node(parent)?.attr.nlink -= 1;
            st.node(newparent)?.attr.nlink += 1;
        }
        Ok(())
    }

    fn link(&self, _ctx: &Ctx, ino: u64, newparent: u64, newname: &[u8]) -> FsResult<Entry<u64>> {
        let mut st = self.st();
        if matches!(st.node(ino)?.kind, Kind::Dir(_)) {
            return Err(Errno::EPERM);
        }
        if st.dir(newparent)?.contains_key(newname) {
            return Err(Errno::EEXIST);
        }
        st.dir(newparent)?.insert(newname.to_vec(), ino);
        st.node(ino)?.attr.nlink += 1;
        st.entry(ino)
    }

    fn open(&self, _ctx: &Ctx, ino: u64, _flags: u32) -> FsResult<Opened<u64>> {
        match self.st().node(ino)?.kind {
            Kind::Dir(_) => Err(Errno::EISDIR),
            _ => Ok(Opened {
                handle: ino,
                open_flags: 0,
                backing_id: 0,
            }),
        }
    }

    fn read(
        &self,
        _ctx: &Ctx,
        ino: u64,
        _fh: u64,
        offset: u64,
        sink: &mut dyn ReadSink,
    ) -> FsResult<usize> {
        let mut st = self.st();
        let Kind::File(d) = &st.node(ino)?.kind else {
            return Err(Errno::EISDIR);
        };
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(d.len());
        let buf = sink.buffer();
        let n = buf.len().min(d.len() - start);
        buf[..n].copy_from_slice(&d[start..start + n]);
        Ok(n)
    }

    fn write(
        &self,
        _ctx: &Ctx,
        ino: u64,
        _fh: u64,
        offset: u64,
        src: &dyn WriteSource,
        _flags: u32,
    ) -> FsResult<usize> {
        let data = src.data();
        let mut st = self.st();
        let n = st.node(ino)?;
        let Kind::File(d) = &mut n.kind else {
            return Err(Errno::EISDIR);
        };
        let start = usize::try_from(offset).map_err(|_| Errno::EFBIG)?;
        let end = start.checked_add(data.len()).ok_or(Errno::EFBIG)?;
        if end > (1 << 34) {
            return Err(Errno::EFBIG);
        }
        if d.len() < end {
            d.resize(end, 0);
        }
        d[start..end].copy_from_slice(data);
        n.attr.size = d.len() as u64;
        n.attr.blocks = n.attr.size.div_ceil(512);
        Ok(data.len())
    }

    fn flush(&self, _ctx: &Ctx, _ino: u64, _fh: u64, _owner: u64) -> FsResult<()> {
        Ok(())
    }

    fn fsync(&self, _ctx: &Ctx, _ino: u64, _fh: u64, _datasync: bool) -> FsResult<()> {
        Ok(())
    }

    fn opendir(&self, _ctx: &Ctx, ino: u64, _flags: u32) -> FsResult<Opened<u64>> {
        self.st().dir(ino)?;
        Ok(Opened {
            handle: ino,
            open_flags: 0,
            backing_id: 0,
        })
    }

    fn readdir(
        &self,
        _ctx: &Ctx,
        ino: u64,
        _fh: u64,
        offset: u64,
        sink: &mut dyn DirSink,
    ) -> FsResult<()> {
        let mut st = self.st();
        let entries: Vec<(Vec<u8>, u64)> =
            st.dir(ino)?.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let dots = [(b".".to_vec(), ino), (b"..".to_vec(), 1)];
        for (i, (name, child)) in dots
            .into_iter()
            .chain(entries)
            .enumerate()
            .skip(offset as usize)
        {
            let typ = st.nodes.get(&child).map_or(0, |n| dtype(n.attr.mode));
            if !sink.add(child, i as u64 + 1, typ, &name) {
                break;
            }
        }
        Ok(())
    }

    fn fsyncdir(&self, _ctx: &Ctx, _ino: u64, _fh: u64, _datasync: bool) -> FsResult<()> {
        Ok(())
    }

    fn statfs(&self, _ctx: &Ctx, _ino: u64) -> FsResult<Kstatfs> {
        let files = self.st().nodes.len() as u64;
        Ok(Kstatfs {
            blocks: 1 << 20,
            bfree: 1 << 19,
            bavail: 1 << 19,
            files,
            ffree: 1 << 20,
            bsize: 4096,
            namelen: NAME_MAX as u32,
            frsize: 4096,
            ..Default::default()
        })
    }

    fn setxattr(
        &self,
        _ctx: &Ctx,
        ino: u64,
        name: &[u8],
        value: &[u8],
        _flags: u32,
        _ext_flags: u32,
    ) -> FsResult<()> {
        self.st()
            .node(ino)?
            .xattrs
            .insert(name.to_vec(), value.to_vec());
        Ok(())
    }

    fn getxattr(&self, _ctx: &Ctx, ino: u64, name: &[u8], _size: u32) -> FsResult<Xattr> {
        self.st()
            .node(ino)?
            .xattrs
            .get(name)
            .cloned()
            .map(Xattr::Data)
            .ok_or(Errno::ENODATA)
    }

    fn listxattr(&self, _ctx: &Ctx, ino: u64, _size: u32) -> FsResult<Xattr> {
        let mut out = Vec::new();
        for k in self.st().node(ino)?.xattrs.keys() {
            out.extend_from_slice(k);
            out.push(0);
        }
        Ok(Xattr::Data(out))
    }

    fn removexattr(&self, _ctx: &Ctx, ino: u64, name: &[u8]) -> FsResult<()> {
        self.st()
            .node(ino)?
            .xattrs
            .remove(name)
            .map(|_| ())
            .ok_or(Errno::ENODATA)
    }

    fn access(&self, _ctx: &Ctx, ino: u64, _mask: u32) -> FsResult<()> {
        self.st().node(ino).map(|_| ())
    }

    fn create(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        _flags: u32,
        umask: u32,
    ) -> FsResult<Created<u64, u64>> {
        let e = self.st().create(
            ctx,
            parent,
            name,
            S_IFREG | (mode & 0o7777 & !umask),
            Kind::File(Vec::new()),
        )?;
        Ok((
            e,
            Opened {
                handle: e.inode,
                open_flags: 0,
                backing_id: 0,
            },
        ))
    }
}
