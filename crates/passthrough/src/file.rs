//! Open files and directories: the handle table and its handles, here;
//! OPEN/CREATE/TMPFILE and RELEASE in `open`, READ/WRITE and the small
//! file ops in `data`, directory listing in `dir`. A handle holds its
//! inode and its opener; a lost one (a migration could not take it up)
//! answers EIO until released.

mod data;
mod dir;
mod open;

use super::creds::Cred;
use super::inode::{CountedFd, InodeData};
use fuse_core::locks::{read, write};
use fuse_core::Errno;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// One open file or directory.
#[derive(Debug)]
pub struct HandleData {
    /// The open file description.
    pub fd: CountedFd,
    /// Its inode.
    pub inode: Arc<InodeData>,
    /// Opened for direct I/O (O_DIRECT, or the cache policy asks for it).
    pub direct: bool,
    /// Data I/O through io_uring (off where the file cannot do
    /// non-blocking I/O, so the ring would punt every op to a worker).
    pub uring: bool,
    /// Opened O_DIRECT on the host (writes then go through the ring too).
    pub odirect: bool,
    /// Holds a use of its inode's backing state (kernel passthrough
    /// configured: see `backing.rs`), given back at RELEASE.
    backing: bool,
    /// Serialises seek + getdents on a directory handle.
    dir: Mutex<()>,
    /// Its mapping for cached READs and their residency checks
    /// (`mapped.rs`).
    pub(crate) map: crate::mapped::MapSlot,
    /// Whether its reads lately found nothing cached (`cold.rs`).
    pub(crate) cold: crate::cold::ColdHint,
    /// Who opened it (uid, gid, and the groups it had then): a writeback
    /// WRITE runs as the opener, since the client kernel sends those with
    /// uid = gid = 0 and a flusher thread's pid (`force && nocreds`).
    opener: Cred,
}

impl HandleData {
    /// Who opened it.
    pub(super) fn opener(&self) -> &Cred {
        &self.opener
    }
}

/// The handle table. Keyed with a hasher seeded per process, not
/// `fuse_core::fasthash`: a migration's state stream, which is not
/// trusted, gives the ids of the handles it brings, once and without
/// seeing the seed. foldhash (not built to resist an attacker who can
/// probe it, which nobody here can) rather than the standard SipHash:
/// every READ and WRITE looks its handle up here.
#[derive(Debug, Default)]
pub struct Handles {
    map: RwLock<HashMap<u64, Arc<HandleData>, foldhash::fast::RandomState>>,
    /// Handles a migration could not take up (`--migration-on-error
    /// guest-error`): EIO until released.
    lost: RwLock<std::collections::HashSet<u64>>,
    next: AtomicU64,
    max_parallel: AtomicUsize,
}

impl Handles {
    /// Enters `h` under a new id, or under `at` (a migration taking up the
    /// source's handles: EEXIST if it is taken).
    fn insert(&self, h: HandleData, at: Option<u64>) -> Result<u64, Errno> {
        let mut map = write(&self.map);
        let id = match at {
            None => self.next.fetch_add(1, Ordering::Relaxed) + 1,
            Some(id) => {
                if id == 0
                    || id > super::inode::MAX_RESTORED_ID
                    || map.contains_key(&id)
                    || self.is_lost(id)
                {
                    return Err(Errno(libc::EEXIST));
                }
                self.next.fetch_max(id, Ordering::Relaxed);
                id
            }
        };
        map.insert(id, Arc::new(h));
        Ok(id)
    }
    fn is_lost(&self, fh: u64) -> bool {
        read(&self.lost).contains(&fh)
    }
    /// Records `fh` as lost in a migration (EIO until released).
    pub(super) fn restore_lost(&self, fh: u64) -> Result<(), Errno> {
        let map = read(&self.map);
        if fh == 0 || fh > super::inode::MAX_RESTORED_ID || map.contains_key(&fh) {
            return Err(Errno(libc::EEXIST));
        }
        if !write(&self.lost).insert(fh) {
            return Err(Errno(libc::EEXIST));
        }
        self.next.fetch_max(fh, Ordering::Relaxed);
        Ok(())
    }
    /// Every open handle, by id, and the lost ones.
    pub(super) fn snapshot(&self) -> (Vec<(u64, Arc<HandleData>)>, Vec<u64>) {
        let mut v: Vec<_> = read(&self.map)
            .iter()
            .map(|(&k, h)| (k, h.clone()))
            .collect();
        v.sort_by_key(|(k, _)| *k);
        let mut lost: Vec<u64> = read(&self.lost).iter().copied().collect();
        lost.sort_unstable();
        (v, lost)
    }
    /// The handle `fh`, or EBADF (EIO for one lost in a migration).
    pub fn get(&self, fh: u64) -> Result<Arc<HandleData>, Errno> {
        match read(&self.map).get(&fh) {
            Some(h) => Ok(h.clone()),
            None if self.is_lost(fh) => Err(Errno::EIO),
            None => Err(Errno::EBADF),
        }
    }
    fn remove(&self, fh: u64) -> Option<Arc<HandleData>> {
        let h = write(&self.map).remove(&fh);
        if h.is_none() {
            write(&self.lost).remove(&fh);
        }
        h
    }
    #[cfg(feature = "test-utils")]
    /// Open handles.
    pub fn len(&self) -> usize {
        read(&self.map).len()
    }
    #[cfg(feature = "test-utils")]
    /// The most writers seen in one inode's lock at once.
    pub fn max_parallel(&self) -> usize {
        self.max_parallel.load(Ordering::Relaxed)
    }
    pub(super) fn clear(&self) {
        write(&self.map).clear();
        write(&self.lost).clear();
    }
    /// Counts a writer of `inode` (in its `writers`, and in the most seen
    /// at once) until the result is dropped.
    pub(super) fn writer(&self, inode: &Arc<InodeData>) -> Writer {
        let now = inode.writers.fetch_add(1, Ordering::AcqRel) + 1;
        self.max_parallel.fetch_max(now, Ordering::Relaxed);
        Writer(inode.clone())
    }
}

/// A writer counted in its inode's `writers` until dropped.
#[derive(Debug)]
pub(super) struct Writer(Arc<InodeData>);

impl Drop for Writer {
    fn drop(&mut self) {
        self.0.writers.fetch_sub(1, Ordering::AcqRel);
    }
}
