//! The inode table and the open-fd budget.
//!
//! An inode is known by (st_dev, st_ino, mount id) and carries the exact
//! number of lookup references the client holds. It keeps an O_PATH fd, or
//! (with file handles on) only a handle and a reference to an fd on its
//! mount, so the daemon need not keep one fd per inode.
//!
//! Locking: the table's `RwLock` guards both maps and every refcount change
//! that may reach zero (so a lookup never revives an inode being removed).

use super::backing::BackingState;
use fuse_core::locks::{lock, read, write};
use fuse_core::Errno;
use host_io::sys;
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// How many fds the daemon may hold (inode fds, handle fds, lock fds).
#[derive(Debug)]
pub struct FdBudget {
    max: usize,
    used: AtomicUsize,
}

impl FdBudget {
    /// A budget of `max` fds.
    pub fn new(max: usize) -> Arc<FdBudget> {
        Arc::new(FdBudget {
            max,
            used: AtomicUsize::new(0),
        })
    }
    /// Fds in use.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
    /// The cap.
    pub fn max(&self) -> usize {
        self.max
    }
    /// Whether less than half the budget is in use: a file-handle inode
    /// may then keep its fd as a cache (see `Source::Handle`), so that
    /// few inodes cost no open_by_handle_at per operation while many
    /// never use up the fds open files need.
    pub fn has_room_to_cache(&self) -> bool {
        self.used() < self.max / 2
    }
    /// Reserves one fd, or EMFILE when the cap is reached.
    pub fn reserve(self: &Arc<Self>) -> Result<Reservation, Errno> {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            if cur >= self.max {
                return Err(Errno::EMFILE);
            }
            match self
                .used
                .compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Ok(Reservation(Some(self.clone()))),
                Err(c) => cur = c,
            }
        }
    }
    /// Opens under a reservation: the fd counts against the cap until dropped.
    pub fn open(
        self: &Arc<Self>,
        f: impl FnOnce() -> Result<OwnedFd, Errno>,
    ) -> Result<CountedFd, Errno> {
        let r = self.reserve()?;
        Ok(CountedFd { fd: f()?, _r: r })
    }
}

/// One reserved slot of the budget (released on drop).
#[derive(Debug)]
pub struct Reservation(Option<Arc<FdBudget>>);

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(b) = self.0.take() {
            b.used.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// An fd counted against the budget.
#[derive(Debug)]
pub struct CountedFd {
    fd: OwnedFd,
    _r: Reservation,
}

impl CountedFd {
    /// The raw fd.
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
    /// The fd, borrowed.
    pub fn borrow(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsFd for CountedFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The largest node id or handle a migration's state may give: the
/// counters that hand out new ones move past what is taken up, so ids
/// near u64::MAX would leave them nowhere to go.
pub const MAX_RESTORED_ID: u64 = u64::MAX / 2;

/// Identity of a host inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InodeKey {
    /// st_ino.
    pub ino: u64,
    /// st_dev.
    pub dev: u64,
    /// Mount id (STATX_MNT_ID).
    pub mnt: u64,
}

/// How the daemon reaches an inode.
#[derive(Debug)]
pub enum Source {
    /// An O_PATH fd held for the inode's lifetime.
    Fd(CountedFd),
    /// A file handle and an fd on the same mount to open it with.
    Handle {
        /// Handle bytes.
        handle: Vec<u8>,
        /// Handle type.
        typ: i32,
        /// An O_PATH fd on the inode's mount.
        mount: Arc<CountedFd>,
        /// The inode's O_PATH fd, kept when it was entered while the fd
        /// budget had room ([`FdBudget::has_room_to_cache`]): operations
        /// use it instead of opening the handle each time.
        cached: Option<CountedFd>,
    },
}

/// An fd for one operation on an inode: borrowed from the table or opened
/// from its handle for the duration of the operation.
#[derive(Debug)]
pub enum InodeFd<'a> {
    /// The inode's own O_PATH fd.
    Held(&'a CountedFd),
    /// Opened from a file handle; closed on drop.
    Opened(CountedFd),
}

impl InodeFd<'_> {
    /// The raw fd.
    pub fn raw(&self) -> RawFd {
        match self {
            InodeFd::Held(f) => f.raw(),
            InodeFd::Opened(f) => f.raw(),
        }
    }
    /// Borrowed.
    pub fn fd(&self) -> BorrowedFd<'_> {
        match self {
            InodeFd::Held(f) => f.as_fd(),
            InodeFd::Opened(f) => f.as_fd(),
        }
    }
}

/// Opens a real (not O_PATH) fd on an inode's mount, for open_by_handle_at.
pub type MountOpener<'a> = &'a dyn Fn(&CountedFd) -> Result<CountedFd, Errno>;

/// One known inode.
#[derive(Debug)]
pub struct InodeData {
    /// Node id given to the client.
    pub nodeid: u64,
    /// Host identity.
    pub key: InodeKey,
    /// File type bits (S_IFMT).
    pub ftype: u32,
    /// How to reach it.
    pub source: Source,
    /// Held shared by parallel direct writers, exclusively by operations
    /// that change the size (truncate, fallocate) or by buffered writers.
    pub io_lock: RwLock<()>,
    /// Writers inside `io_lock` right now.
    pub writers: AtomicUsize,
    /// Open handles on this inode.
    pub handles: AtomicUsize,
    /// Kernel passthrough of its open handles (a leaf lock).
    pub backing: Mutex<BackingState>,
    /// Lookup references (guarded by the table's lock when it may reach 0).
    refs: Mutex<u64>,
}

impl InodeData {
    /// A new inode `nodeid` for what `st` describes, reached by `source`,
    /// with `refs` lookup references.
    fn new(nodeid: u64, st: &libc::statx, source: Source, refs: u64) -> InodeData {
        InodeData {
            nodeid,
            key: key_of(st),
            ftype: u32::from(st.stx_mode) & libc::S_IFMT,
            source,
            io_lock: RwLock::new(()),
            writers: AtomicUsize::new(0),
            handles: AtomicUsize::new(0),
            backing: Mutex::new(BackingState::Idle),
            refs: Mutex::new(refs),
        }
    }

    /// An fd for this inode (O_PATH).
    pub fn fd<'a>(&'a self, budget: &Arc<FdBudget>) -> Result<InodeFd<'a>, Errno> {
        match &self.source {
            Source::Fd(f)
            | Source::Handle {
                cached: Some(f), ..
            } => Ok(InodeFd::Held(f)),
            Source::Handle {
                handle, typ, mount, ..
            } => budget
                .open(|| {
                    super::creds::with_dac_read_search(|| {
                        sys::open_by_handle(mount.raw(), handle, *typ, libc::O_PATH)
                    })
                })
                .map(InodeFd::Opened),
        }
    }
    /// Whether this is a directory.
    pub fn is_dir(&self) -> bool {
        self.ftype == libc::S_IFDIR
    }
    /// Current lookup count.
    pub fn refs(&self) -> u64 {
        *lock(&self.refs)
    }
}

/// A map keyed with a hasher seeded per process: foldhash rather than the
/// standard SipHash, as for the handle table (`file::Handles`), since
/// nearly every request looks its inode up here. Node ids are the
/// daemon's own, or a migration stream's, given once without seeing the
/// seed; inode keys are the host's.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

#[derive(Default)]
struct Maps {
    by_id: Map<u64, Arc<InodeData>>,
    by_key: Map<InodeKey, u64>,
    mounts: Map<u64, Arc<CountedFd>>,
    /// Node ids a migration could not take up (`--migration-on-error
    /// guest-error`), with their lookup references: requests naming them
    /// get EIO until the client forgets them.
    lost: Map<u64, u64>,
    next: u64,
}

/// The inode table.
pub struct InodeTable {
    maps: RwLock<Maps>,
}

impl std::fmt::Debug for InodeTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InodeTable")
            .field("len", &self.len())
            .finish()
    }
}

/// What a lookup found on the host, before it is entered in the table.
pub struct Found {
    /// The O_PATH fd.
    pub fd: CountedFd,
    /// Its statx.
    pub st: libc::statx,
}

impl InodeTable {
    /// A table holding the root (node id 1, one permanent reference).
    pub fn new(root: Found) -> InodeTable {
        let key = key_of(&root.st);
        let data = Arc::new(InodeData::new(
            fuse_core::abi::ROOT_ID,
            &root.st,
            Source::Fd(root.fd),
            1,
        ));
        let mut maps = Maps {
            next: fuse_core::abi::ROOT_ID + 1,
            ..Default::default()
        };
        maps.by_key.insert(key, data.nodeid);
        maps.by_id.insert(data.nodeid, data);
        InodeTable {
            maps: RwLock::new(maps),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Maps> {
        read(&self.maps)
    }
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Maps> {
        write(&self.maps)
    }

    /// The inode with node id `id`, or EBADF (the client names an inode it
    /// has forgotten, or one that never existed).
    pub fn get(&self, id: u64) -> Result<Arc<InodeData>, Errno> {
        let maps = self.read();
        match maps.by_id.get(&id) {
            Some(d) => Ok(d.clone()),
            None if maps.lost.contains_key(&id) => Err(Errno::EIO),
            None => Err(Errno::EBADF),
        }
    }

    /// Every known inode with its lookup references (the root included),
    /// for a migration's saved state.
    pub fn snapshot(&self) -> Vec<(Arc<InodeData>, u64)> {
        let maps = self.read();
        let mut v: Vec<_> = maps.by_id.values().map(|d| (d.clone(), d.refs())).collect();
        v.sort_by_key(|(d, _)| d.nodeid);
        v
    }

    /// Node ids lost in a migration, with their references.
    pub fn lost(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<_> = self.read().lost.iter().map(|(&k, &v)| (k, v)).collect();
        v.sort_unstable();
        v
    }

    /// Enters `found` as node id `id` with `refs` lookup references (a
    /// migration's destination taking up the source's node ids). Refused
    /// (EEXIST) if the id or the host inode is known already.
    pub fn restore(&self, id: u64, refs: u64, found: Found) -> Result<Arc<InodeData>, Errno> {
        let key = key_of(&found.st);
        let mut maps = self.write();
        if id <= fuse_core::abi::ROOT_ID
            || id > MAX_RESTORED_ID
            || refs == 0
            || maps.by_id.contains_key(&id)
            || maps.lost.contains_key(&id)
            || maps.by_key.contains_key(&key)
        {
            return Err(Errno(libc::EEXIST));
        }
        let data = Arc::new(InodeData::new(id, &found.st, Source::Fd(found.fd), refs));
        maps.by_key.insert(key, id);
        maps.by_id.insert(id, data.clone());
        maps.next = maps.next.max(id.saturating_add(1));
        Ok(data)
    }

    /// Records node id `id` as lost in a migration (see `Maps::lost`).
    pub fn restore_lost(&self, id: u64, refs: u64) -> Result<(), Errno> {
        let mut maps = self.write();
        if id <= fuse_core::abi::ROOT_ID
            || id > MAX_RESTORED_ID
            || refs == 0
            || maps.by_id.contains_key(&id)
            || maps.lost.contains_key(&id)
        {
            return Err(Errno(libc::EEXIST));
        }
        maps.lost.insert(id, refs);
        maps.next = maps.next.max(id.saturating_add(1));
        Ok(())
    }

    /// Whether the host inode `key` is in the table.
    pub fn contains(&self, key: &InodeKey) -> bool {
        self.read().by_key.contains_key(key)
    }

    /// Known inodes (the root included).
    pub fn len(&self) -> usize {
        self.read().by_id.len()
    }

    /// Enters `found` (or takes another reference on the inode it names)
    /// and returns it with one more lookup reference. With `handles`, a new
    /// inode keeps a file handle where the filesystem supports handles,
    /// and its fd too only if `keep_fd` (the budget has room).
    ///
    /// open_by_handle_at needs a real (not O_PATH) fd on the mount:
    /// `mount_fd` opens one from the first regular file or directory seen
    /// on each mount. Other inodes, and filesystems without handles, keep
    /// their O_PATH fd.
    pub fn insert(
        &self,
        found: Found,
        handles: Option<MountOpener<'_>>,
        keep_fd: bool,
    ) -> Result<Arc<InodeData>, Errno> {
        let key = key_of(&found.st);
        let ftype = u32::from(found.st.stx_mode) & libc::S_IFMT;
        let handle = match handles {
            Some(_) if ftype == libc::S_IFREG || ftype == libc::S_IFDIR => {
                sys::name_to_handle(found.fd.raw()).ok()
            }
            _ => None,
        };
        let mut maps = self.write();
        if let Some(id) = maps.by_key.get(&key).copied() {
            if let Some(data) = maps.by_id.get(&id) {
                // Without a held fd the inode number may have been reused
                // by a new file: the handle (which has a generation) tells.
                let same = match (&data.source, &handle) {
                    (Source::Handle { handle: h, .. }, Some((n, _, _))) => h == n,
                    _ => true,
                };
                if same {
                    *lock(&data.refs) += 1;
                    return Ok(data.clone());
                }
            }
        }
        let mount = match (&handle, handles) {
            (Some(_), Some(open)) => match maps.mounts.get(&key.mnt) {
                Some(m) => Some(m.clone()),
                None => open(&found.fd).ok().map(|m| {
                    let m = Arc::new(m);
                    maps.mounts.insert(key.mnt, m.clone());
                    m
                }),
            },
            _ => None,
        };
        let source = match (handle, mount) {
            (Some((handle, typ, _)), Some(mount)) => Source::Handle {
                handle,
                typ,
                mount,
                cached: keep_fd.then_some(found.fd),
            },
            _ => Source::Fd(found.fd),
        };
        let id = maps.next;
        maps.next += 1;
        let data = Arc::new(InodeData::new(id, &found.st, source, 1));
        maps.by_key.insert(key, id);
        maps.by_id.insert(id, data.clone());
        Ok(data)
    }

    /// Drops `n` lookup references of `id`; the inode leaves the table at
    /// zero (the root never does). Unknown ids are ignored.
    pub fn forget(&self, id: u64, n: u64) {
        let mut maps = self.write();
        let Some(data) = maps.by_id.get(&id).cloned() else {
            if let Some(r) = maps.lost.get_mut(&id) {
                *r = r.saturating_sub(n);
                if *r == 0 {
                    maps.lost.remove(&id);
                }
            }
            return;
        };
        let mut refs = lock(&data.refs);
        let floor = u64::from(id == fuse_core::abi::ROOT_ID);
        *refs = refs.saturating_sub(n).max(floor);
        if *refs == 0 {
            drop(refs);
            maps.by_id.remove(&id);
            if maps.by_key.get(&data.key) == Some(&id) {
                maps.by_key.remove(&data.key);
            }
        }
    }

    /// Drops every inode but the root (DESTROY).
    pub fn clear(&self) {
        let mut maps = self.write();
        maps.mounts.clear();
        maps.lost.clear();
        maps.by_id.retain(|&id, _| id == fuse_core::abi::ROOT_ID);
        let root: Vec<_> = maps.by_id.values().map(|d| d.key).collect();
        maps.by_key.retain(|k, _| root.contains(k));
    }
}

/// The table key of a statx result.
pub fn key_of(st: &libc::statx) -> InodeKey {
    InodeKey {
        ino: st.stx_ino,
        dev: (u64::from(st.stx_dev_major) << 32) | u64::from(st.stx_dev_minor),
        mnt: st.stx_mnt_id,
    }
}
