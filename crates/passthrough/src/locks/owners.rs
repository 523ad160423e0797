//! The owner table: each POSIX lock owner's open file description on an
//! inode, what an O_RDONLY one holds, and how a SETLKW granted on a
//! description that was replaced while it waited is moved to the current
//! one.
//!
//! Lock order: a description's `held`, then the table; never two `held`
//! at once.

use super::super::inode::CountedFd;
use super::range::{RangeSet, Span, OFFSET_MAX};
use fuse_core::locks::lock;
use fuse_core::Errno;
use host_io::sys;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Most lock owners holding a description on one inode.
pub const MAX_OWNERS: usize = 256;
/// How often a lock request starts over because the owner's description
/// was replaced under it (by a concurrent request of the same owner)
/// before it gives up with ENOLCK.
pub const RETRIES: usize = 16;

/// (inode, lock owner).
pub type Key = (u64, u64);

/// A lock owner's open file description on an inode: its POSIX locks are
/// OFD locks on it.
#[derive(Debug)]
pub struct OwnerDesc {
    fd: CountedFd,
    /// O_RDONLY, O_WRONLY or O_RDWR: the lock types it can carry.
    acc: i32,
    /// Held around every change to the description's locks. For an
    /// O_RDONLY description, also the read ranges it holds (the only locks
    /// it can hold), so an upgrade can take them again on a new one.
    held: Mutex<RangeSet>,
}

impl OwnerDesc {
    /// `fd`, opened with access mode `acc`.
    pub fn new(fd: CountedFd, acc: i32) -> OwnerDesc {
        OwnerDesc {
            fd,
            acc,
            held: Mutex::new(RangeSet::default()),
        }
    }

    /// Its access mode.
    pub fn acc(&self) -> i32 {
        self.acc
    }

    /// The raw fd (for F_OFD_GETLK, which checks no access mode).
    pub fn raw(&self) -> i32 {
        self.fd.raw()
    }

    /// Whether fcntl(2) lets it take a lock of type `typ` (a read lock
    /// needs a description open for reading, a write lock one open for
    /// writing).
    pub fn carries(&self, typ: i32) -> bool {
        match typ {
            libc::F_RDLCK => self.acc != libc::O_WRONLY,
            libc::F_WRLCK => self.acc != libc::O_RDONLY,
            _ => true,
        }
    }

    /// Open read-only: it holds read locks only, and they are tracked.
    pub fn read_only(&self) -> bool {
        self.acc == libc::O_RDONLY
    }

    /// The held-ranges lock (see the field).
    pub fn held(&self) -> std::sync::MutexGuard<'_, RangeSet> {
        lock(&self.held)
    }

    /// F_OFD_SETLK (or, with `wait`, F_OFD_SETLKW) of `s`. A conflict is
    /// EAGAIN (POSIX also allows EACCES; FUSE wants EAGAIN).
    pub fn set(&self, s: Span, wait: bool) -> Result<(), Errno> {
        let cmd = if wait {
            libc::F_OFD_SETLKW
        } else {
            libc::F_OFD_SETLK
        };
        match sys::fcntl_lock(self.fd.raw(), cmd, &mut s.flock()) {
            Err(Errno(libc::EACCES)) => Err(Errno::EAGAIN),
            r => r,
        }
    }

    /// [`OwnerDesc::set`] without waiting, with `held` (this description's,
    /// locked by the caller) kept in step.
    pub fn set_held(&self, held: &mut RangeSet, s: Span) -> Result<(), Errno> {
        self.set(s, false)?;
        if self.read_only() {
            held.apply(s);
        }
        Ok(())
    }

    /// Lets go of everything, with `held` locked by the caller: the owner
    /// closed (FLUSH) or its locks moved to a new description. Others may
    /// still hold this one open (a parked SETLKW), so closing is not enough.
    pub fn release_all(&self, held: &mut RangeSet) {
        let all = Span {
            typ: libc::F_UNLCK,
            start: 0,
            end: OFFSET_MAX,
        };
        // Unlocking everything splits nothing, so it cannot run out of
        // memory; should it fail all the same, the locks go when the last
        // user closes the description.
        let _ = self.set(all, false);
        held.clear();
    }

    /// Lets go of `s`'s range (a lock that moved elsewhere). Best effort,
    /// as [`OwnerDesc::release_all`]: this description is no longer the
    /// owner's and closes with its last user.
    fn release(&self, s: Span) {
        let mut held = self.held();
        let _ = self.set_held(&mut held, s.with_type(libc::F_UNLCK));
    }
}

/// The owners' descriptions, by (inode, owner).
#[derive(Debug, Default)]
pub struct OwnerTable(Mutex<HashMap<Key, Arc<OwnerDesc>>>);

impl OwnerTable {
    /// The owner's description.
    pub fn get(&self, key: Key) -> Option<Arc<OwnerDesc>> {
        lock(&self.0).get(&key).cloned()
    }

    /// Whether `d` is the owner's description now.
    pub fn is(&self, key: Key, d: &Arc<OwnerDesc>) -> bool {
        lock(&self.0).get(&key).is_some_and(|c| Arc::ptr_eq(c, d))
    }

    /// Descriptions held on inode `nodeid`.
    pub fn count(&self, nodeid: u64) -> usize {
        lock(&self.0).keys().filter(|(n, _)| *n == nodeid).count()
    }

    /// Enters `d` as the owner's description, or returns the one another
    /// request entered first; ENOLCK when the inode has `MAX_OWNERS`.
    pub fn enter(&self, key: Key, d: OwnerDesc) -> Result<Arc<OwnerDesc>, Errno> {
        let mut map = lock(&self.0);
        if let Some(c) = map.get(&key) {
            return Ok(c.clone());
        }
        if map.keys().filter(|(n, _)| *n == key.0).count() >= MAX_OWNERS {
            return Err(Errno(libc::ENOLCK));
        }
        Ok(map.entry(key).or_insert(Arc::new(d)).clone())
    }

    /// Makes `d` the owner's description again if it has none (its FLUSH
    /// came while a SETLKW on it waited: the lock granted after it stays
    /// held). False when the owner has another one.
    fn restore(&self, key: Key, d: &Arc<OwnerDesc>) -> bool {
        Arc::ptr_eq(lock(&self.0).entry(key).or_insert_with(|| d.clone()), d)
    }

    /// Puts `new` in the place of `old`; false if `old` is not there.
    pub fn replace(&self, key: Key, old: &Arc<OwnerDesc>, new: Arc<OwnerDesc>) -> bool {
        match lock(&self.0).get_mut(&key) {
            Some(c) if Arc::ptr_eq(c, old) => {
                *c = new;
                true
            }
            _ => false,
        }
    }

    /// Takes the owner's description out.
    pub fn remove(&self, key: Key) -> Option<Arc<OwnerDesc>> {
        lock(&self.0).remove(&key)
    }

    /// Takes out every description on `nodeid` (all of them with None).
    pub fn remove_all(&self, nodeid: Option<u64>) -> Vec<Arc<OwnerDesc>> {
        let mut map = lock(&self.0);
        let keys: Vec<Key> = map
            .keys()
            .filter(|(n, _)| nodeid.is_none_or(|id| id == *n))
            .copied()
            .collect();
        keys.iter().filter_map(|k| map.remove(k)).collect()
    }

    /// The descriptions on `nodeid` of owners other than `except`.
    pub fn others(&self, nodeid: u64, except: u64) -> Vec<(Key, Arc<OwnerDesc>)> {
        lock(&self.0)
            .iter()
            .filter(|(&(n, o), _)| n == nodeid && o != except)
            .map(|(&k, d)| (k, d.clone()))
            .collect()
    }

    /// Every description, by owner.
    pub fn all(&self) -> Vec<(Key, Arc<OwnerDesc>)> {
        lock(&self.0).iter().map(|(&k, d)| (k, d.clone())).collect()
    }

    #[cfg(feature = "test-utils")]
    /// Descriptions held.
    pub fn len(&self) -> usize {
        lock(&self.0).len()
    }
}

/// Where a SETLKW stands after its lock was granted.
pub enum Settled {
    /// The owner holds it.
    Held,
    /// It was a write lock granted on a description the owner no longer
    /// has: let go there, to be waited for on this one, the owner's now.
    WaitOn(Arc<OwnerDesc>),
}

/// A SETLKW granted `s` on `d`: makes the table and `held` agree with it.
pub fn settle(
    owners: &OwnerTable,
    key: Key,
    d: &Arc<OwnerDesc>,
    s: Span,
) -> Result<Settled, Errno> {
    for _ in 0..RETRIES {
        if let Some(c) = owners.get(key).filter(|c| !Arc::ptr_eq(c, d)) {
            match move_grant(owners, key, d, &c, s)? {
                Some(settled) => return Ok(settled),
                None => continue,
            }
        }
        let mut held = d.held();
        if !owners.restore(key, d) {
            continue;
        }
        if d.read_only() {
            // Taken again under `held`, so `held` records it in the order
            // the kernel applied it: if the same owner unlocked the range
            // between the grant and here, the unlock came later and leaves
            // either nothing to take again or room for another owner
            // (EAGAIN). Either way `held` matches the kernel.
            match d.set(s, false) {
                Ok(()) => held.apply(s),
                Err(Errno::EAGAIN) => {}
                Err(e) => return Err(e),
            }
        }
        return Ok(Settled::Held);
    }
    Err(Errno(libc::ENOLCK))
}

/// `s` was granted on `d`, but `c` is the owner's description now (an
/// upgrade replaced `d`, or a FLUSH and a new lock did): the lock moves to
/// `c`. None when `c` was replaced too (look again).
fn move_grant(
    owners: &OwnerTable,
    key: Key,
    d: &Arc<OwnerDesc>,
    c: &Arc<OwnerDesc>,
    s: Span,
) -> Result<Option<Settled>, Errno> {
    if !c.carries(s.typ) {
        d.release(s);
        return Err(Errno::EBADF);
    }
    if s.typ == libc::F_WRLCK {
        // Two descriptions cannot both hold a write lock on a range.
        d.release(s);
        return Ok(Some(Settled::WaitOn(c.clone())));
    }
    // A read lock: nobody holds a write lock where `d` holds it, so `c`
    // takes it at once, before `d` lets go; no gap.
    let taken = {
        let mut held = c.held();
        if !owners.is(key, c) {
            return Ok(None);
        }
        c.set_held(&mut held, s)
    };
    d.release(s);
    match taken {
        Ok(()) => Ok(Some(Settled::Held)),
        // `d` let go of the range (an unlock by the owner, or the upgrade
        // that replaced it) and a writer came in: wait for it on `c`.
        Err(Errno::EAGAIN) => Ok(Some(Settled::WaitOn(c.clone()))),
        Err(e) => Err(e),
    }
}
